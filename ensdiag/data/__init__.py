"""Datasets in their distributed formats, the embedded default, and device-resident batching.

The built-in datasets register themselves when first asked for (`get_dataset`,
`all_datasets`). Nothing here imports torch until a name below is used, so reading a preset's
constants (config.py, from `constants.py`) costs no torch import.
"""

_NAMES = {"DATASETS", "Dataset", "Split", "all_datasets", "get_dataset", "register_dataset"}


def __getattr__(name):
    if name in _NAMES:
        from . import registry
        return getattr(registry, name)
    raise AttributeError(f"module 'ensdiag.data' has no attribute {name!r}")


__all__ = sorted(_NAMES)
