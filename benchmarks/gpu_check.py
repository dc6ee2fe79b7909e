"""One prepared check of the Pallas kernels on a GPU: timings, a layout sweep, floors.

GPU time is short and rare, so everything a lent GPU should tell about
`strategy="kernel"` and the flash kernel runs in one command within a time budget
(default 290 s, compiles included):

    PYTHONPATH=$PWD python benchmarks/gpu_check.py          # on the GPU
    PYTHONPATH=$PWD python benchmarks/gpu_check.py --stages tests,env,S1
    python benchmarks/gpu_check.py --dry-run                # tiny, interpret mode, a CPU

Stages (`--stages` picks and orders them, by name or by the short name in brackets;
the default order puts first what runs 1 and 2 on an H100 did not measure), each
recorded in `$OUT/gpu_check.json` under its short name (`LABELS`; `OUT` from the
environment, default `./gpu_check_out`; rewritten after every stage, so a killed
run leaves what it measured) and printed as it goes:

- `tests` (only when named): `pytest tests/test_pallas*.py` natively, in a subprocess
  started before this process takes the GPU.
- `env`: JAX, the devices, torch and torchsde if installed.
- `floors`: the float32 matmul peak, the copy bandwidth, and the exp rate of a kernel
  with its values in registers beside `jnp.exp` over a large array.
- `meanfield_flash` (`MF_flash`): MF's attention (n = 10⁶ tokens in R³) as the Pallas
  flash kernel (`jaxattn._pallas.flash`): a layout sweep at n = 2¹⁷ checked against
  the blocked XLA path (values and gradients), then the forward pass and gradient at
  n = 10⁶ against the pair floors (the exp floor at the register rate).
- `small_systems_large_batch` (`S1L`), `small_systems_rk4` (`RK4`): the kernel (at
  S1's best layout so far, else run 1's 32 systems per program and one warp) against
  the fused XLA path. The verdict on their values (and S1's) is `law`: each path
  against float64 on `LAW_SAMPLE` systems (`jaxattn.bench.agreement`), since over 10⁶
  systems the largest difference between any two float32 programs is O(1)
  (`rel_diff_kernel_vs_fused`, kept beside it, is not a verdict for many-layer runs).
- `meanfield_forward` (`MF_forward`), `meanfield_gradient` (`MF_gradient`): one
  mean-field layer of the dynamics and its gradient (BENCHMARKS.md's MF) as shipped:
  on a GPU its blocked attention is the flash kernel (`jaxattn._blocks.use_flash`),
  where BENCHMARKS.md's 22.0 s ran the XLA sweep.
- `meanfield_wide` (`MF_wide`): one layer at d = 128 (n = 2¹⁷, the XLA sweep: past
  `FLASH_MAX_DIM`) against the float32 peak's floor (the target: within 3×).
- `small_systems` (`S1`): the kernel at each layout (`block` systems per program,
  Triton warps) at S1's own size while the budget lasts: the fastest is S1's kernel
  row (no second compile) and the layout later stages take; the fused XLA path and
  PyTorch.
- `noisy_small_systems` (`SN`): the noisy layers, kernel against fused and torchsde
  (in law).

Every compile is timed apart from the calls (`compile_s` per row, and all of them
in the record's `compile_s`). Every case runs in `try`/`except`: an error is
recorded with its message and the check goes on; a stage is skipped once the
budget left is below what its compiles need (`NEED_S`), and on a GPU a stage still
running when the budget ends is abandoned (recorded) and the check exits: the
budget bounds the wall time, compiles included.
"""

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import threading
import time
import traceback

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np

import jaxattn as ja
from jaxattn._pallas import use_kernel_config
from jaxattn.bench.agreement import agreement_in_law
from jaxattn.bench.device import copy_bandwidth, exp_rate, jax_matmul_peak
from jaxattn.bench.floors import register_exp_rate
from jaxattn.bench.suite import CASES, pair_floor
from jaxattn.bench.timing import Timing

