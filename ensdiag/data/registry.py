"""The dataset registry: every dataset ensdiag knows, where it looks, and what it expects.

A dataset is a class registered with `@register_dataset` in a module of its own under
`ensdiag/data/sets/` (every module there is imported), or in a user's module; it says which files it expects
under a data directory (`expected_files`), whether they are there (`locate`) and reads
them (`load`). `ensdiag datasets` renders this registry as a table.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: listing datasets imports no torch
    import torch

from ..errors import DataNotFound, EnsdiagError
from ..registry import Registry, import_all

DATASETS = Registry("dataset")  # name -> Dataset, in their `order` (built-ins first)


@dataclass
class Split:
    """One split of a dataset: images [N, C, H, W] (uint8 0..255, or float in [0, 1]) and labels."""

    images: torch.Tensor
    labels: torch.Tensor | None
    source: str = ""  # a human description: which dataset, which files

    def __post_init__(self):
        if self.labels is not None and len(self.labels) != len(self.images):
            raise EnsdiagError(f"{self.source}: {len(self.images)} images but {len(self.labels)} labels")

    def __len__(self):
        return len(self.images)

    def subset(self, index) -> "Split":
        return Split(self.images[index], None if self.labels is None else self.labels[index], self.source)


class Dataset:
    name = "?"
    role = ""  # "ID", "shift", "OOD"
    title = ""  # the name reports print
    how_to_get = ""
    parts: tuple[str, ...] = ()  # sets made of parts (corruptions) that may be present one by one
    order = 100  # where `ensdiag datasets` lists it (built-ins first)

    def present_parts(self, data_dir: Path) -> list[str]:
        """The parts whose files are on disk (for sets made of parts)."""
        return []

    def coverage(self, found) -> str:
        """'' when every part is there, else e.g. '5 of 15 corruptions; missing: fog, …' (all named)."""
        missing = [part for part in self.parts if part not in set(found)]
        if not self.parts or not missing:
            return ""
        return f"{len(self.parts) - len(missing)} of {len(self.parts)} corruptions; missing: {', '.join(missing)}"

    def expected_files(self, data_dir: Path) -> list[Path]:
        raise NotImplementedError

    def locate(self, data_dir: Path) -> Path | None:
        """The folder the files were found in, or None."""
        files = self.expected_files(data_dir)
        return files[0].parent if all(f.is_file() for f in files) else None

    def load(self, data_dir: Path, split: str = "test", download: bool = False, **options):
        raise NotImplementedError

    def missing(self, data_dir: Path) -> DataNotFound:
        files = [str(f) for f in self.expected_files(data_dir) if not f.is_file()]
        shown = ", ".join(files[:4]) + (f" and {len(files) - 4} more" if len(files) > 4 else "")
        return DataNotFound(f"{self.title} not found: missing {shown}. {self.how_to_get}")


def register_dataset(cls):
    DATASETS.add(cls.name, cls(), order=cls.order)
    return cls


def all_datasets() -> dict[str, Dataset]:
    import_all(f"{__package__}.sets")  # every module there registers its datasets: adding one is adding a module
    return dict(DATASETS)


def get_dataset(name: str) -> Dataset:
    all_datasets()
    return DATASETS.named(name)
