"""A dense float64 reference for LoRA ensembles, written apart from ensdiag.lora: every ΔW = s·B·A is
materialised with NumPy and every quantity computed from its definition (full SVDs, plain inner
products), so tests can hold ensdiag's factored, streamed numbers against it."""

import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

FIXTURES = Path(__file__).parent / "fixtures" / "lora"
ADAPTERS = [FIXTURES / f"adapter-{i}" for i in range(3)]
BASE = FIXTURES / "base"
KEY = re.compile(r"^base_model\.model\.(.+)\.lora_([AB])\.weight$")


def copied(tmp_path) -> Path:
    """A writable copy of the fixtures (adapter-0..2, rank-8, base)."""
    target = tmp_path / "lora"
    shutil.copytree(FIXTURES, target, ignore=shutil.ignore_patterns("*.py", "README.md"))
    return target


def adapter_tensors(folder) -> dict:
    folder = Path(folder)
    if (folder / "adapter_model.safetensors").is_file():
        return load_file(folder / "adapter_model.safetensors")
    return torch.load(folder / "adapter_model.bin", weights_only=True)


def dense_updates(folder) -> dict[str, np.ndarray]:
    """{module: ΔW [m, n]} of one adapter, in float64."""
    config = json.loads((Path(folder) / "adapter_config.json").read_text())
    rank = config["r"]
    scale = config["lora_alpha"] / (math.sqrt(rank) if config.get("use_rslora") else rank)
    factors = {}
    for key, value in adapter_tensors(folder).items():
        module, which = KEY.match(key).groups()
        factors.setdefault(module, {})[which] = value.double().numpy()
    return {module: scale * ab["B"].reshape(ab["B"].shape[0], rank) @ ab["A"].reshape(rank, -1)
            for module, ab in factors.items()}


def base_weights(folder=BASE) -> dict[str, np.ndarray]:
    index = json.loads((Path(folder) / "model.safetensors.index.json").read_text())["weight_map"]
    tensors = {}
    for shard in sorted(set(index.values())):
        tensors.update({name: value.double().numpy() for name, value in load_file(Path(folder) / shard).items()})
    return tensors


def cosine(x, y) -> float:
    return float((x * y).sum() / (np.linalg.norm(x) * np.linalg.norm(y)))


def column_basis(matrix) -> np.ndarray:
    u, sigma, _ = np.linalg.svd(matrix, full_matrices=False)
    return u[:, :np.linalg.matrix_rank(matrix)]


def principal_cosines(first, second) -> np.ndarray:
    return np.minimum(np.linalg.svd(first.T @ second, compute_uv=False), 1.0)


def effective_rank(matrix) -> float:
    sigma = np.linalg.svd(matrix, compute_uv=False)
    p = sigma[sigma > 0] / sigma.sum()
    return math.exp(-(p * np.log(p)).sum())


def reference(folders, base=None) -> dict:
    """Per module and over all adapted layers, from the dense matrices."""
    updates = [dense_updates(folder) for folder in folders]
    k, modules = len(updates), sorted(updates[0])
    weights = base_weights(base) if base is not None else None
    pairs = [(i, j) for i in range(k) for j in range(k)]
    layers, inner, effective, base_squared = {}, np.zeros((k, k)), np.zeros((k, k)), 0.0
    for module in modules:
        deltas = [update[module] for update in updates]
        columns = [column_basis(d) for d in deltas]
        rows = [column_basis(d.T) for d in deltas]
        layer = {"delta_cosine": {(i, j): cosine(deltas[i], deltas[j]) for i, j in pairs},
                 "column_overlap": {(i, j): float((principal_cosines(columns[i], columns[j]) ** 2).mean()) for i, j in pairs},
                 "row_overlap": {(i, j): float((principal_cosines(rows[i], rows[j]) ** 2).mean()) for i, j in pairs},
                 "column_angle": {(i, j): math.degrees(math.acos(principal_cosines(columns[i], columns[j])[0]))
                                  for i, j in pairs},
                 "effective_rank": [effective_rank(d) for d in deltas],
                 "rank": [int(np.linalg.matrix_rank(d)) for d in deltas]}
        inner += np.array([[(deltas[i] * deltas[j]).sum() for j in range(k)] for i in range(k)])
        if weights is not None:
            w = weights[f"{module}.weight"].reshape(deltas[0].shape)
            full = [w + d for d in deltas]
            layer["effective_cosine"] = {(i, j): cosine(full[i], full[j]) for i, j in pairs}
            layer["relative_norm"] = [float(np.linalg.norm(d) / np.linalg.norm(w)) for d in deltas]
            effective += np.array([[(full[i] * full[j]).sum() for j in range(k)] for i in range(k)])
            base_squared += float((w * w).sum())
        layers[module] = layer
    norms = np.sqrt(np.diag(inner))
    overall = {"delta_cosine": inner / np.outer(norms, norms), "norm": norms}
    if weights is not None:
        overall["effective_cosine"] = effective / np.sqrt(np.outer(np.diag(effective), np.diag(effective)))
        overall["relative_norm"] = norms / math.sqrt(base_squared)
        orthogonal = base_squared + np.diag(norms ** 2)
        overall["orthogonal"] = orthogonal / np.sqrt(np.outer(np.diag(orthogonal), np.diag(orthogonal)))
    return {"layers": layers, "overall": overall}
