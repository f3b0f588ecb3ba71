"""The `Ensemble` protocol: what ensdiag needs of any ensemble, whatever the user handed over.

Required: `num_members` and `forward(x [B, …]) -> logits [k, B, C]`. Where the ensemble has them:
`member_weights()`, each member's *effective* weights (one dict of tensors per member: what
weight cosine and the rank of W_i ⊘ W_j compare), and `member_network(i)`, member i as a plain
network of its own (a copy: paths, CKA and alignment change or hook it). What an ensemble lacks
raises `Skip` with the reason, which every output then shows in place of the number.

Adapters (one module each in this package, registered with `@adapter`) build an `Ensemble`
from what users have; `as_ensemble(anything)` tries them in order. An `Ensemble` never owns
the user's modules: it reads them, and `measuring()` puts them in eval mode and forks the
random state for a measurement, restoring both after it. Nothing is moved to another device.
"""

from contextlib import contextmanager

import torch

from ..errors import InputTypeError, Skip
from ..registry import Registry

ADAPTERS = Registry("ensemble adapter")  # name -> function(obj, hints) -> Ensemble | None, tried in `order`


def adapter(name: str, order: int):
    """Register `function(obj, hints) -> Ensemble | None` (None: not this adapter's kind)."""
    return ADAPTERS.register(name, order)


class Ensemble:
    """An ensemble as ensdiag reads it. Adapters fill in what they know; the defaults say "not known"."""

    method = "ensemble"  # what reports call it
    own_weights = False  # members share no weight: alignment by permutation applies
    one_weight_set = False  # all members are one set of weights (single model, MC Dropout)
    rank_one_by_construction = False  # W_i ⊘ W_j is rank 1 by the method's definition (BatchEnsemble)
    spec = None  # an ensdiag ModelSpec, where there is one
    preprocess = None  # (mean, std) per channel the ensemble's inputs are normalised with, where recorded
    model = None  # the ensdiag EnsembleModel, where there is one
    weights_skip = "the members' weights are not known"  # why member_weights() has nothing (None: it has)
    networks_skip = "the members are not networks ensdiag can copy"  # why member_network() has nothing
    runnable = True  # False: weights only (no forward)

    def __init__(self, num_members: int | None, forward, modules=()):
        self.num_members = num_members  # None until the first forward says (a module returning [k, B, C])
        self._forward = forward
        self._modules = tuple(modules)

    def __call__(self, x):
        return self._forward(x)

    def modules(self) -> tuple:
        """The user's `nn.Module`s behind the ensemble (their modes are kept, `measuring`)."""
        return self._modules

    @property
    def device(self) -> torch.device:
        """Where the members' parameters are (the CPU for callables)."""
        for module in self._modules:
            parameter = next(module.parameters(), None)
            if parameter is not None:
                return parameter.device
        return torch.device("cpu")

    def member_weights(self):
        """`MemberWeights`: each member's effective weights, or Skip with the reason."""
        if self.weights_skip:
            raise Skip(self.weights_skip)
        return self._weights()

    def member_network(self, i: int):
        """Member i as a plain network (a copy the caller may change), or Skip with the reason."""
        if self.networks_skip:
            raise Skip(self.networks_skip)
        return self._network(i)

    def untrained_members(self, count: int, seed: int = 0) -> list | None:
        """`count` independently initialised, untrained plain networks of the members' architecture
        (the aligned-cosine null), or None."""
        return None


def as_ensemble(members, **hints) -> Ensemble:
    """An `Ensemble` for anything ensdiag takes: an `Ensemble`, an ensdiag `EnsembleModel`, a list
    of `nn.Module` members, one `nn.Module` returning [k, B, C] (or [k·B, C] with `num_members`),
    a callable returning [k, B, C], or model files. `hints`: `num_members`, `member_weights`
    (a function returning each member's effective weights), `layers` (CKA's modules)."""
    if isinstance(members, Ensemble):
        return members
    for function in ADAPTERS.values():
        found = function(members, hints)
        if found is not None:
            return found
    raise InputTypeError(f"members must be an EnsembleModel, a non-empty list of nn.Modules, one nn.Module returning "
                         f"logits [k, B, C], a callable returning them, or model files; got {type(members).__name__}")


@contextmanager
def measuring(ensemble: Ensemble, seed: int | None = 0):
    """The ensemble's modules in eval mode and the random state forked (and seeded with `seed`):
    afterwards every module's mode and the random state (CPU, CUDA) are what they were.

    A module in training mode is put in eval mode through its own `eval()` (so an override of
    `train()` runs); in a module already in eval mode a submodule left in training mode stays so
    (MC Dropout: `model.eval()`, then dropout switched back on, or torch-uncertainty's `MCDropout`),
    except normalisation layers with running statistics, which never update while measured."""
    modes = [(m, m.training) for module in ensemble.modules() for m in module.modules()]
    with seeded(ensemble, seed):
        try:
            for module in ensemble.modules():
                if module.training:
                    module.eval()
            for m, _ in modes:
                if isinstance(m, torch.nn.modules.batchnorm._NormBase):  # BatchNorm, InstanceNorm: statistics stay
                    m.training = False
            yield
        finally:
            for m, training in modes:
                m.training = training


@contextmanager
def seeded(ensemble: Ensemble | None, seed: int | None):
    """The global random state (the CPU's, and that of the CUDA devices the members are on) forked: what
    runs inside draws from it, and it is as it was afterwards; with exactly the forked generators seeded
    with `seed` where it is not None (never `torch.manual_seed`, which would reseed, or queue a reseed
    of, every CUDA device the user has)."""
    devices = sorted({p.device.index or 0 for module in ensemble.modules() for p in module.parameters()
                      if p.device.type == "cuda"}) if ensemble is not None else []
    with torch.random.fork_rng(devices=devices):
        if seed is not None:
            torch.default_generator.manual_seed(seed)
            for index in devices:
                torch.cuda.default_generators[index].manual_seed(seed)
        yield
