"""A LoRA ensemble's weight-space diagnosis: every adapted layer read once, one module at a time,
then summarised over all layers, by module type and by depth. The result is the `lora` section
of metrics.json; docs/conventions.md ("LoRA ensembles") defines every number.

    section = diagnose_adapters(read_adapter_folders(["a", "b", "c"]), base=Path("base"))
    section["summary"]["delta_cosine"]["mean"]
"""

import math
import re
from pathlib import Path

import torch

from ..layout import finite
from ..budget import require
from ..runs import LORA, lora_record, save_result
from . import maths
from .adapters import adapted_modules, read_factors
from .base import BaseWeights
from .config import AdapterConfig

FORMAT = "ensdiag.lora/1"
# module names of common architectures (Llama, Mistral, OPT, BERT, …) → their role; others keep their last name
MODULE_TYPES = {"q_proj": "q", "query": "q", "k_proj": "k", "key": "k", "v_proj": "v", "value": "v", "o_proj": "o",
                "out_proj": "o", "up_proj": "up", "fc1": "up", "down_proj": "down", "fc2": "down", "gate_proj": "gate"}
DEFINITIONS = {
    "scale": "ΔW_i = s·B_i·A_i with PEFT's s = α/r (α/√r with use_rslora)",
    "delta_cosine": "⟨ΔW_i, ΔW_j⟩/(‖ΔW_i‖‖ΔW_j‖), factored: ⟨B_iA_i, B_jA_j⟩ = tr((B_iᵀB_j)(A_jA_iᵀ)); all layers: "
                    "the updates of every adapted layer concatenated; null_rms: the RMS cosine of updates with "
                    "independent uniformly random singular vectors, 1/√(mn) per layer (expected cosine 0)",
    "effective_cosine": "cosine of the effective weights W+ΔW_i of the adapted layers (⟨W, BA⟩ = tr(BᵀWAᵀ)); "
                        "orthogonal_baseline: the same cosine if every update were orthogonal to W and to the others",
    "column_overlap": "principal angles between the column spaces of ΔW_i and ΔW_j (span of B_i when A_i has full "
                      "rank): mean cos² = ‖U_iᵀU_j‖²_F / min(ρ_i, ρ_j), 1 = one space holds the other; null: "
                      "max(ρ_i, ρ_j)/m for independent random subspaces; smallest_angle in degrees",
    "row_overlap": "the same for the row spaces (span of A_iᵀ) in R^n; null max(ρ_i, ρ_j)/n",
    "effective_rank": "exp of the entropy of σ/‖σ‖₁, σ the singular values of s·B·A (Roy & Vetterli 2007): "
                      "1 to r; rank: the numerical rank ρ (σ > σ₁·max(m, n)·ε)",
    "relative_norm": "‖ΔW_i‖_F / ‖W‖_F (all layers: over every adapted layer together)",
}


def module_type(name: str) -> str:
    last = name.rsplit(".", 1)[-1]
    return MODULE_TYPES.get(last, last)


def layer_depth(name: str) -> int | None:
    """The first number in the module's name: `model.layers.12.mlp.up_proj` → 12 (ASCII digits, at most 18:
    a name from a file with "٣" or 5,000 digits in it has no depth rather than a wrong or failing one)."""
    found = re.search(r"(?:^|\.)([0-9]{1,18})(?:\.|$)", name, re.ASCII)
    return int(found.group(1)) if found else None


