"""Memory bounded before allocation on the newer surfaces (foreign checkpoints checked on the meta
device, predictions capped, sparse files, an absolute budget for archives), guarded shapes, no
writes through a linked folder, and inputs no longer accepted silently."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import ensdiag
from tests.cli import assert_one_line_error, run_cli

FIXTURES = Path(__file__).parent / "fixtures" / "torch_uncertainty"


def test_a_torchvision_import_checks_keys_on_the_meta_device_before_building(tmp_path, capsys, monkeypatch):
    from ensdiag.foreign import checkpoints
    built = []
    original = checkpoints.build_from_spec

    def counting(spec):
        built.append(torch.empty(0).device.type)  # the device tensors would be built on
        return original(spec)

    monkeypatch.setattr(checkpoints, "build_from_spec", counting)
    for i in range(2):  # two tiny files that name a 632M-parameter network
        torch.save({"heads.head.weight": torch.zeros(10, 4), "heads.head.bias": torch.zeros(10)}, tmp_path / f"m{i}.pt")
    assert_one_line_error(capsys, "import", tmp_path / "m0.pt", tmp_path / "m1.pt", "--arch", "torchvision:vit_h_14",
                          "--out", tmp_path / "out.safetensors", match="member 0 lacks")
    assert built and set(built) == {"meta"}  # only skeletons: nothing real was allocated


def test_analyze_refuses_more_members_than_model_files_allow(tmp_path, capsys):
    np.save(tmp_path / "wide.npy", np.zeros((20000, 2, 2), dtype=np.float32))
    assert_one_line_error(capsys, "analyze", tmp_path / "wide.npy", match="20,000 members")


def test_analyze_refuses_predictions_beyond_the_memory_budget(tmp_path, capsys, monkeypatch):
    np.save(tmp_path / "p.npy", np.zeros((4, 1000, 10), dtype=np.float32))
    monkeypatch.setenv("ENSDIAG_MEMORY_BUDGET", "100K")
    assert_one_line_error(capsys, "analyze", tmp_path / "p.npy", match="more than the memory budget of 100.0 KiB")
    monkeypatch.setenv("ENSDIAG_MEMORY_BUDGET", "lots")
    assert_one_line_error(capsys, "analyze", tmp_path / "p.npy", match="not a size")


def test_a_sparse_npy_whose_header_claims_gigabytes_is_refused(tmp_path, capsys):
    path = tmp_path / "sparse.npy"
    with open(path, "wb") as handle:
        np.lib.format.write_array_header_1_0(handle, {"descr": "<f4", "fortran_order": False, "shape": (4, 500_000, 1000)})
        handle.truncate(handle.tell() + 4 * 500_000 * 1000 * 4)  # 8 GB of holes: the apparent size matches
    if path.stat().st_blocks * 512 >= 2**30:
        pytest.skip("this filesystem does not make sparse files")
    assert_one_line_error(capsys, "analyze", path, match="sparse file")


@pytest.mark.slow  # every analysis of 20,000 examples of 100 classes
def test_a_compressed_one_hot_archive_is_read_within_the_budget(tmp_path, capsys):
    probs = np.zeros((4, 20000, 100), dtype=np.float32)  # 32 MB that compresses to a few hundred kB
    probs[..., 0] = 1.0
    np.savez_compressed(tmp_path / "onehot.npz", probs=probs, labels=np.zeros(20000, dtype=np.int64))
    assert (tmp_path / "onehot.npz").stat().st_size < 2**20
    code, out, err = run_cli(capsys, "analyze", tmp_path / "onehot.npz", "--format", "json")
    assert code == 0, err
    assert json.loads(out)["splits"]["id"]["n"] == 20000


def test_an_empty_dimension_and_integer_weights_are_refused_by_name(tmp_path, capsys):
    state = torch.load(FIXTURES / "packed_resnet18_w8.pt", weights_only=True)
    state = state.get("state_dict", state)
    key = next(k for k in state if k.endswith("conv2.conv.weight") or k.endswith("conv2.weight"))
    state[key] = torch.empty(0, *state[key].shape[1:])
    torch.save(state, tmp_path / "zero.pt")
    for command in ("import", "diversity"):
        extra = ["--out", tmp_path / "x.safetensors"] if command == "import" else []
        assert_one_line_error(capsys, command, tmp_path / "zero.pt", *extra, match="empty dimension")
    members = [{"hidden.0.weight": torch.ones(64, 64, dtype=torch.int64)} for _ in range(2)]
    for i, member in enumerate(members):
        torch.save(member, tmp_path / f"int{i}.pt")
    assert_one_line_error(capsys, "diversity", tmp_path / "int0.pt", tmp_path / "int1.pt", match="not floating point")


def test_batch_ensemble_layers_must_agree_on_the_member_count(tmp_path, capsys):
    state = torch.load(FIXTURES / "be_mlp.pt", weights_only=True)
    state = state.get("state_dict", state)
    key = next(k for k in state if k.endswith("r_group"))
    state[key] = torch.ones(5, state[key].shape[1])
    torch.save(state, tmp_path / "mixed.pt")
    assert_one_line_error(capsys, "import", tmp_path / "mixed.pt", "--out", tmp_path / "x.safetensors",
                          match="disagree on the number of members")


def test_import_takes_an_ensdiag_model_file(finished_run, tmp_path, capsys):
    source = finished_run / "batch-ensemble" / "seed-1" / "model.safetensors"
    code, out, err = run_cli(capsys, "import", source, "--out", tmp_path / "copy.safetensors")
    assert code == 0, err
    original, copy = ensdiag.load_model(source), ensdiag.load_model(tmp_path / "copy.safetensors")
    assert copy.method == "batch-ensemble"
    assert all(torch.equal(a, b) for a, b in zip(original.state_dict().values(), copy.state_dict().values()))


def test_report_never_writes_through_a_linked_figures_folder(run, tmp_path, capsys):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    os.symlink(outside, run / "figures")
    assert_one_line_error(capsys, "report", run, match="writes figures only inside the run folder")
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]


def test_report_on_a_model_file_points_to_the_commands_that_read_it(finished_run, capsys):
    assert_one_line_error(capsys, "report", finished_run / "single" / "seed-1" / "model.safetensors",
                          match="use `ensdiag evaluate` or `ensdiag diversity`")


def test_track_diversity_needs_an_ensemble_and_skips_single_models(tmp_path, capsys):
    assert_one_line_error(capsys, "train", "--method", "single", "--track-diversity", "--out", tmp_path / "a",
                          match="every method here has one member")
    code, _, err = run_cli(capsys, "train", "--method", "single,deep-ensemble", "--track-diversity", "--seeds", "1",
                           "--epochs", "2", "--members", "2", "--out", tmp_path / "b", "--quiet")
    assert code == 0, err
    assert not (tmp_path / "b" / "single" / "seed-1" / "diversity.jsonl").exists()
    assert (tmp_path / "b" / "deep-ensemble" / "seed-1" / "diversity.jsonl").exists()


def test_an_allocation_failure_is_one_line(tmp_path, capsys, monkeypatch):
    from ensdiag.analysis import ANALYZERS
    analyzer = ANALYZERS["calibration"]

    def exhausted(predictions, weights=None):
        raise MemoryError()

    monkeypatch.setitem(ANALYZERS, "calibration", type(analyzer)(**{**analyzer.__dict__, "function": exhausted}))
    np.save(tmp_path / "p.npy", np.zeros((2, 5, 3), dtype=np.float32))
    np.save(tmp_path / "y.npy", np.zeros(5, dtype=np.int64))
    assert_one_line_error(capsys, "analyze", tmp_path / "p.npy", "--labels", tmp_path / "y.npy", match="out of memory")


def _sparse_safetensors(path, shape):
    """A safetensors file whose header names a float32 tensor of `shape` and whose data is a hole."""
    import struct
    count = int(np.prod(shape))
    header = json.dumps({"id/logits": {"dtype": "F32", "shape": list(shape), "data_offsets": [0, 4 * count]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(header)) + header)
        handle.truncate(8 + len(header) + 4 * count)
    return path


def test_a_safetensors_file_is_checked_against_the_budget_from_its_header_before_it_is_read(tmp_path, capsys, monkeypatch):
    from safetensors import safe_open
    path = _sparse_safetensors(tmp_path / "p.safetensors", (2, 1000, 50_000))  # 400 MB of nothing on disk
    read = []
    monkeypatch.setattr(type(safe_open(str(path), framework="pt")), "get_tensor", lambda *a: read.append(a))
    monkeypatch.setenv("ENSDIAG_MEMORY_BUDGET", "50M")
    for args in (["analyze", path], ["evaluate", path]):
        code, _, err = run_cli(capsys, *args)
        assert code == 2 and "Traceback" not in err
    assert_one_line_error(capsys, "analyze", path, match="p.safetensors: reading its tensors needs about 381.5 MiB, more "
                                                          "than the memory budget of 50.0 MiB")
    assert read == []


def test_one_question_of_150000_choices_is_read_within_the_budget(tmp_path, capsys, monkeypatch):
    """k = 2 and C = 150,000 (round five): the readers hold it as [2, 1, 150000] after checking its analysis
    against the budget, and refuse it in one line naming the file where the budget is smaller."""
    from ensdiag.foreign.jsonl import load_jsonl_predictions
    from ensdiag.foreign.predictions import load_array_predictions
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 9, (2, 150_000))
    (tmp_path / "wide.jsonl").write_text(json.dumps({"answer": 3, "scores": scores.tolist()}, separators=(",", ":")))
    np.save(tmp_path / "wide.npy", scores[:, None, :].astype(np.float32))
    np.save(tmp_path / "y.npy", np.array([3]))
    splits, _ = load_jsonl_predictions(tmp_path / "wide.jsonl")
    assert splits["id"]["logits"].shape == (2, 1, 150_000)
    splits, _ = load_array_predictions([tmp_path / "wide.npy"], tmp_path / "y.npy")
    assert splits["id"]["logits"].shape == (2, 1, 150_000)
    monkeypatch.setenv("ENSDIAG_MEMORY_BUDGET", "1M")
    assert_one_line_error(capsys, "analyze", tmp_path / "wide.jsonl", match="wide.jsonl, line 1: analysing "
                          "\\[k=2, N=1, C=150,000\\] predictions needs about 8.0 MiB, more than the memory budget")
    assert_one_line_error(capsys, "analyze", tmp_path / "wide.npy", "--labels", tmp_path / "y.npy",
                          match="more than the memory budget of 1.0 MiB")


def test_the_budget_helpers_size_or_refuse_work_before_it_is_allocated(monkeypatch):
    from ensdiag import budget
    monkeypatch.setenv("ENSDIAG_MEMORY_BUDGET", "1M")
    assert budget.over_budget(2**20, "x") is None
    assert budget.over_budget(36 * 10**9, "resampling ECE").startswith("resampling ECE needs about 33.5 GiB, more than "
                                                                      "the memory budget of 1.0 MiB")


def test_one_question_of_150000_choices_is_analysed_and_a_number_too_big_to_resample_says_why(tmp_path, capsys,
                                                                                                monkeypatch):
    """Round five's case end to end: k = 2, one question, 150,000 choices is analysed (exit 0); with
    --detail the classwise ECE, whose 1,000 resamples × 150,000 classes × 15 bins would need tens of
    GiB, gets no interval and says why, instead of failing in the allocator."""
    scores = np.random.default_rng(0).integers(0, 9, (2, 150_000))
    (tmp_path / "wide.jsonl").write_text(json.dumps({"answer": 3, "scores": scores.tolist()}, separators=(",", ":")))
    monkeypatch.setenv("ENSDIAG_MEMORY_BUDGET", "2G")
    code, out, err = run_cli(capsys, "analyze", tmp_path / "wide.jsonl", "--detail", "--format", "json")
    assert code == 0, err
    calibration = json.loads(out)["analyzers"]["calibration"]["splits"]["id"]
    assert calibration["ece_classwise"]["value"] is not None
    note = calibration["ece_classwise"]["interval"]["note"]
    assert note.startswith("no interval:") and "more than the memory budget of 2.0 GiB" in note
    assert calibration["nll"]["interval"]["low"] is not None  # the others keep theirs
