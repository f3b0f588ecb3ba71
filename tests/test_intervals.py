"""Example-level intervals: the shared draws, the constructions, the vectorised built-ins against
re-running each analyzer, a plug-in's intervals from the generic path, and how they are shown."""

import json
import math

import pytest
import torch

from ensdiag.stats import bootstrap as B
from ensdiag.stats import constructions as CI
from ensdiag.analysis import ANALYZERS, Column, all_analyzers, analyze_predictions, metric, register_analyzer
from ensdiag.analysis.registry import without_ood_labels
from ensdiag.core.intervals import _generic, _vectorised, add_intervals, targets


def _predictions(seed=0, k=4, classes=5, n=(70, 60, 50, 40)):
    g = torch.Generator().manual_seed(seed)
    split = lambda size, labelled=True: {"logits": 2 * torch.randn(k, size, classes, generator=g),  # noqa: E731
                                         "labels": torch.randint(0, classes, (size,), generator=g) if labelled else None}
    return {"id": split(n[0]), "shift": split(n[1]), "ood": split(n[2], False), "val": split(n[3])}


def test_draws_depend_on_the_split_family_and_size_only_and_blocks_agree():
    whole = B.draws("id", 50, 30)
    assert torch.equal(torch.cat([rows for _, rows in B.blocks("id", 50, 30)]), whole)
    assert torch.equal(B.draws("id", 50, 30, start=10, stop=20), whole[10:20])
    assert torch.equal(B.draws("shift/blur", 40, 5), B.draws("shift/fog", 40, 5))  # a corruption resamples like its set
    assert not torch.equal(B.draws("id", 50, 5), B.draws("ood", 50, 5))  # ID and OOD are drawn apart (stratified)
    counts = B.counts_of(whole[:3], 50)
    assert counts.sum(1).tolist() == [50.0] * 3 and counts[0, whole[0, 0]] >= 1


@pytest.mark.parametrize("kept", [True, False])
def test_the_shared_counts_are_the_draws_in_any_order_of_blocks_kept_or_drawn_again(kept, monkeypatch):
    """Draws hands out the same counts whoever asks, in whatever blocks and order: kept (a byte per
    count, filled a block at a time) or, for a split above KEPT_ENTRIES, drawn again from a stream that
    goes on, skips forward a block at a time, or restarts."""
    monkeypatch.setattr(B, "BLOCK_ENTRIES", 37 * 4)  # 4 rows a block: every fill and skip takes several
    if not kept:
        monkeypatch.setattr(B, "KEPT_ENTRIES", 100)
    n, resamples = 37, 60
    whole = B.counts_of(B.draws("id", n, resamples), n)
    draws = B.Draws()
    assert draws.counts("id", n, 0, 0).shape == (0, n)
    for start, stop in [(0, 7), (7, 20), (20, 60), (3, 11), (50, 60), (0, 60), (30, 31), (45, 58)]:
        found = draws.counts("id", n, start, stop)
        assert found.dtype == torch.float64 and torch.equal(found, whole[start:stop])
    assert bool(draws.kept) is kept
    assert torch.equal(draws.counts("shift/fog", n, 0, 5), B.counts_of(B.draws("shift", n, 5), n))


def test_the_float64_counts_are_kept_for_the_next_statistic_within_their_bound(monkeypatch):
    """A block asked for again is the very tensor handed out before (every analyzer reads every block),
    equal to drawing it afresh; past WIDE_BYTES, or a quarter of the memory budget, it is widened anew."""
    n = 37
    draws = B.Draws()
    first = draws.counts("id", n, 0, 20)
    assert draws.counts("id", n, 0, 20) is first and torch.equal(first, B.counts_of(B.draws("id", n, 20), n))
    assert draws.counts("id", n, 0, 10) is not first  # another block: its own entry
    assert draws.counts("id", n, 0, 20, clusters=n) is not first  # clustered counts: their own entry
    monkeypatch.setenv("ENSDIAG_MEMORY_BUDGET", "4K")  # a quarter: 1 KiB, under one block of 20 × 37 float64
    small = B.Draws()
    again = small.counts("id", n, 0, 20)
    assert small.counts("id", n, 0, 20) is not again and torch.equal(again, first) and small.wide_bytes == 0
    monkeypatch.delenv("ENSDIAG_MEMORY_BUDGET")
    monkeypatch.setattr(B, "WIDE_BYTES", 8 * 20 * n)
    bounded = B.Draws()
    bounded.counts("id", n, 0, 20)
    assert bounded.counts("id", n, 20, 21) is not bounded.counts("id", n, 20, 21)  # the bound reached: not kept
    assert bounded.wide_bytes == 8 * 20 * n


