"""Permutation alignment of independent members by weight matching (Ainsworth et al. 2023).

Two networks that compute the same function can list their hidden units in different orders,
so the cosine of their flattened weights can be near 0 while they are one solution. Weight
matching finds, for every group of permutable units (`permutation_groups()` of the
architecture: hidden layers of the MLP; ResNet-18's block-internal channels and each stage's
residual stream, BatchNorm included), the permutation of member b's units that maximises
Σ ⟨W_a, P W_b⟩ over every tensor the group touches, one group at a time with the others
fixed (a linear assignment problem, solved by SciPy), until no group improves.

Each start ends in a local optimum of its own: restarts reach nearly the same aligned cosine
(±0.003) but can give very different loss barriers along the path between the members (on a
digits pair, 0.12 to 0.59 over 64 restarts). Restart `s` (`restart`) visits the groups in its
own seeded orders, starting from member b as it is (the authors' start) for the first `RESTARTS`
seeds — the aligned cosine reads the one of highest matching objective among them — and from a
seeded random permutation of every group after them, which reaches other optima; the paths
restart until their least barrier stops falling (geometry/least.py). Every seed is fixed, so
every way in (`train`, `diversity`, `diagnose()`) aligns the same weights the same way.

    groups = permutation_groups(network)                 # from the architecture
    perms = weight_matching(state_a, state_b, groups)    # {group: index tensor}
    aligned = permute_state(state_b, groups, perms)      # member b, same function, a's unit order
    perms = restart(state_a, state_b, groups, seed=5)    # restart 5: from a seeded random permutation
    found = restarts(state_a, state_b, groups)           # [{"seeds", "objective", "perms"}], best first
    groups, states, found = align_networks(networks)     # every member aligned; raw and aligned weight cosine
"""

import torch

from ..errors import EnsdiagError
from ..nn.layers import function_parameters
from ..stats.metrics import weight_cosine

RESTARTS = 3  # the aligned cosine: the best of this many restarts (seeds 0..RESTARTS−1)
START_SEEDS = 10_000  # restart s ≥ RESTARTS draws its starting permutations from seed START_SEEDS + s, its group orders from s


def permutation_groups(network) -> dict[str, list[tuple[str, int]]]:
    """{group: [(state-dict key, axis)]} for a plain network (`member_network(i)`), from the
    architecture's `permutation_groups()`; every float tensor of an "out" module is permuted
    along its first axis (weights, biases, BatchNorm's affine and running statistics), a
    weight of an "in" module along its second."""
    body = network.body
    if not hasattr(body, "permutation_groups"):
        raise EnsdiagError(f"no permutation rule for the {network.spec.arch} architecture: alignment needs one")
    modules = dict(body.named_modules())
    groups = {}
    for group, entries in body.permutation_groups().items():
        keys = []
        for module_name, side in entries:
            module = modules[module_name]
            for key, tensor in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
                if not tensor.is_floating_point() or tensor.dim() == 0:
                    continue  # BatchNorm's step count
                if side == "out":
                    keys.append((f"body.{module_name}.{key}", 0))
                elif key == "weight":
                    keys.append((f"body.{module_name}.{key}", 1))
        groups[group] = keys
    return groups


def _size(state, keys) -> int:
    key, axis = keys[0]
    return state[key].shape[axis]


def permute_state(state: dict, groups: dict, perms: dict) -> dict:
    """The state with every group's permutation applied (new tensors; untouched keys shared)."""
    permuted = dict(state)
    for group, keys in groups.items():
        for key, axis in keys:
            permuted[key] = permuted[key].index_select(axis, perms[group].to(permuted[key].device))
    return permuted


