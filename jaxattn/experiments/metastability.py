"""`metastability`: the `t → ∞` limit of the unnormalised attention flow (Geshkovski,
Koubbi, Polyanskiy, Rigollet, "Dynamic metastability in the self-attention model",
2024; their script `staircase.py`).

`n` uniform tokens on `S^{d−1}` follow the `usa` flow in float64 on a logarithmic grid
(`--integrator plain`: `ja.solve_flow`, Kvaerno3; `rescaled`: `long_time.rescaled_flow`),
read as plateaus and mergers (`ja.metrics.plateaus`) against the two-cluster merge time
(`long_time`) and `cascade`'s prediction from `x(0)` and `β` alone, with each plateau's
saddle index. What is judged (`verdict`), the mechanism, the integrators and the
measured numbers: `docs/limits.md` ("Metastability and long horizons").
"""

import math
from pathlib import Path

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from .._artifacts import figures
from .._dynamics import SelfAttentionDynamics
from .._flow import solve_flow
from .._manifold import sample_ellipsoid
from .._programs import kept_jit
from .._validate import SimulationError
from ..metrics import cluster_count, fit_slope, interaction_energy, plateaus
from .base import AbstractExperiment, Param, Verdict
from .long_time import (
    SNAP,
    cluster_index,
    clusters,
    coupling_span,
    groups,
    log_grid,
    merge_time,
    merged,
    rescaled_flow,
    two_cluster_time,
    weakest_coupling,
)
from .verdicts import finite_or_none, short

#: A small run for tests and smoke checks: `jaxattn run metastability` with these.
QUICK = {"tokens": 8, "betas": 2, "beta_min": 20.0, "beta_max": 30.0, "saves": 80}

#: The first positive save time of the log grid.
T_MIN = 1e-3
#: A final merger's time against the exact two-cluster integral: at most this apart
#: (relative; measured 6e-6 at n = 8, β = 10; Laplace's term is 4 % high there).
FINAL_TOL = 0.01
#: A plateau is post-transient (judged) when it is not the first and lasts at least
#: this many times the time before it: a decade on the log time axis, a separation of
#: time scales. A plateau 2× its start (n = 8, β = 30: 4 clusters from t = 15 to 46)
#: is still the drift of the first mergers, not the point masses the cascade assumes
#: (its log-length 3.44 against the cascade's 4.43); the judged ones measured 32× and
#: more (`docs/limits.md`).
SEPARATION = 10.0
#: Other post-transient plateaus: within this many decades of the integral.
DECADES = 1.0
#: A post-transient plateau's log-length against `cascade`'s prediction from `x(0)`:
#: at most this apart, relative in the log (so that it holds at β = 500, where a
#: plateau lasts 10²⁸³; measured ≤ 1.9 %, `docs/limits.md`).
CASCADE_TOL = 0.05
#: The growth of a plateau's log-length in `β` (the `c` of `e^{cβ}`, fitted over the
#: `β` where it ended) against `cascade`'s: at most this apart (relative; measured
#: 1.2 % and 4.6 %, `docs/limits.md`; an exponent 10 % off is past it).
RATE_TOL = 0.075
#: The smallest linking distance: float64 unit vectors are not resolved closer (and
#: the squared distances of a smaller one underflow, linking every token at t = 0).
EPS_MIN = 1e-12
#: A plateau's saddle index is judged where its clusters' couplings span at most this
#: many decades (`long_time.coupling_span`): a float64 Hessian rounds the weaker
#: couplings' modes away (`docs/limits.md`).
SPAN_MAX = 6.0
#: ... and where their weakest coupling (`long_time.weakest_coupling`) is at least
#: this `log₁₀`: 16 decades (float64's precision) above its smallest normal number
#: (`10⁻³⁰⁸`), so that `β(1 − cos δ) ≲ 670`. Past `≈ 708` the couplings underflow, the
#: Hessian is all zeros and its index `0` at any `k` (two clusters at δ = 1.78 and
#: β = 800 read `0`, not `1`); the span alone, `0` for two clusters, cannot see it.
COUPLING_FLOOR = math.log10(np.finfo(np.float64).tiny) + 16
#: The largest `β` (`--beta`, `--beta-max`): the exact two-cluster integral
#: (`long_time.merge_time`) has its peak at `δ₀` of width `1/(β sin δ₀)`; scipy's
#: `quad` meets its tolerance for `δ₀` from 0.011 to π up to `β = 10⁸`, warns of
#: roundoff from `10⁹`, misses the peak from `≈ 10¹⁷` (the log 8 off) and returns 0
#: from `10¹⁸` (no logarithm: a run at β = 10³⁰⁰ failed after its simulation).
BETA_MAX = 1e8
#: The smallest `--rtol` of the rescaled integrator (which takes at most `SNAP/1000`):
#: its log-time `τ ≤ 709` is resolved to `10⁻¹³`.
RTOL_MIN = 1e-13
#: The largest `--rtol`: at 1e-3 the final merger at β = 20 (6 tokens) came out 7 % late,
#: about the verdict's tolerance, which then judged the solver, not the theorem.
RTOL_MAX = 1e-5
#: The largest `--log-horizon`: float64 times end at 1.8·10³⁰⁸.
LOG_HORIZON_MAX = 308.0


