"""Numbers a person types, and what a terminal prints: decimal digits only ("²" and "٣" are not 2
and 3), sizes and seeds range-checked before they overflow, a normalisation that keeps inputs
finite; on an ASCII-only terminal every command prints, and `--device cuda` without a GPU is one
line on every command that takes it."""

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ensdiag.errors import EnsdiagError

from .cli import assert_one_line_error

ROOT = Path(__file__).resolve().parents[1]
HUGE = str(2**70)


@pytest.fixture
def predictions(tmp_path):
    rng = np.random.default_rng(0)
    np.save(tmp_path / "p.npy", rng.normal(size=(2, 30, 3)).astype(np.float32))
    np.save(tmp_path / "y.npy", rng.integers(0, 3, 30))
    return tmp_path / "p.npy", tmp_path / "y.npy"


@pytest.mark.parametrize("value,match", [("9" * 400, "is not a size"), ("٣G", "is not a size"), ("²K", "is not a size"),
                                         ("99999999999999999999T", "more than any machine's memory")])
def test_a_memory_budget_that_is_not_a_size_is_one_line(predictions, capsys, monkeypatch, value, match):
    monkeypatch.setenv("ENSDIAG_MEMORY_BUDGET", value)
    assert_one_line_error(capsys, "analyze", predictions[0], "--labels", predictions[1], match=match)


@pytest.mark.parametrize("value", ["²", "٣", "1e1", "0x10", "7" * 30])
def test_path_points_take_decimal_digits_only(finished_run, capsys, value):
    assert_one_line_error(capsys, "diversity", finished_run / "batch-ensemble" / "seed-1" / "model.safetensors",
                          f"--path-points={value}", match="--path-points must be an integer from 2 to 101")


def test_seeds_and_method_options_take_decimal_digits_only(tmp_path, capsys):
    assert_one_line_error(capsys, "train", "--seeds", "1,٣", "--out", tmp_path / "x", match="--seeds must be a comma-separated list of whole numbers")
    assert_one_line_error(capsys, "train", "--method", "packed-ensemble", "-O", "packed-ensemble.gamma=²",
                          "--out", tmp_path / "x", match="packed-ensemble.gamma must be a whole number")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("value,match", [("0.5:1e-320", "stds in \\[1e-06, 1e\\+06\\]"), ("0.5:nan", "finite number"),
                                         ("1e300:0.5", "means within"), ("٠.5:0.5", "decimal digits")])
def test_a_normalisation_that_would_make_inputs_infinite_is_refused(finished_run, capsys, value, match):
    assert_one_line_error(capsys, "evaluate", finished_run / "single" / "seed-1" / "model.safetensors",
                          "--normalize", value, match=match)


def test_a_seed_beyond_what_seeds_a_generator_is_one_line_on_every_command(finished_run, tmp_path, capsys, predictions):
    model = finished_run / "batch-ensemble" / "seed-1" / "model.safetensors"
    for args in (["evaluate", model], ["diversity", model, "--no-geometry"],
                 ["analyze", predictions[0], "--labels", predictions[1], "--out", tmp_path / "r", "--method", "m"]):
        assert_one_line_error(capsys, *args, "--seed", HUGE, match=r"seed must be an integer in 0\.\.2³¹−1")
    assert_one_line_error(capsys, "train", "--seeds", HUGE, "--out", tmp_path / "t", match="--seeds must lie in")


def test_the_python_api_takes_the_same_seeds(tmp_path):
    import torch

    import ensdiag
    diagnosis = ensdiag.diagnose(lambda x: torch.stack([x, -x]), test=(torch.eye(3), torch.arange(3)),
                                 measure=ensdiag.Measure(geometry=False))
    for seed in (2**70, -1, 1.5, True):
        with pytest.raises(ValueError, match="seed must be"):
            diagnosis.save(tmp_path / "r", "m", seed)


def test_diversity_without_a_gpu_refuses_cuda_in_one_line(finished_run, capsys, monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    model = finished_run / "batch-ensemble" / "seed-1" / "model.safetensors"
    for command in ("diversity", "evaluate"):  # 0.6.0: diversity exited 0 without its disagreement section
        assert_one_line_error(capsys, command, model, "--device", "cuda", match="--device cuda asked for, but torch sees no")


@pytest.mark.slow
def test_an_ascii_only_terminal_prints_every_name_and_table(tmp_path):
    folder = tmp_path / "dé"
    folder.mkdir()
    rng = np.random.default_rng(0)
    np.save(folder / "p€.npy", rng.normal(size=(2, 20, 3)).astype(np.float32))
    np.save(folder / "y.npy", rng.integers(0, 3, 20))
    env = {**os.environ, "PYTHONIOENCODING": "ascii", "PYTHONPATH": str(ROOT)}
    for args in (["analyze", folder / "p€.npy", "--labels", folder / "y.npy"], ["models", "--arch", "mlp"]):
        done = subprocess.run([sys.executable, "-m", "ensdiag", *map(str, args)], capture_output=True, env=env,
                              cwd=tmp_path, timeout=120)
        assert done.returncode == 0, done.stderr.decode("ascii", "replace")
        done.stdout.decode("ascii")  # every byte ASCII: "é" written as an escape, not a crash
    # relative paths: the table's title (the path) stays on one line at any temporary folder's length
    assert b"d\\xe9/p\\u20ac.npy" in subprocess.run([sys.executable, "-m", "ensdiag", "analyze", "dé/p€.npy",
                                                     "--labels", "dé/y.npy"], capture_output=True, env=env,
                                                    cwd=tmp_path, timeout=120).stdout


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=30))
def test_any_text_is_a_whole_number_or_one_clear_error(text):
    from ensdiag.numbers import decimal, integer
    for parse, kind in ((integer, int), (decimal, float)):
        try:
            value = parse(text, "--x")
        except EnsdiagError as error:
            assert "\n" not in str(error) and str(error).startswith("--x must be")
            continue
        assert isinstance(value, kind) and all(c in "0123456789+-.eE" for c in text.strip())
        assert kind is int or math.isfinite(value)


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40))
def test_any_budget_text_is_a_size_or_one_clear_error(text):
    from ensdiag.budget import MAX_BUDGET, memory_budget
    os.environ["ENSDIAG_MEMORY_BUDGET"] = text
    try:
        size = memory_budget()
    except EnsdiagError as error:
        assert "\n" not in str(error)
    else:
        assert isinstance(size, int) and 0 <= size <= MAX_BUDGET
    finally:
        del os.environ["ENSDIAG_MEMORY_BUDGET"]
