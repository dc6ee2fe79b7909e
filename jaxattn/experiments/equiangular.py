"""`equiangular`: the equiangular reduction (Rigollet, "The Mean-Field Dynamics of
Transformers", arXiv 2512.01868).

Equiangular unit tokens (`ja.theory.equiangular_tokens`) under `ja.SelfAttentionDynamics(P
= I, U = I, β)`, each placement with softmax and `"exp"` (`ja.solve_flow`, float64), must
follow the reduced ODE (`ja.theory.equiangular_solution`) to `AGREEMENT`, with late
rates within `RATE_TOL` of `ja.theory.equiangular_asymptotics`. `"none"` with `"exp"`
blows up in finite time and is not run. The derivation and the numbers:
`docs/limits.md`, "The equiangular reduction".
"""

import math
from pathlib import Path

import diffrax as dfx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float
from tqdm.auto import tqdm

from .._artifacts import figures
from .._dynamics import SelfAttentionDynamics
from .._flow import solve_flow
from .._kernel import BUILTIN as KERNEL_BUILTIN
from .._manifold import normalize
from .._norm import BUILTIN as NORM_BUILTIN
from .._programs import kept_jit
from ..metrics import fit_slope
from ..theory import equiangular_asymptotics, equiangular_solution, equiangular_tokens
from .base import BETA, AbstractExperiment, Param, Verdict
from .pair_density import EXP_BETA_MAX
from .verdicts import finite_or_none, short

#: The members the study runs (in its arrays' order): every built-in placement, those
#: on `E_W` first, and the built-in kernels the reduction covers (weights
#: `e^{β⟨x_i, x_j⟩}`, over `n` or normalised: an `exponent_shift` of 0).
NORMS = tuple(sorted((cls() for cls in NORM_BUILTIN.values()),
                     key=lambda norm: not norm.stays_on_manifold))
KERNELS = tuple(cls() for cls in KERNEL_BUILTIN.values() if cls.exponent_shift == 0)
#: The flow's tolerances (float64): far below the agreement `AGREEMENT` asked of it.
RTOL, ATOL = 1e-13, 1e-20
#: How closely the flow's `ρ(t)` must follow the reduced ODE, and its spread stay 0.
AGREEMENT = 1e-10
#: Gaps `1 − ρ` below this are not used to read a rate (the flow's tokens resolve
#: them only to a few digits there).
RATE_FLOOR = 1e-20
#: How closely each late rate read from the flow must match the predicted asymptotic
#: rate (relative): a prediction 10 % off fails it.
RATE_TOL = 0.02
#: The longest horizon: the unnormalised softmax flow's norms grow like `e^t`, so
#: `|x|² ≈ e^{2t}` leaves float64 past `t ≈ 354` (at 600 they read inf, at 1,000 the
#: solver ran out of steps after the folder was made).
GROWTH_HORIZON = 300.0
COLORS = {"post": "C0", "ngpt": "C3", "pre": "C1", "peri": "C2", "none": "C4"}
#: The algebraic panel's colours for the `"exp"` kernel, apart from softmax's.
EXP_COLORS = {"pre": "C5", "peri": "C8"}
#: Each kernel's panel title and line style in the algebraic panel, by name.
TITLES = {"softmax": "softmax", "exp": r"exp: $e^{\beta\langle x,y\rangle}/n$"}
STYLES = {"softmax": "-", "exp": (0, (4, 2))}


def skipped(norm, kernel) -> bool:
    """Whether the pair is left out of a run: those whose norms blow up in finite
    time (no normalisation with `exp`; the kind depends on neither `n` nor `β`)."""
    return equiangular_asymptotics(2, 1.0, norm=norm, kernel=kernel).kind == "blow-up"


def off_diagonal(gram: Float[Array, "*T n n"]) -> Float[Array, "*T m"]:
    """The entries of `gram` off its diagonal, `(…, n(n − 1))`."""
    return gram[..., ~np.eye(gram.shape[-1], dtype=bool)]


@kept_jit(static_argnames=())  # one program for every pair (op by op, ~20)
def measure(ys: Float[Array, "T n d"]) -> dict[str, Float[Array, " T"]]:
    """`ρ` (mean off-diagonal cosine), its spread (max − min), `1 − ρ` and the mean
    norm, at every saved time. `1 − ρ` is the mean of `|u_i − u_j|²/2` (`u = x/|x|`):
    no cancellation, so gaps far below the float's epsilon resolve."""
    u = normalize(ys)
    cos = off_diagonal(jnp.einsum("tid,tjd->tij", u, u))
    gaps = off_diagonal(0.5 * jnp.sum((u[..., :, None, :] - u[..., None, :, :]) ** 2, -1))
    return {"rho": jnp.mean(cos, -1), "spread": jnp.max(cos, -1) - jnp.min(cos, -1),
            "gap": jnp.mean(gaps, -1),
            "radius": jnp.mean(jnp.linalg.norm(ys, axis=-1), -1)}


