"""The benchmark suite behind `jaxattn bench`: each case (`CASES`, sizes in
`jaxattn.bench.cases`) timed in one process against the PyTorch references. How it
times, where PyTorch runs, what each case times and the measured tables: BENCHMARKS.md.

Flop counts (multiply–adds count 2; softmax, normalisation and the metric left out,
so GFLOP/s are lower bounds), per sequence and evaluation of the raw update `v`:
unfactored `P`: `4 h n d² + 4 h n² d`; factored (`k`): `4 h n k d + 2 h n² k +
2 h n² d + 2 h n d²`. A layer is one evaluation, an RK4 step four, an accepted Tsit5
step six (FSAL; rejected steps not counted).
"""

import argparse
import dataclasses
import importlib
import importlib.util
import math
import os
import platform
import time
from collections.abc import Callable
from typing import Any

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._artifacts.folders import package_versions
from .._flow import RK4, solve_flow
from .._layers import run_layers
from .._noise import TokenNoise
from .._precision import check_precision
from .._validate import refuse_first
from ..metrics import mean_error, misalignment
from .cases import ALL_CASES, CASES, LARGE, QUICK, SIZES, Problem, case_names
from .cases import flops_raw_update as flops_raw_update
from .device import (
    TorchSide,
    copy_bandwidth,
    device_meta,
    exp_rate,
    jax_matmul_peak,
    matmul_peaks,
    peak_of,
)
from .floors import EXP_CACHED, register_exp_rate
from .timing import Repeats, Timing, compile_jax, repeats_refusal


@dataclasses.dataclass(frozen=True)
class Context:
    """What every case shares: the timing rule, JAX's precision, the peaks, and the
    PyTorch side with its reference module (`None` without torch)."""

    rep: Repeats
    precision: str = "float32"
    peaks: dict | None = None
    side: TorchSide | None = None
    ref: Any = None
    bandwidth: dict | None = None

    def library(self, name: str) -> str:
        """A PyTorch library's label, marked when it runs off JAX's device."""
        return name if self.side.same_device else f"{name} [{self.side.device}]"

    def row(self, case, variant, library, timing, *, token_steps, flops, compile_s=None,
            memory=None, agreement=None) -> dict:
        """One table row; `%peak` against the peak of the precision it ran at (none
        for PyTorch off JAX's device, or where that precision has no peak)."""
        jax_side = library.startswith("jaxattn")
        precision = self.precision if jax_side else self.side.precision
        peak = peak_of(self.peaks, precision) if jax_side or self.side.same_device else math.nan
        gflops = flops / timing.median / 1e9 if flops else None
        return {
            "case": case, "variant": variant, "library": library,
            "device": jax.default_backend() if jax_side else self.side.device,
            "precision": precision,
            "median_s": timing.median, "min_s": timing.min, "max_s": timing.max,
            "calls": timing.calls, "token_steps_per_s": token_steps / timing.median,
            "gflops": gflops,
            "fraction_of_peak": gflops / peak if gflops and math.isfinite(peak) else None,
            "compile_s": compile_s, "memory_bytes": memory, "max_abs_diff_vs_jax": agreement,
        }

    def jax_row(self, case, variant, library, fn, *args, token_steps, flops):
        """Time `fn(*args)` compiled (`Repeats.time_jax`): its row and its output."""
        timing, compile_s, memory, out = self.rep.time_jax(fn, *args)
        return self.row(case, variant, library, timing, token_steps=token_steps, flops=flops,
                        compile_s=compile_s, memory=memory), out

    def floor(self, flops: float, moved_bytes: float) -> dict:
        """The run's floor on this device: its flops at the measured matmul peak of
        its precision, and its unavoidable bytes at the best measured copy bandwidth
        (`None` where the `peak` case did not run)."""
        peak = peak_of(self.peaks, self.precision)
        bandwidth = max((v for k, v in (self.bandwidth or {}).items() if k != "bytes"),
                        default=None)
        return {"floor_flops_s": flops / peak / 1e9 if math.isfinite(peak) else None,
                "floor_bytes_s": moved_bytes / bandwidth / 1e9 if bandwidth else None,
                "moved_bytes": moved_bytes}

    def diff(self, torch_out, jax_out) -> float:
        return float(np.abs(self.side.numpy(torch_out) - np.asarray(jax_out)).max())

    def time_torch(self, fn):
        with self.side.matmul_mode():
            return self.rep.time(self.side.call(fn))


