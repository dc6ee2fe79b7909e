"""The particle system of the equation on the circle, its field summed in Fourier modes:
`circle_velocity`, `circle_particles`, `circle_modes` (the derivation:
docs/meanfield_equation.md, "The particles on the circle"). With the particles' modes
`c_k = (1/n) Σ_j e^{−ikθ_j}`, `b_k = I_{k−1}(β) − I_{k+1}(β)` and `a_k = I_k(β)`:

    θ_i' = −K Σ_{k=1}^{M} b_k Im(e^{ikθ_i} c_k)       [÷ (a_0 + 2 Σ_k a_k Re(e^{ikθ_i} c_k))],

the bracket for `"softmax"`; `O(nM)`, with `M = circle_modes(β)`."""

import math

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Real
from scipy import special

from .._flow import CheckedTimes
from .._kernel import AbstractKernel
from .._programs import kept_jit
from .._validate import (
    SimulationError,
    check_count,
    check_scalar,
    checked,
    checked_on_host,
    is_concrete,
    refuse_first,
)
from ._checks import finite_reals
from ._circle import Circle
from ._kernels import check_kernel

#: The most modes `circle_modes` returns (`I_k(β)/I_0(β) ≈ e^{−k²/2β}` below
#: rounding needs `M ≈ 8.6 √β` in float64: β up to about 10⁵).
MAX_MODES = 4096


def circle_modes(beta: float, dtype=jnp.float64) -> int:
    """The Fourier modes `M ≥ 1` that `circle_velocity` keeps at `β`: the fewest with
    `2 Σ_{k≥M} I_k(β) ≤ ε I_0(β)`, `ε` the dtype's rounding (`jnp.finfo(dtype).eps`),
    which bounds every term dropped from the field and the softmax normaliser.

    **Arguments:**

    - `beta`: the inverse temperature, a concrete number `≥ 0`.
    - `dtype`: the particles' float dtype (default float64).

    **Returns:**

    `M` as an int (15 at `β = 1` in float64, 89 at `β = 100`).
    """
    traced = isinstance(beta, jax.core.Tracer)
    value = float(beta) if not traced and finite_reals(beta) else math.nan
    valid = math.isfinite(value) and value >= 0
    eps = float(jnp.finfo(dtype).eps)
    k = np.arange(MAX_MODES + 2)
    scaled = special.ive(k, value if valid else 0.0)  # I_k(β) e^{−β}, no overflow
    tail = 2 * np.cumsum(scaled[::-1])[::-1]  # 2 Σ_{j ≥ k} I_j
    small = np.flatnonzero((tail <= eps * scaled[0]) & (k >= 1))
    refuse_first((
        (traced, "`beta` is traced: pass `modes=` (e.g. circle_modes(β) at the value of β), "
                 "the truncation is read from β's value."),
        (not valid, f"`beta` must be finite and ≥ 0, got {beta!r}."),
        (small.size == 0, f"circle_modes: β = {beta!r} needs more than {MAX_MODES} Fourier "
                          "modes; the pairwise sum (ja.solve_flow) has no such limit."),
    ))
    return int(small[0])


def coefficients(beta, modes: int):
    """`(b_k, a_k) e^{−β}` for `k = 1…M` and `k = 0…M` (module docstring): `I_k(β) e^{−β}
    = (1/2π) ∫ e^{β(cos u − 1)} cos(ku) du` is the Funk–Hecke multiplier of that
    profile over `2π` (`Circle.multipliers`, exact to rounding), differentiable in `β`."""
    a = Circle(modes + 1).multipliers(lambda t: jnp.exp(beta * (t - 1)))[0] / (2 * jnp.pi)
    return a[:-2] - a[2:], a[:-1]


def angular_velocity(theta: Float[Array, " n"], beta, coupling, modes: int,
                     softmax: bool) -> Float[Array, " n"]:
    """`θ_i'` of the module docstring, `O(nM)`: `e^{ikθ_i}` by the rotation
    `e^{ikθ} = e^{i(k−1)θ} e^{iθ}` (products, no `M` sines per particle; its rounding
    grows as `k ε`), in two sweeps over `k` that hold one mode at a time: the
    particles' modes `c_k`, then the sums over `k`."""
    b, a = (c.astype(theta.dtype) for c in coefficients(beta, modes))  # (the grid's dtype)
    turn = (jnp.cos(theta), jnp.sin(theta))

    def rotate(wave):
        cos, sin = wave
        return cos * turn[0] - sin * turn[1], sin * turn[0] + cos * turn[1]

    def moments(wave, _):
        wave = rotate(wave)
        return wave, (jnp.mean(wave[0]), jnp.mean(wave[1]))

    one = (jnp.ones_like(theta), jnp.zeros_like(theta))
    _, (cm, sm) = jax.lax.scan(moments, one, None, length=modes)  # c_k = cm − i sm

    def sums(carry, mode):
        wave, field, norm = carry
        wave = rotate(wave)
        bk, ak, ck, sk = mode
        field = field + bk * (wave[1] * ck - wave[0] * sk)  # b_k Im(e^{ikθ} c_k)
        norm = norm + 2 * ak * (wave[0] * ck + wave[1] * sk)  # 2 a_k Re(e^{ikθ} c_k)
        return (wave, field, norm), None

    zero = jnp.zeros_like(theta)
    (_, field, norm), _ = jax.lax.scan(sums, (one, zero, zero + a[0]), (b, a[1:], cm, sm))
    if softmax:
        return -coupling * field / norm
    return -coupling * jnp.exp(beta) * field


