"""What ensdiag knows, read from its registries: methods, analyzers, datasets.

    ensdiag.list_methods()      # ["single", "mc-dropout", "deep-ensemble", "batch-ensemble", ...]
    ensdiag.list_analyzers()    # ["calibration", "disagreement", ...], plug-ins included
    ensdiag.list_datasets()     # ["mnist", "fashion-mnist", ...]

Each component registers itself from its own module (a kit under nn/kits/, an analyzer under
analysis/, a dataset under data/sets/), so these lists, and docs/components.md, which
`python -m ensdiag.registries > docs/components.md` writes, follow the code; so does ensdiag/names.py
(`python -m ensdiag.registries names > ensdiag/names.py`), the names checked before torch is imported.
"""

import sys
import textwrap

from .analysis import ANALYZERS, all_analyzers
from .data import all_datasets
from .nn import METHODS
from .report import FORMATS


def list_methods() -> list[str]:
    return list(METHODS)


def list_analyzers() -> list[str]:
    return list(all_analyzers())


def list_datasets() -> list[str]:
    return list(all_datasets())


def components_markdown() -> str:
    """docs/components.md: one table per registry, built-ins only (plug-ins are the user's)."""
    lines = ["# Components", "", "Generated from ensdiag's registries by `python -m ensdiag.registries > "
             "docs/components.md` (a test keeps it current). Adding one is adding a module: a method under "
             "`ensdiag/nn/kits/`, an analyzer under `ensdiag/analysis/`, a dataset under `ensdiag/data/sets/` "
             "(docs/architecture.md).", "", "## Methods", "", "| name | in reports | members share one weight set |",
             "|---|---|---|"]
    lines += [f"| `{name}` | {kit.label} | {'yes' if kit.one_weight_set else 'no'} |" for name, kit in METHODS.items()]
    lines += ["", "## Analyzers", "", "| name | reads | what it computes | report columns |", "|---|---|---|---|"]
    lines += [f"| `{name}` | {analyzer.needs} | {analyzer.description} | "
              f"{', '.join(dict.fromkeys(column.label for column in analyzer.columns)) or '—'} |"
              for name, analyzer in ANALYZERS.items() if analyzer.source == "built-in"]
    lines += ["", "## Datasets", "", "| name | role | shown as |", "|---|---|---|"]
    lines += [f"| `{name}` | {dataset.role} | {dataset.title} |" for name, dataset in all_datasets().items()]
    return "\n".join(lines) + "\n"


def _built_in(entry) -> bool:
    return getattr(entry, "__module__", type(entry).__module__).startswith("ensdiag.")


def names_module() -> str:
    """ensdiag/names.py: the built-in names quickcheck.py checks arguments against before torch is imported."""
    tables = [("every run name training accepts: the methods and their run variants", "METHODS",
               tuple(run for name, kit in METHODS.items() if _built_in(kit) for run in (name, *kit.run_variants))),
              ("the datasets", "DATASETS", tuple(name for name, dataset in all_datasets().items() if _built_in(dataset))),
              ("`report --format`: name -> file extension", "REPORT_FORMATS",
               {name: extension for name, (extension, render) in FORMATS.items() if _built_in(render)})]
    lines = ['"""The registries\' names, for the argument checks that run before torch is imported (quickcheck.py).',
             "", "Generated from the registries by `python -m ensdiag.registries names > ensdiag/names.py`",
             '(tests/test_startup.py keeps it current): edit the registries, not this file."""']
    for comment, name, value in tables:
        lines += ["", f"# {comment}", *textwrap.wrap(f"{name} = {value!r}", 120, subsequent_indent=" " * (len(name) + 4),
                                                    break_long_words=False, break_on_hyphens=False)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(names_module() if sys.argv[1:] == ["names"] else components_markdown(), end="")