def final_time(config) -> float:
    """The run's final time: `10^{--log-horizon}` where it is set (the rescaled
    integrator), else `--horizon`."""
    log = config.get("log_horizon", 0.0)
    return 10.0 ** log if log else config.horizon


def rescaled(config) -> bool:
    """Whether the run steps in the rescaled time (`--integrator rescaled`)."""
    return config.get("integrator", 0) == 1


def betas(config) -> np.ndarray:
    """`--betas` inverse temperatures from `--beta-min` to `--beta-max` (linear: the
    plateaus' logarithms are linear in β), or `--beta` alone where it is set."""
    if config.get("beta", 0.0):
        return np.array([config.beta])
    return np.linspace(config.beta_min, config.beta_max, config.betas)


def run_beta(x0, beta: float, ts, config, stop) -> dict[str, np.ndarray]:
    """One `β`'s run: its save times (`inf` after the stop), tokens, energy, count
    (and with the rescaled integrator every merger's time, located by its event).
    `stop` is the plain run's event (`merged`), one function for every `β`: its
    solve is then one program, traced once (`β` is a leaf of the model)."""
    if rescaled(config):
        out = rescaled_flow(x0, beta, ts, eps=config.eps, target=config.target,
                            rtol=min(config.rtol, SNAP / 1000))
        _, E, count = readings(out["ts"], out["ys"], out["ys"], beta, eps=config.eps)
        return out | {"E": np.asarray(E), "count": np.asarray(count)}
    eye = np.eye(x0.shape[-1])[None]
    dyn = SelfAttentionDynamics(eye, eye, beta=beta, kernel="usa")
    # implicit: an explicit solver is held to steps of ~1 by the clusters' stiffness
    # (docs/limits.md, "Stiffness, and the implicit solver")
    sol = solve_flow(dyn, x0, ts, solver=diffrax.Kvaerno3(), solution=True, event=stop,
                     rtol=config.rtol, atol=config.rtol * 1e-2, max_steps=config.max_steps,
                     throw=False)
    if not bool(sol.success):  # in the flags of this command, not `solve_flow`'s arguments
        raise SimulationError(plain_failure(sol.result, beta, config))
    ys, E, count = readings(sol.ts, sol.ys, x0, beta, eps=config.eps)
    return {"ts": np.asarray(sol.ts), "ys": np.asarray(ys), "E": np.asarray(E),
            "count": np.asarray(count), "t1": np.asarray(sol.t1),
            "steps": np.asarray(sol.stats["num_steps"])}


