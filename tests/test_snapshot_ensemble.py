"""Procedural ensembles as kits: the snapshot ensemble's cyclic cosine schedule, members stored at
the cycle ends, an exact resume after an interrupt, and the checkpoint ensemble's evenly spaced
members of an ordinary run; both trained, diagnosed and reported like every method."""

import math

import pytest
import torch

import ensdiag
from ensdiag.nn.kits.snapshot_ensemble import cycle_ends
from ensdiag.train import fit
from tests.cli import assert_one_line_error, run_cli
from tests.test_train import digits_fit_data, small


def _fit(method, tmp_path, epochs=6, on_epoch=None, state="state.pt"):
    config = small(methods=[method], members=3, epochs=epochs, batch_size=64, early_stopping=True, patience=1)
    torch.manual_seed(0)
    model = ensdiag.build_model("mlp", method, 3, 10, (1, 8, 8))
    result = fit(model, config, digits_fit_data(), 0, tmp_path / state, torch.device("cpu"), on_epoch=on_epoch)
    return model, result, config


def test_the_learning_rate_restarts_every_cycle_and_follows_half_a_cosine(tmp_path):
    model, result, config = _fit("snapshot-ensemble", tmp_path)
    assert cycle_ends(6, 3) == [2, 4, 6]
    expected = [config.lr * 0.5 * (1 + math.cos(math.pi * t)) for t in (0, 0.5) * 3]
    assert [row["lr"] for row in result["history"]] == pytest.approx(expected)
    assert len(result["history"]) == 6  # the run's early stopping does not cut the cycles short


@pytest.mark.parametrize("method", ["snapshot-ensemble", "checkpoint-ensemble"])
def test_each_member_is_the_network_at_the_end_of_its_cycle(method, tmp_path):
    config = small(methods=[method], members=3, epochs=6, batch_size=64)
    torch.manual_seed(0)
    model = ensdiag.build_model("mlp", method, 3, 10, (1, 8, 8))
    trained = {}  # the live network's weights after each epoch

    def remember(row):
        trained[row["epoch"]] = {name.removeprefix("body."): p.detach().clone() for name, p in model.named_parameters()}

    fit(model, config, digits_fit_data(), 0, tmp_path / "state.pt", torch.device("cpu"), on_epoch=remember)
    for member, epoch in enumerate(cycle_ends(6, 3)):
        stored = model.member_state_dict(member)
        for name, tensor in trained[epoch].items():
            assert torch.equal(stored[name], tensor), (member, name)


def test_an_interrupted_run_resumes_to_the_same_members(tmp_path):
    whole, _, _ = _fit("snapshot-ensemble", tmp_path / "a")

    class Interrupt(Exception):
        pass

    def stop_after_three(row):
        if row["epoch"] == 3:
            raise Interrupt

    with pytest.raises(Interrupt):
        _fit("snapshot-ensemble", tmp_path / "b", on_epoch=stop_after_three)
    resumed, result, _ = _fit("snapshot-ensemble", tmp_path / "b")
    assert [row["epoch"] for row in result["history"]] == [1, 2, 3, 4, 5, 6]
    for (key, a), (_, b) in zip(whole.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), key  # the stored members too: they live in the saved state


def test_members_differ_and_predictions_run_each_member(tmp_path):
    model, _, _ = _fit("snapshot-ensemble", tmp_path)
    model.eval()
    x = torch.rand(5, 1, 8, 8)
    logits = model(x)
    for i in range(3):
        torch.testing.assert_close(model.member_network(i)(x)[0], logits[i])
    assert not torch.equal(logits[0], logits[2])


def test_too_few_epochs_for_the_members_is_refused_before_training(tmp_path, capsys):
    assert_one_line_error(capsys, "train", "--method", "snapshot-ensemble", "--epochs", "2", "--members", "4",
                          "--out", tmp_path / "run", match="need --epochs 4 or more")
    assert not (tmp_path / "run").exists()


def test_both_are_trained_diagnosed_and_reported(tmp_path, capsys):
    code, out, err = run_cli(capsys, "train", "--method", "snapshot-ensemble,checkpoint-ensemble", "--seeds", "1",
                             "--epochs", "4", "--members", "2", "--out", tmp_path / "run", "--quiet")
    assert code == 0, err
    code, out, err = run_cli(capsys, "report", tmp_path / "run", "--format", "markdown", "--no-figures")
    assert code == 0, err
    assert "Snapshot Ensemble" in out and "Checkpoint Ensemble" in out
    code, out, err = run_cli(capsys, "diversity", tmp_path / "run" / "snapshot-ensemble" / "seed-1" / "model.safetensors",
                             "--no-geometry")
    assert code == 0 and "weight cosine, all layers" in out
