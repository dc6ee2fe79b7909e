"""Several processes through `jax.distributed`: `examples/multihost.py` on two local
processes with two CPU devices each equals the single-process unsharded run."""

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

import jaxattn as ja
from jaxattn._process.distributed import free_port

_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "multihost.py"
_ARGS = ["--batch", "6", "--tokens", "5", "--dim", "3", "--heads", "2", "--layers", "12",
         "--tau", "0.2", "--seed", "7"]


def _example():
    spec = importlib.util.spec_from_file_location("multihost_example", _EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_workers(example, out: Path, processes: int = 2, timeout: float = 120, args=_ARGS):
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=2")
    address = f"localhost:{free_port()}"
    procs = [
        subprocess.Popen(
            [sys.executable, str(_EXAMPLE), *args, "--out", str(out), "--coordinator",
             address, "--num-processes", str(processes), "--process-id", str(k)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for k in range(processes)
    ]
    deadline = time.monotonic() + timeout
    logs = []
    try:
        for p in procs:
            try:
                logs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                p.kill()
                logs.append(p.communicate())
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    report = "\n".join(
        f"--- process {k} (exit {p.returncode})\n{o}\n{e[-4000:]}"
        for k, (p, (o, e)) in enumerate(zip(procs, logs, strict=True))
    )
    assert all(p.returncode == 0 for p in procs), report
    return report


@pytest.mark.slow  # two processes
@pytest.mark.parametrize("batch", [6, 8])  # padded, and whole shares (the example's own
def test_two_processes_equal_one(tmp_path, batch):  # 16 failed its finiteness check once)
    example = _example()
    out = tmp_path / "xs.npz"
    argv = ["--batch", str(batch), *_ARGS[2:]]
    report = _run_workers(example, out, args=argv)
    print(report)
    saved = np.load(out)
    assert int(saved["devices"]) == 4 and int(saved["processes"]) == 2
    args = example.parse_args(argv)
    with jax.enable_x64(False):
        dyn, x0 = example.make_problem(args.seed, args.batch, args.tokens, args.dim,
                                       args.heads)
        ref = np.asarray(ja.run_layers(dyn, x0, args.layers, args.tau))
    xs = saved["xs"]
    assert xs.dtype == np.float32 and xs.shape == ref.shape == (batch, 13, 5, 3)
    err = float(np.abs(xs - ref).max())
    print(f"max |multi-process - single-process| = {err:.3g}")
    assert err <= 1e-6


@pytest.mark.slow  # two processes
def test_tokens_split_over_two_processes_equal_one(tmp_path):
    """`shard="tokens"` over hosts: each set's 8 tokens split over 2 processes × 2
    devices, attention passed around the ring across processes."""
    example = _example()
    out = tmp_path / "xs.npz"
    argv = ["--batch", "2", "--tokens", "8", "--dim", "3", "--heads", "2", "--layers", "6",
            "--tau", "0.2", "--seed", "5", "--shard", "tokens"]
    _run_workers(example, out, args=argv)
    args = example.parse_args(argv)
    with jax.enable_x64(False):
        dyn, x0 = example.make_problem(args.seed, args.batch, args.tokens, args.dim,
                                       args.heads)
        ref = np.asarray(ja.run_layers(dyn, x0, args.layers, args.tau))
    xs = np.load(out)["xs"]
    assert xs.shape == ref.shape == (2, 7, 8, 3)
    assert float(np.abs(xs - ref).max()) <= 1e-6