@kept_jit(static_argnames=("eps",))
def readings(ts, ys, fill, beta, *, eps: float):
    """The saves after the stop (`ts` inf) replaced by `fill`, the energy at each
    save (NaN after the stop) and the cluster count: one program for every `β`."""
    finite = jnp.isfinite(ts)
    ys = jnp.where(finite[:, None, None], ys, fill)
    return ys, jnp.where(finite, interaction_energy(ys, beta), jnp.nan), cluster_count(ys, eps)


def plain_failure(result, beta: float, config) -> str:
    """The one line for a plain run that did not reach its final time or its event:
    out of `--max-steps`, or another failure (tokens that became NaN or inf), with
    the fix in this command's flags."""
    if result == diffrax.RESULTS.max_steps_reached:
        return (f"the plain integrator used its --max-steps {config.max_steps} before "
                f"t = {final_time(config):g} at β = {beta:g}: raise --max-steps, shorten "
                "--horizon (or --log-horizon), or add --integrator rescaled.")
    what = ("the tokens became NaN or inf" if result == diffrax.RESULTS.successful
            else diffrax.RESULTS[result].split(". ")[0].rstrip("."))
    return (f"the plain integrator failed at β = {beta:g} ({what}): lower --rtol, or add "
            "--integrator rescaled.")


def study(data, config) -> list[dict]:
    """Per `β`: its plateaus of the cluster count, each with its start, end (the run's
    stop `t1` for the last one when the event fired: the final merger), the count,
    the saddle index, whether it is post-transient, resolved (`SPAN_MAX`,
    `COUPLING_FLOOR`) and made of the cascade's clusters (`cascade_groups`), and the
    measured time from its first save to its end beside the exact and Laplace
    two-cluster predictions from that save."""
    out = []
    # the cascade's clusters, as sets of tokens, for each count (the same at every β)
    predicted = cascade_groups(data["x0"], config.eps) if "x0" in data else {}
    for b, beta in enumerate(data["betas"]):
        ts, count, ys = data["ts"][b], data["count"][b].astype(float), data["ys"][b]
        t1 = float(data["t1"][b])
        stopped = t1 < final_time(config)  # the event fired: the final merger
        stair = plateaus(ts, count, 0.5)
        # the rescaled integrator's mergers are located by its events; else the
        # staircase's jumps (between two saves)
        exact = np.sort(data["mergers"][b]) if "mergers" in data else None
        finite = np.flatnonzero(np.isfinite(ts))
        rows, start = [], 0.0
        for k in range(len(stair.levels)):
            first = int(np.searchsorted(ts[finite], stair.starts[k]))
            last = int(np.searchsorted(ts[finite], stair.ends[k]))
            mid = (first + last) // 2
            final = k == len(stair.levels) - 1 and stopped
            end = float(stair.jumps[k]) if k < len(stair.jumps) else (t1 if final else math.inf)
            if exact is not None and k < len(stair.jumps):
                end = float(exact[np.searchsorted(exact, stair.ends[k], side="right")])
            log_laplace, delta = two_cluster_time(ys[first], float(beta), config.eps)
            log_exact = merge_time(ys[first], float(beta), config.eps)
            length = end - start
            span = coupling_span(ys[mid], float(beta), config.eps)
            weakest = weakest_coupling(ys[mid], float(beta), config.eps)
            level = int(stair.levels[k])
            rows.append({"clusters": level, "start": start, "end": end,
                         "coupling_span": span, "weakest_coupling": weakest,
                         "resolved": span <= SPAN_MAX and weakest >= COUPLING_FLOOR,
                         "length": length, "final": final,
                         "post_transient": k > 0 and length >= SEPARATION * start,
                         "cascade": k > 0 and predicted.get(level) == groups(ys[mid],
                                                                             config.eps),
                         "from": float(ts[first]), "measured": end - float(ts[first]),
                         "predicted_exact": _exp(log_exact),
                         "predicted_laplace": _exp(log_laplace), "delta": delta,
                         "saddle_index": cluster_index(ys[mid], float(beta), config.eps)})
            start = end
        mergers = ([float(t) for t in exact if math.isfinite(t)] if exact is not None else
                   [float(t) for t in stair.jumps] + ([t1] if stopped else []))
        out.append({"beta": float(beta), "mergers": mergers, "final_merger":
                    t1 if stopped else None, "plateaus": rows, "t1": t1,
                    "steps": int(data["steps"][b])})
    return out


