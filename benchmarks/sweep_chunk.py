"""One sweep chunk of `--discrete` instances (T = 2, τ = 0.01: 200 layers), simulated
the vmapped general way and as stacked models under `strategy="auto"` (the fused
path), compiled, best of 3 each, in one process:

    .venv/bin/python benchmarks/sweep_chunk.py thm52-symmetric 1024        # float64
    .venv/bin/python benchmarks/sweep_chunk.py thm52-symmetric 1024 f32    # float32
"""

import sys
import time

import jax

jax.config.update("jax_enable_x64", len(sys.argv) < 4)

import numpy as np  # noqa: E402

from jaxattn.experiments import experiment_config, get_experiment  # noqa: E402
from jaxattn.sweep import _instances, sweep_params  # noqa: E402


def main(name: str, count: int) -> None:
    sizes = {"discrete": True, "horizon": 2.0, "tau": 0.01}
    config = experiment_config(get_experiment(name), sizes, 0) | {"beta": 1.0}
    params, seeds = sweep_params(name), list(range(count))
    best, outs = {}, {}
    for strategy in ("general", "auto"):  # compile both
        _instances.STRATEGY = strategy
        _instances.simulate_chunk(name, config, params, seeds)
    for _ in range(3):
        for strategy in ("general", "auto"):
            _instances.STRATEGY = strategy
            start = time.perf_counter()
            outs[strategy] = _instances.simulate_chunk(name, config, params, seeds)
            best[strategy] = min(best.get(strategy, np.inf), time.perf_counter() - start)
    gap = np.abs(outs["auto"]["E"] - outs["general"]["E"]).max()
    same = all(np.array_equal(outs["auto"][k], outs["general"][k])
               for k in ("in_domain", "reached", "success"))
    dtype = "float64" if jax.config.jax_enable_x64 else "float32"
    print(f"{dtype} {name} --discrete, {count} instances, 200 layers: general "
          f"{best['general']:.3f} s, auto (fused) {best['auto']:.3f} s, ratio "
          f"{best['general'] / best['auto']:.2f}x; max |dE| {gap:.1e}; verdicts equal {same}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
