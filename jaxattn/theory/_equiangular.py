"""The equiangular reduction (Rigollet, "The Mean-Field Dynamics of Transformers",
arXiv 2512.01868): `n` tokens with equal pairwise inner products stay so, and the
`n`-particle flow of `SelfAttentionDynamics(P = I, U = I, β)` becomes an ODE for their
common cosine `ρ(t)` (and, for the placements that leave the sphere, their common
norm `r(t)`). The weights `a`, `b`, the quantities `s`, `m`, `g` and the table of `ρ̇`,
`ṙ` and rates per `norm`: docs/limits.md, "The equiangular reduction".

The solution is integrated in `(log(1 − ρ), log r)`, so that `1 − ρ` keeps its
relative accuracy down to the smallest floats as the tokens cluster."""

import math
from functools import partial
from typing import NamedTuple

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Real

from .._kernel import BUILTIN, AbstractKernel, as_kernel
from .._norm import BUILTIN as NORM_BUILTIN
from .._norm import AbstractNorm, as_norm
from .._programs import kept_jit
from .._strategy import stepped
from .._validate import is_concrete, refuse_first

#: The built-in kernels the reduction covers: weights `e^{β⟨x_i, x_j⟩}`, over `n` or
#: normalised (`exponent_shift == 0`). Every placement is covered: each states its
#: reduced flow (`AbstractNorm.equiangular`).
KERNELS = tuple(name for name, cls in BUILTIN.items() if cls.exponent_shift == 0)
_Norm = AbstractNorm | str
_Kernel = AbstractKernel | str

#: The pairs whose reduced ODEs share one program, traced once (issue 42): every
#: built-in placement with every covered kernel, one chosen by a traced index.
PAIRS = tuple((norm(), BUILTIN[kernel]()) for norm in NORM_BUILTIN.values() for kernel in KERNELS)

class Asymptotics(NamedTuple):
    """How fast `1 − ρ(t) → 0`: `kind` is `"exponential"` (`1 − ρ ≍ e^{−rate·t}`),
    `"algebraic"` (`1 − ρ ≍ t^{−rate}`), `"none"` (`ρ` tends to a limit below 1:
    no clustering; `rate` is NaN) or `"blow-up"` (the norms blow up in finite time;
    `rate` is NaN); `law` says it in words."""

    kind: str
    rate: float
    law: str


class EquiangularSolution(eqx.Module):
    """The reduced ODE solved at `ts`: the common cosine `rho`, its gap `1 − ρ`
    (`gap`, accurate where `rho` rounds to 1) and the common norm `radius` (1 for
    `"post"` and `"ngpt"`)."""

    ts: Float[Array, " T"]
    rho: Float[Array, " T"]
    gap: Float[Array, " T"]
    radius: Float[Array, " T"]


def _check(n: int, beta: float = 0.0, norm: _Norm = "post", kernel: _Kernel = "softmax", *,
           rho0=None, closed: bool = True, d=None, ts=None, rho=None
           ) -> tuple[AbstractNorm, AbstractKernel]:
    """The members `norm` and `kernel` name (strings or members), or a one-line refusal:
    a kernel the reduction does not cover, a token count `n` below 2, a `beta` that is
    not a finite number `≥ 0`, a `rho0` outside `[−1/(n − 1), 1]` (`[…, 1)` unless
    `closed`), cosines `rho` (when concrete) outside `[−1/(n − 1), 1]`, a dimension `d`
    below `n` and save times `ts` that are not 1-D and (when concrete) nondecreasing."""
    norm, kernel = as_norm(norm), as_kernel(kernel)
    int_n = not isinstance(n, bool) and isinstance(n, (int, np.integer))
    lowest = -1 / (n - 1) if int_n and n >= 2 else -1.0
    top = "1]" if closed else "1)"
    number = (int, float, np.number)
    cosines = np.asarray(rho, float) if rho is not None and is_concrete(rho) else np.zeros(0)
    outside = next(iter(cosines[~((cosines >= lowest) & (cosines <= 1))].flat), None)
    refusals = (
        (kernel.exponent_shift != 0, f"`kernel` must be {' or '.join(map(repr, KERNELS))} (the "
         f"reduction needs weights that depend on ⟨x_i, x_j⟩ alone), got {kernel.name!r}."),
        (not int_n or n < 2, f"`n` is the number of tokens: an integer ≥ 2, got {n!r}."),
        (not (isinstance(beta, number) and math.isfinite(beta) and beta >= 0),
         f"`beta` must be a finite number ≥ 0, got {beta!r}."),
        (rho0 is not None and not (isinstance(rho0, number) and lowest <= rho0
                                   and (rho0 <= 1 if closed else rho0 < 1)),
         f"`rho0` must lie in [−1/(n − 1), {top} = [{lowest:.4g}, {top} for n = {n} tokens"
         + ("" if closed else " (ρ = 1 is one point, which never moves)") + f", got {rho0!r}."),
        (outside is not None, f"`rho` must lie in [−1/(n − 1), 1] = [{lowest:.4g}, 1] for n "
         f"= {n} tokens (equiangular tokens have no other cosine), got {outside}."),
        (d is not None and (isinstance(d, bool) or not isinstance(d, (int, np.integer))
                            or not int_n or d < n),
         f"`d` must be an integer ≥ n = {n}: {n} equiangular tokens span {n} dimensions; "
         f"got d = {d!r}."),
        (ts is not None and (ts.ndim != 1 or ts.size < 1),
         f"`ts` must be a 1-D array of save times, got shape {getattr(ts, 'shape', None)}."),
        (ts is not None and ts.ndim == 1 and is_concrete(ts)
         and np.any(np.diff(np.asarray(ts)) < 0),
         "`ts` must be nondecreasing (the reduced ODE is integrated forwards)."),
    )
    refuse_first(refusals)
    return norm, kernel


