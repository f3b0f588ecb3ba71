"""Datasets in their distributed formats, the embedded default, and device-resident batching.

The built-in datasets register themselves when first asked for (`get_dataset`,
`all_datasets`). Nothing here imports torch (the registry is torch-free), so reading a preset's
constants (config.py, from `constants.py`) costs no torch import.
"""

from .registry import DATASETS, Dataset, Split, all_datasets, get_dataset, register_dataset

__all__ = ["DATASETS", "Dataset", "Split", "all_datasets", "get_dataset", "register_dataset"]
