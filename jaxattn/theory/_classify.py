"""Which of paper 001's theorems cover a model (Table 1): `classify`. What they predict
for given tokens is `_predict.py`.

Every hypothesis is judged relative to the scale of the matrix it constrains, and the
values a weight takes are read from its schedule's structure where it has one (a
constant, every piece of a piecewise constant stack); only `ja.Schedule` functions
are sampled on a grid, and the checks made from them say so. See `classify`.
"""

import dataclasses
import functools
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._dynamics import SelfAttentionDynamics
from .._kernel import AbstractKernel
from .._norm import AbstractNorm
from .._programs import kept_jit
from .._schedule import AbstractSchedule, PiecewiseConstant
from .._validate import refuse_first
from ._report import THEOREMS as THEOREMS
from ._report import Check, Classification, TheoremReport

# --- reading the model ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Reading:
    """How the values one weight takes for `t ≥ 0` were read: its `kind` (`"constant"`,
    `"piecewise"` or `"smooth"`, a function), the `times` that show every value it
    takes (one for a constant, one inside each piece; when not `exact`, the grid it
    was sampled on), and `where`, the same in words for the report."""

    kind: str
    times: np.ndarray
    where: str
    exact: bool


def _kind(sched: AbstractSchedule) -> str:
    if sched.is_constant():
        return "constant"
    return "piecewise" if isinstance(sched, PiecewiseConstant) else "smooth"


def _reading(scheds, grid: np.ndarray) -> _Reading:
    """How to read a weight made of `scheds` (`P`, the factors `Q` and `K`, or `U`).

    Piecewise constant factors that share one stack layout are read exactly, at the
    middle of each piece; anything else time-varying on the grid.
    """
    kinds = {_kind(s) for s in scheds}
    if kinds == {"constant"}:
        return _Reading("constant", np.zeros(1), "exact: a constant, no grid", True)
    kind = "smooth" if "smooth" in kinds else "piecewise"
    stacks = {(s.values.shape[0], float(s.dt), s.periodic)
              for s in scheds if isinstance(s, PiecewiseConstant)}
    if kind == "piecewise" and len(stacks) == 1:
        ((num, dt, _),) = stacks
        return _Reading(kind, (np.arange(num) + 0.5) * dt, f"exact: all {num} pieces, no grid",
                        True)
    where = f"sampled on a grid of {grid.size} times on [{grid.min():.3g}, {grid.max():.3g}]"
    return _Reading(kind, grid, where, False)


@dataclasses.dataclass(frozen=True)
class _Model:
    """The model's weights at `t = 0` and statistics of them over the values read.

    Each statistic is a maximum over the times read of a residual relative to the
    scale of the matrices it compares (per head, their largest `|entry|`), computed
    one time at a time so that large models are never held in full.
    """

    P0: np.ndarray  # (h, d, d)
    U0: np.ndarray  # (h, d, d)
    u: float  # U₀[0]'s first entry: the u of U = u·I
    stats: dict[str, float]
    W: np.ndarray | None
    h: int
    d: int
    causal: bool
    beta: float
    P: _Reading
    U: _Reading
    norm: AbstractNorm
    kernel: AbstractKernel
    window: int | None
    masked: bool


def _per_head_scale(*mats):
    """The largest `|entry|` of each head over `mats` as `(m, e)` with `s = m·2^e`,
    `m ∈ [0.5, 1)` (`m = 1, e = 0` where all are 0), each `(h, 1, 1)`."""
    s = functools.reduce(jnp.maximum, [jnp.max(jnp.abs(a), axis=(-2, -1), keepdims=True)
                                       for a in mats])
    m, e = jnp.frexp(s)
    return jnp.where(s > 0, m, 1), e


def _rel_diff(A, B):
    """`max |A − B|` relative to the heads' scale `max(|A|, |B|)` (0 when both are 0).

    Scaled by a power of two before subtracting: exact, so equal entries cancel to
    exactly 0 (a compiled division may round two equal entries differently), and
    nothing overflows.
    """
    m, e = _per_head_scale(A, B)
    return jnp.max(jnp.abs(jnp.ldexp(A, -e) - jnp.ldexp(B, -e)) / m)