#: Each stage's key in `gpu_check.json` by its name, the short names of BENCHMARKS.md
#: and of runs 1 and 2 (`--stages` takes either): the suite's labels (`suite.CASES`)
#: and this check's own. A stage not named here is its own key (`env`, `floors`).
LABELS = {
    "small_systems": CASES["small_systems"],
    "small_systems_large_batch": CASES["small_systems_large_batch"],
    "small_systems_rk4": "RK4",
    "noisy_small_systems": CASES["noisy_small_systems"],
    "meanfield_flash": "MF_flash",
    "meanfield_forward": "MF_forward",
    "meanfield_gradient": "MF_gradient",
    "meanfield_wide": "MF_wide",
}
SIZES = {  # (full GPU sizes, dry-run sizes)
    "small_systems": ({"batch": 100_000, "layers": 200}, {"batch": 40, "layers": 3}),
    "small_systems_large_batch": ({"batch": 1_000_000, "layers": 200},
                                  {"batch": 70, "layers": 2}),
    "small_systems_rk4": ({"batch": 100_000, "steps": 200}, {"batch": 40, "steps": 2}),
    "noisy_small_systems": ({"batch": 1000, "steps": 1000}, {"batch": 20, "steps": 3}),
    "meanfield": ({"n": 1_000_000}, {"n": 256}),
    # MF's target at a large head dimension: the XLA sweep on tensor-core-free float32
    "meanfield_wide": ({"n": 2**17, "d": 128}, {"n": 256, "d": 20}),
    "flash_sweep": ({"n": 2**17}, {"n": 40}),
}
# S1's kernel layouts, in the order they are tried (each layout is its own Triton
# compile, about 70 s on an H100, so a budgeted run reaches few of them). Run 1 on an
# H100 measured (32, 1) only: S1L, RK4 and SN take it until S1 has found a faster one.
LAYOUTS = [("triton", 64, 2), ("triton", 128, 4), ("triton", 32, 1), ("triton", 64, 1),
           ("triton", 256, 8), ("triton", 128, 2), ("triton", 256, 4), ("triton", 512, 8)]
FIRST_LAYOUT = {"backend": "triton", "block": 32, "num_warps": 1}
# Flash attention's layouts: (queries, keys) per block and Triton warps.
FLASH_LAYOUTS = [(64, 64, 4), (128, 64, 4), (64, 128, 4), (128, 128, 8), (32, 64, 2)]
# Stages in the order a run takes them: what runs 1 and 2 (an H100, 330 and 300 s)
# did not measure first: S1L judged in law, S1's other layouts, RK4 (its compile
# outran run 2's budget); then what they did. `tests` only when named (24 passed
# natively in run 1, 94 s of the budget).
STAGES = ("env", "floors", "small_systems_large_batch", "small_systems", "small_systems_rk4",
          "noisy_small_systems", "meanfield_flash", "meanfield_forward", "meanfield_gradient",
          "meanfield_wide")
ALL_STAGES = ("tests",) + STAGES
# Seconds a stage needs to start: its compiles. Run 1 took about 70 s for S1's kernel
# (its body 6.7k jaxpr equations: the layer and misalignment unrolled over the
# tokens) and 140 s for SN's (11.5k: the threefry hash and normals besides); RK4's
# stages run as loop iterations (7.0k; unrolled they were 20.8k, about 250 s), yet
# its compile outran run 2's last 137 s.
NEED_S = {"tests": 250, "floors": 10, "meanfield_flash": 40, "small_systems_large_batch": 90,
          "small_systems_rk4": 150, "small_systems": 90, "noisy_small_systems": 150,
          "meanfield_forward": 30, "meanfield_gradient": 40, "meanfield_wide": 20}
DIMS = ((10, 3, 2), (3, 2, 1))  # S1's (n, d, h) on the GPU; in a dry run
# Systems of S1, S1L and RK4 rerun in float64 to judge the kernel against the fused
# path in law (`jaxattn.bench.agreement`; every system in a dry run).
LAW_SAMPLE = 100_000


