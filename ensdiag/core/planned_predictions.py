"""A budget's predictions: each split read in a seeded random order and in doubling chunks, until
the precision target is met or the split's share of the budget is spent (planning.py).

The test split's first chunk is the pilot: it times the ensemble and the analyzers per example
(`_analysis_cost`), and a budget that cannot hold `MIN_PER_SPLIT` examples of every split is
refused then, before it is spent, saying what it would take.
"""

import math
import time
from itertools import chain

import torch

from ..analysis import all_analyzers, analyze_predictions
from ..stats.bootstrap import family, seed_of
from ..stats.constructions import half_width
from ..checks import check_predictions
from ..data.given import batches
from ..data.registry import Split
from ..errors import EnsdiagError
from ..layout import lookup
from ..predictions import with_pooled_shift
from .intervals import add_intervals, targets
from .predict import GEOMETRY_SPLITS, SPLIT_ORDER, Interrupted, predict_batches

RESERVE = 0.1  # of the budget, held back for the last analyzers and what measured costs underestimate
FIRST_CHUNK = 32  # examples of the pilot (the first split's first chunk times the ensemble and the analysis) and of
# every split's first chunk, doubling after it: small, so that a short budget is not spent before any choice is made
NEED_MARGIN = 0.15  # a refusal's "give at least" holds what the pilot measured and this much of it again (pilots vary)
MIN_PER_SPLIT = 32  # examples every split reads at least: fewer say nothing (a budget that cannot afford it is refused)
CHECK_RESAMPLES = 200  # resamples of the precision checks while a split is read (the stored intervals use 1,000)
PREDICTION_SHARE = 0.5  # of the budget, for predictions, when member geometry follows


def random_order(name: str, size: int) -> torch.Tensor:
    """The order a split's examples are read in under a budget: seeded by the split and its size
    (the same examples for every method measured on that split)."""
    return torch.randperm(size, generator=torch.Generator().manual_seed(seed_of(name, size) + 1))


def length(data) -> int | None:
    """Examples in data given in any form `data.given` reads; None for a stream of unknown length."""
    if isinstance(data, Split) or isinstance(data, torch.Tensor):
        return len(data)
    if isinstance(data, (tuple, list)) and len(data) == 2 and all(isinstance(d, torch.Tensor) for d in data):
        return len(data[0])
    if isinstance(data, torch.utils.data.Dataset) and hasattr(data, "__len__"):
        return len(data)
    return None


def take(data, index: torch.Tensor):
    """The examples `index` of random-access data, in the same form."""
    if isinstance(data, Split):
        return data.subset(index)
    if isinstance(data, torch.Tensor):
        return data[index]
    if isinstance(data, (tuple, list)):
        return data[0][index], data[1][index]
    return torch.utils.data.Subset(data, index.tolist())