def _stats(fn, dyn, ref, times) -> dict:
    """`fn(dyn, ref, t) -> dict of scalars`, maximised over `times` (one time at a time)."""
    out = jax.lax.map(lambda t: fn(dyn, ref, t), times)
    top = out.pop("v1", None)  # U's top eigenvector at each time
    if top is not None:  # how far it turns between two read times (−min |⟨v_k, v_k+1⟩|)
        out["neg_align"] = -jnp.abs(jnp.sum(top[1:] * top[:-1], axis=-1, keepdims=True)
                                    if len(times) > 1 else jnp.ones((1, 1), top.dtype))
    return {k: jnp.max(v) for k, v in out.items()}


def _p_stats(dyn, P0, t):
    P = dyn.query_key(t)
    return {
        "P_change": _rel_diff(P, P0),
        "P_max": jnp.max(jnp.abs(P)),
        "P_nonfinite": jnp.any(~jnp.isfinite(P)).astype(P.dtype),
    }


def _u_stats(dyn, ref, t):
    U0, u = ref
    U = dyn.U(t)
    d = U.shape[-1]
    m, e = _per_head_scale(U)
    unit = jnp.ldexp(U[0], -e[0]) / m[0]
    lam, vectors = jnp.linalg.eigh((unit + unit.T) / 2)  # in units of |U₀(t)|, ascending
    lam = lam[::-1]
    gap = lam[0] - lam[1] if d > 1 else jnp.inf
    return {
        "U_change": _rel_diff(U, U0),
        "U_identity": _rel_diff(U, jnp.broadcast_to(u * jnp.eye(d, dtype=U.dtype), U.shape)),
        "U_asym": _rel_diff(U, jnp.swapaxes(U, -1, -2)),
        "U_max": jnp.max(jnp.abs(U)),
        "U_nonfinite": jnp.any(~jnp.isfinite(U)).astype(U.dtype),
        "neg_lam1": -lam[0],  # maxima over the times: the smallest λ₁ and gap
        "neg_gap": -gap,
        "v1": vectors[:, -1],
    }


@kept_jit
def _weights(dyn, p_times, u_times):
    """`P(0)`, `U(0)`, `u` and the statistics over the times read, one program
    (compiled once per model structure, so that classifying many models of one kind
    is quick)."""
    t0 = jnp.zeros((), p_times.dtype)
    P0, U0 = dyn.query_key(t0), dyn.U(t0)
    u = U0[0, 0, 0]  # U = u·I exactly when every head is this u times I
    stats = _stats(_p_stats, dyn, P0, p_times) | _stats(_u_stats, dyn, (U0, u), u_times)
    return P0, U0, u, stats


def _read(dyn: SelfAttentionDynamics, grid: np.ndarray) -> _Model:
    p_read = _reading([dyn.P] if dyn.P is not None else [dyn.Q, dyn.K], grid)
    u_read = _reading([dyn.U], grid)
    P0, U0, u, stats = _weights(dyn, *(np.asarray(r.times, jnp.result_type(float))
                                       for r in (p_read, u_read)))
    stats = {k: float(v) for k, v in stats.items()}
    stats["lam1"], stats["gap"] = -stats.pop("neg_lam1"), -stats.pop("neg_gap")
    stats["align"] = -stats.pop("neg_align")
    return _Model(
        np.asarray(P0, np.float64), np.asarray(U0, np.float64), float(u), stats,
        None if dyn.W is None else np.asarray(dyn.W, np.float64),
        *U0.shape[:2], dyn.causal, float(dyn.beta), p_read, u_read,
        dyn.norm, dyn.kernel, dyn.window, dyn.mask is not None,
    )


def _unit(A: np.ndarray) -> tuple[np.ndarray, float]:
    """`A / max |A|` and `max |A|` (`A` itself and 0 for a zero matrix)."""
    s = float(np.max(np.abs(A)))
    return (A / s if s > 0 else A), s


# --- the hypotheses ------------------------------------------------------------


def _check_heads(m: _Model, one: bool) -> Check:
    return Check("one head" if one else "any number of heads", m.h == 1 or not one, f"h = {m.h}")


def _check_causal(m: _Model, causal: bool) -> Check:
    name = "causal (auto-regressive) attention" if causal else "full attention"
    return Check(name, m.causal == causal, f"causal = {m.causal}")


