"""What a weight cosine between members must be read against: its value before training, and
what alignment alone produces.

- `initial_cosine(model)`: the members' weight cosine as built, before any training step.
  `ensdiag train` records it for every run; for a model file, `initial_cosine_of_spec(spec,
  seed)` rebuilds the same architecture and method from the stored spec with the run's seed
  (ensdiag seeds `torch.manual_seed(seed)` right before building, so this is the recorded value
  exactly) and measures it. BatchEnsemble members start at ≈ 0.6 (one shared W, random signs
  and scales), Deep Ensemble members at ≈ 0: a trained 0.87 means little against the first.
- `aligned_null(model, seed)`: k members of the same plain architecture, each initialised
  independently and never trained, aligned to the first by the same weight matching as the
  trained members. Matching maximises the inner product, so even random members reach a
  positive aligned cosine; a trained aligned cosine says something only above it.

    found = initial_cosine(model)                  # {"mean", "layers"} or None (one weight set)
    null = aligned_null(model, seed=0)             # {"raw", "aligned", "layers"} or None (no permutation rule)
"""

from ..ensembles import as_ensemble, seeded
from ..errors import EnsdiagError
from ..nn.model import build_from_spec
from ..stats import metrics as M
from .align import align_networks


def initial_cosine(model) -> dict | None:
    """{"mean", "layers": {layer: mean}} of the member weights' cosine; None for one weight set."""
    weights = model.member_weights()
    if len(weights) < 2:
        return None
    overall, per_layer = M.weight_cosine(weights)
    return {"mean": M.mean_off_diagonal(overall),
            "layers": {layer: M.mean_off_diagonal(matrix) for layer, matrix in per_layer.items()}}


def recorded_or_rebuilt(model, seed: int = 0) -> dict | None:
    """{"mean", "source"}: the initial cosine a model file recorded at training, else measured on a
    fresh build of its spec (with `seed`); None for one weight set or a model without a spec."""
    recorded = getattr(model, "initial_cosine", None)
    if recorded is not None:
        return {"mean": recorded["mean"], "source": f"recorded at training, seed {recorded['seed']}"}
    spec = getattr(model, "spec", None)
    if spec is None:
        return None
    try:
        found = initial_cosine_of_spec(spec, seed)
    except (EnsdiagError, RuntimeError, MemoryError):
        return None
    return None if found is None else {"mean": found["mean"], "source": f"a fresh build of the model's spec, seed {seed}"}


def initial_cosine_of_spec(spec, seed: int = 0) -> dict | None:
    """`initial_cosine` of a fresh model built from `spec` after `torch.manual_seed(seed)`
    (the global RNG is left as it was)."""
    with seeded(None, seed):  # the CPU generator alone, as training seeds it before building
        return initial_cosine(build_from_spec(spec))


def aligned_null(ensemble, seed: int = 0) -> dict | None:
    """Raw and aligned mean off-diagonal cosine (overall and per layer) of k (the ensemble's)
    independently initialised, untrained plain networks of the members' architecture, each
    aligned to the first by weight matching. None without such networks or a permutation rule."""
    ensemble = as_ensemble(ensemble)
    networks = ensemble.untrained_members(ensemble.num_members, seed)
    if not networks:
        return None
    try:
        _, _, found = align_networks(networks)
    except EnsdiagError:
        return None
    (raw, raw_layers), (after, after_layers) = found["raw"], found["aligned"]
    return {"raw": M.mean_off_diagonal(raw), "aligned": M.mean_off_diagonal(after), "members": ensemble.num_members,
            "layers": {layer: {"raw": M.mean_off_diagonal(raw_layers[layer]),
                               "aligned": M.mean_off_diagonal(after_layers[layer])} for layer in raw_layers}}