def _reference(name: str = "reference_torch"):
    """The PyTorch reference module `jaxattn.bench.NAME`, or `None` without torch
    (or, for `loop_vs_hf`, without transformers): imported on first use, so that
    jaxattn itself never needs torch."""
    needs = ("torch", "transformers") if name == "loop_vs_hf" else ("torch",)
    if any(importlib.util.find_spec(module) is None for module in needs):
        return None
    return importlib.import_module(f"{__package__}.{name}")


def _strategies(general: bool = True) -> list[tuple[str, str]]:
    """The strategies a case times, with their rows' library: the default, the general
    path, and `strategy="kernel"` where it is compiled (a GPU; elsewhere it runs in
    interpret mode, correct but with no speed to measure)."""
    out = [("auto", "jaxattn")] + ([("general", "jaxattn (general)")] if general else [])
    return out + ([("kernel", "jaxattn (kernel)")] if jax.default_backend() == "gpu" else [])


def _setup(prob: Problem, ctx: Context):
    """`prob`'s arrays, its dynamics at the context's precision and its tokens."""
    arrays = prob.arrays()
    return arrays, prob.dynamics(arrays, ctx.precision), jnp.asarray(arrays["x0"])


def _layers_case(case, prob: Problem, num_layers, tau, ctx: Context, *, general=False,
                 torch=True, floor=False) -> list[dict]:
    """`num_layers` layers observed with `misalignment`: jaxattn (its default
    strategy; with `general`, also the general path), and the PyTorch reference.
    `case`: its name in `CASES`."""
    name, variant = CASES[case], f"{num_layers} layers"
    arrays, dyn, x0 = _setup(prob, ctx)
    steps, flops = prob.batch * prob.n * num_layers, num_layers * prob.flops()
    rows, outputs = [], []
    for strategy, library in _strategies(general):
        def fwd(dyn, x0, s=strategy):
            return run_layers(dyn, x0, num_layers, tau, observe=misalignment, strategy=s)

        row, out = ctx.jax_row(name, variant, library, fwd, dyn, x0, token_steps=steps,
                               flops=flops)
        rows.append(row)
        outputs.append(out)
    if floor:
        # The least a run must move: the tokens read once, E(t) written once.
        rows[0].update(ctx.floor(flops, 4 * prob.batch * (prob.n * prob.d + num_layers + 1)))
    if ctx.ref is not None and torch:
        xt, Qt, Kt, Ut = prob.torch_args(arrays, ctx.side)
        run = lambda: ctx.ref.run_layers(xt, Qt, Kt, Ut, 1.0, prob.causal, tau, num_layers)  # noqa: E731
        t_ref, E_t = ctx.time_torch(run)
        rows.append(ctx.row(name, variant, ctx.library("torch"), t_ref, token_steps=steps,
                            flops=flops, agreement=ctx.diff(E_t, outputs[0])))
    return rows


