"""Training: loss semantics, reproducibility, exact resume, early stopping, bad input."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

import ensdiag
from ensdiag.config import preset_config
from ensdiag.data import get_dataset
from ensdiag.data.batching import Normalize, epoch_permutations
from ensdiag.experiment import run_experiment
from ensdiag.progress import TrainProgress
from ensdiag.nn import METHODS
from ensdiag.train import FitData, fit, make_optimizer, train_epoch

from .cli import assert_one_line_error, run_cli


def small(**overrides):
    options = dict(methods=["single"], seeds=[1], epochs=3, members=2)
    options.update(overrides)
    return preset_config("digits", **options)


def digits_fit_data(n=256):
    split = get_dataset("digits").load(split="train")
    return FitData(split.images[:n], split.labels[:n], split.images[n:n + 64], split.labels[n:n + 64],
                   Normalize((0.3,), (0.37,)))


def test_deep_ensemble_member_trained_alone_equals_member_inside_the_ensemble():
    config = small(methods=["deep-ensemble"], members=3, batch_size=32)
    data = digits_fit_data()
    ensemble = ensdiag.build_model("mlp", "deep-ensemble", 3, 10, (1, 8, 8))
    alone = ensdiag.build_model("mlp", "single", 1, 10, (1, 8, 8))
    alone.load_state_dict({f"body.{k}": v for k, v in ensemble.member_state_dict(1).items()})
    g = torch.Generator().manual_seed(0)
    orders = [epoch_permutations(len(data.train_images), 3, g, "cpu") for _ in range(2)]
    for model, rows in ((ensemble, slice(None)), (alone, slice(1, 2))):
        optimizer, _ = make_optimizer(model, config)
        for order in orders:  # member 1 follows its own shuffle in both cases
            train_epoch(model, optimizer, data, order[rows], config, g)
    for key, value in alone.state_dict().items():
        torch.testing.assert_close(ensemble.member_state_dict(1)[key.removeprefix("body.")], value, rtol=1e-5, atol=1e-6)


def test_each_deep_ensemble_member_stops_and_keeps_its_weights_as_a_single_run_of_it_would(tmp_path, monkeypatch):
    """Member i of a Deep Ensemble trained by `fit` with early stopping is the `single` run that starts from its
    weights and follows its data order: the same epochs, validation accuracies, stop and kept weights."""
    import ensdiag.train as training
    config = small(methods=["deep-ensemble"], members=3, batch_size=32, epochs=12, patience=2, lr=0.01)
    data = digits_fit_data(128)
    ensemble = ensdiag.build_model("mlp", "deep-ensemble", 3, 10, (1, 8, 8))
    initial = [ensemble.member_state_dict(i) for i in range(3)]
    initial = [{key: value.clone() for key, value in state.items()} for state in initial]
    drawn, permutations = [], training.epoch_permutations
    monkeypatch.setattr(training, "epoch_permutations", lambda *a: drawn.append(permutations(*a)) or drawn[-1])
    together = fit(ensemble, config, data, 1, tmp_path / "together.pt", "cpu")
    assert len(set(together["weights_epoch"])) > 1  # the members stopped at different epochs
    assert len(together["history"]) < config.epochs  # and the ensemble stopped when its last member did
    for i in range(3):
        alone = ensdiag.build_model("mlp", "single", 1, 10, (1, 8, 8))
        alone.load_state_dict({f"body.{key}": value for key, value in initial[i].items()})
        rows = iter([order[i:i + 1] for order in drawn])
        monkeypatch.setattr(training, "epoch_permutations", lambda *a: next(rows))
        single = fit(alone, config, data, 1, tmp_path / f"alone-{i}.pt", "cpu")
        epochs = len(single["history"])
        assert single["weights_epoch"] == together["weights_epoch"][i] and together["members_stopped_early"][i]
        assert [row["val_accuracy"] for row in single["history"]] == pytest.approx(
            [row["val_member_accuracy"][i] for row in together["history"][:epochs]])
        for key, value in alone.state_dict().items():
            torch.testing.assert_close(ensemble.member_state_dict(i)[key.removeprefix("body.")], value,
                                       rtol=1e-5, atol=1e-6)


def test_a_deep_ensemble_state_saved_before_members_stopped_apart_resumes_with_one_rule(tmp_path):
    config = small(methods=["deep-ensemble"], members=2, epochs=3, patience=1, min_delta=1.0)  # nothing improves
    state = tmp_path / "state.pt"
    fit(ensdiag.build_model("mlp", "deep-ensemble", 2, 10, (1, 8, 8)), small(methods=["deep-ensemble"], members=2,
        epochs=1), digits_fit_data(64), 1, state, "cpu")
    saved = torch.load(state, weights_only=True)
    model = ensdiag.build_model("mlp", "deep-ensemble", 2, 10, (1, 8, 8))
    saved["best"] = {"accuracy": 0.5, "epoch": 0, "bad_epochs": 0, "state": model.state_dict()}  # as 0.7 saved it
    torch.save(saved, state)
    result = fit(model, config, digits_fit_data(64), 1, state, "cpu")
    assert result["weights_epoch"] == 1 and result["stopped_early"] and "members_stopped_early" not in result
    assert len(result["history"]) == 2 and "val_member_accuracy" not in result["history"][-1]


@pytest.mark.parametrize("split_batch", [False, True])
def test_batch_ensemble_shared_weight_steps_like_a_single_model_when_fast_weights_are_one(split_batch):
    """The loss is the mean CE over all k·B rows, so W gets a single model's gradient, not k times it."""
    config = small(methods=["batch-ensemble"], members=4, batch_size=64, optimizer="sgd", momentum=0.0, nesterov=False,
                   weight_decay=0.0, lr=0.5, be_split_batch=split_batch)
    data = digits_fit_data(n=64)
    ensemble = ensdiag.build_model("mlp", "batch-ensemble", 4, 10, (1, 8, 8), init="ones")
    single = ensdiag.build_model("mlp", "single", 1, 10, (1, 8, 8))
    layers = list(ensemble.body.hidden) + [ensemble.body.head]
    with torch.no_grad():
        for be, plain in zip(layers, list(single.body.hidden) + [single.body.head]):
            plain.weight.copy_(be.weight)
            plain.bias.copy_(be.bias[0])
    before = [layer.weight.detach().clone() for layer in layers]
    order = torch.arange(64)[None]
    for model in (ensemble, single):
        optimizer, _ = make_optimizer(model, config)
        train_epoch(model, optimizer, data, order, config, torch.Generator().manual_seed(0))
    for be, plain, start in zip(layers, list(single.body.hidden) + [single.body.head], before):
        torch.testing.assert_close(be.weight - start, plain.weight - start, rtol=1e-4, atol=1e-7)
        assert (be.weight - start).abs().max() > 1e-4  # the step is not empty


