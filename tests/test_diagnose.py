"""`ensdiag.diagnose` on members and data from anywhere: plain torchvision networks, a custom
module, a callable, tensors, Datasets and DataLoaders; saved folders that `ensdiag report` reads."""

import json

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ensdiag
from ensdiag.errors import EnsdiagError
from tests.cli import assert_one_line_error, run_cli


class TwoLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(12, 16)
        self.act = nn.ReLU()
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.act(self.hidden(x)))


def _data(n=60, d=12, classes=3, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=generator), torch.randint(0, classes, (n,), generator=generator)


def _dense_linear_cka(x, y):
    """Kornblith et al.'s linear CKA in float64 on features held in memory."""
    x, y = x.double() - x.double().mean(0), y.double() - y.double().mean(0)
    return float((y.T @ x).norm() ** 2 / ((x.T @ x).norm() * (y.T @ y).norm()))


def test_custom_modules_on_tensors_match_dense_references():
    torch.manual_seed(0)
    members = [TwoLayer() for _ in range(3)]
    x, y = _data()
    ood = torch.randn(40, 12) * 3
    diagnosis = ensdiag.diagnose(ensdiag.as_ensemble(members, layers=["hidden", "head"]), test=(x, y), ood=ood,
                                 train=(x, y))
    analyzers = diagnosis.metrics["analyzers"]
    with torch.no_grad():
        logits = torch.stack([member(x) for member in members])
    torch.testing.assert_close(diagnosis.predictions["id"]["logits"], logits)
    predicted = logits.argmax(-1)
    disagreement = (predicted[0] != predicted[1]).double().mean().item()
    assert analyzers["disagreement"]["splits"]["id"]["matrix"]["value"][0][1] == pytest.approx(disagreement)
    with torch.no_grad():
        hidden = [member.hidden(x) for member in members]
    cka = analyzers["cka"]["splits"]["id"]["layers"]["hidden"]["linear"]["value"]
    assert cka[0][1] == pytest.approx(_dense_linear_cka(hidden[0], hidden[1]), abs=1e-9)
    assert cka[1][2] == pytest.approx(_dense_linear_cka(hidden[1], hidden[2]), abs=1e-9)
    flat = [torch.cat([p.detach().flatten() for p in member.parameters()]).double() for member in members]
    cosine = float(flat[0] @ flat[1] / (flat[0].norm() * flat[1].norm()))
    assert analyzers["weight-similarity"]["matrix"]["value"][0][1] == pytest.approx(cosine, abs=1e-6)
    assert analyzers["paths"]["status"] == "ok" and analyzers["paths"]["train_n"] == 60
    assert analyzers["alignment"]["status"] == "skipped" and "permutation" in analyzers["alignment"]["reason"]
    assert analyzers["ood"]["status"] == "ok"
    # the user's modules are left as they were (paths work on copies)
    with torch.no_grad():
        torch.testing.assert_close(torch.stack([member(x) for member in members]), logits)


def test_three_torchvision_resnets_with_cka_at_named_modules():
    from torchvision.models import resnet18
    torch.manual_seed(0)
    members = [resnet18(num_classes=4) for _ in range(3)]
    x = torch.rand(24, 3, 32, 32)
    y = torch.randint(0, 4, (24,))
    loader = DataLoader(TensorDataset(x, y), batch_size=10)
    diagnosis = ensdiag.diagnose(ensdiag.as_ensemble(members, layers=["layer1", "avgpool", "fc"]), test=loader,
                                 measure=ensdiag.Measure(geometry_examples=16))
    cka = diagnosis.metrics["analyzers"]["cka"]["splits"]["id"]
    assert cka["n"] == 16 and set(cka["layers"]) == {"layer1", "avgpool", "fc"}
    assert all(member.training for member in members)  # diagnose left the members in their own mode
    for member in members:
        member.eval()  # the reference reads them as diagnose does: in evaluation mode
    with torch.no_grad():
        features = [member.layer1(member.maxpool(member.relu(member.bn1(member.conv1(x[:16]))))).mean(dim=(2, 3))
                    for member in members]
    assert cka["layers"]["layer1"]["linear"]["value"][0][2] == pytest.approx(
        _dense_linear_cka(features[0], features[2]), abs=1e-6)
    assert diagnosis.predictions["id"]["logits"].shape == (3, 24, 4)


