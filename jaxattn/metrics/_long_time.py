"""Integrators of the attention flow over horizons an adaptive solver in `t` cannot
reach, with the tokens' clusters snapped to point masses (Geshkovski, Koubbi,
Polyanskiy, Rigollet, "Dynamic metastability in the self-attention model", 2024).
Their plateaus and mergers are judged by `cluster_labels`, `interaction_energy`,
`plateaus` and `saddle_index`.

`rescaled_euler` is the paper's own scheme: Euler steps of constant length in the
rescaled time of its figures. `rescaled_flow` steps in a rescaled time `s` with
`dt/ds = (1 + t) / (1 + (1 + t) ‖v‖/ρ)` (`v` the tokens' velocity, `ρ ≤ 1` their
smallest distance), the time a state component `τ = log(1 + t)`, and tokens closer
than `snap` merged into one point mass; why, and what it measures at β = 500:
docs/limits.md, "The last merger at β = 500"."""

import math

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx
from jaxtyping import Array, Float

from .._precision import einsum
from .._programs import kept_jit
from .._validate import SimulationError, check_count, check_scalar, refuse_first
from ._consensus import cluster_labels


def _snap(theta: Float[Array, " n"], dist: float) -> Float[Array, " n"]:
    """Each later token within `dist` of an earlier one takes its angle, in order."""
    n = theta.shape[0]

    def pair(p, th):
        j, k = p // n, p % n
        close = (k > j) & (jnp.abs(th[j] - th[k]) < dist)
        return th.at[k].set(jnp.where(close, th[j], th[k]))

    return jax.lax.fori_loop(0, n * n, pair, theta)


def rescaled_euler(theta0: Float[Array, " n"], beta, lr: float, steps: int, *,
                   snap_norm: float = 1e-5, snap_dist: float = 1e-3) -> Float[Array, " steps"]:
    """The paper's scheme on the circle: Euler steps of constant length in its
    rescaled time, `θ ← θ + lr log β · g/‖g‖` with `g_i = (1/n²) Σ_j sin(θ_j − θ_i)
    e^{−2β sin²((θ_i − θ_j)/2)}` (the `usa` flow's angular velocity over `n`), tokens
    closer than `snap_dist` snapped together while `‖g‖` is below `snap_norm`; the
    interaction energy after each step.

    The velocity is taken in angles, not from `dyn.velocity`'s tangent vectors: on
    a plateau `‖g‖` falls to `10⁻¹²` and below while the projection `P_x` of the
    tangent form rounds at `10⁻¹⁶` of the weights, and the direction `g/‖g‖` of this
    scheme amplifies that (measured: the energies part after 2,889 steps of the
    reference setting). In angles a snapped pair adds exactly 0.

    **Arguments:**

    - `theta0`: the initial angles `(n,)`.
    - `beta`: the inverse temperature `β`.
    - `lr`: the step of rescaled time.
    - `steps`: the number of steps.
    - `snap_norm`, `snap_dist`: the snapping rule (the reference script's defaults).

    **Returns:**

    The energy `(1/n²) Σ_ij e^{β(cos(θ_i − θ_j) − 1)}` after each step `(steps,)`.
    """
    lr, steps = check_scalar(lr, "lr", positive=True), check_count(steps, "steps")
    beta = check_scalar(beta, "beta")
    theta0 = np.asarray(theta0, float)
    refuse_first((bad, f"rescaled_euler needs {message}.") for bad, message in (
        (theta0.ndim != 1 or theta0.size < 2 or not np.all(np.isfinite(theta0)),
         f"finite angles `theta0` (n,) of n ≥ 2 tokens, got shape {theta0.shape}"),
        (theta0.ndim == 1 and np.ptp(np.mod(theta0, 2 * np.pi)) == 0,
         "tokens not all at one angle (they are a consensus already: g = 0 has no direction)"),
        (not beta > 1, f"β > 1 (its steps are lr · log β: at β ≤ 1 they stand still or run "
                       f"backwards), got {beta!r}"),
    ))
    theta0 = jnp.asarray(theta0)
    n = theta0.shape[0]

    def energy_terms(theta):
        delta = theta[:, None] - theta[None, :]
        return delta, jnp.exp(-2 * beta * jnp.sin(delta / 2) ** 2)

    def step(theta, _):
        delta, w = energy_terms(theta)
        g = jnp.sum(-jnp.sin(delta) * w, axis=1) / n**2
        norm = jnp.sqrt(jnp.sum(g * g))
        theta = theta + lr * jnp.log(beta) * g / norm
        theta = jax.lax.cond(norm < snap_norm, _snap, lambda th, _: th, theta, snap_dist)
        return theta, jnp.sum(energy_terms(theta)[1]) / n**2

    return jax.lax.scan(step, theta0, None, length=steps)[1]