#: The flow's step budget, and the steps post-norm exp takes per unit of `e^β T`: its
#: rate `2e^β` bounds Dopri8's steps (measured at n = 4, ρ0 = 0.2, T = 20: 4,621 steps
#: at β = 6, 33,517 at 8, 245,841 at 10; the budget ran out at 12).
MAX_STEPS, STEPS_PER_RATE = 2**18, 0.56


def flow(config, norm, kernel, ts) -> dict[str, np.ndarray]:
    """The `n`-particle flow from the equiangular start, measured (`measure`)."""
    n, d = config.tokens, config.dim
    eye = np.eye(d)[None]
    dyn = SelfAttentionDynamics(eye, eye, beta=config.beta, norm=norm, kernel=kernel)
    x0 = equiangular_tokens(config.rho0, n, d)
    ys = solve_flow(dyn, x0, ts, solver=dfx.Dopri8(), rtol=RTOL, atol=ATOL,
                    max_steps=MAX_STEPS, on_manifold=dyn.stays_on_manifold)
    return measure(ys)


def late_rate(ts: np.ndarray, gap: np.ndarray, kind: str,
              radius: np.ndarray | None = None, *, last: float = 0.5) -> float:
    """The slope of `−log(1 − ρ)` against `t` (`"exponential"`) or against `log r`
    (`"algebraic"`; `log t` when `radius` is not given) over the `last` part of the
    times where `1 − ρ > RATE_FLOOR` (the second half by default); NaN for other
    kinds."""
    if kind not in ("exponential", "algebraic"):
        return math.nan
    keep = (ts > 0) & (gap > RATE_FLOOR) & np.isfinite(gap)
    keep &= ts >= (ts[keep].max() * (1 - last) if keep.any() else 0)
    if keep.sum() < 3:
        return math.nan
    x = ts[keep] if kind == "exponential" else np.log((ts if radius is None else radius)[keep])
    return -fit_slope(x, np.log(gap[keep]))[0]


def rate_error(rate: dict) -> float:
    """`|read / predicted − 1|` of one `kernel_norm` entry of `Equiangular.rates`
    (0 for the kinds with no rate; inf where a rate could not be read)."""
    if rate["kind"] not in ("exponential", "algebraic") or "flow" not in rate:
        return 0.0
    if rate["flow"] is None:
        return math.inf
    return abs(rate["flow"] / rate["predicted"] - 1)