class Check:
    """The record: stages with their results or errors, written after each one."""

    def __init__(self, out: str, budget_s: float, dry: bool):
        self.path = os.path.join(out, "gpu_check.json")
        os.makedirs(out, exist_ok=True)
        self.start = time.perf_counter()
        self.budget_s = budget_s
        self.dry = dry
        self.data = {"dry_run": dry, "budget_s": budget_s, "stages": {}}
        self.stopped = False

    def left(self) -> float:
        return self.budget_s - (time.perf_counter() - self.start)

    def run(self, name: str, fn, *, need_s: float = 0.0):
        """Run one stage; its result or error goes into the record. On a GPU a stage
        still running when the budget ends (a compile cannot be interrupted) is
        abandoned in its thread, recorded as such, and no further stage starts."""
        if self.stopped:
            self.record(name, {"skipped": "an earlier stage ran past the budget"})
            return None
        if self.left() < need_s:
            self.record(name, {"skipped": f"budget: {self.left():.0f} s left, "
                                          f"{need_s:.0f} s wanted"})
            return None
        print(f"[{time.perf_counter() - self.start:6.1f} s] {LABELS.get(name, name)} ...",
              flush=True)
        t0 = time.perf_counter()
        box = {}

        def target():
            try:
                box["result"] = fn()
            except Exception as e:  # noqa: BLE001 - every failure is recorded, the check goes on
                box["result"] = {"error": f"{type(e).__name__}: {e}"[:2000],
                                 "traceback": traceback.format_exc()[-4000:]}
        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        thread.join(timeout=None if self.dry else max(1.0, self.left()))
        if thread.is_alive():
            self.stopped = True
            result = {"error": f"budget: still running after {time.perf_counter() - t0:.0f} s "
                               "(a compile or a call), abandoned; the check ends here"}
        else:
            result = box["result"]
        if isinstance(result, dict):
            result.setdefault("stage_s", time.perf_counter() - t0)
        self.record(name, result)
        print(f"    {_short(result)}", flush=True)
        return result

    def record(self, name, result):
        self.data["stages"][LABELS.get(name, name)] = result
        self.write()

    def stage(self, name) -> dict:
        """The record of the stage `name` so far (empty before it ran)."""
        return self.data["stages"].get(LABELS.get(name, name)) or {}

    def write(self):
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


def _kernel_layouts(check: Check, fn_of, args, ref, layouts) -> list:
    """The kernel at each layout while the budget lasts (one compile per layout):
    rows with the timing, the compile time and the difference from `ref`, and each
    timed layout's output (by the row's index)."""
    rows, outputs = [], {}
    for i, (backend, block, warps) in enumerate(layouts):
        if i and check.left() < NEED_S["small_systems"]:
            rows.append({"backend": backend, "block": block, "num_warps": warps,
                         "skipped": f"budget: {check.left():.0f} s left"})
            continue
        try:
            with use_kernel_config(backend=backend, block=block, num_warps=warps):
                timing, comp, out = _time(fn_of("kernel"), *args)
            outputs[len(rows)] = out
            rows.append(_row(timing, comp, backend=backend, block=block, num_warps=warps,
                             rel_diff_vs_fused=None if ref is None else _rel(out, ref)))
        except Exception as e:  # noqa: BLE001
            rows.append({"backend": backend, "block": block, "num_warps": warps,
                         "error": f"{type(e).__name__}: {e}"[:1000]})
        print(f"      {_short(rows[-1])}", flush=True)
    return rows, outputs


def _best_layout(check: Check) -> dict:
    """The fastest layout S1 measured in this run, else run 1's (32 systems, 1 warp)."""
    best = check.stage("small_systems").get("best")
    if not best:
        return dict(FIRST_LAYOUT)
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
    _compare(out, results)
    out["layout"] = _best_layout(check)
    return out, results


