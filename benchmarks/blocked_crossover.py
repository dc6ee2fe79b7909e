"""Dense against blocked attention: the measurement behind `DENSE_LIMIT`.

Time of one layer (`dyn.layer`) and of its gradient (a scalar of the layer, with
respect to the tokens and the weights) for n = 128 … 4096, h ∈ {1, 4}, d ∈ {3, 16},
float32: the dense path (`block_size=None`) against `block_size=512`. So that the
dense path can be timed above the limit too, the script lifts
`jaxattn._dynamics.DENSE_LIMIT` for its own run; the `auto` column says which path
`block_size=None` takes at the real limit. Best of 3 calls after compilation
(`jaxattn.bench.timing.time_jax`).

    .venv/bin/python benchmarks/blocked_crossover.py
"""

import math

import equinox as eqx
import jax
import jax.numpy as jnp

import jaxattn as ja
from jaxattn import _dynamics
from jaxattn.bench.timing import time_jax

SIZES = (128, 256, 512, 1024, 2048, 4096)
LIMIT = _dynamics.DENSE_LIMIT


def seconds(dyn, x, gradient: bool) -> float:
    def layer(dyn, x):
        return dyn.layer(0.0, x, 0.1)

    def grad(dyn, x):
        return eqx.filter_grad(lambda dx: layer(*dx)[:, 0].sum())((dyn, x))

    return time_jax(grad if gradient else layer, dyn, x, repeats=3)[0].min


def main() -> None:
    _dynamics.DENSE_LIMIT = math.inf
    print(f"DENSE_LIMIT {LIMIT} bytes; times in ms (best of 3); ratio = dense / blocked")
    print("   n  h   d  auto     fwd dense  blocked  ratio    grad dense  blocked  ratio")
    for h in (1, 4):
        for d in (3, 16):
            kP, kU, kx = jax.random.split(jax.random.PRNGKey(0), 3)
            P = jax.random.normal(kP, (h, d, d), jnp.float32) / d
            U = jax.random.normal(kU, (h, d, d), jnp.float32) / math.sqrt(d)
            for n in SIZES:
                x = jax.random.normal(kx, (n, d), jnp.float32)
                x = x / jnp.linalg.norm(x, axis=-1, keepdims=True)
                dense = ja.SelfAttentionDynamics(P, U)
                blocked = ja.SelfAttentionDynamics(P, U, block_size=512)
                auto = "blocks" if h * n * n * 4 > LIMIT else "dense"
                t = {(path, g): 1e3 * seconds(dyn, x, g)
                     for path, dyn in (("dense", dense), ("blocked", blocked))
                     for g in (False, True)}
                print(f"{n:4d} {h:2d} {d:3d}  {auto:6}" + "".join(
                    f"  {t['dense', g]:10.2f} {t['blocked', g]:8.2f} "
                    f"{t['dense', g] / t['blocked', g]:6.2f}" for g in (False, True)),
                    flush=True)


if __name__ == "__main__":
    main()