def test_batch_ensemble_members_see_every_example_or_a_disjoint_split():
    x, y = torch.randn(1, 8, 3), torch.arange(8)[None]
    kit = METHODS["batch-ensemble"](4)
    xs, ys = kit.member_batch(x, y)
    assert xs.shape == (4, 8, 3) and all(torch.equal(xs[i], x[0]) for i in range(4))
    assert all(torch.equal(ys[i], y[0]) for i in range(4))
    xs, ys = kit.member_batch(x, y, split_batch=True)
    assert xs.shape == (4, 2, 3) and sorted(ys.flatten().tolist()) == list(range(8))


def test_runs_are_reproducible(tmp_path):
    config = small(methods=["mc-dropout", "deep-ensemble"])
    for name in ("a", "b"):
        run_experiment(config, tmp_path / name, "data", quiet=True)
    for method in ("mc-dropout", "deep-ensemble"):
        a = load_file(tmp_path / "a" / method / "seed-1" / "predictions.safetensors")
        b = load_file(tmp_path / "b" / method / "seed-1" / "predictions.safetensors")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def final_weights(run_dir, method="batch-ensemble"):
    return load_file(run_dir / method / "seed-1" / "model.safetensors")


@pytest.mark.parametrize("method, stopping", [("batch-ensemble", {"early_stopping": False}),
                                             ("deep-ensemble", {"patience": 2, "lr": 0.01})])  # members stop apart