#: The snapping distance of `rescaled_flow` (chord): points this close become one.
#: The pair's centre of mass is what the flow keeps (to the other clusters' pull,
#: `e^{−β(1 − cos δ)}` small), so snapping moves the other tokens' velocities by
#: `O((β snap)²)` of their size.
RESCALED_SNAP = 1e-7
#: The most steps of one segment of `rescaled_flow` (between two events); its dense
#: output is stored whole.
SEGMENT_STEPS = 4096


def _chords(x, mass):
    """The points' unit directions, their differences `u_b − u_a`, the squared chords
    and the pairs of two distinct live points."""
    u = x / jnp.linalg.norm(x, axis=-1, keepdims=True)
    diff = u[None, :, :] - u[:, None, :]
    live = mass > 0
    pair = live[:, None] & live[None, :] & ~jnp.eye(x.shape[0], dtype=bool)
    return u, diff, jnp.sum(diff * diff, axis=-1), pair


def _rescaled_field(s, y, args):
    """`d(x, τ)/ds` of `rescaled_flow`: the `usa` velocity of point masses
    `v_a = Σ_b (m_b/n) e^{−β‖u_a − u_b‖²/2} P_{u_a}(u_b − u_a)` (`1 − ⟨u_a, u_b⟩ =
    ‖u_a − u_b‖²/2`, without cancellation) as `e^{top} g`, and with
    `L = τ + top + log(‖g‖/ρ) = log((1 + t)‖v‖/ρ)`: `dx/ds = σ(L) ρ g/‖g‖`,
    `dτ/ds = σ(−L)`. `x` is carried unnormalised, its direction moving by the
    sphere's flow (`dx` is scaled by `‖x‖`), so the solver's rounding of the norm
    never reaches the flow."""
    x, tau = y
    beta, mass = args
    u, diff, sq, pair = _chords(x, mass)
    exponent = jnp.where(pair, -0.5 * beta * sq, -jnp.inf)
    top = jnp.max(exponent)
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    w = jnp.exp(exponent - top) * mass[None, :] / jnp.sum(mass)
    g = einsum("ab,abk->ak", w, diff, precision="float32")
    g = g - jnp.sum(g * u, axis=-1, keepdims=True) * u
    norm = jnp.sqrt(jnp.sum(mass[:, None] * g * g))  # every token's velocity counted
    rho = jnp.minimum(jnp.sqrt(jnp.min(jnp.where(pair, sq, jnp.inf))), 1.0)
    moving = norm > 0
    safe = jnp.where(moving, norm, 1.0)
    log_speed = tau + top + jnp.log(safe) - jnp.log(rho)
    dx = jnp.where(moving, rho * jax.nn.sigmoid(log_speed) / safe, 0.0) * g \
        * jnp.linalg.norm(x, axis=-1, keepdims=True)
    return dx, jnp.where(moving, jax.nn.sigmoid(-log_speed), 1.0)


