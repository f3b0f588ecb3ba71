"""Ensembles and predictions made elsewhere: NumPy prediction arrays (predictions.py) and
checkpoints from torch-uncertainty or plain PyTorch (checkpoints.py), read without running
any pickled code."""


def shown(value) -> str:
    """A user's value quoted safely in an error: repr escapes control characters; long values are cut."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