def diagnose_adapters(configs: list[AdapterConfig], base=None, progress=None) -> dict:
    """The `lora` section for k checked adapter configs; `base`: the base's safetensors (optional);
    `progress(done, total)`: called after each adapted layer (long adapter sets take minutes)."""
    modules, other = adapted_modules(configs)
    weights = BaseWeights(base) if base is not None else None
    transposed = configs[0].fan_in_fan_out  # GPT-2's Conv1D: W is stored [n, m]
    if weights is not None:  # every adapted weight found and fitting before anything is computed
        for module in modules:
            weights.check_weight(weights.weight_of(module.name), module.shape[::-1] if transposed else module.shape)
    k, rank = len(configs), configs[0].rank
    for module in modules:  # every layer's maths within the memory budget, before any factor is read
        require(maths.layer_bytes(k, *module.shape, rank), f"the LoRA maths of {module.name} (k = {k}, r = {rank})")
    log_scales = torch.tensor([config.log_scale for config in configs], dtype=maths.FLOAT)
    signs = torch.tensor([math.copysign(1.0, config.alpha) for config in configs], dtype=maths.FLOAT)
    totals = {"delta": maths.ScaledGram(k), "null": maths.ScaledGram(k), "joint": maths.ScaledGram(k + 1)}
    layers = []
    for done, module in enumerate(modules, 1):
        factors = [read_factors(config, module) for config in configs]
        layers.append(_layer(module, factors, log_scales, signs, weights, transposed, totals))
        if progress is not None:
            progress(done, len(modules))
    first = configs[0]
    section = {"format": FORMAT, "members": [str(config.folder) for config in configs],
               "files": [config.weights.name for config in configs], "k": k, "rank": first.rank, "alpha": first.alpha,
               "use_rslora": first.use_rslora, "scale": first.scale, "base_model": first.base_model,
               "target_modules": list(first.target_modules) if isinstance(first.target_modules, tuple) else first.target_modules,
               "base": None if base is None else str(base), "not_compared": other,
               "summary": _summary(layers, totals, weights is not None, first.rank),
               "by_type": _groups(layers, "type"), "by_depth": _groups(layers, "depth"), "layers": layers,
               "definitions": DEFINITIONS}
    return finite(section)


def _layer(module, factors, log_scales, signs, weights, transposed, totals) -> dict:
    """Every quantity of one adapted layer; `totals` gathers the sums over layers. Each member's update
    is a unit direction and a log size (maths.unit_factors): the scale never meets a product."""
    A = torch.stack([a for a, _ in factors])
    B = torch.stack([b for _, b in factors])
    m, n = module.shape
    if transposed:  # fan_in_fan_out: W is stored [n, m], so compare (B·A)ᵀ = Aᵀ·Bᵀ with it
        A, B = B.transpose(1, 2), A.transpose(1, 2)
    k = len(factors)
    A, B, log_size = maths.unit_factors(A, B, log_scales)
    unit = maths.unit_gram(A, B) * torch.outer(signs, signs)
    delta = maths.ScaledGram(k)
    delta.add(unit, log_size)
    spaces = [maths.factored_svd(B[i], A[i]) for i in range(k)]  # directions and ranks: the scale plays no part
    left = _subspaces([u for u, _, _ in spaces], B.shape[1])
    right = _subspaces([v for _, _, v in spaces], A.shape[2])
    column, row = (right, left) if transposed else (left, right)
    layer = {"name": module.name, "type": module_type(module.name), "depth": layer_depth(module.name), "shape": [m, n],
             # null_rms: an independent [m, n] matrix with uniformly random singular vectors has E[cos²] = 1/(mn)
             "delta_cosine": _matrix(maths.cosines(delta.total), null_rms=1 / math.sqrt(m * n)),
             "column_overlap": column, "row_overlap": row,
             "effective_rank": [maths.effective_rank(sigma) for _, sigma, _ in spaces],
             "rank": [int(sigma.numel()) for _, sigma, _ in spaces], "norm": delta.norms()}
    totals["delta"].add(unit, log_size)
    squares = torch.clamp(torch.diagonal(unit), min=0)  # ‖ΔW_i‖² / e^{2·log size_i}
    totals["null"].add(torch.outer(squares, squares) / (m * n), 2 * log_size)
    if weights is not None:
        name = weights.weight_of(module.name)
        log_base, inner = maths.base_products(weights.row_blocks(name, (B.shape[1], A.shape[2])), A, B)
        joint_unit = torch.zeros(k + 1, k + 1, dtype=maths.FLOAT)
        joint_unit[0, 0] = 1.0 if log_base > -math.inf else 0.0
        joint_unit[0, 1:] = joint_unit[1:, 0] = inner * signs
        joint_unit[1:, 1:] = unit
        joint = maths.ScaledGram(k + 1)
        joint.add(joint_unit, torch.cat([torch.tensor([log_base], dtype=maths.FLOAT), log_size]))
        layer["base_weight"] = name
        layer["effective_cosine"] = _effective_cosine(joint)
        layer["relative_norm"] = maths.relative_norms(joint)
        totals["joint"].add(joint_unit, joint.log_scale)
    return layer


