"""Normalisation constants of docs/conventions.md (per channel, on pixels scaled to [0, 1]);
torch-free, so the presets (config.py) are read without importing it."""

CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)
MNIST_MEAN, MNIST_STD = (0.1307,), (0.3081,)
# Pixel statistics of all 1,797 scikit-learn digits scaled to [0, 1] (computed once, fixed like MNIST's).
DIGITS_MEAN, DIGITS_STD = (0.3053,), (0.3761,)
