"""Files from anywhere, walked and read as untrusted: a FIFO or a device is refused before anything
opens it (no hang), image folders are walked without following folder links (no loop, no image
counted twice), every JSON reader is bounded in size and nesting with one error, and images are
decoded within the memory budget (PIL's limit set from it), a broken one a one-line error."""

import json
import math
import os
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from PIL import Image

from ensdiag.errors import EnsdiagError

from .cli import assert_one_line_error, run_cli
from .guards import deadline, fifo
from .lora_reference import copied


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    """A tiny ensdiag model on 1×8×8 inputs with 3 classes."""
    from ensdiag.checkpoint import save_model
    from ensdiag.nn import build_model
    path = tmp_path_factory.mktemp("model") / "model.safetensors"
    save_model(build_model("mlp", "deep-ensemble", 2, 3, (1, 8, 8)), path)
    return path


def image_folder(root: Path, classes=2, per_class=5, size=(10, 12)) -> Path:
    rng = np.random.default_rng(0)
    for c in range(classes):
        (root / f"c{c}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 255, size, dtype=np.uint8)).save(root / f"c{c}" / f"{i}.png")
    return root


def evaluate_json(capsys, model, data):
    code, out, err = run_cli(capsys, "evaluate", model, "--data", data, "--normalize", "none", "--format", "json")
    return code, (json.loads(out) if code == 0 else None), err


# ------------------------------------------------------------------ FIFOs and devices: refused before open

def test_a_fifo_given_as_predictions_is_refused_before_it_is_opened(tmp_path, capsys):
    fifo(tmp_path / "q.jsonl")
    with deadline(10):
        assert_one_line_error(capsys, "analyze", tmp_path / "q.jsonl", match="is not a regular file")


def test_a_fifo_given_as_labels_model_or_ood_is_refused(tmp_path, capsys, model_file):
    np.save(tmp_path / "p.npy", np.zeros((2, 5, 3), dtype=np.float32))
    fifo(tmp_path / "y.npy")
    fifo(tmp_path / "m.safetensors")
    with deadline(10):
        assert_one_line_error(capsys, "analyze", tmp_path / "p.npy", "--labels", tmp_path / "y.npy",
                              match="--labels .*y.npy is not a regular file")
        assert_one_line_error(capsys, "evaluate", tmp_path / "m.safetensors", match="MODEL .* is not a regular file")
        assert_one_line_error(capsys, "evaluate", model_file, "--ood", tmp_path / "y.npy", match="is not a regular file")


def test_the_python_readers_refuse_a_fifo_too(tmp_path):
    from ensdiag.foreign.readers import load_any_predictions
    from ensdiag.io import read_json, read_safetensors
    fifo(tmp_path / "f.jsonl")
    with deadline(10):
        for read in (lambda: load_any_predictions([tmp_path / "f.jsonl"], None, (), "logits"),
                     lambda: read_json(tmp_path / "f.jsonl"), lambda: read_safetensors(tmp_path / "f.jsonl")):
            with pytest.raises(EnsdiagError, match="not a regular file"):
                read()


def test_a_fifo_named_like_an_image_in_a_class_folder_is_refused(tmp_path, capsys, model_file):
    data = image_folder(tmp_path / "imgs")
    fifo(data / "c1" / "f.png")
    with deadline(10):
        assert_one_line_error(capsys, "evaluate", model_file, "--data", data, "--normalize", "none",
                              match=r"c1/f.png is not a regular file")


@pytest.mark.parametrize("name", ["samples_ensq_2026-01-01T00-00-00.jsonl", "results_2026-01-01T00-00-00.json"])
def test_an_lm_eval_log_that_is_a_fifo_in_a_member_folder_is_named(tmp_path, capsys, name):
    import shutil
    lm_eval = Path(__file__).parent / "fixtures" / "lm_eval" / "out" / "lora-r4"
    out = shutil.copytree(lm_eval, tmp_path / "out")
    fifo(out / "lora-r4__adapter-1" / name)
    with deadline(10):  # in a member folder given, and in an output folder's model folder
        for args in ([out / "lora-r4__adapter-0", out / "lora-r4__adapter-1"], [out]):
            assert_one_line_error(capsys, "analyze", *args, "--task", "ensq",
                                  match=f"lm-eval (sample|results) file .*adapter-1/{name} is not a regular file")


def test_a_report_never_waits_on_a_fifo_in_a_run(run, capsys):
    fifo(run / "single" / "seed-1" / "diversity.jsonl")
    with deadline(10):
        assert_one_line_error(capsys, "report", run, "--no-figures", match="diversity.jsonl is damaged .*not a regular file")


# ------------------------------------------------------------------ image folders walked without following links

def test_every_image_counts_once_and_a_folder_link_is_refused(tmp_path, capsys, model_file):
    data = image_folder(tmp_path / "imgs")
    code, metrics, err = evaluate_json(capsys, model_file, data)
    assert code == 0, err
    assert "(10 images, image folder" in metrics["split_titles"]["id"]
    os.symlink(".", data / "c0" / "a")  # on 0.6.0 this counted every image of c0 41 times
    with deadline(10):
        assert_one_line_error(capsys, "evaluate", model_file, "--data", data, "--normalize", "none",
                              match="c0/a is a link to a folder; ensdiag does not follow folder links")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")
def test_a_link_to_proc_in_a_class_folder_is_refused_at_once(tmp_path, capsys, model_file):
    data = image_folder(tmp_path / "imgs")
    os.symlink("/proc/self", data / "c1" / "p")
    with deadline(10):
        assert_one_line_error(capsys, "evaluate", model_file, "--data", data, "--normalize", "none",
                              match="is a link to a folder")


def test_a_linked_class_folder_is_refused_and_a_linked_image_read(tmp_path, capsys, model_file):
    data = image_folder(tmp_path / "imgs")
    os.symlink(data / "c0" / "0.png", data / "c1" / "linked.png")  # a link to an image file: read like the file
    code, metrics, err = evaluate_json(capsys, model_file, data)
    assert code == 0 and "(11 images" in metrics["split_titles"]["id"], err
    os.symlink(data / "c0", data / "c2")
    assert_one_line_error(capsys, "evaluate", model_file, "--data", data, "--normalize", "none",
                          match="c2 is a link to a folder")


def test_images_are_read_in_torchvisions_order_with_its_labels(tmp_path):
    from torchvision import datasets, transforms

    from ensdiag.data.image_folder import read_image_folder
    data = image_folder(tmp_path / "imgs", classes=3, per_class=4)
    (data / "c1" / "deeper").mkdir()
    Image.fromarray(np.full((7, 9), 200, dtype=np.uint8)).save(data / "c1" / "deeper" / "z.jpg")
    images, labels = read_image_folder(data, (1, 8, 8), "--data")
    reference = datasets.ImageFolder(str(data), transform=transforms.Compose(
        [transforms.Grayscale(), transforms.Resize((8, 8)), transforms.PILToTensor()]))
    assert labels.tolist() == reference.targets
    assert all((images[i] == reference[i][0]).all() for i in range(len(reference)))


def test_a_broken_png_that_makes_pil_raise_syntax_error_is_one_line(tmp_path, capsys, model_file):
    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    rows = zlib.compress(b"".join(b"\x00" + bytes(np.random.default_rng(1).integers(0, 255, 64, dtype=np.uint8))
                                  for _ in range(64)))
    broken = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 64, 64, 8, 0, 0, 0, 0))
              + chunk(b"IDAT", rows[:100]) + struct.pack(">I", 4) + b"\x01\x02\x03\x04abcd\x00\x00\x00\x00")
    data = image_folder(tmp_path / "imgs")
    (data / "c0" / "broken.png").write_bytes(broken)
    assert_one_line_error(capsys, "evaluate", model_file, "--data", data, "--normalize", "none",
                          match=r"c0/broken.png: not a readable image \(SyntaxError\)")