def test_token_outputs_are_averaged_over_tokens_not_features():
    from ensdiag.geometry.representations import pooled
    tokens = torch.randn(5, 7, 4)  # [B, T, D]
    torch.testing.assert_close(pooled(tokens), tokens.mean(1))
    maps = torch.randn(5, 3, 2, 2)
    torch.testing.assert_close(pooled(maps), maps.mean(dim=(2, 3)))
    torch.testing.assert_close(pooled(maps, "channels-last"), maps.mean(dim=(1, 2)))
    torch.testing.assert_close(pooled((tokens, None)), tokens.mean(1))


def test_a_callable_gives_predictions_only_and_a_dataset_works_as_data():
    x, y = _data()
    weights = torch.randn(2, 12, 3)
    diagnosis = ensdiag.diagnose(lambda batch: torch.einsum("bd,kdc->kbc", batch, weights), test=TensorDataset(x, y))
    analyzers = diagnosis.metrics["analyzers"]
    assert analyzers["calibration"]["status"] == "ok"
    for name in ("weight-similarity", "cka", "paths", "alignment", "rank-structure"):  # each says why
        assert analyzers[name]["status"] == "skipped" and "declare" in analyzers[name]["reason"], name


def test_an_ensdiag_model_is_diagnosed_like_training_does():
    model = ensdiag.build_model("mlp", "deep-ensemble", 3, 4, (1, 4, 4))
    x, y = torch.rand(30, 1, 4, 4), torch.randint(0, 4, (30,))
    diagnosis = ensdiag.diagnose(model, test=(x, y), train=(x, y))
    assert diagnosis.metrics["analyzers"]["alignment"]["status"] == "ok"
    assert diagnosis.metrics["num_members"] == 3


def test_saved_diagnoses_make_a_report(tmp_path, capsys):
    x, y = _data()
    torch.manual_seed(1)
    for method, k in (("single", 1), ("deep-ensemble", 3)):
        for seed in (0, 1):
            members = [TwoLayer() for _ in range(k)]
            ensdiag.diagnose(members, test=(x, y), ood=torch.randn(20, 12), measure=ensdiag.Measure(geometry=False)).save(tmp_path / "mine", method, seed)
    experiment = json.loads((tmp_path / "mine" / "experiment.json").read_text())
    assert experiment["config"]["methods"] == ["single", "deep-ensemble"] and experiment["config"]["seeds"] == [0, 1]
    code, out, err = run_cli(capsys, "report", tmp_path / "mine", "--format", "markdown")
    assert code == 0, err
    assert "Deep Ensemble" in out or "deep-ensemble" in out
    markdown = ensdiag.diagnose([TwoLayer(), TwoLayer()], test=(x, y), measure=ensdiag.Measure(geometry=False)).to_markdown()
    assert "In-distribution" in markdown


@pytest.mark.parametrize("method", ["../up", "", "a" * 65, "with space"])
def test_a_method_name_must_be_a_plain_folder_name(tmp_path, method):
    diagnosis = ensdiag.diagnose([TwoLayer()], test=_data(), measure=ensdiag.Measure(geometry=False))
    with pytest.raises(EnsdiagError, match="method name"):
        diagnosis.save(tmp_path, method)
    assert not any(tmp_path.iterdir())


def test_a_training_run_is_not_extended_with_diagnoses(finished_run, tmp_path):
    import shutil
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    with pytest.raises(EnsdiagError, match="holds a training run"):
        ensdiag.diagnose([TwoLayer()], test=_data(), measure=ensdiag.Measure(geometry=False)).save(run, "mine")


def test_a_hostile_diagnosis_folder_is_a_one_line_error(tmp_path, capsys):
    ensdiag.diagnose([TwoLayer()], test=_data(), measure=ensdiag.Measure(geometry=False)).save(tmp_path / "mine", "single", 0)
    path = tmp_path / "mine" / "experiment.json"
    data = json.loads(path.read_text())
    data["config"]["methods"] = ["../../etc"]
    path.write_text(json.dumps(data))
    assert_one_line_error(capsys, "report", tmp_path / "mine", "--no-figures", match="methods must be distinct names")


@pytest.mark.parametrize("members,data,match", [
    ([], None, "members must be"),
    ("not a model", None, "does not exist"),  # a path: model files are one way in
    (3, None, "members must be"),
    ([TwoLayer()], "text", "give \\(x, y\\) tensors"),
    ([TwoLayer()], (torch.randn(5, 12), torch.zeros(4, dtype=torch.long)), "5 inputs but 4 labels"),
    (lambda x: x, None, "logits \\[k, B, C\\]"),
])
def test_bad_inputs_are_clear_errors(members, data, match):
    with pytest.raises(EnsdiagError, match=match):
        ensdiag.diagnose(members, test=data if data is not None else _data(), measure=ensdiag.Measure(geometry=False))


