"""Scaling sweeps behind `jaxattn bench --scaling`: time of `ja.run_layers` versus
the number of tokens `n`, the dimension `d`, the batch `B` and the number of devices.

Every point times `run_layers(dyn, x0, layers, tau, observe=misalignment)` as the
suite's S2/S3 cases do. One sweep varies one size, the others stay at `SETUP`'s
(`QUICK_SETUP`'s for a smoke test). The ideal curve (dashed): for n and d the flop
count `L · B · (4 h n d² + 4 h n² d)`, for the batch time ∝ `B`, its constant fitted
in log space to the upper half of the sizes; for devices time ∝ 1/devices, in a
subprocess with `XLA_FLAGS=--xla_force_host_platform_device_count=N` (forced CPU
devices share the cores). The measured figure: BENCHMARKS.md ("Scaling").
"""

import dataclasses
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from .._artifacts.figures import pyplot, save_figure
from .._layers import run_layers
from .._validate import refuse_first
from ..metrics import fit_slope, misalignment
from .suite import Problem, flops_raw_update, run_meta
from .timing import Timing, repeats_refusal, time_jax


@dataclasses.dataclass(frozen=True)
class Setup:
    """One point of a sweep: sizes of `run_layers(dyn, x0, layers, tau)`."""

    n: int
    d: int
    h: int
    batch: int
    layers: int
    tau: float = 0.1
    devices: int | None = None

    def flops(self) -> float:
        return self.layers * self.batch * flops_raw_update(self.n, self.d, self.h)


SETUP = Setup(n=128, d=64, h=2, batch=16, layers=10)
SIZES = {
    "n": (32, 64, 128, 256, 512),
    "d": (16, 32, 64, 128, 256, 512),
    "batch": (1, 4, 16, 64, 256, 1024),
    "devices": (1, 2, 4),
}
QUICK_SETUP = Setup(n=16, d=8, h=2, batch=4, layers=3)
QUICK_SIZES = {"n": (8, 16, 32), "d": (4, 8, 16), "batch": (1, 32, 1024), "devices": (1, 2, 4)}
SWEEPS = ("n", "d", "batch", "devices")


def cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def machine() -> str:
    """A one-line description of this machine (CPU model, cores, jax backend)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{cpu}, {cores()} cores, {platform.machine()}, "
            f"jax {jax.__version__} on {jax.default_backend()}")


def time_point(setup: Setup, repeats: int) -> dict:
    """Seconds per call of `run_layers` at `setup`: median, min, max and compile time."""
    prob = Problem(n=setup.n, d=setup.d, h=setup.h, batch=setup.batch, causal=False)
    arrays = prob.arrays()
    dyn, x0 = prob.dynamics(arrays), jnp.asarray(arrays["x0"])
    if setup.devices is None:
        def fwd(dyn, x0):
            return run_layers(dyn, x0, setup.layers, setup.tau, observe=misalignment)

        timing, compile_s, _, _ = time_jax(fwd, dyn, x0, repeats=repeats)
    else:
        # Called as a user calls it, so that `devices=` places the batch before the
        # compiled program runs; under an outer `jax.jit` that placement would be
        # traced too, and XLA may then replicate the whole batch on every device.
        def call():
            return jax.block_until_ready(run_layers(
                dyn, x0, setup.layers, setup.tau, observe=misalignment, devices=setup.devices))

        t0 = time.perf_counter()
        call()
        compile_s = time.perf_counter() - t0  # compilation and one run
        timing = Timing.of(call, repeats)  # after an untimed call
    return {"median_s": timing.median, "min_s": timing.min, "max_s": timing.max,
            "compile_s": compile_s, "gflops": setup.flops() / timing.median / 1e9}


def measure(name: str, sizes, setup: Setup, repeats: int,
            progress: Callable[[str], None] = print) -> dict:
    """Time `run_layers` at each size of `name` ("n", "d", "batch" or "devices")."""
    points = []
    for size in sizes:
        progress(f"{name} = {size}")
        points.append(time_point(dataclasses.replace(setup, **{name: size}), repeats))
    return {"sizes": list(sizes), **{key: [p[key] for p in points] for key in points[0]}}


def _log_slope(x, y) -> float:
    """The least-squares slope of `log y` against `log x` (NaN under two points)."""
    return fit_slope(np.log(x), np.log(y))[0]


def _upper(values):
    return list(values)[len(values) // 2:]


def ideal(name: str, sizes, medians, setup: Setup, ncores: int) -> dict:
    """The ideal curve of one sweep (see the module docstring) and its slope."""
    x = np.asarray(sizes, float)
    s = setup
    if name in ("n", "d"):
        model = np.array([dataclasses.replace(s, **{name: v}).flops() for v in sizes])
        ends = [(s.d + 2 * v) / (s.d + v) if name == "n" else (2 * v + s.n) / (v + s.n)
                for v in (x[0], x[-1])]
        out = {"proportional_to": "flops L·B·(4 h n d² + 4 h n² d)",
               "slope": _log_slope(x, model), "local_slope": ends}
    elif name == "batch":
        model, out = x, {"proportional_to": "B (once the machine is saturated)", "slope": 1.0}
    else:
        model = 1 / x
        out = {"proportional_to": "1/devices", "slope": -1.0, "cores": ncores,
               "core_limited_s": [medians[0] / min(v, ncores) for v in sizes],
               "note": (f"forced CPU devices share {ncores} cores, so no speed-up is "
                        f"possible beyond {ncores} devices (less where one device's threads "
                        "already use several)")}
        return {**out, "anchor": "the one-device point",
                "curve_s": list(medians[0] / model[0] * model)}
    scale = float(np.exp(np.mean(np.log(_upper(medians)) - np.log(_upper(model)))))
    return {**out, "anchor": "constant fitted (log space) to the upper half of the sizes",
            "curve_s": list(scale * model)}


def _summarise(name, data, setup, ncores) -> dict:
    data["fitted_slope"] = _log_slope(data["sizes"], data["median_s"])
    data["fitted_slope_upper_half"] = _log_slope(_upper(data["sizes"]), _upper(data["median_s"]))
    data["ideal"] = ideal(name, data["sizes"], data["median_s"], setup, ncores)
    data["fixed"] = {k: v for k, v in dataclasses.asdict(setup).items()
                     if k != name and not (k == "devices" and v is None)}
    return data


def measure_devices(sizes, setup: Setup, repeats: int) -> dict:
    """The device sweep in a fresh process with `max(sizes)` forced CPU devices."""
    flag = f"--xla_force_host_platform_device_count={max(sizes)}"
    root = str(Path(__file__).resolve().parents[2])  # the folder that holds jaxattn/
    env = dict(os.environ, XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip(),
               JAX_PLATFORMS="cpu", JAX_ENABLE_X64="0",
               PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    spec = {"sizes": list(sizes), "setup": dataclasses.asdict(setup), "repeats": repeats}
    # Progress goes to the inherited stderr; the result is the last line of stdout.
    proc = subprocess.run([sys.executable, "-m", __name__, json.dumps(spec)], env=env,
                          stdout=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"the device sweep's subprocess failed (exit status "
                           f"{proc.returncode}); its error is printed above.")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_scaling(*, quick: bool = False, repeats: int = 5, sweeps=SWEEPS,
                progress: Callable[[str], None] = print) -> dict:
    """Run the scaling sweeps; returns a JSON-able dict (see the module docstring).

    **Returns:** `{"meta": ..., "setup": ..., "sweeps": {name: {"sizes", "median_s",
    "min_s", "max_s", "compile_s", "gflops", "fitted_slope",
    "fitted_slope_upper_half", "ideal", "fixed"}}}`.
    """
    refuse_first([repeats_refusal(repeats)])
    setup, sizes = (QUICK_SETUP, QUICK_SIZES) if quick else (SETUP, SIZES)
    ncores = cores()
    out = {}
    for name in sweeps:
        if name == "devices":
            progress(f"scaling: devices = {', '.join(map(str, sizes[name]))} "
                     "(subprocess with forced CPU devices)")
            data = measure_devices(sizes[name], setup, repeats)
        else:
            with jax.enable_x64(False):  # float32 whatever the caller's setting
                data = measure(name, sizes[name], setup, repeats,
                               progress=lambda m: progress(f"scaling: {m}"))
        out[name] = _summarise(name, data, setup, ncores)
    meta = {**run_meta(quick, repeats), "cores": ncores, "machine_description": machine()}
    return {"meta": meta, "setup": dataclasses.asdict(setup), "sweeps": out}


def format_summary(result: dict) -> str:
    """One line per sweep: sizes, the time range and the fitted against ideal slope."""
    lines = [f"{'sweep':8} {'sizes':>12} {'time range (median)':>24} {'slope':>6} "
             f"{'upper':>6} {'ideal':>6}"]
    for name, s in result["sweeps"].items():
        span = f"{s['sizes'][0]}…{s['sizes'][-1]}"
        times = f"{s['median_s'][0]:.3g} … {s['median_s'][-1]:.3g} s"
        lines.append(f"{name:8} {span:>12} {times:>24} {s['fitted_slope']:6.2f} "
                     f"{s['fitted_slope_upper_half']:6.2f} {s['ideal']['slope']:6.2f}")
    return "\n".join(lines)


_LABELS = {
    "n": ("tokens n", "tokens n (d = {d}, batch {batch})"),
    "d": ("dimension d", "dimension d (n = {n}, batch {batch})"),
    "batch": ("batch B (sequences per call)", "batch B (n = {n}, d = {d})"),
    "devices": ("forced CPU devices (batch sharded)", "devices (n = {n}, d = {d}, batch {batch})"),
}


def _draw(ax, name, s, setup) -> None:
    x, med = np.asarray(s["sizes"], float), np.asarray(s["median_s"])
    err = [med - np.asarray(s["min_s"]), np.asarray(s["max_s"]) - med]
    handles = [ax.errorbar(x, med, yerr=err, fmt="o-", color="tab:blue", capsize=3,
                           label=f"measured: median, min–max (fitted slope "
                                 f"{s['fitted_slope']:.2f})")]
    ideal_ = s["ideal"]
    local = ideal_.get("local_slope")
    local = f", local {local[0]:.2f} → {local[1]:.2f}" if local else ""
    handles += ax.plot(x, ideal_["curve_s"], "--", color="0.3",
                       label=f"ideal ∝ {ideal_['proportional_to']}\n"
                             f"(slope {ideal_['slope']:.2f}{local})")
    lo, hi = x[0] / 1.25, x[-1] * 1.25
    if name == "devices":
        handles += ax.plot(x, ideal_["core_limited_s"], ":", color="tab:red",
                           label=f"best possible on {ideal_['cores']} cores")
        note = ideal_["note"].replace(" (", "\n(").replace(", so", ",\nso")
        if x[-1] > ideal_["cores"]:
            handles.append(ax.axvspan(ideal_["cores"], hi, color="0.92", zorder=0, label=note))
        else:
            handles += ax.plot([], [], " ", label=note)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xticks(x, [f"{v:g}" for v in x])
    ax.set_xlabel(_LABELS[name][0])
    ax.set_ylabel("seconds per call")
    ax.set_title(_LABELS[name][1].format(**setup), fontsize=10)
    ax.legend(handles=handles, fontsize=7, loc="best")


def write_figure(result: dict, stem) -> list[Path]:
    """The sweeps as 2×2 log-log panels, written as `stem.png` and `stem.pdf`."""
    fig, axes = pyplot().subplots(2, 2, figsize=(11, 8.5))
    setup = result["setup"]
    for ax, name in zip(axes.flat, SWEEPS):
        if name in result["sweeps"]:
            _draw(ax, name, result["sweeps"][name], setup)
        else:
            ax.set_visible(False)
    meta = result["meta"]
    title = (f"ja.run_layers: {setup['layers']} layers, h = {setup['h']}, full attention, "
             f"float32, median of {meta['repeats']}{' (quick sizes)' if meta['quick'] else ''}"
             f"\n{meta['machine_description']}")
    return save_figure(fig, stem, title)


def _worker(spec: str) -> None:
    """The device sweep's subprocess: measure, print the result as one JSON line."""
    spec = json.loads(spec)
    data = measure("devices", spec["sizes"], Setup(**spec["setup"]), spec["repeats"],
                   progress=lambda m: print(f"· scaling: {m}", file=sys.stderr, flush=True))
    print(json.dumps(data))


if __name__ == "__main__":
    _worker(sys.argv[1])
