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
    code, out, err = run_cli(capsys, "bench", "--arch", "resnet18", "--train-size", 8, "--test-size", 4, "--members", 2,
                             "--method", "deep-ensemble", "--batches", 1, "--strategies", "--no-reference",
                             "--epochs", 2, "--results-dir", tmp_path)
    assert code == 0, err
    assert "deep-ensemble" in out and "vmap" in out and "loop" in out  # the tables
    rounds = [line for line in err.splitlines() if line.startswith("round ")]
    assert [line.split(":")[0] for line in rounds] == ["round 1/2", "round 2/2"]
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


def test_bench_diagnose_times_every_step_in_evaluation_passes(tmp_path, capsys):
    from ensdiag.analysis import all_analyzers
    from ensdiag.bench.diagnose import PROTOCOL_IMAGES
    code, out, err = run_cli(capsys, "bench", "--diagnose", "--test-size", 50, "--train-size", 20, "--epochs", 1,
                             "--method", "single,deep-ensemble", "--path-points", "adaptive", "--results-dir", tmp_path)
    assert code == 0, err
    assert "geometry paths" in out and "report verdict bootstrap" in out  # both tables printed
    written = list(tmp_path.glob("diagnose-mlp-cpu-*.json"))
    assert len(written) == 1
    result = json.loads(written[0].read_text())
    assert result["kind"] == "diagnose" and result["settings"]["path_points"] == "adaptive"
    predictions_analyzers = {f"analyzer {name}" for name, a in all_analyzers().items() if a.needs == "predictions"}
    geometry = {"geometry cka", "geometry alignment", "geometry paths", "geometry rank-structure"}
    single, ensemble = result["methods"]["single"], result["methods"]["deep-ensemble"]
    assert set(single["steps"]) == {"predict id", "predict all splits"} | predictions_analyzers  # one weight set: no geometry
    assert set(ensemble["steps"]) == {"predict id", "predict all splits"} | predictions_analyzers | geometry
    for row in (single, ensemble):
        unit = row["steps"]["predict id"]["seconds"]
        assert row["steps"]["predict id"]["passes"] == 1
        for step in row["steps"].values():
            assert step["seconds"] > 0 and step["passes"] == pytest.approx(step["seconds"] / unit)
        assert row["diagnosis_seconds"] == pytest.approx(sum(s["seconds"] for name, s in row["steps"].items()
                                                             if name != "predict id"))
    # paths: 3 pairs, each 6 to 11 points of (50 test + 20 training-sample) images and the barrier search's
    # points beyond them, at least one a restart (the default search's restarts after the first, no --detail);
    # no BatchNorm in the mlp
    from ensdiag.geometry.least import rule_for
    after_first = rule_for(detail=False).minimum - 1
    assert (3 * 6 + 3 * after_first) * 70 <= ensemble["path_images"] and ensemble["path_images"] % 70 == 0
    search = ensemble["path_images"] / 70 / 3  # points per pair, the first walk's 6 to 11 among them
    assert 3 * (11 + search - 11) * 9000 <= ensemble["protocol_path_images"] <= 3 * (11 + search - 6) * 9000
    estimate = ensemble["estimate"]  # scaled to the protocol's 10,000 images per split
    steps = ensemble["steps"]
    scaled = sum(s["seconds"] * PROTOCOL_IMAGES / 50 for name, s in steps.items()
                 if name not in ("predict id", "geometry paths", "geometry alignment", "geometry rank-structure"))
    scaled += steps["geometry paths"]["seconds"] * ensemble["protocol_path_images"] / ensemble["path_images"]
    scaled += steps["geometry alignment"]["seconds"] + steps["geometry rank-structure"]["seconds"]
    assert estimate["seconds"] == pytest.approx(scaled)
    report = result["report"]
    assert report["runs"] == 2 * 3 and report["unit_method"] == "deep-ensemble"
    assert {"report verdict bootstrap", "report figures", "report (whole command)"} <= set(report["steps"])


@pytest.mark.slow
@pytest.mark.clock  # a wall-clock budget: run alone
def test_bench_diagnose_with_a_budget_records_what_fit_and_the_full_estimate(tmp_path, capsys):
    """One budgeted diagnosis: each step's examples and precision, every headline number with its
    interval, the skipped steps, and the estimate on every example; the docs render the record."""
    import importlib.util
    from pathlib import Path
    code, out, err = run_cli(capsys, "bench", "--diagnose", "--budget", "30s", "--arch", "mlp", "--test-size", 600,
                             "--train-size", 100, "--results-dir", tmp_path)
    assert code == 0, err
    written = list(tmp_path.glob("diagnose-budget-mlp-cpu-*.json"))
    assert len(written) == 1 and "headline numbers" in out
    result = json.loads(written[0].read_text())
    row = result["methods"]["deep-ensemble"]
    assert result["kind"] == "diagnose-budget" and result["settings"]["budget"] == "30s"
    assert row["budget"]["seconds"] == 30 and row["budget"]["full_estimate_seconds"] > 0
    assert {step["step"] for step in row["budget"]["steps"]} >= {"predict id", "predict shift", "predict ood", "predict val"}
    ece = row["headline"]["calibration/id/ece"]
    assert ece["low"] <= ece["high"] and ece["n"] == next(s["n"] for s in row["budget"]["steps"] if s["step"] == "predict id")
    assert set(row["load_average"]) == {"before", "after"}
    spec = importlib.util.spec_from_file_location("docs_tables", Path(__file__).parents[1] / "benchmarks" / "docs_tables.py")
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    lines = tables.budgeted(result)
    assert any(line.startswith("| predict id | ") for line in lines) and "| calibration/id/ece | " in "\n".join(lines)


@pytest.mark.slow  # the whole default grid, its report and a budgeted diversity, as processes
def test_bench_main_job_records_each_runs_diagnosis_against_its_own_training(tmp_path, capsys):
    code, out, err = run_cli(capsys, "bench", "--main-job", "--epochs", 1, "--budget", "20s", "--format", "json",
                             "--results-dir", tmp_path)
    assert code == 0, err
    record = json.loads(out)
    (found,) = record["rounds"]
    assert len(found["runs"]) == 12 and found["cache"] == "empty"
    assert found["training_seconds"] == pytest.approx(sum(run["train_seconds"] for run in found["runs"]), abs=0.1)
    assert all(run["ratio"] == pytest.approx(run["diagnosis_seconds"] / run["train_seconds"], rel=0.01)
               for run in found["runs"])
    assert found["report_seconds"] > 0 and found["budget"]["asked_seconds"] == 20
    assert set(record["targets"]) and record["environment"]["ensdiag"]
    assert list(tmp_path.glob("main-job-mlp-cpu-*.json"))
