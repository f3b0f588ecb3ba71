"""`ensdiag analyze` on NumPy predictions (.npy / .npz): the same numbers give the same metrics
as ensdiag's own predictions file; probabilities are checked, mix-ups reported, pickles refused."""

import json

import numpy as np
import pytest
import torch

from ensdiag.predictions import save_predictions

from .cli import assert_one_line_error, run_cli

K, N, C = 3, 40, 5


@pytest.fixture
def arrays():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(K, N, C, generator=generator) * 2
    labels = torch.randint(0, C, (N,), generator=generator)
    ood = torch.randn(K, 25, C, generator=generator)
    return logits, labels, ood


def metrics_of(capsys, *args):
    code, out, err = run_cli(capsys, "analyze", *args, "--format", "json")
    assert code == 0, err
    return json.loads(out), err


def test_npy_npz_and_per_member_files_give_the_same_metrics_as_a_predictions_file(arrays, tmp_path, capsys):
    logits, labels, ood = arrays
    save_predictions({"id": {"logits": logits, "labels": labels}, "ood": {"logits": ood}}, tmp_path / "p.safetensors")
    reference, _ = metrics_of(capsys, tmp_path / "p.safetensors")
    np.save(tmp_path / "logits.npy", logits.numpy())
    np.save(tmp_path / "labels.npy", labels.numpy())
    np.save(tmp_path / "ood.npy", ood.numpy())
    from_npy, _ = metrics_of(capsys, tmp_path / "logits.npy", "--labels", tmp_path / "labels.npy",
                             "--ood", tmp_path / "ood.npy")
    assert from_npy == reference
    for i in range(K):
        np.save(tmp_path / f"member{i}.npy", logits[i].numpy())
        np.save(tmp_path / f"ood{i}.npy", ood[i].numpy())
    per_member, _ = metrics_of(capsys, *[tmp_path / f"member{i}.npy" for i in range(K)], "--labels",
                               tmp_path / "labels.npy", *[a for i in range(K) for a in ("--ood", tmp_path / f"ood{i}.npy")])
    assert per_member == reference
    np.savez(tmp_path / "p.npz", **{"id/logits": logits.numpy(), "id/labels": labels.numpy(), "ood/logits": ood.numpy()})
    assert metrics_of(capsys, tmp_path / "p.npz")[0] == reference


def test_npz_with_shift_corruptions_pools_them_like_a_predictions_file(arrays, tmp_path, capsys):
    logits, labels, ood = arrays
    splits = {"id": {"logits": logits, "labels": labels}, "shift/blur": {"logits": logits[:, :20], "labels": labels[:20]},
              "shift/noise": {"logits": logits[:, 20:], "labels": labels[20:]}}
    save_predictions(splits, tmp_path / "p.safetensors")
    np.savez(tmp_path / "p.npz", **{f"{name}/{kind}": split[kind].numpy() for name, split in splits.items()
                                    for kind in ("logits", "labels")})
    assert metrics_of(capsys, tmp_path / "p.npz")[0] == metrics_of(capsys, tmp_path / "p.safetensors")[0]


def test_probabilities_give_the_metrics_of_their_logits(arrays, tmp_path, capsys):
    logits, labels, _ = arrays
    np.save(tmp_path / "logits.npy", logits.numpy())
    np.save(tmp_path / "probs.npy", logits.softmax(-1).numpy())
    np.save(tmp_path / "labels.npy", labels.numpy())
    expected, _ = metrics_of(capsys, tmp_path / "logits.npy", "--labels", tmp_path / "labels.npy")
    got, err = metrics_of(capsys, tmp_path / "probs.npy", "--labels", tmp_path / "labels.npy", "--inputs", "probs")
    assert "warning" not in err
    for analyzer, key in (("calibration", "nll"), ("calibration", "ece"), ("uncertainty", "jsd")):
        value = got["analyzers"][analyzer]["splits"]["id"][key]["value"]
        assert value == pytest.approx(expected["analyzers"][analyzer]["splits"]["id"][key]["value"], abs=1e-5)
    np.savez(tmp_path / "p.npz", probs=logits.softmax(-1).numpy(), labels=labels.numpy())  # the name says probs
    got, _ = metrics_of(capsys, tmp_path / "p.npz")
    assert got["analyzers"]["calibration"]["splits"]["id"]["nll"]["value"] == pytest.approx(
        expected["analyzers"]["calibration"]["splits"]["id"]["nll"]["value"], abs=1e-5)


def test_probabilities_passed_as_logits_are_reported(arrays, tmp_path, capsys):
    logits, labels, _ = arrays
    np.save(tmp_path / "probs.npy", logits.softmax(-1).numpy())
    metrics, err = metrics_of(capsys, tmp_path / "probs.npy")
    assert "look like probabilities" in err and "--inputs probs" in err
    assert "look like probabilities" in metrics["input_warnings"][0]


