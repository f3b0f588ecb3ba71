"""LoRA ensembles at the edges: the cosine and the overlaps of updates do not depend on the scale
α/r or on how large the factors' entries are (α = 1e308 and 5e-324 give the numbers of α = 8),
no [k, k, r, r] block is formed (a rank-65,536 adapter of a 1×1 layer takes megabytes, not
137 GB) and every layer's maths is checked against the memory budget first; at most 64 adapters,
with a progress callback per layer; target_modules must name the weights' modules; a refused
pickle is one line."""

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from safetensors.torch import load_file, save_file

from ensdiag.lora.analysis import diagnose_adapters
from ensdiag.lora.config import read_adapter_folders

from .cli import assert_one_line_error, run_cli
from .lora_reference import ADAPTERS, BASE, copied

KEY = "base_model.model.layers.0.q_proj.lora_{}.weight"


def diagnosed(folders, base=None, progress=None):
    return diagnose_adapters(read_adapter_folders(folders), base, **({"progress": progress} if progress else {}))


def set_config(folder, **changes):
    path = folder / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def scale_free(section) -> dict:
    """What must not depend on α or on the factors' magnitude: cosines, overlaps, ranks."""
    summary = section["summary"]
    return {"delta": summary["delta_cosine"]["matrix"], "column": summary["column_overlap"]["mean"],
            "row": summary["row_overlap"]["mean"], "rank": summary["effective_rank"]["mean"],
            "layers": [(layer["delta_cosine"]["matrix"], layer["column_overlap"]["matrix"], layer["row_overlap"]["matrix"],
                        layer["effective_rank"], layer["rank"]) for layer in section["layers"]]}


def assert_close(ours, expected, tolerance=1e-9):
    if isinstance(expected, (list, tuple)):
        assert len(ours) == len(expected)
        for a, b in zip(ours, expected):
            assert_close(a, b, tolerance)
    elif isinstance(expected, dict):
        assert ours.keys() == expected.keys()
        for key in expected:
            assert_close(ours[key], expected[key], tolerance)
    elif isinstance(expected, float):
        assert ours is not None and abs(ours - expected) <= tolerance * max(1.0, abs(expected)), (ours, expected)
    else:
        assert ours == expected


@pytest.fixture(scope="module")
def at_alpha_8():
    return diagnosed(ADAPTERS, BASE)


@pytest.mark.parametrize("alpha", [1e308, 5e-324, -1e308, 1e-300])
def test_extreme_alphas_give_the_cosines_and_overlaps_of_alpha_8(tmp_path, at_alpha_8, alpha):
    copy = copied(tmp_path)
    folders = [copy / f"adapter-{i}" for i in range(3)]
    for folder in folders:
        set_config(folder, lora_alpha=alpha)
    section = diagnosed(folders, copy / "base")
    assert_close(scale_free(section), scale_free(at_alpha_8))  # a negative α flips every update: no cosine changes
    json.dumps(section, allow_nan=False)
    effective = section["summary"]["effective_cosine"]["matrix"]
    if abs(alpha) > 1e300:  # W is negligible beside the updates: the effective cosine is the update cosine
        assert_close(effective, at_alpha_8["summary"]["delta_cosine"]["matrix"], 1e-9)
    else:  # the updates are negligible beside W: every effective weight is W
        assert_close(effective, [[1.0] * 3] * 3, 1e-9)


@settings(max_examples=12, deadline=None)
@given(st.floats(-323, 308), st.booleans())
def test_the_update_cosine_never_depends_on_alpha(tmp_path_factory, exponent, negative):
    copy = copied(tmp_path_factory.mktemp("alpha"))
    alpha = (-1 if negative else 1) * 10.0 ** exponent
    folders = [copy / f"adapter-{i}" for i in range(2)]
    for folder in folders:
        set_config(folder, lora_alpha=alpha)
    section = diagnosed(folders)
    reference = diagnosed(ADAPTERS[:2])
    assert_close(scale_free(section), scale_free(reference))


