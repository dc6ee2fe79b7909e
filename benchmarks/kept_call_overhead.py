"""What a call of a kept program (`_programs.kept_jit`) costs beside `eqx.filter_jit`
on the same small program, whose run takes microseconds: the host's work per call
(BENCHMARKS.md, "A kept program's call").

Three ways, alternated in rounds, the median per call of each:
- `eqx.filter_jit` alone;
- `kept_jit`, its check that the arguments' structure names only jaxattn's classes
  walked at every call (the walk's cache emptied before each call: the code before
  that cache);
- `kept_jit` as it is (the walk cached per treedef).

    python benchmarks/kept_call_overhead.py [--calls 2000] [--rounds 5]
"""

import argparse
import statistics
import tempfile
import time

import equinox as eqx
import jax
import jax.numpy as jnp

import jaxattn as ja
from jaxattn import _programs


def _program(dyn, x, n):
    return x * 2.0 + n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    ja.enable_cache(tempfile.mkdtemp(prefix="jaxattn-overhead-"))
    dyn = ja.random_dynamics(jax.random.key(0), 2, 8)
    x = jnp.ones((4, 8))
    kept, plain = _programs.kept_jit(_program), eqx.filter_jit(_program)

    def walked(*a):
        _programs._ours_structure.cache_clear()
        return kept(*a)

    ways = {"eqx.filter_jit": plain, "kept_jit, walked every call": walked,
            "kept_jit, cached walk": kept}
    times = {name: [] for name in ways}
    for fn in ways.values():
        jax.block_until_ready(fn(dyn, x, 3))
    for _ in range(args.rounds):
        for name, fn in ways.items():
            start = time.perf_counter()
            for _ in range(args.calls):
                fn(dyn, x, 3)
            jax.block_until_ready(fn(dyn, x, 3))
            times[name].append((time.perf_counter() - start) / (args.calls + 1))
    base = statistics.median(times["eqx.filter_jit"])
    print("| way | µs per call (median of rounds) | over eqx.filter_jit |")
    print("|---|---|---|")
    for name, ts in times.items():
        t = statistics.median(ts)
        print(f"| {name} | {t * 1e6:.0f} | {(t - base) * 1e6:+.0f} µs |")


if __name__ == "__main__":
    main()