def _compare(out: dict, results: dict) -> None:
    if "kernel" in results and "fused" in results:
        out["rel_diff_kernel_vs_fused"] = _rel(results["kernel"], results["fused"])
        out["speedup_kernel_vs_fused"] = out["fused"]["median_s"] / out["kernel"]["median_s"]


def _law(fn_of, prob, arrays, results: dict) -> dict:
    """The kernel and the fused path, each against float64 on a sample of the systems
    (`LAW_SAMPLE`): the verdict for many-layer runs, where the largest difference over
    10⁶ systems is O(1) between any two float32 programs (`jaxattn.bench.agreement`)."""
    if "kernel" not in results or "fused" not in results:
        return {"skipped": "the kernel or the fused path did not run"}
    B = prob.batch
    idx = (np.arange(B) if B <= LAW_SAMPLE else
           np.sort(np.random.default_rng(0).choice(B, LAW_SAMPLE, replace=False)))
    try:
        with jax.enable_x64(True):
            wide = {k: v.astype(np.float64) for k, v in arrays.items()}
            ref = jax.jit(fn_of("fused"))(prob.dynamics(wide), jnp.asarray(wide["x0"][idx]))
            ref = np.asarray(ref)
        return agreement_in_law(np.asarray(results["kernel"])[idx],
                                np.asarray(results["fused"])[idx], ref)
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"[:1000]}


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
    fn_of = lambda s: _layers_fn(L, s)  # noqa: E731
    if case == "small_systems":  # the layout sweep at S1's own size: its best row is S1's kernel
        out, results = _versus(check, fn_of, (dyn, x0), strategies=("fused",))
        layouts = LAYOUTS[:1] if check.dry else LAYOUTS
        out["layouts"], outputs = _kernel_layouts(check, fn_of, (dyn, x0),
                                                  results.get("fused"), layouts)
        if outputs:
            i = min(outputs, key=lambda j: out["layouts"][j]["median_s"])
            out["best"] = out["kernel"] = out["layouts"][i]
            out["layout"] = {k: out["best"][k] for k in ("backend", "block", "num_warps")}
            results["kernel"] = outputs[i]
            _compare(out, results)
    else:
        out, results = _versus(check, fn_of, (dyn, x0))
    out["law"] = _law(fn_of, prob, arrays, results)
    flops = L * prob.flops()
    moved = 4 * prob.batch * (prob.n * prob.d + L + 1)
    out.update(size=size, flops=flops, moved_bytes=moved)
    peak = check.stage("floors").get("matmul_peak_gflops_f32")
    bw = check.stage("floors").get("copy_bandwidth") or {}
    bandwidth = max((v for k, v in bw.items() if k != "bytes"), default=None)
    if peak:
        out["floor_flops_s"] = flops / (peak * 1e9)
    if bandwidth:
        out["floor_bytes_s"] = moved / (bandwidth * 1e9)
    floor = max(out.get("floor_flops_s") or 0, out.get("floor_bytes_s") or 0)
    if floor and "median_s" in out.get("kernel", {}):
        out["kernel_over_floor"] = out["kernel"]["median_s"] / floor
    ref, why = _torch_ref()
    if ref is None or case != "small_systems":
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
    size = _size(check, "small_systems_rk4")
    prob, arrays, dyn, x0 = _problem(check, size["batch"])
    steps, T = size["steps"], 10.0
    ts = jnp.linspace(0.0, T, 2)

    def fn_of(strategy):
        return lambda dyn, x0: ja.solve_flow(dyn, x0, ts, solver=ja.RK4(), dt0=T / steps,
                                             stepsize_controller=dfx.ConstantStepSize(),
                                             strategy=strategy)[:, -1]
    out, results = _versus(check, fn_of, (dyn, x0))
    out["law"] = _law(fn_of, prob, arrays, results)
    out["size"] = size
    return out


def stage_noisy(check: Check) -> dict:
    size = _size(check, "noisy_small_systems")
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


