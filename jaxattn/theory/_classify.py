"""Which of paper 001's theorems cover a model (Table 1): `classify`. What they predict
for given tokens is `_predict.py`.

Hypotheses are read off the model numerically: the schedules are evaluated on a
grid of times and compared with a stated relative tolerance. Properties that no
finite computation can establish (boundedness for all time, uniform continuity,
differentiability) are taken from the schedule's type: arrays and `ja.Constant`
are constant, `ja.PiecewiseConstant` jumps between layers (not continuous),
`ja.Schedule` functions are taken to be smooth, and boundedness is checked as
finiteness on the grid.
"""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._dynamics import SelfAttentionDynamics
from .._schedule import AbstractSchedule, PiecewiseConstant

THEOREMS = ("3.2", "4.1", "5.1", "5.2", "5.3")


@dataclasses.dataclass(frozen=True)
class Check:
    """One hypothesis, whether it holds, and the numbers behind the answer."""

    name: str
    holds: bool
    detail: str

    def __str__(self) -> str:
        return f"[{'x' if self.holds else ' '}] {self.name}: {self.detail}"


@dataclasses.dataclass(frozen=True)
class TheoremReport:
    """One theorem of paper 001 against one model.

    - `theorem`: `"3.2"`, `"4.1"`, `"5.1"`, `"5.2"` or `"5.3"`.
    - `applies`: whether every hypothesis holds.
    - `checks`: the hypotheses, each a `Check`.
    - `statement`: the theorem's conclusion in words, with the model's numbers.
    - `domain`: its domain of attraction in words.
    - `data`: numbers the prediction needs (e.g. `v1`, `eigenvalues`).
    """

    theorem: str
    applies: bool
    checks: tuple[Check, ...]
    statement: str
    domain: str
    data: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False)

    def __str__(self) -> str:
        head = f"Theorem {self.theorem}: {'applies' if self.applies else 'does not apply'}"
        lines = [head] + [f"    {c}" for c in self.checks]
        if self.applies:
            lines += [f"    → {self.statement}", f"    domain: {self.domain}"]
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Classification:
    """What `classify` returns: one `TheoremReport` per theorem of Table 1."""

    reports: tuple[TheoremReport, ...]
    tol: float
    times: np.ndarray = dataclasses.field(repr=False)

    @property
    def applicable(self) -> tuple[TheoremReport, ...]:
        """The reports of the theorems whose hypotheses all hold."""
        return tuple(r for r in self.reports if r.applies)

    @property
    def theorems(self) -> tuple[str, ...]:
        """The numbers of the applicable theorems, e.g. `("4.1",)`."""
        return tuple(r.theorem for r in self.applicable)

    def __getitem__(self, theorem: str) -> TheoremReport:
        for r in self.reports:
            if r.theorem == theorem:
                return r
        raise KeyError(f"no Theorem {theorem!r}; the theorems are {', '.join(THEOREMS)}.")

    def summary(self) -> str:
        """One line: the theorems that apply and what they predict, or that none does."""
        if not self.applicable:
            return "no theorem of paper 001 applies to this model"
        return "; ".join(f"Theorem {r.theorem}: {r.statement}" for r in self.applicable)

    def __str__(self) -> str:
        return "\n".join([self.summary(), ""] + [str(r) for r in self.reports])


# --- reading the model ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Model:
    """The model's weights at `t = 0` and statistics of them over the time grid.

    Each statistic is the maximum over the grid of `max |entry|` of a residual,
    computed one time at a time so that large models are never held in full.
    """

    P0: np.ndarray  # (h, d, d)
    U0: np.ndarray  # (h, d, d)
    stats: dict[str, float]
    W: np.ndarray | None
    h: int
    d: int
    causal: bool
    beta: float
    P_kind: str  # "constant", "piecewise" or "smooth"
    U_kind: str


def _kind(sched: AbstractSchedule | None) -> str:
    if sched is None or sched.is_constant():
        return "constant"
    if isinstance(sched, PiecewiseConstant):
        jumps = np.ptp(np.asarray(sched.values), axis=0).max() > 0
        return "piecewise" if jumps else "constant"
    return "smooth"


def _grid_stats(fn, times, kind: str):
    """`fn(t) -> dict of scalars`, maximised over the grid (once if constant)."""
    ts = jnp.asarray(times if kind != "constant" else times[:1], jnp.result_type(float))
    out = jax.lax.map(fn, ts)
    return {k: float(jnp.max(v)) for k, v in out.items()}