def test_a_count_a_byte_cannot_hold_is_kept_exactly(monkeypatch):
    """Counted into bytes, a count past 255 would wrap: the rows that hold one are counted exactly."""
    n = 300
    crafted = torch.randint(0, n, (10, n), generator=torch.Generator().manual_seed(0))
    crafted[0] = 7  # one example drawn 300 times (no real resample does this)
    crafted[3, :256] = 2  # 256: a byte's wrap to exactly 0
    assert B.byte_counts(crafted[1:3], n) is not None and B.byte_counts(crafted[:4], n) is None
    monkeypatch.setattr(B._Stream, "rows", lambda self, start, stop: crafted[start:stop])
    draws = B.Draws()
    first = draws.counts("id", n, 0, 10)
    assert torch.equal(first, B.exact_counts(crafted, n)) and first[0, 7] == 300 and first[3, 2] >= 256
    assert torch.equal(B.counts_of(crafted, n), first)  # counted in bytes where they fit, exactly where not
    assert draws.kept[("id", n)].dtype == torch.int32 and torch.equal(draws.counts("id", n, 0, 10), first)


def test_a_clustered_splits_counts_add_each_inputs_blocks_first():
    """The counts of a clustered split (each input's count repeated in every block) say so, and the weighted
    sums read them as the blocks' sums per input: the dense product's numbers (to float rounding; integer
    masses exactly), a NaN anywhere still a NaN."""
    from ensdiag.stats import weighted as W
    inputs, blocks = 23, 4
    counts = B.Draws().counts("shift", inputs * blocks, 0, 40, clusters=inputs)
    assert counts.inputs == inputs and torch.equal(counts, counts[:, :inputs].repeat(1, blocks))
    dense = counts.clone()  # (a copy carries no `inputs`: the plain product)
    g = torch.Generator().manual_seed(1)
    values = torch.rand(inputs * blocks, generator=g, dtype=torch.float64)
    assert torch.allclose(W.mean(values, counts), W.mean(values, dense), rtol=1e-13, atol=0)
    assert torch.equal(W.total_weight(counts), dense.sum(1))
    confidence, correct = torch.rand(inputs * blocks, generator=g), (torch.rand(inputs * blocks, generator=g) > 0.3).double()
    clustered, plain = W.calibration_bins(confidence, correct, counts), W.calibration_bins(confidence, correct, dense)
    assert torch.equal(clustered.mass, plain.mass) and torch.allclose(clustered.confidence, plain.confidence, rtol=1e-13)
    values[inputs * 2 + 5] = math.nan
    assert W.mean(values, counts).isnan().all() and W.mean(values, dense).isnan().all()


def test_statistics_worked_on_in_chunks_give_the_numbers_of_one_pass(monkeypatch):
    """The OOD rankings and the ray inversion work on their resamples a cache-sized chunk at a time: the
    numbers are those of one pass over every resample, bit for bit."""
    from ensdiag.stats import weighted as W
    g = torch.Generator().manual_seed(2)
    score_id, score_ood = torch.rand(60, generator=g).round(decimals=1), torch.rand(45, generator=g) + 0.2
    w_id, w_ood = B.Draws().counts("id", 60, 0, 300), B.Draws().counts("ood", 45, 0, 300)
    combine = lambda means, mass: (mass * means.abs()).sum(-1)  # noqa: E731
    estimate = CI.Folded(torch.tensor([0.05, -0.02, 0.1], dtype=torch.float64), torch.ones(3, dtype=torch.float64), combine)
    resampled = CI.Folded(estimate.means + 0.05 * torch.randn(300, 3, generator=g, dtype=torch.float64),
                          torch.ones(300, 3, dtype=torch.float64), combine)
    whole = W.ood_metrics(score_id, score_ood, w_id, w_ood), CI.ray(estimate, resampled)
    for entries in (7, 1000):
        monkeypatch.setattr(W, "CACHED_ENTRIES", entries)
        monkeypatch.setattr(CI, "CACHED_ENTRIES", entries)
        chunked = W.ood_metrics(score_id, score_ood, w_id, w_ood), CI.ray(estimate, resampled)
        assert all(torch.equal(whole[0][key], chunked[0][key]) for key in whole[0]) and chunked[1] == whole[1]