def weight_matching(reference: dict, other: dict, groups: dict, max_rounds: int = 100, seed: int = 0,
                    start: dict | None = None) -> dict:
    """{group: perm} such that `permute_state(other, groups, perms)` best matches `reference`.

    Groups are visited in a seeded random order each round (as the authors do), from the
    permutations `start` (default: the identity); the loop ends when a round improves no group's
    objective (each step can only increase it)."""
    from scipy.optimize import linear_sum_assignment  # (scipy's import is slow: only where members are matched)
    axes_of = {}  # key -> {axis: group}
    for group, keys in groups.items():
        for key, axis in keys:
            axes_of.setdefault(key, {})[axis] = group
    perms = {group: (start[group].clone() if start is not None else torch.arange(_size(reference, keys)))
             for group, keys in groups.items()}
    generator = torch.Generator().manual_seed(seed)
    names = list(groups)
    terms = {}  # group -> [(reference's tensor with the group's axis first, flat; other's alike; its other groups' axes)]
    for group, keys in groups.items():
        terms[group] = []
        for key, axis in keys:
            if key.endswith(("running_mean", "running_var")):
                continue  # permuted with their channels, but only weights are matched (as the authors do)
            mine = reference[key].detach().double().cpu().movedim(axis, 0)
            theirs = other[key].detach().double().cpu().movedim(axis, 0)
            others = [(other_axis + (other_axis < axis), other_group) for other_axis, other_group in axes_of[key].items()
                      if other_group != group]
            terms[group].append((mine.reshape(len(mine), -1), theirs, others))
    for _ in range(max_rounds):
        improved = False
        for index in torch.randperm(len(names), generator=generator).tolist():
            group = names[index]
            size = len(perms[group])
            score = torch.zeros(size, size, dtype=torch.float64)
            for mine, theirs, others in terms[group]:
                for other_axis, other_group in others:
                    theirs = theirs.index_select(other_axis, perms[other_group])
                score += mine @ theirs.reshape(size, -1).T
            _, columns = linear_sum_assignment(score.numpy(), maximize=True)
            new = torch.as_tensor(columns, dtype=torch.long)
            old_value, new_value = score[torch.arange(size), perms[group]].sum(), score[torch.arange(size), new].sum()
            if new_value > old_value + 1e-12 * max(1.0, abs(float(old_value))):
                perms[group], improved = new, True
        if not improved:
            break
    return perms


def matching_objective(reference: dict, other: dict, groups: dict) -> float:
    """Σ ⟨W_a, W_b⟩ over every weight a permutation group touches: what weight matching maximises."""
    keys = {key for entries in groups.values() for key, _ in entries if not key.endswith(("running_mean", "running_var"))}
    return float(sum((reference[key].detach().double().cpu() * other[key].detach().double().cpu()).sum() for key in keys))


def restart(reference: dict, other: dict, groups: dict, seed: int) -> dict:
    """Restart `seed` of weight matching: {group: perm}. Seeds below `RESTARTS` (those the aligned
    cosine reads) start from `other` as it is, any other seed from a random permutation of every
    group drawn from seed `START_SEEDS + seed`; each visits the groups in orders drawn from its own seed."""
    start = None
    if seed >= RESTARTS:
        generator = torch.Generator().manual_seed(START_SEEDS + seed)
        start = {group: torch.randperm(_size(reference, keys), generator=generator) for group, keys in groups.items()}
    return weight_matching(reference, other, groups, seed=seed, start=start)


def restarts(reference: dict, other: dict, groups: dict, count: int = RESTARTS) -> list[dict]:
    """The distinct permutations of restarts 0..count−1 (`restart`): [{"seeds": [the seeds that
    reached it], "objective", "perms"}], highest objective first (ties: the smallest seed first)."""
    found = []
    for seed in range(count):
        perms = restart(reference, other, groups, seed)
        same = next((entry for entry in found if entry["perms"].keys() == perms.keys()
                     and all(torch.equal(entry["perms"][group], perms[group]) for group in perms)), None)
        if same is not None:
            same["seeds"].append(seed)
            continue
        found.append({"seeds": [seed], "objective": matching_objective(reference, permute_state(other, groups, perms), groups),
                      "perms": perms})
    return sorted(found, key=lambda entry: (-entry["objective"], entry["seeds"][0]))


def align_networks(networks: list) -> tuple[dict, list[dict], dict]:
    """(groups, member states, found) of plain networks, every member aligned to the first: the one computation
    the alignment analyzer, its null baseline, the paths and training's tracking share. found: {"raw": (k×k
    weight cosine, {layer: k×k}) as given, "aligned": the same after alignment, "states": the aligned states
    (each member by its restart of highest objective), "restarts": {member j: restarts(states[0], states[j])}};
    an EnsdiagError where the architecture has no permutation rule or a weight is not finite."""
    groups = permutation_groups(networks[0])
    states = [{key: value.detach() for key, value in network.state_dict().items()} for network in networks]
    if not all(torch.isfinite(value).all() for state in states for value in state.values() if value.is_floating_point()):
        raise EnsdiagError("non-finite weights: no permutation matches them")
    keys = function_parameters(networks[0].body)  # what weight cosine compares, as the weight-similarity analyzer does
    found = {j: restarts(states[0], states[j], groups) for j in range(1, len(states))}
    aligned = [states[0]] + [permute_state(states[j], groups, found[j][0]["perms"]) for j in range(1, len(states))]
    cosine = lambda members: weight_cosine([{key: state[f"body.{key}"] for key in keys} for state in members])  # noqa: E731
    return groups, states, {"raw": cosine(states), "aligned": cosine(aligned), "states": aligned, "restarts": found}
