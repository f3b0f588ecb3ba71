"""Ensembles of generated answers (lm-eval's generate_until tasks): the members' answers to each
question and whether each is correct, with no probabilities. What an ensemble of them gives:

    per_question = question_quantities(ids, correct)     # ids, correct: [k, N] (foreign/lm_eval_generated.py)
    metrics = generated_metrics(splits, section)          # every number with its interval
    ensdiag analyze out/ --task gsm8k                     # the same, from lm-eval's logs (cli/analyze.py)

- **member accuracy**: each member's share of correct answers (lm-eval's exact_match);
- **majority vote**: the most frequent answer among the k members (answers equal after the
  metric's normalisation count as one); a tie between answers counts the share of the tied
  answers that are correct (the vote's accuracy with ties broken at random, in expectation: no
  member order decides it);
- **oracle**: some member is correct (the vote's ceiling: k answers, one right one is enough);
- **disagreement**: the fraction of member pairs whose answers differ, (k² − Σ_a c_a²)/(k(k − 1))
  with c_a the members giving answer a;
- **double fault** (Kuncheva & Whitaker 2003): the fraction of member pairs both wrong,
  w(w − 1)/(k(k − 1)) with w the members wrong.

Each is a mean over questions, with a percentile bootstrap interval over the questions (the
draws `bootstrap.py` shares with every analysis of the same split and size). The probabilities
behind NLL, ECE, JSD, the OOD scores and the verdict's diversity term do not exist for generated
answers: those tables do not apply. docs/conventions.md, "Generated answers", says the same.
"""

import math

import torch

from .. import __version__
from ..layout import metric
from . import bootstrap as B
from . import constructions as CI

SCHEMA = "ensdiag.generated/1"
DEFINITIONS = {
    "vote_accuracy": "accuracy of the members' majority answer (a tie: the share of the tied answers that are correct)",
    "oracle_accuracy": "share of questions some member answers correctly",
    "mean_member_accuracy": "mean over members of their accuracy",
    "disagreement": "fraction of member pairs whose answers differ (after the metric's normalisation)",
    "double_fault": "fraction of member pairs both wrong",
    "member_accuracy": "each member's accuracy: lm-eval's exact_match",
}
COLUMNS = (("vote Acc ↑", "vote_accuracy"), ("oracle Acc", "oracle_accuracy"), ("member Acc", "mean_member_accuracy"),
           ("disagreement", "disagreement"), ("double fault ↓", "double_fault"))


def question_quantities(ids: torch.Tensor, correct: torch.Tensor) -> dict:
    """Per question [N] (members' correctness [N, k]) from answer ids and correctness [k, N]."""
    k, n = ids.shape
    count = torch.zeros(n, k, dtype=torch.float64).scatter_add_(1, ids.T, torch.ones(n, k, dtype=torch.float64))
    right = torch.zeros(n, k, dtype=torch.float64).scatter_add_(1, ids.T, correct.T.double())
    tied = count == count.max(1, keepdim=True).values
    share = torch.where(count > 0, right / count.clamp(min=1), 0.0)  # an answer's correctness (all its members agree)
    wrong = (~correct).double().sum(0)
    pairs = k * (k - 1)
    nan = torch.full((n,), math.nan, dtype=torch.float64)
    return {"vote_accuracy": (share * tied).sum(1) / tied.sum(1),
            "oracle_accuracy": correct.any(0).double(),
            "mean_member_accuracy": correct.double().mean(0),
            "disagreement": (k * k - count.pow(2).sum(1)) / pairs if k > 1 else nan,
            "double_fault": wrong * (wrong - 1) / pairs if k > 1 else nan,
            "member_accuracy": correct.double().T}


def split_metrics(name: str, ids: torch.Tensor, correct: torch.Tensor, resamples: int = B.RESAMPLES) -> dict:
    """Every number of one split, each mean with its bootstrap interval over the questions."""
    per_question = question_quantities(ids, correct)
    n = ids.shape[1]
    if n == 0:
        return {"n": 0, **{key: metric(None, DEFINITIONS[key], status="empty") for key in DEFINITIONS}}
    scalars = [key for key in per_question if per_question[key].dim() == 1]
    values = torch.stack([per_question[key] for key in scalars], 1)  # [N, Q]
    count = B.resamples_for(n, resamples)
    resampled = torch.cat([B.counts_of(rows, n) @ values.nan_to_num() / n for _, rows in B.blocks(name, n, count)])
    found = {"n": n}
    for index, key in enumerate(scalars):
        value = values[:, index].mean().item()
        found[key] = metric(value, DEFINITIONS[key], interval=CI.interval(value, resampled[:, index], n)
                            if math.isfinite(value) else None)
    found["member_accuracy"] = metric(per_question["member_accuracy"].mean(0).tolist(), DEFINITIONS["member_accuracy"])
    wrong = (~correct).double()  # [k, k] of every member pair, means over questions:
    found["pairs"] = {"disagreement": (ids[:, None, :] != ids[None, :, :]).double().mean(2).tolist(),
                      "double_fault": (wrong @ wrong.T / n).tolist()}
    return found


def generated_metrics(splits: dict, section: dict) -> dict:
    """The metrics layout of generated answers: {"schema", "num_members", "splits", "generated": {split: …}, "lm_eval"}."""
    first = next(iter(splits.values()))
    return {"schema": SCHEMA, "ensdiag_version": __version__, "num_members": first["ids"].shape[0],
            "splits": {name: {"n": split["ids"].shape[1], "labelled": True} for name, split in splits.items()},
            "generated": {name: split_metrics(name, split["ids"], split["correct"]) for name, split in splits.items()},
            "lm_eval": section}

