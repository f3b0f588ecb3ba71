"""Example-level uncertainty: bootstrap draws over test examples, shared by every statistic that resamples them.

A number measured on n test examples carries the sampling error of those examples. Every
interval comes from resampling the examples with replacement (Efron's bootstrap): these are the
draws, and constructions.py builds the intervals from the statistic over them.

    rows = draws("id", n)                        # [R, n] example indices, the same wherever (split, n) is
    counts = counts_of(rows, n)                  # [R, n] how often each example was drawn

**Shared draws.** The indices come from a generator seeded by the split's family and size
(`seed_of`: "id", "ood", "shift" — a corruption shares its family —, "val", "train"), so every
analyzer, every member and every method measured on the same examples resamples them alike:
their draws are paired, and a difference between two of them can be resampled as it is. ID and
OOD examples are drawn separately (a stratified resample: AUROC needs both classes).
"""

import zlib

import torch

from ..budget import memory_budget

RESAMPLES = 1000
MIN_RESAMPLES = 200  # fewer than this and the 2.5th percentile rests on a handful of draws
MAX_DRAWN = 2 * 10**8  # R × n above which fewer resamples are drawn (a 950,000-image shift set)
BLOCK_ENTRIES = 2**22  # counts per block of resamples (32 MiB of float64)
# numbers per chunk where a statistic's resamples are worked on in pieces: 1 MiB of float64, so that each
# piece's temporaries stay in the CPU's cache (about twice as fast as one pass over every resample)
CACHED_ENTRIES = 2**17


def family(split: str) -> str:
    """The examples a split's draws are tied to: "shift/blur" resamples like every corruption of the shift set."""
    return split.split("/", 1)[0]


def seed_of(split: str, n: int) -> int:
    """The generator seed of a split's draws: its family and its size, nothing else."""
    return zlib.crc32(f"{family(split)}/{n}".encode())


