"""The benchmark suite behind `jaxattn bench`.

Every figure is the median of repeated runs after compilation, with min and max,
measured in one process so that ratios are comparable on a noisy machine:

- **peak**: the best float32 4096² matrix product of NumPy, PyTorch and JAX.
- **S1** many tiny systems: n = 10, d = 3, h = 2, batch 1000; 200 RK4 steps to
  T = 10, and the adaptive solve (Tsit5 / torchdiffeq dopri5) to T = 10.
- **S2** paper-size causal: n = 50, d = 500, h = 2, batch 16, 100 layers.
- **S3** GPT-2-small-sized dynamics: n = 200, d = 768, h = 12, factored
  `P_η = Q_ηᵀ K_η` with k = 64, batch 8, 12 layers.
- **G** gradient of the final misalignment through 100 steps of S2 (discrete
  layers, and RK4 flow steps), time and memory relative to the forward pass.

Flop counts (multiply–adds count 2; softmax, normalisation and the metric are
left out, so achieved GFLOP/s are lower bounds), per sequence and per
evaluation of the raw update `v`:
  unfactored `P`: `4 h n d² + 4 h n² d`;  factored (`k`): `4 h n k d + 2 h n² k
  + 2 h n² d + 2 h n d²`. A layer is one evaluation, an RK4 step four, a Tsit5
  step six (FSAL) per accepted step (rejected steps not counted).
- **S4** the looped-model protocol: GPT-2 small and GPT-Neo 125M configs, random
  weights, 100 prompts × 200 tokens, one pass, pure attention and full model,
  against the HuggingFace blocks looped by hand (`jaxattn.bench.loop_vs_hf`).
  Flops per token and block: `8 d² + 4 n d` (attention) and `24 d² + 4 n d` (full).

The PyTorch references (`jaxattn.bench.reference_torch`) run the same
mathematics the plain way and are timed in the same process when torch is
installed.
"""

import argparse
import dataclasses
import importlib
import importlib.util
import math
import os
import platform
import statistics
import time
from collections.abc import Callable

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np

from .._dynamics import SelfAttentionDynamics
from .._flow import solve_flow
from .._layers import run_layers
from .._runs import package_versions
from .._solvers import RK4
from ..metrics._consensus import misalignment


@dataclasses.dataclass
class Timing:
    """Seconds per call: median, min and max over the timed calls."""

    median: float
    min: float
    max: float
    calls: int = 1

    @classmethod
    def run(cls, fn: Callable[[], object], repeats: int,
            budget_s: float = math.inf) -> tuple["Timing", object]:
        """Time `repeats` calls of `fn`, or fewer: no call is started that would,
        at the mean time per call so far, take the total past `budget_s` (at least
        one call); also returns the last call's output."""
        times, out = [], None
        while cls.another(times, repeats, budget_s):
            t0 = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - t0)
        return cls.of_times(times), out

    @staticmethod
    def another(times: list[float], repeats: int, budget_s: float) -> bool:
        """Whether to time one more call after `times`: fewer than `repeats` so far,
        and the next one, at the mean so far, keeps the total within `budget_s`."""
        return len(times) < repeats and (
            not times or sum(times) * (1 + 1 / len(times)) <= budget_s
        )

    @classmethod
    def of_times(cls, times: list[float]) -> "Timing":
        return cls(statistics.median(times), min(times), max(times), len(times))

    @classmethod
    def of(cls, fn: Callable[[], object], repeats: int, budget_s: float = math.inf) -> "Timing":
        return cls.run(fn, repeats, budget_s)[0]


def flops_raw_update(n: int, d: int, h: int, k: int | None = None) -> float:
    """Floating-point operations of one evaluation of `v` for one sequence."""
    if k is None:
        return 4 * h * n * d * d + 4 * h * n * n * d
    return 4 * h * n * k * d + 2 * h * n * n * k + 2 * h * n * n * d + 2 * h * n * d * d


def compile_jax(fn: Callable, *args):
    """Compile `jax.jit(fn)` for `args`: the executable, compile seconds, memory bytes."""
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    seconds = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    nbytes = None
    if mem is not None:
        nbytes = mem.temp_size_in_bytes + mem.argument_size_in_bytes + mem.output_size_in_bytes
    return compiled, seconds, nbytes


def time_jax(fn: Callable, *args, repeats: int, budget_s: float = math.inf):
    """Compile ahead of time (no warm-up call needed), then time the executable."""
    compiled, compile_s, nbytes = compile_jax(fn, *args)
    timing, out = Timing.run(lambda: jax.block_until_ready(compiled(*args)), repeats, budget_s)
    return timing, compile_s, nbytes, out