def _subspaces(bases, dimension) -> dict:
    k = len(bases)
    overlap = maths.pair_matrix(k, lambda i, j: maths.overlap(bases[i], bases[j]))
    angle = maths.pair_matrix(k, lambda i, j: math.degrees(math.acos(float(maths.principal_cosines(bases[i], bases[j])[0])))
                              if bases[i].shape[1] and bases[j].shape[1] else None)
    null = maths.mean(maths.overlap_null(bases[i].shape[1], bases[j].shape[1], dimension)
                      for i in range(k) for j in range(i + 1, k))
    return {**_matrix(overlap, null=null), "smallest_angle": angle}


def _matrix(matrix, **extra) -> dict:
    return {"matrix": matrix, "mean": maths.mean(maths.off_diagonal(matrix)), **extra}


def _effective_cosine(joint) -> dict:
    effective, orthogonal = maths.with_base(joint)
    return _matrix(maths.cosines(effective), orthogonal_baseline=maths.mean(maths.off_diagonal(maths.cosines(orthogonal))))


def _summary(layers, totals, with_base, rank) -> dict:
    delta = totals["delta"]
    summary = {"layers": len(layers),
               "delta_cosine": _matrix(maths.cosines(delta.total),
                                       null_rms=maths.mean(maths.null_cosines(delta, totals["null"]))),
               "column_overlap": _mean_of(layers, "column_overlap"), "row_overlap": _mean_of(layers, "row_overlap"),
               "effective_rank": {"mean": maths.mean(r for layer in layers for r in layer["effective_rank"]), "r": rank},
               "norm": delta.norms(), "effective_cosine": None, "relative_norm": None}
    if with_base:
        summary["effective_cosine"] = _effective_cosine(totals["joint"])
        members = maths.relative_norms(totals["joint"])
        summary["relative_norm"] = {"members": members, "mean": maths.mean(members)}
    return summary


def _mean_of(layers, key) -> dict:
    return {"mean": maths.mean(layer[key]["mean"] for layer in layers),
            "null": maths.mean(layer[key]["null"] for layer in layers)}


def _groups(layers, by) -> list[dict]:
    """Layer means per module type (in order of appearance) or per depth (layers without a number last)."""
    keys = list(dict.fromkeys(layer[by] for layer in layers))
    if by == "depth":
        keys.sort(key=lambda depth: (depth is None, depth or 0))
    groups = []
    for key in keys:
        found = [layer for layer in layers if layer[by] == key]
        group = {by: key, "layers": len(found),
                 "delta_cosine": maths.mean(layer["delta_cosine"]["mean"] for layer in found),
                 "delta_cosine_null": maths.mean(layer["delta_cosine"]["null_rms"] for layer in found),
                 **{f"{space}{part}": maths.mean(layer[space][name] for layer in found)
                    for space in ("column_overlap", "row_overlap") for part, name in (("", "mean"), ("_null", "null"))},
                 "effective_rank": maths.mean(r for layer in found for r in layer["effective_rank"])}
        if "effective_cosine" in found[0]:
            group["effective_cosine"] = maths.mean(layer["effective_cosine"]["mean"] for layer in found)
            group["relative_norm"] = maths.mean(r for layer in found for r in layer["relative_norm"])
        groups.append(group)
    return groups


def save_lora_run(folder, method: str, seed: int, section: dict, source: str, overwrite: bool = False) -> Path:
    """`folder/<method>/seed-<seed>/lora.json`: the run's weight-space part, listed in the folder's
    experiment.json like any diagnosis (`runs.save_result`: a predictions part of the same run is left
    as it is, a LoRA diagnosis already there is replaced only with `overwrite`)."""
    return save_result(folder, method, seed, LORA, lora_record(method, seed, source, section), overwrite=overwrite)