def test_the_ood_columns_intervals_reach_past_a_perfect_separation_and_a_zero_count():
    """Separated scores: AUROC and AUPR are 1 and FPR95 0 on every resample. The printed intervals are
    not [1, 1] and [0, 0]: they reach as far as no misordered example among the split's n allows (the
    Clopper–Pearson bound), and say so; the value stays inside."""
    g = torch.Generator().manual_seed(0)
    confident = torch.randn(3, 120, 5, generator=g) + 30 * torch.nn.functional.one_hot(torch.arange(120) % 5, 5)
    flat = 0.01 * torch.randn(3, 80, 5, generator=g)
    predictions = {"id": {"logits": confident, "labels": torch.arange(120) % 5}, "ood": {"logits": flat, "labels": None}}
    metrics = analyze_predictions(predictions, only=["ood"])
    add_intervals(metrics, predictions)
    msp = metrics["analyzers"]["ood"]["scores"]["msp"]
    exact = CI.clopper_pearson(0, 80)[1]
    for key in ("auroc", "aupr_out"):
        assert msp[key]["value"] == 1.0
        interval = msp[key]["interval"]
        assert interval["low"] == pytest.approx(1 - exact) and interval["high"] == 1.0
    for key, n in (("fpr95_ood_as_id", 80), ("fpr95_id_as_ood", 120)):
        interval = msp[key]["interval"]
        assert msp[key]["value"] == 0.0 and interval["low"] == 0.0
        assert interval["high"] == pytest.approx(CI.clopper_pearson(0, n)[1]) and "Clopper–Pearson" in interval["method"]


# a re-run refits what these fit on the resampled split itself; their own tests check their resamplers
REFITTED = {"refinement": "cross-fits its temperatures by position, one Newton step per resample (tests/test_diagnostics.py)"}


@pytest.mark.parametrize("name", sorted(name for name, analyzer in all_analyzers().items()
                                        if analyzer.needs == "predictions" and analyzer.resampler and name not in REFITTED))
def test_every_built_in_resampler_is_its_analyzer_re_run_on_the_same_resamples(name):
    """The vectorised path gives what re-running the analyzer on resampled predictions gives,
    for every example-level column, and leaves none of them to the generic path."""
    analyzer = all_analyzers()[name]
    predictions = without_ood_labels(_predictions())
    result = {"status": "ok", **analyzer(predictions)}
    wanted = targets(analyzer, result, predictions, detail=True)
    assert wanted, f"{name} declares no example-level column"
    fast = _vectorised(analyzer, result, predictions, None, wanted, 25, B.Draws())
    assert set(fast) == {path for path, _ in wanted}
    slow, note = _generic(analyzer, predictions, None, wanted, 25, math.inf)
    assert note is None
    for path, _ in wanted:
        if isinstance(fast[path], str):  # a number its resampler gives no interval (MCE, direction): the reason instead
            assert fast[path].startswith("no interval: ") and path[-2] in ("mce", "ece_direction")
            continue
        estimate, values = fast[path]
        if isinstance(values, CI.Folded):  # the folded statistic itself, and its estimate the analyzer's value
            assert estimate.value() == pytest.approx(_value(result, path), abs=1e-12)
            values = values.combine(values.means[None], values.mass)[0]
        torch.testing.assert_close(values, slow[path][1], rtol=1e-9, atol=1e-12, msg=f"{name} {path}")


def _value(result, path):
    for key in path:
        result = result[key]
    return result