def cascade(x0: np.ndarray, beta: float, eps: float) -> dict[int, float]:
    """The plateau lengths predicted from the initial tokens and `β` alone: the
    clusters of `x0` at distance `eps` as point masses; the closest two merge, after
    the exact two-cluster time (`long_time.merge_time`, the others held still: their
    couplings are exponentially weaker), into one at their mass-weighted mean
    direction; repeated down to one cluster. Each plateau lasts `e^{β(1 − cos δ)}`
    to leading order (Geshkovski et al. 2024), `δ` its closest pair's angle.

    **Returns:**

    `{k: log length of the plateau with k clusters}`, for `k` from the clusters of
    `x0` down to 2.
    """
    return {len(means): merge_time(np.repeat(means, masses, axis=0), beta, eps)
            for means, masses, _ in _closest_merges(x0, eps) if len(means) > 1}


def cascade_groups(x0: np.ndarray, eps: float) -> dict[int, frozenset]:
    """The clusters of each plateau of `cascade`, as sets of token indices
    (`long_time.groups`): `{k: the partition of the tokens into k clusters}`, from the
    clusters of `x0` down to 1. The merge order is `cascade`'s (the closest two mean
    directions), which does not depend on `β`.

    A plateau is compared with the cascade only where its clusters are these
    (`compared`): the cascade predicts the lengths of its own plateaus, and a plateau
    of the same count made of other tokens (the flow's first mergers, many at once,
    need not follow the cascade's closest-pair order) is another state."""
    return {len(means): frozenset(frozenset(g) for g in members)
            for means, _, members in _closest_merges(x0, eps)}


def _closest_merges(x0: np.ndarray, eps: float):
    """`cascade`'s states: each `(means (k, d), masses (k,), members)`, `members` the
    tokens of each cluster, from the clusters of `x0` down to one."""
    means, masses = clusters(x0, eps)  # in the order of their first tokens
    members = sorted((sorted(g) for g in groups(x0, eps)), key=min)
    while True:
        yield means, masses, members
        if len(means) < 2:
            return
        cos = means @ means.T - 2 * np.eye(len(means))
        a, b = np.unravel_index(np.argmax(cos), cos.shape)
        joined = masses[a] * means[a] + masses[b] * means[b]
        keep = np.setdiff1d(np.arange(len(means)), [a, b])
        means = np.vstack([means[keep], joined / np.linalg.norm(joined)])
        masses = np.append(masses[keep], masses[a] + masses[b])
        members = [members[i] for i in keep] + [sorted(members[a] + members[b])]


def cascade_errors(per_beta, data, config) -> tuple[float, float, int]:
    """The judged plateaus that are `compared` (resolved, the cascade's clusters)
    against `cascade` from `data["x0"]`: the largest
    relative error of the log-length (inf where the cascade has no plateau of that
    many clusters), the largest relative error of the log-lengths' slope in `β`
    (over the cluster counts that ended at two `β` or more; NaN with none), and how
    many slopes were compared."""
    rows = [p for p in judged(per_beta) if compared(p)]
    predicted = {b: cascade(data["x0"], b, config.eps) for b in {p["beta"] for p in rows}}
    logs = [predicted[p["beta"]].get(p["clusters"], math.inf) for p in rows]
    worst = max((abs(math.log(p["length"]) / q - 1) for p, q in zip(rows, logs)),
                default=0.0)
    rates = []
    for k in sorted({p["clusters"] for p in rows}):
        sel = [(p["beta"], math.log(p["length"]), q) for p, q in zip(rows, logs)
               if p["clusters"] == k and math.isfinite(q)]
        if len({b for b, _, _ in sel}) >= 2:
            b, measured, want = (np.array(v) for v in zip(*sel))
            rates.append(abs(fit_slope(b, measured)[0] / fit_slope(b, want)[0] - 1))
    return worst, max(rates, default=math.nan), len(rates)


