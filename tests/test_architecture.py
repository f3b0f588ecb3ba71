"""The shape of the package: its import graph (imports inside functions included) has no cycle,
every import runs down the floors (`FLOORS`), the core imports nothing from the outputs, and no
private name (`_x`) is imported across a package boundary. Read from the source with
`ast`, so what a module imports lazily counts as much as what it imports at the top (imports under
`if TYPE_CHECKING:` never run and do not count)."""

import ast

import pytest
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "ensdiag"


def _modules() -> dict[str, tuple[Path, bool]]:
    """{dotted name: (file, is a package)} of every module of ensdiag."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


def _runtime_nodes(tree):
    """Every node of the tree except those under `if TYPE_CHECKING:`."""
    pending = [tree]
    while pending:
        node = pending.pop()
        yield node
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            pending += node.orelse
            continue
        pending += list(ast.iter_child_nodes(node))


def _imported(name: str, package: bool, tree):
    """(module, [names]) of every import that runs in module `name`: `from m import a, b` gives (m, [a, b])
    with relative imports resolved, `import m` gives (m, [])."""
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.ImportFrom):
            base = name.split(".") if package else name.split(".")[:-1]
            if node.level:
                base = base[:len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            yield source, [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            yield from ((alias.name, []) for alias in node.names)


def _imports(modules) -> tuple[dict[str, set[str]], list[tuple[str, str, str]]]:
    """(module -> the ensdiag modules it imports, [(importer, module, private name)])."""
    edges, private = {name: set() for name in modules}, []
    for name, (path, package) in modules.items():
        for source, names in _imported(name, package, ast.parse(path.read_text())):
            if not source.startswith("ensdiag"):
                continue
            targets = [] if names else [source]
            for imported in names:
                if f"{source}.{imported}" in modules:
                    targets.append(f"{source}.{imported}")
                else:
                    targets.append(source)
                    if imported.startswith("_") and not imported.startswith("__"):
                        private.append((name, source, imported))
            for target in targets:
                while target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in modules and target != name:
                    edges[name].add(target)
    return edges, private


def _cycles(edges) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for other in edges[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in edges:
        if node not in index:
            visit(node)
    return found


def _package_of(name, modules) -> str:
    return name if modules[name][1] else name.rsplit(".", 1)[0]


# The floors, lowest first: a module may import from its own floor and those below, never above.
FLOORS = [
    ("ground", ["ensdiag", "ensdiag.errors", "ensdiag.numbers", "ensdiag.io", "ensdiag.text", "ensdiag.console",
                "ensdiag.progress", "ensdiag.device", "ensdiag.precision", "ensdiag.budget", "ensdiag.forked",
                "ensdiag.provenance", "ensdiag.distributed", "ensdiag.threads", "ensdiag.registry", "ensdiag.names"]),
    ("maths", ["ensdiag.stats"]),
    ("data and networks", ["ensdiag.data", "ensdiag.nn"]),
    ("files", ["ensdiag.config", "ensdiag.checkpoint", "ensdiag.checks", "ensdiag.predictions", "ensdiag.runs"]),
    ("readers", ["ensdiag.foreign"]),
    ("ensembles", ["ensdiag.ensembles", "ensdiag.geometry"]),
    ("analyzers", ["ensdiag.analysis"]),
    ("core", ["ensdiag.core"]),
    # statistics across runs: each run's predictions read once, the verdict, effective sizes, bias–variance
    ("seeds", ["ensdiag.seeds"]),
    ("training and LoRA", ["ensdiag.train", "ensdiag.experiment", "ensdiag.tracker", "ensdiag.lora"]),
    ("outputs", ["ensdiag.report", "ensdiag.export", "ensdiag.integrations"]),
    # the Diagnosis with its views (results.py) and the Lightning callback, which trains with it, above the outputs
    ("public API", ["ensdiag.results", "ensdiag.lightning"]),
    ("commands", ["ensdiag.cli", "ensdiag.bench", "ensdiag.registries", "ensdiag.entry", "ensdiag.__main__",
                  "ensdiag.quickcheck"]),
]


def _floor(name: str) -> int | None:
    """The floor of a module: that of the longest prefix naming it."""
    best = None
    for index, (_, prefixes) in enumerate(FLOORS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    return None if best is None else best[0]


def test_every_module_has_a_floor_and_every_import_runs_down_the_floors():
    modules = _modules()
    assert not [name for name in modules if _floor(name) is None], "a module no floor names"
    edges, _ = _imports(modules)
    upward = [f"{a} ({FLOORS[_floor(a)][0]}) imports {b} ({FLOORS[_floor(b)][0]})"
              for a, targets in edges.items() for b in targets if _floor(a) < _floor(b)]
    assert not upward, "\n".join(upward)


def _folder(name, modules) -> str:
    """A module's folder (`ensdiag.report` for `ensdiag.report.render`); a module at the root is its own."""
    parts = name.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 or modules[name][1] else name