def _check_sphere(m: _Model, tol: float) -> Check:
    dev = 0.0 if m.W is None else float(np.max(np.abs(m.W - np.eye(m.d))))
    return Check("tokens on the sphere (W = I)", dev <= tol, f"max |W − I| = {dev:.2g}")


def _identity_holds(m: _Model, tol: float) -> bool:
    return m.u > 0 and m.stats["U_identity"] <= tol


def _check_identity_U(m: _Model, tol: float) -> Check:
    dev = m.stats["U_identity"]
    detail = f"u = {m.u:.3g}, max |U − u I| / |U| = {dev:.2g} ({m.U.where})"
    return Check("U_η(t) = u·I for every head, one u > 0", _identity_holds(m, tol), detail)


def _check_constant(m: _Model, name: str, tol: float) -> Check:
    read = getattr(m, name)
    if read.kind == "constant":
        return Check(f"{name} time-invariant", True, read.where)
    dev = m.stats[f"{name}_change"]
    what = "piecewise constant" if read.kind == "piecewise" else "a Schedule function"
    detail = f"{what}: max |{name}(t) − {name}(0)| / |{name}| = {dev:.2g} ({read.where})"
    return Check(f"{name} time-invariant", dev <= tol, detail)


def _finite(m: _Model, name: str) -> str:
    read, top = getattr(m, name), m.stats[f"{name}_max"]
    if m.stats[f"{name}_nonfinite"]:
        return f"{name} not finite ({read.where})"
    if read.exact:
        return f"{name} has finitely many values, max |{name}| = {top:.3g} ({read.where})"
    return f"{name} finite where {read.where}, max |{name}| = {top:.3g}: taken to be bounded"


def _check_bounded(m: _Model) -> Check:
    ok = m.stats["P_nonfinite"] == 0 and m.stats["U_nonfinite"] == 0
    return Check("P, U bounded", ok, f"{_finite(m, 'P')}; {_finite(m, 'U')}")


def _check_regular(m: _Model, name: str, tol: float, what: str) -> Check:
    """`name` uniformly continuous / differentiable in `t`: read from the schedule type;
    a piecewise constant schedule is, exactly when its pieces agree (within `tol`)."""
    read = getattr(m, name)
    if read.kind == "constant":
        return Check(f"{name} {what}", True, read.where)
    if read.kind == "smooth":
        return Check(f"{name} {what}", True, "a Schedule function, taken to be smooth "
                                             "(not checked)")
    jump = m.stats[f"{name}_change"]
    detail = f"piecewise constant, jumps of up to {jump:.2g} · |{name}| ({read.where})"
    return Check(f"{name} {what}", jump <= tol, detail)


def _check_symmetric(m: _Model, name: str, tol: float) -> Check:
    dev = m.stats[f"{name}_asym"]
    detail = f"max |{name} − {name}ᵀ| / |{name}| = {dev:.2g} ({getattr(m, name).where})"
    return Check(f"{name} symmetric", dev <= tol, detail)


def top_eigen(U: np.ndarray):
    """Eigenvalues (descending) and eigenvectors (columns, same order) of `(U + Uᵀ)/2`,
    computed on `U / max |U|` so that tiny and huge weights lose no digits."""
    s = np.max(np.abs(U), axis=(-2, -1), keepdims=True)
    s = np.where(s > 0, s, 1.0)
    lam, vec = np.linalg.eigh((U + np.swapaxes(U, -1, -2)) / (2 * s))
    return lam[..., ::-1] * s[..., 0], vec[..., :, ::-1]


#: The most U's top eigenvector may turn between two read times (degrees) for `λ₁` to
#: count as simple between them: a crossing of `λ₁` and `λ₂` turns it by about 90°.
MAX_TURN = 45.0


def _check_simple_top(m: _Model, tol: float) -> Check:
    gap, lam1 = m.stats["gap"], m.stats["lam1"]  # in units of |U(t)|
    # λ₁ and λ₂ crossing between two read times swap the top eigenvector there: the
    # gap at the read times alone missed it (λ₁ = λ₂ at t = 4.935 read as simple)
    turn = math.degrees(math.acos(min(1.0, m.stats["align"])))
    ok = m.h == 1 and gap > tol and lam1 > tol and turn <= MAX_TURN
    detail = (f"smallest λ₁ / |U| = {lam1:.3g}, (λ₁ − λ₂) / |U| = {gap:.3g} ({m.U.where})"
              + (f"; its eigenvector turns {turn:.0f}° between two read times (λ₁ and λ₂ "
                 "cross between them)" if turn > MAX_TURN else ""))
    return Check("λ₁(U) simple and positive", ok, detail)