def _check(x, beta, coupling, modes, kernel, ts=None, solver=dfx.Tsit5()):
    """The entry checks of `circle_velocity` and `circle_particles`: `(x, modes,
    softmax)`, or the first refusal."""
    x = jnp.asarray(x)
    member = check_kernel(kernel)
    softmax = member.normalised
    concrete = not isinstance(ts, jax.core.Tracer) and ts is not None
    t = np.asarray(ts, dtype=float) if concrete else np.zeros(1)
    bad_modes = isinstance(modes, bool) or not isinstance(modes, (int, np.integer, type(None)))
    known_beta = modes is not None and not isinstance(beta, jax.core.Tracer)
    dtype = jnp.result_type(x, float)
    # `"usa"`/`"exp"`'s force grows as `e^β`: past the dtype's range it is inf, as in
    # `solve` (`check_beta`)
    limit = math.inf if softmax else 0.98 * math.log(float(jnp.finfo(dtype).max))
    refusals = [
        (x.ndim != 2 or x.shape[-1] != 2 or x.shape[0] < 1,
         f"`x` must be (n, 2) points of the circle (vmap for a batch), got shape {x.shape}."),
        (bad_modes or (modes is not None and modes < 1),
         f"`modes` must be an integer ≥ 1 (or None: circle_modes(β)), got {modes!r}."),
        (known_beta and not (finite_reals(beta) and float(beta) >= 0),
         f"`beta` must be finite and ≥ 0, got {beta!r}."),
        (not isinstance(beta, jax.core.Tracer) and finite_reals(beta) and float(beta) > limit,
         f"`beta` = {beta!r} is past the range of the {member.name!r} kernel in "
         f"{jnp.dtype(dtype).name} (β ≤ {limit:.4g}: its force grows as e^β); use "
         "kernel='softmax'."),
        (not isinstance(coupling, jax.core.Tracer) and not finite_reals(coupling),
         f"`coupling` must be finite, got {coupling!r}."),
        (t.ndim != 1 or t.size < 1 or not np.all(np.isfinite(t)) or np.any(np.diff(t) < 0),
         f"`ts` must be a 1-D array of nondecreasing finite times, got {ts!r}."),
        (not isinstance(solver, dfx.AbstractAdaptiveSolver),
         f"`solver` must be an adaptive diffrax solver (error estimates for the step-size "
         f"controller), got {type(solver).__name__}."),
    ]
    refuse_first(refusals)
    if modes is None:
        modes = circle_modes(beta, jnp.result_type(x, float))
    return x, int(modes), softmax


def _points(x):
    """`x`, refused where a point is not finite or is zero (on the host where `x` is
    concrete: no callback in a program)."""
    ok = _on_circle(np, x) if is_concrete(x) else _traced_on_circle(jnp, x)
    return checked(x, ok, "`x` must be finite and nonzero (points of the circle).")


def _on_circle(xp, x):
    """Whether every point is finite and nonzero (`xp`: NumPy, or `jnp` in a program)."""
    return xp.all(xp.isfinite(x)) & ~xp.any(xp.sum(xp.asarray(x) ** 2, -1) == 0)


_traced_on_circle = jax.jit(_on_circle, static_argnums=0)


def _angles(x):
    return jnp.arctan2(x[:, 1], x[:, 0])


def circle_velocity(x: Float[Array, "n 2"], *, beta, coupling=1.0,
                    kernel: str | AbstractKernel = "usa",
                    modes: int | None = None) -> Float[Array, "n 2"]:
    """The particles' velocity `K P_{x_i} (1/n) Σ_j k_β(x_i, x_j) x_j` on the circle
    (the equation's `K X[μ_n](x_i)` for the empirical measure `μ_n`), summed in `modes`
    Fourier modes in `O(n · modes)` (module docstring) where the pairwise sum costs
    `O(n²)`. Equal to `SelfAttentionDynamics(I, κ I, beta=β, kernel=…).velocity` with
    `coupling = coupling_of(κ, β, kernel)` to rounding.

    **Arguments:**

    - `x`: `(n, 2)` points of the circle (normalised here).
    - `beta`: the inverse temperature `β ≥ 0`.
    - `coupling`: `K` in the papers' normalisation (`_kernels.py`).
    - `kernel`: `"usa"` (default), `"exp"` (the same field) or `"softmax"`, or its
      member.
    - `modes`: the Fourier modes kept; `None` (default): `circle_modes(β)`, which needs
      a concrete `β`.

    **Returns:**

    `(n, 2)` tangent vectors.
    """
    x, modes, softmax = _check(x, beta, coupling, modes, kernel)
    theta = _angles(_points(x))
    speed = angular_velocity(theta, beta, coupling, modes, softmax)
    return speed[:, None] * jnp.stack([-jnp.sin(theta), jnp.cos(theta)], -1)


