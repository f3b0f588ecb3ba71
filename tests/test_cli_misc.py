"""The smaller commands, and the CUDA path (skipped where there is no GPU)."""

import pytest
import torch

import ensdiag

from .cli import run_cli


def test_datasets_table_lists_every_dataset_and_where_it_looked(tmp_path, capsys):
    code, out, _ = run_cli(capsys, "datasets", "--data-dir", tmp_path)
    assert code == 0
    for name in ("mnist", "fashion-mnist", "mnist-c", "cifar10", "cifar10-c", "svhn", "digits", "digits-c", "natural-patches"):
        assert name in out
    assert "missing" in out and "found" in out


def test_models_table_prints_the_paper_parameter_counts(capsys):
    code, out, _ = run_cli(capsys, "models", "--arch", "resnet18")
    assert code == 0 and "11,173,962" in out and "44,695,848" in out
    assert "11,220,636" in out and "11,210,652" in out  # BatchEnsemble: the paper's layout and the original's
    code, out, _ = run_cli(capsys, "models", "--arch", "mlp")
    assert code == 0 and "kernel" not in out  # no convolutions: kernel-wise would be the channel-wise model


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_bf16_channels_last_training_step_gives_fp32_logits(tmp_path):
    from ensdiag.config import preset_config
    from ensdiag.experiment import run_experiment
    config = preset_config("digits", methods=["deep-ensemble", "batch-ensemble"], seeds=[1], epochs=2)
    run_experiment(config, tmp_path, "data", device="cuda", quiet=True)
    from ensdiag.predict import load_predictions
    predictions, _ = load_predictions(tmp_path / "batch-ensemble" / "seed-1" / "predictions.safetensors")
    assert predictions["id"]["logits"].dtype == torch.float32
    model = ensdiag.build_model("resnet18", "batch-ensemble", 4, 10, (3, 32, 32)).cuda().to(memory_format=torch.channels_last)
    x = torch.randn(8, 3, 32, 32, device="cuda").contiguous(memory_format=torch.channels_last)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(x)
    assert logits.shape == (4, 8, 10) and torch.isfinite(logits.float()).all()


def test_a_partial_shift_set_names_what_is_missing_wherever_the_pooled_number_appears(tmp_path, capsys, monkeypatch):
    from ensdiag.data.corrupted import MNIST_C_CORRUPTIONS

    from .formats import write_mnist_c, write_mnist_layout
    write_mnist_layout(tmp_path, "MNIST", n_train=40, n_test=10)
    write_mnist_layout(tmp_path, "FashionMNIST", seed=1)
    found, missing = MNIST_C_CORRUPTIONS[:5], MNIST_C_CORRUPTIONS[5:]
    write_mnist_c(tmp_path, found)
    monkeypatch.setenv("COLUMNS", "400")  # one table row per line
    code, out, _ = run_cli(capsys, "datasets", "--data-dir", tmp_path)
    row = next(line for line in out.splitlines() if "mnist-c" in line)
    note = f"5 of 15 corruptions; missing: {', '.join(missing)}"
    assert code == 0 and "partial" in row and "found" not in row and note in row
    code, _, _ = run_cli(capsys, "train", "--preset", "mnist", "--method", "single", "--seeds", "1", "--epochs", "1",
                         "--data-dir", tmp_path, "--out", tmp_path / "run", "-q")
    assert code == 0
    code, out, _ = run_cli(capsys, "report", tmp_path / "run", "--format", "markdown", "--no-figures")
    assert code == 0 and f"MNIST-C ({note}), pooled" in out
    model = tmp_path / "run" / "single" / "seed-1" / "model.safetensors"
    code, out, _ = run_cli(capsys, "evaluate", model, "--data-dir", tmp_path, "--format", "json")
    assert code == 0 and note in out