class Equiangular(AbstractExperiment):
    name = "equiangular"
    title = ("The equiangular reduction (Rigollet 2025): n equiangular tokens follow a "
             "scalar ODE for ρ(t), with exact clustering rates per normalisation placement")
    theorem = "Rigollet 2025, the equiangular reduction (arXiv 2512.01868)"
    params = (
        Param("tokens", int, 4, "number of tokens n", 2),
        Param("dim", int, 5, "dimension d (≥ n)", 1),
        BETA,
        Param("rho0", float, 0.2, "initial inner product ρ0 in (−1/(n − 1), 1)"),
        Param("horizon", float, 20.0, "final time T", 0.0),
        # the verdict reads a rate from ≥ 3 saved times in the run's second half
        Param("saves", int, 200, "number of saved time intervals (≥ 4: the late rate "
              "is read from the second half)", 4),
    )

    def refusals(self, config):
        n = config.tokens
        steps = STEPS_PER_RATE * math.exp(min(config.beta, EXP_BETA_MAX)) * config.horizon
        return (
            (config.dim < n, f"--dim must be ≥ --tokens ({n}): {n} equiangular tokens span {n} "
             f"dimensions; got --dim {config.dim}."),
            (config.seed != 0, f"equiangular draws nothing at random (its tokens are the "
             f"equiangular ones of --rho0): --seed {config.seed} would change nothing; drop "
             "it."),
            (config.beta > EXP_BETA_MAX, f"--beta {config.beta:g}: the exp kernel's weights "
             f"e^β overflow float64 past β = {EXP_BETA_MAX:.0f}; lower --beta."),
            (steps > MAX_STEPS, f"--beta {config.beta:g} with --horizon {config.horizon:g}: the "
             f"exp kernel's rate 2e^β makes the post-norm flow take about {steps:.2g} steps, "
             f"more than its budget {MAX_STEPS}; lower --beta or --horizon (e^β T ≤ "
             f"{MAX_STEPS / STEPS_PER_RATE:.2g})."),
            (config.horizon > GROWTH_HORIZON, f"--horizon {config.horizon:g}: without a "
             "normalisation (softmax, norm none) the norms grow like e^t, and their squares "
             f"leave float64 past t ≈ 354; choose --horizon ≤ {GROWTH_HORIZON:g}."),
            (not -1 / (n - 1) < config.rho0 < 1, f"--rho0 must lie in (−1/(n − 1), 1) = "
             f"({-1 / (n - 1):.4g}, 1) for --tokens {n} (the ends are fixed points: "
             f"nothing clusters from them), got {config.rho0!r}."))

    def simulate(self, config, progress):
        ts = jnp.linspace(0.0, config.horizon, config.saves + 1)
        shape = (len(KERNELS), len(NORMS), len(ts))
        data = {f"{k}_{w}": np.full(shape, np.nan) for k in ("rho", "gap", "radius")
                for w in ("flow", "ode")} | {"spread": np.full(shape, np.nan)}
        pairs = [(i, j) for i, kernel in enumerate(KERNELS) for j, norm in enumerate(NORMS)
                 if not skipped(norm, kernel)]
        with tqdm(total=len(pairs), desc=self.name, disable=not progress, leave=False) as bar:
            for i, j in pairs:
                norm, kernel = NORMS[j], KERNELS[i]
                measured = flow(config, norm, kernel, ts)
                ode = equiangular_solution(config.rho0, config.tokens, config.beta,
                                           ts, norm=norm, kernel=kernel)
                for k in ("rho", "gap", "radius"):
                    data[f"{k}_flow"][i, j] = measured[k]
                    data[f"{k}_ode"][i, j] = np.asarray(getattr(ode, k))
                data["spread"][i, j] = measured["spread"]
                bar.update()
        return {"ts": np.asarray(ts)} | data

    def rates(self, config, data) -> dict[str, dict]:
        """Per `kernel_norm`: the predicted asymptotics and the rates read from the
        flow and from the ODE (`late_rate`: against `log r` for the algebraic kinds),
        and the flow's slope against `log t` (`flow_in_t`, not judged)."""
        out = {}
        for i, kernel in enumerate(KERNELS):
            for j, norm in enumerate(NORMS):
                law = equiangular_asymptotics(config.tokens, config.beta, norm=norm,
                                              kernel=kernel)
                entry = {"kind": law.kind, "law": law.law, "predicted": finite_or_none(law.rate)}
                if not skipped(norm, kernel):
                    ts, flow, ode = data["ts"], data["gap_flow"][i, j], data["gap_ode"][i, j]
                    entry |= {"flow": finite_or_none(late_rate(ts, flow, law.kind,
                                                      data["radius_flow"][i, j])),
                              "ode": finite_or_none(late_rate(ts, ode, law.kind,
                                                     data["radius_ode"][i, j])),
                              "flow_in_t": finite_or_none(late_rate(ts, flow, law.kind)),
                              # over the last quarter: where it differs from the second
                              # half's, the rate is still changing (a transient)
                              "flow_last_quarter": finite_or_none(late_rate(
                                  ts, flow, law.kind, data["radius_flow"][i, j], last=0.25)),
                              "final_rho": finite_or_none(data["rho_ode"][i, j, -1])}
                out[f"{kernel.name}_{norm.name}"] = entry
        return out

    def verdict(self, config, data):
        error = float(np.nanmax(np.abs(data["rho_flow"] - data["rho_ode"])))
        spread = float(np.nanmax(data["spread"]))
        radius = float(np.nanmax(np.abs(data["radius_flow"] / data["radius_ode"] - 1)))
        rates = self.rates(config, data)
        worst = max(rate_error(r) for r in rates.values())
        words = "; ".join(f"{key.replace('_', ' ')}: {_law(r)} (read {short(r['flow'])})"
                          if r["kind"] in ("exponential", "algebraic") else
                          f"{key.replace('_', ' ')}: {r['law']}" for key, r in rates.items())
        line = (f"n = {config.tokens}, β = {config.beta:g}, ρ0 = {config.rho0:g}: the "
                f"flow follows the reduced ODE to max |Δρ| = {error:.2g} (asked: ≤ "
                f"{AGREEMENT:g}), spread of the cosines ≤ {spread:.2g}, norms to "
                f"{radius:.2g} (relative); late rates read from the flow within "
                f"{worst:.2g} of the predicted ones (asked: ≤ {RATE_TOL:g}, relative): {words}")
        # A rate read before the flow nears one point is no test of the late law (a
        # start near the simplex, ρ0 → −1/(n − 1), leaves it slowly): say so. At the
        # defaults 1 − ρ ends under 0.4 % of its start.
        early = [key for key, r in rates.items()
                 if r.get("final_rho") is not None and r["kind"] in ("exponential", "algebraic")
                 and 1 - r["final_rho"] > (1 - config.rho0) / 100]
        # a rate the last quarter reads otherwise than the second half is still
        # changing: a transient read is no test of the late law either
        early += [key for key, r in rates.items() if key not in early
                  and r["kind"] in ("exponential", "algebraic") and "flow" in r
                  and None not in (r["flow"], r["flow_last_quarter"])
                  and abs(r["flow"] / r["flow_last_quarter"] - 1) > RATE_TOL / 2]
        unread = [key for key, r in rates.items() if rate_error(r) == math.inf]
        # The rates judged are those read in the late regime; a run whose other rates
        # are early or unread is undecided, not against the law it could not test.
        judged = max((rate_error(r) for key, r in rates.items()
                      if key not in early and key not in unread), default=0.0)
        missed = error > AGREEMENT or spread > AGREEMENT or judged > RATE_TOL
        ok = not (missed or early or unread)
        early, unread = ([key.replace("_", " ") for key in keys] for keys in (early, unread))
        if unread:
            line += (f"; {', '.join(unread)}: no rate read (fewer than 3 saved times with "
                     f"1 − ρ above {RATE_FLOOR:g} in the later half of those): more --saves")
        if early:
            line += (f"; {', '.join(early)}: not yet in the late regime by T = "
                     f"{config.horizon:g} (1 − ρ not yet a hundredth of its start, or the "
                     "rate over the last quarter of the window not yet the second half's), "
                     "so their rates test no late law: choose a ρ0 farther from −1/(n − 1), "
                     "or a longer --horizon")
        numbers = {"max_rho_error": error, "max_spread": spread,
                   "max_radius_error": radius, "agreement": AGREEMENT,
                   "max_rate_error": worst, "rate_tolerance": RATE_TOL}
        undecided = "" if ok or missed else "; ".join(
            words for keys, words in ((unread, "raise --saves"), (early, "a longer --horizon or "
                                      "a ρ0 farther from −1/(n − 1)")) if keys)
        return Verdict(ok, line, numbers, {"rates": rates}, undecided)

    def draw(self, config, data, folder: Path):
        rates = self.rates(config, data)
        fig, axes = figures.pyplot().subplots(1, 4, figsize=(20, 5.6))
        ts = data["ts"]
        for ax, (i, kernel) in zip(axes, enumerate(KERNELS)):
            guided = False  # the predicted slope's legend entry, once per panel
            for j, norm in enumerate(NORMS):
                if not skipped(norm, kernel):
                    guided |= _draw_pair(ax, ts, data["gap_flow"][i, j], data["gap_ode"][i, j],
                                         norm, rates[f"{kernel.name}_{norm.name}"], not guided)
            name = TITLES.get(kernel.name, kernel.name)
            ax.set(ylabel=r"$1-\rho(t)$", title=f"{name}: flow (wide) and reduced ODE (dashed)")
            figures.legend_below(ax, ncol=2)
        self._draw_algebraic(axes[2], ts, data, rates)
        self._draw_agreement(axes[3], ts, data)
        return figures.save_figure(
            fig, self.stem(folder),
            f"Equiangular tokens: n = {config.tokens}, d = {config.dim}, "
            f"β = {config.beta:g}, ρ0 = {config.rho0:g}: the n-particle flow against "
            "the reduced ODE for ρ(t), per normalisation placement")

    @staticmethod
    def _draw_algebraic(ax, ts, data, rates):
        """The algebraic placements on log–log axes, with the predicted slope `t^−2`.
        `"peri"` is drawn once: `N(v_i)` removes the exp kernel's row factor, so both
        kernels give the same flow (a kernel whose ODE curve an earlier one's
        matches is named beside it)."""
        later = ts >= ts[-1] / 2
        gaps = data["gap_ode"]

        def same(k, i, j):
            return bool(np.allclose(gaps[k, j], gaps[i, j], rtol=1e-6, atol=0))

        labelled = False
        for i, kernel in enumerate(KERNELS):
            for j, norm in enumerate(NORMS):
                if rates[f"{kernel.name}_{norm.name}"]["kind"] != "algebraic" or any(
                        same(k, i, j) for k in range(i)):
                    continue
                twins = [KERNELS[k].name for k in range(i + 1, len(KERNELS)) if same(k, i, j)]
                label = f"{norm.name}, {kernel.name}" + (
                    f" (= {', '.join(twins)})" if twins else "")
                style = STYLES.get(kernel.name, "-")
                color = (EXP_COLORS if kernel.name == "exp" else COLORS).get(norm.name, "C7")
                ax.loglog(ts[1:], data["gap_flow"][i, j, 1:], ls=style, lw=3.5, alpha=0.35,
                          color=color, label=f"{label}: flow")
                ax.loglog(ts[1:], data["gap_ode"][i, j, 1:], ls=(0, (2, 2)), lw=1.2,
                          color=color, label=f"{label}: ODE")
                end = data["gap_ode"][i, j, -1] * (ts[later] / ts[-1]) ** -2.0
                ax.loglog(ts[later], end * 3.0, color="k", lw=0.8,
                          label="_nolegend_" if labelled else "predicted slope: $t^{-2}$ (×3)")
                labelled = True
        ax.set(xlabel="time $t$ (log)", ylabel=r"$1-\rho(t)$",
               title=r"pre and peri: algebraic, $1-\rho \asymp t^{-2}$")
        figures.legend_below(ax, ncol=2)

    @staticmethod
    def _draw_agreement(ax, ts, data):
        """`max |ρ_flow − ρ_ode|` and the cosines' spread over every run, on a log axis
        (values at or below the float64 epsilon drawn at it)."""
        eps = float(np.finfo(np.float64).eps)
        error = np.nanmax(np.abs(data["rho_flow"] - data["rho_ode"]), axis=(0, 1))
        spread = np.nanmax(data["spread"], axis=(0, 1))
        ax.semilogy(ts, np.maximum(error, eps), color="C0", lw=1.6,
                    label=r"max $|\rho_{flow}-\rho_{ODE}|$ over the runs")
        ax.semilogy(ts, np.maximum(spread, eps), color="C1", lw=1.2,
                    label="max spread of the off-diagonal cosines")
        ax.axhline(AGREEMENT, color="k", ls="--", lw=0.9, label=f"asked: {AGREEMENT:g}")
        ax.axhline(eps, color="0.45", ls=(0, (1, 2)), lw=0.9,
                   label="float64 ε (values below drawn at it)")
        ax.set(xlabel="time $t$ (depth)", ylabel="deviation", ylim=(eps / 3, AGREEMENT * 30),
               title="the flow stays equiangular and on the ODE")
        figures.legend_below(ax, ncol=1)


