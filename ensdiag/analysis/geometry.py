"""Member geometry: where members agree and differ (model analyzers, `needs="model"`).

- `cka`: linear and debiased CKA between every pair of members, per layer, on ID and OOD data;
- `alignment`: weight cosine before and after permutation alignment (members that own their weights);
- `paths`: loss and accuracy on the straight line between members, and its barrier;
- `rank-structure`: the rank of W_i ⊘ W_j per layer (1 for BatchEnsemble).

They read the model through a `ModelProbe`:

    probe = ModelProbe(ensemble, {"id": test_split, "ood": ood_split}, normalize, train_images=images)
    analyze_model(probe)["cka"]["splits"]["id"]["layers"]["hidden.0"]["linear"]["value"]   # k×k

Nothing here depends on a user-visible seed: the training sample, the alignment's restarts and the
null baseline draw from fixed seeds (`paths.GEOMETRY_SEED`, align.restart), so `train`, `diversity` and
`diagnose()` give the same numbers for the same weights and data.
"""

from dataclasses import dataclass, field

import torch

from ..data.registry import Split
from ..ensembles import as_ensemble
from ..errors import EnsdiagError, Skip
from ..geometry.align import RESTARTS, align_networks, permute_state, restart
from ..geometry.baselines import aligned_null
from ..geometry.least import describe, least_over_restarts, rule_for
from ..geometry.paths import GEOMETRY_SEED, barriers_of, bounded_walk, describe_points, excess, path, seeded_sample
from ..geometry.rank import TOLERANCE_RULE, rank_structure as structure, rounding
from ..geometry.representations import layer_cka
from ..geometry.resampled import CKA_INTERVAL_EXAMPLES, cka_interval, least_barrier_interval
from ..layout import metric
from ..stats import metrics as M
from .registry import Column, register_analyzer

PATH_POINTS = 11  # t = 0, 0.1, …, 1
PATH_PAIRS = 3  # member 0 with members 1..3
PATH_EXAMPLES = 5000  # test images each point of a path is evaluated on (at most)
BATCHNORM_EXAMPLES = 2000  # training images BatchNorm statistics are recomputed on, at every point
MAX_MEMBERS = 64  # every pair is compared (k×k matrices per layer, k − 1 alignments): beyond this, skipped
CKA_REPRESENTATION = ("each representation point's output (linear layers before their activation; convolutional "
                      "feature maps averaged over positions), features centred over the examples")


@dataclass
class ModelProbe:
    """An ensemble (anything `ensembles.as_ensemble` takes) with the data model analyzers read:
    `splits` maps "id" (labelled test images) and "ood" to `Split`s; `train_images` (or None) are
    for BatchNorm statistics and, with `train_labels`, for the training loss along paths
    (`train_source` says which examples they are, e.g. the training split without its validation
    examples); `max_examples` caps the images per split."""

    ensemble: object
    splits: dict
    normalize: object
    train_images: torch.Tensor | None = None
    max_examples: int | None = None
    train_labels: torch.Tensor | None = None
    path_pairs: int = PATH_PAIRS
    path_points: int | str = PATH_POINTS  # or "adaptive" (geometry/paths.py)
    limits: dict = field(default_factory=dict)  # a budget's examples per step: "cka", "paths", "batchnorm" (planning.py)
    enough: object = None  # a budget's precision target for paths: enough(per-example curves) -> bool
    train_source: str | None = None
    detail: bool = False  # also the example-level intervals of the geometry table (CKA, barriers): on request
    _cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        self.ensemble = as_ensemble(self.ensemble)

    def split(self, name, limit=None):
        split = self.splits.get(name)
        if split is None or len(split) == 0:
            return None
        limit = min(x for x in (limit, self.max_examples, len(split)) if x is not None)
        return split.subset(slice(0, limit)) if limit < len(split) else split

    def _training_pick(self):
        return seeded_sample(len(self.train_images), self.limits.get("batchnorm", BATCHNORM_EXAMPLES))

    def batchnorm_images(self):
        """A seeded sample of `BATCHNORM_EXAMPLES` training images (the split may be sorted by class), or None."""
        if self.train_images is None or len(self.train_images) == 0:
            return None
        return self.train_images[self._training_pick()]

    def training_sample(self):
        """The same fixed sample with its labels, as a `Split` (for the training loss along paths), or None."""
        if self.train_images is None or self.train_labels is None or len(self.train_images) == 0:
            return None
        pick = self._training_pick()
        return Split(self.train_images[pick], self.train_labels[pick],
                     f"{len(pick)} of {self.train_source or f'{len(self.train_images)} training examples'}")

    def members(self) -> list:
        """Every member as a plain network (one set of weights per member), or Skip."""
        ensemble = self.ensemble
        if ensemble.one_weight_set or (ensemble.num_members or 0) < 2:
            raise Skip("one set of weights shared by all members (single model / MC Dropout)")
        if ensemble.num_members > MAX_MEMBERS:
            raise Skip(f"k = {ensemble.num_members} members: member geometry compares every pair, up to {MAX_MEMBERS} members")
        if "members" not in self._cache:
            self._cache["members"] = [ensemble.member_network(i).eval() for i in range(ensemble.num_members)]
        return self._cache["members"]

    def aligned(self):
        """(groups, member states, `align_networks`' result: every member aligned to member 0 by its best
        restart, and each restart) for members that own their weights, or Skip."""
        if not self.ensemble.own_weights:
            self.members()  # the reason members cannot be compared comes first
            raise Skip(f"{self.ensemble.method} members share weights, so their units are already in one order")
        if "aligned" not in self._cache:
            networks = self.members()
            try:
                self._cache["aligned"] = align_networks(networks)
            except EnsdiagError as error:  # no permutation rule, or non-finite weights
                raise Skip(str(error)) from None
        return self._cache["aligned"]


