"""`ensdiag bench`: what it measures, what it writes, how it refuses bad input (no timings asserted)."""

import json
import statistics

import pytest
import torch

from .cli import assert_one_line_error, run_cli

TINY = ("--train-size", 300, "--test-size", 64)


def test_bench_json_has_every_method_against_the_reference_and_is_written_down(tmp_path, capsys):
    code, out, err = run_cli(capsys, "bench", *TINY, "--format", "json", "--results-dir", tmp_path)
    assert code == 0, err
    result = json.loads(out)
    assert result["format"] == "ensdiag.bench/1"
    assert set(result["methods"]) == {"single", "mc-dropout", "deep-ensemble", "batch-ensemble-channel", "packed-ensemble",
                                      "mimo", "snapshot-ensemble", "checkpoint-ensemble"}  # no kernel-wise on the mlp
    for run, row in result["methods"].items():
        assert row["seconds_per_epoch"] > 0 and row["reference_seconds_per_epoch"] > 0, run
        assert row["speedup"] == pytest.approx(row["reference_seconds_per_epoch"] / row["seconds_per_epoch"])
        for prefix in ("", "reference_"):  # every timer ran the default 3 rounds; the median epoch counts
            measured = row[f"{prefix}epoch_seconds_measured"]
            assert len(measured) == 3
            assert row[f"{prefix}seconds_per_epoch"] == pytest.approx(statistics.median(measured))
        assert row["images_per_second"] == pytest.approx(300 / row["seconds_per_epoch"])
        # MIMO: 4 members × batch repetition 4; snapshot and checkpoint ensembles train one network
        k_train = {"single": 1, "mc-dropout": 1, "mimo": 4 * 4, "snapshot-ensemble": 1, "checkpoint-ensemble": 1}.get(run, 4)
        assert row["member_images_per_second"] == pytest.approx(k_train * row["images_per_second"])
        assert row["inference_member_images_per_second"] == pytest.approx(
            row["members"] * row["inference_images_per_second"])
    ratios = result["ratios"]
    assert ratios["deep-ensemble / single"] == pytest.approx(
        result["methods"]["deep-ensemble"]["seconds_per_epoch"] / result["methods"]["single"]["seconds_per_epoch"])
    for run in ("batch-ensemble-channel", "packed-ensemble", "mimo"):  # every efficient ensemble vs the Deep Ensemble
        assert ratios[f"{run} / deep-ensemble"] == pytest.approx(
            result["methods"][run]["seconds_per_epoch"] / result["methods"]["deep-ensemble"]["seconds_per_epoch"])
    settings, env = result["settings"], result["environment"]
    assert settings["train_size"] == 300 and settings["batch_size"] == 128 and settings["device"] == "cpu"
    assert env["torch"] == torch.__version__ and env["threads"] >= 1
    written = list(tmp_path.glob("bench-mlp-cpu-*.json"))
    assert len(written) == 1 and json.loads(written[0].read_text()) == result


def test_bench_resnet_extrapolates_from_timed_batches_and_compares_member_strategies(tmp_path, capsys):
    code, out, err = run_cli(capsys, "bench", "--arch", "resnet18", "--train-size", 8, "--test-size", 4,
                             "--method", "deep-ensemble", "--batches", 1, "--strategies", "--no-reference",
                             "--results-dir", tmp_path)
    assert code == 0, err
    assert "deep-ensemble" in out and "vmap" in out and "loop" in out  # the tables
    rounds = [line for line in err.splitlines() if line.startswith("round ")]
    assert [line.split(":")[0] for line in rounds] == ["round 1/3", "round 2/3", "round 3/3"]
    assert all("deep-ensemble [vmap]" in line and "deep-ensemble [loop]" in line for line in rounds)
    result = json.loads(next(tmp_path.glob("bench-resnet18-cpu-*.json")).read_text())
    row = result["methods"]["deep-ensemble"]
    assert row["timed_batches"] == 1 and row["batches_per_epoch"] == 1  # 8 images, batch 128
    assert "reference_seconds_per_epoch" not in row
    assert set(result["strategies"]) == {"stacked", "vmap", "loop"}
    assert result["strategy_in_use"] == "loop" and "loop is in use" in out  # FASTEST for (cpu, resnet18)
    assert result["settings"]["augment"] is True and result["settings"]["optimizer"] == "sgd"


@pytest.mark.parametrize("args, match", [
    (("--arch", "vgg"), "unknown --arch"),
    (("--method", "single,boosting"), "unknown method boosting"),
    (("--epochs", 0), "--epochs must be at least 1"),
    (("--format", "csv"), "unknown --format"),
    (("--precision", "fp8"), "unknown --precision"),
    (("--compile-mode", "fastest"), "unknown --compile-mode"),
])
def test_bench_bad_input_is_one_line(capsys, tmp_path, args, match):
    assert_one_line_error(capsys, "bench", *TINY, "--results-dir", tmp_path, *args, match=match)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on machines without CUDA")
def test_bench_on_cuda_without_a_gpu_says_so(capsys, tmp_path):
    assert_one_line_error(capsys, "bench", *TINY, "--device", "cuda", "--results-dir", tmp_path, match="no CUDA device")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bench_cuda_runs_bf16_fast_path_and_fp16_reference(capsys, tmp_path):
    code, out, err = run_cli(capsys, "bench", "--arch", "resnet18", "--device", "cuda", "--train-size", 512,
                             "--test-size", 256, "--format", "json", "--results-dir", tmp_path)
    assert code == 0, err
    result = json.loads(out)
    assert result["environment"]["device"].startswith("cuda")
    assert all(row["speedup"] > 0 for row in result["methods"].values())
