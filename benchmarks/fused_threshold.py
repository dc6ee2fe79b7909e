"""Where the fused ensemble path stops paying: `run_layers` on the fused and the
general path (`strategy=`) over growing systems, batches of equal total work.

`strategy="auto"` fuses a batch when one sequence's raw update costs at most
`jaxattn._strategy.FUSED_MAX_FLOPS`; this script is the measurement behind it.
CPU time of the process (`time.process_time`, best of 3 after compilation), which
is steadier than wall time on a shared machine.

    .venv/bin/python benchmarks/fused_threshold.py
"""

import time

import jax
import numpy as np

import jaxattn as ja
from jaxattn._strategy import FUSED_MAX_FLOPS, sequence_flops

SHAPES = [(10, 3, 2), (16, 4, 2), (16, 8, 2), (32, 8, 4), (32, 16, 4), (64, 16, 4), (64, 32, 8)]


def best_cpu_seconds(fn, *args, repeats: int = 3) -> float:
    compiled = jax.jit(fn).lower(*args).compile()
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(repeats):
        start = time.process_time()
        jax.block_until_ready(compiled(*args))
        times.append(time.process_time() - start)
    return min(times)


def main() -> None:
    key = jax.random.PRNGKey(0)
    print(f"auto fuses up to {FUSED_MAX_FLOPS} flops per sequence")
    for n, d, h in SHAPES:
        flops = sequence_flops(h, n, d)
        batch = int(min(4000, max(16, 4e8 / flops / 20)))
        dyn = ja.SelfAttentionDynamics(jax.random.normal(key, (h, d, d)) / d,
                                       jax.random.normal(key, (h, d, d)) / np.sqrt(d))
        x0 = jax.random.normal(key, (batch, n, d))
        t = {s: best_cpu_seconds(
            lambda dyn, x, s=s: ja.run_layers(dyn, x, 20, 0.1, strategy=s,
                                              observe=ja.misalignment), dyn, x0)
             for s in ("general", "fused")}
        print(f"n={n:3d} d={d:3d} h={h}  flops/sequence {flops:8d}  batch {batch:5d}  "
              f"general {1e3 * t['general']:7.1f} ms  fused {1e3 * t['fused']:7.1f} ms  "
              f"fused speed-up {t['general'] / t['fused']:.2f}×", flush=True)


if __name__ == "__main__":
    main()