def circle_particles(x0: Float[Array, "n 2"], ts: Real[Array, " T"], *, beta, coupling=1.0,
                     kernel: str | AbstractKernel = "usa", modes: int | None = None,
                     solver: dfx.AbstractSolver = dfx.Tsit5(), rtol: float = 1e-6,
                     atol: float = 1e-8, max_steps: int = 16384,
                     adjoint: dfx.AbstractAdjoint = dfx.RecursiveCheckpointAdjoint()
                     ) -> Float[Array, "T n 2"]:
    """The `n` particles of the equation with `σ = 0` on the circle at the times `ts`:
    the flow of `circle_velocity`, integrated in the angles by `diffrax.diffeqsolve`
    (adaptive steps, `PIDController(rtol, atol)`), each evaluation `O(n · modes)`.
    It is the flow `ja.solve_flow` integrates for `SelfAttentionDynamics(I, κ I,
    beta=β, kernel=…)` (`coupling = coupling_of(κ, β, kernel)`), in `O(n)` instead of
    `O(n²)` per step: `n = 10⁵` in seconds on a CPU. Traceable and differentiable in
    `x0`, `coupling` and (with `modes` given) `beta`; a batch is `jax.vmap`.

    **Arguments:**

    - `x0`: `(n, 2)` initial points (normalised here).
    - `ts`: increasing save times (`ts[0]` the start).
    - `beta`, `coupling`, `kernel`, `modes`: as `circle_velocity`.
    - `solver`: an adaptive diffrax ODE solver (default `diffrax.Tsit5()`).
    - `rtol`, `atol`: the step-size controller's tolerances (on the angles).
    - `max_steps`: the step budget; reaching it is an error.
    - `adjoint`: how gradients are taken (default checkpointed reverse mode).

    **Returns:**

    The points at `ts`, `(len(ts), n, 2)`.
    """
    x0, modes, softmax = _check(x0, beta, coupling, modes, kernel, ts, solver)
    max_steps = check_count(max_steps, "max_steps", 1)
    rtol = check_scalar(rtol, "rtol", nonnegative=True)
    atol = check_scalar(atol, "atol", nonnegative=True)
    refuse_first([(rtol == atol == 0, "circle_particles: `rtol` and `atol` are both 0, so no "
                   "step is accurate enough; give one > 0 (defaults 1e-6, 1e-8).")])
    dtype = jnp.result_type(x0, float)
    ts = jnp.asarray(ts, dtype=dtype)
    x0 = _points(x0)
    if ts.shape[0] == 1:
        return (x0 / jnp.linalg.norm(x0, axis=1, keepdims=True))[None]
    points, result = _flow(x0, ts, jnp.asarray(beta, dtype), jnp.asarray(coupling, dtype),
                           modes, softmax, solver, rtol, atol, max_steps, adjoint)
    if checked_on_host(result, _raise_failure):  # the program holds no callback (issue 42)
        return points
    return result.error_if(points, result != dfx.RESULTS.successful)


def _raise_failure(result) -> None:
    """Raise diffrax's message for the first failed solve of a concrete `result`."""
    failed = np.flatnonzero(np.asarray(result != dfx.RESULTS.successful))
    if failed.size:
        first = jax.tree.map(lambda v: np.ravel(v)[failed[:1]].reshape(()), result)
        why = dfx.RESULTS[first].split(". ")[0].rstrip(".")  # its first sentence
        why = why[:1].lower() + why[1:]
        raise SimulationError(f"circle_particles: {why}: raise `max_steps`, loosen `rtol`/"
                              "`atol`, or take a smaller β (a large β makes the flow stiff).")


@kept_jit
def _flow(x0, ts, beta, coupling, modes, softmax, solver, rtol, atol, max_steps, adjoint):
    """The points at `ts` and diffrax's result (checked by the caller, `ts` too:
    `CheckedTimes`)."""
    theta0 = _angles(x0)
    term = dfx.ODETerm(lambda t, th, args: angular_velocity(th, beta, coupling, modes,
                                                            softmax))
    sol = dfx.diffeqsolve(term, solver, ts[0], ts[-1], None, theta0,
                          stepsize_controller=dfx.PIDController(rtol=rtol, atol=atol),
                          saveat=dfx.SaveAt(ts=ts), max_steps=max_steps,
                          adjoint=CheckedTimes(adjoint, ts), throw=False)
    return jnp.stack([jnp.cos(sol.ys), jnp.sin(sol.ys)], -1), sol.result
