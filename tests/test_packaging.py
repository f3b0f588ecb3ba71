"""ensdiag as users install it: every import declared, and the wheel working outside the repository.

The undeclared-import check reads the installed metadata: a module counts as declared when the
distribution that provides it is a declared dependency or a requirement of one, followed
transitively. ensdiag itself may rely on `dependencies` only; the tests on those and the `test`
extra. A module that is not installed at all is undeclared too (a fresh venv would fail on it).
"""

import ast
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _distribution(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[(]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _closure(requirements) -> set[str]:
    """The distributions `requirements` bring in, following installed metadata (extras left out)."""
    found, todo = set(), [_distribution(r) for r in requirements]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        try:
            todo += [_distribution(r) for r in metadata.requires(name) or [] if "extra ==" not in r]
        except metadata.PackageNotFoundError:
            pass
    return found


def _imports(folder: Path, skip=("fixtures",)) -> dict[str, set[str]]:
    """{top-level third-party module: files importing it} for absolute imports under `folder`
    (a folder or one file); fixtures/ holds scripts that make the committed fixture files in
    environments of their own, and each of ensdiag's integrations/ may use its own extra."""
    users: dict[str, set[str]] = {}
    for path in ([folder] if folder.is_file() else folder.rglob("*.py")):
        if folder.is_dir() and set(skip) & set(path.relative_to(folder).parts):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top not in sys.stdlib_module_names and top not in ("ensdiag", "tests"):
                    users.setdefault(top, set()).add(path.name)
    return users


def undeclared(folder: Path, requirements, skip=("fixtures",)) -> list[str]:
    """One line per module imported under `folder` that no requirement brings in."""
    declared = _closure(requirements)
    providers = metadata.packages_distributions()
    missing = []
    for module, files in sorted(_imports(folder, skip).items()):
        dists = {d.lower().replace("_", "-") for d in providers.get(module, [])}
        if not dists:
            missing.append(f"{module}: not installed here ({', '.join(sorted(files))})")
        elif not dists & declared:
            missing.append(f"{module} (from {', '.join(sorted(dists))}): no declared dependency brings it in "
                           f"({', '.join(sorted(files))})")
    return missing


PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_every_import_of_the_package_comes_from_a_declared_dependency():
    assert undeclared(ROOT / "ensdiag", PROJECT["dependencies"], skip=("integrations", "harness.py", "lightning.py")) == []


def test_the_lightning_callback_imports_only_the_dependencies_and_its_extra():
    assert undeclared(ROOT / "ensdiag" / "lightning.py",
                      [*PROJECT["dependencies"], *PROJECT["optional-dependencies"]["lightning"]]) == []


def test_the_lm_eval_harness_imports_only_the_dependencies_and_the_llm_extra():
    """ensdiag/lora/harness.py (`evaluate ADAPTER_DIR…`) imports lm-eval, which the `llm` extra brings
    (with transformers and peft, which lm-eval imports itself) and which not every test
    environment has; nothing else it imports is undeclared."""
    assert {_distribution(requirement) for requirement in PROJECT["optional-dependencies"]["llm"]} == {"lm-eval"}
    found = undeclared(ROOT / "ensdiag" / "lora" / "harness.py", [*PROJECT["dependencies"], "lm-eval"])
    assert found in ([], ["lm_eval: not installed here (harness.py)"])


@pytest.mark.parametrize("integration", sorted(p.stem for p in (ROOT / "ensdiag" / "integrations").glob("[!_]*.py")))
def test_each_integration_imports_only_the_dependencies_and_its_own_extra(integration):
    extras = PROJECT["optional-dependencies"]
    assert integration in extras, f"ensdiag/integrations/{integration}.py needs an extra of the same name"
    path = ROOT / "ensdiag" / "integrations" / f"{integration}.py"
    assert undeclared(path, [*PROJECT["dependencies"], *extras[integration]]) == []
    assert set(extras[integration]) <= set(extras["test"])  # so CI tests it


def test_every_import_of_the_tests_comes_from_a_dependency_or_the_test_extra():
    assert undeclared(ROOT / "tests", [*PROJECT["dependencies"], *PROJECT["optional-dependencies"]["test"]]) == []


def test_an_undeclared_import_is_caught(tmp_path):
    """pip is in every virtual environment and no dependency of ensdiag's: importing it would work
    here and nowhere else. A module installed nowhere is caught too."""
    package = tmp_path / "ensdiag"
    package.mkdir()
    (package / "fine.py").write_text("import json\nimport numpy\nfrom torch import nn\nfrom . import fine\n")
    (package / "sneaky.py").write_text("import pip\nfrom ensdiag_surely_absent.sub import thing\n")
    found = undeclared(package, PROJECT["dependencies"])
    assert len(found) == 2
    assert found[0].startswith("ensdiag_surely_absent: not installed here (sneaky.py)")
    assert found[1].startswith("pip (from pip): no declared dependency brings it in (sneaky.py)")


@pytest.mark.slow
def test_the_wheel_works_outside_the_repository_with_its_package_data(tmp_path):
    """Built as a user's pip builds it, unpacked on its own (what installing it lays out), and run
    from another folder: the entry point, the presets, a training, and a report validated against
    the schema the wheel carries."""
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels),
                    str(ROOT)], check=True, capture_output=True, timeout=300)
    wheel, = wheels.glob("ensdiag-*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
        names = archive.namelist()
    assert "ensdiag/report/schema.json" in names and not any(name.startswith("tests/") for name in names)
    work = tmp_path / "elsewhere"
    work.mkdir()
    script = f"""
import json, sys
from importlib import metadata, resources
import jsonschema
import ensdiag
from ensdiag.entry import main
from ensdiag.config import PRESETS
assert ensdiag.__file__.startswith({str(site)!r}), ensdiag.__file__
assert metadata.version("ensdiag") == ensdiag.__version__
entry, = [e for e in metadata.entry_points(group="console_scripts") if e.name == "ensdiag"]
assert entry.load() is main
assert sorted(PRESETS) == ["cifar10", "digits", "mnist"]
for argv in (["train", "--method", "single", "--seeds", "1", "--epochs", "1", "--no-geometry", "--quiet", "--out", "run"],
             ["report", "run", "--format", "json", "--no-figures", "--out", "report.json"]):
    try:
        main(argv)
    except SystemExit as done:
        assert not done.code, (argv, done.code)
schema = json.loads(resources.files("ensdiag.report").joinpath("schema.json").read_text())
jsonschema.validate(json.load(open("report.json")), schema)
print("wheel ok")
"""
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run([sys.executable, "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "wheel ok" in done.stdout


def test_the_gpu_review_table_is_the_committed_cost_model_json():
    """docs/gpu.md's estimates are the JSON's numbers: regenerating the JSON without the docs fails here."""
    import importlib.util
    import json
    spec = importlib.util.spec_from_file_location("cost_model", ROOT / "benchmarks" / "cost_model.py")
    cost_model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cost_model)
    result = json.loads((ROOT / "benchmarks" / "results" / "cost-model-resnet18-cifar10.json").read_text())
    assert result["kind"] == "estimate"
    assert cost_model.markdown(result) in (ROOT / "docs" / "gpu.md").read_text()