@dataclasses.dataclass(frozen=True)
class Repeats:
    """How long to time one figure: `count` calls, fewer where another call would
    take the figure past `budget_s` seconds (always at least one)."""

    count: int
    budget_s: float = math.inf

    def time(self, fn: Callable[[], object]) -> tuple[Timing, object]:
        return Timing.run(fn, self.count, self.budget_s)

    def time_jax(self, fn: Callable, *args):
        return time_jax(fn, *args, repeats=self.count, budget_s=self.budget_s)


def matmul_peak(size: int = 4096, repeats: int = 5) -> dict[str, float]:
    """GFLOP/s of a float32 `size`² product in NumPy, PyTorch (if installed) and JAX."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    flops = 2 * size**3
    out = {"numpy": flops / Timing.of(lambda: a @ b, repeats).min / 1e9}
    torch = _torch()
    if torch is not None:
        at, bt = torch.from_numpy(a.copy()), torch.from_numpy(b.copy())
        at @ bt
        out["torch"] = flops / Timing.of(lambda: at @ bt, repeats).min / 1e9
    f = jax.jit(jnp.matmul)
    aj, bj = jnp.asarray(a), jnp.asarray(b)
    jax.block_until_ready(f(aj, bj))
    out["jax"] = flops / Timing.of(lambda: jax.block_until_ready(f(aj, bj)), repeats).min / 1e9
    out["best"] = max(out.values())
    return out


def _torch():
    """torch, or `None` when it is not installed: imported on first use, so that
    jaxattn itself never needs it."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(max(1, torch.get_num_threads()))
    return torch


def _reference(name: str = "reference_torch"):
    """The PyTorch reference module `jaxattn.bench.NAME`, or `None` without torch
    (or, for `loop_vs_hf`, without transformers): imported on first use, so that
    jaxattn itself never needs torch."""
    if _torch() is None:
        return None
    if name == "loop_vs_hf" and importlib.util.find_spec("transformers") is None:
        return None
    return importlib.import_module(f"{__package__}.{name}")


@dataclasses.dataclass
class Problem:
    """One benchmark problem: weights and a batch of initial tokens, in float32."""

    n: int
    d: int
    h: int
    batch: int
    causal: bool
    k: int | None = None
    seed: int = 0

    def arrays(self) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(self.seed)
        f32 = np.float32
        out = {"U": (rng.standard_normal((self.h, self.d, self.d)) / np.sqrt(self.d)).astype(f32)}
        if self.k is None:
            out["P"] = (rng.standard_normal((self.h, self.d, self.d)) / self.d).astype(f32)
        else:
            scale = 1 / np.sqrt(self.d)
            out["Q"] = (scale * rng.standard_normal((self.h, self.k, self.d))).astype(f32)
            out["K"] = (scale * rng.standard_normal((self.h, self.k, self.d))).astype(f32)
        x0 = rng.standard_normal((self.batch, self.n, self.d)).astype(f32)
        out["x0"] = x0 / np.linalg.norm(x0, axis=-1, keepdims=True)
        return out

    def dynamics(self, arrays) -> SelfAttentionDynamics:
        U = jnp.asarray(arrays["U"])
        if self.k is None:
            return SelfAttentionDynamics(jnp.asarray(arrays["P"]), U, causal=self.causal)
        Q, K = jnp.asarray(arrays["Q"]), jnp.asarray(arrays["K"])
        return SelfAttentionDynamics.from_factors(Q, K, U, causal=self.causal)

    def torch_args(self, arrays):
        torch = _torch()
        t = {k: torch.from_numpy(v.copy()) for k, v in arrays.items()}
        return t["x0"], t.get("Q"), t["K"] if self.k is not None else t["P"], t["U"]

    def flops(self) -> float:
        return self.batch * flops_raw_update(self.n, self.d, self.h, self.k)


def _row(case, variant, library, timing, *, token_steps, flops, peak, compile_s=None,
         memory=None, agreement=None) -> dict:
    return {
        "case": case, "variant": variant, "library": library,
        "median_s": timing.median, "min_s": timing.min, "max_s": timing.max,
        "calls": timing.calls,
        "token_steps_per_s": token_steps / timing.median,
        "gflops": flops / timing.median / 1e9 if flops else None,
        "fraction_of_peak": (flops / timing.median / 1e9 / peak
                             if flops and math.isfinite(peak) else None),  # no peak run: None
        "compile_s": compile_s, "memory_bytes": memory, "max_abs_diff_vs_jax": agreement,
    }


def _max_abs_diff(torch_out, jax_out) -> float:
    return float(np.abs(torch_out.numpy() - np.asarray(jax_out)).max())


