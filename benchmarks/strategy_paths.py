"""Compiled per-call time of 200 layers and 200 RK4 steps at S1's shape on the fused
and general paths (BENCHMARKS.md, "The execution strategies as a family")."""

import json
import time

import diffrax as dfx
import jax
import jax.numpy as jnp

import jaxattn as ja


def best_ms(f, repeats: int = 7) -> float:
    jax.block_until_ready(f())  # compile
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(f())
        best = min(best, time.perf_counter() - start)
    return round(best * 1e3, 2)


def main() -> None:
    dyn = ja.random_dynamics(jax.random.key(0), 2, 3)
    x0 = jax.random.normal(jax.random.key(1), (1000, 10, 3), jnp.float32)
    ts = jnp.linspace(0.0, 2.0, 3)
    out = {}
    for s in ("fused", "general"):
        out[f"layers_{s}"] = best_ms(lambda s=s: ja.run_layers(
            dyn, x0, 200, 0.05, observe=ja.misalignment, strategy=s))
        out[f"rk4_{s}"] = best_ms(lambda s=s: ja.solve_flow(
            dyn, x0, ts, solver=ja.RK4(), dt0=0.01,
            stepsize_controller=dfx.ConstantStepSize(), strategy=s))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
