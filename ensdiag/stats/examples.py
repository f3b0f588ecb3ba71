"""One split's predictions and what every analyzer reads of them, computed once.

    split = Examples(logits, labels)     # logits [k, N, C] (members first), labels [N] or None
    split["logits"], split["labels"]     # what analyzers and plug-ins always got
    split.nll, split.correct, split.jsd  # per-example quantities [N], float64, made on first use

`analyze_predictions` wraps every split once, and every analyzer and its resampler (the
example-level intervals) read the same object: member log-probabilities, their mean and the
per-example losses are computed once per split, not once per metric. An `Examples` is a dict, so
a plug-in analyzer written against `{"logits", "labels"}` sees no difference.
"""

import math
import weakref
from functools import cached_property

import torch
import torch.nn.functional as F


class Examples(dict):
    """{"logits", "labels"} with cached per-example quantities (natural log, float64).

    `clusters` (or None): the examples are `len / clusters` blocks of the same `clusters` inputs in
    the same order (the pooled shift split: every corruption of the same test images), and a
    bootstrap resamples inputs, each with all its blocks (bootstrap.Draws)."""

    def __init__(self, logits: torch.Tensor, labels: torch.Tensor | None, clusters: int | None = None):
        super().__init__(logits=logits, labels=labels)
        self.clusters = clusters

    @classmethod
    def of(cls, split) -> "Examples":
        """`split` itself when it is one already, else a new one of its logits and labels."""
        return split if isinstance(split, Examples) else cls(split["logits"], split["labels"], split.get("clusters"))

    def without_labels(self) -> "Examples":
        """The same predictions, unlabelled (an OOD split), sharing what is label-free."""
        other = Examples(self["logits"], None, self.clusters)
        for name in LABEL_FREE:
            if name in self.__dict__:
                other.__dict__[name] = self.__dict__[name]
        return other

    def subset(self, members) -> "Examples":
        """The members `members` (indices) as an ensemble of their own (a sub-ensemble), sharing this
        split's member log-probabilities."""
        chosen = list(members)
        other = Examples(self["logits"][chosen], self["labels"], self.clusters)
        other.__dict__["log_probs"] = self.log_probs[chosen]
        return other

    def memo(self, name: str, make):
        """`make()` once per split: a quantity an analyzer derives from these examples (its per-example
        terms), kept for its other statistics and its resampler."""
        key = f"memo:{name}"
        if key not in self.__dict__:
            self.__dict__[key] = make()
        return self.__dict__[key]

    def per_weighting(self, name: str, w, make):
        """`make()` once per weighting w (None or a tensor of counts): what several statistics of one
        weighting share (the ECE's bins behind MCE and the direction, a curve's four areas)."""
        key = f"weighting:{name}"
        held = self.__dict__.get(key)
        if held is not None and (held[0] is None if w is None else held[0] is not None and held[0]() is w):
            return held[1]
        found = make()
        self.__dict__[key] = (None if w is None else weakref.ref(w), found)
        return found

    @property
    def logits(self) -> torch.Tensor:
        return self["logits"]

    @property
    def labels(self) -> torch.Tensor | None:
        return self["labels"]

    @property
    def members(self) -> int:
        return self["logits"].shape[0]

    @property
    def size(self) -> int:
        return self["logits"].shape[1]

    @cached_property
    def log_probs(self) -> torch.Tensor:
        """log p_i [k, N, C]: each member's log-softmax."""
        return F.log_softmax(self["logits"].double(), dim=-1)

    @cached_property
    def log_mean(self) -> torch.Tensor:
        """log p̄ [N, C], stably: logsumexp over members minus log k."""
        return torch.logsumexp(self.log_probs, dim=0) - math.log(self.members)

    @cached_property
    def mean(self) -> torch.Tensor:
        """p̄ [N, C]."""
        return self.log_mean.exp()

    @cached_property
    def confidence(self) -> torch.Tensor:
        """max_c p̄_c [N]."""
        return self.mean.max(dim=1).values

    @cached_property
    def predicted(self) -> torch.Tensor:
        """argmax p̄ [N]."""
        return self.log_mean.argmax(-1)

    @cached_property
    def undefined(self) -> torch.Tensor:
        """[k, N] bool: where a member's softmax is undefined (NaN logits, +inf, or all −inf)."""
        return ~torch.isfinite(self["logits"].amax(-1))

    @cached_property
    def member_predicted(self) -> torch.Tensor:
        """argmax p_i [k, N]."""
        return self["logits"].argmax(-1)

    @cached_property
    def correct(self) -> torch.Tensor:
        """1[argmax p̄ = y] [N]; NaN where p̄ is undefined (its argmax is arbitrary)."""
        right = (self.predicted == self._labelled()).double()
        return right.masked_fill(self.log_mean.isnan().any(-1), math.nan)

    @cached_property
    def nll(self) -> torch.Tensor:
        """−log p̄(y) [N]."""
        return -self.log_mean.gather(1, self._labelled()[:, None]).squeeze(1)

    @cached_property
    def brier(self) -> torch.Tensor:
        """Σ_c (p̄_c − 1[y = c])² [N]."""
        return (self.mean - F.one_hot(self._labelled(), self.mean.shape[1]).double()).pow(2).sum(1)

    @cached_property
    def member_log_likelihood(self) -> torch.Tensor:
        """log p_i(y) [k, N]."""
        labels = self._labelled()
        return self.log_probs.gather(2, labels.expand(self.members, -1)[..., None]).squeeze(-1)

    @cached_property
    def member_errors(self) -> torch.Tensor:
        """1[argmax p_i ≠ y] [k, N]; NaN where member i's prediction is undefined."""
        wrong = (self.member_predicted != self._labelled()).double()
        return wrong.masked_fill(self.undefined, math.nan)

    @cached_property
    def entropy(self) -> torch.Tensor:
        """H(p̄) [N]: total uncertainty."""
        return entropy(self.mean)

    @cached_property
    def expected_entropy(self) -> torch.Tensor:
        """(1/k) Σ_i H(p_i) [N]: aleatoric uncertainty."""
        return entropy(self.log_probs.exp()).mean(0)

    @cached_property
    def jsd(self) -> torch.Tensor:
        """H(p̄) − (1/k) Σ_i H(p_i) [N]: mutual information (epistemic), ≥ 0.

        Clamped at 0 against rounding; examples on which every member gives the same distribution
        get exactly 0, so that 1e-16-sized rounding does not break ties when JSD ranks them."""
        value = (self.entropy - self.expected_entropy).clamp(min=0)
        identical = (self.log_probs == self.log_probs[:1]).all(dim=2).all(dim=0)
        return value.masked_fill(identical, 0.0)

    @cached_property
    def pair_disagreement(self) -> torch.Tensor:
        """The fraction of ordered member pairs i ≠ j that predict different labels [N] (k ≥ 2);
        NaN where some member's prediction is undefined."""
        k, predicted = self.members, self.member_predicted
        agree = sum((predicted == predicted[i]).double().sum(0) for i in range(k))  # ordered pairs, i = j included
        return ((k * k - agree) / (k * (k - 1))).masked_fill(self.undefined.any(0), math.nan)

    def _labelled(self) -> torch.Tensor:
        if self["labels"] is None:
            raise ValueError("this split has no labels")
        return self["labels"]


LABEL_FREE = ("log_probs", "log_mean", "mean", "confidence", "predicted", "undefined", "member_predicted", "entropy",
              "expected_entropy", "jsd", "pair_disagreement")


def entropy(p: torch.Tensor) -> torch.Tensor:
    """−Σ p log p over the last axis, with 0 log 0 = 0."""
    return -torch.special.xlogy(p, p).sum(-1)
