"""Bipartite-consensus equilibria of the layer map (paper 004, eq. 3/8 and
Theorem 3): a search for weights that make one locally stable. The point and the
Jacobian of the layer map on the tangent space are `ja.spectral`'s
(`bipartite_point`, `tangent_jacobian`, `spectral_radius`).

A bipartite point puts `m` tokens at `v` and `n − m` at `−v`. For the layer map
`x_i ↦ N(x_i + τ Σ_η Σ_j α^η_ij U_η x_j)` (`W = I`) it is an equilibrium when `v`
is an eigenvector of `Ω = Σ_η U_η` and every head scores `vᵀ P_η v` alike (then
all heads attend alike and the update of each token is `c_i Ω v ∥ v`). Both are
linear conditions, kept exactly here by orthogonal projection.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, Float

from .._dynamics import SelfAttentionDynamics
from .._precision import einsum, matmul
from .._programs import kept_jit
from .._validate import check_count, check_scalar, is_concrete, refuse_first, surface_errors
from ..spectral import bipartite_point, tangent_jacobian


def log_radius_bound(J: Float[Array, "k k"], squarings: int = 6) -> Float[Array, ""]:
    """`log ‖J^{2^s}‖_F / 2^s`: a smooth upper bound on `log ρ(J)` tending to it as
    `s` grows (Gelfand). Repeated squaring with renormalisation, no overflow."""
    logscale = jnp.zeros((), J.dtype)
    A = J
    for s in range(squarings):
        norm = jnp.linalg.norm(A)
        A = A / norm
        logscale = logscale + jnp.log(norm) / 2**s
        A = matmul(A, A)
    return logscale + jnp.log(jnp.linalg.norm(A)) / 2**squarings


def _off_v(M: Float[Array, "d d"], v: Float[Array, " d"]) -> Float[Array, " d"]:
    """`M v − (vᵀ M v) v`: the part of `M v` off the unit vector `v`."""
    Mv = matmul(M, v)
    return Mv - matmul(v, Mv) * v


class BipartiteWeights(eqx.Module):
    """Time-invariant weights `P, U` `(h, d, d)` of the layer map searched over."""

    P: Float[Array, "h d d"]
    U: Float[Array, "h d d"]

    def dynamics(self, beta: float = 1.0) -> SelfAttentionDynamics:
        return SelfAttentionDynamics(self.P, self.U, beta=beta)


def project_bipartite(w: BipartiteWeights, v, p_bound: float, u_bound: float, *,
                      norm=jnp.linalg.norm):
    """Keep `U_η` symmetric, `v` an eigenvector of `Σ_η U_η`, `vᵀP_η v` equal over
    heads, and the Frobenius norms (`norm`) of the stacks `P`, `U` bounded (a common
    rescaling, which keeps the linear conditions)."""
    h = w.U.shape[0]
    U = (w.U + jnp.swapaxes(w.U, -1, -2)) / 2
    Om = jnp.sum(U, axis=0)
    r = _off_v(Om, v)  # the part of Ω v off v
    U = U - (jnp.outer(r, v) + jnp.outer(v, r))[None] / h
    pv = einsum("d,hde,e->h", v, w.P, v)
    P = w.P - (pv - jnp.mean(pv))[:, None, None] * jnp.outer(v, v)[None]
    P = P * jnp.minimum(1.0, p_bound / norm(P))
    U = U * jnp.minimum(1.0, u_bound / norm(U))
    return BipartiteWeights(P, U)


def bipartite_violation(w: BipartiteWeights, v, p_bound, u_bound) -> Float[Array, ""]:
    """The largest defect of the conditions kept by `project_bipartite`."""
    Om = jnp.sum(w.U, axis=0)
    pv = einsum("d,hde,e->h", v, w.P, v)
    return jnp.max(jnp.stack([
        jnp.max(jnp.abs(w.U - jnp.swapaxes(w.U, -1, -2))),
        jnp.linalg.norm(_off_v(Om, v)),
        jnp.max(pv) - jnp.min(pv),
        jnp.maximum(jnp.linalg.norm(w.P) - p_bound, 0.0),
        jnp.maximum(jnp.linalg.norm(w.U) - u_bound, 0.0),
    ]))


def bipartite_log_radius(w: BipartiteWeights, v, n: int, m: int, tau=1.0, beta=1.0
                         ) -> Float[Array, ""]:
    """The objective of `stabilize_bipartite`: `log_radius_bound` of the tangent
    Jacobian of the map with weights `w` at the bipartite point `(m × v, (n − m) × −v)`.

    **Returns:**

    A scalar, differentiable in `w`.
    """
    x = bipartite_point(v, n, m)
    return log_radius_bound(tangent_jacobian(w.dynamics(beta), x, tau))


@surface_errors
def stabilize_bipartite(
    w0: BipartiteWeights,
    v: Float[Array, " d"],
    *,
    n: int,
    m: int,
    tau: float = 1.0,
    beta: float = 1.0,
    p_bound: float = 10.0,
    u_bound: float = 3.0,
    steps: int = 300,
    optimizer: optax.GradientTransformation | None = None,
):
    """Minimise the (smoothed) spectral radius of the tangent Jacobian at the
    bipartite point `(m × v, (n − m) × −v)` over weights, from a batch of starts.

    **Arguments:**

    - `w0`: finite starting weights with a leading restart axis, `P, U (R, h, d, d)`.
    - `v`: the unit direction of the equilibrium; `n`, `m`: tokens and split.
    - `tau`, `beta`: the layer step and inverse temperature.
    - `p_bound`, `u_bound`: Frobenius bounds of the stacks `P` and `U`.
    - `steps`, `optimizer` (default `optax.adam(0.02)`).

    **Returns:**

    `(weights, trace, violation)`: the final weights `(R, ...)`, the smooth log
    radius at every iterate `(steps + 1, R)` and the constraint defect there.
    """
    steps = check_count(steps, "steps")
    n = check_count(n, "n", 2)
    m = check_count(m, "m", 1)
    tau, beta, p_bound, u_bound = (check_scalar(a, name, positive=True) for a, name in (
        (tau, "tau"), (beta, "beta"), (p_bound, "p_bound"), (u_bound, "u_bound")))
    refuse_first([(not isinstance(w0, BipartiteWeights), TypeError, "stabilize_bipartite: "
                   f"`w0` must be ja.explore.BipartiteWeights, got {type(w0).__name__}.")])
    shapes = {np.shape(w0.P), np.shape(w0.U)}
    d = np.shape(w0.U)[-1] if np.ndim(w0.U) else None
    refuse_first((
        (len(shapes) != 1 or len(shapes.pop()) != 4, "stabilize_bipartite: `w0.P` and "
         f"`w0.U` must both be (restarts, h, d, d), got {np.shape(w0.P)} and "
         f"{np.shape(w0.U)}."),
        (np.shape(v) != (d,), f"stabilize_bipartite: `v` must be a direction ({d},), got "
         f"shape {np.shape(v)}."),
        (not np.isclose(np.linalg.norm(np.asarray(v, float)), 1.0, atol=1e-5),
         "stabilize_bipartite: `v` must be a unit vector (pass v / jnp.linalg.norm(v))."),
        (not m < n, f"stabilize_bipartite: `m` must be in 1..n−1 = 1..{n - 1}, got {m}."),
        (is_concrete(w0.P) and is_concrete(w0.U) and not (
            np.all(np.isfinite(np.asarray(w0.P))) and np.all(np.isfinite(np.asarray(w0.U)))),
         "stabilize_bipartite: `w0` contains NaN or inf; pass finite starting weights."),
    ))
    # the bounds and the step traced (weakly typed, as the Python floats were)
    w, trace, viol = _stabilize(w0, v, *map(jnp.asarray, (tau, p_bound, u_bound)), n=n, m=m,
                                beta=beta, steps=steps, optimizer=optimizer)
    return w, np.asarray(trace), np.asarray(viol)


def _whole_norm(a):
    return jax.lax.optimization_barrier(jnp.linalg.norm(a))


@kept_jit
def _stabilize(w0, v, tau, p_bound, u_bound, *, n, m, beta, steps, optimizer):
    """`stabilize_bipartite`'s search, one program: the projected start, the optimiser
    steps and the radius and defect of the last iterate appended. The default
    optimiser is made here, so that the program is kept (`kept_jit`: an optimiser's
    functions print with addresses)."""
    optimizer = optimizer or optax.adam(0.02)
    proj = jax.vmap(lambda w: project_bipartite(w, v, p_bound, u_bound))
    violation = jax.vmap(lambda w: bipartite_violation(w, v, p_bound, u_bound))

    def radius(w):
        return bipartite_log_radius(w, v, n, m, tau, beta)

    def step(carry, _):
        w, opt = carry
        val, g = jax.vmap(jax.value_and_grad(radius))(w)
        upd, opt = jax.vmap(optimizer.update)(g, opt, w)
        return (proj(optax.apply_updates(w, upd)), opt), (val, violation(w))

    # The start's bounds read `‖P‖` whole, as the start projected op by op did (in one
    # program XLA turns `p_bound / ‖P‖` into an rsqrt: other last bits, and the search's
    # optimum moves with them).
    w = jax.vmap(lambda w: project_bipartite(w, v, p_bound, u_bound, norm=_whole_norm))(w0)
    (w, _), (trace, viol) = jax.lax.scan(step, (w, jax.vmap(optimizer.init)(w)), None,
                                         length=steps)
    return (w, jnp.concatenate([trace, jax.vmap(radius)(w)[None]]),
            jnp.concatenate([viol, violation(w)[None]]))