@register_analyzer("cka", needs="model", detail=True,
                   description="linear and debiased CKA between members' representations, per layer",
                   version=2,  # 2: the example-level interval of each split's mean
                   columns=[Column(f"CKA ({split})", ("splits", split, "mean", "value"), None,
                                   f"linear CKA between members on {split}, mean off-diagonal, averaged over layers",
                                   ("geometry",), 30 + index, split) for index, split in enumerate(("id", "ood"))])
def cka(probe):
    networks = probe.members()
    splits = {}
    for name in ("id", "ood"):
        split = probe.split(name, limit=probe.limits.get("cka"))
        if split is None:
            continue
        found = layer_cka(networks, split.images, probe.normalize, retain=CKA_INTERVAL_EXAMPLES if probe.detail else 0)
        layers = {}
        for layer, entry in found["layers"].items():
            layers[layer] = {"linear": metric(entry["linear"].tolist(), "linear CKA, k×k"),
                             "debiased": metric(entry["debiased"].tolist(), "debiased CKA (unbiased HSIC), k×k"),
                             "mean_linear": metric(M.mean_off_diagonal(entry["linear"]), "mean off-diagonal linear CKA"),
                             "mean_debiased": metric(M.mean_off_diagonal(entry["debiased"]), "mean off-diagonal debiased CKA"),
                             "features": entry["features"]}
        means = [entry["mean_linear"]["value"] for entry in layers.values() if entry["mean_linear"]["value"] is not None]
        mean = sum(means) / len(means) if means else None
        interval = cka_interval(found["kept"], len(split), name, mean) if probe.detail and means and found["kept"] else None
        splits[name] = {"n": len(split), "layers": layers, "skipped_layers": found["skipped"],
                        "mean": metric(mean, "mean over layers of the mean off-diagonal linear CKA",
                                       **({"interval": interval} if interval else {}))}
    if not splits:
        raise Skip("no in-distribution or OOD images to read representations on")
    return {"splits": splits, "representation": CKA_REPRESENTATION}


NULL_ALIGNED = ("the same k, architecture and weight matching applied to independently initialised, untrained "
                "members: matching maximises the inner product, so random members already reach this aligned cosine")


@register_analyzer("alignment", needs="model", version=2,  # 2: the null baseline
                   description="weight cosine of members before and after permutation alignment (weight matching)",
                   columns=[Column("weight cosine (aligned)", ("aligned", "mean", "value"), None,
                                   "mean off-diagonal cosine of members' weights after aligning each to member 0",
                                   ("diversity",), 21),
                            Column("aligned cosine, null", ("null", "aligned", "value"), None,
                                   f"aligned weight cosine of the null baseline: {NULL_ALIGNED}", ("diversity",), 21,
                                   since=2)])