def test_a_plugin_analyzer_gets_percentile_intervals_without_a_line_of_its_own():
    """A column of a per-split table is an example-level statistic by default: the analyzer is re-run
    on the shared draws, and the interval is the percentiles of its values."""
    @register_analyzer("toy-confidence", description="mean top softmax probability of member 0",
                       columns=[Column("confidence", ("splits", "{split}", "confidence", "value"), None, "mean top p",
                                       ("id",))])
    def toy(predictions, weights=None):
        return {"splits": {name: {"confidence": metric(split["logits"][0].softmax(-1).amax(-1).mean().item(), "mean top p")}
                           for name, split in predictions.items()}}

    try:
        predictions = _predictions()
        metrics = analyze_predictions(predictions, only=["toy-confidence"])
        add_intervals(metrics, predictions, resamples=B.MIN_RESAMPLES)
        entry = metrics["analyzers"]["toy-confidence"]["splits"]["id"]["confidence"]["interval"]
        assert "interval" not in metrics["analyzers"]["toy-confidence"]["splits"]["shift"]["confidence"]  # not declared
        top = predictions["id"]["logits"][0].softmax(-1).amax(-1).double()
        rows = B.draws("id", len(top), B.MIN_RESAMPLES)
        low, high = torch.quantile(top[rows].mean(1), torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
        assert entry["low"] == pytest.approx(low) and entry["high"] == pytest.approx(high)
        assert entry["n"] == 70 and entry["level"] == 0.95 and entry["method"].startswith("percentile bootstrap")
    finally:
        del ANALYZERS["toy-confidence"]


def test_a_plugin_too_slow_to_re_run_says_why_it_has_no_interval():
    import time

    @register_analyzer("toy-slow", columns=[Column("slow", ("splits", "{split}", "slow", "value"), None, "x", ("id",))])
    def slow(predictions, weights=None):
        time.sleep(0.05)
        return {"splits": {"id": {"slow": metric(1.0, "one")}}}

    try:
        predictions = _predictions()
        metrics = analyze_predictions(predictions, only=["toy-slow"])
        notes = add_intervals(metrics, predictions, allowance=1.0)
        entry = metrics["analyzers"]["toy-slow"]["splits"]["id"]["slow"]["interval"]
        assert entry["low"] is None and "re-run" in entry["note"] and "toy-slow" in notes
        assert metrics["intervals"]["skipped"]["toy-slow"] == entry["note"]
    finally:
        del ANALYZERS["toy-slow"]


def test_columns_say_which_examples_they_are_statistics_of():
    analyzers = all_analyzers()
    by_label = {column.label: column for analyzer in analyzers.values() for column in analyzer.columns}
    ece = next(column for column in analyzers["calibration"].columns if column.label == "ECE")
    assert ece.example_splits("shift") == ("shift",)
    assert by_label["AUROC"].example_splits() == ("id", "ood")
    assert by_label["disagreement (ood)"].example_splits() == ("ood",)
    assert by_label["weight cosine"].example_splits() == ()
    assert by_label["T pooled"].example_splits() == ()
    with pytest.raises(ValueError, match="examples must be"):
        register_analyzer("toy-bad", columns=[Column("x", ("x", "value"), None, "x", ("id",), examples="id")])(lambda p, w: {})


def test_percentile_basic_and_the_finite_population_factor():
    values = torch.linspace(0, 1, 1001, dtype=torch.float64)
    assert CI.percentile(0.5, values) == pytest.approx((0.025, 0.975))
    skewed = values**2  # resamples sitting above the estimate on average: the basic interval takes that bias off
    low, high = CI.basic(0.2, skewed)
    centre = float(skewed.mean())
    assert (low, high) == pytest.approx((0.2 - (centre - 0.2) - (0.950625 - centre), 0.2 - (centre - 0.2) - (0.000625 - centre)))
    entry = CI.interval(0.5, values, 400, of=1000)
    factor = math.sqrt(600 / 999)
    assert entry["full_split"]["low"] == pytest.approx(0.5 - factor * 0.475)
    assert entry["full_split"]["of"] == 1000 and entry["n"] == 400
    assert "full_split" not in CI.interval(0.5, values, 1000, of=1000)
    assert CI.interval(float("nan"), values, 10)["low"] is None
    assert CI.interval(0.5, torch.full((100,), float("nan")), 10)["note"].startswith("only 0 of 100")


def test_the_ray_interval_of_a_folded_statistic():
    """Σ|μ| of well-separated means behaves like a mean (the ray interval is close to the percentile
    one); of means at 0 the interval reaches down to 0 where the percentiles never would."""
    g = torch.Generator().manual_seed(0)
    combine = lambda means, mass: (mass * means.abs()).sum(-1)  # noqa: E731
    ones = torch.ones(3, dtype=torch.float64)
    far = CI.Folded(torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64), ones, combine)
    draws = far.means + 0.05 * torch.randn(2000, 3, generator=g, dtype=torch.float64)
    low, high = CI.ray(far, CI.Folded(draws, ones.expand(2000, 3), combine))
    plain = CI.percentile(6.0, combine(draws[None], ones.expand(2000, 3))[0])
    assert low == pytest.approx(plain[0], abs=0.02) and high == pytest.approx(plain[1], abs=0.02)
    noise = 0.05 * torch.randn(3, generator=g, dtype=torch.float64)
    near = CI.Folded(noise, ones, combine)
    draws = noise + 0.05 * torch.randn(2000, 3, generator=g, dtype=torch.float64)
    low, high = CI.ray(near, CI.Folded(draws, ones.expand(2000, 3), combine))
    assert low == 0.0 and CI.percentile(near.value(), combine(draws[None], ones.expand(2000, 3))[0])[0] > 0
    lucky = CI.Folded(noise / 20, ones, combine)  # smaller than pure noise typically gives: [0, where the resamples reach]
    low, high = CI.ray(lucky, CI.Folded(noise / 20 + draws - noise, ones.expand(2000, 3), combine))
    assert low == 0.0 and lucky.value() < high


