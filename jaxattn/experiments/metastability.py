"""`metastability`: the `t → ∞` limit of the unnormalised attention flow (Geshkovski,
Koubbi, Polyanskiy, Rigollet, "Dynamic metastability in the self-attention model",
2024; their script `staircase.py`).

`n` tokens drawn uniformly on the sphere `S^{d−1}` follow the `usa` flow (weights
`exp(β(⟨x_i, x_j⟩ − 1)) / n`, the `exp` dynamics in time rescaled by `e^β`), in
float64 with adaptive implicit steps (`ja.solve_flow`, Kvaerno3), saved on a logarithmic grid
up to `--horizon` and stopped by an event once `--target` clusters are left
(`long_time.merged`). For each `β`: the interaction energy
`E = (1/n²) Σ_ij e^{β(⟨x_i, x_j⟩ − 1)}` (`ja.metrics.interaction_energy`) and the
cluster count over time; the plateaus of the count and the mergers between them
(`ja.metrics.plateaus`); on each plateau the index of the saddle the tokens sit near
(`long_time.cluster_index`: `ja.metrics.saddle_index`, the number of unstable
directions of the tangent Hessian of `E`, the clusters taken as point masses) and
the length the paper's mechanism predicts, the two closest clusters alone
(`long_time.two_cluster_time`: `n e^{β(1 − cos δ)} / ((m_a + m_b) β sin² δ)`,
exponential in `β`), beside the measured one.
"""

import math
from pathlib import Path

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from .._app import figures
from .._dynamics import SelfAttentionDynamics
from .._flow import solve_flow
from .._manifold import sample_ellipsoid
from ..metrics import cluster_count, interaction_energy, plateaus
from .base import AbstractExperiment, Param, Verdict
from .long_time import cluster_index, log_grid, merged, two_cluster_time
from .verdicts import short

#: A small run for tests and smoke checks: `jaxattn run metastability` with these.
QUICK = {"tokens": 8, "betas": 2, "beta_min": 20.0, "beta_max": 30.0, "saves": 80}

#: The first positive save time of the log grid.
T_MIN = 1e-3


def betas(config) -> np.ndarray:
    """`--betas` inverse temperatures from `--beta-min` to `--beta-max` (linear: the
    plateaus' logarithms are linear in β)."""
    if config["beta_max"] < config["beta_min"]:
        raise ValueError(f"--beta-max ({config['beta_max']!r}) must be ≥ --beta-min "
                         f"({config['beta_min']!r}).")
    return np.linspace(config["beta_min"], config["beta_max"], config["betas"])


def run_beta(x0, beta: float, ts, config) -> dict[str, np.ndarray]:
    """One `β`'s run: its save times (`inf` after the stop), tokens, energy, count."""
    eye = jnp.eye(x0.shape[-1])[None]
    dyn = SelfAttentionDynamics(eye, eye, beta=beta, kernel="usa")
    # Kvaerno3, implicit: the modes inside a cluster decay at rate ~1 while clusters
    # drift at e^{−β(1 − cos δ)}, so an explicit solver is held to steps of ~1 by
    # stability (Tsit5: ~10⁴ steps per decade past t = 10⁴); the implicit one takes
    # ~10³ steps to t = 10¹⁰ (measured at n = 8, β = 20, rtol 1e-6).
    sol = solve_flow(dyn, x0, jnp.asarray(ts), solver=diffrax.Kvaerno3(), solution=True,
                     event=merged(config["eps"], config["target"]), rtol=config["rtol"],
                     atol=config["rtol"] * 1e-2, max_steps=config["max_steps"])
    ys = jnp.where(jnp.isfinite(sol.ts)[:, None, None], sol.ys, x0)  # inf → placeholders
    return {"ts": np.asarray(sol.ts), "ys": np.asarray(ys),
            "E": np.where(np.isfinite(sol.ts), np.asarray(interaction_energy(ys, beta)),
                          np.nan),
            "count": np.asarray(cluster_count(ys, config["eps"])),
            "t1": np.asarray(sol.t1), "steps": np.asarray(sol.stats["num_steps"])}


