"""One prepared check of the Pallas kernels on a GPU: tests, a layout sweep, timings, floors.

GPU time is short and rare, so everything a lent GPU should tell about
`strategy="kernel"` runs in one command within a time budget (default 330 s):

    PYTHONPATH=$PWD python benchmarks/gpu_check.py          # on the GPU
    python benchmarks/gpu_check.py --dry-run                # tiny, interpret mode, a CPU

Stages, in order, each recorded in `$OUT/gpu_check.json` (`OUT` from the
environment, default `./gpu_check_out`; rewritten after every stage, so a killed
run leaves what it measured) and printed as it goes:

1. `tests`: `pytest tests/test_pallas*.py` natively (the kernels compiled for the
   GPU against the XLA paths), in a subprocess started before this process takes
   the GPU; skipped in a dry run (CI runs them itself).
2. `env`: JAX, the devices, torch and torchsde if installed.
3. `floors`: the float32 matmul peak, the copy bandwidth, and the exp rate of a
   kernel with its values in registers beside `jnp.exp` over a large array.
4. `sweep`: S1's kernel at each layout (`block` systems per program, Triton warps),
   with fewer layers; the fastest layout is used below.
5. `S1`, `S1L`, `RK4`, `SN`: the kernel against the fused XLA path (and PyTorch /
   torchsde where installed), with the largest difference between them.
6. `MF_flash`: MF's attention (n = 10⁶ tokens in R³) as the Pallas flash kernel
   (`jaxattn._flash`): a layout sweep at n = 2¹⁷ checked against the blocked XLA
   path (values and gradients), then the forward pass and gradient at n = 10⁶
   against the pair floors (the exp floor at the register rate).
7. `MF_forward`, `MF_gradient`: one mean-field layer and its gradient on the blocked
   XLA path (BENCHMARKS.md's MF), as budget allows.

Every case runs in `try`/`except`: an error is recorded with its message and the
check goes on; a case is skipped once the budget is spent.
"""

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
import traceback

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np

import jaxattn as ja
from jaxattn._pallas import use_kernel_config
from jaxattn.bench.device import copy_bandwidth, exp_rate, jax_matmul_peak
from jaxattn.bench.floors import register_exp_rate
from jaxattn.bench.suite import pair_floor
from jaxattn.bench.timing import Timing

SIZES = {  # (full GPU sizes, dry-run sizes)
    "S1": ({"batch": 100_000, "layers": 200}, {"batch": 40, "layers": 3}),
    "S1L": ({"batch": 1_000_000, "layers": 200}, {"batch": 70, "layers": 2}),
    "RK4": ({"batch": 100_000, "steps": 200}, {"batch": 40, "steps": 2}),
    "SN": ({"batch": 1000, "steps": 1000}, {"batch": 20, "steps": 3}),
    "MF": ({"n": 1_000_000}, {"n": 256}),
    "flash_sweep": ({"n": 2**17}, {"n": 40}),
    "sweep": ({"batch": 100_000, "layers": 50}, {"batch": 40, "layers": 2}),
}
LAYOUTS = [("triton", 32, 1), ("triton", 64, 2), ("triton", 128, 4), ("triton", 256, 8),
           ("triton", 64, 1), ("triton", 128, 2), ("triton", 256, 4), ("triton", 512, 8)]
SWEEP_S = 60  # the sweep's share of the budget (each layout compiles its own kernel)
# Flash attention's layouts: (queries, keys) per block and Triton warps.
FLASH_LAYOUTS = [(64, 64, 4), (128, 64, 4), (64, 128, 4), (128, 128, 8), (32, 64, 2)]
DIMS = ((10, 3, 2), (3, 2, 1))  # S1's (n, d, h) on the GPU; in a dry run