def test_an_image_folder_beyond_the_memory_budget_is_refused_before_decoding(tmp_path, capsys, model_file, monkeypatch):
    data = image_folder(tmp_path / "imgs", per_class=150)
    monkeypatch.setenv("ENSDIAG_MEMORY_BUDGET", "60K")  # the model file's 53 KiB fit (its header is checked too)
    assert_one_line_error(capsys, "evaluate", model_file, "--data", data, "--normalize", "none",
                          match="images or more needs about .* more than the memory budget of 60.0 KiB")


def test_pils_pixel_limit_comes_from_the_memory_budget(tmp_path, capsys, model_file, monkeypatch):
    from PIL import Image as PILImage

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    data = image_folder(tmp_path / "imgs")  # a header claiming 12,000 × 12,000 pixels: nothing behind it
    (data / "c0" / "huge.png").write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(
        ">IIBBBBB", 12000, 12000, 8, 0, 0, 0, 0)) + chunk(b"IEND", b""))
    monkeypatch.setenv("ENSDIAG_MEMORY_BUDGET", "100M")
    before = PILImage.MAX_IMAGE_PIXELS
    assert_one_line_error(capsys, "evaluate", model_file, "--data", data, "--normalize", "none",
                          match="huge.png: an image of more pixels than the memory budget decodes")
    assert PILImage.MAX_IMAGE_PIXELS == before  # the process's own limit is left as it was