def alignment(probe):
    groups, states, found = probe.aligned()
    networks, aligned = probe.members(), found["states"]
    (raw, raw_layers), (after, after_layers) = found["raw"], found["aligned"]
    split = probe.split("id", limit=256)
    change = None
    if split is not None:  # the functions must not move: the aligned members' outputs, measured
        scratch = probe.ensemble.member_network(0).eval()
        x = probe.normalize(split.images.to(next(scratch.parameters()).device))
        with torch.no_grad():
            change = 0.0
            for network, state in zip(networks[1:], aligned[1:]):
                scratch.load_state_dict(state)
                change = max(change, (scratch(x) - network(x)).abs().max().item())
    null = aligned_null(probe.ensemble, GEOMETRY_SEED) or {"raw": None, "aligned": None, "members": None, "layers": {}}
    return {"raw": {"matrix": metric(raw.tolist(), "cosine of members' weights as trained"),
                    "mean": metric(M.mean_off_diagonal(raw), "mean off-diagonal cosine, as trained")},
            "aligned": {"matrix": metric(after.tolist(), "cosine after aligning every member to member 0"),
                        "mean": metric(M.mean_off_diagonal(after), "mean off-diagonal cosine, aligned")},
            "layers": {layer: {"raw": M.mean_off_diagonal(raw_layers[layer]),
                                                      "aligned": M.mean_off_diagonal(after_layers[layer]),
                                                      "null_aligned": null["layers"].get(layer, {}).get("aligned")}
                       for layer in raw_layers},
            "null": {"raw": metric(null["raw"], "mean off-diagonal cosine of independently initialised, untrained "
                                               "members as built"),
                     "aligned": metric(null["aligned"], NULL_ALIGNED), "members": null["members"]},
            "groups": len(groups), "restarts": RESTARTS,
            "max_output_change": metric(change, "largest |logit change| of an aligned member on up to 256 test images "
                                                "(0 up to float rounding: alignment keeps every function)")}


BARRIERS = ("loss_barrier", "accuracy_barrier", "train_loss_barrier")
LEAST = ("per pair the least over weight matching's restarts, restarted until the least stopped falling (a stated "
         "rule, `restarts.rule`; the longer search with --detail, whose interval resamples the restarts), then the "
         "mean over pairs")


@register_analyzer("paths", needs="model", detail=True, version=4,  # 2: least over restarts; 3: intervals; 4: restarts by a stop rule
                   description="loss and accuracy on the straight line between members' weights",
                   columns=[Column("test-loss barrier", ("loss_barrier", "value"), "down",
                                   f"largest rise of the test loss above the line between two members ({LEAST}); 0 can "
                                   "mean averaged weights temper over-confident logits, not connectivity",
                                   ("geometry",), 40, "id"),
                            Column("test-loss barrier, worst restart", ("loss_barrier_max", "value"), None,
                                   "the same with the largest barrier over weight matching's restarts (mean over "
                                   "pairs; a path walked only part of the way counts with its barrier over the "
                                   "points evaluated, a lower bound): beside the least, how much the barrier depends on the "
                                   "alignment's local optimum", ("geometry",), 40, "id", since=2),
                            Column("error barrier", ("accuracy_barrier", "value"), "down",
                                   f"largest rise of the test error above the line between two members ({LEAST}; "
                                   "Frankle et al.)", ("geometry",), 41, "id"),
                            Column("train-loss barrier", ("train_loss_barrier", "value"), "down",
                                   "largest rise of the training loss, on a fixed sample of training examples (never "
                                   "validation ones where the model file says which they were), above the line "
                                   f"between two members ({LEAST}; Ainsworth et al.)", ("geometry",), 42, "id"),
                            Column("alignment restarts", ("restarts", "mean"), None,
                                   "weight matching's restarts per pair until the least barrier stopped falling "
                                   "(mean over pairs)", ("geometry",), 43, examples=False, since=4)])