def compared(p: dict) -> bool:
    """Whether a judged plateau (`judged`) is compared with `cascade`: a positive
    log-length, and its clusters, as sets of tokens, the cascade's (`cascade_groups`):
    the cascade predicts the lengths of its own plateaus, and a plateau of the same
    count made of other tokens is another state. Its saddle index's resolution
    (`resolved`) does not matter here: a span of many decades is the separation of
    time scales the cascade assumes (β = 500: 52 decades and more, log-lengths within
    1.9 %)."""
    return p["length"] > 1 and p.get("cascade", True)


def _exp(log: float) -> float:
    return math.exp(log) if log < 700 else math.inf


def judged(per_beta) -> list[dict]:
    """The post-transient plateaus that end in a merger, with `β` (the ones compared
    with the two-cluster prediction)."""
    return [p | {"beta": s["beta"]} for s in per_beta for p in s["plateaus"]
            if p["post_transient"] and math.isfinite(p["end"]) and p["clusters"] > 1
            and 0 < p["predicted_exact"] < math.inf]


class Metastability(AbstractExperiment):
    name = "metastability"
    title = ("Dynamic metastability (Geshkovski et al. 2024): the energy staircase of the usa "
             "flow to t = 10⁸ (10³⁰⁰ rescaled) and the saddles on its plateaus")
    theorem = "Geshkovski, Koubbi, Polyanskiy, Rigollet 2024: exponentially long plateaus"
    params = (
        Param("tokens", int, 8, "number of tokens n (≥ 3: the first plateau, the start, is "
              "not judged; 80 and beyond: docs/usage/experiments.md)", 3),
        Param("dim", int, 2, "dimension d (2: the circle, 3: the sphere)", 2),
        Param("beta_min", float, 10.0, "smallest β", 0.0),
        Param("beta_max", float, 20.0, "largest β", 0.0),
        Param("betas", int, 3, "number of β values", 1),
        Param("beta", float, 0.0, "β: 0 the grid --beta-min … --beta-max; else this β alone"),
        Param("horizon", float, 1e8, "final time T of the usa flow (log-spaced saves)", 0.0),
        Param("log_horizon", float, 0.0, "log₁₀ T, in place of --horizon, up to 308 (a "
              "solver in t stops at 2⁵²; the rescaled integrator steps in log t); 0: "
              "--horizon"),
        Param("integrator", int, 0, "plain (the implicit Kvaerno3 in t) or rescaled "
              "(Tsit5 in the rescaled time s, clusters as point masses; or its code 0–1)",
              names=("plain", "rescaled")),
        Param("saves", int, 240, "number of log-spaced save times from 10⁻³ to T", 2),
        Param("eps", float, 1e-2, "linking distance of a cluster (Euclidean)", 0.0),
        Param("target", int, 1, "stop once this many clusters are left (1: consensus)", 1),
        Param("rtol", float, 1e-7, "relative tolerance of the adaptive steps (the rescaled "
              "integrator takes at most 1e-10)", 0.0),
        Param("max_steps", int, 1_000_000, "step budget of each plain run (the rescaled "
              "integrator: 4096 per segment between two events)", 1),
    )

    def refusals(self, config):
        log, eps, plain = config.log_horizon, config.eps, not rescaled(config)
        return (
            (not config.beta and config.beta_max < config.beta_min, f"--beta-max "
             f"({config.beta_max!r}) must be ≥ --beta-min ({config.beta_min!r})."),
            (config.beta < 0, f"--beta must be ≥ 0 (0: the grid), got {config.beta!r}."),
            (max(config.beta, 0.0 if config.beta else config.beta_max) > BETA_MAX,
             f"--beta and --beta-max must be ≤ {BETA_MAX:g} (past it the exact two-cluster "
             f"integral's peak, of width 1/(β sin δ), is not resolved in float64), got "
             f"{config.beta if config.beta else config.beta_max!r}."),
            (log and not math.log10(T_MIN) < log <= LOG_HORIZON_MAX,
             f"--log-horizon must be in ({math.log10(T_MIN):g}, {LOG_HORIZON_MAX:g}] (or 0: "
             f"--horizon), got {log!r}."),
            (log > math.log10(2.0 ** 52) and plain, f"--log-horizon {log!r} is past 2**52, "
             "where a solver in t cannot step: add --integrator rescaled."),
            (not plain and not eps > 10 * SNAP, f"--eps must be > {10 * SNAP:g} with "
             f"--integrator rescaled (its points join at {SNAP:g}), got {eps!r}."),
            (not config.rtol <= RTOL_MAX, f"--rtol must be ≤ {RTOL_MAX:g} (a looser solve "
             f"moves the merger times by about the verdict's tolerance), got {config.rtol!r}."),
            (not plain and not config.rtol >= RTOL_MIN, f"--rtol must be ≥ {RTOL_MIN:g} with "
             f"--integrator rescaled (its log-time, up to 709, resolves no finer), got "
             f"{config.rtol!r}."),
            (not eps >= EPS_MIN, f"--eps must be ≥ {EPS_MIN:g} (float64 tokens are not "
             f"resolved closer), got {eps!r}."),
            (eps >= 2, f"--eps must be < 2, the diameter of the sphere (at {eps!r} every "
             "token is one cluster from the start)."),
            (config.target >= config.tokens, f"--target must be < --tokens ({config.tokens}): "
             f"the run stops once --target clusters are left, got {config.target}."),
            (not log and config.horizon <= T_MIN, f"--horizon must be > {T_MIN:g}, got "
             f"{config.horizon!r}."))

    def simulate(self, config, progress):
        bs = betas(config)
        ts = log_grid(T_MIN, final_time(config), config.saves)
        x0 = sample_ellipsoid(jax.random.PRNGKey(config.seed), config.tokens,
                              config.dim, dtype=jnp.float64)
        stop = merged(config.eps, config.target)
        runs = [run_beta(x0, float(beta), ts, config, stop)
                for beta in tqdm(bs, desc=self.name, disable=not progress, leave=False)]
        data = {k: np.stack([r[k] for r in runs]) for k in runs[0]}
        return data | {"betas": bs, "x0": np.asarray(x0)}

    def verdict(self, config, data):
        per_beta = study(data, config)
        rows = judged(per_beta)
        finals = [p for p in rows if p["final"]]
        others = [p for p in rows if not p["final"]]
        final_err = max((abs(p["measured"] / p["predicted_exact"] - 1) for p in finals),
                        default=math.nan)
        worst = max((abs(math.log10(p["measured"] / p["predicted_exact"])) for p in others),
                    default=0.0)
        circle = config.dim == 2
        post = [p for s in per_beta for p in s["plateaus"] if p["post_transient"]]
        resolved = [p for p in post if p["resolved"]]
        saddles_ok = not circle or all(p["saddle_index"] == p["clusters"] - 1 for p in resolved)
        lengths, rate, slopes = cascade_errors(per_beta, data, config)
        theirs = [p for p in rows if compared(p)]
        elsewhere = sum(1 for p in rows if p["length"] > 1 and not compared(p))
        cascade_ok = lengths <= CASCADE_TOL and (not slopes or rate <= RATE_TOL)
        missed = (bool(finals) and final_err > FINAL_TOL) or worst >= DECADES \
            or not saddles_ok or not cascade_ok
        ok = bool(finals) and not missed
        indices = "; ".join(
            f"β = {short(s['beta'])}: " + ", ".join(
                f"{p['clusters']}→{p['saddle_index']}"
                + ("" if p["post_transient"] else " (transient)")
                + ("" if p["resolved"] else " (unresolved)") for p in s["plateaus"])
            for s in per_beta)
        finals_text = ", ".join(
            f"β = {short(p['beta'])} at t = {short(p['end'])}: {short(p['measured'])} from "
            f"t = {short(p['from'])} against {short(p['predicted_exact'])} exact "
            f"(Laplace {short(p['predicted_laplace'])})" for p in finals) or (
            "none to judge: no plateau after the first ended in the last merger by "
            f"T = {short(final_time(config))}")
        judged_finals = ("within" if final_err <= FINAL_TOL else "NOT within") if finals \
            else "untested: the tolerance is"
        line = (f"n = {config.tokens}, d = {config.dim}: final mergers {judged_finals} "
                f"{FINAL_TOL:.0%} of the exact two-cluster integral ({finals_text}); "
                f"{len(others)} other post-transient plateaus within 10^{short(worst)} of it; "
                f"predicted from x(0) alone (the cascade of closest-pair mergers): "
                + (f"log-lengths within {short(lengths)} (asked ≤ {CASCADE_TOL:g}, "
                   f"{len(theirs)} plateaus compared), growth in β "
                   + (f"within {short(rate)} (asked ≤ {RATE_TOL:g}, {slopes} cluster counts)"
                      if slopes else "not judged (no plateau ended at two β)")
                   + f" — {'yes' if cascade_ok else 'NO'}"
                   if theirs else "not judged (no post-transient plateau with the cascade's "
                   "clusters ended)")
                + (f" ({elsewhere} not compared: other clusters than the cascade's)"
                   if elsewhere else "") + "; "
                f"saddle indices measured (clusters→index): {indices}"
                + ("" if not circle else
                   f" — k − 1 on every resolved post-transient plateau: "
                   f"{'yes' if saddles_ok else 'NO'}")
                + (f" ({len(post) - len(resolved)} unresolved: couplings spanning more than "
                   f"10^{SPAN_MAX:g}, or weaker than 10^{COUPLING_FLOOR:.0f}, past a float64 "
                   "Hessian)"
                   if len(resolved) < len(post) else ""))
        last = per_beta[-1]
        numbers = {"mergers": len(last["mergers"]), "final_mergers": len(finals),
                   "final_rel_error": final_err, "worst_log10_ratio": worst,
                   "long_plateaus": len(others), "steps": int(np.sum(data["steps"])),
                   "cascade_log_error": lengths, "cascade_rate_error": rate,
                   "cascade_rates": slopes}
        # no final merger by T: the main prediction is untested (exit 4), not missed
        longer = ("--log-horizon" if rescaled(config) else
                  "--horizon (--log-horizon with --integrator rescaled reaches past 2**52)")
        undecided = "" if ok or missed else f"a smaller β or a longer {longer}"
        return Verdict(ok, line, numbers, {"per_beta": finite_or_none(per_beta)}, undecided)

    def draw(self, config, data, folder: Path):
        plt = figures.pyplot()
        per_beta = study(data, config)
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
        colors = plt.cm.viridis(np.linspace(0, 0.85, len(data["betas"])))
        for b, (s, c) in enumerate(zip(per_beta, colors)):
            ts = data["ts"][b]
            keep = np.isfinite(ts) & (ts > 0)
            t, E, count = ts[keep], data["E"][b][keep], data["count"][b][keep]
            if s["final_merger"] is not None:  # the run stops at the final merger
                t, count = np.append(t, s["final_merger"]), np.append(count, config.target)
                axes[1].plot([s["final_merger"]], [config.target], "*", color=c, ms=12,
                             label="final merger (the run's stop)" if b == 0 else None)
            tE = t[: len(E)]
            if s["final_merger"] is not None and config.target == 1 and np.isfinite(E).any():
                # held until the final merger, then the step up to consensus, E = 1
                last = np.flatnonzero(np.isfinite(E))[-1]
                tE = np.append(tE[: last + 1], [s["final_merger"]] * 2)
                E = np.append(E[: last + 1], [E[last], 1.0])
            axes[0].plot(tE, E, "-", color=c, label=f"β = {s['beta']:g}")
            # later lines thinner: the counts share their first steps
            axes[1].step(t, count, where="post", color=c, lw=2.4 - 1.6 * b / max(1, len(colors)))
            for m in s["mergers"]:
                axes[0].axvline(m, color=c, lw=0.6, ls=":")
        axes[0].set(ylabel="energy E", ylim=(0, 1.05),
                    title="the energy staircase (dotted: mergers, the final one included)")
        axes[1].set(ylabel=f"clusters (link distance {config.eps:g})", title="cluster count")
        figures.integer_ticks(axes[1].yaxis)
        for ax in axes[:2]:
            # the limits stated: autoscaling's margin past 10³⁰⁰ overflows the log ticks
            ax.set(xscale="log", xlabel="time t (usa flow)", xlim=(T_MIN, final_time(config)))
            _decade_ticks(ax.xaxis, T_MIN, final_time(config))
        figures.legend_below(axes[0], ncol=3)
        if axes[1].get_legend_handles_labels()[0]:
            figures.legend_below(axes[1], ncol=1)
        self._draw_lengths(axes[2], judged(per_beta))
        return figures.save_figure(
            fig, self.stem(folder),
            f"Dynamic metastability: n = {config.tokens} tokens on $S^{{{config.dim - 1}}}$, "
            f"usa kernel, float64, log-spaced saves to t = {final_time(config):g}")

    @staticmethod
    def _draw_lengths(ax, rows):
        """Measured time to the merger over each prediction, against `β` (the exact
        integral's and Laplace's points set apart by a little in `β`)."""
        if any(p["final"] for p in rows):
            ax.axhspan(1 - FINAL_TOL, 1 + FINAL_TOL, color="C3", alpha=0.12,
                       label=f"±{FINAL_TOL:.0%}: the final mergers' tolerance")
        if not rows:
            ax.text(0.5, 0.5, "no post-transient plateau ended by T:\nnothing to compare",
                    transform=ax.transAxes, ha="center", va="center", color="0.4")
        ax.axhline(1.0, color="k", lw=0.8)
        betas = sorted({p["beta"] for p in rows})
        dodge = 0.02 * ((betas[-1] - betas[0] if betas else 0.0) or 1.0)
        for final, marker, what in ((False, "o", "post-transient plateau"),
                                    (True, "*", "final merger")):
            sel = [p for p in rows if p["final"] == final]
            if not sel:
                continue
            beta = np.array([p["beta"] for p in sel])
            for key, shift, color, name in (("predicted_exact", -dodge, "C3", "exact integral"),
                                            ("predicted_laplace", dodge, "C2", "Laplace")):
                ax.plot(beta + shift, [p["measured"] / p[key] for p in sel], marker,
                        color=color, ms=9 if final else 6, label=f"{what}, {name}")
        if 0 < len(betas) <= 6:  # each β its tick (one β alone: no offset notation)
            ax.set_xticks(betas, [f"{b:g}" for b in betas])
            if len(betas) == 1:
                ax.set_xlim(betas[0] - 4 * dodge, betas[0] + 4 * dodge)
        ax.set(xlabel=r"$\beta$", ylabel="measured / predicted time to the merger",
               title="two clusters alone: exact integral and Laplace's term")
        if ax.get_legend_handles_labels()[0]:  # none without a judged plateau
            figures.legend_below(ax, ncol=1)


def _decade_ticks(axis, lo: float, hi: float, most: int = 8) -> None:
    """Ticks at whole decades from `lo` to `hi`, at most `most` of them: matplotlib's
    own log locator places ticks past 10³⁰⁸ on a range to 10³⁰⁰, which overflow."""
    import matplotlib.ticker as mticker

    first, last = math.ceil(math.log10(lo)), math.floor(math.log10(hi))
    step = next(s for s in (1, 2, 3, 5, 10, 20, 25, 50, 100) if (last - first) / s < most)
    start = step * math.ceil(first / step)
    axis.set_major_locator(mticker.FixedLocator([10.0 ** k for k in range(start, last + 1,
                                                                               step)]))
    axis.set_minor_locator(mticker.NullLocator())


