"""A curve over save times read as a staircase: its plateaus and the jumps between
them (the energy or the cluster count of a metastable flow)."""

from typing import NamedTuple

import numpy as np

from .._validate import refuse_first


class Staircase(NamedTuple):
    """Plateaus and jumps of a curve over save times (`plateaus`)."""

    #: `(k,)` first and last save time of each plateau
    starts: np.ndarray
    ends: np.ndarray
    #: `(k,)` the value on each plateau (its median)
    levels: np.ndarray
    #: `(k − 1,)` each jump's time: the geometric mean of the saves it spans
    jumps: np.ndarray


def plateaus(ts, values, jump: float) -> Staircase:
    """Split a curve into plateaus and the jumps between them, on the host.

    A jump is a run of consecutive save intervals over which the curve moves by more
    than `jump`; the saves between two jumps are a plateau (a plateau of one save
    counts). Infinite times (after an event) and non-finite values are dropped first.

    **Arguments:**

    - `ts`: the save times `(T,)`, increasing, positive where a log axis reads them.
    - `values`: the curve at those times `(T,)`.
    - `jump`: the smallest change between two saves that is part of a jump, `> 0`.

    **Returns:**

    A `Staircase`.
    """
    ts, values = np.asarray(ts, float), np.asarray(values, float)
    same = ts.ndim == 1 and ts.shape == values.shape
    keep = np.isfinite(ts) & np.isfinite(values) if same else np.zeros(0, bool)
    refuse_first((
        (not same, f"plateaus needs `ts` and `values` of one shape (T,), got {ts.shape} and "
                   f"{values.shape}."),
        (not jump > 0, f"`jump` must be > 0, got {jump!r}."),
        (not keep.any(), "plateaus needs at least one finite save."),
        (same and np.any(np.diff(ts[keep]) <= 0),
         "plateaus needs increasing save times `ts` (sort the saves by time first)."),
    ))
    ts, values = ts[keep], values[keep]
    moving = np.abs(np.diff(values)) > jump
    cuts = np.flatnonzero(np.diff(np.concatenate([[0], moving.astype(int), [0]])))
    rises, falls = cuts[::2], cuts[1::2]  # jump k spans saves rises[k] … falls[k]
    first = np.concatenate([[0], falls])
    last = np.concatenate([rises, [len(ts) - 1]])
    levels = np.array([np.median(values[a:b + 1]) for a, b in zip(first, last)])
    mids = np.sqrt(np.abs(ts[rises] * ts[falls]))
    return Staircase(ts[first], ts[last], levels, mids)
