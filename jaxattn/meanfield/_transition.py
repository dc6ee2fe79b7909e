"""The ordered branch of the USA equation (`ordered_state`: the zonal minimiser of the
free energy on the Gauss–Jacobi nodes of `t = ⟨x, e⟩`) and the transition coupling
`K_c` (`transition_coupling`): docs/meanfield_equation.md, "The ordered branch and
`K_c`"."""

import contextlib
import functools
import math
from typing import NamedTuple

import numpy as np
from scipy.special import eval_jacobi, roots_jacobi

from .._validate import check_scalar, check_sphere

try:  # BLAS threads on small matrices only contend for the cores (40× slower when busy)
    from threadpoolctl import threadpool_limits
except ImportError:  # pragma: no cover
    def threadpool_limits(limits=None):
        return contextlib.nullcontext()

#: Nodes of `t` (Gauss–Jacobi) and the harmonics' degree: the ordered densities of
#: β ≤ 30 are resolved to rounding.
NODES, DEGREE = 160, 120
#: A minimiser is ordered when its `r = E[t ρ]` exceeds this.
ORDERED = 1e-5
#: For `d ≥ 4` the weight `(1 − t²)^{(d−3)/2}` vanishes at `t = 1`, and so does a
#: resolved density's mass: more than this share on the last node is a density too
#: peaked for `NODES` (at large `β` and `d` it sits there whole), refused.
LAST_NODE_MASS = 1e-3
#: The largest `β` (and `d`) of the ordered branch: `NODES` resolve its densities to
#: rounding up to `β = 30`; past it they are refused, not silently wrong.
BETA_MAX, DIM_MAX = 30.0, 64


class OrderedState(NamedTuple):
    """The ordered minimiser at one coupling: `nodes` `t` and `density` `ρ(t)`, its
    order parameter `r = E[t ρ(t)]`, its free energy and the uniform density's.
    `r < ORDERED` means the minimisation found no ordered state (it fell to uniform)."""

    nodes: np.ndarray
    density: np.ndarray
    order: float
    free_energy: float
    uniform_free_energy: float


def check_branch(beta, d) -> tuple[float, int]:
    """`(β, d)` of the ordered branch: `0 < β ≤ BETA_MAX`, `2 ≤ d ≤ DIM_MAX`."""
    beta, d = check_sphere(beta, d)
    if beta > BETA_MAX or d > DIM_MAX:
        raise ValueError(f"the ordered branch is resolved for β ≤ {BETA_MAX:g} and d ≤ "
                         f"{DIM_MAX} ({NODES} nodes), got β = {beta:g}, d = {d}.")
    return beta, d


def _zonal(beta: float, d: int):
    a = (d - 3) / 2
    t, w = roots_jacobi(NODES, a, a)
    w = w / w.sum()
    ells = np.arange(DEGREE + 1)
    p = np.stack([eval_jacobi(ell, a, a, t) / eval_jacobi(ell, a, a, 1.0) for ell in ells], -1)
    h = w @ p**2
    e = w @ (np.expm1(beta * t)[:, None] / beta * p)
    matrix = (p * (e / h)) @ (p * w[:, None]).T  # Φ = matrix @ ρ
    return t, w, matrix, beta


def _parts(u, w):
    """`ρ = e^u / E[e^u]` and `log ρ`, without overflow or `log 0`."""
    shifted = u - u.max()
    log_rho = shifted - math.log(w @ np.exp(shifted))
    return np.exp(log_rho), log_rho


def _energy(u, coupling, zonal):
    """`ρ(u)`, the free energy `F[ρ]` and its gradient `∂F/∂ρ` on the nodes."""
    _, w, matrix, _ = zonal
    rho, log_rho = _parts(u, w)
    phi = matrix @ rho
    f = w @ (rho * log_rho) - coupling * (w @ (rho * phi))
    return rho, f, w * (log_rho + 1 - 2 * coupling * phi)


def _descend(coupling, zonal, start=None) -> np.ndarray:
    """`log ρ` near a local minimiser of `F`, by L-BFGS from `start` (default: the
    Gibbs state of a point mass, in the ordered minimiser's basin where there is one;
    `_newton` polishes it). A descent never stops on the saddle branch."""
    from scipy.optimize import minimize

    t, w, _, beta = zonal

    def objective(u):
        rho, f, g = _energy(u, coupling, zonal)
        return f, g * rho - w * rho * (g @ rho)

    u0 = 2 * coupling * np.expm1(beta * t) / beta if start is None else start
    res = minimize(objective, u0, jac=True, method="L-BFGS-B",
                   options={"maxiter": 2000, "ftol": 1e-12, "gtol": 1e-9})
    return res.x