def stage_mean_field(check: Check, gradient: bool, case: str = "meanfield") -> dict:
    size = _size(check, case)
    n, d = size["n"], size.get("d", 3)
    from jaxattn.bench.suite import Problem
    prob = Problem(n=n, d=d, h=1, batch=1, causal=False)
    arrays = prob.arrays()
    dyn, x0 = prob.dynamics(arrays), jnp.asarray(arrays["x0"][0])
    tau = 0.1

    def forward(dyn, x):
        return dyn.layer(0.0, x, tau)

    def grad(dyn, x):
        import equinox as eqx
        return eqx.filter_grad(lambda dx: forward(*dx)[:, 0].sum())((dyn, x))

    timing, comp, _ = _time(grad if gradient else forward, dyn, x0, repeats=1 if n > 1e5 else 3)
    floors = check.stage("floors")
    peak = floors.get("matmul_peak_gflops_f32")
    blocked = bool(dyn.blocked(n, x0.dtype))
    from jaxattn._blocks import FLASH_MAX_DIM
    flash = blocked and jax.default_backend() == "gpu" and d <= FLASH_MAX_DIM  # "auto"
    out = _row(timing, comp, n=n, d=d, blocked=blocked,
               path="the flash kernel (jaxattn._blocks, use_flash 'auto')" if flash else
               "blocked XLA sweep (jaxattn._blocks)" if blocked else "dense XLA")
    for name in ("exp_register_per_s", "exp_stream_per_s"):
        if peak and floors.get(name):
            floor = pair_floor(float(n) ** 2, d, gradient, peak, floors[name])
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
    from jaxattn._blocks import block_spec, blocked_attention, use_flash
    from jaxattn._pallas.flash import flash_attention
    small = _size(check, "flash_sweep")["n"]
    args = _attention_inputs(small)
    weights = jax.random.normal(jax.random.key(1), args[0].shape[:2] + (3,), args[0].dtype)

    def flash_of(bq, bk, warps):
        return lambda q, k, v, o: flash_attention(q, k, v, o, block_q=bq, block_k=bk,
                                                  num_warps=warps)

    def grad_of(fn):
        return jax.grad(lambda *x: jnp.sum(fn(*x) * weights), argnums=(0, 1, 2))

    spec = block_spec("softmax", small, small, 1, 512)

    def blocked(q, k, v, o):  # the XLA sweep, not the flash kernel it takes on a GPU
        with use_flash("never"):
            return blocked_attention(q, k, v, o, None, spec)
    t_ref, _, ref = _time(blocked, *args, repeats=1)
    out = {"sweep_n": small, "blocked_forward_s": t_ref.median, "layouts": []}
    layouts = FLASH_LAYOUTS[:1] if check.dry else FLASH_LAYOUTS[:3]
    for bq, bk, warps in layouts:
        if out["layouts"] and check.left() < 150:  # n = 10⁶ next, and what follows
            out["layouts"].append({"block_q": bq, "block_k": bk, "num_warps": warps,
                                   "skipped": "budget"})
            continue
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
    n = _size(check, "meanfield")["n"]
    big = _attention_inputs(n)
    weights = jax.random.normal(jax.random.key(1), big[0].shape[:2] + (3,), big[0].dtype)
    timing, comp, _ = _time(flash_of(*layout), *big, repeats=1 if n > 1e5 else 3)
    out["forward"] = _row(timing, comp, n=n)
    if check.left() > 40 or check.dry:
        timing, comp, _ = _time(grad_of(flash_of(*layout)), *big, repeats=1 if n > 1e5 else 3)
        out["gradient"] = _row(timing, comp, n=n)
        out["gradient_over_forward"] = out["gradient"]["median_s"] / out["forward"]["median_s"]
    floors = check.stage("floors")
    peak, rate = floors.get("matmul_peak_gflops_f32"), floors.get("exp_register_per_s")
    if peak and rate:
        for name, grad in (("forward", False), ("gradient", True)):
            if name in out:
                floor = pair_floor(float(n) ** 2, 3, grad, peak, rate)
                out[name]["floor"] = floor
                out[name]["ratio_to_floor"] = out[name]["median_s"] / floor["floor_s"]
    return out


