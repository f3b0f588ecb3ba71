"""The registries' names, for the argument checks that run before torch is imported (quickcheck.py).

Generated from the registries by `python -m ensdiag.registries names > ensdiag/names.py`
(tests/test_startup.py keeps it current): edit the registries, not this file."""

# every run name training accepts: the methods and their run variants
METHODS = ('single', 'mc-dropout', 'deep-ensemble', 'batch-ensemble', 'batch-ensemble-channel', 'batch-ensemble-kernel',
           'packed-ensemble', 'mimo', 'snapshot-ensemble', 'checkpoint-ensemble')

# the datasets
DATASETS = ('mnist', 'fashion-mnist', 'cifar10', 'svhn', 'cifar10-c', 'mnist-c', 'digits', 'digits-c',
            'natural-patches')

# `report --format`: name -> file extension
REPORT_FORMATS = {'markdown': 'md', 'latex': 'tex', 'html': 'html', 'summary': 'txt', 'json': 'json', 'csv': 'csv',
                  'table': 'txt'}