def _check_gradient_pair(m: _Model, tol: float) -> Check:
    P, p = _unit(m.P0[0])
    WU, wu = _unit(m.U0[0] if m.W is None else m.W @ m.U0[0])
    c = float(np.sum(WU * P) / max(np.sum(P * P), np.finfo(float).tiny))  # in units wu / p
    # Relative to the terms' scale max(|W| |U|) ≥ |W U|: a product rounded in the
    # model's dtype is off by a multiple of eps times it, not of |W U| (cancellation).
    terms = wu if m.W is None else float(np.max(np.abs(m.W) @ np.abs(m.U0[0])))
    dev = float(np.max(np.abs(WU - c * P))) * (wu / terms if terms > 0 else 1.0)
    sym = float(np.max(np.abs(P - P.T)))
    lam_min = float(np.linalg.eigvalsh((P + P.T) / 2).min())
    ok = c > 0 and dev <= tol and sym <= tol and lam_min > tol and m.beta > 0
    c_value = c * wu / p if p > 0 else 0.0
    detail = (
        f"W U = c P with c = {c_value:.3g} (residual {dev:.2g} · |W| |U|), "
        f"|P − Pᵀ| = {sym:.2g} · |P|, λ_min(P) = {lam_min:.3g} · |P|, β = {m.beta:.3g}"
    )
    return Check("P symmetric positive definite, W U = c P (c > 0), β > 0", ok, detail)


def _check_form(m: _Model) -> list[Check]:
    """The model of the papers: post-normalisation, softmax, no window or mask.

    Every theorem is proved for the flow (eq. 6) on `E_W` with softmax weights over
    all tokens (or all earlier ones); a variant is a different dynamical system.
    """
    # softmax: the normalised kernel exponential in the logit
    papers_norm = m.norm.papers_default
    papers_kernel = m.kernel.normalised and m.kernel.exponent_shift is not None
    norm = m.norm.description if papers_norm else (
        f"norm = {m.norm.name!r}: {m.norm.description}")
    kernel = "softmax" if papers_kernel else f"kernel = {m.kernel.name!r}: {m.kernel.description}"
    limits = [f"a window |i − j| < {m.window}"] if m.window is not None else []
    limits += ["a mask"] if m.masked else []
    scope = (f"attention limited by {' and '.join(limits)}: the proofs average over every "
             "token (or every earlier one)" if limits else "every token (or every earlier one)")
    return [
        Check("post-normalisation (eq. 4, 6)", papers_norm, norm),
        Check("softmax attention (rows summing to one)", papers_kernel, kernel),
        Check("no window or mask", not limits, scope),
    ]


# --- the theorems --------------------------------------------------------------


def _vec(v: np.ndarray) -> str:
    return "(" + ", ".join(f"{c:.3g}" for c in v[:4]) + (", …)" if len(v) > 4 else ")")


def _report(m: _Model, theorem, checks, statement, domain, data=None) -> TheoremReport:
    checks = tuple(_check_form(m)) + tuple(checks)  # the model's form first
    applies = all(c.holds for c in checks)
    return TheoremReport(theorem, applies, checks, statement, domain, data or {})


def _theorem_32(m: _Model, tol: float) -> TheoremReport:
    checks = [
        _check_causal(m, False), _check_heads(m, True), _check_constant(m, "P", tol),
        _check_constant(m, "U", tol), _check_gradient_pair(m, tol),
    ]
    identity = m.h == 1 and _identity_holds(m, tol)
    statement = (
        f"a gradient flow of E_P (β = {m.beta:.3g}): E_P never decreases and every "
        "trajectory converges to an equilibrium"
        + ("; with U = u·I the only stable equilibria are consensus" if identity else "")
    )
    return _report(m, "3.2", checks, statement, "the whole ellipsoid", {"identity_U": identity})


