"""LoRA ensembles: real PEFT adapters and a sharded transformers base (tests/fixtures/lora, written by
make_fixtures.py there in a venv of its own; peft and transformers are not imported here). Every
factored, streamed quantity equals the dense float64 computation from the same files to 1e-10;
mismatched members are refused with one line; the CLI prints, plots and saves; reports render."""

import json
import math
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from ensdiag.lora.analysis import diagnose_adapters, layer_depth, module_type
from ensdiag.lora.config import read_adapter_folders

from .cli import assert_one_line_error, run_cli, run_recorded
from .documents import recorded_commands
from .lora_reference import ADAPTERS, BASE, FIXTURES, copied, reference

ROOT = FIXTURES.parents[2]

TOLERANCE = 1e-10


def diagnosed(folders, base=None):
    return diagnose_adapters(read_adapter_folders(folders), base)


@pytest.fixture(scope="module")
def with_base():
    return diagnosed(ADAPTERS, BASE), reference(ADAPTERS, BASE)


def close(ours, dense, tolerance=TOLERANCE):
    assert ours is not None and abs(ours - dense) <= tolerance, (ours, dense)


def test_the_fixtures_are_peft_files_of_a_sharded_base_and_stay_small():
    versions = json.loads((FIXTURES / "versions.json").read_text())
    assert {"torch", "transformers", "peft"} <= set(versions)
    assert (ADAPTERS[2] / "adapter_model.bin").is_file() and not (ADAPTERS[2] / "adapter_model.safetensors").exists()
    assert len(json.loads((BASE / "model.safetensors.index.json").read_text())["weight_map"]) > 3
    assert len(list(BASE.glob("model-*.safetensors"))) >= 2
    assert sum(path.stat().st_size for path in FIXTURES.rglob("*") if path.is_file()) < 400_000


def test_factored_layer_quantities_equal_the_dense_float64_computation(with_base):
    section, dense = with_base
    assert section["k"] == 3 and section["rank"] == 4 and section["scale"] == 2.0 and section["files"][2] == "adapter_model.bin"
    assert [layer["name"] for layer in section["layers"]] == sorted(dense["layers"], key=lambda n: (layer_depth(n), n))
    for layer in section["layers"]:
        expected = dense["layers"][layer["name"]]
        for key in ("delta_cosine", "effective_cosine", "column_overlap", "row_overlap"):
            for (i, j), value in expected[key].items():
                close(layer[key]["matrix"][i][j], value)
        for (i, j), value in expected["column_angle"].items():  # arccos is steep near 0°: looser on the diagonal
            close(layer["column_overlap"]["smallest_angle"][i][j], value, TOLERANCE if i != j else 1e-5)
        for ours, value in zip(layer["effective_rank"] + layer["relative_norm"],
                               expected["effective_rank"] + expected["relative_norm"]):
            close(ours, value)
        assert layer["rank"] == expected["rank"] == [4, 4, 4]
        m, n = layer["shape"]
        assert layer["delta_cosine"]["null_rms"] == pytest.approx(1 / math.sqrt(m * n))
        assert layer["column_overlap"]["null"] == pytest.approx(4 / m) and layer["row_overlap"]["null"] == pytest.approx(4 / n)


def test_summaries_equal_the_dense_computation_over_all_adapted_layers(with_base):
    section, dense = with_base
    summary, overall = section["summary"], dense["overall"]
    for key, matrix in (("delta_cosine", overall["delta_cosine"]), ("effective_cosine", overall["effective_cosine"])):
        for i in range(3):
            for j in range(3):
                close(summary[key]["matrix"][i][j], matrix[i, j])
    close(summary["effective_cosine"]["orthogonal_baseline"], overall["orthogonal"][np.triu_indices(3, 1)].mean())
    for ours, value in zip(summary["relative_norm"]["members"], overall["relative_norm"]):
        close(ours, value)
    layers = dense["layers"].values()
    close(summary["column_overlap"]["mean"], np.mean([np.mean([v for (i, j), v in layer["column_overlap"].items() if i < j])
                                                      for layer in layers]))
    close(summary["effective_rank"]["mean"], np.mean([r for layer in layers for r in layer["effective_rank"]]))
    by_type = {group["type"]: group for group in section["by_type"]}
    assert set(by_type) == {"q", "k", "v", "o", "up"} and all(group["layers"] == 2 for group in by_type.values())
    q = [layer["delta_cosine"]["mean"] for layer in section["layers"] if layer["type"] == "q"]
    close(by_type["q"]["delta_cosine"], sum(q) / 2)
    assert [group["depth"] for group in section["by_depth"]] == [0, 1]