def study(data, config) -> list[dict]:
    """Per `β`: its plateaus of the cluster count, each with its start, end, the
    count, the saddle index and the measured and predicted lengths."""
    out = []
    for b, beta in enumerate(data["betas"]):
        ts, count, ys = data["ts"][b], data["count"][b].astype(float), data["ys"][b]
        stair = plateaus(ts, count, 0.5)
        finite = np.flatnonzero(np.isfinite(ts))
        rows, start = [], 0.0
        for k in range(len(stair.levels)):
            first = int(np.searchsorted(ts[finite], stair.starts[k]))
            last = int(np.searchsorted(ts[finite], stair.ends[k]))
            mid = (first + last) // 2
            end = float(stair.jumps[k]) if k < len(stair.jumps) else math.inf
            log_pred, delta = two_cluster_time(ys[first], float(beta), config["eps"])
            rows.append({"clusters": int(stair.levels[k]), "start": start, "end": end,
                         "length": end - start,
                         "predicted_length": math.exp(log_pred) if log_pred < 700 else math.inf,
                         "delta": delta,
                         "saddle_index": cluster_index(ys[mid], float(beta), config["eps"])})
            start = end
        out.append({"beta": float(beta), "mergers": [float(t) for t in stair.jumps],
                    "plateaus": rows, "t1": float(data["t1"][b]),
                    "steps": int(data["steps"][b])})
    return out


def long_plateaus(per_beta) -> list[tuple[float, float, float]]:
    """`(β, measured, predicted)` lengths of the plateaus that end in a merger and last
    longer than 10 (the exponential regime; the first plateaus are the initial
    transient)."""
    return [(s["beta"], p["length"], p["predicted_length"]) for s in per_beta
            for p in s["plateaus"] if math.isfinite(p["end"]) and p["length"] > 10
            and p["clusters"] > 1 and math.isfinite(p["predicted_length"])]


