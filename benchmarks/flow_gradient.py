"""Gradient of the S2 flow (100 RK4 steps) under diffrax's adjoint settings: time
relative to the forward solve and XLA's temporary memory of the compiled gradient.

    .venv/bin/python benchmarks/flow_gradient.py        # ~2 minutes

`ja.solve_flow` passes `adjoint=` and `max_steps=` to diffrax. With the defaults
(`RecursiveCheckpointAdjoint()`, `max_steps=16384`) the checkpoint buffers are sized
by `max_steps`, not by the steps taken; a step count known in advance can be given
as `max_steps`, and `checkpoints=` trades memory for recomputation.
"""

import time

import diffrax as dfx
import jax
import jax.numpy as jnp

import jaxattn as ja
from jaxattn.bench.suite import SIZES

TAU, STEPS = 0.1, 100


def loss_fn(dyn, adjoint, max_steps):
    ts = jnp.array([0.0, STEPS * TAU], jnp.float32)

    def loss(x0):
        xs = ja.solve_flow(dyn, x0, ts, solver=ja.RK4(), dt0=TAU, adjoint=adjoint,
                           stepsize_controller=dfx.ConstantStepSize(), max_steps=max_steps)
        return ja.misalignment(xs[:, -1]).sum()

    return loss


def best(fn, x0, repeats: int = 2) -> tuple[float, int]:
    compiled = jax.jit(fn).lower(x0).compile()
    jax.block_until_ready(compiled(x0))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(compiled(x0))
        times.append(time.perf_counter() - t)
    return min(times), compiled.memory_analysis().temp_size_in_bytes


def main() -> None:
    prob = SIZES["paper_causal"]  # S2
    arrays = prob.arrays()
    dyn, x0 = prob.dynamics(arrays), jnp.asarray(arrays["x0"])
    forward, _ = best(loss_fn(dyn, dfx.RecursiveCheckpointAdjoint(), 16384), x0)
    print(f"S2 flow, {STEPS} RK4 steps, batch {prob.batch}: forward {forward:.2f} s")
    settings = [
        ("default (checkpoints=None, max_steps=16384)", dfx.RecursiveCheckpointAdjoint(), 16384),
        ("max_steps=100", dfx.RecursiveCheckpointAdjoint(), STEPS),
        ("checkpoints=100, max_steps=100", dfx.RecursiveCheckpointAdjoint(checkpoints=STEPS),
         STEPS),
        ("checkpoints=10, max_steps=100", dfx.RecursiveCheckpointAdjoint(checkpoints=10), STEPS),
    ]
    for name, adjoint, max_steps in settings:
        t, mem = best(jax.grad(loss_fn(dyn, adjoint, max_steps)), x0)
        print(f"{name:<46} gradient/forward {t / forward:5.2f}   temp memory {mem / 1e6:7.1f} MB",
              flush=True)


if __name__ == "__main__":
    main()