def test_weighted_hsic_is_the_cka_of_the_resampled_features():
    from ensdiag.geometry.cka import Moments
    from ensdiag.geometry.resampled import resampled_cka
    g = torch.Generator().manual_seed(1)
    x = torch.randn(40, 6, generator=g)
    features = {"a": [x, x @ torch.randn(6, 5, generator=g) + 0.5 * torch.randn(40, 5, generator=g), torch.randn(40, 3, generator=g)],
                "b": [torch.randn(40, 4, generator=g) + 3, torch.randn(40, 4, generator=g), x[:, :2]]}
    rows = B.draws("id", 40, 3)
    found = resampled_cka(features, B.counts_of(rows, 40))
    for r, index in enumerate(rows):
        per_layer = []
        for members in features.values():
            moments = Moments()
            moments.add([member[index] for member in members])
            linear = moments.cka()[0]
            per_layer.append((linear.sum() - linear.diagonal().sum()).item() / 6)
        assert found[r].item() == pytest.approx(sum(per_layer) / 2, abs=1e-9)


def test_a_barrier_interval_is_read_from_the_paths_per_example_curves():
    from ensdiag.geometry.paths import barrier, excess
    from ensdiag.geometry.resampled import barrier_interval
    g = torch.Generator().manual_seed(2)
    ts = torch.linspace(0, 1, 5).tolist()
    losses = 1 + 0.3 * torch.randn(5, 300, generator=g, dtype=torch.float64).abs()
    losses[2] += 0.4  # a bump in the middle
    entry = barrier_interval([(ts, excess(ts, losses))], "id")
    value = barrier(ts, losses.mean(1).tolist())
    assert entry["low"] < value < entry["high"] and entry["n"] == 300 and "ray" in entry["method"]


def test_metrics_carry_intervals_and_every_output_shows_them(tmp_path):
    from ensdiag.core import inspect_predictions
    from ensdiag.report.inspection import metrics_view
    from ensdiag.report.terminal import INTERVALS, cell
    diagnosis = inspect_predictions(_predictions(n=(300, 200, 200, 100)))
    metrics = json.loads(diagnosis.to_json())  # JSON-safe
    assert metrics["schema"] == "ensdiag.metrics/2" and metrics["intervals"]["level"] == 0.95
    ece = metrics["analyzers"]["calibration"]["splits"]["id"]["ece"]
    assert set(ece["interval"]) >= {"low", "high", "level", "n", "method"} and ece["interval"]["n"] == 300
    auroc = metrics["analyzers"]["ood"]["scores"]["msp"]["auroc"]["interval"]
    assert auroc["strata"] == {"id": 300, "ood": 200} and auroc["n"] == 500 and "stratified" in auroc["method"]
    text = cell(ece, interval="n")
    assert text == f"{ece['value']:.3f} [{ece['interval']['low']:.3f}, {ece['interval']['high']:.3f}] (n = 300)"
    assert cell(metrics["analyzers"]["ood"]["scores"]["msp"]["auroc"], interval="n").endswith("(n = 300 id + 200 ood)")
    tables, notes = metrics_view(metrics, "toy")
    assert INTERVALS in notes
    from ensdiag.results import Diagnosis
    markdown = Diagnosis.of(diagnosis).to_markdown()  # one run: the report's cells carry the run's own interval
    nll = metrics["analyzers"]["calibration"]["splits"]["id"]["nll"]
    assert f"{nll['value']:.3f} [{nll['interval']['low']:.3f}, {nll['interval']['high']:.3f}] (n = 300)" in markdown