def predict_planned(plan, ensemble, splits: dict, preprocess, device, keep: int, progress=None):
    """({split: {"logits", "labels"}} on the examples the plan affords, {split: a Split of the first `keep`
    of them, for geometry}); every split's step recorded in the plan (the ensemble measured by the caller)."""
    order = sorted((name for name in splits if splits[name] is not None),
                   key=lambda s: SPLIT_ORDER.index(family(s)) if family(s) in SPLIT_ORDER else len(SPLIT_ORDER))
    plan.sizes = {name: length(splits[name]) for name in order}
    families = {}
    for name in order:
        families.setdefault(family(name), []).append(name)
    family_sizes = {group: (sum(plan.sizes[s] for s in names) if all(plan.sizes[s] is not None for s in names) else None)
                    for group, names in families.items()}
    budget, start = plan.remaining() * (PREDICTION_SHARE if plan.geometry else 1.0), plan.spent()
    plan.deadline = start + budget  # predictions and their analysis end here (seconds since the plan started)
    per_family = {}

    def share(group):  # every split reads at least `MIN_PER_SPLIT`: fewer examples would say nothing
        chosen = per_family.get(group)
        return None if chosen is None else max(MIN_PER_SPLIT, chosen // len(families[group]))

    def first_chunk(group, chunk, seconds):  # the costs per example, from the first split's first chunk
        n = chunk["logits"].shape[1]
        plan.costs["predict per example"] = seconds / max(n, 1)
        fixed, per_example = _analysis_cost(chunk)
        plan.costs["analysis per example"] = per_example
        reserve = fixed * len(order)  # the analyzers' fixed part, once per split
        plan.costs["analysis fixed"] = reserve
        _refuse_a_budget_below_the_minimum(plan, {name: plan.sizes[name] for name in order}, reserve,
                                           plan.costs["predict per example"] + per_example)
        per_family.update(examples_per_family(family_sizes, max(budget - reserve - (plan.spent() - start), 0.0),
                                                   plan.costs["predict per example"] + per_example))
        return share(group)

    found, kept = {}, {}
    for group, names in families.items():
        for name in names:
            began = time.perf_counter()
            timing = (lambda n, seconds, group=group: first_chunk(group, n, seconds)) if not per_family else None
            try:
                logits, labels, first, why = _read(plan, ensemble, name, splits[name], plan.sizes[name],
                                                   FIRST_CHUNK if timing else share(group), preprocess, device,
                                                   keep if name in GEOMETRY_SPLITS else 0, found, progress, timing)
            except KeyboardInterrupt:
                raise Interrupted(found, kept, name, order[order.index(name):]) from None
            found[name] = {"logits": logits, "labels": labels}
            if first is not None:
                kept[name] = Split(*first, f"{len(first[0])} examples of {name}")
            n, size = logits.shape[1], plan.sizes[name]
            if size is not None and n < size:
                plan.full[name] = size
            plan.record(f"predict {name}", n=n, of=size, seconds=round(time.perf_counter() - began, 2), stopped=why,
                        **_widest(found, name))
    return found, kept


def examples_per_family(sizes: dict, seconds: float, cost: float) -> dict:
    """{family: examples} spending `seconds` at `cost` per example: the same n for every family
    that has it, a family with fewer examples read whole and its rest shared by the others."""
    if math.isinf(seconds):
        return dict(sizes)
    left, chosen, open_ = seconds / max(cost, 1e-12), {}, dict(sizes)
    while open_:
        share = left / len(open_)
        small = {name: size for name, size in open_.items() if size is not None and size <= share}
        if not small:
            chosen.update({name: int(share) for name in open_})
            break
        chosen.update(small)
        left -= sum(small.values())
        open_ = {name: size for name, size in open_.items() if name not in small}
    return chosen


def _refuse_a_budget_below_the_minimum(plan, sizes: dict, fixed: float, per_example: float) -> None:
    """Before the budget is spent: refuse one that cannot hold `MIN_PER_SPLIT` examples of every split
    and their analysis at the costs the pilot measured (member geometry is skipped before that)."""
    if plan.seconds is None:
        return
    least = fixed + per_example * sum(MIN_PER_SPLIT if size is None else min(size, MIN_PER_SPLIT) for size in sizes.values())
    if least > plan.remaining():  # what is left after the pilot, less the reserve
        need = (plan.spent() + least) / (1 - RESERVE) * (1 + NEED_MARGIN)
        shown = f"{math.ceil(need * 10) / 10:g}" if need < 10 else str(math.ceil(need))  # rounded up: tenths below 10 s
        raise EnsdiagError(f"a budget of {plan.seconds:g} s cannot hold the least this diagnosis reads: {MIN_PER_SPLIT} "
                           f"examples of each of its {len(sizes)} splits and their analysis take about {least:.1f} s here "
                           f"(measured on a pilot of {FIRST_CHUNK}); give at least {shown} s")


class _Stream:
    """Batches of a stream taken `count` examples at a time; the rest of a cut batch waits for the next take."""

    def __init__(self, batches):
        self.batches = batches

    def take(self, count):
        taken = 0
        for x, y in self.batches:
            if taken + len(x) > count:
                cut = count - taken
                self.batches = chain([(x[cut:], None if y is None else y[cut:])], self.batches)
                x, y = x[:cut], None if y is None else y[:cut]
            taken += len(x)
            yield x, y
            if taken >= count:
                return


def _read(plan, ensemble, name, data, size, wanted, preprocess, device, keep, found, progress, timing=None):
    """Predict `wanted` examples of one split (all where None) in a seeded random order and in
    doubling chunks, stopping early once the precision target is met or the time is spent;
    (logits, labels, kept, why it stopped). `timing(chunk, seconds)`: called after the first chunk,
    returns how many examples to read in all."""
    index = random_order(name, size) if size is not None else None
    stream = _Stream(batches(data, name)) if index is None else None
    chunks, labels, first, done, checked = [], [], None, 0, FIRST_CHUNK
    why = "budget"
    while True:
        limit = size if wanted is None else (wanted if size is None else min(wanted, size))
        if limit is not None and done >= limit:
            why = "all examples" if limit == size else why
            break
        step = max(done, FIRST_CHUNK) if limit is None else min(max(done, FIRST_CHUNK), limit - done)
        source = batches(take(data, index[done:done + step]), name) if index is not None else stream.take(step)
        began = time.perf_counter()
        try:
            logits, y, kept = predict_batches(ensemble, source, preprocess, device, max(keep - done, 0), name,
                                              progress(name) if progress else None)
        except EnsdiagError:
            if done and index is None:  # the stream ended
                why = "all examples"
                break
            raise
        chunks.append(logits)
        labels.append(y)
        if kept is not None:
            first = kept if first is None else (torch.cat([first[0], kept[0]]),
                                                None if first[1] is None else torch.cat([first[1], kept[1]]))
        done += logits.shape[1]
        if timing is not None:
            pilot = {"logits": logits, "labels": y}
            wanted, timing = timing(pilot, time.perf_counter() - began), None
            continue
        if index is None and logits.shape[1] < step:
            why = "all examples"
            break
        if plan.precision is not None and done >= 2 * checked:
            checked = done
            partial = {**found, name: {"logits": torch.cat(chunks, 1),
                                       "labels": None if any(part is None for part in labels) else torch.cat(labels)}}
            widest = _widest(partial, name)
            if widest.get("half_width") is not None and widest["half_width"] <= plan.precision:
                why = "precision reached"
                break
        read = done + sum(split["logits"].shape[1] for split in found.values())  # this split's examples and the others'
        analysis = plan.costs.get("analysis fixed", 0.0) + plan.costs.get("analysis per example", 0.0) * read
        if plan.seconds is not None and plan.spent() + analysis >= plan.deadline:  # the analyzers' time on them too
            why = "budget"
            break
    y = None if any(part is None for part in labels) else torch.cat(labels)
    return torch.cat(chunks, 1), y, first, why


ANALYSIS_TILES = 8  # the pilot chunk repeated this often, for the second of the two timed analyses


def _analysis_cost(chunk: dict) -> tuple[float, float]:
    """(fixed seconds, seconds per example) of the analyzers and their intervals on one split,
    fitted to two timed runs: on the chunk, and on the chunk repeated `ANALYSIS_TILES` times (what
    they cost depends on how many examples there are, hardly on their values)."""
    n = chunk["logits"].shape[1]
    if n < 8:
        return 0.0, 0.0
    timed = []
    for tiles in (1, ANALYSIS_TILES):
        part = {"id": {"logits": chunk["logits"].repeat(1, tiles, 1),
                       "labels": None if chunk["labels"] is None else chunk["labels"].repeat(tiles)}}
        began = time.perf_counter()
        add_intervals(analyze_predictions(part), part)
        timed.append(time.perf_counter() - began)
    per_example = max(timed[1] - timed[0], 0.0) / (n * (ANALYSIS_TILES - 1))
    return max(timed[0] - per_example * n, 0.0), per_example


def _widest(predictions: dict, split: str) -> dict:
    """{"half_width", "column"} of the widest example-level interval among the headline numbers
    (columns of the headline tables, `layout.HEADLINE_TABLES`; detail tables such as MCE's, which rests on its sparsest
    bin, still get intervals but do not hold a split back) that read `split` (vectorised analyzers
    only; a quick check with `CHECK_RESAMPLES`)."""
    try:
        checked = with_pooled_shift(check_predictions(dict(predictions), "the examples read so far", need_id=False))
    except EnsdiagError:
        return {}
    names = [name for name, analyzer in all_analyzers().items() if analyzer.needs == "predictions" and analyzer.resampler]
    metrics = analyze_predictions(checked, only=names)
    add_intervals(metrics, checked, resamples=CHECK_RESAMPLES, only=names)
    widest = {}
    for name in names:
        result = metrics["analyzers"].get(name, {})
        if result.get("status") != "ok":
            continue
        for path, reads in targets(all_analyzers()[name], result, checked):  # (the headline columns: detail False)
            if split not in reads:
                continue
            width = half_width(lookup(result, path[:-1])[0].get("interval"))
            if width is not None and (not widest or width > widest["half_width"]):
                widest = {"half_width": round(width, 6), "column": f"{name}/{'/'.join(path[:-1])}"}
    return widest
