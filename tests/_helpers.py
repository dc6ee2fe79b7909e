"""Random problems shared by the core tests (distinct sizes so swapped axes fail),
a runner for scripts that need several (forced CPU) devices, and the comparison of
two programs' values."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jaxattn as ja


def random_spd(key, d, spread=0.5):
    A = jax.random.normal(key, (d, d))
    Qm, _ = jnp.linalg.qr(A)
    lam = jnp.exp(spread * jax.random.uniform(key, (d,), minval=-1, maxval=1))
    return (Qm * lam[None, :]) @ Qm.T


def random_dynamics(key, h=2, d=3, *, W=False, causal=False, scale=0.5, beta=1.0):
    kP, kU, kW = jax.random.split(key, 3)
    P = scale * jax.random.normal(kP, (h, d, d))
    U = scale * jax.random.normal(kU, (h, d, d))
    Wm = random_spd(kW, d) if W else None
    return ja.SelfAttentionDynamics(P, U, W=Wm, beta=beta, causal=causal)


def random_tokens(key, n, d, W=None, batch=()):
    keys = jax.random.split(key, max(1, int(jnp.prod(jnp.asarray(batch))) if batch else 1))
    xs = jax.vmap(lambda k: ja.sample_ellipsoid(k, n, d, W))(keys)
    return xs.reshape(tuple(batch) + (n, d)) if batch else xs[0]


def run_on_forced_devices(script: str, timeout: float) -> dict:
    """Run `script` in a fresh Python with 4 forced CPU devices (the flag must be set
    before JAX starts); it prints one JSON object, with `"devices"`, last."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "rematerialization" not in out.stderr, out.stderr[-4000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["devices"] == 4
    return res


def assert_same_values(actual, desired, *, ulps: int = 4):
    """Values that two different programs compute the same way: bit for bit on the
    CPU, where XLA compiles both alike. A GPU fuses programs of other shapes
    differently (another order of addition), so there they agree to `ulps` units in
    the last place of the array's largest entry (measured on an H100: 1–2)."""
    actual, desired = np.asarray(actual), np.asarray(desired)
    if jax.default_backend() == "cpu":
        np.testing.assert_array_equal(actual, desired)
        return
    scale = np.max(np.abs(desired), initial=0.0)
    np.testing.assert_allclose(actual, desired, rtol=0,
                               atol=ulps * np.finfo(desired.dtype).eps * scale)