def _theorem_41(m: _Model, tol: float) -> TheoremReport:
    checks = [
        _check_causal(m, False), _check_heads(m, False), _check_identity_U(m, tol),
        _check_bounded(m), _check_regular(m, "P", tol, "uniformly continuous"),
    ]
    heads = f"{m.h} head" + ("s" if m.h > 1 else "")
    statement = f"tokens starting in an open hemisphere converge to consensus ({heads})"
    return _report(m, "4.1", checks, statement, "an open hemisphere {y : ⟨z, y⟩_W > 0}")


def _theorem_51(m: _Model, tol: float) -> TheoremReport:
    checks = [
        _check_causal(m, True), _check_heads(m, False), _check_sphere(m, tol),
        _check_identity_U(m, tol), _check_bounded(m),
    ]
    statement = "the first token stays fixed and every token converges to x₁(0)"
    return _report(m, "5.1", checks, statement, "almost every start (a conull set)")


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
    return _report(m, "5.2", checks, statement, "the hemisphere ⟨v₁, x⟩ > 0 (or < 0)", data)


def _theorem_53(m: _Model, tol: float) -> TheoremReport:
    checks = [
        _check_causal(m, True), _check_heads(m, True), _check_sphere(m, tol),
        _check_symmetric(m, "U", tol), _check_regular(m, "U", tol, "differentiable in t"),
        _check_simple_top(m, tol), _check_bounded(m),
    ]
    lam, vec = top_eigen(m.U0[0])
    statement = (
        "tokens starting in the hemisphere ⟨v₁(0), x⟩ > 0 converge to a ball around "
        "v₁(t), the top eigenvector of U(t); its radius grows with the speed of v₁(t)"
    )
    data = {"v1": vec[:, 0], "eigenvalues": lam}
    return _report(m, "5.3", checks, statement, "the hemisphere ⟨v₁(0), x⟩ > 0 (or < 0)", data)


def default_tol(dtype, d: int) -> float:
    """`classify`'s default tolerance for weights stored in `dtype` in dimension `d`:
    `max(1e-8, 16 d eps)`. A residual made by rounding alone (a product of `d`
    terms, `U = c·P` or `(A + Aᵀ)/2` computed in the dtype) is a few `d·eps` of the
    scale: `1e-8` in float64, `~6e-6` for `d = 3` in float32 (eps `1.2e-7`)."""
    return max(1e-8, 16 * d * float(jnp.finfo(dtype).eps))


def _weights_dtype(dyn: SelfAttentionDynamics):
    """The least precise floating dtype among the model's weights at `t = 0`."""
    t0 = np.zeros((), jnp.result_type(float))
    arrays = eqx.filter_eval_shape(lambda d, t: [d.query_key(t), d.U(t)], dyn, t0)
    arrays += [] if dyn.W is None else [dyn.W]
    return max((a.dtype for a in arrays), key=lambda dt: jnp.finfo(dt).eps)


def _times(times) -> tuple[np.ndarray, str | None]:
    """The sampling grid of `classify`, and why `times` is refused (`None`: it is not)."""
    if times is None:
        return np.linspace(0.0, 10.0, 201), None
    try:
        array = np.asarray(times, np.float64)
    except (TypeError, ValueError):
        array = np.zeros(())
    bad = np.flatnonzero(~np.isfinite(array)) if array.ndim == 1 else []
    if array.ndim != 1 or array.size < 1 or len(bad):
        return array, (f"must be finite, got {array[bad[0]]} at index {bad[0]}." if len(bad)
                       else f"must be a nonempty 1-D array of finite times, got {times!r}; "
                       "pass e.g. np.linspace(0, 10, 201), or None.")
    return array, None