def test_interrupted_run_resumes_to_identical_weights(tmp_path, monkeypatch, method, stopping):
    config = small(methods=[method], epochs=8, **stopping)
    run_experiment(config, tmp_path / "straight", "data", quiet=True)

    original = TrainProgress.epoch

    def interrupt_after_epoch_3(self, row, epochs):
        original(self, row, epochs)
        if row["epoch"] == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(TrainProgress, "epoch", interrupt_after_epoch_3)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(config, tmp_path / "cut", "data", quiet=True)
    assert (tmp_path / "cut" / method / "seed-1" / "training-state.pt").exists()
    assert not (tmp_path / "cut" / method / "seed-1" / "model.safetensors").exists()
    monkeypatch.setattr(TrainProgress, "epoch", original)
    run_experiment(config, tmp_path / "cut", "data", quiet=True)
    straight, resumed = final_weights(tmp_path / "straight", method), final_weights(tmp_path / "cut", method)
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    history, meta = ((folder / method / "seed-1" / name).read_text() for folder in (tmp_path / "cut",)
                     for name in ("history.jsonl", "meta.json"))
    assert [json.loads(line)["epoch"] for line in history.splitlines()][:4] == [1, 2, 3, 4]
    assert json.loads(meta)["weights_epoch"] == json.loads(
        (tmp_path / "straight" / method / "seed-1" / "meta.json").read_text())["weights_epoch"]


