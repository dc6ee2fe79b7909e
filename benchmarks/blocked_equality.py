"""Blocked attention against the dense path at n = 4,096: the largest relative
difference of the update `raw_update` (every kernel, mask and head layout) and of
one layer (every norm placement, with a metric W), in float32 and float64.

    .venv/bin/python benchmarks/blocked_equality.py [n]
"""

import sys

import equinox as eqx
import jax
import jax.numpy as jnp

jax.config.update("jax_enable_x64", True)
import jaxattn as ja  # noqa: E402
from jaxattn import _dynamics  # noqa: E402

MASKS = {"full": {}, "causal": {"causal": True}, "window": {"window": 64},
         "mask": {"mask": True}, "causal+window+mask": {"causal": True, "window": 64,
                                                        "mask": True}}


def model(form, kernel, opts, dtype, block_size, n, d=8, h=2, **extra):
    opts = dict(opts)
    if opts.pop("mask", False):
        opts["mask"] = ja.random_mask(jax.random.PRNGKey(3), n, 0.3)
    k = jax.random.split(jax.random.PRNGKey(0), 4)
    U = jax.random.normal(k[0], (h, d, d), dtype) / d
    common = dict(beta=2.0, kernel=kernel, block_size=block_size, **opts, **extra)
    if form == "P":
        P = jax.random.normal(k[1], (h, d, d), dtype) / jnp.sqrt(d)
        return ja.SelfAttentionDynamics(P, U, **common)
    Q = jax.random.normal(k[2], (h, 2, d), dtype) / jnp.sqrt(2.0)
    K = jax.random.normal(k[3], (2, 2, d), dtype) / jnp.sqrt(2.0)
    return ja.SelfAttentionDynamics.from_factors(Q, K, U, **common)


update = eqx.filter_jit(lambda m, x: m.raw_update(0.0, x))
layer = eqx.filter_jit(lambda m, x: m.layer(0.0, x, 0.3))


def rel(a, b):
    return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(a)))


def main(n=4096):
    worst = {}
    for dtype in (jnp.float32, jnp.float64):
        x = jax.random.normal(jax.random.PRNGKey(1), (n, 8), dtype)
        x = x / jnp.linalg.norm(x, axis=-1, keepdims=True)
        for kernel in ("softmax", "sigmoid", "exp"):
            for mname, opts in MASKS.items():
                for form in ("P", "QK"):
                    a = update(model(form, kernel, opts, dtype, 0, n), x)
                    b = update(model(form, kernel, opts, dtype, 512, n), x)
                    e = rel(a, b)
                    worst[dtype.__name__] = max(worst.get(dtype.__name__, 0), e)
                    print(f"{dtype.__name__:8} {kernel:8} {mname:20} {form:3} {e:.1e}", flush=True)
        W = jnp.eye(8, dtype=dtype) + 0.2 * jnp.ones((8, 8), dtype)
        for norm in _dynamics.NORMS:
            a = layer(model("P", "softmax", {}, dtype, 0, n, W=W, norm=norm), x)
            b = layer(model("P", "softmax", {}, dtype, 512, n, W=W, norm=norm), x)
            e = rel(a, b)
            worst[dtype.__name__] = max(worst[dtype.__name__], e)
            print(f"{dtype.__name__:8} layer    norm={norm:15} W   {e:.1e}", flush=True)
    print("largest:", {k: f"{v:.1e}" for k, v in worst.items()})


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4096)