def classify(
    dyn: SelfAttentionDynamics, *, times=None, tol: float | None = None
) -> Classification:
    """Which theorems of paper 001 (Table 1) cover `dyn`, and what they predict.

    Reads the hypotheses of Theorems 3.2, 4.1, 5.1, 5.2 and 5.3 off the model:

    - 3.2: full attention, one head, `P` and `U` time-invariant, `P` symmetric
      positive definite, `W U = c P` with `c > 0`, `β > 0` → a gradient flow of
      `E_P` (eq. 8), converging to an equilibrium from everywhere.
    - 4.1: full attention, any heads, every `U_η(t) = u·I` (one `u > 0`), `P`
      bounded and uniformly continuous → consensus from an open hemisphere.
    - 5.1: causal, `W = I`, every `U_η(t) = u·I` (one `u > 0`), `P` bounded →
      every token converges to `x₁(0)` from almost every start.
    - 5.2: causal, `W = I`, one head, `U` time-invariant and symmetric with a
      simple top eigenvalue `λ₁ > 0` → convergence to `v₁` from the hemisphere
      `⟨v₁, x⟩ > 0`. (`λ₁ > 0` is required here: with `λ₁ < 0` the consensus at
      `v₁` can be unstable, see the tests.)
    - 5.3: as 5.2 with `U(t)` time-varying and differentiable, `λ₁(t)` simple and
      positive → convergence to a ball around `v₁(t)`.

    Every theorem is about the papers' model (`norm="post"`, softmax weights, no
    `window` or `mask`): a variant fails these checks (`docs/variants.md`).

    The paper states 4.1 and 5.1 for `U = I`; `U = u·I` with `u > 0` is the same
    flow with time rescaled by `u`, so it is covered too.

    **Tolerance.** A matrix property holds when its residual, relative to the
    scale of the matrices it constrains (`|A|` = largest `|entry|`, per head), is
    at most `tol`: `|U − Uᵀ| ≤ tol·|U|`, `|U(t) − U(0)| ≤ tol·max(|U(0)|, |U(t)|)`,
    `|U − u I| ≤ tol·max(|U|, u)`, `|W U − c P| ≤ tol·|W U|`,
    `|P − Pᵀ| ≤ tol·|P|`; eigenvalues must exceed it, `λ_min(P) > tol·|P|`,
    `λ₁(U) > tol·|U|` and `λ₁ − λ₂ > tol·|U|`. The verdict (which theorems apply,
    and each check's `holds`) is therefore the same for `P → cP, β → β/c` (the
    flow depends on `βP` only) and for `U → cU` (`c > 0`; time is rescaled). A
    zero matrix is symmetric and time-invariant, but not positive definite and
    has no simple top eigenvalue (nor is it `u·I` with `u > 0`). `W = I` is
    checked as `|W − I| ≤ tol` (the sphere has a scale). A product is judged
    against its terms: `|W U − c P| ≤ tol·max(|W| |U|)` (entrywise absolute values,
    `= |U|` without `W`), the scale its rounding is relative to.

    The default `tol` follows the weights' dtype (`default_tol`), so a float32 model
    built to satisfy a hypothesis is not refused for its rounding.

    **Times.** The values a weight takes for `t ≥ 0` are read from its schedule
    where it has structure: an array or `ja.Constant` has one value, a
    `ja.PiecewiseConstant` one per piece (every piece is compared, exactly; its
    boundedness follows from finite pieces, its continuity from whether the pieces
    agree). A `ja.Schedule` function is sampled at `times`, and every check made
    from the samples says so (`Check.detail`: "on a grid of N times on [a, b]"):
    its boundedness is finiteness on the grid, and its continuity and
    differentiability are assumed, not checked.

    **Arguments:**

    - `dyn`: the model.
    - `times`: the grid on which `Schedule` functions are sampled (default 201
      points on `[0, 10]`); constant and piecewise constant weights need none.
    - `tol`: the relative tolerance of every check (default: `default_tol` of
      the least precise dtype among `P`, `U`, `W`).

    **Returns:**

    A `Classification`: `.theorems` (those that apply), `.applicable` (their
    `TheoremReport`s with the statement and domain), `str()` a readable report.
    """
    times, why = _times(times)
    number = isinstance(tol, (int, float, np.floating, np.integer)) and not isinstance(tol, bool)
    refuse_first((
        (not isinstance(dyn, SelfAttentionDynamics), TypeError,
         f"classify: `dyn` must be a ja.SelfAttentionDynamics, got {type(dyn).__name__}."),
        (why, ValueError, f"classify: `times` {why}"),
        (tol is not None and not (number and 0 < tol < np.inf), ValueError,
         f"classify: `tol` must be a finite number > 0, got {tol!r}."),
    ))
    m = _read(dyn, times)
    tol = default_tol(_weights_dtype(dyn), m.d) if tol is None else float(tol)
    builders = (_theorem_32, _theorem_41, _theorem_51, _theorem_52, _theorem_53)
    return Classification(tuple(b(m, tol) for b in builders), tol, times)