class Check:
    """The record: stages with their results or errors, written after each one."""

    def __init__(self, out: str, budget_s: float, dry: bool):
        self.path = os.path.join(out, "gpu_check.json")
        os.makedirs(out, exist_ok=True)
        self.start = time.perf_counter()
        self.budget_s = budget_s
        self.dry = dry
        self.data = {"dry_run": dry, "budget_s": budget_s, "stages": {}}

    def left(self) -> float:
        return self.budget_s - (time.perf_counter() - self.start)

    def run(self, name: str, fn, *, need_s: float = 0.0):
        """Run one stage; its result or error goes into the record."""
        if self.left() < need_s:
            self.record(name, {"skipped": f"budget: {self.left():.0f} s left, "
                                          f"{need_s:.0f} s wanted"})
            return None
        print(f"[{time.perf_counter() - self.start:6.1f} s] {name} ...", flush=True)
        t0 = time.perf_counter()
        try:
            result = fn()
        except Exception as e:  # noqa: BLE001 - every failure is recorded, the check goes on
            result = {"error": f"{type(e).__name__}: {e}"[:2000],
                      "traceback": traceback.format_exc()[-4000:]}
        if isinstance(result, dict):
            result.setdefault("stage_s", time.perf_counter() - t0)
        self.record(name, result)
        print(f"    {_short(result)}", flush=True)
        return result

    def record(self, name, result):
        self.data["stages"][name] = result
        self.data["elapsed_s"] = time.perf_counter() - self.start
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=1, default=_jsonable)
        os.replace(tmp, self.path)


def _jsonable(v):
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    return str(v)


def _short(result) -> str:
    text = json.dumps(result, default=_jsonable)
    return text if len(text) < 400 else text[:400] + " …"


def _size(check: Check, case: str) -> dict:
    return SIZES[case][1 if check.dry else 0]


def _problem(check: Check, batch: int, seed: int = 0):
    """S1's system (bench suite's `Problem`): weights and unit tokens, float32."""
    from jaxattn.bench.suite import Problem
    n, d, h = DIMS[check.dry]
    prob = Problem(n=n, d=d, h=h, batch=batch, causal=False, seed=seed)
    arrays = prob.arrays()
    return prob, arrays, prob.dynamics(arrays), jnp.asarray(arrays["x0"])


def _time(fn, *args, repeats: int = 3):
    """Compile, then the median of `repeats` calls: `(Timing, compile s, output)`."""
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - t0
    timing, out = Timing.run(lambda: jax.block_until_ready(compiled(*args)), repeats)
    return timing, compile_s, out


def _row(timing: Timing, compile_s: float, **extra) -> dict:
    return {"median_s": timing.median, "min_s": timing.min, "max_s": timing.max,
            "calls": timing.calls, "compile_s": compile_s, **extra}


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def stage_env() -> dict:
    info = {"python": platform.python_version(), "jax": jax.__version__,
            "backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()],
            "device_kind": jax.devices()[0].device_kind}
    for name in ("torch", "torchsde", "diffrax"):
        try:
            mod = __import__(name)
            info[name] = getattr(mod, "__version__", "?")
        except ImportError:
            info[name] = None
    return info


def stage_tests(timeout_s: float) -> dict:
    tests = sorted(f for f in os.listdir("tests") if f.startswith("test_pallas"))
    cmd = [sys.executable, "-m", "pytest", *[f"tests/{f}" for f in tests], "-q",
           "-n", "0", "-m", "not slow", "-k", "not dry_run", "-p", "no:cacheprovider"]
    t0 = time.perf_counter()
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired as e:
        text = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) \
            else (e.stdout or "")
        return {"command": " ".join(cmd), "error": f"timed out after {timeout_s:.0f} s",
                "tail": text[-3000:]}
    return {"command": " ".join(cmd), "returncode": proc.returncode,
            "seconds": time.perf_counter() - t0, "tail": (proc.stdout + proc.stderr)[-3000:]}


def stage_floors(dry: bool) -> dict:
    repeats = 3
    out = {"matmul_peak_gflops_f32": jax_matmul_peak(256 if dry else 8192, "float32",
                                                     repeats, 10.0),
           "copy_bandwidth": copy_bandwidth(2**16 if dry else 2**28, repeats),
           "exp_stream_per_s": exp_rate(2**12 if dry else 2**26, repeats)}
    if dry:  # the register kernel in interpret mode, tiny: that it runs, not its rate
        from jaxattn.bench.floors import register_exp_call
        x = jnp.linspace(0.0, 1.0, 4 * 32, dtype=jnp.float32)
        y = jax.jit(register_exp_call(4, 32, 8, interpret=True))(x)
        ref = x
        for _ in range(8):
            ref = jnp.exp(-ref)
        out["register_kernel_rel_diff"] = _rel(y, ref)
        out.update(register_exp_rate(repeats))
    else:
        out.update(register_exp_rate(repeats))
    return out