def test_a_report_over_seeds_shows_both_uncertainties_as_what_they_are(tmp_path):
    from ensdiag.core import inspect_predictions
    from ensdiag.report import make_report
    from ensdiag.report.render import cell_text
    shared = _predictions(n=(200, 100, 100, 100))
    for seed in (0, 1):  # two seeds on one test set
        predictions = _predictions(seed=seed, n=(200, 100, 100, 100))
        predictions.update({name: {**predictions[name], "labels": shared[name]["labels"]} for name in ("id", "shift")})
        inspect_predictions(predictions).save(tmp_path, "ensemble", seed)
    report = make_report(tmp_path, write=False)
    table = next(table for table in report["tables"] if table["id"] == "id")
    index = [column["name"] for column in table["columns"]].index("NLL")
    cell = table["rows"][0]["cells"][index]
    halves = []
    for seed in (0, 1):
        metrics = json.loads((tmp_path / "ensemble" / f"seed-{seed}" / "metrics.json").read_text())
        entry = metrics["analyzers"]["calibration"]["splits"]["id"]["nll"]["interval"]
        halves.append((entry["high"] - entry["low"]) / 2)
    assert cell["example"] == {"half_width": pytest.approx(sum(halves) / 2), "n": 200, "seeds": 2}
    assert cell_text(cell, "id", index).endswith(f"(test set ± {sum(halves) / 2:.3f})")
    assert "test set:" in report["examples"]


def _pairs_of(agreeing: bool):
    """Three members on 400 examples: their errors differ on many examples, or on two only."""
    g = torch.Generator().manual_seed(4)
    labels = torch.randint(0, 5, (400,), generator=g)
    base = torch.randn(400, 5, generator=g) + 2.5 * torch.nn.functional.one_hot(labels, 5)
    noise = 0.02 if agreeing else 1.5
    logits = torch.stack([base + noise * torch.randn(400, 5, generator=g) for _ in range(3)])
    return {"id": {"logits": logits, "labels": labels}}


def test_yules_q_and_the_error_correlation_say_why_they_have_no_interval_where_a_pair_barely_differs():
    """Where a pair's errors differ on fewer than 5 examples one way round, Q and φ are ±1 on almost
    every resample (no interval covers, docs/conventions.md): the reason, with the count; the double
    fault keeps its interval. Members that differ keep every interval."""
    analyzer = all_analyzers()["member-pairs"]
    for agreeing in (True, False):
        predictions = without_ood_labels(_pairs_of(agreeing))
        result = {"status": "ok", **analyzer(predictions)}
        wanted = targets(analyzer, result, predictions, detail=True)
        found = _vectorised(analyzer, result, predictions, None, wanted, 25, B.Draws())
        for key in ("yule_q", "error_correlation"):
            entry = found[("splits", "id", key, "mean", "value")]
            if agreeing:
                assert isinstance(entry, str) and "differ on fewer than 5 examples one way round" in entry, entry
            else:
                assert not isinstance(entry, str)
        assert not isinstance(found[("splits", "id", "double_fault", "mean", "value")], str)


