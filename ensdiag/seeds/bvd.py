"""Bias, variance and diversity over seeds (Wood et al., JMLR 2023, "A unified theory of diversity
in ensemble learning"), for every ensemble method of a run with at least two seeds.

With members q_{s,i} (seed s of S, member i of k) on the in-distribution test set, averaged over
test examples:
- squared loss (Brier), arithmetic-mean ensemble q̄_s = mean_i q_{s,i}, central model
  q° = mean_{s,i} q_{s,i}:
      mean_s ‖y − q̄_s‖² = ‖y − q°‖²  +  mean_{s,i} ‖q_{s,i} − q°‖²  −  mean_{s,i} ‖q_{s,i} − q̄_s‖²
                          (bias)        (variance)                     (diversity)
- cross-entropy, normalised-geometric-mean ensemble q̄_s ∝ exp(mean_i log q_{s,i}), central
  model q° ∝ exp(mean_{s,i} log q_{s,i}):
      mean_s −log q̄_s(y) = −log q°(y)  +  mean_{s,i} KL(q° ‖ q_{s,i})  −  mean_{s,i} KL(q̄_s ‖ q_{s,i})
- cross-entropy, arithmetic-mean ensemble p̄_s = mean_i q_{s,i} (the ensemble ensdiag predicts
  with), the same central model, bias and variance (they describe the members, not how they are
  combined):
      mean_s −log p̄_s(y) = −log q°(y)  +  mean_{s,i} KL(q° ‖ q_{s,i})  −  [mean_{s,i} −log q_{s,i}(y) − mean_s −log p̄_s(y)]
  Here the diversity is the members' mean loss minus the ensemble's (Jensen's gap, ≥ 0): it
  depends on the label, as Wood et al. show it must for a combiner that is not the loss's own
  (for cross-entropy that is the normalised geometric mean).
All three hold exactly with the expectations over seeds taken as means over the run's seeds; the
bias includes the label noise, which labels alone cannot separate. Variance is what more
seeds of the same method would average away; diversity is what the members already do.
"""

import torch
import torch.nn.functional as F

from ..checks import test_set_difference

COMBINERS = {"squared": "arithmetic mean of the members' probabilities",
             "cross_entropy": "normalised geometric mean of the members' probabilities",
             "cross_entropy_arithmetic": "arithmetic mean of the members' probabilities"}


def decompose(splits: list) -> dict[str, float]:
    """Each seed's test split (`Examples`, one test set) -> the three decompositions, each with its combiner
    named; the NLLs of p̄_s and of the members are the splits' own (Examples.nll, member_log_likelihood)."""
    log_q, labels = torch.stack([split.log_probs for split in splits]), splits[0].labels  # [S, k, N, C]
    q = log_q.exp()
    onehot = F.one_hot(labels, q.shape[-1]).double()
    central = q.mean(dim=(0, 1))  # [N, C]
    ensemble = q.mean(dim=1)  # [S, N, C]
    squared = {"loss": (onehot - ensemble).pow(2).sum(-1).mean().item(),
               "bias": (onehot - central).pow(2).sum(-1).mean().item(),
               "variance": (q - central).pow(2).sum(-1).mean().item(),
               "diversity": (q - ensemble[:, None]).pow(2).sum(-1).mean().item()}
    log_central = log_q.mean(dim=(0, 1))
    log_central = log_central - torch.logsumexp(log_central, -1, keepdim=True)
    log_ensemble = log_q.mean(dim=1)
    log_ensemble = log_ensemble - torch.logsumexp(log_ensemble, -1, keepdim=True)  # [S, N, C]
    central_q = log_central.exp()

    def kl(log_p, p, log_r):  # KL(p ‖ r) over the last axis
        return (p * (log_p - log_r)).sum(-1)

    cross_entropy = {"loss": -log_ensemble.gather(-1, labels.expand(log_ensemble.shape[0], -1)[..., None]).mean().item(),
                     "bias": -log_central.gather(-1, labels[:, None]).mean().item(),
                     "variance": kl(log_central, central_q, log_q).mean().item(),
                     "diversity": kl(log_ensemble[:, None], log_ensemble.exp()[:, None], log_q).mean().item()}
    member_loss = -torch.stack([split.member_log_likelihood for split in splits]).mean().item()
    arithmetic_loss = torch.stack([split.nll for split in splits]).mean().item()
    arithmetic = {"loss": arithmetic_loss, "bias": cross_entropy["bias"], "variance": cross_entropy["variance"],
                  "diversity": member_loss - arithmetic_loss}
    decompositions = {"squared": squared, "cross_entropy": cross_entropy, "cross_entropy_arithmetic": arithmetic}
    return {name: {**parts, "combiner": COMBINERS[name]} for name, parts in decompositions.items()}


def run_decompositions(runs: dict) -> dict:
    """{method: decomposition} for every method with ≥ 2 seeds and ≥ 2 members on one test set ({method:
    {seed: across.Seed}}); {"reason"} for one whose seeds were measured on different test sets."""
    found = {}
    for method, seeds in runs.items():
        splits = [run.id for run in seeds.values()]
        test_sets = [(split.labels, split.logits.shape[-1]) for split in splits]
        if test_sets and (difference := test_set_difference(test_sets)) is not None:
            found[method] = {"reason": f"its seeds were measured on different test sets ({difference})"}
        elif len(splits) >= 2 and splits[0].members >= 2 and len({split.logits.shape for split in splits}) == 1:
            found[method] = {**decompose(splits), "seeds": len(splits)}
    return found