@kept_jit(static_argnames=())
def _segment(x, tau, mass, labels, beta, eps, snap, tau_max, rtol, grid):
    """One diffrax solve in `s` from `(x, τ)` to the first event: two points of
    different `labels` (the clusters at `eps`) within `eps` (located by bisection),
    two live points within `snap`, or `τ = tau_max`. Its end, its steps and result,
    and the points at the log-times `grid` it spans (by bisection on the dense
    output, `τ` increasing in `s`) with the mask of those."""

    def stop(t, y, args, **kwargs):
        _, _, sq, pair = _chords(y[0], mass)
        cross = jnp.min(jnp.where(pair & (labels[:, None] != labels[None, :]), sq, jnp.inf))
        near = jnp.min(jnp.where(pair, sq, jnp.inf))
        return jnp.minimum(jnp.minimum(jnp.sqrt(cross) - eps, jnp.sqrt(near) - snap),
                           tau_max - y[1])

    sol = dfx.diffeqsolve(
        dfx.ODETerm(_rescaled_field), dfx.Tsit5(), 0.0, jnp.inf, 1e-3, (x, tau),
        args=(beta, mass), saveat=dfx.SaveAt(t1=True, dense=True),
        stepsize_controller=dfx.PIDController(rtol=rtol, atol=rtol),
        event=dfx.Event(stop, optx.Bisection(rtol=1e-12, atol=1e-10)),
        max_steps=SEGMENT_STEPS, throw=False)
    s1, x1, tau1 = sol.ts[-1], sol.ys[0][-1], sol.ys[1][-1]

    def at(target):
        def halve(_, bounds):
            lo, hi = bounds
            mid = 0.5 * (lo + hi)
            below = sol.evaluate(mid)[1] < target
            return jnp.where(below, mid, lo), jnp.where(below, hi, mid)

        lo, hi = jax.lax.fori_loop(0, 64, halve, (jnp.zeros_like(s1), s1))
        return sol.evaluate(hi)[0]

    inside = (grid >= tau) & (grid <= tau1)
    points = jax.vmap(at)(jnp.clip(grid, tau, tau1))
    return x1, tau1, sol.result, sol.stats["num_steps"], points, inside


def _join(x: np.ndarray, mass: np.ndarray, owner: np.ndarray, snap: float) -> None:
    """Join live points within `snap` (in place): one point at their mean direction
    carrying their masses, the other emptied, its tokens handed over."""
    for a in range(len(mass)):
        for b in range(a + 1, len(mass)):
            if mass[a] > 0 and mass[b] > 0 and np.linalg.norm(x[a] - x[b]) <= snap * 1.01:
                joined = mass[a] * x[a] + mass[b] * x[b]
                x[a] = joined / np.linalg.norm(joined)
                mass[a], mass[b] = mass[a] + mass[b], 0.0
                owner[owner == b] = a


def _point_labels(x, owner, eps) -> tuple[np.ndarray, int]:
    """Each point's cluster at `eps` (the tokens' `cluster_labels`, a pair found at
    `eps` by the event's bisection included) and the number of clusters."""
    with jax.enable_x64(True):
        tokens = jnp.asarray(x[owner], jnp.float64)
        label = np.asarray(cluster_labels(tokens, eps * (1 + 1e-8)))
    out = np.arange(len(owner))
    out[owner] = label
    return out, len(np.unique(label))