def _draw_pair(ax, ts, gap_flow, gap_ode, norm, rate: dict, label_guide: bool) -> bool:
    """One placement's `1 − ρ` from the flow (wide, faint) and the ODE (dashed), and
    for an exponential rate the predicted slope over the second half (in the legend
    if `label_guide`); whether it drew that slope."""
    color = COLORS[norm.name]
    figures.draw_decay(ax, ts, gap_flow, label=f"{norm.name}: {_tex(rate)}", lw=4, alpha=0.35,
                       color=color)
    figures.draw_decay(ax, ts, gap_ode, lw=1.2, ls=(0, (2, 2)), color=color)
    valid = np.flatnonzero(gap_ode > RATE_FLOOR)
    if rate["kind"] == "exponential" and valid.size:
        end = valid[-1]  # anchored where the gap still reads well
        window = (ts <= ts[end]) & (ts >= ts[end] - ts[-1] / 4)
        guide = 3.0 * gap_ode[end] * np.exp(-rate["predicted"] * (ts[window] - ts[end]))
        ax.semilogy(ts[window], guide, color="k", lw=0.8,
                    label="predicted slope (×3)" if label_guide else "_nolegend_")
        return True
    return False


def _tex(rate: dict) -> str:
    """A rate's law for a legend, in mathtext."""
    if rate["kind"] == "exponential":
        return rf"$1-\rho \asymp e^{{-{rate['predicted']:.4g}\,t}}$"
    if rate["kind"] == "algebraic":
        return r"$1-\rho \asymp t^{-2}$"
    return rate["law"].replace("ρ∞", r"$\rho_\infty$").replace("ρ", r"$\rho$")


def _law(rate: dict) -> str:
    """A rate's law as judged: algebraic exponents are read against the norm `r`."""
    if rate["kind"] == "algebraic":
        return f"1 − ρ ≍ r^(−{rate['predicted']:.4g}) (r ≍ t)"
    return rate["law"]



