"""Every component registers from its own module: the public lists, the generated docs page,
and a dataset and an analyzer added from this test file alone."""

from pathlib import Path

import pytest
import torch

import ensdiag
from ensdiag.registries import components_markdown
from tests.cli import run_cli

ROOT = Path(__file__).resolve().parents[1]


def test_the_public_lists_are_the_registries():
    from ensdiag.analysis import all_analyzers
    from ensdiag.data import all_datasets
    from ensdiag.nn import METHODS
    assert ensdiag.list_methods() == list(METHODS) and ensdiag.list_methods()[:4] == [
        "single", "mc-dropout", "deep-ensemble", "batch-ensemble"]
    assert ensdiag.list_analyzers() == list(all_analyzers()) and "calibration" in ensdiag.list_analyzers()
    assert ensdiag.list_datasets() == list(all_datasets()) and ensdiag.list_datasets()[0] == "mnist"


def test_docs_components_page_is_generated_from_the_registries():
    assert (ROOT / "docs" / "components.md").read_text() == components_markdown(), \
        "regenerate it: python -m ensdiag.registries > docs/components.md"


@pytest.fixture
def toy_dataset():
    from ensdiag.data.registry import DATASETS, Dataset, Split, register_dataset

    @register_dataset
    class Stripes(Dataset):
        name, role, title = "toy-stripes", "ID (test file)", "toy stripes"

        def expected_files(self, data_dir):
            return [Path(data_dir) / "stripes.npy"]

        def load(self, data_dir, split="test", download=False, **options):
            images = torch.zeros(10, 1, 4, 4)
            images[::2, :, ::2] = 1.0
            return Split(images, torch.arange(10) % 2, "toy stripes")

    yield Stripes
    del DATASETS["toy-stripes"]


def test_a_dataset_added_from_a_test_file_is_found_everywhere(toy_dataset, tmp_path, capsys):
    from ensdiag.data import get_dataset
    (tmp_path / "stripes.npy").write_bytes(b"")
    assert "toy-stripes" in ensdiag.list_datasets()
    assert len(get_dataset("toy-stripes").load(tmp_path)) == 10
    code, out, _ = run_cli(capsys, "datasets", "--data-dir", tmp_path)
    assert code == 0 and "toy-stripes" in out


def test_an_analyzer_added_from_a_test_file_runs_and_is_listed():
    from ensdiag.analysis import ANALYZERS, analyze_predictions, metric, register_analyzer

    @register_analyzer("toy-max-logit", description="mean of the largest member logit")
    def toy(predictions, weights=None):
        return {"value": metric(predictions["id"]["logits"].max(-1).values.mean().item(), "mean max logit")}

    try:
        assert "toy-max-logit" in ensdiag.list_analyzers()
        logits = torch.tensor([[[1.0, 3.0]], [[2.0, 0.0]]])
        result = analyze_predictions({"id": {"logits": logits, "labels": torch.tensor([1])}})
        assert result["analyzers"]["toy-max-logit"]["value"]["value"] == pytest.approx(2.5)
    finally:
        del ANALYZERS["toy-max-logit"]


def test_the_registry_helper_refuses_a_name_twice_keeps_order_and_recognises():
    from ensdiag.errors import EnsdiagError
    from ensdiag.registry import Registry
    kinds = Registry("kind")
    kinds.register("b")(2)
    kinds.add("a", 1, recognises=lambda thing: thing > 0)
    kinds.add("c", 3, recognises=lambda thing: thing > 10)
    assert list(kinds) == ["b", "a", "c"]  # the order registered, not the names'
    assert kinds.recognise(20) == "a" and kinds.recognise(5) == "a" and kinds.recognise(-1) is None  # first in order
    with pytest.raises(EnsdiagError, match="kind 'a' is registered twice"):
        kinds.add("a", 4)
    assert kinds["a"] == 1
    with pytest.raises(EnsdiagError, match="unknown kind 'aa'"):
        kinds.named("aa")
    ranked = Registry("ranked")
    for name, order in (("late", 30), ("early", 10), ("middle", 20), ("also-middle", 20)):
        ranked.add(name, None, order=order)
    assert list(ranked) == ["early", "middle", "also-middle", "late"]  # by order, ties as registered


def _again(kind):
    """Registering an entry under a name a built-in already has, through each registry's own decorator."""
    from ensdiag import export, integrations
    from ensdiag.analysis import register_analyzer
    from ensdiag.analysis.registry import register_resampler
    from ensdiag.data.corruptions import corruption
    from ensdiag.data.registry import Dataset, register_dataset
    from ensdiag.ensembles import adapter
    from ensdiag.foreign.readers import READERS
    from ensdiag.nn import register_arch, register_method
    from ensdiag.nn.kit import Kit
    from ensdiag.report.render import report_format
    entry = lambda *args: None  # noqa: E731

    def blur(images, generator):  # a corruption under a built-in's name
        return images
    return {"method": lambda: register_method("deep-ensemble")(type("Again", (Kit,), {})),
            "architecture": lambda: register_arch("mlp")(entry),
            "dataset": lambda: register_dataset(type("Again", (Dataset,), {"name": "mnist"})),
            "analyzer": lambda: register_analyzer("calibration")(entry),
            "resampler": lambda: register_resampler("calibration")(entry),
            "ensemble adapter": lambda: adapter("a callable", 99)(entry),
            "predictions reader": lambda: READERS.register("NumPy arrays (.npy, .npz)", recognises=bool)(entry),
            "--format": lambda: report_format("markdown", "md")(entry),
            "logger": lambda: integrations.LOGGERS.register("a TensorBoard SummaryWriter or Lightning's TensorBoardLogger",
                                                                recognises=bool)(entry),
            "table format": lambda: export.TABLE_FORMATS.register("csv")(entry),
            "corruption": lambda: corruption(blur)}[kind]


@pytest.mark.parametrize("kind", ["method", "architecture", "dataset", "analyzer", "resampler", "ensemble adapter",
                                  "predictions reader", "--format", "logger", "table format", "corruption"])
def test_every_registry_refuses_a_second_entry_under_a_built_in_name(kind):
    from ensdiag.errors import EnsdiagError
    ensdiag.list_datasets()  # the built-in datasets registered
    with pytest.raises(EnsdiagError, match=kind + r" (['\"]).*\1 is registered twice"):  # repr's quotes
        _again(kind)()
