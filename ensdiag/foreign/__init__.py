"""Ensembles and predictions made elsewhere: NumPy prediction arrays (predictions.py) and
checkpoints from torch-uncertainty or plain PyTorch (checkpoints.py), read without running
any pickled code."""