def _layers_fn(L, strategy, observe=ja.misalignment):
    return lambda dyn, x0: ja.run_layers(dyn, x0, L, 1.0, observe=observe, strategy=strategy)


def stage_sweep(check: Check) -> dict:
    size = _size(check, "sweep")
    _, _, dyn, x0 = _problem(check, size["batch"])
    rows, ref = [], None
    _, _, ref = _time(_layers_fn(size["layers"], "fused"), dyn, x0, repeats=1)
    cap = time.perf_counter() + (1e9 if check.dry else SWEEP_S)
    for backend, block, warps in LAYOUTS[:1] if check.dry else LAYOUTS:
        if check.left() < 30 or time.perf_counter() > cap:
            rows.append({"backend": backend, "block": block, "num_warps": warps,
                         "skipped": "budget"})
            continue
        try:
            with use_kernel_config(backend=backend, block=block, num_warps=warps):
                timing, comp, out = _time(_layers_fn(size["layers"], "kernel"), dyn, x0)
            rows.append(_row(timing, comp, backend=backend, block=block, num_warps=warps,
                             rel_diff_vs_fused=_rel(out, ref)))
        except Exception as e:  # noqa: BLE001
            rows.append({"backend": backend, "block": block, "num_warps": warps,
                         "error": f"{type(e).__name__}: {e}"[:1000]})
        print(f"      {_short(rows[-1])}", flush=True)
    timed = [r for r in rows if "median_s" in r]
    best = min(timed, key=lambda r: r["median_s"]) if timed else None
    return {"size": size, "layouts": rows, "best": best}


def _best_layout(check: Check) -> dict:
    best = (check.data["stages"].get("sweep") or {}).get("best")
    if not best:
        return {"backend": "triton", "block": 128, "num_warps": 4}
    return {k: best[k] for k in ("backend", "block", "num_warps")}


def _versus(check: Check, fn_of, args, strategies=("kernel", "fused"), repeats=3) -> dict:
    """Time `fn_of(strategy)` on each strategy (the kernel at the best layout)."""
    out, results = {}, {}
    for strategy in strategies:
        try:
            with use_kernel_config(**_best_layout(check)):
                timing, comp, res = _time(fn_of(strategy), *args, repeats=repeats)
            results[strategy] = res
            out[strategy] = _row(timing, comp)
        except Exception as e:  # noqa: BLE001
            out[strategy] = {"error": f"{type(e).__name__}: {e}"[:1500]}
    if "kernel" in results and "fused" in results:
        out["rel_diff_kernel_vs_fused"] = _rel(results["kernel"], results["fused"])
        out["speedup_kernel_vs_fused"] = out["fused"]["median_s"] / out["kernel"]["median_s"]
    out["layout"] = _best_layout(check)
    return out, results


def _torch_ref():
    try:
        import torch  # noqa: F401

        from jaxattn.bench import reference_torch
    except ImportError as e:
        return None, f"skipped: {e}"
    return reference_torch, None


def _torch_args(arrays):
    import torch
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    t = {k: torch.tensor(v, device=dev) for k, v in arrays.items()}
    return t["x0"], None, t["P"], t["U"], dev


def _torch_time(fn, repeats=3):
    import torch

    def call():
        out = fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return out
    call()
    return Timing.run(call, repeats)