def test_data_of_no_images_is_refused(tmp_path, capsys, model_file):
    np.savez(tmp_path / "empty.npz", images=np.zeros((0, 1, 8, 8), dtype=np.uint8), labels=np.zeros(0, dtype=np.int64))
    np.save(tmp_path / "empty.npy", np.zeros((0, 8, 8), dtype=np.float32))
    assert_one_line_error(capsys, "evaluate", model_file, "--data", tmp_path / "empty.npz", "--normalize", "none",
                          match=r"holds no images \(N = 0\)")
    np.savez(tmp_path / "some.npz", images=np.zeros((4, 1, 8, 8), dtype=np.uint8), labels=np.zeros(4, dtype=np.int64))
    assert_one_line_error(capsys, "evaluate", model_file, "--data", tmp_path / "some.npz", "--ood", tmp_path / "empty.npy",
                          "--normalize", "none", match=r"empty.npy holds no images")


# ------------------------------------------------------------------ JSON: bounded in size and nesting, one error

DEEP = "[" * 100_000 + "]" * 100_000


def test_deeply_nested_json_is_one_line_wherever_it_is_read(tmp_path, capsys):
    lora = copied(tmp_path)
    (lora / "adapter-1" / "adapter_config.json").write_text(DEEP)
    assert_one_line_error(capsys, "diversity", lora / "adapter-0", lora / "adapter-1",
                          match="adapter config .* is not readable JSON \\(nested deeper than 64 levels\\)")
    (lora / "adapter-1" / "adapter_config.json").write_text((lora / "adapter-0" / "adapter_config.json").read_text())
    (lora / "base" / "model.safetensors.index.json").write_text('{"weight_map": ' + DEEP + "}")
    assert_one_line_error(capsys, "diversity", lora / "adapter-0", lora / "adapter-1", "--base", lora / "base",
                          match="shard index .* is not readable JSON \\(nested deeper")


def test_deeply_nested_metrics_of_a_saved_run_are_damage(run, capsys):
    (run / "single" / "seed-1" / "metrics.json").write_text('{"analyzers": ' + DEEP + "}")
    assert_one_line_error(capsys, "report", run, "--no-figures", match=r"metrics.json is damaged \(not readable JSON: "
                                                                        "nested deeper than 64 levels\\)")


def test_a_json_file_larger_than_its_bound_is_refused_without_reading_it_all(tmp_path, monkeypatch):
    from ensdiag import io
    path = tmp_path / "big.json"
    with open(path, "wb") as handle:  # 1 GiB of holes: read_json must stop after its bound
        handle.truncate(2**30)
    with pytest.raises(io.UnreadableJson, match=r"larger than 1,024 bytes"):
        io.read_json(path, "file", limit=1024)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200),
                 st.integers(1, 5000).map(lambda depth: "{\"a\": " * depth + "1" + "}" * depth)))
def test_any_bytes_parse_to_a_value_or_one_unreadable_json_line(text):
    from ensdiag.io import MAX_JSON_DEPTH, UnreadableJson, _depth, parse_json
    try:
        value = parse_json(text, "input")
    except UnreadableJson as error:
        assert "\n" not in str(error) and str(error).startswith("input is not readable JSON (")
        return
    assert _depth(value) <= MAX_JSON_DEPTH


def test_the_limits_the_docs_state_are_the_codes():
    from ensdiag.data.image_folder import DECODE_BYTES_PER_PIXEL
    from ensdiag.lora.config import MAX_ADAPTERS, PATTERN_SECONDS
    from ensdiag.numbers import NORMALIZE_RANGE
    root = Path(__file__).resolve().parents[1]
    conventions, llm = (root / "docs" / "conventions.md").read_text(), (root / "docs" / "llm.md").read_text()
    superscript = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")
    low, high = (f"10{str(int(math.log10(value))).translate(superscript)}" for value in NORMALIZE_RANGE)
    for sentence in (f"more than {MAX_ADAPTERS} adapters", f"a {PATTERN_SECONDS:g} s time limit",
                     f"budget ÷ {DECODE_BYTES_PER_PIXEL} pixels", f"stds lie in [{low}, {high}]"):
        assert " ".join(sentence.split()) in " ".join(conventions.split()), sentence
    assert f"at most {MAX_ADAPTERS} adapters" in " ".join(llm.split())