def _stages(text: str | None, skip_tests: bool) -> list[str]:
    """The stages `--stages` names, by name or short name (`LABELS`), as names."""
    names = {label: name for name, label in LABELS.items()} | {n: n for n in ALL_STAGES}
    given = list(STAGES) if not text else [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in given if t not in names]
    if unknown:
        raise SystemExit(f"gpu_check: unknown stage {unknown[0]!r}; stages: "
                         f"{', '.join(ALL_STAGES)} (or their short names: "
                         f"{', '.join(LABELS.values())})")
    return [names[t] for t in given if not (skip_tests and t == "tests")]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="tiny sizes, interpret mode on a CPU (what CI runs)")
    parser.add_argument("--budget", type=float, default=290.0, help="seconds in all")
    parser.add_argument("--out", default=os.environ.get("OUT") or "gpu_check_out")
    parser.add_argument("--stages", default=None,
                        help=f"comma-separated, run in this order (default: "
                             f"{','.join(STAGES)}; also: tests)")
    parser.add_argument("--skip-tests", action="store_true",
                        help="drop `tests` from --stages")
    args = parser.parse_args(argv)
    dry = args.dry_run
    names = _stages(args.stages, args.skip_tests or dry)
    check = Check(args.out, args.budget, dry)
    check.data["stage_order"] = [LABELS.get(name, name) for name in names]
    # The tests first, in their own process, before this one starts JAX's backend
    # (which would hold most of the GPU's memory).
    if "tests" in names:
        check.run("tests", lambda: stage_tests(min(120.0, check.left() - 200)),
                  need_s=NEED_S["tests"])
    env = check.run("env", stage_env)
    if not dry and (env or {}).get("backend") != "gpu":
        print("no GPU: the timings below run the kernels in interpret mode", flush=True)
    run = {"floors": lambda: stage_floors(dry),
           "meanfield_flash": lambda: stage_flash(check),
           "small_systems_large_batch": lambda: stage_layers(check, "small_systems_large_batch"),
           "small_systems_rk4": lambda: stage_rk4(check),
           "small_systems": lambda: stage_layers(check, "small_systems"),
           "noisy_small_systems": lambda: stage_noisy(check),
           "meanfield_forward": lambda: stage_mean_field(check, False),
           "meanfield_gradient": lambda: stage_mean_field(check, True),
           "meanfield_wide": lambda: stage_mean_field(check, False, "meanfield_wide")}
    for name in names:
        if name in run:
            check.run(name, run[name], need_s=0 if dry else NEED_S[name])
    check.data["compile_s"] = _compile_times(check.data["stages"])
    check.write()
    print(f"done in {time.perf_counter() - check.start:.0f} s: {check.path}", flush=True)
    errors = [k for k, v in check.data["stages"].items() if isinstance(v, dict) and "error" in v]
    if errors:
        print(f"stages with errors: {', '.join(errors)}", flush=True)
    code = 1 if dry and errors else 0
    if check.stopped:  # a stage's thread is still compiling: leave without joining it
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _compile_times(tree, path="", seen=None) -> dict:
    """Every JAX compile in the record by its path (`S1.layouts.0`), apart from the
    timings: where a run's seconds went (a row named twice, such as S1's best, once)."""
    seen = set() if seen is None else seen
    found = {}
    if isinstance(tree, dict) and id(tree) not in seen:
        seen.add(id(tree))
        for k, v in tree.items():
            if k == "compile_s":
                if v:  # PyTorch rows: no compile
                    found[path] = v
            else:
                found.update(_compile_times(v, f"{path}.{k}" if path else str(k), seen))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            found.update(_compile_times(v, f"{path}.{i}", seen))
    return found


if __name__ == "__main__":
    sys.exit(main())