def paths(probe):
    networks = probe.members()
    test = probe.split("id", limit=probe.limits.get("paths", PATH_EXAMPLES))
    if test is None or test.labels is None:
        raise Skip("needs labelled in-distribution test images")
    has_norm = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in networks[0].modules())
    train = probe.batchnorm_images()
    if has_norm and (train is None or len(train) < 2):
        raise Skip("the network has BatchNorm, whose statistics along a path need training images (two or more; none loaded)")
    try:
        aligned = probe.aligned()
        rule = rule_for(probe.detail).capped(probe.limits.get("restarts"))  # a budget may cap it
        how = "aligned to member 0 by weight matching, restarted (`restarts`)"
    except Skip:
        aligned, rule = None, None
        how = "as trained (members share weights or have no permutation rule)"
    walker = _Walker(probe, networks, test, train if has_norm else None, probe.training_sample())
    keys = [key for key in BARRIERS if key != "train_loss_barrier" or walker.sample is not None]
    pairs, kept = [], []
    for j in range(1, min(len(networks), probe.path_pairs + 1)):
        evaluate = lambda end, least: walker.evaluate(end, least, keys)  # noqa: E731
        search = least_over_restarts(walker.alignments(aligned, j), evaluate, keys,
                                     **(rule._asdict() if rule else {"limit": 1, "minimum": 1}))
        found = search["alignments"]
        lowest = min((entry for entry in found if entry["complete"]), key=lambda entry: entry["barriers"]["loss_barrier"])
        kept.append({key: [(_rows(entry, key), len(entry["seeds"])) for entry in found] for key in keys} if probe.detail
                    else None)
        curve = {key: value for key, value in lowest["curve"].items() if key not in ("examples", "points", "n")}
        pairs.append({"members": [0, j], **curve, **search["least"],
                      **{f"{key}_max": max(entry["barriers"][key] for entry in found) for key in keys},
                      "restarts": [{"seeds": entry["seeds"], "complete": entry["complete"],
                                    "points": len(entry["curve"]["t"]), **entry["barriers"]} for entry in found],
                      "restarts_run": search["run"], "stopped": search["stopped"],
                      "points_evaluated": sum(len(entry["curve"]["t"]) - 2 * (index > 0) for index, entry in enumerate(found))})
    # each pair's alignments' per-example excess (`_rows`), the restarts resampled with the examples
    intervals = {key: {"interval": least_barrier_interval([pair[key] for pair in kept],
                                                          "train" if key.startswith("train") else "id")}
                 for key in keys} if probe.detail else {}
    mean = lambda key: sum(pair[key] for pair in pairs) / len(pairs) if key in pairs[0] else None  # noqa: E731
    batchnorm = (f"BatchNorm statistics recomputed on {len(train)} training images at every point" if has_norm
                 else "no BatchNorm in the network")
    least = "least over the alignment's restarts per pair (`restarts`), then the mean over pairs"
    runs = [pair["restarts_run"] for pair in pairs]
    return {"pairs": pairs, "ends": how, "points": describe_points(probe.path_points), "batchnorm": batchnorm, "n": len(walker.test),
            "restarts": {"rule": describe(rule) if rule else "one path per pair (no alignment)", "per_pair": runs,
                         "mean": sum(runs) / len(runs), "limit": rule.limit if rule else 1,
                         "minimum": rule.minimum if rule else 1, "patience": rule.patience if rule else None},
            "train_n": len(walker.sample) if walker.sample is not None else 0,
            "train_examples": walker.sample.source if walker.sample is not None else None,
            "loss_barrier": metric(mean("loss_barrier"), f"max_t L(θ(t)) − ((1−t)L(θ_0) + tL(θ_1)) on the test set, {least}; "
                                   "can be 0 without connectivity (averaging tempers over-confident logits)",
                                   **intervals.get("loss_barrier", {})),
            "accuracy_barrier": metric(mean("accuracy_barrier"), "error barrier: max_t of test accuracy below the line "
                                       f"between the ends (= test error above it), {least}",
                                       **intervals.get("accuracy_barrier", {})),
            "train_loss_barrier": metric(mean("train_loss_barrier"), "max_t of the training loss above the line between "
                                         f"the ends, on a fixed training sample, {least} (null without training labels)",
                                         **intervals.get("train_loss_barrier", {})),
            **{f"{key}_max": metric(mean(f"{key}_max"), f"as {key}, with the largest over the restarts per pair (a path "
                                    "walked only part of the way counts with its barrier over the points evaluated, a "
                                    "lower bound)") for key in BARRIERS}}


