"""Diversity over training (`ensdiag train --track-diversity`): one row per epoch, 0 = initialisation.

Each row holds, on the validation split, the members' mean pairwise disagreement and mean JSD,
and the mean off-diagonal cosine of their weights, raw and (for members that own their
weights, on an architecture with a permutation rule) after weight matching to member 0.
The per-epoch rows reuse the logits the epoch's validation already computed, and the
initial one runs with the random state forked, so a tracked run trains to exactly the
weights of an untracked one. `seconds` is what the row cost to measure; the report's figure
states it as a share of the epochs' time, and `ensdiag bench --tracking` measures it.
"""

import time
from contextlib import suppress

import torch

from ..ensembles import as_ensemble
from ..errors import EnsdiagError, Skip
from ..stats import metrics as M
from ..stats.examples import Examples
from .align import align_networks, permutation_groups

MAX_ALIGNED_MEMBERS = 64  # as member geometry: beyond it, no aligned cosine


class DiversityTracker:
    def __init__(self, ensemble):
        """`ensemble`: anything `ensembles.as_ensemble` takes (None: predictions only, no weight cosine)."""
        self.model = as_ensemble(ensemble) if ensemble is not None else None
        self.groups = None
        model = self.model
        if model is not None and model.own_weights and 1 < (model.num_members or 0) <= MAX_ALIGNED_MEMBERS:
            try:
                with torch.random.fork_rng(devices=[]):  # building a plain network initialises layers
                    self.groups = permutation_groups(model.member_network(0))
            except (EnsdiagError, Skip):  # no permutation rule, or no plain networks: raw cosine only
                self.groups = None

    def _weights(self):
        try:
            return self.model.member_weights() if self.model is not None else []
        except Skip as reason:  # shared storage without declared weights: no weight cosine
            self.weights_skipped = str(reason)
            return []

    @torch.no_grad()
    def measure(self, epoch: int, logits: torch.Tensor) -> dict:
        """The row for `epoch` from the validation logits [k, N, C] of the model as it is now."""
        began = time.perf_counter()
        logits = logits.float()
        row = {"epoch": epoch, "disagreement": None, "jsd": None, "weight_cosine": None, "aligned_weight_cosine": None}
        if logits.shape[0] > 1 and logits.shape[1] > 0:
            row["disagreement"] = M.mean_off_diagonal(M.disagreement_matrix(logits))
            row["jsd"] = float(Examples(logits, None).jsd.mean())
        weights = self._weights()
        if len(weights) > 1:
            row["weight_cosine"] = M.mean_off_diagonal(M.weight_cosine(weights)[0])
            if self.groups is not None:
                with torch.random.fork_rng(devices=[]):  # member_network initialises layers before loading weights
                    networks = [self.model.member_network(i) for i in range(self.model.num_members)]
                with suppress(EnsdiagError):  # non-finite weights: none
                    row["aligned_weight_cosine"] = M.mean_off_diagonal(align_networks(networks)[2]["aligned"][0])
        row = {key: (None if isinstance(value, float) and value != value else value) for key, value in row.items()}
        row["seconds"] = time.perf_counter() - began
        return row