def _flow_cases(case, prob: Problem, T, rk4_steps, ctx: Context, *, general=False) -> list[dict]:
    """RK4 steps and the adaptive solve to `T` (`case`: its name in `CASES`); with
    `general`, also RK4 on the general path and the fused shared-step adaptive mode."""
    name = CASES[case]
    arrays, dyn, x0 = _setup(prob, ctx)
    ts, dt = jnp.array([0.0, T], jnp.float32), T / rk4_steps
    fixed_v, adapt_v = f"RK4 × {rk4_steps}", f"adaptive to T={T:g}"

    def rk4(strategy):
        def run(dyn, x0):
            return solve_flow(dyn, x0, ts, solver=RK4(), dt0=dt, strategy=strategy,
                              stepsize_controller=dfx.ConstantStepSize())[:, -1]
        return run

    def tsit5(strategy):
        def run(dyn, x0):
            res = solve_flow(dyn, x0, ts, throw=False, strategy=strategy)
            return res.ys[:, -1], res.num_steps
        return run

    runs = [(fixed_v, "jaxattn", rk4("auto")), (adapt_v, "jaxattn", tsit5("auto")),
            *((fixed_v, library, rk4(s)) for s, library in _strategies(False)[1:])]
    if general:
        runs += [(fixed_v, "jaxattn (general)", rk4("general")),
                 (adapt_v, "jaxattn (shared step)", tsit5("fused"))]
    rows, first = [], {}
    for variant, library, fn in runs:
        timing, compile_s, memory, out = ctx.rep.time_jax(fn, dyn, x0)
        y, steps = (out, rk4_steps) if variant == fixed_v else (out[0], float(np.mean(out[1])))
        evaluations = 4 if variant == fixed_v else 6  # per step: RK4's stages, Tsit5's (FSAL)
        rows.append(ctx.row(name, variant, library, timing, token_steps=prob.batch * prob.n * steps,
                            flops=evaluations * steps * prob.flops(), compile_s=compile_s,
                            memory=memory))
        first.setdefault(variant, (y, steps))
    if ctx.ref is not None:
        xt, Qt, Kt, Ut = prob.torch_args(arrays, ctx.side)
        refs = [(fixed_v, "torch", lambda: ctx.ref.rk4(xt, Qt, Kt, Ut, 1.0, prob.causal, dt,
                                                       rk4_steps), 4)]
        if importlib.util.find_spec("torchdiffeq") is not None:
            refs.append((adapt_v, "torch (torchdiffeq)",
                         lambda: ctx.ref.adaptive(xt, Qt, Kt, Ut, 1.0, prob.causal, T), None))
        for variant, library, run, evaluations in refs:
            (y, steps), (t_ref, y_ref) = first[variant], ctx.time_torch(run)
            rows.append(ctx.row(name, variant, ctx.library(library), t_ref,
                                token_steps=prob.batch * prob.n * steps,
                                flops=evaluations and evaluations * steps * prob.flops(),
                                agreement=ctx.diff(y_ref, y)))
    return rows


SN_SIGMA, SN_DT = 0.5, 0.01
SN_SCHEME = ("Itô Euler–Maruyama both sides: jaxattn's noisy layers N(x + dt v + σ P_x ξ√dt) "
             "(retracted) against torchsde euler on dx = (P_x v − (d−1)σ²/2 x) dt + σ P_x dB "
             "(not retracted); independent Brownian paths")


def _final_stats(final) -> dict:
    """The mean final misalignment over the systems and its standard error."""
    mean, se = mean_error(np.asarray(final, np.float64).ravel())
    return {"mean_final_misalignment": float(mean), "se_final_misalignment": float(se),
            "scheme": SN_SCHEME}


def _noisy_cases(prob: Problem, steps: int, ctx: Context) -> list[dict]:
    """SN: `steps` noisy layers (`TokenNoise(SN_SIGMA)`, `dt = SN_DT`) of the
    batch, observed with `misalignment`, on both paths and with torchsde."""
    arrays, dyn, x0 = _setup(prob, ctx)
    key, noise = jax.random.key(prob.seed), TokenNoise(SN_SIGMA)
    variant = f"Itô EM × {steps}, TokenNoise σ={SN_SIGMA:g}"
    tok, flops = prob.batch * prob.n * steps, steps * prob.flops()
    label = CASES["noisy_small_systems"]
    rows = []
    for strategy, library in _strategies():
        def fwd(dyn, x0, s=strategy):
            return run_layers(dyn, x0, steps, SN_DT, observe=misalignment, noise=noise, key=key,
                              strategy=s)[:, -1]
        row, out = ctx.jax_row(label, variant, library, fwd, dyn, x0, token_steps=tok,
                               flops=flops)
        rows.append({**row, **_final_stats(out)})
    if ctx.ref is not None and importlib.util.find_spec("torchsde") is not None:
        xt, Qt, Kt, Ut = prob.torch_args(arrays, ctx.side)
        run = lambda: ctx.ref.noisy_euler(xt, Qt, Kt, Ut, 1.0, prob.causal, SN_SIGMA,  # noqa: E731
                                          SN_DT, steps, prob.seed)
        t_ref, final = ctx.time_torch(run)
        row = {**ctx.row(label, variant, ctx.library("torch (torchsde)"), t_ref,
                         token_steps=tok, flops=flops), **_final_stats(ctx.side.numpy(final))}
        jx = rows[0]
        joint = math.hypot(row["se_final_misalignment"], jx["se_final_misalignment"])
        row["z_vs_jax"] = (row["mean_final_misalignment"] - jx["mean_final_misalignment"]) / joint
        row["jaxattn_speedup"] = t_ref.median / jx["median_s"]
        rows.append(row)
    return rows


