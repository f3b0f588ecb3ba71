"""`checkpoint-ensemble`: k checkpoints of one ordinary training run as the members.

The network trains with the run's own schedule (optimizer, milestones); after the epochs
round(E·(c+1)/k), c = 0..k−1, its state is stored as member c, so the last member is the final
network and the others are evenly spaced points of the same trajectory. It is the cheapest
ensemble one can have from a run that exists anyway, and the natural lower bound for how
different procedural members are: the diagnostics show how far one trajectory travels. The
layers and the capturing hook are the snapshot ensemble's (snapshot_ensemble.py); only the
learning-rate schedule differs.
"""

from ..kit import register_method
from .snapshot_ensemble import _CapturingKit


@register_method("checkpoint-ensemble")
class CheckpointEnsembleKit(_CapturingKit):
    label = "Checkpoint Ensemble"
    order = 61