def _p_stats(dyn, P0, t):
    P = dyn.query_key(t)
    return {
        "P_change": jnp.max(jnp.abs(P - P0)),
        "P_max": jnp.max(jnp.abs(P)),
        "P_nonfinite": jnp.any(~jnp.isfinite(P)).astype(P.dtype),
    }


def _u_stats(dyn, U0, t):
    U = dyn.U(t)
    sym = (U[0] + U[0].T) / 2
    lam = jnp.linalg.eigvalsh(sym)[::-1]
    gap = lam[0] - lam[1] if U.shape[-1] > 1 else jnp.inf
    return {
        "U_change": jnp.max(jnp.abs(U - U0)),
        "U_identity": jnp.max(jnp.abs(U - jnp.eye(U.shape[-1], dtype=U.dtype)[None])),
        "U_asym": jnp.max(jnp.abs(U - jnp.swapaxes(U, -1, -2))),
        "U_max": jnp.max(jnp.abs(U)),
        "U_nonfinite": jnp.any(~jnp.isfinite(U)).astype(U.dtype),
        "neg_lam1": -lam[0],  # maxima over the grid: the smallest λ₁ and gap
        "neg_gap": -gap,
    }


def _read(dyn: SelfAttentionDynamics, times) -> _Model:
    t0 = jnp.zeros((), jnp.result_type(float))
    P0, U0 = dyn.query_key(t0), dyn.U(t0)
    p_kind = _kind(dyn.P) if dyn.P is not None else _factor_kind(dyn)
    u_kind = _kind(dyn.U)
    stats = _grid_stats(lambda t: _p_stats(dyn, P0, t), times, p_kind)
    stats |= _grid_stats(lambda t: _u_stats(dyn, U0, t), times, u_kind)
    stats["lam1"], stats["gap"] = -stats.pop("neg_lam1"), -stats.pop("neg_gap")
    return _Model(
        np.asarray(P0, np.float64), np.asarray(U0, np.float64), stats,
        None if dyn.W is None else np.asarray(dyn.W, np.float64),
        dyn.num_heads, dyn.dim, dyn.causal, float(dyn.beta), p_kind, u_kind,
    )


def _factor_kind(dyn) -> str:
    kinds = {_kind(dyn.Q), _kind(dyn.K)}
    return "piecewise" if "piecewise" in kinds else "smooth" if "smooth" in kinds else "constant"


def _rel(a, ref: float) -> float:
    return float(np.max(np.abs(a))) / max(1.0, ref)


# --- the hypotheses ------------------------------------------------------------


def _check_heads(m: _Model, one: bool) -> Check:
    ok = m.h == 1 if one else True
    return Check("one head" if one else "any number of heads", ok, f"h = {m.h}")


def _check_causal(m: _Model, causal: bool) -> Check:
    name = "causal (auto-regressive) attention" if causal else "full attention"
    return Check(name, m.causal == causal, f"causal = {m.causal}")


def _check_sphere(m: _Model, tol: float) -> Check:
    dev = 0.0 if m.W is None else _rel(m.W - np.eye(m.d), 1.0)
    return Check("tokens on the sphere (W = I)", dev <= tol, f"max |W − I| = {dev:.2g}")


def _check_identity_U(m: _Model, tol: float) -> Check:
    dev = m.stats["U_identity"]
    return Check("U_η(t) = I for every head", dev <= tol, f"max |U − I| = {dev:.2g} on the grid")


def _check_constant(m: _Model, name: str, tol: float) -> Check:
    kind = getattr(m, f"{name}_kind")
    dev = m.stats[f"{name}_change"] / max(1.0, float(np.abs(getattr(m, f"{name}0")).max()))
    ok = kind == "constant" or dev <= tol
    detail = f"{kind} schedule, max |{name}(t) − {name}(0)| = {dev:.2g}"
    return Check(f"{name} time-invariant", ok, detail)


def _check_bounded(m: _Model) -> Check:
    ok = m.stats["P_nonfinite"] == 0 and m.stats["U_nonfinite"] == 0
    detail = f"finite on the grid, max |P| = {m.stats['P_max']:.3g}, |U| = {m.stats['U_max']:.3g}"
    return Check("P, U bounded", ok, detail)


def _smooth_detail(kind: str) -> str:
    return "constant" if kind == "constant" else "a Schedule function (taken to be smooth)"


def _check_uniformly_continuous(m: _Model) -> Check:
    ok = m.P_kind != "piecewise"
    detail = "piecewise constant with jumps" if not ok else _smooth_detail(m.P_kind)
    return Check("P uniformly continuous", ok, detail)


