"""ensdiag's own models (trained, loaded or imported `EnsembleModel`s) and weights-only
ensembles (`RawEnsemble`: foreign tensors no ensdiag architecture runs)."""

from os import PathLike

from ..errors import EnsdiagError
from ..foreign.checkpoints import RawEnsemble, open_ensemble
from ..nn.model import EnsembleModel
from .base import Ensemble, adapter, as_ensemble, seeded


class ModelEnsemble(Ensemble):
    """An `EnsembleModel`: every member's effective weights (BatchEnsemble rebuilt as W ∘ r sᵀ),
    every member as a plain network, the method's facts from its kit."""

    weights_skip = None
    networks_skip = None

    def __init__(self, model):
        super().__init__(model.num_members, model, (model,))
        self.model, self.spec, self.method = model, model.spec, model.method
        kit = model.kit
        self.own_weights, self.one_weight_set = kit.own_weights, kit.one_weight_set
        self.rank_one_by_construction = getattr(kit, "rank_one_by_construction", False)
        self.preprocess = getattr(model, "preprocess", None)  # what the model file records (checkpoint.py)
        if self.one_weight_set or model.num_members < 2:
            self.networks_skip = "one set of weights shared by all members (single model / MC Dropout)"

    def _weights(self):
        return self.model.member_weights()

    def _network(self, i: int):
        return self.model.member_network(i).eval()

    def untrained_members(self, count: int, seed: int = 0) -> list:
        biases = self.model.member_state_dict(0)  # the trained members' tensors, so both compare the same keys
        with seeded(self, seed):  # plain networks initialise on the model's device
            return [self.model.plain_network(biases_of=biases).eval() for _ in range(count)]


class WeightsOnly(Ensemble):
    """Member tensors without a runnable architecture: weight cosine and rank only."""

    weights_skip = None
    runnable = False

    def __init__(self, raw):
        super().__init__(len(raw.member_tensors), None)
        self.raw, self.method, self.reason = raw, "unknown", raw.reason
        self.networks_skip = raw.reason

    def __call__(self, x):
        raise EnsdiagError(f"{self.raw.source}: {self.reason}: these members cannot be run")

    def _weights(self):
        return self.raw.member_weights()


@adapter("ensdiag model", order=10)
def _ensdiag_model(obj, hints):
    if isinstance(obj, EnsembleModel):
        return ModelEnsemble(obj)
    if isinstance(obj, RawEnsemble):
        return WeightsOnly(obj)
    return None


@adapter("model files", order=20)
def _model_files(obj, hints):
    """A path (or list of paths): an ensdiag model file or foreign checkpoints (`ensdiag import`'s)."""
    paths = [obj] if isinstance(obj, (str, PathLike)) else obj
    if not isinstance(paths, (list, tuple)) or not paths or not all(isinstance(p, (str, PathLike)) for p in paths):
        return None
    return as_ensemble(open_ensemble(paths, raw_ok=True, num_classes=hints.get("num_classes")))
