"""A benchmark group's numbers as lm-evaluation-harness aggregates them, with intervals that
resample the questions within each subtask.

    tree = group_tree(results, "mmlu")                      # {group: its leaf subtasks}
    weights = group_weighting(selections, tree, "acc", "none")
    section = aggregates(per_question, subtask_of, sizes, tree, weights, definitions)

lm-eval 0.4.13 (lm_eval/api/group.py `Group.aggregate`, api/metrics.py
`aggregate_subtask_metrics`) gives a group the mean of its *leaf* subtasks' values (a subgroup's
own value is not used: MMLU's 57 subjects, not its 4 categories), each weighted by its number of
questions (`weight_by_size: true`, the default of `aggregate_metric_list`) or equally (false):

    group = Σ_s w_s m_s / Σ_s w_s,   w_s = n_s or 1.

Which weighting a group used is not in results_*.json (the group's YAML is not logged); its
result is, for each member. `group_weighting` compares that number with both weightings of the
member's own subtask numbers, computed as lm-eval computes them, and takes the one that equals
it for every member. A group without a logged number for the metric (no aggregate_metric_list
entry for it) is weighted by size, which is the pooled questions' value, and says so.

Every ensemble number (accuracy of p̄, NLL, Brier, JSD, disagreement, the members' accuracies;
for generated answers the vote's and the oracle's accuracy, disagreement, double fault) is a
mean over questions, so it aggregates the same way; ECE, a sum of bin gaps, is no mean over
questions and is not aggregated (the pooled table has it). Intervals: each subtask's questions
resampled with replacement (its own generator, seeded by its name and size), the group's value
recomputed from the resampled subtask means: a stratified bootstrap, as lm-eval's group stderr
treats the subtasks as independent samples. Torch only; no file is read here.
"""

import math
import zlib
from itertools import accumulate, groupby

import torch

from ..stats import bootstrap as B
from ..stats import constructions as CI
from ..stats.examples import Examples
from ..layout import metric
from ..budget import require
from ..errors import EnsdiagError
from . import lm_eval_files as files

TOLERANCE = 1e-9  # |ours − lm-eval's| below which a logged group number is the weighting's


def group_tree(results: dict, task: str) -> dict[str, list[str]]:
    """{group: its leaf subtasks, in lm-eval's order} for `task` and every group below it; {} for
    a task that is no group."""
    tree, pending = {}, [task]
    while pending:
        name = pending.pop(0)
        leaves = files.group_subtasks(results, name)
        if leaves is None or name in tree:
            continue
        tree[name] = leaves
        named = results.get("group_subtasks", {}).get(name, [])
        pending += [child for child in named if isinstance(child, str)]
    return tree


def group_weighting(selections, tree: dict, metric_name: str, filter_name: str) -> dict[str, dict]:
    """{group: {"by_size": bool, "why": str, "lm_eval": [each member's logged group value or None]}}."""
    found = {}
    for group, leaves in tree.items():
        logged, matches = [], []
        for selection in selections:
            value = files.logged_metric(selection.results, group, metric_name, filter_name)
            logged.append(value)
            subtask = [files.logged_metric(selection.results, leaf, metric_name, filter_name) for leaf in leaves]
            sizes = [_sample_len(selection.results, leaf) for leaf in leaves]
            if value is None or None in subtask or None in sizes:
                continue
            means, sizes = torch.tensor(subtask, dtype=torch.float64)[:, None], torch.tensor(sizes)
            matches.append({by_size for by_size in (True, False)
                            if abs(float(aggregate(means, sizes, by_size)) - value) <= TOLERANCE * max(1.0, abs(value))})
        metric_key = f"{metric_name},{filter_name}"
        if not matches:
            found[group] = {"by_size": True, "lm_eval": logged,
                            "why": f"lm-eval logs no {metric_key} for the group: weighted by size (the pooled questions)"}
            continue
        common = set.intersection(*matches)
        if not common:
            raise EnsdiagError(f"group {group!r}: lm-eval's {metric_key} of the members is neither the size-weighted nor "
                               "the unweighted mean of their subtasks' for every member (groups configured differently?)")
        by_size = True in common
        why = ("as lm-eval's " + metric_key + (": weighted by size" if by_size else ": unweighted (weight_by_size: false)")
               if len(common) == 1 else f"as lm-eval's {metric_key} (both weightings give its numbers): weighted by size")
        found[group] = {"by_size": by_size, "lm_eval": logged, "why": why}
    return found


def _sample_len(results: dict, task: str):
    entry = results.get("results", {}).get(task) if isinstance(results.get("results"), dict) else None
    value = entry.get("sample_len") if isinstance(entry, dict) else None
    return value if type(value) is int and value > 0 else None