def _newton(u, coupling, zonal, iterations: int = 60) -> tuple[np.ndarray, bool]:
    """Newton's method on the stationarity `u = 2K Φ[ρ(u)]` (`u = log ρ` up to a
    constant), from `u`; whether it converged (to `1e-12`)."""
    _, w, matrix, _ = zonal
    eye = np.eye(len(u))
    for _ in range(iterations):
        rho, _ = _parts(u, w)
        residual = u - 2 * coupling * (matrix @ rho)
        jac = eye - 2 * coupling * matrix @ (np.diag(rho) - np.outer(rho, w * rho))
        step = np.linalg.solve(jac, residual)
        u = u - step
        if not np.all(np.isfinite(u)):
            return u, False
        if np.max(np.abs(step)) < 1e-12 * max(1.0, np.max(np.abs(u))):
            return u, True
    return u, False


def _state(coupling, u, zonal) -> OrderedState:
    t, w, _, beta = zonal
    rho, f, _ = _energy(u, coupling, zonal)
    uniform = -coupling * (w @ (np.expm1(beta * t) / beta))
    return OrderedState(t, rho, float(w @ (t * rho)), float(f), float(uniform))


def _check_resolved(u, zonal, d: int) -> None:
    """Refuse, in one line, an ordered density the nodes do not resolve (`LAST_NODE_MASS`)."""
    t, w, _, beta = zonal
    last = (w * _parts(u, w)[0])[-1]
    if d >= 4 and last > LAST_NODE_MASS:
        raise ValueError(f"the ordered branch at β = {beta:g}, d = {d} is not resolved by "
                         f"{NODES} nodes: its density puts {100 * last:.3g}% of its mass on "
                         f"the last node (t = {t[-1]:.4f}), more than "
                         f"{100 * LAST_NODE_MASS:g}%; choose a smaller β or d.")


def ordered_state(beta: float, d: int, coupling: float) -> OrderedState:
    """The ordered minimiser of the papers' free energy at `(β, K)` (docs/meanfield_equation.md),
    found from a cap by L-BFGS on `log ρ` and polished by Newton's method on the
    stationarity condition.

    **Arguments:**

    - `beta`: `β > 0`; `d`: the dimension `≥ 2`; `coupling`: `K > 0`.

    **Returns:**

    An `OrderedState` (`order < ORDERED`: none was found, the minimiser is uniform).
    """
    beta, d = check_branch(beta, d)
    coupling = check_scalar(coupling, "coupling", positive=True)
    with threadpool_limits(1):
        zonal = _zonal(beta, d)
        u, _ = _newton(_descend(coupling, zonal), coupling, zonal)
        _check_resolved(u, zonal, d)
        return _state(coupling, u, zonal)


def transition_coupling(beta: float, d: int) -> float:
    """`K_c(β)`: the coupling where the ordered branch's free energy equals the uniform
    density's (docs/meanfield_equation.md); `K_#(β)` (`ja.theory.noisy_threshold`) for
    `β ≤ β*`, where the transition is continuous.

    Above `β*`: the ordered minimiser followed down from `K_#` in steps of 2 % until
    it no longer beats the uniform density, then bisection to `1e-11` relative.
    Cached per `(β, d)`.

    **Arguments:**

    - `beta`: `β > 0`.
    - `d`: the dimension `≥ 2`.

    **Returns:**

    `K_c` as a float.
    """
    return _above_beta_star(beta, d, _transition)


def _above_beta_star(beta, d, find) -> float:
    """`K_#(β)` at or below `β*` (the transition is continuous there), else
    `find(beta, d, K_#)` on one BLAS thread: the shared entry of `transition_coupling`
    and `fold_coupling`."""
    from ..theory import noisy_beta_star, noisy_threshold

    beta, d = check_branch(beta, d)
    k_sharp = noisy_threshold(beta, d)
    if beta <= noisy_beta_star(d):
        return k_sharp
    with threadpool_limits(1):
        return find(beta, d, k_sharp)


