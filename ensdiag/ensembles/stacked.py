"""One `nn.Module` that computes every member at once — a user's own BatchEnsemble, a
torch-uncertainty routine, a Lightning module — returning logits [k, B, C], or member-major
[k·B, C] when `num_members` says k (as torch-uncertainty's models do).

Its parameters are shared by construction, so they are not the members' weights: the module
declares them with a `member_weights()` method (one {name: tensor} dict of effective weights per
member, e.g. W ∘ r_i s_iᵀ for each BatchEnsemble layer), or the caller passes a function
(`as_ensemble(…, member_weights=…)`). A `member_network(i)` method returning member i as a plain
`nn.Module` adds paths, CKA and alignment. A callable that is no module gives predictions only.
"""

import copy

import torch
from torch import nn

from ..errors import EnsdiagError, InputTypeError
from .base import Ensemble, adapter
from .modules import DECLARE, Member, declared_weights, user_layers

NETWORKS = "declare member_network(i) on your module (member i as a plain nn.Module) for paths, CKA and alignment"


def members_first(logits, k: int | None):
    if not isinstance(logits, torch.Tensor):
        raise InputTypeError(f"the ensemble returned a {type(logits).__name__}, not a logits tensor [k, B, C]")
    if logits.dim() == 2 and k is not None:
        if logits.shape[0] % k:
            raise EnsdiagError(f"the ensemble returned {logits.shape[0]} rows, not a multiple of num_members = {k}")
        return logits.reshape(k, -1, logits.shape[-1])  # member-major [k·B, C]
    if logits.dim() != 3:
        raise EnsdiagError(f"the ensemble returned logits of shape {tuple(logits.shape)}; ensdiag needs logits [k, B, C] "
                           "(members first) — or [k·B, C] member-major with num_members=k, or a list of member "
                           "modules each returning [B, C]")
    return logits


class StackedEnsemble(Ensemble):
    method = "user ensemble"

    def __init__(self, function, num_members=None, member_weights=None, layers=None, modules=()):
        num_members = num_members if num_members is not None else getattr(function, "num_members", None)
        if num_members is not None and (not isinstance(num_members, int) or isinstance(num_members, bool)
                                        or num_members < 1):
            raise InputTypeError(f"num_members must be a positive integer, got {num_members!r}")
        super().__init__(num_members, self._forward_stacked, modules)
        self.function, self.layers = function, layers
        declared = member_weights or getattr(function, "member_weights", None)
        self.declared = declared if callable(declared) else None
        self.weights_skip = None if self.declared else f"one function computes every member: {DECLARE}"
        self.networks_skip = None if callable(getattr(function, "member_network", None)) else NETWORKS

    def _forward_stacked(self, x):
        logits = members_first(self.function(x), self.num_members)
        if self.num_members is None:
            self.num_members = logits.shape[0]
        elif logits.shape[0] != self.num_members:
            raise EnsdiagError(f"the ensemble returned {logits.shape[0]} members, num_members says {self.num_members}")
        return logits

    def _weights(self):
        return declared_weights(self.declared, self.num_members)

    def _network(self, i: int):
        network = self.function.member_network(i)
        if not isinstance(network, nn.Module):
            raise InputTypeError(f"member_network({i}) must return an nn.Module, got {type(network).__name__}")
        return Member(copy.deepcopy(network), user_layers(network, self.layers)).eval()


@adapter("one nn.Module for all members", order=40)
def _one_module(obj, hints):
    if isinstance(obj, nn.Module) and not isinstance(obj, nn.ModuleList):
        return StackedEnsemble(obj, hints.get("num_members"), hints.get("member_weights"), hints.get("layers"), (obj,))
    return None


@adapter("a callable", order=50)
def _callable(obj, hints):
    if callable(obj) and not isinstance(obj, (nn.Module, type)):
        given = hints.get("modules")  # the nn.Module(s) the callable runs, measured in eval mode like any member
        given = () if given is None else (given,) if isinstance(given, nn.Module) else tuple(given)
        if not all(isinstance(module, nn.Module) for module in given):
            raise InputTypeError("modules must be the nn.Module(s) the callable runs")
        ensemble = StackedEnsemble(obj, hints.get("num_members"), hints.get("member_weights"), hints.get("layers"),
                                   given)
        ensemble.method = "user callable"
        return ensemble
    return None
