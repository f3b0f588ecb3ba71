"""Statistics across runs (across.py): the verdict, effective ensemble sizes, seeds needed and the
bias–variance decomposition of a run folder's methods, from each run's predictions read once, returned
as data that report/ renders. Torch-free to import: `stats.py` holds what renderers read.
"""