def _gradient_row(variant, library, device, precision, forward: Timing, gradient: Timing):
    return {"case": CASES["gradient"], "variant": variant, "library": library, "device": device,
            "precision": precision, "forward_s": forward.median, "gradient_s": gradient.median,
            "min_s": gradient.min, "max_s": gradient.max, "calls": gradient.calls,
            "gradient_over_forward": gradient.median / forward.median}


def _gradient_cases(prob: Problem, steps, ctx: Context) -> list[dict]:
    """Gradient of the final misalignment through `steps` steps vs the forward pass."""
    arrays, dyn, x0 = _setup(prob, ctx)
    tau = 0.1

    def layers(checkpoints):
        return lambda num: lambda x0: run_layers(dyn, x0, num, tau, observe=misalignment,
                                                 checkpoints=checkpoints)[:, -1].sum()

    def flow(num):
        ts = jnp.array([0.0, num * tau], jnp.float32)
        return lambda x0: misalignment(solve_flow(
            dyn, x0, ts, solver=RK4(), dt0=tau,
            stepsize_controller=dfx.ConstantStepSize())[:, -1]).sum()

    rows = []
    for variant, make in (("layers, checkpoint every layer", layers(None)),
                          ("layers, √L segment checkpoints", layers("sqrt")),
                          ("layers, recursive checkpoints", layers(10)),
                          ("RK4 flow, diffrax adjoint", flow)):
        t_f, _, m_f, _ = ctx.rep.time_jax(make(steps), x0)
        t_g, c_g, m_g, _ = ctx.rep.time_jax(jax.grad(make(steps)), x0)
        _, _, m_g4 = compile_jax(jax.grad(make(4 * steps)), x0)
        rows.append({
            **_gradient_row(f"{variant}, {steps} steps", "jaxattn", jax.default_backend(),
                            ctx.precision, t_f, t_g),
            "memory_forward_bytes": m_f, "memory_gradient_bytes": m_g,
            f"memory_gradient_{4 * steps}_steps_bytes": m_g4,
            "memory_growth_4x_steps": (m_g4 / m_g) if m_g and m_g4 else None,
            "compile_s": c_g,
        })
    if ctx.ref is not None:
        args = (*prob.torch_args(arrays, ctx.side), 1.0, prob.causal, tau, steps)
        t_f = ctx.time_torch(lambda: ctx.ref.run_layers(*args))[0]
        t_g = ctx.time_torch(lambda: ctx.ref.grad_layers(*args))[0]
        rows.append(_gradient_row(f"layers, autograd, {steps} steps", ctx.library("torch"),
                                  ctx.side.device, ctx.side.precision, t_f, t_g))
    return rows


# Work per (query, key) pair of one head on the blocked path; the O(n d²) per-token
# products are left out, so both floors are lower bounds (BENCHMARKS.md, "Mean-field scale").
def pair_work(d: int, gradient: bool) -> tuple[int, int]:
    """`(multiply-adds, exponentials)` per pair of one head: forward or gradient."""
    return (7 * d, 2) if gradient else (2 * d, 1)