def test_without_the_base_the_update_quantities_are_the_same_and_the_rest_is_absent(with_base):
    section = diagnosed(ADAPTERS)
    assert section["summary"]["effective_cosine"] is None and section["summary"]["relative_norm"] is None
    assert section["summary"]["delta_cosine"] == with_base[0]["summary"]["delta_cosine"]
    assert all("effective_cosine" not in layer for layer in section["layers"])


def test_the_bin_file_reads_as_the_safetensors_file_it_was_saved_from(tmp_path):
    copy = copied(tmp_path)
    state = load_file(copy / "adapter-0" / "adapter_model.safetensors")
    (copy / "adapter-0" / "adapter_model.safetensors").unlink()
    torch.save(state, copy / "adapter-0" / "adapter_model.bin")
    folders = [copy / "adapter-0", copy / "adapter-1"]
    assert diagnosed(folders)["summary"] == diagnosed(ADAPTERS[:2])["summary"]


def test_rslora_scales_the_updates_by_the_square_root_of_the_rank(tmp_path, with_base):
    copy = copied(tmp_path)
    for i in range(3):
        path = copy / f"adapter-{i}" / "adapter_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "use_rslora": True}))
    section = diagnosed([copy / f"adapter-{i}" for i in range(3)], copy / "base")
    assert section["scale"] == 4.0  # α/√r = 8/2, where α/r = 2
    dense = reference([copy / f"adapter-{i}" for i in range(3)], copy / "base")
    for ours, value in zip(section["summary"]["relative_norm"]["members"], dense["overall"]["relative_norm"]):
        close(ours, value)
    for ours, before in zip(section["summary"]["relative_norm"]["members"], with_base[0]["summary"]["relative_norm"]["members"]):
        close(ours, 2 * before)
    close(section["summary"]["delta_cosine"]["mean"], with_base[0]["summary"]["delta_cosine"]["mean"])


def test_a_transposed_base_with_fan_in_fan_out_gives_the_same_numbers(tmp_path, with_base):
    """GPT-2's Conv1D stores W as [in, out]; PEFT's fan_in_fan_out says so and keeps A, B as they are."""
    copy = copied(tmp_path)
    weights = {}
    for shard in (copy / "base").glob("model-*.safetensors"):
        weights.update({name: value.T.contiguous() if value.ndim == 2 else value for name, value in load_file(shard).items()})
    save_file(weights, tmp_path / "transposed.safetensors")
    for i in range(3):
        path = copy / f"adapter-{i}" / "adapter_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "fan_in_fan_out": True}))
    section = diagnosed([copy / f"adapter-{i}" for i in range(3)], tmp_path / "transposed.safetensors")
    for ours, theirs in zip(section["layers"], with_base[0]["layers"]):
        for key in ("delta_cosine", "effective_cosine", "column_overlap", "row_overlap"):
            for row, expected in zip(ours[key]["matrix"], theirs[key]["matrix"]):
                assert row == pytest.approx(expected, abs=TOLERANCE)


def test_an_untrained_adapter_has_no_direction_and_says_so(tmp_path):
    """PEFT starts B at zero: ΔW = 0 has no cosine, no subspace and no effective rank (null, not NaN)."""
    copy = copied(tmp_path)
    path = copy / "adapter-1" / "adapter_model.safetensors"
    save_file({key: value if "lora_A" in key else torch.zeros_like(value) for key, value in load_file(path).items()}, path)
    section = diagnosed([copy / "adapter-0", copy / "adapter-1"], copy / "base")
    assert section["summary"]["delta_cosine"]["matrix"][0][1] is None
    assert section["layers"][0]["effective_rank"][1] is None and section["layers"][0]["rank"][1] == 0
    assert section["summary"]["relative_norm"]["members"][1] == 0.0
    json.dumps(section, allow_nan=False)


def test_module_types_and_depths_come_from_the_names():
    assert [module_type(n) for n in ("model.layers.3.self_attn.q_proj", "model.layers.3.mlp.down_proj",
                                     "encoder.layer.2.attention.self.value", "transformer.h.0.attn.c_attn")] == \
        ["q", "down", "v", "c_attn"]
    assert [layer_depth(n) for n in ("model.layers.12.mlp.up_proj", "lm_head", "h.0.attn")] == [12, None, 0]


@pytest.mark.parametrize("field,value,match", [
    ("base_model_name_or_path", "meta-llama/Llama-2-7b-hf", "disagree in base model"),
    ("target_modules", ["q_proj", "v_proj"], "disagree in target modules"),
    ("lora_alpha", 16, "disagree in lora_alpha: 8.0 in .* but 16.0"),
])
def test_members_that_differ_in_their_settings_are_refused_with_one_line(tmp_path, capsys, field, value, match):
    copy = copied(tmp_path)
    path = copy / "adapter-1" / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), field: value}))
    assert_one_line_error(capsys, "diversity", copy / "adapter-0", copy / "adapter-1", match=match)