@kept_jit  # one program where `r` is a number (op by op: five)
def _kappa(norm: AbstractNorm, r):
    """`κ`, the factor of the scores `βκ⟨u_i, u_j⟩` at tokens of norm `r`: `|y|²` of
    the tokens `y` the placement's attention reads (`norm.reads`: `r²` for the raw
    tokens, 1 for `N(x)`); 1 on `E_W`."""
    if norm.stays_on_manifold:
        return 1.0
    return norm.reads(jnp.asarray(r)[..., None], None)[..., 0] ** 2


def _parts(gap, kappa, n: int, beta, kernel: AbstractKernel):
    """`(s, m, g / (1 − ρ))` of docs/limits.md (equiangular) at `1 − ρ = gap`, scores scaled
    by `κ` (`g` divided by the gap exactly, for the log-gap equation)."""
    rho = 1 - gap
    if kernel.normalised:  # softmax
        b = 1 / (jnp.exp(beta * kappa * gap) + (n - 1))
        a = 1 - (n - 1) * b
    else:
        a = jnp.exp(beta * kappa) / n
        b = jnp.exp(beta * kappa * rho) / n
    s = a + (n - 1) * b * rho
    m = jnp.sqrt(a**2 + 2 * (n - 1) * a * b * rho + (n - 1) * b**2 * (1 + (n - 2) * rho))
    per_gap = b * (n - (n - 1) * gap)  # 1 + (n − 1)ρ = n − (n − 1)(1 − ρ)
    return s, m, per_gap


def _log_field(t, y, args):
    """`d/dt (log(1 − ρ), log r)`: the reduced ODE in the variables it is solved in, of
    the pair `pairs[index]` (a switch on the traced `index`)."""
    index, n, beta, pairs = args
    return jax.lax.switch(index, [partial(_pair_field, norm, kernel) for norm, kernel in pairs],
                          y, n, beta)


def _pair_field(norm: AbstractNorm, kernel: AbstractKernel, y, n: int, beta):
    gap, r = jnp.exp(y[0]), jnp.exp(y[1])
    s, m, per_gap = _parts(gap, _kappa(norm, r), n, beta, kernel)
    # 1 + (n − 1)ρ = |Σ u_i|²/n ≥ 0 vanishes at the simplex, a fixed point the solution
    # must not cross by rounding: below it no tokens exist (`"ngpt"` ran off to ρ = −6)
    per_gap = jnp.maximum(per_gap, 0)
    # ρ̇ = 2g · speed, so d log(1 − ρ)/dt = −2 (g / (1 − ρ)) · speed
    speed, dr = norm.equiangular(s, m, r)
    return jnp.stack([-2 * per_gap * speed, jnp.asarray(dr / r, y.dtype)]).astype(y.dtype)


