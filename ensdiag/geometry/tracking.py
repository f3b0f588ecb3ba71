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

import torch

from ..analysis import metrics as M


MAX_ALIGNED_MEMBERS = 64  # as member geometry: beyond it, no aligned cosine


class DiversityTracker:
    def __init__(self, model, seed: int = 0):
        self.model, self.seed = model, seed  # model None: predictions only (no weight cosine)
        self.groups = None
        if model is not None and model.kit.own_weights and 1 < model.num_members <= MAX_ALIGNED_MEMBERS:
            from ..errors import EnsdiagError
            from .align import permutation_groups
            try:
                with torch.random.fork_rng(devices=[]):  # building a plain network initialises layers
                    self.groups = permutation_groups(model.member_network(0))
            except EnsdiagError:  # an architecture without a permutation rule: raw cosine only
                self.groups = None

    def _aligned_cosine(self):
        from .align import align_to_first, all_finite
        with torch.random.fork_rng(devices=[]):  # member_network initialises layers before loading weights
            states = [{key: value.detach() for key, value in self.model.member_network(i).state_dict().items()}
                      for i in range(self.model.num_members)]
        if not all_finite(states):
            return None
        aligned = align_to_first(states, self.groups, self.seed)
        keys = [key for key in states[0] if key.endswith((".weight", ".bias")) and key.removeprefix("body.")
                in self._weight_names]
        overall, _ = M.weight_cosine([{key: state[key] for key in keys} for state in aligned])
        return M.mean_off_diagonal(overall)

    @torch.no_grad()
    def measure(self, epoch: int, logits: torch.Tensor) -> dict:
        """The row for `epoch` from the validation logits [k, N, C] of the model as it is now."""
        began = time.perf_counter()
        logits = logits.float()
        row = {"epoch": epoch, "disagreement": None, "jsd": None, "weight_cosine": None, "aligned_weight_cosine": None}
        if logits.shape[0] > 1 and logits.shape[1] > 0:
            row["disagreement"] = M.mean_off_diagonal(M.disagreement_matrix(logits))
            row["jsd"] = float(M.jsd(logits).mean())
        weights = self.model.member_weights() if self.model is not None else []
        if len(weights) > 1:
            self._weight_names = set(weights[0])
            row["weight_cosine"] = M.mean_off_diagonal(M.weight_cosine(weights)[0])
            if self.groups is not None:
                row["aligned_weight_cosine"] = self._aligned_cosine()
        row = {key: (None if isinstance(value, float) and value != value else value) for key, value in row.items()}
        row["seconds"] = time.perf_counter() - began
        return row