def resamples_for(n: int, wanted: int = RESAMPLES) -> int:
    """Resamples drawn for n examples: `wanted`, fewer only where R × n would pass `MAX_DRAWN`
    (and never fewer than `MIN_RESAMPLES` for that reason)."""
    return min(wanted, max(MIN_RESAMPLES, MAX_DRAWN // max(n, 1)))


def block_size(n: int) -> int:
    """Resamples per block so that a block of counts stays near `BLOCK_ENTRIES` numbers."""
    return max(1, BLOCK_ENTRIES // max(n, 1))


def draws(split: str, n: int, resamples: int, start: int = 0, stop: int | None = None) -> torch.Tensor:
    """Rows start..stop of the split's [resamples, n] example indices (int64). Rows are drawn in
    order from one generator, so any block of rows is the same whatever blocks came before."""
    return _Stream(split, n).rows(start, resamples if stop is None else stop)  # the rows before: skipped a block at a time


def blocks(split: str, n: int, resamples: int, seed: int | None = None):
    """(start, indices [b, n]) for every block of the split's draws, in order (`seed`: a stream of the
    caller's instead of the split's, e.g. each lm-eval subtask's own)."""
    size = block_size(n)
    generator = torch.Generator().manual_seed(seed_of(split, n) if seed is None else seed)
    for start in range(0, resamples, size):
        yield start, torch.randint(0, n, (min(size, resamples - start), n), generator=generator)


def counts_of(rows: torch.Tensor, n: int) -> torch.Tensor:
    """[b, n] float64: how often each example was drawn in each resample (counted in bytes, then
    widened: 2-4× faster than counting in int64; exactly where a count passes 255)."""
    counted = byte_counts(rows, n)
    return counted.double() if counted is not None else exact_counts(rows, n)


def exact_counts(rows: torch.Tensor, n: int) -> torch.Tensor:
    """`counts_of` counted in int64 (any count)."""
    offsets = torch.arange(len(rows)).unsqueeze(1) * n
    return torch.bincount((offsets + rows).flatten(), minlength=len(rows) * n).view(len(rows), n).double()


KEPT_ENTRIES = 2**26  # a split's counts are kept for every statistic up to this size (64 MiB: a byte each)
WIDE_BYTES = 2**27  # float64 counts kept for the next statistic, all splits together (each analyzer reads each block)


def byte_counts(rows: torch.Tensor, n: int) -> torch.Tensor | None:
    """`counts_of` as uint8, counted straight into bytes (4× faster than counting in int64 and
    converting); None where a count passed 255. A byte wraps past 255, and a wrapped row no longer
    sums to n (each wrap takes 256 off), so the row sums tell."""
    counts = torch.zeros(len(rows), n, dtype=torch.uint8)
    counts.scatter_add_(1, rows, torch.ones((), dtype=torch.uint8).expand_as(rows))
    if n <= 255:  # no count can pass n
        return counts
    return counts if bool((counts.sum(1, dtype=torch.int64) == n).all()) else None


class _Stream:
    """The rows of one split's generator (`seed_of`), handed out in order: asked for rows start..stop it
    goes on from where it stopped, skipping forward in blocks (never all the skipped rows at once), and
    starts again from the seed only when asked for rows it has passed."""

    def __init__(self, split: str, n: int):
        self.split, self.n, self.generator, self.position = split, n, None, 0

    def rows(self, start: int, stop: int) -> torch.Tensor:
        if self.generator is None or start < self.position:
            self.generator, self.position = torch.Generator().manual_seed(seed_of(self.split, self.n)), 0
        while self.position < start:
            step = min(start - self.position, block_size(self.n))
            torch.randint(0, self.n, (step, self.n), generator=self.generator)
            self.position += step
        found = torch.randint(0, self.n, (stop - start, self.n), generator=self.generator)
        self.position = stop
        return found


class Draws:
    """The bootstrap counts of every split, drawn once for all the statistics that resample it (each
    analyzer, the verdict): rows in order from the split's generator (`seed_of`), so whoever asks
    for resamples start..stop of (split, n) gets the same counts. Kept, a byte per count, up to
    `KEPT_ENTRIES` per split; larger ones are drawn again when asked, the split's stream going on
    from the block it gave last (statistics read a split block after block)."""

    def __init__(self):
        self.kept, self.streams, self.wide, self.wide_bytes = {}, {}, {}, 0

    def counts(self, split: str, n: int, start: int, stop: int, clusters: int | None = None) -> torch.Tensor:
        """[stop − start, n] float64: how often each example was drawn in resamples start..stop−1.
        `clusters`: the n examples are blocks of the same `clusters` inputs (examples.Examples), and
        each input is drawn with all its blocks: its counts repeated per block (the tensor's `inputs`
        says so, for `weighted.weighted_sum`). The float64 counts are kept too, up to `WIDE_BYTES`
        (and a quarter of the memory budget) in all, for the next statistic that reads the same
        block: the callers only read them."""
        key = (family(split), n, start, stop, clusters)
        found = self.wide.get(key)
        if found is not None:
            return found
        if clusters:  # repeated in the kept integers, then widened: a quarter of the bytes moved
            found = self._counts(split, clusters, start, stop).repeat(1, n // clusters).double()
            found.inputs = clusters  # (what weighted.weighted_sum reads: a block's share of the work)
        else:
            found = self._counts(split, n, start, stop).double()
        if self.wide_bytes + 8 * found.numel() <= min(WIDE_BYTES, memory_budget() // 4):
            self.wide[key], self.wide_bytes = found, self.wide_bytes + 8 * found.numel()
        return found

    def _counts(self, split: str, n: int, start: int, stop: int) -> torch.Tensor:
        """`counts` as kept (uint8 or int32), or float64 where not kept."""
        key = (family(split), n)
        found = self.kept.get(key)
        if found is not None and len(found) >= stop:
            return found[start:stop]
        stream = self.streams.setdefault(key, _Stream(split, n))
        if stop * n > KEPT_ENTRIES:
            return counts_of(stream.rows(start, stop), n)
        pieces = [] if found is None else [found]
        for begin in range(len(found) if found is not None else 0, stop, block_size(n)):  # a block's temporaries at a time
            rows = stream.rows(begin, min(begin + block_size(n), stop))
            more = byte_counts(rows, n)
            pieces.append(more if more is not None else exact_counts(rows, n).to(torch.int32))
        if not pieces:  # nothing asked for (stop = 0)
            return torch.zeros(0, n, dtype=torch.float64)
        # a count a byte cannot hold (never in practice: Binomial(n, 1/n) > 255) widens the split's counts
        wide = any(piece.dtype != torch.uint8 for piece in pieces)
        found = torch.cat([piece.to(torch.int32) for piece in pieces]) if wide else torch.cat(pieces)
        self.kept[key] = found
        return found[start:stop]