@functools.lru_cache(maxsize=256)
def _transition(beta: float, d: int, k_sharp: float) -> float:
    zonal = _zonal(beta, d)

    def minimiser(k, start):
        """The local minimiser reached from `start`, or None if it is the uniform one
        or its free energy is not below the uniform one's."""
        u, ok = _newton(_descend(k, zonal, start), k, zonal)
        state = _state(k, u, zonal)
        wins = ok and state.order > ORDERED and state.free_energy < state.uniform_free_energy
        return u if wins else None

    hi, anchor = k_sharp, minimiser(k_sharp, None)
    if anchor is None:
        raise ValueError(f"transition_coupling: no ordered state below the uniform one at "
                         f"K_# (β = {beta:g}, d = {d}); the branch is not resolved here.")
    while True:  # steps of 2 % down from K_#, each from the last ordered minimiser
        lo = 0.98 * hi
        u = minimiser(lo, anchor)
        if u is None:
            break
        hi, anchor = lo, u
    while hi - lo > 1e-11 * hi:  # bisection: whether the ordered minimiser still wins
        mid = 0.5 * (lo + hi)
        u = minimiser(mid, anchor)
        lo, hi, anchor = (lo, mid, u) if u is not None else (mid, hi, anchor)
    _check_resolved(anchor, zonal, d)
    return 0.5 * (lo + hi)


def fold_coupling(beta: float, d: int) -> float:
    """`K_f(β)`: the lowest coupling of the ordered branch, where it ends in a
    saddle-node (the ordered minimiser meets the saddle branch); below it the uniform
    density is the only stationary state (docs/meanfield_equation.md). `K_#(β)` for
    `β ≤ β*`, where the branch leaves the uniform state upwards; below `K_c` above `β*`.

    By continuation in the order parameter `r = E[t ρ]` (the page's "The ordered branch
    and `K_c`"); the fold is the minimum of `K(r)`, refined by Brent's method (`K` to
    rounding, as `dK/dr = 0` there). Cached per `(β, d)`.

    **Arguments:**

    - `beta`: `0 < β ≤ 30`.
    - `d`: the dimension, `2 ≤ d ≤ 64`.

    **Returns:**

    `K_f` as a float.
    """
    return _above_beta_star(beta, d, _fold)


def _on_branch(r, start, zonal, iterations: int = 60):
    """`(u, K)` on the branch at order parameter `r`: Newton's method on
    `u − 2K Φ[ρ(u)] = 0`, `E[t ρ(u)] = r`, from `start = (u, K)`; None if it fails."""
    t, w, matrix, _ = zonal
    u, k = start
    n = len(u)
    for _ in range(iterations):
        rho, _ = _parts(u, w)
        phi = matrix @ rho
        drho = np.diag(rho) - np.outer(rho, w * rho)  # ∂ρ/∂u
        jac = np.zeros((n + 1, n + 1))
        jac[:n, :n] = np.eye(n) - 2 * k * matrix @ drho
        jac[:n, n] = -2 * phi
        jac[n, :n] = (w * t) @ drho
        residual = np.append(u - 2 * k * phi, w @ (t * rho) - r)
        step = np.linalg.solve(jac, residual)
        u, k = u - step[:n], k - step[n]
        if not (np.all(np.isfinite(u)) and np.isfinite(k)):
            return None
        if np.max(np.abs(step)) < 1e-13 * max(1.0, np.max(np.abs(u)), k):
            return u, k
    return None


@functools.lru_cache(maxsize=256)
def _fold(beta: float, d: int, k_sharp: float) -> float:
    from scipy.optimize import minimize_scalar

    zonal = _zonal(beta, d)
    t = zonal[0]
    # the branch near the uniform state: ρ ≈ 1 + d r t (E[t²] = 1/d), at K_#
    rs = np.linspace(0.0, 1.0, 101)[1:-1]
    points = [_on_branch(rs[0], (np.log1p(d * rs[0] * t), k_sharp), zonal)]
    for r in rs[1:]:
        nxt = _on_branch(r, points[-1], zonal)
        if nxt is None:
            break
        points.append(nxt)
        if len(points) > 2 and points[-1][1] > points[-2][1]:
            break  # past the minimum
    ks = [k for _, k in points]
    i = int(np.argmin(ks))
    for u, _ in points[: i + 2]:  # the branch up to its fold
        _check_resolved(u, zonal, d)
    if i == 0 or i == len(ks) - 1:
        raise ValueError(f"fold_coupling: no interior minimum of the branch's K(r) "
                         f"(β = {beta:g}, d = {d}); the branch is not resolved here.")

    def coupling(r):
        found = _on_branch(r, points[i], zonal)
        return np.inf if found is None else found[1]

    best = minimize_scalar(coupling, bracket=(rs[i - 1], rs[i], rs[i + 1]),
                           options={"xtol": 1e-10})
    return float(best.fun)
