"""Which OOD score the report's OOD table and histogram show (`ensdiag report --ood-score NAME`).

metrics.json holds every score of the `ood` analyzer (analysis/ood.py); the report shows one,
1 − MSP unless asked. The OOD table's declared columns read `scores.msp.…`; for another score
they read `scores.<name>.…`, N/A for runs written before that score existed (ood analyzer
version 1) and for scores a run cannot have (mutual information, variation ratio: k = 1).
"""

from ..analysis.ood import ALIASES, DEFAULT_SCORE, SCORES, score_of
from ..errors import unknown
from ..seeds.across import read_seed
from .load import first_run

SCORES_SINCE = {"msp": 1, "entropy": 1, "jsd": 1}  # the others came with the ood analyzer's version 2


def resolve(name: str | None) -> str:
    """The score's key in metrics.json (aliases such as `mutual_information` resolved); an
    unknown name is a one-line error listing the choices."""
    if name is None:
        return DEFAULT_SCORE
    key = ALIASES.get(name, name)
    if key not in SCORES:
        raise unknown("--ood-score", name, [*SCORES, *ALIASES])
    return key


# how the table's title and the histogram name each score (its definition is SCORES[score][1])
TITLES = {"msp": "1 − MSP", "entropy": "entropy H(p̄)", "jsd": "mutual information (JSD)",
          "expected_entropy": "mean member entropy", "energy": "energy −logsumexp(z̄)", "max_logit": "−max mean logit",
          "variation_ratio": "variation ratio"}


def columns(declared: list[tuple], score: str) -> list[tuple]:
    """The OOD table's declared columns reading `score` instead of the default."""
    if score == DEFAULT_SCORE:
        return declared
    chosen = []
    for label, analyzer, path, direction, definition, split, since in declared:
        if analyzer == "ood" and path[:2] == ("scores", DEFAULT_SCORE):
            path, since = ("scores", score, *path[2:]), max(since, SCORES_SINCE.get(score, 2))
            definition = f"{definition}; score: {SCORES[score][1]}"
        chosen.append((label, analyzer, path, direction, definition, split, since))
    return chosen


def histograms(runs: dict, damaged: dict, score: str) -> list[tuple]:
    """[(method, ID scores, OOD scores)] of each method's first seed whose predictions could be used
    (`damaged`: {method: {seed: why}} of those that could not), for the report's histogram."""
    panels = []
    for method, seeds in runs.items():
        _, run = first_run({seed: run for seed, run in seeds.items() if str(seed) not in damaged.get(method, {})})
        if run is None or "ood" not in run["metrics"]["splits"]:  # e.g. LoRA adapters: weights, no predictions
            continue
        found = read_seed(run["folder"])
        if found.ood is not None and not (SCORES[score][2] and found.ood.members < 2):
            panels.append((method, *(score_of(score, split.logits).float().numpy() for split in (found.id, found.ood))))
    return panels