def pair_floor(pairs: float, d: int, gradient: bool, peak_gflops: float,
               exps_per_s: float) -> dict:
    """The floor of `pairs` attention pairs: the larger of their flops (a
    multiply-add counts 2) at the matmul peak and their exps at the exp rate."""
    madds, exps = pair_work(d, gradient)
    matmul_s = 2 * madds * pairs / (peak_gflops * 1e9)
    exp_s = exps * pairs / exps_per_s
    return {"pairs": pairs, "madds_per_pair": madds, "exps_per_pair": exps,
            "floor_matmul_s": matmul_s, "floor_exp_s": exp_s,
            "floor_s": max(matmul_s, exp_s)}


def _floor_rates(preset: "Preset", ctx: Context) -> dict:
    """The matmul peak (the `peak` case's, else JAX's alone, measured now) and the
    exp rates of the mean-field floors, measured in this run."""
    repeats = max(ctx.rep.count, 3)
    peak = peak_of(ctx.peaks, ctx.precision)
    if not math.isfinite(peak):
        peak = jax_matmul_peak(preset.peak_size, ctx.precision, repeats, ctx.rep.budget_s)
    # The floor takes the fastest exp: streamed, in cache, or in registers.
    elements = preset.copy_bytes // 4
    stream = exp_rate(elements, repeats)
    cached = exp_rate(EXP_CACHED[0], repeats, EXP_CACHED[1])
    register = register_exp_rate(repeats, cached=cached)
    return {"matmul_peak_gflops": peak,
            "exp_per_s": max(stream, cached, register["exp_register_per_s"]), **register,
            "exp_elements": elements, "exp_stream_per_s": stream, "exp_cached_per_s": cached,
            "exp_cached_elements": EXP_CACHED[0], "exp_cached_sweeps": EXP_CACHED[1]}


def _mean_field_cases(prob: Problem, preset: "Preset", ctx: Context) -> list[dict]:
    """MF: one layer and its gradient at mean-field scale against their floors."""
    _, dyn, x0 = _setup(prob, ctx)
    x0, rates = x0[0], _floor_rates(preset, ctx)
    peak, tau = rates["matmul_peak_gflops"], 0.1

    def forward(dyn, x):
        return dyn.layer(0.0, x, tau)

    def gradient(dyn, x):
        return eqx.filter_grad(lambda dx: forward(*dx)[:, 0].sum())((dyn, x))

    pairs = prob.h * prob.n**2
    rows = []
    for variant, fn, grad in (("one layer", forward, False),
                              ("gradient of one layer (tokens, weights)", gradient, True)):
        floor = pair_floor(pairs, prob.d, grad, peak, rates["exp_per_s"])
        floor["floor_exp_stream_s"] = floor["exps_per_pair"] * pairs / rates["exp_stream_per_s"]
        row, _ = ctx.jax_row(CASES["meanfield"], f"{variant}, n={prob.n:,}", "jaxattn", fn,
                             dyn, x0, token_steps=prob.n, flops=2 * floor["madds_per_pair"] * pairs)
        row.update(floor, **rates, n=prob.n, d=prob.d, heads=prob.h,
                   blocked=dyn.blocked(prob.n, x0.dtype),
                   memory_source="compiled: temp + argument + output bytes",
                   # the peak bytes in use since the process started (GPUs), else None
                   device_peak_bytes=(jax.devices()[0].memory_stats() or {}).get(
                       "peak_bytes_in_use"),
                   ratio_to_floor=row["median_s"] / floor["floor_s"],
                   fraction_of_peak=row["gflops"] / peak)
        rows.append(row)
    rows[1]["gradient_over_forward"] = rows[1]["median_s"] / rows[0]["median_s"]
    return rows