def test_the_relative_norm_scales_with_alpha_where_float64_holds_it(tmp_path, at_alpha_8):
    copy = copied(tmp_path)
    folders = [copy / f"adapter-{i}" for i in range(3)]
    for folder in folders:
        set_config(folder, lora_alpha=8e200)
    section = diagnosed(folders, copy / "base")
    for ours, before in zip(section["summary"]["relative_norm"]["members"],
                            at_alpha_8["summary"]["relative_norm"]["members"]):
        assert ours == pytest.approx(before * 1e200, rel=1e-9)


def test_factors_of_extreme_magnitude_give_the_same_cosines(tmp_path):
    copy = copied(tmp_path)
    folders = [copy / f"adapter-{i}" for i in range(2)]
    for index, folder in enumerate(folders):
        path = folder / "adapter_model.safetensors"
        factor = {"A": 1e160, "B": 1e150} if index == 0 else {"A": 1e-160, "B": 1e-150}
        save_file({key: value.double() * factor["A" if "lora_A" in key else "B"] for key, value in load_file(path).items()},
                  path)
    assert_close(scale_free(diagnosed(folders)), scale_free(diagnosed(ADAPTERS[:2])))


# ------------------------------------------------------------------ bounded before allocation

def huge_rank_adapters(root, rank=65536):
    """Two adapters of rank 65,536 on a 1×1 layer (256 KiB files): their [k, k, r, r] block is 137 GB."""
    folders = []
    for i in range(2):
        folder = root / f"a{i}"
        folder.mkdir(parents=True)
        generator = torch.Generator().manual_seed(i)
        save_file({KEY.format("A"): torch.randn(rank, 1, generator=generator).half(),
                   KEY.format("B"): torch.randn(1, rank, generator=generator).half()}, folder / "adapter_model.safetensors")
        (folder / "adapter_config.json").write_text(json.dumps({"r": rank, "lora_alpha": 16, "target_modules": ["q_proj"]}))
        folders.append(folder)
    return folders


@pytest.fixture
def no_big_einsum(monkeypatch):
    """torch.einsum refuses to form a result of more than 10⁸ numbers (the 137 GB block of 0.6.0 is
    refused here, before any allocation, instead of taking the machine's memory)."""
    real = torch.einsum

    def einsum(equation, *operands):
        inputs, output = equation.split("->")
        sizes = {letter: size for term, operand in zip(inputs.split(","), operands) for letter, size in zip(term, operand.shape)}
        assert math.prod(sizes[letter] for letter in output) <= 10**8, f"einsum {equation} would form a huge block"
        return real(equation, *operands)

    monkeypatch.setattr(torch, "einsum", einsum)


def test_a_huge_rank_on_a_tiny_layer_never_forms_the_rank_squared_block(tmp_path, capsys, monkeypatch, no_big_einsum):
    folders = huge_rank_adapters(tmp_path)
    monkeypatch.setenv("ENSDIAG_MEMORY_BUDGET", "64M")
    section = diagnosed(folders)
    products = [float((load_file(f / "adapter_model.safetensors")[KEY.format("B")].double()
                       @ load_file(f / "adapter_model.safetensors")[KEY.format("A")].double()).item()) for f in folders]
    assert section["summary"]["delta_cosine"]["matrix"][0][1] == pytest.approx(math.copysign(1.0, products[0] * products[1]))
    monkeypatch.setenv("ENSDIAG_MEMORY_BUDGET", "1M")
    assert_one_line_error(capsys, "diversity", *folders, match=r"the LoRA maths of layers.0.q_proj \(k = 2, r = 65536\) "
                                                               "needs about .* more than the memory budget of 1.0 MiB")


def test_the_gram_matrix_equals_the_dense_one_by_either_way_of_computing_it():
    from ensdiag.lora.maths import unit_gram
    generator = torch.Generator().manual_seed(0)
    for k, m, n, rank in ((3, 5, 7, 2), (3, 2, 2, 6)):  # r×r blocks, and the updates themselves (r² > m·n)
        A = torch.randn(k, rank, n, generator=generator, dtype=torch.float64)
        B = torch.randn(k, m, rank, generator=generator, dtype=torch.float64)
        dense = torch.stack([B[i] @ A[i] for i in range(k)]).reshape(k, -1)
        assert torch.allclose(unit_gram(A, B), dense @ dense.T, rtol=1e-12, atol=1e-12)