class Metastability(AbstractExperiment):
    name = "metastability"
    title = ("Dynamic metastability (Geshkovski et al. 2024): the energy staircase of the usa "
             "flow to t = 10¹² and the saddles on its plateaus")
    theorem = "Geshkovski, Koubbi, Polyanskiy, Rigollet 2024: exponentially long plateaus"
    params = (
        Param("tokens", int, 8, "number of tokens n (80 and beyond: see the README)", 2),
        Param("dim", int, 2, "dimension d (2: the circle, 3: the sphere)", 2),
        Param("beta_min", float, 10.0, "smallest β", 0.0),
        Param("beta_max", float, 20.0, "largest β", 0.0),
        Param("betas", int, 3, "number of β values", 1),
        Param("horizon", float, 1e8, "final time T of the usa flow (log-spaced saves)", 0.0),
        Param("saves", int, 240, "number of log-spaced save times from 10⁻³ to T", 2),
        Param("eps", float, 1e-2, "linking distance of a cluster (Euclidean)", 0.0),
        Param("target", int, 1, "stop once this many clusters are left (1: consensus)", 1),
        Param("rtol", float, 1e-7, "relative tolerance of the adaptive steps", 0.0),
        Param("max_steps", int, 1_000_000, "step budget of each run", 1),
    )

    def simulate(self, config, progress):
        bs = betas(config)
        if config["horizon"] <= T_MIN:
            raise ValueError(f"--horizon must be > {T_MIN:g}, got {config['horizon']!r}.")
        ts = log_grid(T_MIN, config["horizon"], config["saves"])
        x0 = sample_ellipsoid(jax.random.PRNGKey(config["seed"]), config["tokens"],
                              config["dim"], dtype=jnp.float64)
        runs = []
        for beta in tqdm(bs, desc=self.name, disable=not progress, leave=False):
            runs.append(run_beta(x0, float(beta), ts, config))
        data = {k: np.stack([r[k] for r in runs]) for k in runs[0]}
        return data | {"betas": bs, "x0": np.asarray(x0)}

    def verdict(self, config, data):
        per_beta = study(data, config)
        pairs = long_plateaus(per_beta)
        ratio = [math.log10(m / p) for _, m, p in pairs]
        worst = max((abs(r) for r in ratio), default=math.nan)
        last = per_beta[-1]
        indices = [p["saddle_index"] for p in last["plateaus"]]
        counts = [p["clusters"] for p in last["plateaus"]]
        circle = config["dim"] == 2
        final = short(last["mergers"][-1]) if last["mergers"] else "none"
        # the first plateau is the initial scatter, not yet near a saddle
        ok = bool(pairs) and worst < 1 and (not circle or all(
            i == c - 1 for i, c in zip(indices[1:], counts[1:])))
        line = (f"n = {config['tokens']}, d = {config['dim']}, β = {short(data['betas'][0])}…"
                f"{short(data['betas'][-1])}: at β = {short(last['beta'])}, "
                f"{len(last['mergers'])} mergers, the last at t = {final}"
                f" (stopped at t = {short(last['t1'])}); clusters {counts} on the plateaus, "
                f"saddle indices {indices}; {len(pairs)} plateaus longer than 10 last "
                f"within 10^{short(worst)} of the two-cluster prediction "
                f"n e^(β(1 − cos δ))/((m_a + m_b) β sin² δ)")
        numbers = {"mergers": len(last["mergers"]), "worst_log10_ratio": worst,
                   "long_plateaus": len(pairs), "steps": int(np.sum(data["steps"]))}
        return Verdict(ok, line, numbers, {"per_beta": _finite(per_beta)})

    def draw(self, config, data, folder: Path):
        plt = figures.pyplot()
        per_beta = study(data, config)
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
        colors = plt.cm.viridis(np.linspace(0, 0.85, len(data["betas"])))
        for b, (s, c) in enumerate(zip(per_beta, colors)):
            ts = data["ts"][b]
            keep = np.isfinite(ts) & (ts > 0)
            axes[0].plot(ts[keep], data["E"][b][keep], "-", color=c, label=f"β = {s['beta']:g}")
            axes[1].step(ts[keep], data["count"][b][keep], where="post", color=c,
                         label=f"β = {s['beta']:g}")
            for t in s["mergers"]:
                axes[0].axvline(t, color=c, lw=0.6, ls=":")
        axes[0].set(xscale="log", xlabel="time t (usa flow)", ylabel="energy E",
                    title="the energy staircase (dotted: mergers)", ylim=(0, 1.05))
        axes[1].set(xscale="log", xlabel="time t (usa flow)",
                    ylabel=f"clusters (link distance {config['eps']:g})",
                    title="cluster count")
        figures.integer_ticks(axes[1].yaxis)
        figures.legend_below(axes[0], ncol=3)
        self._draw_lengths(axes[2], long_plateaus(per_beta))
        return figures.save_figure(
            fig, self.stem(folder),
            f"Dynamic metastability: n = {config['tokens']} tokens on $S^{{{config['dim'] - 1}}}$, "
            f"usa kernel, float64, log-spaced saves to t = {config['horizon']:g}")

    @staticmethod
    def _draw_lengths(ax, pairs):
        if pairs:
            beta, measured, predicted = (np.array(v) for v in zip(*pairs))
            ax.plot(beta, measured, "o", color="C0", label="measured plateau length")
            ax.plot(beta, predicted, "x", color="C3", ms=8,
                    label=r"two clusters: $n e^{\beta(1-\cos\delta)}/((m_a+m_b)\beta\sin^2\delta)$")
        ax.set(yscale="log", xlabel=r"$\beta$", ylabel="plateau length (usa time)",
               title="plateaus longer than 10, against the prediction")
        figures.legend_below(ax, ncol=1)


def _finite(value):
    """`value` with infinite and NaN floats as `None` (JSON)."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