def _layers_case(name, prob: Problem, num_layers, tau, peak, rep: Repeats, ref) -> list[dict]:
    arrays = prob.arrays()
    dyn, x0 = prob.dynamics(arrays), jnp.asarray(arrays["x0"])
    fwd = lambda dyn, x0: run_layers(dyn, x0, num_layers, tau, observe=misalignment)  # noqa: E731
    timing, comp, mem, E = rep.time_jax(fwd, dyn, x0)
    steps = prob.batch * prob.n * num_layers
    flops = num_layers * prob.flops()
    rows = [_row(name, f"{num_layers} layers", "jaxattn", timing, token_steps=steps,
                 flops=flops, peak=peak, compile_s=comp, memory=mem)]
    if ref is not None:
        xt, Qt, Kt, Ut = prob.torch_args(arrays)
        run = lambda: ref.run_layers(xt, Qt, Kt, Ut, 1.0, prob.causal, tau, num_layers)  # noqa: E731
        t_ref, E_t = rep.time(run)
        rows.append(_row(name, f"{num_layers} layers", "torch", t_ref, token_steps=steps,
                         flops=flops, peak=peak, agreement=_max_abs_diff(E_t, E)))
    return rows


def _flow_cases(name, prob: Problem, T, rk4_steps, peak, rep: Repeats, ref) -> list[dict]:
    arrays = prob.arrays()
    dyn, x0 = prob.dynamics(arrays), jnp.asarray(arrays["x0"])
    ts = jnp.array([0.0, T], jnp.float32)
    dt = T / rk4_steps
    fixed = dfx.ConstantStepSize()

    def rk4(dyn, x0):
        return solve_flow(dyn, x0, ts, solver=RK4(), dt0=dt, stepsize_controller=fixed)[:, -1]

    def tsit5(dyn, x0):
        res = solve_flow(dyn, x0, ts, throw=False)
        return res.ys[:, -1], res.num_steps

    t_rk4, c_rk4, m_rk4, y_rk4 = rep.time_jax(rk4, dyn, x0)
    t_ad, c_ad, m_ad, (y_ad, nsteps) = rep.time_jax(tsit5, dyn, x0)
    steps_ad = float(np.mean(nsteps))
    tok = prob.batch * prob.n
    rows = [
        _row(name, f"RK4 × {rk4_steps}", "jaxattn", t_rk4, token_steps=tok * rk4_steps,
             flops=4 * rk4_steps * prob.flops(), peak=peak, compile_s=c_rk4, memory=m_rk4),
        _row(name, f"adaptive to T={T:g}", "jaxattn", t_ad, token_steps=tok * steps_ad,
             flops=6 * steps_ad * prob.flops(), peak=peak, compile_s=c_ad, memory=m_ad),
    ]
    if ref is not None:
        xt, Qt, Kt, Ut = prob.torch_args(arrays)
        run = lambda: ref.rk4(xt, Qt, Kt, Ut, 1.0, prob.causal, dt, rk4_steps)  # noqa: E731
        t_ref, y_ref = rep.time(run)
        rows.append(_row(name, f"RK4 × {rk4_steps}", "torch", t_ref,
                         token_steps=tok * rk4_steps, flops=4 * rk4_steps * prob.flops(),
                         peak=peak, agreement=_max_abs_diff(y_ref, y_rk4)))
        if importlib.util.find_spec("torchdiffeq") is not None:
            run = lambda: ref.adaptive(xt, Qt, Kt, Ut, 1.0, prob.causal, T)  # noqa: E731
            t_ref, y_ref = rep.time(run)
            rows.append(_row(name, f"adaptive to T={T:g}", "torch (torchdiffeq)",
                             t_ref, token_steps=tok * steps_ad, flops=None,
                             peak=peak, agreement=_max_abs_diff(y_ref, y_ad)))
    return rows


