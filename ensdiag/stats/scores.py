"""Per-sample uncertainty scores for OOD detection (pure functions over member logits [k, N, C]).

Every score is an uncertainty score: higher means more likely OOD. The ones over probabilities
(1 − MSP, entropy, mutual information) live in metrics.py; these read the logits themselves or
the members' votes.
"""

import math

import torch

from .examples import Examples


def energy(logits, temperature: float = 1.0) -> torch.Tensor:
    """The free energy E(x) = −T · logsumexp_c(z̄_c / T) (Liu et al. 2020) of the mean logits z̄:
    low (very negative) on confident inputs, so it is an uncertainty score as it stands."""
    return -temperature * torch.logsumexp(logits.double().mean(0) / temperature, dim=-1)


def max_logit(logits) -> torch.Tensor:
    """−max_c z̄_c (Hendrycks et al. 2022), on the mean logits z̄ (float64)."""
    return -logits.double().mean(0).max(dim=-1).values


def variation_ratio(logits) -> torch.Tensor:
    """1 − (votes for the modal class) / k: the fraction of members that do not vote with the
    majority (Freeman 1965). 0 when all agree; NaN on a sample where some member's vote is undefined."""
    k, _, classes = logits.shape
    votes = torch.nn.functional.one_hot(logits.argmax(-1), classes).sum(0)  # [N, C]
    ratio = 1 - votes.max(dim=-1).values.double() / k
    return ratio.masked_fill(Examples(logits, None).undefined.any(0), math.nan)