def equiangular_field(rho: Real[Array, "..."], n: int, beta: float, *, norm: _Norm = "post",
                      kernel: _Kernel = "softmax", radius: Real[Array, "..."] = 1.0
                      ) -> tuple[Float[Array, "..."], Float[Array, "..."]]:
    """The reduced ODE: `(dρ/dt, dr/dt)` for `n` equiangular tokens of cosine `ρ` and
    norm `r` under `SelfAttentionDynamics(P = I, U = I, beta, norm=, kernel=)`.

    **Arguments:**

    - `rho`: the common cosine `ρ ∈ [−1/(n − 1), 1]` (an array: elementwise).
    - `n`: the number of tokens, ≥ 2.
    - `beta`: the inverse temperature `β ≥ 0`.
    - `norm`: the placement, `ja.PostNorm()` (default), `ja.PreNorm()`,
      `ja.PeriNorm()`, `ja.NGPT()`, `ja.NoNorm()`, or its name (`"post"`, …).
    - `kernel`: `ja.Softmax()` (default) or `ja.Exp()` (weights `exp(β⟨x_i, x_j⟩)/n`),
      or its name.
    - `radius`: the common norm `r` (default 1; it moves only for `"pre"`, `"peri"`
      and `"none"`).

    **Returns:**

    `(dρ/dt, dr/dt)`, arrays of the broadcast shape.
    """
    norm, kernel = _check(n, beta, norm, kernel, rho=rho)
    rho, r = jnp.asarray(rho, float), jnp.asarray(radius, float)
    s, m, per_gap = _parts(1 - rho, _kappa(norm, r), n, beta, kernel)
    speed, dr = norm.equiangular(s, m, r)
    drho, dr = jnp.broadcast_arrays(2 * (1 - rho) * per_gap * speed, jnp.asarray(dr, s.dtype))
    return drho, dr


def equiangular_rate(rho: Real[Array, "..."], n: int, beta: float, *, norm: _Norm = "post",
                     kernel: _Kernel = "softmax", radius: Real[Array, "..."] = 1.0
                     ) -> Float[Array, "..."]:
    """`dρ/dt` of the reduced ODE (`equiangular_field`'s first part): for `"post"`
    and softmax, `2 (1 − ρ)(1 + (n − 1) ρ) / (e^{β(1 − ρ)} + n − 1)`.

    **Arguments:** as `equiangular_field`.

    **Returns:**

    `dρ/dt`, an array of the broadcast shape of `rho` and `radius`.
    """
    return equiangular_field(rho, n, beta, norm=norm, kernel=kernel, radius=radius)[0]


def equiangular_solution(rho0: float, n: int, beta: float, ts: Real[Array, " T"], *,
                         norm: _Norm = "post", kernel: _Kernel = "softmax",
                         rtol: float | None = None, atol: float | None = None,
                         max_steps: int = 65536) -> EquiangularSolution:
    """Integrate the reduced ODE (`equiangular_field`) from `ρ(ts[0]) = rho0`,
    `r(ts[0]) = 1`, with diffrax (`Dopri8`, adaptive steps), in the default float
    dtype: turn on `jax_enable_x64` to agree with the `n`-particle flow to `1e-10`.

    **Arguments:**

    - `rho0`: the initial cosine, in `[−1/(n − 1), 1)`.
    - `n`, `beta`, `norm`, `kernel`: as `equiangular_field`.
    - `ts`: nondecreasing save times.
    - `rtol`, `atol`: tolerances on `(log(1 − ρ), log r)`; `None` (default): `1e-14`,
      or ten times the dtype's rounding where that is larger (`1.2e-6` in float32,
      where `1e-14` stalls the steps until `max_steps`).
    - `max_steps`: the step budget (reaching it is an error).

    **Returns:**

    An `EquiangularSolution` at `ts`.
    """
    ts = jnp.asarray(ts, float)
    floor = max(1e-14, 10 * float(jnp.finfo(ts.dtype).eps))
    rtol, atol = (floor if tol is None else tol for tol in (rtol, atol))
    norm, kernel = _check(n, beta, norm, kernel, rho0=rho0, closed=False, ts=ts)
    concrete = is_concrete(ts)
    y0 = jnp.asarray([math.log1p(-rho0), 0.0], ts.dtype)
    pairs = PAIRS if (norm, kernel) in PAIRS else ((norm, kernel),)
    index = jnp.asarray(pairs.index((norm, kernel)))
    solution, result = _solve(y0, ts, index, float(beta), n, pairs, rtol, atol, max_steps)
    if concrete:  # checked on the host: the program holds no callback (issue 42)
        if message := dfx.RESULTS[result]:  # "" for success, read with NumPy
            raise eqx.EquinoxRuntimeError(message)
    else:  # inside a user's jit: diffrax's checks, in the program
        solution = eqx.error_if(solution, ts[1:] < ts[:-1],
                                "saveat.ts must be increasing or decreasing.")
        solution = result.error_if(solution, result != dfx.RESULTS.successful)
    return solution


