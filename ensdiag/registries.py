"""What ensdiag knows, read from its registries: methods, analyzers, datasets.

    ensdiag.list_methods()      # ["single", "mc-dropout", "deep-ensemble", "batch-ensemble", ...]
    ensdiag.list_analyzers()    # ["calibration", "disagreement", ...], plug-ins included
    ensdiag.list_datasets()     # ["mnist", "fashion-mnist", ...]

Each component registers itself from its own module (a kit under nn/kits/, an analyzer under
analysis/, a dataset under data/sets/), so these lists, and docs/components.md, which
`python -m ensdiag.registries > docs/components.md` writes, follow the code.
"""


def list_methods() -> list[str]:
    from .nn import METHODS
    return list(METHODS)


def list_analyzers() -> list[str]:
    from .analysis import all_analyzers
    return list(all_analyzers())


def list_datasets() -> list[str]:
    from .data import all_datasets
    return list(all_datasets())


def _first_line(text) -> str:
    return " ".join((text or "").strip().split("\n\n")[0].split())


def components_markdown() -> str:
    """docs/components.md: one table per registry, built-ins only (plug-ins are the user's)."""
    from .analysis import ANALYZERS
    from .data import all_datasets
    from .nn import METHODS
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


if __name__ == "__main__":
    print(components_markdown(), end="")
