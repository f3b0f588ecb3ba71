"""`ensdiag.Tracker`: diversity over training, from any training loop.

    tracker = ensdiag.Tracker(members, val=(x_val, y_val),
                              path="runs/mine/deep-ensemble/seed-0/diversity.jsonl")
    tracker.measure(0)                  # at initialisation
    for epoch in range(1, epochs + 1):
        train_one_epoch(...)
        tracker.measure(epoch)          # one row, also appended to `path`

Rows have the schema of `ensdiag train --track-diversity`'s diversity.jsonl (epoch,
disagreement, jsd, weight_cosine, aligned_weight_cosine, seconds), so `ensdiag report` draws
them beside a saved diagnosis. Measuring leaves training as it was: the members' train/eval
modes are restored and the random state is forked, so a tracked loop trains to the same
weights as an untracked one. Members are any that `ensdiag.diagnose` takes (with
`num_members` and `member_weights` as there); members that share parameter storage without
declared effective weights get no weight cosine (`weights_skipped` says why).
"""

import json
from pathlib import Path

from .core.diagnose import checked_device, preprocessing
from .core.predict import predict_batches
from .data.given import batches
from .ensembles import as_ensemble, measuring
from .errors import EnsdiagError
from .geometry.tracking import DiversityTracker
from .io import MAX_JSON_BYTES, UnreadableJson, atomic_write_text, parse_json, read_bounded


class Tracker:
    def __init__(self, members, val, path=None, normalize=None, device=None, seed: int = 0, num_members=None,
                 member_weights=None, modules=None):
        self.ensemble = as_ensemble(members, num_members=num_members, member_weights=member_weights, modules=modules)
        self.val, self.seed, self.given_normalize = val, seed, normalize
        self.given_device = None if device is None else checked_device(device, self.ensemble)
        self.path = Path(path) if path is not None else None
        self.rows = self._read() if self.path is not None and self.path.exists() else []
        with measuring(self.ensemble, seed=None):  # building plain networks draws random initial weights
            self._rows = DiversityTracker(self.ensemble if self.ensemble.runnable else None)

    @property
    def weights_skipped(self) -> str | None:
        """Why rows carry no weight cosine (members sharing parameter storage, a callable), or None."""
        return getattr(self._rows, "weights_skipped", None)

    def _read(self) -> list[dict]:
        """The rows an earlier (interrupted) loop wrote: a bounded regular file, one JSON object per line."""
        try:
            text = read_bounded(self.path, "diversity record", 64 * MAX_JSON_BYTES).decode("utf-8")
            rows = [parse_json(line, f"line {number}") for number, line in enumerate(text.splitlines(), 1) if line.strip()]
        except (UnreadableJson, UnicodeDecodeError) as error:
            reason = str(error) if isinstance(error, UnreadableJson) else "not UTF-8 text"
            raise EnsdiagError(f"{self.path} is not a diversity record ({reason}); move it away or pass another "
                               "path") from None
        if not all(isinstance(row, dict) and isinstance(row.get("epoch"), int) and not isinstance(row["epoch"], bool)
                   and 0 <= row["epoch"] <= 10**6 for row in rows):
            raise EnsdiagError(f"{self.path} is not a diversity record (rows without an epoch in 0..10⁶)")
        return rows

    def measure(self, epoch: int) -> dict:
        """The row for `epoch` on the validation data, kept in `rows` and written to `path` (a row
        of the same or a later epoch, left by an interrupted loop, is replaced)."""
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise EnsdiagError(f"epoch must be a non-negative integer, got {epoch!r}")
        device = self.given_device or self.ensemble.device  # where the members are now (a loop may move them)
        normalize = preprocessing(self.given_normalize, self.ensemble, device) or (lambda x: x)
        with measuring(self.ensemble, self.seed):
            logits, _, _ = predict_batches(self.ensemble, batches(self.val, "val"), normalize, device, name="val")
            row = self._rows.measure(epoch, logits)
        self.rows = [r for r in self.rows if r["epoch"] < epoch] + [row]
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in self.rows))
        return row
