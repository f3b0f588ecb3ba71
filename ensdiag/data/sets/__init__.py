"""The built-in datasets, one or a few per module; every module here is imported by
`data/registry.py`, so adding a dataset is adding a module (docs/architecture.md)."""
