"""Datasets in their distributed formats, the embedded default, and device-resident batching."""

from . import torchvision_sets, corrupted, digits  # noqa: F401,I001  (registers the datasets, in this order)
from .registry import DATASETS, Dataset, Split, get_dataset, register_dataset

__all__ = ["DATASETS", "Dataset", "Split", "get_dataset", "register_dataset"]
