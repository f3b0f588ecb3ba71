"""LoRA adapters and bases from anywhere: damaged or hostile configs, tensors, shard indexes and
pickles are one-line errors naming the file, never a traceback; nothing pickled runs; a base of
hundreds of MB is streamed (peak memory grows by a small fraction of it)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from .cli import assert_one_line_error
from .lora_reference import copied

ROOT = Path(__file__).resolve().parents[1]
Q = "base_model.model.model.layers.0.self_attn.q_proj"


def _edit_config(folder, **changes):
    path = folder / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _edit_tensors(folder, edit):
    path = folder / "adapter_model.safetensors"
    state = load_file(path)
    edit(state)
    save_file(state, path)


CONFIGS = {  # name: (how adapter-1's folder is damaged, the error it gives)
    "not JSON": (lambda f: (f / "adapter_config.json").write_text("{"), "is not readable JSON"),
    "a list": (lambda f: (f / "adapter_config.json").write_text("[1, 2]"), "holds a JSON list"),
    "rank a string": (lambda f: _edit_config(f, r="4"), "r must be an integer"),
    "huge rank": (lambda f: _edit_config(f, r=10**12), "r must be an integer from 1 to 65536"),
    "alpha NaN": (lambda f: (f / "adapter_config.json").write_text('{"r": 4, "lora_alpha": NaN}'), "lora_alpha must be a finite"),
    "targets a number": (lambda f: _edit_config(f, target_modules=5), "target_modules must be"),
    "DoRA": (lambda f: _edit_config(f, use_dora=True), "use_dora is set"),
    "rank pattern": (lambda f: _edit_config(f, rank_pattern={"q_proj": 8}), "rank_pattern gives some modules"),
    "another PEFT method": (lambda f: _edit_config(f, peft_type="IA3"), "peft_type 'IA3' is not LORA"),
    "a huge config": (lambda f: (f / "adapter_config.json").write_text(" " * (2 << 20) + "{}"), "not a PEFT adapter config"),
    "no weights": (lambda f: (f / "adapter_model.safetensors").unlink(), "no adapter_model.safetensors or adapter_model.bin"),
}
TENSORS = {
    "truncated": (lambda f: (f / "adapter_model.safetensors").write_bytes(
        (f / "adapter_model.safetensors").read_bytes()[:1000]), "not a readable safetensors file"),
    "NaN": (lambda f: _edit_tensors(f, lambda s: s[f"{Q}.lora_B.weight"].__setitem__((0, 0), float("nan"))), "NaN or infinite"),
    "ranks of A and B differ": (lambda f: _edit_tensors(f, lambda s: s.update({f"{Q}.lora_A.weight": torch.ones(3, 32)})),
                                "lora_A of rank 3 and lora_B of rank 4"),
    "B missing": (lambda f: _edit_tensors(f, lambda s: s.pop(f"{Q}.lora_B.weight")), "has lora_A but no lora_B"),
    "integers": (lambda f: _edit_tensors(f, lambda s: s.update({f"{Q}.lora_B.weight": torch.ones(32, 4, dtype=torch.int32)})),
                 "is I32, not a float tensor"),
    "a module fewer": (lambda f: _edit_tensors(f, lambda s: [s.pop(f"{Q}.lora_{x}.weight") for x in "AB"]),
                       "adapts model.layers.0.self_attn.q_proj but"),
    "another shape": (lambda f: _edit_tensors(f, lambda s: s.update({f"{Q}.lora_A.weight": torch.ones(4, 40)})),
                      "q_proj is 32×32 in .* but 32×40"),
    "a vector": (lambda f: _edit_tensors(f, lambda s: s.update({f"{Q}.lora_A.weight": torch.ones(4)})), "not lora_A"),
}


@pytest.mark.parametrize("case", [*CONFIGS, *TENSORS])
def test_a_damaged_adapter_is_one_line_naming_it(tmp_path, capsys, case):
    copy = copied(tmp_path)
    damage, match = {**CONFIGS, **TENSORS}[case]
    damage(copy / "adapter-1")
    line = assert_one_line_error(capsys, "diversity", copy / "adapter-0", copy / "adapter-1", match=match)
    assert "adapter-1" in line


def test_a_header_declaring_a_huge_tensor_is_refused_before_anything_is_allocated(tmp_path, capsys):
    copy = copied(tmp_path)
    header = json.dumps({f"{Q}.lora_A.weight": {"dtype": "F32", "shape": [4, 2**40], "data_offsets": [0, 16]}}).encode()
    (copy / "adapter-1" / "adapter_model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(16))
    assert_one_line_error(capsys, "diversity", copy / "adapter-0", copy / "adapter-1", match="not a readable safetensors")


def test_factors_beyond_the_memory_budget_are_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ENSDIAG_MEMORY_BUDGET", "1K")
    copy = copied(tmp_path)
    assert_one_line_error(capsys, "diversity", copy / "adapter-0", copy / "adapter-1", match="more than the memory budget")


class Payload:  # anything beyond tensors: torch.load(weights_only=True) must refuse to rebuild it
    def __reduce__(self):
        return (print, ("pickled code ran",))


@pytest.mark.parametrize("content,match", [({"x": Payload()}, "never runs pickled code"), ([1, 2], "no state_dict")])
def test_a_bin_adapter_that_needs_more_than_tensors_is_refused(tmp_path, capsys, content, match):
    copy = copied(tmp_path)
    torch.save(content, copy / "adapter-2" / "adapter_model.bin")
    code_ran = assert_one_line_error(capsys, "diversity", copy / "adapter-0", copy / "adapter-2", match=match)
    assert "pickled code ran" not in capsys.readouterr().out and "adapter_model.bin" in code_ran


def _replace_base_tensor(base, name, value):
    index = json.loads((base / "model.safetensors.index.json").read_text())["weight_map"]
    shard = base / index[name]
    state = load_file(shard)
    state[name] = value
    save_file(state, shard)


BASES = {
    "missing": (lambda b: __import__("shutil").rmtree(b), "does not exist"),
    "empty folder": (lambda b: [p.unlink() for p in b.iterdir()], "holds neither model.safetensors nor"),
    "index not JSON": (lambda b: (b / "model.safetensors.index.json").write_text("{"), "shard index .* is not readable JSON"),
    "shard outside": (lambda b: (b / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"lm_head.weight": "../../etc/passwd.safetensors"}})), "not a .safetensors file name beside"),
    "shard missing": (lambda b: (b / "model-00002-of-00003.safetensors").unlink(), "lists model-00002-of-00003.safetensors"),
    "another base": (lambda b: _replace_base_tensor(b, "model.layers.0.self_attn.q_proj.weight", torch.ones(32, 16)),
                     "has shape \\[32, 16\\], but the adapters' updates of it are 32×32"),
    "NaN": (lambda b: _replace_base_tensor(b, "model.layers.1.mlp.up_proj.weight", torch.full((64, 32), float("nan"))),
            "NaN or infinite"),
    "quantised": (lambda b: _replace_base_tensor(b, "model.layers.0.self_attn.q_proj.weight",
                                                 torch.ones(32, 32, dtype=torch.int8)), "dequantise"),
}


@pytest.mark.parametrize("case", BASES)
def test_a_damaged_base_is_one_line(tmp_path, capsys, case):
    copy = copied(tmp_path)
    damage, match = BASES[case]
    damage(copy / "base")
    assert_one_line_error(capsys, "diversity", copy / "adapter-0", copy / "adapter-1", "--base", copy / "base", match=match)


def test_a_base_without_the_adapted_module_is_named(tmp_path, capsys):
    copy = copied(tmp_path)
    save_file({"lm_head.weight": torch.ones(48, 32)}, tmp_path / "other.safetensors")
    assert_one_line_error(capsys, "diversity", copy / "adapter-0", copy / "adapter-1", "--base", tmp_path / "other.safetensors",
                          match="no tensor for the adapted module model.layers.0")


def test_mismatched_configs_are_refused_before_torch_is_imported(tmp_path):
    copy = copied(tmp_path)
    _edit_config(copy / "adapter-1", lora_alpha=32)
    script = ("import sys\nfrom ensdiag.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as done:\n"
              "    print('exit', done.code, 'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", script, "diversity", str(copy / "adapter-0"), str(copy / "adapter-1")],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip().endswith("exit 2 False"), (done.stdout, done.stderr)
    assert "disagree in lora_alpha" in done.stderr


MEMORY_SCRIPT = """
import json, re, sys
from safetensors.torch import load_file
from ensdiag.lora.analysis import diagnose_adapters
from ensdiag.lora.config import read_adapter_folders