def test_a_member_of_another_rank_is_refused_with_one_line(capsys):
    assert_one_line_error(capsys, "diversity", ADAPTERS[0], FIXTURES / "rank-8", match="disagree in rank r: 4 in .* but 8")


def test_diversity_prints_the_lora_tables_and_json(capsys):
    code, out, err = run_cli(capsys, "diversity", *ADAPTERS, "--base", BASE)
    assert code == 0, err
    for text in ("LoRA ensemble: k = 3 adapters of rank 4", "LoRA ensemble: all adapted layers", "ΔW cosine",
                 "column-space overlap", "LoRA ensemble by module type", "LoRA ensemble by depth"):
        assert text in out, text
    code, out, _ = run_cli(capsys, "diversity", *ADAPTERS, "--format", "json")
    assert code == 0
    found = json.loads(out)["analyzers"]["lora"]  # the metrics layout every command prints
    assert found["status"] == "ok" and found["summary"]["delta_cosine"] == diagnosed(ADAPTERS)["summary"]["delta_cosine"]


def test_names_from_the_files_are_printed_literally(tmp_path, capsys):
    copy = copied(tmp_path)
    odd = copy / "[red]$\\x$[bold]"  # rich markup, and mathtext that matplotlib could not parse
    (copy / "adapter-0").rename(odd)
    for folder in (odd, copy / "adapter-1"):
        path = folder / "adapter_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "base_model_name_or_path": "[blink]$base$"}))
    code, out, err = run_cli(capsys, "diversity", odd, copy / "adapter-1", "--base", copy / "base", "--plot",
                             tmp_path / "a$b$.png")
    assert code == 0, err
    assert f"m0 = {odd} (adapter_model.safetensors)" in out and "base model [blink]$base$" in out
    assert (tmp_path / "a$b$.png").is_file() and (tmp_path / "a$b$-depth.png").is_file()


def test_options_for_running_models_are_refused_for_adapters(capsys, tmp_path):
    assert_one_line_error(capsys, "diversity", *ADAPTERS, "--preset", "digits", match="--preset does not apply to LoRA")
    assert_one_line_error(capsys, "diversity", ADAPTERS[0], match="k ≥ 2 adapter folders")
    assert_one_line_error(capsys, "diversity", ADAPTERS[0], ADAPTERS[0], match="given twice")
    assert_one_line_error(capsys, "diversity", ADAPTERS[0], FIXTURES / "versions.json", match="not a LoRA adapter folder")


def test_saved_lora_diagnoses_make_a_report(tmp_path, capsys):
    import jsonschema
    from importlib import resources
    folder = tmp_path / "report"
    for method, members, base in (("lora-3", ADAPTERS, ["--base", BASE]), ("lora-2", ADAPTERS[:2], [])):
        code, _, err = run_cli(capsys, "diversity", *members, *base, "--save", folder, "--method", method, "--seed", 7)
        assert code == 0 and "saved to" in err, err
    code, out, err = run_cli(capsys, "report", folder, "--format", "markdown")
    assert code == 0, err
    assert "## LoRA ensemble: weight space over all adapted layers" in out and "## LoRA ensemble: ΔW cosine by module type" in out
    assert "In-distribution" not in out  # weights alone: no table that needs predictions
    expected = f"{diagnosed(ADAPTERS, BASE)['summary']['delta_cosine']['mean']:.4g}"
    row = next(line for line in out.splitlines() if line.startswith("| lora-3 "))
    assert row.split("|")[2].strip() == expected
    assert "| lora-2 |" in out and "N/A" in next(line for line in out.splitlines() if line.startswith("| lora-2 "))
    assert (folder / "figures" / "lora-cosine.png").is_file() and (folder / "figures" / "lora-depth.png").is_file()
    code, out, _ = run_cli(capsys, "report", folder, "--format", "json", "--no-figures")
    schema = json.loads(resources.files("ensdiag.report").joinpath("schema.json").read_text())
    jsonschema.validate(json.loads(out), schema)
    code, out, _ = run_cli(capsys, "report", folder, "--format", "table", "--no-figures")
    assert code == 0 and "LoRA ensemble" in out


def test_a_damaged_lora_section_is_a_one_line_error(tmp_path, capsys):
    folder = tmp_path / "report"
    run_cli(capsys, "diversity", *ADAPTERS[:2], "--save", folder)
    path = folder / "lora" / "seed-0" / "lora.json"
    record = json.loads(path.read_text())
    record["lora"]["layers"] = "nonsense"
    path.write_text(json.dumps(record))
    assert_one_line_error(capsys, "report", folder, "--format", "markdown", match="its lora section has no list of layers")
    path.write_text(json.dumps({**record, "format": "something else"}))
    assert_one_line_error(capsys, "report", folder, "--format", "markdown", match="lora.json is damaged")