@kept_jit
def _solve(y0, ts, index, beta, n, pairs, rtol, atol, max_steps):
    """`diffeqsolve(ODETerm(_log_field), Dopri8(), …, SaveAt(ts=ts))`'s loop without its
    in-program checks (`stepping.stepped`), for the pair `pairs[index]` (traced: one
    program for every built-in pair; `β` static, as folding `e^β` keeps today's last bits):
    `(solution, result)`."""
    ys, result, _ = stepped(dfx.ODETerm(_log_field), dfx.Dopri8(),
                            dfx.PIDController(rtol=rtol, atol=atol), ts, None, max_steps, y0,
                            (index, n, beta, pairs))
    gap = jnp.exp(ys[:, 0])
    return EquiangularSolution(ts, 1 - gap, gap, jnp.exp(ys[:, 1])), result


def equiangular_asymptotics(n: int, beta: float, *, norm: _Norm = "post",
                            kernel: _Kernel = "softmax") -> Asymptotics:
    """How fast the reduced ODE clusters (`1 − ρ → 0`) from any start `ρ0 > −1/(n−1)`:
    read from the placement's own `equiangular(s, m, r)` at `s = m = nb`, `r = 1` (the
    derivation per `norm`: docs/limits.md, "The rates"). On `E_W` the rate
    `2nb · ρ̇/2g`; off it, with scores that read `N(x)`, the exponent
    `2nb · (ρ̇/2g) / ṙ` in `r ≍ t`; with raw scores, no clustering (softmax) or a blow-up.

    **Arguments:** `n`, `beta`, `norm`, `kernel` as `equiangular_field`.

    **Returns:**

    An `Asymptotics(kind, rate, law)`.
    """
    norm, kernel = _check(n, beta, norm, kernel)
    nb = 1.0 if kernel.normalised else math.exp(beta)  # n·b at ρ = 1 (κ = 1)
    speed, dr = norm.equiangular(nb, nb, 1.0)  # s, m → nb
    if norm.stays_on_manifold:  # d log(1 − ρ)/dt → −2 nb · speed
        rate = 2 * nb * speed
        return Asymptotics("exponential", rate, f"1 − ρ ≍ e^(−{rate:.4g} t)")
    if float(_kappa(norm, 2.0)) == 1.0:  # the scores read N(x): r grows as t
        rate = 2 * nb * speed / dr  # d log(1 − ρ)/d log r, speed and ṙ/r both ∝ 1/r
        return Asymptotics("algebraic", rate, f"1 − ρ ≍ t^(−{rate:.4g})")
    if not kernel.normalised:
        return Asymptotics("blow-up", math.nan, "r blows up in finite time")
    return Asymptotics("none", math.nan, "ρ → ρ∞ < 1 (no clustering)")


def equiangular_tokens(rho0: float, n: int, d: int, dtype=None) -> Float[Array, "n d"]:
    """`n` unit tokens in `R^d` with `⟨x_i, x_j⟩ = rho0` for every `i ≠ j`:
    `x_i = c e + s f_i`, with `e = 𝟙/√n`, `f_i` the regular simplex `√(n/(n−1))(e_i − 𝟙/n)`
    (unit, `⟨f_i, f_j⟩ = −1/(n − 1)`, orthogonal to `e`), `c² = (1 + (n − 1)ρ0)/n`
    and `s² = 1 − c²`; zero past the first `n` coordinates.

    **Arguments:**

    - `rho0`: the common inner product, in `[−1/(n − 1), 1]`.
    - `n`: the number of tokens, ≥ 2; `d`: the dimension, ≥ `n` (a Gram matrix
      `(1 − ρ0) I + ρ0 𝟙𝟙ᵀ` of rank `n` needs `n` dimensions).
    - `dtype`: the tokens' dtype (default: JAX's default float).

    **Returns:**

    The tokens, `(n, d)`.
    """
    _check(n, rho0=rho0, d=d)
    c2 = (1 + (n - 1) * rho0) / n
    e = np.full(n, 1 / math.sqrt(n))
    f = math.sqrt(n / (n - 1)) * (np.eye(n) - 1 / n)
    x = math.sqrt(max(c2, 0.0)) * e + math.sqrt(max(1 - c2, 0.0)) * f
    x = np.pad(x, ((0, 0), (0, d - n)))
    return jnp.asarray(x, jnp.result_type(float) if dtype is None else dtype)