def test_logits_passed_as_probabilities_are_refused_with_a_hint(arrays, tmp_path, capsys):
    np.save(tmp_path / "logits.npy", arrays[0].numpy())
    assert_one_line_error(capsys, "analyze", tmp_path / "logits.npy", "--inputs", "probs",
                          match="not probabilities.*look like logits; pass --inputs logits")
    np.save(tmp_path / "unnormalised.npy", arrays[0].softmax(-1).numpy() * 2)
    assert_one_line_error(capsys, "analyze", tmp_path / "unnormalised.npy", "--inputs", "probs", match="sum to 1")


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_pickled_object_array_is_refused_without_running_it(tmp_path, capsys):
    marker = tmp_path / "ran"
    array = np.empty(1, dtype=object)
    array[0] = _Payload(marker)
    with open(tmp_path / "evil.npy", "wb") as handle:
        np.lib.format.write_array(handle, array, allow_pickle=True)
    assert_one_line_error(capsys, "analyze", tmp_path / "evil.npy", match="pickle.*never loads")
    np.savez(tmp_path / "evil.npz", logits=array)
    assert_one_line_error(capsys, "analyze", tmp_path / "evil.npz", match="pickle.*never loads")
    assert not marker.exists()
    np.load(tmp_path / "evil.npy", allow_pickle=True)  # the payload is live: loading with pickles runs it
    assert marker.exists()


def _huge_header(path):
    """A tiny file whose header claims a [1000, 1000000, 1000] float32 array."""
    with open(path, "wb") as handle:
        np.lib.format.write_array_header_1_0(handle, {"descr": "<f4", "fortran_order": False,
                                                      "shape": (1000, 1000000, 1000)})
        handle.write(b"\0" * 64)


def test_big_endian_arrays_read_like_native_ones(arrays, tmp_path, capsys):
    logits, labels, _ = arrays
    np.save(tmp_path / "native.npy", logits.numpy())
    np.save(tmp_path / "big.npy", logits.numpy().astype(">f4"))
    np.save(tmp_path / "labels.npy", labels.numpy().astype(">i8"))
    expected, _ = metrics_of(capsys, tmp_path / "native.npy", "--labels", tmp_path / "labels.npy")
    assert metrics_of(capsys, tmp_path / "big.npy", "--labels", tmp_path / "labels.npy")[0] == expected
@pytest.mark.parametrize("write,args,message", [
    (lambda d: np.save(d / "x.npy", np.zeros((N, C), np.float32)), (), r"\[k, N, C\].*one \[N, C\] file per member"),
    (lambda d: np.save(d / "x.npy", np.zeros((K, N, 1), np.float32)), (), "two classes"),
    (lambda d: np.save(d / "x.npy", np.full((K, N, C), np.nan, np.float32)), (), "NaN"),
    (lambda d: np.save(d / "x.npy", np.array(["a", "b"])), (), "numbers"),
    (lambda d: (d / "x.npy").write_bytes(b"\x93NUMPY garbage"), (), "not a readable .npy"),
    (lambda d: (np.save(d / "x.npy", np.zeros((K, N, C), np.float32)), np.save(d / "y.npy", np.zeros(N) + 0.5)),
     ("--labels", "y.npy"), "integer class indices"),
    (lambda d: (np.save(d / "x.npy", np.zeros((K, N, C), np.float32)), np.save(d / "y.npy", np.full(N, 9))),
     ("--labels", "y.npy"), r"out of range 0\.\.4"),
    (lambda d: (np.save(d / "x.npy", np.zeros((K, N, C), np.float32)), np.save(d / "o.npy", np.zeros((2, 5, C), np.float32))),
     ("--ood", "o.npy"), "disagree on members"),
    (lambda d: np.savez(d / "x.npz", weights=np.zeros(3)), (), "unexpected array 'weights'"),
    (lambda d: np.save(d / "x.npy", np.zeros((K, 0, C), np.float32)), (), "no examples"),
    (lambda d: (np.savez(d / "z.npz", logits=np.zeros((K, N, C))), (d / "z.npz").rename(d / "x.npy")), (),
     "is an .npz archive"),
    (lambda d: _huge_header(d / "x.npy"), (), "claims 4,000,000,000,000 bytes"),
])


def test_bad_arrays_are_one_line_errors(write, args, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path)
    source = "x.npz" if (tmp_path / "x.npz").exists() else "x.npy"
    assert_one_line_error(capsys, "analyze", source, *args, match=message)


def test_every_registered_reader_is_chosen_for_its_files_and_refuses_what_does_not_apply(arrays, tmp_path, capsys):
    """The readers' registry: each kind of file reaches its reader (the same metrics from the same
    numbers), and each reader refuses, in one line, the options that are not for its files."""
    from ensdiag.foreign.readers import READERS
    assert list(READERS)[-1] == "NumPy arrays (.npy, .npz)"  # the fallback comes last
    logits, labels, _ = arrays
    save_predictions({"id": {"logits": logits, "labels": labels}}, tmp_path / "p.safetensors")
    np.savez(tmp_path / "p.npz", logits=logits.numpy(), labels=labels.numpy())
    with (tmp_path / "p.jsonl").open("w") as out:
        for i in range(N):
            out.write(json.dumps({"id": i, "answer": int(labels[i]), "scores": logits[:, i].tolist()}) + "\n")
    found = {name: metrics_of(capsys, tmp_path / name)[0]["analyzers"]["calibration"]["splits"]["id"]["nll"]["value"]
             for name in ("p.safetensors", "p.npz", "p.jsonl")}
    assert found["p.npz"] == pytest.approx(found["p.safetensors"], abs=1e-6)
    assert found["p.jsonl"] == pytest.approx(found["p.safetensors"], abs=1e-6)
    np.save(tmp_path / "labels.npy", labels.numpy())
    for name, match in (("p.safetensors", "holds every member's logits"), ("p.jsonl", "holds every member's scores")):
        assert_one_line_error(capsys, "analyze", tmp_path / name, "--labels", tmp_path / "labels.npy", match=match)
    assert_one_line_error(capsys, "analyze", tmp_path / "p.npz", "--task", "x", match="are for lm-evaluation-harness logs")