@pytest.mark.slow
def test_killed_process_resumes_to_identical_weights(tmp_path):
    args = ["--method", "deep-ensemble", "--seeds", "1", "--epochs", "40", "--members", "2", "--quiet"]
    env = dict(os.environ)
    command = [sys.executable, "-m", "ensdiag", "train", *args]
    subprocess.run([*command, "--out", str(tmp_path / "straight")], check=True, env=env, capture_output=True)
    process = subprocess.Popen([*command, "--out", str(tmp_path / "cut")], env=env)
    state = tmp_path / "cut" / "deep-ensemble" / "seed-1" / "training-state.pt"
    deadline = time.time() + 60
    while not state.exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()
    if not state.exists():
        pytest.skip("the run finished before it could be killed")
    done = subprocess.run([*command, "--out", str(tmp_path / "cut")], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    straight, resumed = final_weights(tmp_path / "straight", "deep-ensemble"), final_weights(tmp_path / "cut", "deep-ensemble")
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


def test_kill_during_the_final_save_resumes_to_identical_files(tmp_path, monkeypatch):
    import ensdiag.experiment as experiment
    config = small(methods=["batch-ensemble"], epochs=3, early_stopping=False)
    run_experiment(config, tmp_path / "straight", "data", quiet=True)

    def killed(model, path, *args, **kwargs):  # dies mid-write: a hidden partial file stays behind
        (path.parent / f".{path.name}.x1y2z3.tmp").write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(experiment, "save_model", killed)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(config, tmp_path / "cut", "data", quiet=True)
    folder = tmp_path / "cut" / "batch-ensemble" / "seed-1"
    assert (folder / "training-state.pt").exists() and not (folder / "meta.json").exists()
    monkeypatch.undo()
    run_experiment(config, tmp_path / "cut", "data", quiet=True)
    for name in ("model.safetensors", "predictions.safetensors"):
        assert (folder / name).read_bytes() == (tmp_path / "straight" / "batch-ensemble" / "seed-1" / name).read_bytes()
    assert not list((tmp_path / "cut").rglob("*.tmp")) and not (folder / "training-state.pt").exists()


def test_a_second_training_into_a_locked_run_folder_is_refused(tmp_path, capsys):
    from ensdiag.io import locked_folder
    out = tmp_path / "r"
    run_cli(capsys, "train", "--method", "single", "--seeds", "1", "--epochs", "1", "--out", out, "--quiet")
    before = (out / "experiment.json").read_bytes()
    with locked_folder(out):  # as another `ensdiag train` holds it while training
        assert_one_line_error(capsys, "train", "--method", "single", "--seeds", "1", "--epochs", "1", "--out", out,
                              "--quiet", match="another ensdiag process is writing to run folder")
        assert_one_line_error(capsys, "train", "--resume", out, "--quiet", match="another ensdiag process")
    assert (out / "experiment.json").read_bytes() == before


def test_early_stopping_keeps_the_best_validation_epoch(tmp_path):
    config = small(methods=["single"], epochs=20, patience=2, min_delta=1.0)  # nothing counts as improving
    run_experiment(config, tmp_path, "data", quiet=True)
    meta = json.loads((tmp_path / "single" / "seed-1" / "meta.json").read_text())
    assert meta["stopped_early"] and meta["epochs_run"] == 3 and meta["weights_epoch"] == meta["best_val_epoch"] == 1


def test_without_early_stopping_the_last_epoch_is_kept_and_named(tmp_path, capsys):
    code, _, _ = run_cli(capsys, "train", "--method", "single", "--seeds", "1", "--epochs", "4", "--no-early-stopping",
                         "--patience", "1", "--out", tmp_path / "r", "--quiet")
    meta = json.loads((tmp_path / "r" / "single" / "seed-1" / "meta.json").read_text())
    assert code == 0 and not meta["stopped_early"] and meta["epochs_run"] == 4
    assert meta["weights_epoch"] == 4 and meta["early_stopping"] is False and 1 <= meta["best_val_epoch"] <= 4


def test_cifar10_preset_trains_on_the_full_training_set_unless_asked(tmp_path, capsys):
    from tests.formats import write_cifar10_layout
    assert preset_config("cifar10").val_fraction == 0 and not preset_config("cifar10").early_stopping
    write_cifar10_layout(tmp_path / "data", per_batch=4)
    common = ["train", "--preset", "cifar10", "--method", "single", "--seeds", "1", "--epochs", "1", "--batch-size", "8",
              "--data-dir", tmp_path / "data", "--quiet"]
    code, _, _ = run_cli(capsys, *common, "--out", tmp_path / "full")
    history = json.loads((tmp_path / "full" / "single" / "seed-1" / "history.jsonl").read_text())
    meta = json.loads((tmp_path / "full" / "single" / "seed-1" / "meta.json").read_text())
    assert code == 0 and history["val_accuracy"] is None and meta["best_val_epoch"] is None and meta["weights_epoch"] == 1
    code, _, _ = run_cli(capsys, *common, "--val-fraction", "0.25", "--early-stopping", "--out", tmp_path / "held")
    history = json.loads((tmp_path / "held" / "single" / "seed-1" / "history.jsonl").read_text())
    assert code == 0 and history["val_accuracy"] is not None
    assert json.loads((tmp_path / "held" / "experiment.json").read_text())["config"]["val_fraction"] == 0.25


def test_mc_dropout_trained_without_dropout_is_the_single_model_with_dropout_at_test_time(tmp_path):
    common = dict(methods=["single", "mc-dropout"], epochs=3, early_stopping=False, dropout=0.2)
    run_experiment(small(**common, mc_dropout_train="off"), tmp_path / "off", "data", quiet=True)
    run_experiment(small(**common), tmp_path / "on", "data", quiet=True)
    single = final_weights(tmp_path / "off", "single")
    off, on = final_weights(tmp_path / "off", "mc-dropout"), final_weights(tmp_path / "on", "mc-dropout")
    assert all(torch.equal(single[k], off[k]) for k in single)  # no mask was drawn in training
    assert not all(torch.equal(single[k], on[k]) for k in single)
    model = ensdiag.load_model(tmp_path / "off" / "mc-dropout" / "seed-1" / "model.safetensors")
    assert model.spec.options["train_dropout"] is False
    x = torch.randn(5, 1, 8, 8)
    model.train()
    torch.testing.assert_close(model.forward_members(x[None])[0], model.forward_members(x[None])[0])
    model.eval()
    logits = model(x)
    assert not torch.equal(logits[0], logits[1])  # MC passes at test time
    stored = json.loads((tmp_path / "off" / "experiment.json").read_text())["config"]
    assert stored["mc_dropout_train"] == "off"


def test_overrides_are_recorded(tmp_path):
    config = preset_config("digits", methods=["single"], seeds=[5], epochs=2, lr=0.02, be_init="ones")
    run_experiment(config, tmp_path, "data", quiet=True)
    stored = json.loads((tmp_path / "experiment.json").read_text())
    assert stored["config"]["overrides"] == {"methods": ["single"], "seeds": [5], "epochs": 2, "lr": 0.02, "be_init": "ones"}
    assert stored["splits"]["shift"] == "digits-C (procedural)" and stored["skipped"] == {}


def test_a_different_experiment_in_the_folder_names_what_differs(tmp_path, capsys):
    run_cli(capsys, "train", "--method", "single", "--seeds", "1", "--epochs", "1", "--out", tmp_path / "r", "--quiet")
    assert_one_line_error(capsys, "train", "--method", "single", "--seeds", "1", "--epochs", "2", "--out", tmp_path / "r",
                          "--quiet", match=r"holds a different experiment \(epochs 1 there, 2 here\); use --resume")


def test_finished_runs_are_not_retrained(tmp_path, capsys):
    config = small()
    run_experiment(config, tmp_path, "data", quiet=True)
    before = (tmp_path / "single" / "seed-1" / "meta.json").stat().st_mtime_ns
    run_experiment(config, tmp_path, "data", quiet=False)
    assert (tmp_path / "single" / "seed-1" / "meta.json").stat().st_mtime_ns == before
    assert "already finished" in capsys.readouterr().err


def test_missing_shift_and_ood_are_skipped_and_recorded(tmp_path, monkeypatch):
    from ensdiag.data.sets import torchvision_sets
    from tests.formats import write_mnist_layout
    monkeypatch.setattr(torchvision_sets, "DEBIAN_FASHION_MNIST", tmp_path / "nowhere")
    write_mnist_layout(tmp_path / "data", n_train=40, n_test=10)
    config = preset_config("mnist", methods=["single"], seeds=[1], epochs=1, lr=0.001)
    run_experiment(config, tmp_path / "run", tmp_path / "data", quiet=True)
    stored = json.loads((tmp_path / "run" / "experiment.json").read_text())
    assert set(stored["skipped"]) == {"shift", "ood"} and "MNIST-C not found" in stored["skipped"]["shift"]
    predictions = load_file(tmp_path / "run" / "single" / "seed-1" / "predictions.safetensors")
    # val: temperature scaling; train: the seeded training sample behind the diversity gap
    assert set(predictions) == {"id/logits", "id/labels", "val/logits", "val/labels", "train/logits", "train/labels"}


@pytest.mark.parametrize("args,match", [
    (["--preset", "imagenet"], "unknown preset 'imagenet'"),
    (["--method", "single,bagging"], "unknown method 'bagging'"),
    (["--seeds", "1,x"], "--seeds must be a comma-separated list"),
    (["--preset", "mnist", "--data-dir", "{tmp}/empty", "--out", "{tmp}/r"],
     r"MNIST not found: missing .*train-images-idx3-ubyte.*--download"),
    (["--out", "{tmp}/file.txt/run"], "cannot write to --out"),
    (["--resume", "{tmp}"], "is not an ensdiag run"),
    (["--resume", "{tmp}", "--epochs", "3"], "drop epochs"),
    (["--preset", "cifar10", "--early-stopping"], "early stopping needs a validation split"),
    (["--method", "batch-ensemble-kernel"], "kernel-wise BatchEnsemble perturbs convolution kernels and mlp has none"),
    (["--method", "batch-ensemble", "--be-variant", "kernel"], "mlp has none"),
    (["--be-layout", "mine"], "--be-layout .*must be original or paper"),
    (["--mc-dropout-train", "maybe"], "--mc-dropout-train .*must be on or off"),
    (["--patience", "0"], "--patience must be at least 1"),
    (["--val-fraction", "1.5"], r"--val-fraction must lie in \[0, 1\)"),
])
def test_bad_input_is_one_line_and_non_zero(tmp_path, capsys, args, match):
    (tmp_path / "file.txt").write_text("not a folder")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    assert_one_line_error(capsys, "train", "--quiet", *args, match=match)


def test_missing_data_leaves_no_run_folder_behind(tmp_path, capsys):
    out = tmp_path / "runs" / "r"
    assert_one_line_error(capsys, "train", "--quiet", "--preset", "mnist", "--data-dir", tmp_path / "empty",
                          "--out", out, match="MNIST not found")
    assert not out.exists()


def test_cli_train_writes_the_run_folder(tmp_path, capsys):
    code, out, _ = run_cli(capsys, "train", "--method", "single", "--seeds", "3", "--epochs", "2", "--out", tmp_path / "r", "--quiet")
    assert code == 0 and out.strip() == str(tmp_path / "r")
    files = sorted(p.name for p in (tmp_path / "r" / "single" / "seed-3").iterdir())
    assert files == ["history.jsonl", "meta.json", "metrics.json", "model.safetensors", "predictions.safetensors"]


def subnormals_survive() -> bool:
    return (torch.tensor([1e-39]) * 1.5).item() != 0.0


@pytest.mark.parametrize("stage", ["fit", "predict", "bench"])
def test_training_prediction_and_bench_flush_denormals(stage, tmp_path, capsys):
    """Fast weights decay into subnormal floats, whose arithmetic is slow on some CPUs: every stage flushes them."""
    torch.set_flush_denormal(False)
    assert subnormals_survive()
    try:
        if stage == "fit":
            model = ensdiag.build_model("mlp", "single", 1, 10, (1, 8, 8))
            fit(model, small(epochs=1), digits_fit_data(64), 1, tmp_path / "state.pt", "cpu")
        elif stage == "predict":
            from ensdiag.data.registry import Split
            from ensdiag.core.predict import predict
            predict(ensdiag.build_model("mlp", "single", 1, 10, (1, 8, 8)),
                    {"id": Split(torch.zeros(4, 1, 8, 8), None)}, Normalize((0.0,), (1.0,)), torch.device("cpu"))
        else:
            assert run_cli(capsys, "bench", "--train-size", 64, "--test-size", 16, "--epochs", 1, "--method", "single",
                           "--no-reference", "--results-dir", tmp_path)[0] == 0
        assert not subnormals_survive()
    finally:
        torch.set_flush_denormal(False)


def test_restart_removes_only_ensdiag_temporaries_of_its_own_run(tmp_path, capsys):
    out = tmp_path / "r"
    run_cli(capsys, "train", "--method", "single", "--seeds", "1", "--epochs", "1", "--out", out, "--quiet")
    stale = [out / ".experiment.json.ab12cd34.tmp", out / "single" / "seed-1" / ".model.safetensors.x_y9z8w7.tmp"]
    kept = [out / ".notes.tmp", out / "single" / "seed-1" / "deeper" / ".metrics.json.ab12cd34.tmp",
            out / ".model.safetensors.tmp"]
    for path in stale + kept:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    run_cli(capsys, "train", "--method", "single", "--seeds", "1", "--epochs", "1", "--out", out, "--quiet")
    assert not any(p.exists() for p in stale) and all(p.exists() for p in kept)


def test_a_run_started_before_the_mean_loss_resumes_with_the_sum(tmp_path):
    from ensdiag.config import TrainConfig
    stored = small(methods=["batch-ensemble"]).to_dict()
    del stored["be_loss"]  # experiment.json as ensdiag wrote it before the loss was recorded
    config = TrainConfig.from_dict(stored)
    method, options = config.model_options("batch-ensemble")
    assert config.be_loss == "sum" and small().be_loss == "mean"
    assert ensdiag.build_model("mlp", method, 2, 10, (1, 8, 8), **options).kit.loss_over_members == "sum"


def test_a_state_saved_on_another_device_resumes_here_and_keeps_no_unused_best_copy(tmp_path):
    """A run started on a GPU (its state holds CUDA RNG states) resumes on the CPU; without early
    stopping no copy of the best weights is kept in the state."""
    config = small(epochs=2, early_stopping=False)
    state = tmp_path / "state.pt"
    first = ensdiag.build_model("mlp", "single", 1, 10, (1, 8, 8))
    fit(first, small(epochs=1, early_stopping=False), digits_fit_data(64), 1, state, "cpu")
    saved = torch.load(state, weights_only=True)
    assert saved["best"]["state"] is None and saved["device"] == "cpu"
    saved["rng"]["cuda"] = [torch.zeros(16, dtype=torch.uint8)]  # as a CUDA run saves it
    saved["device"] = "cuda:0"
    torch.save(saved, state)
    resumed = ensdiag.build_model("mlp", "single", 1, 10, (1, 8, 8))
    result = fit(resumed, config, digits_fit_data(64), 1, state, "cpu")
    assert [row["epoch"] for row in result["history"]] == [1, 2] and result["weights_epoch"] == 2


@pytest.mark.parametrize("decay", [True, False])
def test_batch_ensemble_fast_weights_form_their_own_optimiser_group(decay):
    """Two groups whatever the setting, as ensdiag 0.1 saved them: its training states resume."""
    model = ensdiag.build_model("resnet18", "batch-ensemble", 2, 10, (3, 8, 8))
    optimizer, _ = make_optimizer(model, small(weight_decay=1e-3, be_fast_weight_decay=decay))
    fast = {id(p) for name, p in model.named_parameters() if name.rsplit(".", 1)[-1] in ("r", "s")}
    assert len(optimizer.param_groups) == 2 and {id(p) for p in optimizer.param_groups[1]["params"]} == fast
    assert optimizer.param_groups[1]["weight_decay"] == (1e-3 if decay else 0.0)
    everything = [id(p) for group in optimizer.param_groups for p in group["params"]]
    assert sorted(everything) == sorted(id(p) for p in model.parameters())