def test_a_lora_save_writes_only_its_own_part_and_reads_back_in_the_old_layout_too(tmp_path, capsys):
    """`diversity --save` writes lora.json alone (no metrics.json, no meta.json: the run's predictions
    part is another command's); a run saved by ensdiag 0.6 (the section in metrics.json) reports alike."""
    new, old = tmp_path / "new", tmp_path / "old"
    assert run_cli(capsys, "diversity", *ADAPTERS, "--save", new, "--method", "lora-r4")[0] == 0
    assert sorted(p.name for p in (new / "lora-r4" / "seed-0").iterdir()) == ["lora.json"]
    record = json.loads((new / "lora-r4" / "seed-0" / "lora.json").read_text())
    assert record["format"] == "ensdiag.lora-run/1" and record["method"] == "lora-r4" and record["seed"] == 0
    shutil.copytree(new, old)
    run = old / "lora-r4" / "seed-0"
    (run / "lora.json").unlink()
    (run / "metrics.json").write_text(json.dumps({"analyzers": {}, "splits": {}, "num_members": 3, "lora": record["lora"]}))
    (run / "meta.json").write_text(json.dumps({"run": "lora-r4", "method": "lora-r4", "seed": 0, "splits": {},
                                               "source": "ensdiag diversity (LoRA adapters)"}))
    tables = []
    for folder in (new, old):
        code, out, err = run_cli(capsys, "report", folder, "--format", "json", "--no-figures")
        assert code == 0, err
        tables.append([table for table in json.loads(out)["tables"]])
    assert tables[0] == tables[1] and tables[0][0]["id"] == "lora"


def test_the_documented_lora_commands_run(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tests").mkdir()  # the commands name the repository's fixtures, relative to its root
    (tmp_path / "tests" / "fixtures").symlink_to(ROOT / "tests" / "fixtures")
    commands = recorded_commands("docs/llm.md", "LoRA ensembles", tmp_path)
    assert [command[:2] for command in commands] == [["ensdiag", "diversity"]] * 2 + [["ensdiag", "report"]]
    assert commands[1].count("--save") == 1 and sum("adapter-" in part for part in commands[1]) == 3  # the glob
    outputs = [run_recorded(capsys, command, ROOT) for command in commands]
    assert "LoRA ensemble: all adapted layers" in outputs[0] and "LoRA ensemble" in outputs[2]
    assert (tmp_path / "lora.png").is_file() and (tmp_path / "lora-depth.png").is_file()


def test_convolutions_and_ranks_above_the_width_match_the_dense_computation_too(tmp_path):
    """A convolution's factors (A [r, c, kh, kw], B [m, r, 1, 1]) are matrices over its flattened
    kernels; an update of rank r > m has rank m at most, and its subspaces say so."""
    generator = torch.Generator().manual_seed(1)
    shapes = {"features.3.conv": ((4, 3, 3, 3), (8, 4, 1, 1), (8, 3, 3, 3)), "head.narrow": ((4, 6), (2, 4), (2, 6))}
    base = tmp_path / "base"
    base.mkdir()
    save_file({f"{name}.weight": torch.randn(w, generator=generator) for name, (_, _, w) in shapes.items()},
              base / "model-1.safetensors")
    (base / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {f"{n}.weight": "model-1.safetensors"
                                                                                   for n in shapes}}))
    folders = []
    for member in range(3):
        folder = tmp_path / f"adapter-{member}"
        folder.mkdir()
        (folder / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 3, "target_modules": list(shapes)}))
        save_file({f"base_model.model.{name}.lora_{x}.weight": torch.randn(shape, generator=generator)
                   for name, (a, b, _) in shapes.items() for x, shape in (("A", a), ("B", b))}, folder / "adapter_model.safetensors")
        folders.append(folder)
    section, dense = diagnosed(folders, base), reference(folders, base)
    for layer in section["layers"]:
        expected = dense["layers"][layer["name"]]
        for key in ("delta_cosine", "effective_cosine", "column_overlap", "row_overlap"):
            for (i, j), value in expected[key].items():
                close(layer[key]["matrix"][i][j], value)
        for ours, value in zip(layer["effective_rank"] + layer["relative_norm"], expected["effective_rank"] + expected["relative_norm"]):
            close(ours, value)
        assert layer["rank"] == expected["rank"]
    narrow = next(layer for layer in section["layers"] if layer["name"] == "head.narrow")
    assert narrow["rank"] == [2, 2, 2] and narrow["column_overlap"]["matrix"][0][1] == pytest.approx(1.0)  # all of R²
    conv = next(layer for layer in section["layers"] if layer["type"] == "conv")
    assert conv["shape"] == [8, 27] and conv["depth"] == 3