def test_every_folder_stands_on_one_floor_and_its_imports_run_down():
    """The folder view: each folder's modules share one floor (the maths in stats/, the analyzers in
    analysis/, the Lightning callback beside the public API), and at most five imports between folders
    run back up."""
    modules = _modules()
    floors = {}
    for name in modules:
        floors.setdefault(_folder(name, modules), set()).add(_floor(name))
    spanning = {folder: sorted(FLOORS[floor][0] for floor in found) for folder, found in floors.items() if len(found) > 1}
    assert not spanning, spanning
    edges, _ = _imports(modules)
    upward = [(a, b) for a, targets in edges.items() for b in targets
              if _folder(a, modules) != _folder(b, modules) and min(floors[_folder(a, modules)]) < min(floors[_folder(b, modules)])]
    assert len(upward) <= 5, upward


def test_the_core_imports_nothing_from_the_outputs():
    modules = _modules()
    edges, _ = _imports(modules)
    outputs = ("ensdiag.report", "ensdiag.export", "ensdiag.integrations")
    reached = [(a, b) for a, targets in edges.items() if a.startswith("ensdiag.core") for b in targets
               if b.startswith(outputs)]
    assert not reached, reached


def test_the_import_graph_has_no_cycle():
    modules = _modules()
    cycles = _cycles(_imports(modules)[0])
    assert not cycles, f"{len(cycles)} import cycles: {cycles}"


def test_no_private_name_crosses_a_package_boundary():
    modules = _modules()
    _, private = _imports(modules)
    crossing = [(importer, source, name) for importer, source, name in private
                if _package_of(importer, modules) != (_package_of(source, modules) if source in modules else source)]
    assert not crossing, crossing


def test_the_checks_find_what_they_look_for():
    """The graph reader sees lazy imports, cycles and floors (so the tests above can fail)."""
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(edges) == [["a", "b", "c"]]
    assert _floor("ensdiag.lightning") > _floor("ensdiag.integrations.mlflow") > _floor("ensdiag.core.intervals")
    assert _floor("ensdiag.stats.weighted") < _floor("ensdiag.data.files") < _floor("ensdiag.analysis.calibration")
    assert _floor("ensdiag.stats.scaling") < _floor("ensdiag.seeds.verdict") < _floor("ensdiag.report.aggregate")
    assert _readers("ensdiag.report.x", False, ast.parse(
        "from ..io import atomic_write_text, read_safetensors\nfrom .. import predictions\nimport safetensors.torch\n"
        "def f(p):\n    return predictions.load_predictions(p)")) == ["read_safetensors", "safetensors.torch",
                                                                      "load_predictions"]
    modules = _modules()
    edges, _ = _imports(modules)
    assert "ensdiag.core" in edges["ensdiag.cli.evaluate"]  # imported inside the command function


READERS = {"read_safetensors", "load_predictions"}  # ensdiag.io's and ensdiag.predictions' readers of a tensors file


def _readers(name: str, package: bool, tree) -> list[str]:
    """The readers of tensor files a module reaches: ensdiag's (`READERS`, imported or called as a module's
    attribute) and safetensors itself."""
    found = [imported for source, names in _imported(name, package, tree) if source.startswith("ensdiag")
             for imported in names if imported in READERS]
    found += [source for source, _ in _imported(name, package, tree) if source.split(".")[0] == "safetensors"]
    return found + [node.attr for node in _runtime_nodes(tree) if isinstance(node, ast.Attribute) and node.attr in READERS]


def test_report_reads_no_predictions_file_itself():
    """report/ renders: the runs' predictions reach it through seeds/ (read once, checked, damaged runs named),
    never through a reader of its own."""
    reading = {name: found for name, (path, package) in _modules().items() if name.startswith("ensdiag.report")
               if (found := _readers(name, package, ast.parse(path.read_text())))}
    assert not reading, reading


def test_every_lazy_public_name_is_visible_to_type_checkers():
    """`ensdiag.diagnose` & co. resolve on first use (torch-free start-up); a TYPE_CHECKING block
    imports each from the module the lazy table names, so type checkers see their signatures."""
    import ensdiag
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    guarded = {}
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for statement in node.body:
                guarded.update({alias.name: statement.module for alias in statement.names})
    assert guarded == {name: module for name, module in ensdiag._LAZY.items()}
    assert (PACKAGE / "py.typed").is_file()


# Imports inside functions: only those that keep torch, scipy, matplotlib or an extra's library out of a path that
# must not load them (`ensdiag --help`, a mistyped command, a report read back from its cache, the console script's
# guard) may wait in a function; everything else is imported at the top. A library in HEAVY may always be imported
# late; an ensdiag module only where LAZY names it, beside the importing module, each with its reason.
HEAVY = {"torch", "torchvision", "scipy", "matplotlib", "sklearn", "numpy", "safetensors", "PIL", "pandas", "pyarrow",
         "lightning", "mlflow", "wandb", "tensorboard", "lm_eval", "transformers", "peft", "typer", "rich"}