def _gradient_cases(prob: Problem, steps, rep: Repeats, ref) -> list[dict]:
    """Gradient of the final misalignment through `steps` steps vs the forward pass."""
    arrays = prob.arrays()
    dyn, x0 = prob.dynamics(arrays), jnp.asarray(arrays["x0"])
    fixed = dfx.ConstantStepSize()
    tau = 0.1

    def layers(checkpoints, num):
        return lambda x0: run_layers(dyn, x0, num, tau, observe=misalignment,
                                     checkpoints=checkpoints)[:, -1].sum()

    def flow(num):
        ts = jnp.array([0.0, num * tau], jnp.float32)
        return lambda x0: misalignment(solve_flow(dyn, x0, ts, solver=RK4(), dt0=tau,
                                                  stepsize_controller=fixed)[:, -1]).sum()

    rows = []
    for variant, make in (("layers, checkpoint every layer", lambda m: layers(None, m)),
                          ("layers, √L segment checkpoints", lambda m: layers("sqrt", m)),
                          ("layers, recursive checkpoints", lambda m: layers(10, m)),
                          ("RK4 flow, diffrax adjoint", flow)):
        t_f, c_f, m_f, _ = rep.time_jax(make(steps), x0)
        t_g, c_g, m_g, _ = rep.time_jax(jax.grad(make(steps)), x0)
        _, _, m_g4 = compile_jax(jax.grad(make(4 * steps)), x0)
        rows.append({
            "case": "G", "variant": f"{variant}, {steps} steps", "library": "jaxattn",
            "forward_s": t_f.median, "gradient_s": t_g.median, "min_s": t_g.min, "max_s": t_g.max,
            "calls": t_g.calls,
            "gradient_over_forward": t_g.median / t_f.median,
            "memory_forward_bytes": m_f, "memory_gradient_bytes": m_g,
            f"memory_gradient_{4 * steps}_steps_bytes": m_g4,
            "memory_growth_4x_steps": (m_g4 / m_g) if m_g and m_g4 else None,
            "compile_s": c_g,
        })
    if ref is not None:
        xt, Qt, Kt, Ut = prob.torch_args(arrays)
        fwd = lambda: ref.run_layers(xt, Qt, Kt, Ut, 1.0, prob.causal, tau, steps)  # noqa: E731
        grad = lambda: ref.grad_layers(xt, Qt, Kt, Ut, 1.0, prob.causal, tau, steps)  # noqa: E731
        t_f, t_g = rep.time(fwd)[0], rep.time(grad)[0]
        rows.append({"case": "G", "variant": f"layers, autograd, {steps} steps",
                     "library": "torch", "forward_s": t_f.median, "gradient_s": t_g.median,
                     "min_s": t_g.min, "max_s": t_g.max, "calls": t_g.calls,
                     "gradient_over_forward": t_g.median / t_f.median})
    return rows


def _looped_cases(quick: bool, rep: Repeats, peak: float) -> list[dict]:
    """S4 through `jaxattn.bench.loop_vs_hf` (needs torch and transformers)."""
    if importlib.util.find_spec("transformers") is None:
        return []
    mod = _reference("loop_vs_hf")
    if mod is None:
        return []
    prompts, tokens = (4, 32) if quick else (100, 200)
    args = argparse.Namespace(prompts=prompts, tokens=tokens, passes=1, repeats=rep.count,
                              budget_s=rep.budget_s, seed=0, dtype="float32",
                              variants=["attn", "full"], chunk=None)
    rows = []
    for name in ("gpt2", "gpt-neo-125M"):
        for r in mod.bench_model(name, args, np.random.default_rng(0)):
            d, L = 768, 12
            per_token = (24 if r["variant"] == "full" else 8) * d * d + 4 * tokens * d
            flops = prompts * tokens * L * per_token
            for lib, key in (("jaxattn", "jax_s_per_pass"), ("HuggingFace torch", "hf_s_per_pass")):
                t = Timing(**r[key])
                row = _row("S4", f"{name} {r['variant']}, 1 pass", lib, t,
                           token_steps=prompts * tokens * L, flops=flops, peak=peak,
                           compile_s=r["jax_compile_s"] if lib == "jaxattn" else None)
                if lib != "jaxattn":
                    row["max_rel_diff_E_vs_jax"] = r["max_rel_diff_E"]
                rows.append(row)
    return rows


SIZES = {
    # name: (problem, extra), full size as in the benchmark issue; "quick" shrinks.
    "S1": Problem(n=10, d=3, h=2, batch=1000, causal=False),
    "S2": Problem(n=50, d=500, h=2, batch=16, causal=True),
    "S3": Problem(n=200, d=768, h=12, batch=8, causal=False, k=64),
}
QUICK = {
    "S1": Problem(n=10, d=3, h=2, batch=64, causal=False),
    "S2": Problem(n=20, d=64, h=2, batch=4, causal=True),
    "S3": Problem(n=32, d=96, h=4, batch=2, causal=False, k=24),
}


ALL_CASES = ("peak", "S1", "S2", "S3", "G", "S4")