def rescaled_flow(x0: Float[Array, "n d"], beta: float, ts, *, eps: float,
                  target: int = 1, rtol: float = 1e-10,
                  snap: float = RESCALED_SNAP) -> dict[str, np.ndarray]:
    """The `usa` flow of tokens `x0` on the sphere (weights `e^{β(⟨x_i, x_j⟩ − 1)}/n`,
    as `ja.SelfAttentionDynamics(I, I, beta=β, kernel="usa")`) to the final time
    `ts[-1]`, stepped in the rescaled time of the module docstring and stopped once
    at most `target` clusters at linking distance `eps` are left: what
    `ja.solve_flow(..., solution=True, event=...)` records with an event that stops
    at `cluster_count(x, eps) <= target`, for horizons a solver in `t` cannot reach.

    A diffrax solve (`Tsit5`, `rtol` on `(x, τ)`) per segment between two events: a
    merger (two clusters within `eps`, its time located by bisection), a snap (two
    points within `snap`) or the final time. In float64.

    **Arguments:**

    - `x0`: the tokens `(n, d)`, unit vectors.
    - `beta`: the inverse temperature `β > 0`.
    - `ts`: the save times, increasing from `0` (a log grid), up to `10³⁰⁸`.
    - `eps`: the linking distance of a cluster, `> snap`.
    - `target`: the cluster count that stops the run, `≥ 1`.
    - `rtol`: the step controller's tolerance (relative and absolute), at most
      `snap/1000`: a pair closing to `snap` is resolved (at `rtol ≈ snap` the
      solver's error walks the pair's distance around `snap`).
    - `snap`: the distance at which two points become one.

    **Returns:**

    `ts` (the save times, `inf` past the stop), `ys` (the tokens there, `x0` past the
    stop), `t1` (the stop: the final merger's time, or `ts[-1]`), `mergers` (every
    merger's time, `inf`-padded to `n − 1`), `steps` (the solver's steps, every
    segment's).
    """
    ts = np.asarray(ts, float)
    refuse_first((bad, f"rescaled_flow needs {message}.") for bad, message in (
        (not (ts[0] == 0 and np.all(np.diff(ts) > 0) and np.isfinite(ts[-1])),
         "finite save times increasing from 0"),
        (not 0 < snap < eps, f"0 < snap < eps, got {snap!r} and {eps!r}"),
        (not 0 < rtol <= snap / 1000 * (1 + 1e-9),
         f"0 < rtol ≤ snap/1000 = {snap / 1000:g}, got {rtol!r}"),
        (not (isinstance(target, int | np.integer) and target >= 1),
         f"a target cluster count `target` ≥ 1, got {target!r}"),
        (not check_scalar(beta, "beta") > 0, f"β > 0, got {beta!r}"),
    ))
    x = np.array(x0, float)
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    n = len(x)
    mass, owner = np.ones(n), np.arange(n)
    grid, tau, tau_max = np.log1p(ts), 0.0, float(np.log1p(ts[-1]))
    ys, filled = np.repeat(x[None], len(ts), axis=0), np.zeros(len(ts), bool)
    _join(x, mass, owner, snap)  # coincident tokens start as one point
    labels, count = _point_labels(x, owner, eps)
    mergers, steps, stopped = [], 0, count <= target
    with jax.enable_x64(True):
        for _ in range(4 * n + 4):  # each segment ends in a merger, a snap or the end
            if stopped or tau >= tau_max:
                break
            x1, tau1, result, taken, points, inside = _segment(
                jnp.asarray(x), jnp.asarray(tau), jnp.asarray(mass), jnp.asarray(labels),
                beta, eps, snap, tau_max, rtol, jnp.asarray(grid))
            steps += int(taken)
            if result != dfx.RESULTS.event_occurred:
                raise SimulationError(f"rescaled_flow at β = {beta:g} stopped: a segment "
                                      f"took more than {SEGMENT_STEPS} steps or its event "
                                      f"failed ({result}); loosen rtol or raise eps.")
            new = np.asarray(inside) & ~filled
            ys[new], filled = np.asarray(points)[new][:, owner], filled | new
            x, tau = np.asarray(x1) / np.linalg.norm(np.asarray(x1), axis=-1,
                                                     keepdims=True), float(tau1)
            _join(x, mass, owner, snap)
            labels, now = _point_labels(x, owner, eps)
            if now < count:
                mergers += [math.expm1(tau)] * (count - now)
                count = now
                stopped = count <= target
    t1 = math.expm1(tau) if stopped else float(ts[-1])
    saved = np.where(filled, ts, np.inf)
    return {"ts": saved, "ys": np.where(filled[:, None, None], ys, np.asarray(x0)[None]),
            "t1": np.asarray(t1), "steps": np.asarray(steps),
            "mergers": np.asarray(mergers + [math.inf] * (n - 1 - len(mergers)))}