def _looped_cases(preset: "Preset", ctx: Context) -> list[dict]:
    """S4 through `jaxattn.bench.loop_vs_hf` (needs torch and transformers)."""
    mod = _reference("loop_vs_hf") if ctx.side is not None else None
    if mod is None:
        return []
    prompts, tokens = preset.prompts, preset.tokens
    args = argparse.Namespace(prompts=prompts, tokens=tokens, passes=1, repeats=ctx.rep.count,
                              budget_s=ctx.rep.budget_s, seed=0, dtype="float32",
                              variants=["attn", "full"], chunk=None, precision=ctx.precision)
    rows = []
    for name in preset.models:
        for r in mod.bench_model(name, args, np.random.default_rng(0), log=None):
            d, L = r["d"], r["layers"]
            per_token = (24 if r["variant"] == "full" else 8) * d * d + 4 * tokens * d
            flops = prompts * tokens * L * per_token
            for lib, key in (("jaxattn", "jax_s_per_pass"),
                             (ctx.library("HuggingFace torch"), "hf_s_per_pass")):
                row = ctx.row(CASES["looped_models"], f"{name} {r['variant']}, 1 pass", lib,
                              Timing(**r[key]),
                              token_steps=prompts * tokens * L, flops=flops,
                              compile_s=r["jax_compile_s"] if lib == "jaxattn" else None)
                if lib != "jaxattn":
                    row["max_rel_diff_E_vs_jax"] = r["max_rel_diff_E"]
                rows.append(row)
    return rows


@dataclasses.dataclass(frozen=True)
class Preset:
    """One size of the suite: the problems by case (`gradient`'s is S2's), the layer and
    RK4 step counts, the peak product's side, the copied bytes, S4's models
    and prompts × tokens, and SN's Euler–Maruyama steps."""

    problems: dict
    steps: int
    rk4_steps: int
    peak_size: int
    copy_bytes: int
    models: tuple[str, ...]
    prompts: int
    tokens: int
    noisy_steps: int = 1000


_SMALL_MODELS = ("gpt2", "gpt-neo-125M")
PRESETS = {
    "quick": Preset({**QUICK, "gradient": QUICK["paper_causal"]}, 10, 20, 512, 2**24,
                    _SMALL_MODELS, 4, 32, noisy_steps=20),
    "default": Preset({**SIZES, "gradient": SIZES["paper_causal"]}, 100, 200, 4096, 2**28,
                      _SMALL_MODELS, 100, 200),
    "large": Preset({**LARGE, "gradient": SIZES["paper_causal"]}, 100, 200, 8192, 2**30,
                    ("gpt2-xl", "gpt-neo-2.7B"), 100, 200),
}


