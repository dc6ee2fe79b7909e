"""How the benchmarks time a figure: compile ahead of time, call once untimed, then
the median of repeated calls (with min and max), fewer calls where a time budget would
be passed."""

import dataclasses
import math
import statistics
import time
from collections.abc import Callable

import jax
import numpy as np


@dataclasses.dataclass
class Timing:
    """Seconds per call: median, min and max over the timed calls."""

    median: float
    min: float
    max: float
    calls: int = 1

    @classmethod
    def run(cls, fn: Callable[[], object], repeats: int,
            budget_s: float = math.inf) -> tuple["Timing", object]:
        """Time `repeats` calls of `fn` after one untimed call, or fewer: no call is
        started that would, at the mean time per call so far (the untimed one
        included), take the total past `budget_s`. The untimed call is the figure only
        where the budget allows no other (a program's first execution also makes its
        kernels: about 10× a later call of a millisecond program on the CPU). Also
        returns the last call's output."""
        t0 = time.perf_counter()
        out = fn()
        spent, times = [time.perf_counter() - t0], []
        while cls.another(spent, repeats + 1, budget_s):
            t0 = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - t0)
            spent.append(times[-1])
        return cls.of_times(times or spent), out

    @staticmethod
    def another(times: list[float], repeats: int, budget_s: float) -> bool:
        """Whether to time one more call after `times`: fewer than `repeats` so far,
        and the next one, at the mean so far, keeps the total within `budget_s`."""
        return len(times) < repeats and (
            not times or sum(times) * (1 + 1 / len(times)) <= budget_s
        )

    @classmethod
    def of_times(cls, times: list[float]) -> "Timing":
        return cls(statistics.median(times), min(times), max(times), len(times))

    @classmethod
    def of(cls, fn: Callable[[], object], repeats: int, budget_s: float = math.inf) -> "Timing":
        return cls.run(fn, repeats, budget_s)[0]


def repeats_refusal(repeats) -> tuple[bool, str]:
    """`refuse_first`'s row for a benchmark's `repeats`: a whole number ≥ 1 (0 left no
    call to take a median of, after the work)."""
    return (isinstance(repeats, bool) or not isinstance(repeats, int | np.integer)
            or repeats < 1, f"`repeats` must be a whole number ≥ 1, got {repeats!r}.")


def compile_jax(fn: Callable, *args):
    """Compile `jax.jit(fn)` for `args`: the executable, compile seconds, memory bytes."""
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    seconds = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    nbytes = None if mem is None else (
        mem.temp_size_in_bytes + mem.argument_size_in_bytes + mem.output_size_in_bytes)
    return compiled, seconds, nbytes


def time_jax(fn: Callable, *args, repeats: int, budget_s: float = math.inf):
    """Compile ahead of time, then time the executable (`Timing.run`: after one
    untimed call)."""
    compiled, compile_s, nbytes = compile_jax(fn, *args)
    timing, out = Timing.run(lambda: jax.block_until_ready(compiled(*args)), repeats, budget_s)
    return timing, compile_s, nbytes, out


@dataclasses.dataclass(frozen=True)
class Repeats:
    """How long to time one figure: `count` calls, fewer where another call would
    take the figure past `budget_s` seconds (always at least one)."""

    count: int
    budget_s: float = math.inf

    def time(self, fn: Callable[[], object]) -> tuple[Timing, object]:
        return Timing.run(fn, self.count, self.budget_s)

    def time_jax(self, fn: Callable, *args):
        return time_jax(fn, *args, repeats=self.count, budget_s=self.budget_s)