def stage_layers(check: Check, case: str) -> dict:
    size = _size(check, case)
    prob, arrays, dyn, x0 = _problem(check, size["batch"])
    L = size["layers"]
    out, results = _versus(check, lambda s: _layers_fn(L, s), (dyn, x0))
    flops = L * prob.flops()
    moved = 4 * prob.batch * (prob.n * prob.d + L + 1)
    out.update(size=size, flops=flops, moved_bytes=moved)
    peak = (check.data["stages"].get("floors") or {}).get("matmul_peak_gflops_f32")
    bw = (check.data["stages"].get("floors") or {}).get("copy_bandwidth") or {}
    bandwidth = max((v for k, v in bw.items() if k != "bytes"), default=None)
    if peak:
        out["floor_flops_s"] = flops / (peak * 1e9)
    if bandwidth:
        out["floor_bytes_s"] = moved / (bandwidth * 1e9)
    floor = max(out.get("floor_flops_s") or 0, out.get("floor_bytes_s") or 0)
    if floor and "median_s" in out.get("kernel", {}):
        out["kernel_over_floor"] = out["kernel"]["median_s"] / floor
    ref, why = _torch_ref()
    if ref is None or case != "S1":
        out["torch"] = why or "not run for this case"
        return out
    try:
        xt, Qt, Pt, Ut, dev = _torch_args(arrays)
        timing, E = _torch_time(lambda: ref.run_layers(xt, Qt, Pt, Ut, 1.0, False, 1.0, L))
        out["torch"] = _row(timing, 0.0, device=dev)
        if "kernel" in results:
            out["torch"]["rel_diff_vs_kernel"] = _rel(E.cpu().numpy(), results["kernel"])
            out["speedup_kernel_vs_torch"] = timing.median / out["kernel"]["median_s"]
    except Exception as e:  # noqa: BLE001
        out["torch"] = {"error": f"{type(e).__name__}: {e}"[:1000]}
    return out


def stage_rk4(check: Check) -> dict:
    size = _size(check, "RK4")
    _, _, dyn, x0 = _problem(check, size["batch"])
    steps, T = size["steps"], 10.0
    ts = jnp.linspace(0.0, T, 2)

    def fn_of(strategy):
        return lambda dyn, x0: ja.solve_flow(dyn, x0, ts, solver=ja.RK4(), dt0=T / steps,
                                             stepsize_controller=dfx.ConstantStepSize(),
                                             strategy=strategy)[:, -1]
    out, _ = _versus(check, fn_of, (dyn, x0))
    out["size"] = size
    return out