def kib(field):
    return int(re.search(field + r":\\s+(\\d+) kB", open("/proc/self/status").read()).group(1))

def growth(work):
    open("/proc/self/clear_refs", "w").write("5")  # restart the peak (VmHWM) at the present RSS
    before = kib("VmRSS")
    result = work()
    return (kib("VmHWM") - before) * 1024, result

configs = read_adapter_folders(sys.argv[1:3])
diagnose_adapters(configs)  # warm up every code path that does not read the base
streamed, section = growth(lambda: diagnose_adapters(configs, sys.argv[3]))

def hold_whole():  # what holding the base costs, measured the same way: every shard read and touched
    held = [load_file(path) for path in sys.argv[4:]]
    return [float(tensor.sum()) for state in held for tensor in state.values()]

whole, _ = growth(hold_whole)
print(json.dumps({"streamed": streamed, "whole": whole, "summary": section["summary"]}))
"""


def test_a_sharded_base_of_hundreds_of_mb_is_streamed_in_bounded_memory(tmp_path):
    """16 weights of 2048×2048 float32 (256 MiB) in 4 shards, two rank-4 adapters on all of them: peak
    RSS grows by well under a quarter of the base (one block of rows at a time), while holding the
    base as the files give it grows it by the whole base (so the measurement can see the difference)."""
    size, layers, constant = 2048, 16, 0.5
    base = tmp_path / "base"
    base.mkdir()
    weight_map = {}
    for shard in range(4):
        name = f"model-{shard + 1:05d}-of-00004.safetensors"
        names = [f"model.layers.{4 * shard + i}.mlp.up_proj.weight" for i in range(4)]
        save_file({n: torch.full((size, size), constant) for n in names}, base / name)
        weight_map.update({n: name for n in names})
    (base / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    generator = torch.Generator().manual_seed(0)
    for member in range(2):
        folder = tmp_path / f"adapter-{member}"
        folder.mkdir()
        (folder / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8, "peft_type": "LORA",
                                                                 "target_modules": ["up_proj"]}))
        save_file({f"base_model.model.model.layers.{i}.mlp.up_proj.lora_{x}.weight":
                   torch.randn(shape, generator=generator) * 0.01
                   for i in range(layers) for x, shape in (("A", (4, size)), ("B", (size, 4)))}, folder / "adapter_model.safetensors")
    shards = sorted(str(path) for path in base.glob("*.safetensors"))
    done = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, str(tmp_path / "adapter-0"), str(tmp_path / "adapter-1"),
                           str(base), *shards], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    base_bytes = layers * size * size * 4
    streamed, whole = (f"{result[key] / 2**20:.0f} MiB" for key in ("streamed", "whole"))
    assert result["streamed"] < base_bytes / 4, f"peak RSS grew by {streamed} for a base of 256 MiB"
    assert result["whole"] > base_bytes / 2, f"holding the base grew it by only {whole}: the measurement is blind"
    norm_of_base = constant * size * layers ** 0.5  # ‖W‖ over all adapted layers, so the base was read
    assert result["summary"]["relative_norm"]["members"] == pytest.approx(
        [norm / norm_of_base for norm in result["summary"]["norm"]], rel=1e-9)