def test_unknown_layers_are_named():
    with pytest.raises(EnsdiagError, match="layer 'nope'"):
        ensdiag.diagnose(ensdiag.as_ensemble([TwoLayer(), TwoLayer()], layers=["nope"]), test=_data())
    with pytest.raises(EnsdiagError, match="layout must be one of"):
        ensdiag.diagnose(ensdiag.as_ensemble([TwoLayer(), TwoLayer()], layers={"hidden": "sideways"}), test=_data())


# --- a Ctrl-C keeps what was finished --------------------------------------------------------------

def _members_that_stop_on(marker: float):
    """Two linear members whose forward is a Ctrl-C on inputs holding `marker` (one split's)."""
    torch.manual_seed(0)
    members = [nn.Linear(4, 3), nn.Linear(4, 3)]

    def run(x):
        if bool((x == marker).any()):
            raise KeyboardInterrupt
        return torch.stack([member(x) for member in members])
    return run, members


def test_a_ctrl_c_while_predicting_keeps_the_splits_read_before_it():
    run, members = _members_that_stop_on(7.0)
    x, y = torch.randn(40, 4), torch.randint(0, 3, (40,))
    diagnosis = ensdiag.diagnose(ensdiag.as_ensemble(run, modules=members), test=(x, y), shift=(x * 2, y),
                                 ood=torch.full((20, 4), 7.0),
                                 measure=ensdiag.Measure(geometry=False),
                                 context=ensdiag.Context(progress=False))
    metrics = diagnosis.metrics
    assert metrics["interrupted"].startswith("Ctrl-C while predicting ood")
    assert set(diagnosis.predictions) == {"id", "shift"} and "interrupted" in metrics["skipped_splits"]["ood"]
    assert metrics["analyzers"]["calibration"]["splits"]["shift"]["nll"]["interval"]["low"] is not None
    assert "interrupted" in repr(diagnosis)
    with pytest.raises(KeyboardInterrupt):  # nothing finished: nothing to keep
        ensdiag.diagnose(ensdiag.as_ensemble(run, modules=members),
                         test=(torch.full((10, 4), 7.0), torch.zeros(10, dtype=torch.long)),
                         measure=ensdiag.Measure(geometry=False), context=ensdiag.Context(progress=False))


def test_a_ctrl_c_during_member_geometry_keeps_the_steps_finished(monkeypatch):
    from ensdiag.core import inspection
    real = inspection.analyze_model

    def stop_at_paths(probe, only, without_data=None):
        if only == ["paths"]:
            raise KeyboardInterrupt
        return real(probe, only=only, without_data=without_data)
    monkeypatch.setattr(inspection, "analyze_model", stop_at_paths)
    model = ensdiag.build_model("mlp", "deep-ensemble", 2, 3, (1, 4, 4))
    x, y = torch.rand(60, 1, 4, 4), torch.randint(0, 3, (60,))
    metrics = ensdiag.diagnose(model, test=(x, y), train=(x, y), context=ensdiag.Context(progress=False)).metrics
    analyzers = metrics["analyzers"]
    assert analyzers["alignment"]["status"] == "ok" and analyzers["cka"]["status"] == "ok"
    assert analyzers["paths"]["status"] == "skipped" and "interrupted" in analyzers["paths"]["reason"]
    assert "member geometry" in metrics["interrupted"] and analyzers["calibration"]["status"] == "ok"


def test_evaluate_interrupted_shows_and_saves_what_it_finished_then_exits_130(finished_run, tmp_path, capsys, monkeypatch):
    from ensdiag.core import predict
    real = predict.predict_batches

    def stop_at_ood(ensemble, batches, preprocess, device, keep=0, name="", bar=None):
        if name == "ood":
            raise KeyboardInterrupt
        return real(ensemble, batches, preprocess, device, keep, name, bar)
    monkeypatch.setattr(predict, "predict_batches", stop_at_ood)
    code, out, err = run_cli(capsys, "evaluate", finished_run / "batch-ensemble" / "seed-1" / "model.safetensors",
                             "--out", tmp_path / "partial")
    assert code == 130 and "Ctrl-C while predicting ood" in err and "NLL" in out
    saved = json.loads((tmp_path / "partial" / "metrics.json").read_text())
    assert saved["interrupted"] and "ood" in saved["skipped_splits"] and "shift" in saved["split_titles"]