# {importing module: {the ensdiag modules it may import inside a function}}, one dict per group of folders:
LAZY_COMMANDS = {  # the root modules, cli/, bench/ (the commands: parsing, --help and a typo load no torch)
    # what a command needs once it runs: torch (and scipy, matplotlib: report/), never for --help or a typo
    "ensdiag.cli.analyze": {"ensdiag.core", "ensdiag.foreign.lm_eval", "ensdiag.foreign.readers",
                            "ensdiag.report.inspection", "ensdiag.stats.generated"},
    "ensdiag.cli.bench": {"ensdiag.bench", "ensdiag.device"},
    "ensdiag.cli.catalog": {"ensdiag.nn"},  # (`ensdiag presets` and `datasets` list without torch)
    "ensdiag.cli.diversity": {"ensdiag.analysis", "ensdiag.core", "ensdiag.device", "ensdiag.foreign.checkpoints",
                              "ensdiag.report"},
    "ensdiag.cli.evaluate": {"ensdiag.core", "ensdiag.distributed", "ensdiag.foreign.checkpoints"},
    "ensdiag.cli.import_model": {"ensdiag.checkpoint", "ensdiag.foreign.checkpoints"},
    "ensdiag.cli.lora": {"ensdiag.lora.analysis", "ensdiag.lora.harness", "ensdiag.report"},  # (adapters' configs: before torch)
    "ensdiag.cli.options": {"ensdiag.core.inputs", "ensdiag.nn.architectures", "ensdiag.report.inspection"},
    "ensdiag.cli.report": {"ensdiag.predictions", "ensdiag.report"},
    "ensdiag.cli.train": {"ensdiag.distributed", "ensdiag.experiment", "ensdiag.nn.methods", "ensdiag.report"},
    # torch-free modules the CLI reads before a command runs, and a report read back from its cache:
    "ensdiag.config": {"ensdiag.nn"},  # the presets' methods and options, checked against the kits (torch)
    "ensdiag.runs": {"ensdiag.checks", "ensdiag.predictions"},  # a diagnosis saved with its predictions (torch)
    # the registered analyzers' columns and per-example quantities (torch); Parquet and DataFrames (extras)
    "ensdiag.export": {"ensdiag.analysis", "ensdiag.stats.examples", "ensdiag.integrations.parquet",
                       "ensdiag.integrations.pandas"},
    "ensdiag.entry": {"ensdiag.cli"},  # the console script's guard: a dependency that fails to import is one line
}


LAZY_OUTPUTS = {  # report/, seeds/, integrations/, lightning.py (a report read back loads no torch)
    # building a report (the tables over seeds, the OOD histograms' scores) imports torch; reading one back does not
    "ensdiag.report": {"ensdiag.report.aggregate", "ensdiag.report.ood_score"},
    # each logger's module imports its extra at the top (mlflow, wandb), found by the target's type first
    "ensdiag.integrations": {"ensdiag.integrations.mlflow", "ensdiag.integrations.wandb"},
}


LAZY_CORE = {  # core/, analysis/, stats/, geometry/, ensembles/
}


LAZY_READERS = {  # foreign/, lora/, data/, nn/
    # corruptions.py is torch and torchvision, preset.py torch: `ensdiag datasets` lists the datasets without either
    "ensdiag.data.sets.digits": {"ensdiag.data.corruptions", "ensdiag.data.preset"},
    # the ensembles' adapters (which every analyzer listing imports: a report) open a model file only when given one
    "ensdiag.foreign.checkpoints": {"ensdiag.checkpoint"},
}


LAZY = {**LAZY_COMMANDS, **LAZY_OUTPUTS, **LAZY_CORE, **LAZY_READERS}


def _unit(name, modules) -> str:
    """A module's folder, "ensdiag" for a module at the root."""
    folder = _folder(name, modules)
    return "ensdiag" if folder == name and not modules[name][1] else folder


FOLDERS = sorted({_unit(name, _modules()) for name in _modules()})


def _late_imports(name: str, path: Path, package: bool):
    """(line, imported module) of every import inside a function of a module, ensdiag's resolved absolute."""
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for inner in _runtime_nodes(node):
            if isinstance(inner, ast.Import):
                yield from ((inner.lineno, alias.name) for alias in inner.names)
            elif isinstance(inner, ast.ImportFrom):
                base = name.split(".") if package else name.split(".")[:-1]
                source = ".".join(base[:len(base) - inner.level + 1] + ([inner.module] if inner.module else [])) \
                    if inner.level else inner.module
                yield inner.lineno, source


@pytest.mark.parametrize("folder", FOLDERS)
def test_imports_are_at_the_top_but_for_the_named_lazy_ones(folder):
    modules = _modules()
    late = [f"{name}:{line} imports {source}" for name, (path, package) in modules.items() if _unit(name, modules) == folder
            for line, source in _late_imports(name, path, package)
            if source.split(".")[0] not in HEAVY and not (source.startswith("ensdiag") and any(
                source == allowed or source.startswith(allowed + ".") for allowed in LAZY.get(name, ())))]
    assert not late, "\n".join(late)