def _check_symmetric(m: _Model, name: str, tol: float) -> Check:
    dev = m.stats[f"{name}_asym"] / max(1.0, m.stats[f"{name}_max"])
    return Check(f"{name} symmetric", dev <= tol, f"max |{name} − {name}ᵀ| = {dev:.2g}")


def top_eigen(U: np.ndarray):
    """Eigenvalues (descending) and eigenvectors (columns, same order) of `(U + Uᵀ)/2`."""
    lam, vec = np.linalg.eigh((U + np.swapaxes(U, -1, -2)) / 2)
    return lam[..., ::-1], vec[..., :, ::-1]


def _check_simple_top(m: _Model, tol: float) -> Check:
    scale = max(1.0, m.stats["U_max"])
    gap, lam1 = m.stats["gap"], m.stats["lam1"]
    ok = m.h == 1 and gap > tol * scale and lam1 > tol * scale
    return Check(
        "λ₁(U) simple and positive", ok, f"min over the grid: λ₁ = {lam1:.3g}, λ₁ − λ₂ = {gap:.3g}"
    )


def _check_differentiable_U(m: _Model) -> Check:
    ok = m.U_kind != "piecewise"
    detail = "piecewise constant with jumps" if not ok else _smooth_detail(m.U_kind)
    return Check("U differentiable in t", ok, detail)


def _check_gradient_pair(m: _Model, tol: float) -> Check:
    P, U = m.P0[0], m.U0[0]
    WU = U if m.W is None else m.W @ U
    c = float(np.sum(WU * P) / max(np.sum(P * P), np.finfo(float).tiny))
    dev = _rel(WU - c * P, np.abs(WU).max())
    sym = _rel(P - P.T, np.abs(P).max())
    lam_min = float(np.linalg.eigvalsh((P + P.T) / 2).min())
    ok = c > 0 and dev <= tol and sym <= tol and lam_min > tol * max(1.0, np.abs(P).max())
    ok = ok and m.beta > 0
    detail = (
        f"W U = c P with c = {c:.3g} (residual {dev:.2g}), |P − Pᵀ| = {sym:.2g}, "
        f"λ_min(P) = {lam_min:.3g}, β = {m.beta:.3g}"
    )
    return Check("P symmetric positive definite, W U = c P (c > 0), β > 0", ok, detail)


# --- the theorems --------------------------------------------------------------


def _vec(v: np.ndarray) -> str:
    return "(" + ", ".join(f"{c:.3g}" for c in v[:4]) + (", …)" if len(v) > 4 else ")")


def _report(theorem, checks, statement, domain, data=None) -> TheoremReport:
    checks = tuple(checks)
    applies = all(c.holds for c in checks)
    return TheoremReport(theorem, applies, checks, statement, domain, data or {})


def _theorem_32(m: _Model, tol: float) -> TheoremReport:
    checks = [
        _check_causal(m, False), _check_heads(m, True), _check_constant(m, "P", tol),
        _check_constant(m, "U", tol), _check_gradient_pair(m, tol),
    ]
    identity = m.h == 1 and m.stats["U_identity"] <= tol
    statement = (
        f"a gradient flow of E_P (β = {m.beta:.3g}): E_P never decreases and every "
        "trajectory converges to an equilibrium"
        + ("; with U = I the only stable equilibria are consensus" if identity else "")
    )
    return _report("3.2", checks, statement, "the whole ellipsoid", {"identity_U": identity})


def _theorem_41(m: _Model, tol: float) -> TheoremReport:
    checks = [
        _check_causal(m, False), _check_heads(m, False), _check_identity_U(m, tol),
        _check_bounded(m), _check_uniformly_continuous(m),
    ]
    statement = f"tokens starting in an open hemisphere converge to consensus ({m.h} heads)"
    return _report("4.1", checks, statement, "an open hemisphere {y : ⟨z, y⟩_W > 0}")


def _theorem_51(m: _Model, tol: float) -> TheoremReport:
    checks = [
        _check_causal(m, True), _check_heads(m, False), _check_sphere(m, tol),
        _check_identity_U(m, tol), _check_bounded(m),
    ]
    statement = "the first token stays fixed and every token converges to x₁(0)"
    return _report("5.1", checks, statement, "almost every start (a conull set)")


