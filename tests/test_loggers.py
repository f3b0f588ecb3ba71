"""A diagnosis logged to TensorBoard, MLflow and W&B by the real libraries into local folders, and
read back with each one's own reader: TensorBoard's EventAccumulator, MLflow's client on a local
SQLite store (what the pinned MLflow accepts without MLFLOW_ALLOW_FILE_STORE, with the `[mlflow]`
extra's SQLAlchemy and Alembic), W&B's offline run read by `wandb leet inspect` and listed by
`wandb sync --dry-run`. Directly from a Diagnosis, and through Lightning's loggers by
DiversityCallback at fit and test end. Each test skips without its library."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

import ensdiag
from ensdiag.errors import EnsdiagError

pytestmark = pytest.mark.slow  # the loggers' own libraries: the slow tier


def _data(n=90, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=generator), torch.randint(0, 3, (n,), generator=generator)


def _members(k=3):
    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)) for _ in range(k)]


@pytest.fixture(scope="module")
def diagnosis():
    x, y = _data()
    return ensdiag.diagnose(_members(), test=(x, y), ood=torch.randn(40, 6) * 3, train=(x, y))


def _measured(diagnosis):
    return {name: value for name, value in diagnosis.flat().items() if math.isfinite(value)}


def _events(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    events.Reload()
    return events


def test_tensorboard_gets_every_measured_number_the_heatmaps_and_the_summary(diagnosis, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.util import tensor_util
    from torch.utils.tensorboard import SummaryWriter
    writer = SummaryWriter(str(tmp_path / "tb"))
    diagnosis.log_to(writer, step=7)
    writer.close()
    events = _events(tmp_path / "tb")
    measured = _measured(diagnosis)
    assert set(events.Tags()["scalars"]) == {f"ensdiag/{name}" for name in measured}
    for name, value in measured.items():
        (event,) = events.Scalars(f"ensdiag/{name}")
        assert event.step == 7 and event.value == pytest.approx(value, rel=1e-6)  # stored as float32
    (image,) = events.Images("ensdiag/heatmaps")
    assert image.width > 400 and image.encoded_image_string[:4] == b"\x89PNG"
    (summary,) = events.Tensors("ensdiag/summary/text_summary")
    assert "members disagree" in tensor_util.make_ndarray(summary.tensor_proto).item().decode()
    diagnosis.log_to(writer := SummaryWriter(str(tmp_path / "tb2")), prefix="mine")  # another prefix
    writer.close()
    assert "mine/calibration/id/accuracy" in _events(tmp_path / "tb2").Tags()["scalars"]


@pytest.fixture
def mlflow_store(tmp_path, monkeypatch):
    """docs/loggers-and-exports.md's local store: a SQLite database (artifacts in ./mlruns beside the working folder).
    The file store stays refused, as on a fresh machine: MLFLOW_ALLOW_FILE_STORE is not set."""
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    monkeypatch.chdir(tmp_path)
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    yield mlflow
    mlflow.set_tracking_uri(None)


def read_offline_run(folder) -> dict:
    """What W&B's own reader (`wandb leet inspect --summary --json`, wandb-core's) finds in an offline run
    folder: its state, and the summary of every key logged (the last value of each); `wandb sync
    --dry-run` lists it as a run to upload."""
    def wandb(*args):
        done = subprocess.run([sys.executable, "-m", "wandb", *args], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "WANDB_SILENT": "true"})
        assert done.returncode == 0, done.stderr
        return done.stdout + done.stderr
    found = json.loads(wandb("leet", "inspect", "--summary", "--json", str(folder)))
    assert "Would sync 1 run" in wandb("sync", "--dry-run", str(folder))
    return found


def test_mlflow_keeps_every_measured_number_the_heatmaps_and_metrics_json(diagnosis, mlflow_store, tmp_path):
    mlflow = mlflow_store
    with mlflow.start_run() as run:
        diagnosis.log_to(mlflow, step=3)
    client = mlflow.tracking.MlflowClient()
    stored = client.get_run(run.info.run_id).data.metrics
    measured = _measured(diagnosis)
    assert set(stored) == {f"ensdiag/{name}" for name in measured}
    assert all(stored[f"ensdiag/{name}"] == pytest.approx(value) for name, value in measured.items())
    assert client.get_metric_history(run.info.run_id, "ensdiag/calibration/id/accuracy")[0].step == 3
    artifacts = {item.path for item in client.list_artifacts(run.info.run_id, "ensdiag")}
    assert {"ensdiag/heatmaps.png", "ensdiag/summary.txt", "ensdiag/metrics.json"} <= artifacts
    local = client.download_artifacts(run.info.run_id, "ensdiag/metrics.json", str(tmp_path))
    import json
    assert json.loads(open(local).read())["analyzers"]["calibration"]["splits"]["id"]["accuracy"]["value"] == \
        diagnosis.metrics["analyzers"]["calibration"]["splits"]["id"]["accuracy"]["value"]
    with pytest.raises(EnsdiagError, match="no active MLflow run"):
        diagnosis.log_to(mlflow)


@pytest.mark.parametrize("prefix, run_id", [("ensdiag", "../../../etc"), ("ensdiag", "0" * 32),
                                            ("../../escape", None), ("a/./b", None)])
def test_what_mlflow_refuses_is_an_ensdiag_error(diagnosis, mlflow_store, prefix, run_id):
    from ensdiag.integrations.mlflow import log_diagnosis
    with mlflow_store.start_run() as run, pytest.raises(EnsdiagError) as raised:
        log_diagnosis(diagnosis, run_id or run.info.run_id, prefix=prefix)
    assert "\n" not in str(raised.value) and (prefix in str(raised.value) or run_id in str(raised.value))


def test_what_wandb_refuses_is_an_ensdiag_error(diagnosis, tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(mode="offline", dir=str(tmp_path), project="ensdiag-test")
    run.finish()
    try:
        with pytest.raises(EnsdiagError, match="W&B refused"):
            diagnosis.log_to(run)  # a finished run
    finally:
        wandb.teardown()


def test_wandb_offline_run_holds_every_measured_number_and_the_heatmaps(diagnosis, tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_MODE", "offline")
    run = wandb.init(mode="offline", dir=str(tmp_path), project="ensdiag-test")
    diagnosis.log_to(run)
    run.finish()
    wandb.teardown()
    (folder,) = (tmp_path / "wandb").glob("offline-run-*")
    found = read_offline_run(folder)
    assert found["state"] == "finished" and found["project"] == "ensdiag-test"
    logged, measured = found["summary"], _measured(diagnosis)
    assert all(logged[f"ensdiag/{name}"] == pytest.approx(value) for name, value in measured.items())
    assert "members disagree" in logged["ensdiag/summary"]
    image = logged["ensdiag/heatmaps"]
    assert image["_type"] == "image-file" and (folder / "files" / image["path"]).read_bytes()[:4] == b"\x89PNG"


def test_a_run_folders_report_goes_to_tensorboard_with_the_verdict_and_figures(tmp_path):
    pytest.importorskip("tensorboard")
    from torch.utils.tensorboard import SummaryWriter
    from ensdiag.integrations import log_report
    from ensdiag.report import make_report
    x, y = _data()
    for method, k in (("single", 1), ("deep-ensemble", 3), ("batch-ensemble", 3)):
        for seed in (0, 1):
            torch.manual_seed(seed)
            members = [nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)) for _ in range(k)]
            ensdiag.diagnose(members, test=(x, y), ood=torch.randn(40, 6) * 3,
                             measure=ensdiag.Measure(geometry=False)).save(tmp_path / "run", method, seed)
    writer = SummaryWriter(str(tmp_path / "tb"))
    log_report(tmp_path / "run", writer)
    writer.close()
    report = make_report(tmp_path / "run", write=False)
    events = _events(tmp_path / "tb")
    diversity = report["verdict"]["batch-ensemble"]["diversity"]["value"]
    assert events.Scalars("ensdiag/verdict/batch-ensemble/diversity")[0].value == pytest.approx(diversity, rel=1e-6)
    accuracy = next(t for t in report["tables"] if t["id"] == "id")["rows"][1]["cells"][0]["mean"]
    assert events.Scalars("ensdiag/deep-ensemble/calibration/id/accuracy")[0].value == pytest.approx(accuracy, rel=1e-6)
    assert {"ensdiag/figures/diversity", "ensdiag/figures/reliability"} <= set(events.Tags()["images"])
    assert "ensdiag/verdict/batch-ensemble/text_summary" in events.Tags()["tensors"]


def test_an_unknown_target_is_a_clear_error(diagnosis):
    with pytest.raises(EnsdiagError, match="cannot log to a dict"):
        diagnosis.log_to({})


# ---------------------------------------------------------------- through Lightning's loggers

lightning = pytest.importorskip("lightning")


class Members(lightning.LightningModule):
    def __init__(self):
        super().__init__()
        self.members = nn.ModuleList(_members())
        self.dropout = nn.Dropout(0.5)  # the diagnosis must see the module in eval mode, and leave its mode

    def forward(self, x):
        return torch.stack([m(self.dropout(x)) for m in self.members])

    def training_step(self, batch, _):
        x, y = batch
        return sum(nn.functional.cross_entropy(m(x), y) for m in self.members)

    def test_step(self, batch, _):
        pass

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _trainer(loggers, callback):
    return lightning.Trainer(max_epochs=2, callbacks=[callback], logger=loggers, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1)


def _loader(seed):
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*_data(seed=seed)), batch_size=32)


def test_the_callback_logs_the_diagnosis_at_fit_and_test_end_through_lightning_loggers(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
    from ensdiag.lightning import DiversityCallback
    callback = DiversityCallback(_data(seed=1), members=lambda m: list(m.members), path=tmp_path / "d.jsonl",
                                 ood=torch.randn(30, 6) * 3, geometry=True)
    module = Members()
    loggers = [TensorBoardLogger(str(tmp_path / "tb")), CSVLogger(str(tmp_path / "csv"))]
    trainer = _trainer(loggers, callback)
    trainer.fit(module, _loader(0))
    fitted = callback.diagnosis
    assert module.training and module.dropout.training  # the module's mode as Lightning left it
    trainer.test(module, _loader(2))
    assert callback.diagnosis is not fitted and callback.diagnosis.predictions["id"]["logits"].shape[1] == 90
    with torch.no_grad():  # the test diagnosis is of the trained members in eval mode, on the test data
        expected = torch.stack([m(_data(seed=2)[0]) for m in module.members])
    torch.testing.assert_close(callback.diagnosis.predictions["id"]["logits"], expected)
    events = _events(next((tmp_path / "tb").rglob("events.out.tfevents.*")).parent)
    scalars = set(events.Tags()["scalars"])
    for stage, diagnosis in (("val", fitted), ("test", callback.diagnosis)):
        for name, value in _measured(diagnosis).items():
            assert f"ensdiag/{stage}/{name}" in scalars
        assert f"ensdiag/{stage}/heatmaps" in events.Tags()["images"]
    value = events.Scalars("ensdiag/test/calibration/id/accuracy")[0].value
    assert value == pytest.approx(callback.diagnosis.flat()["calibration/id/accuracy"], rel=1e-6)
    csv_text = next((tmp_path / "csv").rglob("metrics.csv")).read_text()
    assert "ensdiag/val/cka/id/mean" in csv_text and "ensdiag/test/ood/scores/msp/auroc" in csv_text


def test_the_callback_logs_through_mlflow_and_wandb_loggers(tmp_path, monkeypatch, mlflow_store):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_MODE", "offline")
    from lightning.pytorch.loggers import MLFlowLogger, WandbLogger
    from ensdiag.lightning import DiversityCallback
    callback = DiversityCallback(_data(seed=1), members=lambda m: list(m.members), path=tmp_path / "d.jsonl",
                                 geometry=False)
    mlflow_logger = MLFlowLogger(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    wandb_logger = WandbLogger(offline=True, save_dir=str(tmp_path))
    _trainer([mlflow_logger, wandb_logger], callback).fit(Members(), _loader(0))
    wandb_logger.experiment.finish()
    wandb.teardown()
    measured = _measured(callback.diagnosis)
    stored = mlflow_logger.experiment.get_run(mlflow_logger.run_id).data.metrics
    assert all(stored[f"ensdiag/val/{name}"] == pytest.approx(value) for name, value in measured.items())
    artifacts = {item.path for item in mlflow_logger.experiment.list_artifacts(mlflow_logger.run_id, "ensdiag/val")}
    assert "ensdiag/val/heatmaps.png" in artifacts
    found = read_offline_run(next((tmp_path / "wandb").glob("offline-run-*")))["summary"]
    assert found["ensdiag/val/calibration/id/accuracy"] == pytest.approx(measured["calibration/id/accuracy"])
    assert os.path.basename(found["ensdiag/val/heatmaps"]["path"]).startswith("heatmaps")
