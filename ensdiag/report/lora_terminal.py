"""The `lora` section for a person: `ensdiag diversity ADAPTER_DIR…`'s "LoRA ensemble" lines and
tables (every name from the files shown literally, never as markup)."""

from rich.table import Table
from rich.text import Text

from .terminal import cell, heatmap_table, titled
from ..text import terminal


def _gap(value) -> str:
    """1 − cosine of effective weights, which sit near 1: the digits that differ."""
    return "N/A" if value is None else f"{1 - value:.3g}"


def headline(section: dict) -> str:
    base = (f"base weights {section['base']}" if section["base"] else
            "no --base: effective-weight cosine and ‖ΔW‖/‖W‖ need the base model's weights")
    named = f", base model {section['base_model']}" if section["base_model"] else ""
    return (f"LoRA ensemble: k = {section['k']} adapters of rank {section['rank']}, α = {section['alpha']:g} "
            f"(scale {section['scale']:.4g}{', rsLoRA' if section['use_rslora'] else ''}){named}; "
            f"{section['summary']['layers']} adapted layers; {base}")


def summary_table(section: dict) -> Table:
    summary = section["summary"]
    table = titled(Text("LoRA ensemble: all adapted layers"), ("quantity", "value", "baseline", "reading"), left=(0, 3),
                   header_style="bold")
    delta = summary["delta_cosine"]
    table.add_row("ΔW cosine (mean over pairs)", cell(delta["mean"]), f"null RMS {cell(delta['null_rms'])}",
                  "1: members moved the same way; independent random updates: ≈ 0")
    for name, key in (("column-space overlap (mean cos²)", "column_overlap"),
                      ("row-space overlap (mean cos²)", "row_overlap")):
        table.add_row(name, cell(summary[key]["mean"]), f"null {cell(summary[key]['null'])}",
                      "1: the same subspace; random subspaces: the null")
    rank = summary["effective_rank"]
    table.add_row("effective rank of ΔW (mean)", cell(rank["mean"], 2), f"r = {rank['r']}",
                  "1: one direction; r: all r directions equally used")
    effective = summary["effective_cosine"]
    if effective is not None:
        table.add_row("1 − cosine of W + ΔW_i (mean)", _gap(effective["mean"]),
                      f"orthogonal {_gap(effective['orthogonal_baseline'])}",
                      "below the baseline: the updates share directions (with W or each other)")
        table.add_row("‖ΔW‖/‖W‖ (mean over members)", cell(summary["relative_norm"]["mean"], 4), "",
                      "how far the adapters moved the adapted layers")
    return table


def group_table(section: dict, by: str) -> Table:
    with_base = section["summary"]["effective_cosine"] is not None
    title = "LoRA ensemble by module type" if by == "type" else "LoRA ensemble by depth (layer index in the name)"
    columns = [by, "layers", "ΔW cosine", "null RMS", "column overlap", "null", "row overlap", "null", "eff. rank"]
    table = titled(Text(title), columns + (["1 − eff. cosine", "‖ΔW‖/‖W‖"] if with_base else []), header_style="bold")
    for group in section[f"by_{by}"]:
        cells = [str(group["layers"]), cell(group["delta_cosine"]), cell(group["delta_cosine_null"]),
                 cell(group["column_overlap"]), cell(group["column_overlap_null"]), cell(group["row_overlap"]),
                 cell(group["row_overlap_null"]), cell(group["effective_rank"], 2)]
        if with_base:
            cells += [_gap(group["effective_cosine"]), cell(group["relative_norm"], 4)]
        table.add_row(Text("none" if group[by] is None else terminal(group[by])), *cells)
    return table


def lora_renderables(section: dict) -> list:
    """Lines (str) and tables, in the order `diversity` prints them."""
    members = ", ".join(f"m{i} = {folder} ({name})" for i, (folder, name) in enumerate(zip(section["members"], section["files"])))
    shown = [headline(section), f"members: {members}", summary_table(section),
             "ΔW cosine between members, all adapted layers (factored: ΔW is never formed)",
             heatmap_table(section["summary"]["delta_cosine"]["matrix"], "", low=-1.0, high=1.0)]
    shown += [group_table(section, "type"), group_table(section, "depth")]
    if section["not_compared"]:
        other = section["not_compared"]
        shown.append(f"not compared: {len(other)} other tensors in {section['files'][0]} (e.g. {other[0]}): "
                     "no LoRA factors")
    shown.append("definitions: docs/conventions.md, 'LoRA ensembles' (and the section's 'definitions' in --format json)")
    return shown