def aggregate(means: torch.Tensor, sizes: torch.Tensor, by_size: bool) -> torch.Tensor:
    """Σ_s w_s m_s / Σ_s w_s over the last-but-one axis ([..., S, Q] → [..., Q])."""
    weights = sizes.double() if by_size else torch.ones(len(sizes), dtype=torch.float64)
    return (means * weights[:, None]).sum(-2) / weights.sum()


def aggregates(per_question: dict, subtask_of: list, tree: dict, weighting: dict, definitions: dict) -> dict:
    """{"groups": {group: {...}}, "subtasks": {subtask: {...}}}: each quantity of `per_question`
    ({name: [N] or [N, k] values}) as a metric with its stratified interval; a group's from its
    leaves' means, weighted as `weighting` says."""
    columns = [values.double().reshape(values.shape[0], -1) for values in per_question.values()]
    layout = [(name, values.shape[1]) for name, values in zip(per_question, columns)]
    require(B.RESAMPLES * len(subtask_of) * sum(width for _, width in layout) * 8,
            f"the intervals of {len(subtask_of):,} subtasks' numbers")
    joined = torch.cat(columns, 1)  # [N, Q]: each subtask's means [S, Q] and resampled means [R, S, Q], each
    means = torch.stack([joined[start:stop].mean(0) for _, start, stop in subtask_of])  # resampled on its own
    resampled = torch.empty(B.RESAMPLES, len(subtask_of), joined.shape[1], dtype=torch.float64)
    for at, (name, start, stop) in enumerate(subtask_of):
        values = joined[start:stop].double()
        seed = zlib.crc32(f"lm-eval subtask/{name}/{stop - start}".encode())  # each subtask its own stream
        for done, rows in B.blocks(name, stop - start, B.RESAMPLES, seed):
            resampled[done:done + len(rows), at] = B.counts_of(rows, stop - start) @ values / (stop - start)
    index = {name: i for i, (name, _, _) in enumerate(subtask_of)}
    sizes = torch.tensor([stop - start for _, start, stop in subtask_of])

    starts = accumulate((width for _, width in layout), initial=0)  # each quantity's first column
    single = torch.tensor([at for at, (_, width) in zip(starts, layout) if width == 1], dtype=torch.long)

    def entries(value, values, n, strata):
        out, at, intervals = {}, 0, iter(CI.percentile_columns(value[single], values[:, single], n, strata))
        for name, width in layout:
            if width == 1:
                out[name] = metric(float(value[at]), definitions[name], interval=next(intervals))
            else:  # one per member: the values, no interval (the members' own numbers)
                out[name] = metric(value[at:at + width].tolist(), definitions[name])
            at += width
        return out

    subtasks = {name: {"n": int(sizes[i]), **entries(means[i], resampled[:, i], int(sizes[i]), None)}
                for i, (name, _, _) in enumerate(subtask_of)}
    groups = {}
    for group, leaves in tree.items():
        rows = torch.tensor([index[leaf] for leaf in leaves])
        by_size = weighting[group]["by_size"]
        value = aggregate(means[rows], sizes[rows], by_size)
        values = aggregate(resampled[:, rows], sizes[rows], by_size)
        strata = {leaf: int(sizes[index[leaf]]) for leaf in leaves}
        groups[group] = {"leaves": leaves, "n": int(sizes[rows].sum()), **weighting[group],
                         **entries(value, values, int(sizes[rows].sum()), strata)}
    return {"groups": groups, "subtasks": subtasks}


def positions(order) -> list:
    """[(subtask, start, stop)] of questions ordered by subtask (lm_eval.py's order)."""
    found, stop = [], 0
    for subtask, run in groupby(subtask for subtask, _ in order):
        start, stop = stop, stop + sum(1 for _ in run)
        found.append((subtask, start, stop))
    return found


def choice_quantities(logits: torch.Tensor, labels: torch.Tensor) -> dict:
    """Per question [N] (members' accuracies [N, k]) of multiple-choice logits [k, N, C]: the
    numbers a group aggregates (stats/metrics.py's definitions, question by question)."""
    examples = Examples(logits, labels)
    several = examples.members > 1
    return {"accuracy": (examples.predicted == labels).double(), "nll": examples.nll, "brier": examples.brier,
            "jsd": examples.jsd if several else torch.full((examples.size,), math.nan),
            "disagreement": examples.pair_disagreement if several else torch.full((examples.size,), math.nan),
            "member_accuracy": 1 - examples.member_errors.T}


CHOICE_DEFINITIONS = {
    "accuracy": "accuracy of argmax p̄", "nll": "−log p̄(y|x)", "brier": "Σ_c (p̄_c − 1[y=c])²",
    "jsd": "H(p̄) − mean_i H(p_i)", "disagreement": "fraction of member pairs whose answers differ",
    "member_accuracy": "each member's accuracy (lm-eval's acc of the score read)"}