def test_more_adapters_than_are_compared_pairwise_are_refused_at_once(tmp_path, capsys):
    import shutil
    folders = []
    for i in range(65):
        folders.append(tmp_path / f"a{i}")
        shutil.copytree(ADAPTERS[0], folders[-1])
    assert_one_line_error(capsys, "diversity", *folders, match="65 adapter folders; .* takes at most 64")


def test_progress_is_reported_after_every_layer():
    seen = []
    section = diagnosed(ADAPTERS[:2], progress=lambda done, total: seen.append((done, total)))
    layers = section["summary"]["layers"]
    assert seen == [(done, layers) for done in range(1, layers + 1)]


def test_the_progress_bar_shows_only_on_a_terminal():
    import io

    from rich.console import Console

    from ensdiag.progress import step_bar
    plain, terminal = io.StringIO(), io.StringIO()
    with step_bar("comparing", Console(file=plain)) as advance:
        advance(1, 2)
    with step_bar("comparing", Console(file=terminal, force_terminal=True)) as advance:
        advance(1, 2)
    assert plain.getvalue() == "" and "comparing" in terminal.getvalue()


# ------------------------------------------------------------------ what the files say about themselves

def test_target_modules_that_name_none_of_the_weights_are_refused(tmp_path, capsys):
    copy = copied(tmp_path)
    folders = [copy / "adapter-0", copy / "adapter-1"]
    for targets, match in ((["gate_proj"], r"target_modules \(gate_proj\) does not name"),
                           (r"model\.layers\.\d+\.mlp\..*", "does not name model.layers.0.self_attn"),
                           ("(unclosed", "is not a regular expression")):
        for folder in folders:
            set_config(folder, target_modules=targets)
        assert_one_line_error(capsys, "diversity", *folders, match=match)
    for targets in (r"model\.layers\.\d+\..*_proj", "all-linear"):
        for folder in folders:
            set_config(folder, target_modules=targets)
        code, _, err = run_cli(capsys, "diversity", *folders, "--format", "json")
        assert code == 0, err


def test_a_target_pattern_that_backtracks_for_ever_is_refused_in_time(tmp_path, capsys, monkeypatch):
    from ensdiag.lora import config
    monkeypatch.setattr(config, "PATTERN_SECONDS", 0.3)
    name = "a" * 40 + "!"  # (a+)+$ against it backtracks 2⁴⁰ times
    folders = []
    for i, source in enumerate(ADAPTERS[:2]):
        folder = tmp_path / f"a{i}"
        folder.mkdir()
        state = {key.replace("model.layers.0.self_attn.q_proj", name): value
                 for key, value in load_file(source / "adapter_model.safetensors").items() if "layers.0.self_attn.q_proj" in key}
        save_file(state, folder / "adapter_model.safetensors")
        (folder / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8, "target_modules": "(a+)+$"}))
        folders.append(folder)
    assert_one_line_error(capsys, "diversity", *folders, match="takes more than 0.3 s to match")


def test_a_refused_pickle_is_one_line_without_torchs_warning_or_advice(tmp_path, capsys):
    class Payload:
        def __reduce__(self):
            return (print, ("pickled code ran",))
    copy = copied(tmp_path)
    torch.save({"x": Payload()}, copy / "adapter-2" / "adapter_model.bin", pickle_protocol=4)
    line = assert_one_line_error(capsys, "diversity", copy / "adapter-0", copy / "adapter-2",
                                 match="needs more than tensors to load")
    assert "weights_only=False" not in line and "weights_only` set to `False`" not in line


def test_extreme_values_and_a_negative_alpha_stay_json(tmp_path):
    copy = copied(tmp_path)
    folders = [copy / f"adapter-{i}" for i in range(2)]
    for folder in folders:
        set_config(folder, lora_alpha=-1e308)
    section = diagnosed(folders, copy / "base")
    text = json.dumps(section, allow_nan=False)
    assert np.isfinite([value for value in section["summary"]["norm"] if value is not None]).all()
    assert "NaN" not in text and "Infinity" not in text