def stage_noisy(check: Check) -> dict:
    size = _size(check, "SN")
    prob, arrays, dyn, x0 = _problem(check, size["batch"])
    steps, dt, sigma = size["steps"], 0.01, 0.5
    noise, key = ja.TokenNoise(sigma), jax.random.key(0)

    def fn_of(strategy):
        return lambda dyn, x0: ja.run_layers(dyn, x0, steps, dt, observe=ja.misalignment,
                                             noise=noise, key=key, strategy=strategy)[:, -1]
    out, results = _versus(check, fn_of, (dyn, x0))
    out["size"] = size
    # 1,000 systems fill few programs at S1's best layout: small blocks, one warp each.
    out["kernel_small_blocks"] = []
    for block in (() if check.dry or check.left() < 120 else (32, 64)):
        try:
            with use_kernel_config(block=block, num_warps=max(1, block // 64)):
                timing, comp, _ = _time(fn_of("kernel"), dyn, x0)
            out["kernel_small_blocks"].append(_row(timing, comp, block=block))
        except Exception as e:  # noqa: BLE001
            out["kernel_small_blocks"].append({"block": block,
                                               "error": f"{type(e).__name__}: {e}"[:500]})
    for name, res in results.items():
        res = np.asarray(res, np.float64)
        out[f"{name}_final_mean"] = float(res.mean())
        out[f"{name}_final_se"] = float(res.std(ddof=1) / math.sqrt(res.size))
    ref, why = _torch_ref()
    try:
        import torchsde  # noqa: F401
    except ImportError as e:
        ref, why = None, f"skipped: {e}"
    if ref is None:
        out["torchsde"] = why
        return out
    try:
        xt, Qt, Pt, Ut, dev = _torch_args(arrays)
        timing, E = _torch_time(lambda: ref.noisy_euler(xt, Qt, Pt, Ut, 1.0, False, sigma, dt,
                                                        steps), repeats=1)
        E = E.cpu().numpy().astype(np.float64)
        out["torchsde"] = _row(timing, 0.0, device=dev, final_mean=float(E.mean()),
                               final_se=float(E.std(ddof=1) / math.sqrt(E.size)))
        if "median_s" in out.get("kernel", {}):
            out["speedup_kernel_vs_torchsde"] = timing.median / out["kernel"]["median_s"]
            z = (out["kernel_final_mean"] - E.mean()) / math.hypot(out["kernel_final_se"],
                                                                   out["torchsde"]["final_se"])
            out["z_kernel_vs_torchsde"] = float(z)
    except Exception as e:  # noqa: BLE001
        out["torchsde"] = {"error": f"{type(e).__name__}: {e}"[:1000]}
    return out


def stage_mean_field(check: Check, gradient: bool) -> dict:
    n = _size(check, "MF")["n"]
    from jaxattn.bench.suite import Problem
    prob = Problem(n=n, d=3, h=1, batch=1, causal=False)
    arrays = prob.arrays()
    dyn, x0 = prob.dynamics(arrays), jnp.asarray(arrays["x0"][0])
    tau = 0.1

    def forward(dyn, x):
        return dyn.layer(0.0, x, tau)

    def grad(dyn, x):
        import equinox as eqx
        return eqx.filter_grad(lambda dx: forward(*dx)[:, 0].sum())((dyn, x))

    timing, comp, _ = _time(grad if gradient else forward, dyn, x0, repeats=1 if n > 1e5 else 3)
    floors = check.data["stages"].get("floors") or {}
    peak = floors.get("matmul_peak_gflops_f32")
    out = _row(timing, comp, n=n, d=3, blocked=bool(dyn.blocked(n, x0.dtype)),
               path="blocked XLA (jaxattn._blocks)")
    for name in ("exp_register_per_s", "exp_stream_per_s"):
        if peak and floors.get(name):
            floor = pair_floor(float(n) ** 2, 3, gradient, peak, floors[name])
            out[f"floor_with_{name}"] = floor
            out[f"ratio_to_floor_{name}"] = timing.median / floor["floor_s"]
    return out


def _attention_inputs(n: int, seed: int = 0):
    """MF's attention at d = 3, one head: `q = β Pᵀ x`, keys and values the tokens."""
    from jaxattn.bench.suite import Problem
    prob = Problem(n=n, d=3, h=1, batch=1, causal=False, seed=seed)
    arrays = prob.arrays()
    x = jnp.asarray(arrays["x0"][0])
    q = jnp.einsum("hde,id->hie", jnp.asarray(arrays["P"]), x,
                   precision=jax.lax.Precision.HIGHEST)
    return q, x[None], x[None], jnp.zeros((), x.dtype)


def stage_flash(check: Check) -> dict:
    """MF's attention as the Pallas flash kernel: a layout sweep, the blocked XLA path's
    values and gradients at the sweep's size, then n = 10⁶ forward and gradient."""
    from jaxattn._blocks import block_spec, blocked_attention
    from jaxattn._flash import flash_attention
    small = _size(check, "flash_sweep")["n"]
    args = _attention_inputs(small)
    weights = jax.random.normal(jax.random.key(1), args[0].shape[:2] + (3,), args[0].dtype)

    def flash_of(bq, bk, warps):
        return lambda q, k, v, o: flash_attention(q, k, v, o, block_q=bq, block_k=bk,
                                                  num_warps=warps)

    def grad_of(fn):
        return jax.grad(lambda *x: jnp.sum(fn(*x) * weights), argnums=(0, 1, 2))

    spec = block_spec("softmax", small, small, 1, 512)
    blocked = lambda q, k, v, o: blocked_attention(q, k, v, o, None, spec)  # noqa: E731
    t_ref, _, ref = _time(blocked, *args, repeats=1)
    out = {"sweep_n": small, "blocked_forward_s": t_ref.median, "layouts": []}
    layouts = FLASH_LAYOUTS[:1] if check.dry else FLASH_LAYOUTS
    for bq, bk, warps in layouts:
        try:
            timing, comp, res = _time(flash_of(bq, bk, warps), *args)
            out["layouts"].append(_row(timing, comp, block_q=bq, block_k=bk, num_warps=warps,
                                       rel_diff_vs_blocked=_rel(res, ref)))
        except Exception as e:  # noqa: BLE001
            out["layouts"].append({"block_q": bq, "block_k": bk, "num_warps": warps,
                                   "error": f"{type(e).__name__}: {e}"[:1000]})
        print(f"      {_short(out['layouts'][-1])}", flush=True)
    timed = [r for r in out["layouts"] if "median_s" in r]
    if not timed:
        return out
    best = min(timed, key=lambda r: r["median_s"])
    layout = (best["block_q"], best["block_k"], best["num_warps"])
    out["best"] = layout
    _, _, gf = _time(grad_of(flash_of(*layout)), *args, repeats=1)
    _, _, gb = _time(grad_of(blocked), *args, repeats=1)
    out["grad_rel_diff_vs_blocked"] = [_rel(a, b) for a, b in zip(gf, gb)]
    n = _size(check, "MF")["n"]
    big = _attention_inputs(n)
    weights = jax.random.normal(jax.random.key(1), big[0].shape[:2] + (3,), big[0].dtype)
    timing, comp, _ = _time(flash_of(*layout), *big, repeats=1 if n > 1e5 else 3)
    out["forward"] = _row(timing, comp, n=n)
    if check.left() > 40 or check.dry:
        timing, comp, _ = _time(grad_of(flash_of(*layout)), *big, repeats=1 if n > 1e5 else 3)
        out["gradient"] = _row(timing, comp, n=n)
        out["gradient_over_forward"] = out["gradient"]["median_s"] / out["forward"]["median_s"]
    floors = check.data["stages"].get("floors") or {}
    peak, rate = floors.get("matmul_peak_gflops_f32"), floors.get("exp_register_per_s")
    if peak and rate:
        for name, grad in (("forward", False), ("gradient", True)):
            if name in out:
                floor = pair_floor(float(n) ** 2, 3, grad, peak, rate)
                out[name]["floor"] = floor
                out[name]["ratio_to_floor"] = out[name]["median_s"] / floor["floor_s"]
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="tiny sizes, interpret mode on a CPU (what CI runs)")
    parser.add_argument("--budget", type=float, default=330.0, help="seconds in all")
    parser.add_argument("--out", default=os.environ.get("OUT") or "gpu_check_out")
    parser.add_argument("--skip-tests", action="store_true")
    args = parser.parse_args(argv)
    dry = args.dry_run
    check = Check(args.out, args.budget, dry)
    # The tests first, in their own process, before this one starts JAX's backend
    # (which would hold most of the GPU's memory).
    if dry or args.skip_tests:
        check.record("tests", {"skipped": "dry run" if dry else "--skip-tests"})
    else:
        check.run("tests", lambda: stage_tests(min(120.0, check.left() - 200)), need_s=250)
    env = check.run("env", stage_env)
    if not dry and (env or {}).get("backend") != "gpu":
        print("no GPU: the timings below run the kernels in interpret mode", flush=True)
    check.run("floors", lambda: stage_floors(dry), need_s=10)
    check.run("sweep", lambda: stage_sweep(check), need_s=60 if not dry else 0)
    check.run("S1", lambda: stage_layers(check, "S1"), need_s=30 if not dry else 0)
    check.run("SN", lambda: stage_noisy(check), need_s=40 if not dry else 0)
    check.run("RK4", lambda: stage_rk4(check), need_s=30 if not dry else 0)
    check.run("MF_flash", lambda: stage_flash(check), need_s=40 if not dry else 0)
    check.run("S1L", lambda: stage_layers(check, "S1L"), need_s=40 if not dry else 0)
    check.run("MF_forward", lambda: stage_mean_field(check, False), need_s=60 if not dry else 0)
    check.run("MF_gradient", lambda: stage_mean_field(check, True),
              need_s=120 if not dry else 0)
    print(f"done in {time.perf_counter() - check.start:.0f} s: {check.path}", flush=True)
    errors = [k for k, v in check.data["stages"].items() if isinstance(v, dict) and "error" in v]
    if errors:
        print(f"stages with errors: {', '.join(errors)}", flush=True)
    return 1 if dry and errors else 0


if __name__ == "__main__":
    sys.exit(main())