def run_suite(*, quick: bool = False, repeats: int = 3, budget_s: float = 30.0,
              cases=ALL_CASES, torch: bool = True,
              progress: Callable[[str], None] = print) -> dict:
    """Run the benchmark suite; returns `{"peak": ..., "rows": [...], "meta": ...}`.

    Each figure is the median of `repeats` calls after compilation, fewer where
    another call would take that figure past `budget_s` seconds (at least one;
    each row records its `calls`).
    """
    sizes = QUICK if quick else SIZES
    ref = _reference() if torch else None
    steps = 10 if quick else 100
    rep = Repeats(repeats, budget_s)
    start = time.perf_counter()
    seconds = {}

    def stage(case, message):
        seconds[case] = time.perf_counter()
        progress(f"{message}  [{time.perf_counter() - start:.0f} s]")

    peak = {"best": float("nan")}
    if "peak" in cases:
        stage("peak", "matmul peak (4096² float32)")
        peak = matmul_peak(512 if quick else 4096, max(repeats, 3))
    rows = []
    if "S1" in cases:
        stage("S1", "S1: many tiny systems (flow)")
        rows += _flow_cases("S1", sizes["S1"], 10.0, 20 if quick else 200, peak["best"],
                            rep, ref)
    if "S2" in cases:
        stage("S2", "S2: paper-size causal (layers)")
        rows += _layers_case("S2", sizes["S2"], steps, 0.1, peak["best"], rep, ref)
    if "S3" in cases:
        stage("S3", "S3: GPT-2-small-sized dynamics (layers)")
        rows += _layers_case("S3", sizes["S3"], 12, 1.0, peak["best"], rep, ref)
    if "G" in cases:
        stage("G", "G: gradient through the S2 dynamics")
        rows += _gradient_cases(sizes["S2"], steps, rep, ref)
    if "S4" in cases:
        stage("S4", "S4: looped GPT-2 / GPT-Neo, one pass (jaxattn and HuggingFace)")
        rows += _looped_cases(quick, rep, peak["best"])
    end = time.perf_counter()
    marks = list(seconds.items()) + [("end", end)]
    meta = {**run_meta(quick, repeats), "budget_s": budget_s, "suite_s": end - start,
            "case_s": {c: marks[i + 1][1] - t for i, (c, t) in enumerate(marks[:-1])}}
    # Without the peak case there is no peak (null in the JSON, not NaN).
    peak = peak if "peak" in cases else None
    return {"peak_gflops": peak, "rows": rows, "meta": meta}


def run_meta(quick: bool, repeats: int) -> dict:
    """What a benchmark result depends on: date, sizes, devices, machine, flags, versions."""
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "quick": quick, "repeats": repeats,
        "device": str(jax.devices()[0]), "device_count": len(jax.devices()),
        "cpu_count": os.cpu_count(), "machine": platform.machine(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""), "versions": package_versions(),
    }


def format_table(result: dict) -> str:
    """The suite's rows as a fixed-width text table."""
    peak = result["peak_gflops"]
    lines = ["matmul peak GFLOP/s: " + (", ".join(f"{k} {v:.0f}" for k, v in peak.items())
                                        if peak else "not measured (case `peak` not run)")]
    head = f"{'case':4} {'variant':42} {'library':20} {'median s':>9} {'min':>8} {'max':>8} " \
           f"{'n':>2} {'tok-steps/s':>11} {'GFLOP/s':>8} {'%peak':>6} {'compile':>7}"
    lines += [head, "-" * len(head)]
    fmt = lambda v, f: "" if v is None else format(v, f)  # noqa: E731
    for r in result["rows"]:
        if r["case"] == "G":
            lines.append(
                f"{r['case']:4} {r['variant'][:42]:42} {r['library'][:20]:20} "
                f"{r['gradient_s']:9.4f} {r['min_s']:8.4f} {r['max_s']:8.4f} {r['calls']:2d} "
                f"grad/fwd {r['gradient_over_forward']:.2f}"
                + (f", memory ×{r['memory_growth_4x_steps']:.2f} for 4× steps"
                   if r.get("memory_growth_4x_steps") else ""))
            continue
        pct = None if r["fraction_of_peak"] is None else 100 * r["fraction_of_peak"]
        lines.append(
            f"{r['case']:4} {r['variant'][:42]:42} {r['library'][:20]:20} {r['median_s']:9.4f} "
            f"{r['min_s']:8.4f} {r['max_s']:8.4f} {r['calls']:2d} {r['token_steps_per_s']:11.3g} "
            f"{fmt(r['gflops'], '8.1f'):>8} {fmt(pct, '6.1f'):>6} {fmt(r['compile_s'], '7.2f'):>7}")
    meta = result.get("meta", {})
    if "suite_s" in meta:
        lines.append(f"suite: {meta['suite_s']:.0f} s (" + ", ".join(
            f"{c} {t:.0f} s" for c, t in meta["case_s"].items()) + ")")
    return "\n".join(lines)