def run_suite(*, quick: bool = False, size: str | None = None, repeats: int = 3,
              budget_s: float = 30.0, cases=ALL_CASES, torch: bool = True,
              precision: str = "float32",
              progress: Callable[[str], None] = print) -> dict:
    """Run the benchmark suite on JAX's default device.

    **Arguments:**

    - `quick`: the `"quick"` sizes (the same as `size="quick"`); `size`: a name of
      `PRESETS` (default `"default"`).
    - `repeats`, `budget_s`: each figure is the median of `repeats` calls after
      compilation, fewer where another call would take it past `budget_s` seconds
      (at least one; each row records its `calls`).
    - `cases`: which cases to run, by name or short label (`CASES`); `torch`: time
      the PyTorch references (S4 needs them, and transformers: without, it is
      skipped, and `meta["skipped"]` says why).
    - `precision`: of JAX's products (`jaxattn._precision`); PyTorch's float32
      matmul mode is matched to it on a GPU.
    - `progress`: called with a line as each case starts.

    **Returns:**

    `{"peak_gflops": {precision: {...} | None} | None, "bandwidth": {...} | None,
    "rows": [...], "meta": {...}}`.
    """
    size = size or ("quick" if quick else "default")
    refuse_first([
        (size not in PRESETS, f"`size` must be one of {', '.join(map(repr, PRESETS))}, got "
                              f"{size!r}."),
        (quick and size != "quick", f"quick=True and size={size!r} disagree: give one of them."),
        repeats_refusal(repeats),
        (not (isinstance(budget_s, int | float) and budget_s > 0),
         f"`budget_s` must be a number of seconds > 0 (math.inf: no budget), got {budget_s!r}."),
        (isinstance(cases, str), f"`cases` is a list of cases, got the string {cases!r}: "
                                 f"write [{cases!r}]."),
    ])
    preset, precision = PRESETS[size], check_precision(precision)
    cases = case_names(cases)
    ref = _reference() if torch else None
    skipped = {}
    if "looped_models" in cases and (ref is None or _reference("loop_vs_hf") is None):
        skipped[CASES["looped_models"]] = ("times jaxattn against HuggingFace: needs torch and "
                                           "transformers" + ("" if torch else " (torch=False)"))
    side = TorchSide.choose(ref.torch, precision) if ref is not None else None
    ctx = Context(Repeats(repeats, budget_s), precision, side=side, ref=ref)
    start, seconds = time.perf_counter(), {}

    def stage(case, message):
        seconds[CASES[case]] = time.perf_counter()
        progress(f"{message}  [{time.perf_counter() - start:.0f} s]")

    if "peak" in cases:
        stage("peak", f"matmul peaks ({preset.peak_size}² per precision) and copy bandwidth")
        ctx = dataclasses.replace(
            ctx, peaks=matmul_peaks(preset.peak_size, max(repeats, 3), side, budget_s),
            bandwidth=copy_bandwidth(preset.copy_bytes, max(repeats, 3), side))
    rows, p = [], preset.problems
    stages = (
        ("small_systems", "S1: many tiny systems (layers and flow; fused and general paths)",
         lambda: _layers_case("small_systems", p["small_systems"], preset.rk4_steps, 1.0, ctx,
                              general=True)
         + _flow_cases("small_systems", p["small_systems"], 10.0, preset.rk4_steps, ctx,
                       general=True)),
        ("small_systems_large_batch",
         f"S1-large: {p['small_systems_large_batch'].batch:,} tiny systems, "
         f"{preset.rk4_steps} layers, against the floor",
         lambda: _layers_case("small_systems_large_batch", p["small_systems_large_batch"],
                              preset.rk4_steps, 1.0, ctx,
                              torch=jax.default_backend() != "cpu", floor=True)),
        ("noisy_small_systems", f"SN: {p['noisy_small_systems'].batch:,} noisy tiny systems, "
                                f"{preset.noisy_steps} Euler–Maruyama steps (jaxattn and torchsde)",
         lambda: _noisy_cases(p["noisy_small_systems"], preset.noisy_steps, ctx)),
        ("paper_causal", "S2: paper-size causal (layers)",
         lambda: _layers_case("paper_causal", p["paper_causal"], preset.steps, 0.1, ctx)),
        ("gpt2_sized", "S3: GPT-2-small-sized dynamics (layers)",
         lambda: _layers_case("gpt2_sized", p["gpt2_sized"], 12, 1.0, ctx)),
        ("gradient", "G: gradient through the S2 dynamics",
         lambda: _gradient_cases(p["gradient"], preset.steps, ctx)),
        ("meanfield", f"MF: one layer and its gradient at n = {p['meanfield'].n:,} "
                      "(mean-field scale), against the floor",
         lambda: _mean_field_cases(p["meanfield"], preset, ctx)),
        ("looped_models", f"S4: looped {' / '.join(preset.models)}, one pass "
                          "(jaxattn and HuggingFace)",
         lambda: _looped_cases(preset, ctx)),
    )
    for case, message, run in stages:
        if case in cases:
            stage(case, message)
            rows += run()
    end = time.perf_counter()
    marks = list(seconds.items()) + [("end", end)]
    meta = {**run_meta(size == "quick", repeats, size=size, precision=precision),
            "peak_size": preset.peak_size,
            "torch_device": side and side.device, "torch_precision": side and side.precision,
            "torch_note": side.note if side else "", "budget_s": budget_s, "skipped": skipped,
            "suite_s": end - start,
            "case_s": {c: marks[i + 1][1] - t for i, (c, t) in enumerate(marks[:-1])}}
    # Without the peak case there is no peak (null in the JSON, not NaN).
    return {"peak_gflops": ctx.peaks, "bandwidth": ctx.bandwidth, "rows": rows, "meta": meta}


def run_meta(quick: bool, repeats: int, **extra) -> dict:
    """What a benchmark result depends on: date, sizes, device, machine, flags, versions."""
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "quick": quick, "repeats": repeats,
        **extra, **device_meta(),
        "cpu_count": os.cpu_count(), "machine": platform.machine(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""), "versions": package_versions(),
    }
