"""`ETDRK4`: the exponential time-differencing Runge–Kutta method of Cox & Matthews
(2002), as a diffrax solver, for a semilinear system `y' = L y + N(t, y)` whose linear
part `L` is diagonal: the solver holds `L`, the term (`diffrax.ODETerm`) is `N`. Why (a
stiff, diagonal diffusion): docs/meanfield_equation.md, "The integrator".

Stages: `a = e^{hL/2} y + (h/2) φ₁(hL/2) N(y)`, `b = e^{hL/2} y + (h/2) φ₁ N(a)`,
`c = e^{hL/2} a + (h/2) φ₁ (2N(b) − N(y))`, and
`y₁ = e^{hL} y + h [(φ₁ − 3φ₂ + 4φ₃) N(y) + 2(φ₂ − 2φ₃)(N(a) + N(b)) + (4φ₃ − φ₂) N(c)]`
(`φ` at `hL`). Order 4 for non-stiff `N`; `L = 0` gives the classical RK4."""

from typing import ClassVar

import diffrax as dfx
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Float

#: Below this `|z|` the φ-functions are summed from their Taylor series (the recursion
#: `φ_{k+1} = (φ_k − 1/k!)/z` cancels there).
_SERIES = 1.0


def phis(z: Float[Array, "..."]) -> tuple[Array, Array, Array]:
    """`φ₁, φ₂, φ₃` of a real `z ≤ 0`, to rounding (`φ_k(z) = Σ_j z^j/(j + k)!`)."""
    small = jnp.abs(z) < _SERIES
    zs = jnp.where(small, z, 0.0)
    zr = jnp.where(small, -1.0, z)

    flat = zs.reshape(1, -1)
    k = jnp.arange(1.0, 4.0)[:, None]

    def add(j, carry):  # the j-th terms of the three series (a loop: a small program)
        terms, totals = carry
        return terms * flat / (j + k + 1), totals + terms

    first = jnp.broadcast_to(jnp.array([1.0, 0.5, 1 / 6])[:, None], (3, flat.shape[1]))
    start = (first.astype(flat.dtype), jnp.zeros_like(first, flat.dtype))
    _, series = lax.fori_loop(0, 20, add, start)
    series = series.reshape((3,) + zs.shape)
    p1 = jnp.expm1(zr) / zr
    p2 = (p1 - 1) / zr
    p3 = (p2 - 0.5) / zr
    return tuple(jnp.where(small, s, r) for s, r in zip(series, (p1, p2, p3)))


class ETDRK4(dfx.AbstractSolver):
    """Cox–Matthews ETDRK4 for `y' = L y + N(t, y)` (module docstring): `L` here, `N`
    the `diffrax.ODETerm`. Fixed steps (no error estimate): use it with
    `diffrax.StepTo` or `ConstantStepSize`.

    **Arguments:**

    - `linear`: the diagonal of `L` (an array of `y`'s shape, real, `≤ 0`).
    """

    linear: Float[Array, "..."]
    term_structure: ClassVar = dfx.AbstractTerm
    interpolation_cls: ClassVar = dfx.LocalLinearInterpolation

    def order(self, terms):
        return 4

    def init(self, terms, t0, t1, y0, args):
        return None

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        del solver_state, made_jump
        h = terms.contr(t0, t1)
        z = h * self.linear
        e, e2 = jnp.exp(z), jnp.exp(z / 2)
        q1, _, _ = phis(z / 2)
        p1, p2, p3 = phis(z)
        times = jnp.stack([t0, t0 + h / 2, t0 + h / 2, t1])
        hq = (h / 2) * q1
        # the four stages as one loop, so that the program holds one copy of N
        branches = [lambda ns, a: y0, lambda ns, a: e2 * y0 + hq * ns[0],
                    lambda ns, a: e2 * y0 + hq * ns[1],
                    lambda ns, a: e2 * a + hq * (2 * ns[2] - ns[0])]

        def stage(carry, s):
            ns, a = carry
            y = lax.switch(s, branches, ns, a)
            ns = ns.at[s].set(terms.vf(times[s], y, args))
            return (ns, jnp.where(s == 1, y, a)), None

        start = (jnp.zeros((4,) + jnp.shape(y0), jnp.result_type(y0)), y0)
        (ns, _), _ = lax.scan(stage, start, jnp.arange(4))
        ny, na, nb, nc = ns
        y1 = e * y0 + h * ((p1 - 3 * p2 + 4 * p3) * ny + 2 * (p2 - 2 * p3) * (na + nb)
                           + (4 * p3 - p2) * nc)
        return y1, None, dict(y0=y0, y1=y1), None, dfx.RESULTS.successful

    def func(self, terms, t0, y0, args):
        return self.linear * y0 + terms.vf(t0, y0, args)
