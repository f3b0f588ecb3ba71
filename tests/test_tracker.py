"""Diversity over training outside `ensdiag train`: `ensdiag.Tracker` in a plain loop and the
Lightning callback in a real `lightning.Trainer`, both writing rows `ensdiag report` draws."""

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import ensdiag
from ensdiag.stats import metrics as M
from ensdiag.errors import EnsdiagError


def _members(k=3, seed=0):
    torch.manual_seed(seed)
    return [nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3)) for _ in range(k)]


def _data(n=64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, 10, generator=generator), torch.randint(0, 3, (n,), generator=generator)


def _train(members, x, y, epochs, tracker=None):
    optimizer = torch.optim.SGD([p for m in members for p in m.parameters()], lr=0.1)
    if tracker is not None:
        tracker.measure(0)
    for epoch in range(1, epochs + 1):
        for m in members:
            m.train()
        loss = sum(nn.functional.cross_entropy(m(x), y) for m in members)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if tracker is not None:
            tracker.measure(epoch)
    return [p.detach().clone() for m in members for p in m.parameters()]


def test_a_tracked_loop_trains_the_same_weights_and_records_every_epoch(tmp_path):
    x, y, val = *_data(), _data(seed=1)
    untracked = _members()  # the same initial weights (seeded), trained without a tracker
    torch.manual_seed(5)  # both loops draw their dropout masks from the same global state
    reference = _train(untracked, x, y, 3)
    members = _members()
    tracker = ensdiag.Tracker(members, val=val, path=tmp_path / "diversity.jsonl")
    torch.manual_seed(5)
    tracked = _train(members, x, y, 3, tracker)
    assert all(torch.equal(a, b) for a, b in zip(tracked, reference))  # measuring changed nothing
    rows = [json.loads(line) for line in (tmp_path / "diversity.jsonl").read_text().splitlines()]
    assert [row["epoch"] for row in rows] == [0, 1, 2, 3]
    assert all(m.training for m in members)  # the members' own mode, restored
    for m in members:
        m.eval()
    with torch.no_grad():
        logits = torch.stack([m(val[0]) for m in members])
    assert rows[-1]["disagreement"] == pytest.approx(M.mean_off_diagonal(M.disagreement_matrix(logits)))
    flat = [torch.cat([p.detach().flatten() for p in m.parameters()]).double() for m in members]
    assert rows[-1]["weight_cosine"] == pytest.approx(float(flat[0] @ flat[1] / (flat[0].norm() * flat[1].norm()) +
                                                            flat[0] @ flat[2] / (flat[0].norm() * flat[2].norm()) +
                                                            flat[1] @ flat[2] / (flat[1].norm() * flat[2].norm())) / 3,
                                                      abs=1e-6)
    assert rows[-1]["aligned_weight_cosine"] is None  # plain modules declare no permutation groups


def test_a_resumed_loop_replaces_the_rows_it_measures_again(tmp_path):
    path = tmp_path / "diversity.jsonl"
    members, val = _members(), _data(seed=1)
    tracker = ensdiag.Tracker(members, val=val, path=path)
    for epoch in range(4):
        tracker.measure(epoch)
    again = ensdiag.Tracker(members, val=val, path=path)  # the loop restarted from its epoch-2 checkpoint
    again.measure(2)
    assert [json.loads(line)["epoch"] for line in path.read_text().splitlines()] == [0, 1, 2]


def test_a_damaged_record_and_a_bad_epoch_are_clear_errors(tmp_path):
    (tmp_path / "diversity.jsonl").write_text("{not json\n")
    with pytest.raises(EnsdiagError, match="not a diversity record"):
        ensdiag.Tracker(_members(), val=_data(), path=tmp_path / "diversity.jsonl")
    with pytest.raises(EnsdiagError, match="epoch must be"):
        ensdiag.Tracker(_members(), val=_data()).measure(-1)


# ---------------------------------------------------------------- Lightning

lightning = pytest.importorskip("lightning")


class Members(lightning.LightningModule):
    def __init__(self, stacked=False):
        super().__init__()
        self.members = nn.ModuleList(_members())
        self.stacked = stacked

    def forward(self, x):
        logits = torch.stack([m(x) for m in self.members])
        return logits.flatten(0, 1) if self.stacked else logits  # torch-uncertainty's [k·B, C], or [k, B, C]

    def training_step(self, batch, _):
        x, y = batch
        return sum(nn.functional.cross_entropy(m(x), y) for m in self.members)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(module, callback, tmp_path, epochs=2):
    from lightning.pytorch.loggers import CSVLogger
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*_data()), batch_size=32)
    trainer = lightning.Trainer(max_epochs=epochs, callbacks=[callback], logger=CSVLogger(tmp_path / "logs"),
                                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                                accelerator="cpu", devices=1)
    trainer.fit(module, loader)
    return trainer


def test_the_lightning_callback_writes_rows_that_the_report_draws(tmp_path):
    from ensdiag.lightning import DiversityCallback
    from ensdiag.report import make_report
    run = tmp_path / "runs" / "mine"
    module = Members()
    callback = DiversityCallback(_data(seed=1), members=lambda m: list(m.members),
                                 path=run / "deep-ensemble" / "seed-0" / "diversity.jsonl")
    trainer = _fit(module, callback, tmp_path)
    rows = [json.loads(line) for line in (run / "deep-ensemble" / "seed-0" / "diversity.jsonl").read_text().splitlines()]
    assert [row["epoch"] for row in rows] == [0, 1, 2] and all(row["weight_cosine"] is not None for row in rows)
    logged = (tmp_path / "logs" / "lightning_logs" / "version_0" / "metrics.csv").read_text()
    assert "ensdiag/disagreement" in logged and "ensdiag/weight_cosine" in logged
    assert trainer.current_epoch == 2
    ensdiag.diagnose(list(module.members), test=_data(seed=2), measure=ensdiag.Measure(geometry=False)).save(run, "deep-ensemble", 0)
    report = make_report(run)
    assert "tracking" in {figure["name"] for figure in report["figures"]}


def test_stacked_outputs_need_the_member_count(tmp_path):
    from ensdiag.lightning import DiversityCallback
    callback = DiversityCallback(_data(seed=1), num_members=3, path=tmp_path / "d.jsonl")
    _fit(Members(stacked=True), callback, tmp_path, epochs=1)
    rows = [json.loads(line) for line in (tmp_path / "d.jsonl").read_text().splitlines()]
    assert [row["epoch"] for row in rows] == [0, 1] and rows[0]["disagreement"] is not None
    assert rows[0]["weight_cosine"] is None  # no member weights known: predictions only


def test_a_torch_uncertainty_routine_gives_its_member_weights(tmp_path):
    """A routine's `.model` holding torch-uncertainty's BatchEnsemble weights (the committed fixture,
    saved by torch-uncertainty itself) is read as ensdiag's model, so rows get a weight cosine."""
    from ensdiag.foreign.state_dicts import read_state_dict
    from ensdiag.lightning import _torch_uncertainty_model
    state = read_state_dict(Path(__file__).parent / "fixtures" / "torch_uncertainty" / "be_mlp.pt")

    class Stored(nn.Module):
        def state_dict(self, *args, **kwargs):
            return state

    class Routine(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = Stored()

    model = _torch_uncertainty_model(Routine())
    assert model is not None and model.method == "batch-ensemble" and len(model.member_weights()) == model.num_members
    assert _torch_uncertainty_model(Members()) is None  # no `.model`: predictions only
