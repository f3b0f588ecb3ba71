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
    from ensdiag.predictions import load_predictions
    predictions, _ = load_predictions(tmp_path / "batch-ensemble" / "seed-1" / "predictions.safetensors")
    assert predictions["id"]["logits"].dtype == torch.float32
    model = ensdiag.build_model("resnet18", "batch-ensemble", 4, 10, (3, 32, 32)).cuda().to(memory_format=torch.channels_last)
    x = torch.randn(8, 3, 32, 32, device="cuda").contiguous(memory_format=torch.channels_last)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(x)
    assert logits.shape == (4, 8, 10) and torch.isfinite(logits.float()).all()


def test_the_peer_shortcut_bias_is_the_stated_parameter_difference():
    """docs/conventions.md: torch-uncertainty's batched ResNet-18 with conv_bias has 896 more parameters."""
    from ensdiag.nn import build_model
    counts = [sum(p.numel() for p in build_model("resnet18", "batch-ensemble", 4, 10, (3, 32, 32), layout="paper",
                                                  **options).parameters()) for options in ({}, {"shortcut_bias": True})]
    assert counts == [11_220_636, 11_221_532]


def test_a_partial_shift_set_names_what_is_missing_wherever_the_pooled_number_appears(tmp_path, capsys, monkeypatch):
    from ensdiag.data.sets.corrupted import MNIST_C_CORRUPTIONS

    from .formats import write_mnist_c, write_mnist_layout
    write_mnist_layout(tmp_path, "MNIST", n_train=40, n_test=10)
    write_mnist_layout(tmp_path, "FashionMNIST", seed=1)
    found, missing = MNIST_C_CORRUPTIONS[:5], MNIST_C_CORRUPTIONS[5:]
    write_mnist_c(tmp_path, found)
    code, out, _ = run_cli(capsys, "datasets", "--data-dir", tmp_path)
    lines = out.splitlines()
    at = next(index for index, line in enumerate(lines) if line.startswith("mnist-c"))
    note = f"5 of 15 corruptions; missing: {', '.join(missing)}"
    assert code == 0 and lines[at].endswith("partial") and note in lines[at + 1]
    code, _, _ = run_cli(capsys, "train", "--preset", "mnist", "--method", "single", "--seeds", "1", "--epochs", "1",
                         "--data-dir", tmp_path, "--out", tmp_path / "run", "-q")
    assert code == 0
    code, out, _ = run_cli(capsys, "report", tmp_path / "run", "--format", "markdown", "--no-figures")
    assert code == 0 and f"MNIST-C ({note}), pooled" in out
    model = tmp_path / "run" / "single" / "seed-1" / "model.safetensors"
    code, out, _ = run_cli(capsys, "evaluate", model, "--data-dir", tmp_path, "--format", "json")
    assert code == 0 and note in out


def test_version_and_short_help(capsys):
    code, out, _ = run_cli(capsys, "--version")
    assert code == 0 and out.strip() == f"ensdiag {ensdiag.__version__}"
    code, out, _ = run_cli(capsys, "train", "-h")
    assert code == 0 and "--preset" in out


def test_help_and_version_do_not_import_torch():
    """`ensdiag --help` starts in well under a second because nothing imports torch for it."""
    import subprocess
    import sys
    script = ("import sys\nfrom ensdiag.cli import main\n"
              "for args in (['--help'], ['--version'], ['train', '--help']):\n"
              "    try:\n        main(args)\n    except SystemExit:\n        pass\n"
              "sys.stderr.write(str('torch' in sys.modules))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stderr.strip().endswith("False"), done.stderr


def test_every_option_has_help_that_cites_no_missing_file():
    import typer.main

    from ensdiag.cli import app
    group = typer.main.get_command(app)
    for name, command in group.commands.items():
        for param in command.params:
            if param.param_type_name == "option":
                assert param.help, f"ensdiag {name} {param.opts[0]} has no help text"
                assert "protocol.md" not in param.help and "shared/" not in param.help


@pytest.mark.parametrize("args,match", [
    (["train", "--bogus"], r"No such option: --bogus.*ensdiag train --help"),
    (["evaluate"], "Missing argument"),
    (["train", "--epochs", "x"], "Invalid value for '--epochs'"),
])
def test_usage_errors_are_one_line_with_exit_code_2(capsys, args, match):
    from .cli import assert_one_line_error
    line = assert_one_line_error(capsys, *args, match=match)
    assert "Traceback" not in line


def test_interrupt_and_internal_error_exit_codes(capsys, monkeypatch):
    import ensdiag.experiment

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ensdiag.experiment, "run_experiment", interrupted)
    code, _, err = run_cli(capsys, "train", "--quiet")
    assert code == 130 and err.strip() == "interrupted — rerun the same command to resume"

    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(ensdiag.experiment, "run_experiment", broken)
    monkeypatch.delenv("ENSDIAG_DEBUG", raising=False)
    code, _, err = run_cli(capsys, "train", "--quiet")
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and "internal error (ZeroDivisionError: a bug)" in lines[0]


def test_narrow_terminals_hide_no_digit(tmp_path, capsys, monkeypatch):
    import json
    model = ensdiag.build_model("mlp", "deep-ensemble", 3, 10, (1, 8, 8))
    path = ensdiag.save_model(model, tmp_path / "de.safetensors")
    code, out, _ = run_cli(capsys, "evaluate", path, "--format", "json")
    metrics = json.loads(out)
    monkeypatch.setenv("COLUMNS", "60")
    code, out, _ = run_cli(capsys, "evaluate", path)
    assert code == 0 and "…" not in out
    for name in ("accuracy", "nll", "ece", "brier"):
        assert f"{metrics['analyzers']['calibration']['splits']['id'][name]['value']:.3f}" in out


def test_user_controlled_names_are_printed_literally(tmp_path, capsys):
    from safetensors.torch import save_file
    folder = tmp_path / "sweep[lr=0.01]" / "m[/bold]"
    folder.mkdir(parents=True)
    model = ensdiag.build_model("mlp", "deep-ensemble", 2, 10, (1, 8, 8))
    path = ensdiag.save_model(model, folder / "model.safetensors")
    code, out, _ = run_cli(capsys, "diversity", path)
    assert code == 0 and f"{path}:" in out
    g = torch.Generator().manual_seed(0)
    save_file({"[red]EVIL/logits": torch.randn(2, 5, 3, generator=g), "[red]EVIL/labels": torch.tensor([0, 1, 2, 0, 1]),
               "id/logits": torch.randn(2, 5, 3, generator=g), "id/labels": torch.tensor([0, 1, 2, 0, 1])},
              str(folder / "p.safetensors"))
    code, out, _ = run_cli(capsys, "analyze", folder / "p.safetensors")
    assert code == 0 and "[red]EVIL" in out and str(folder / "p.safetensors") in "".join(out.split())