def _theorem_52(m: _Model, tol: float) -> TheoremReport:
    checks = [
        _check_causal(m, True), _check_heads(m, True), _check_sphere(m, tol),
        _check_constant(m, "U", tol), _check_symmetric(m, "U", tol),
        _check_simple_top(m, tol), _check_bounded(m),
    ]
    lam, vec = top_eigen(m.U0[0])
    v1 = vec[:, 0]
    statement = (
        f"tokens starting in the hemisphere ⟨v₁, x⟩ > 0 converge to v₁ = {_vec(v1)} "
        f"(λ₁ = {lam[0]:.3g}; the opposite hemisphere converges to −v₁)"
    )
    data = {"v1": v1, "eigenvalues": lam}
    return _report("5.2", checks, statement, "the hemisphere ⟨v₁, x⟩ > 0 (or < 0)", data)


def _theorem_53(m: _Model, tol: float) -> TheoremReport:
    checks = [
        _check_causal(m, True), _check_heads(m, True), _check_sphere(m, tol),
        _check_symmetric(m, "U", tol), _check_differentiable_U(m),
        _check_simple_top(m, tol), _check_bounded(m),
    ]
    lam, vec = top_eigen(m.U0[0])
    statement = (
        "tokens starting in the hemisphere ⟨v₁(0), x⟩ > 0 converge to a ball around "
        "v₁(t), the top eigenvector of U(t); its radius grows with the speed of v₁(t)"
    )
    data = {"v1": vec[:, 0], "eigenvalues": lam}
    return _report("5.3", checks, statement, "the hemisphere ⟨v₁(0), x⟩ > 0 (or < 0)", data)


def classify(
    dyn: SelfAttentionDynamics, *, times=None, tol: float = 1e-8
) -> Classification:
    """Which theorems of paper 001 (Table 1) cover `dyn`, and what they predict.

    Reads the hypotheses of Theorems 3.2, 4.1, 5.1, 5.2 and 5.3 off the model:

    - 3.2: full attention, one head, `P` and `U` time-invariant, `P` symmetric
      positive definite, `W U = c P` with `c > 0`, `β > 0` → a gradient flow of
      `E_P` (eq. 8), converging to an equilibrium from everywhere.
    - 4.1: full attention, any heads, every `U_η(t) = I`, `P` bounded and
      uniformly continuous → consensus from an open hemisphere.
    - 5.1: causal, `W = I`, every `U_η(t) = I`, `P` bounded → every token
      converges to `x₁(0)` from almost every start.
    - 5.2: causal, `W = I`, one head, `U` time-invariant and symmetric with a
      simple top eigenvalue `λ₁ > 0` → convergence to `v₁` from the hemisphere
      `⟨v₁, x⟩ > 0`. (`λ₁ > 0` is required here: with `λ₁ < 0` the consensus at
      `v₁` can be unstable, see the tests.)
    - 5.3: as 5.2 with `U(t)` time-varying and differentiable, `λ₁(t)` simple and
      positive → convergence to a ball around `v₁(t)`.

    Checks are numerical: the schedules are evaluated at `times`, and a matrix
    property holds when its residual (e.g. `max |U − Uᵀ|`, `max |U(t) − U(0)|`) is
    at most `tol · max(1, max |entry|)`; eigenvalue gaps must exceed the same
    bound. Boundedness is checked as finiteness on the grid; continuity and
    differentiability are read from the schedule type (`PiecewiseConstant` jumps,
    `Schedule` functions are taken to be smooth).

    **Arguments:**

    - `dyn`: the model.
    - `times`: the grid on which time-varying weights are checked (default 201
      points on `[0, 10]`).
    - `tol`: the relative tolerance of every check (default `1e-8`).

    **Returns:**

    A `Classification`: `.theorems` (those that apply), `.applicable` (their
    `TheoremReport`s with the statement and domain), `str()` a readable report.
    """
    if not isinstance(dyn, SelfAttentionDynamics):
        raise TypeError(f"classify needs a ja.SelfAttentionDynamics, got {type(dyn).__name__}.")
    if not tol > 0:
        raise ValueError(f"`tol` must be > 0, got {tol}.")
    times = np.linspace(0.0, 10.0, 201) if times is None else np.asarray(times, np.float64)
    if times.ndim != 1 or times.size < 1 or not np.all(np.isfinite(times)):
        raise ValueError(f"`times` must be a nonempty 1-D array of finite times, got {times!r}.")
    m = _read(dyn, times)
    builders = (_theorem_32, _theorem_41, _theorem_51, _theorem_52, _theorem_53)
    return Classification(tuple(b(m, tol) for b in builders), tol, times)
