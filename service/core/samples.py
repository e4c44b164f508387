"""Sample accounting with index ranges, never sample lines.

A range is a half-open `(start, end)` pair of dataset sample indices. A job's state holds
a handful of ranges whatever the dataset's size: its size depends on how fragmented the
pending set is (bounded by the number of batches pending), not on the number of samples.
"""


from collections.abc import Iterable
from fractions import Fraction

Range = tuple[int, int]
Ranges = tuple[Range, ...]

EVAL_BATCHES_KEPT = 5


def count(ranges: Iterable[Range]) -> int:
    return sum(end - start for start, end in ranges)


def train_share(train_prob: float, new_samples: int) -> int:
    """floor(trainProb x new_samples), computed on the decimal value the user wrote.

    Binary floats make 0.29 x 100 = 28.999999999999996; the user wrote 0.29 and expects 29.
    `repr` gives the shortest decimal that round-trips, which is what was written.
    """
    share = Fraction(repr(float(train_prob))) * new_samples
    return max(0, min(new_samples, int(share)))


def split_batch(taken: int, available: int, train_prob: float) -> tuple[Range, Range]:
    """The new batch samples[taken:available] split into (train part, eval part)."""
    train_end = taken + train_share(train_prob, available - taken)
    return (taken, train_end), (train_end, available)


def append(ranges: Ranges, new: Range) -> Ranges:
    """`ranges` followed by `new`, merging `new` into the last range when they touch."""
    start, end = new
    if start >= end:
        return ranges
    if ranges and ranges[-1][1] == start:
        return (*ranges[:-1], (ranges[-1][0], end))
    return (*ranges, new)


def concat(first: Ranges, second: Ranges) -> Ranges:
    """`first` then `second`, in that order (a failed round's samples go back in front)."""
    result = first
    for item in second:
        result = append(result, item)
    return result


def keep_last(batches: Ranges, new: Range, limit: int = EVAL_BATCHES_KEPT) -> Ranges:
    """The eval batches after `new` arrived: the last `limit` batches, empty ones included.

    Batches are never merged: each is one dataset growth step's eval share.
    """
    return (*batches, new)[-limit:]


def indices(ranges: Iterable[Range]) -> list[int]:
    """Every index the ranges cover, in order (for tests and small checks only)."""
    return [i for start, end in ranges for i in range(start, end)]