@pytest.mark.parametrize("fewest, refused", [(4, True), (5, False)])
def test_the_discordant_rule_holds_at_five_examples(fewest, refused):
    """Two members, 200 examples: both wrong on 20, only the first on `fewest`, only the second on 9."""
    wrong = {0: set(range(20)) | set(range(20, 20 + fewest)), 1: set(range(20)) | set(range(100, 109))}
    logits = torch.zeros(2, 200, 2)
    for member, examples in wrong.items():
        for example in range(200):
            logits[member, example] = torch.tensor([0.0, 2.0] if example in examples else [2.0, 0.0])
    logits[:, :, 0] += torch.linspace(0, 0.5, 200)  # no two examples alike
    predictions = without_ood_labels({"id": {"logits": logits, "labels": torch.zeros(200, dtype=torch.long)}})
    analyzer = all_analyzers()["member-pairs"]
    result = {"status": "ok", **analyzer(predictions)}
    found = _vectorised(analyzer, result, predictions, None, targets(analyzer, result, predictions, detail=True), 25,
                        B.Draws())
    entry = found[("splits", "id", "yule_q", "mean", "value")]
    assert isinstance(entry, str) == refused and (not refused or f"= {fewest})" in entry)


def test_columns_of_percentile_intervals_equal_one_interval_each():
    """`percentile_columns` (the lm-eval groups' many numbers at once) gives each column exactly the
    entry `interval` gives it, the columns with a non-finite value or resample included."""
    g = torch.Generator().manual_seed(3)
    resampled = torch.randn(400, 5, generator=g, dtype=torch.float64)
    estimates = resampled.mean(0) + 0.01
    resampled[7, 1] = math.nan  # one resample lost: that column goes through `interval` itself
    resampled[:, 2] = math.inf  # none finite: a note, no bounds
    estimates[3] = math.nan  # no value: no interval
    strata = {"a": 120, "b": 80}
    for given in (None, strata):
        found = CI.percentile_columns(estimates, resampled, 200, given)
        assert found == [CI.interval(float(estimates[j]), resampled[:, j], 200, strata=given) for j in range(5)]
    assert found[0]["low"] < found[0]["high"] and found[2]["low"] is None and found[3]["low"] is None
    none_clean = CI.percentile_columns(estimates[2:4], resampled[:, 2:4], 200)  # no column to batch: each on its own
    assert none_clean == [CI.interval(float(estimates[j]), resampled[:, j], 200) for j in (2, 3)]


def test_counts_of_small_splits_fit_in_bytes_unchecked():
    """Under 256 examples no count can wrap a byte: the byte counts equal the exact ones."""
    for n in (1, 37, 255):
        rows = torch.randint(0, n, (50, n), generator=torch.Generator().manual_seed(n))
        assert torch.equal(B.byte_counts(rows, n).double(), B.exact_counts(rows, n))
        assert torch.equal(B.counts_of(rows, n), B.exact_counts(rows, n))


def test_an_interval_whose_lower_end_is_zero_on_every_resample_is_printed_as_an_upper_bound():
    """SmoothECE and the classwise ECE are above 0 on any test set although a calibrated model's are 0, so their
    interval runs from 0: it says only how large the error may be, and every renderer prints it as "≤ high"."""
    from ensdiag.report.example_level import example_cell, example_text
    from ensdiag.report.render import cell_text
    from ensdiag.report.terminal import interval_text
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 5, (300,), generator=generator)
    predictions = {"id": {"logits": torch.randn(4, 300, 5, generator=generator), "labels": labels},
                   "val": {"logits": torch.randn(4, 100, 5, generator=generator), "labels": labels[:100]}}
    metrics = analyze_predictions(predictions, only=["calibration"])
    add_intervals(metrics, predictions, detail=True)
    entry = metrics["analyzers"]["calibration"]["splits"]["id"]
    smooth, nll = entry["smooth_ece"]["interval"], entry["nll"]["interval"]
    assert smooth["bound"] == "upper" and smooth["low"] == 0.0 and "bound" not in nll
    assert interval_text(smooth, with_n=False) == f" (≤ {smooth['high']:.3f})"
    assert interval_text(nll, with_n=False) == f" [{nll['low']:.3f}, {nll['high']:.3f}]"

    class Read:  # a report cell reads the interval of each seed's run
        def interval(self, run):
            return run
    example = example_cell({1: smooth}, Read())["example"]
    assert example_text(example, lambda value: f"{value:.3f}") == f" (≤ {smooth['high']:.3f}) (n = 300)"
    assert cell_text({"mean": 0.1, "ci": None, "example": example}, "calibration", 0, compact=True).endswith(
        f"(≤ {smooth['high']:.3f})")