class _Walker:
    """The paths of one probe from member 0, on the same test examples (the first walk may read
    fewer, a precision target) and with the same ends for every alignment of a pair."""

    def __init__(self, probe, networks, test, batchnorm, sample):
        self.probe, self.test, self.batchnorm, self.sample = probe, test, batchnorm, sample
        self.states = [{key: value.detach() for key, value in network.state_dict().items()} for network in networks]
        self.scratch = probe.ensemble.member_network(0)
        self.ends = None  # the first whole walk's ends (that walk alone may stop early: a precision target)

    def alignments(self, aligned, j):
        """`alignment_of(seed)` for member j: (the permutations' key, member j aligned by restart `seed`)."""
        if aligned is None:
            return lambda seed: (None, self.states[j])
        groups, _, found = aligned
        known = {seed: entry["perms"] for entry in found["restarts"][j] for seed in entry["seeds"]}

        def alignment_of(seed):
            perms = known[seed] if seed in known else restart(self.states[0], self.states[j], groups, seed)
            return (tuple(perms[group].numpy().tobytes() for group in groups),
                    permute_state(self.states[j], groups, perms))
        return alignment_of

    def evaluate(self, end, least, keys):
        """(curve, barriers, complete): the whole path to `end` (least None), else walked until none of
        its barriers can fall below `least`."""
        probe = self.probe
        if least is None:
            curve = path(self.scratch, self.states[0], end, self.test, probe.normalize, self.batchnorm, probe.path_points,
                         self.sample, enough=probe.enough if self.ends is None else None)
            self.test = self.test.subset(slice(0, curve["n"]))  # a precision target stopped the first walk: the rest read as many
            self.ends = {t: curve["points"][t] for t in (curve["t"][0], curve["t"][-1])}
            return curve, barriers_of(curve), True
        curve, complete = bounded_walk(self.scratch, self.states[0], end, self.ends, self.test, probe.normalize,
                                       self.batchnorm, probe.path_points, self.sample,
                                       stop=lambda found: all(found[key] >= least[key] for key in keys))
        return curve, barriers_of(curve), complete


_VALUES = {"loss_barrier": ("loss", True), "accuracy_barrier": ("accuracy", False), "train_loss_barrier": ("train_loss", True)}


def _rows(entry, key):
    """An alignment's per-example excess at its interior points, [points − 2, n] (the ends' is 0)."""
    values, worse = _VALUES[key]
    return excess(entry["curve"]["t"], entry["curve"]["examples"][values], worse)[1:-1]


@register_analyzer("rank-structure", needs="model", reads_data=False, version=2,  # 2: a tolerance from float rounding
                   description="rank of W_i ⊘ W_j per layer (1 for BatchEnsemble members)",
                   columns=[Column("rank-1 layers", ("rank_one", "value"), None,
                                   "fraction of weight layers whose member-weight ratio W_i ⊘ W_0 has rank 1",
                                   ("geometry",), 50)])
def rank_structure(probe):
    weights = probe.ensemble.member_weights()
    if len(weights) < 2:
        raise Skip("one set of weights shared by all members (single model / MC Dropout)")
    found = structure(weights)
    telling = [entry for entry in found["layers"].values() if entry["rank"] is not None and entry["max_rank"] >= 2]
    rank_one = sum(entry["rank"] == 1 for entry in telling) / len(telling) if telling else None
    kernels = [entry for entry in telling if "kernel_rank" in entry]
    if rank_one is None:
        summary = "no layer whose ratio could have rank 2 or more: nothing to tell"
    elif rank_one == 1:
        summary = "rank 1 in every layer: members are one weight set rescaled by rank-1 factors"
    elif kernels and all(e["kernel_rank"] == 1 for e in kernels) and all(e["rank"] == 1 or "kernel_rank" in e for e in telling):
        summary = "rank 1 per kernel in every convolution: kernel-wise rank-1 factors"
    else:
        summary = "higher rank: members are not rank-1 rescalings of one weight set"
    by_construction = probe.ensemble.rank_one_by_construction
    if by_construction and rank_one is not None:
        summary += (" (true by construction for this method: a check of the rebuilt members, "
                    "not evidence about their diversity)")
    dtype = next((tensor.dtype for tensor in weights[0].values() if tensor.is_floating_point()), torch.float32)
    return {**found, "tolerance": rounding(dtype), "tolerance_rule": TOLERANCE_RULE, "summary": summary,
            "construction_check": by_construction,
            "rank_one": metric(rank_one, "fraction of weight layers whose ratio W_i ⊘ W_0 has rank 1 (singular values above "
                                         "what float rounding can add counted, `tolerance_rule`; layers whose ratio has one row or column tell nothing and are left out)")}
