"""The entry checks of `ja.meanfield`, written once: a grid, a density on it, `β` within
the range its kernel and its grid can represent, and a solve's size (its steps and its
memory) before any work. The ranges: docs/meanfield_equation.md, "Ranges"."""

import math

import jax
import jax.numpy as jnp
import numpy as np
from scipy.special import ive

from .._kernel import AbstractKernel
from .._validate import is_real, refuse_first, too_big
from ._grid import AbstractGrid

#: The largest first dropped Funk–Hecke multiplier of the kernel `e^{βt}`, relative to
#: its mean's (`I_{M+1+ν}(β)/I_ν(β)`, `ν = d/2 − 1`), with which a grid of band `M` is
#: said to represent it: the kernel's angular width `β^{−1/2}` is resolved.
KERNEL_TAIL = 1e-2
#: The most steps one `solve` takes (at `dt0 = 0.01`, `t = 10⁴`).
MAX_STEPS = 10**6


def check_grid(grid) -> AbstractGrid:
    """`grid`, or a `TypeError` naming the grids."""
    if not isinstance(grid, AbstractGrid):
        raise TypeError(f"`grid` must be ja.meanfield.Circle(modes) or Sphere(degree), got "
                        f"{type(grid).__name__}.")
    return grid


def check_density(grid, mu, name: str = "mu", *, strict: bool = False, signed: bool = False):
    """`mu` as an array, checked to be a density on `grid`: its shape, and when its values
    are known now, finite, `≥ 0` (`> 0` with `strict`: a logarithm is taken) with a
    positive mass (`signed`: any finite values, a difference of densities). A traced `mu`
    (under `vmap`, `grad`) is trusted."""
    shape = check_grid(grid).weights.shape
    try:
        arr = None if isinstance(mu, str | bytes) else jnp.asarray(mu)
    except (TypeError, ValueError):
        arr = None
    real = arr is not None and (jnp.issubdtype(arr.dtype, jnp.floating)
                                or jnp.issubdtype(arr.dtype, jnp.integer))
    known = real and arr.shape == shape and not isinstance(arr, jax.core.Tracer)
    values = np.asarray(arr, dtype=np.float64) if known else np.ones(1)
    with jax.ensure_compile_time_eval():  # a grid built inside a jit: its weights now
        mass = float(np.sum(np.asarray(grid.weights) * values)) if known else 1.0
    low, finite, density = values.min(), bool(np.all(np.isfinite(values))), not signed
    fix = (": pass a probability density on the grid (e.g. ja.meanfield.uniform(grid) or "
           "density(grid, x, smoothing=…)).")
    refuse_first((bad, error, f"`{name}` {message}") for bad, error, message in (
        (not real, TypeError, f"must be a real array of densities on the grid, got "
         f"{type(mu).__name__ if arr is None else arr.dtype}."),
        (real and arr.shape != shape, ValueError, f"must be a density on the grid, shape "
         f"{shape}, got {arr.shape if real else ()} (ja.meanfield.uniform(grid) has the shape)."),
        (not finite, ValueError, "has NaN or inf values" + fix),
        (density and strict and low <= 0, ValueError, f"must be > 0 everywhere, its minimum is "
         f"{low:g}" + fix),
        (density and low < 0, ValueError, f"must be ≥ 0, its minimum is {low:g}" + fix),
        (density and not mass > 0, ValueError, f"must have a positive mass, got {mass:g}" + fix),
    ))
    return arr


def finite_reals(value) -> bool:
    """Whether `value` (a number, or an array of them) is real and finite everywhere: a
    string (`"1"` would parse), a bool or `None` is not."""
    if value is None or isinstance(value, (str, bytes, bool, np.bool_)):
        return False
    try:
        array = np.asarray(value)
    except (TypeError, ValueError):  # a ragged list
        return False
    return is_real(array.dtype) and array.dtype != bool and bool(np.all(np.isfinite(array)))


def check_beta(grid: AbstractGrid, beta, kernel: AbstractKernel, dtype) -> None:
    """Refuse a concrete `β` past the range of `kernel` in `dtype` (`"usa"`/`"exp"`'s force
    grows as `e^β/β`: `β` up to `log` of the dtype's largest number, less 2 %; softmax's
    normalised force has no limit), or one whose kernel the grid cannot represent (its
    first dropped multiplier above `KERNEL_TAIL` of the mean's), naming the grid that
    would. A traced `β` is trusted."""
    if isinstance(beta, jax.core.Tracer):
        return
    beta = float(beta)
    limit = math.inf if kernel.normalised else 0.98 * math.log(float(jnp.finfo(dtype).max))
    if beta > limit:
        raise ValueError(f"`beta` = {beta:g} is past the range of the {type(kernel).__name__} "
                         f"kernel in {jnp.dtype(dtype).name} (β ≤ {limit:.4g}: its force "
                         "grows as e^β/β); use kernel='softmax'"
                         f"{'' if limit > 100 else ', or float64 (jax_enable_x64)'}.")
    with jax.ensure_compile_time_eval():  # static, even for a grid built inside a jit
        top = int(np.max(np.asarray(grid.degrees())))
    nu = grid.dim / 2 - 1
    tail = float(ive(top + 1 + nu, beta) / ive(nu, beta))
    if tail > KERNEL_TAIL:
        need = kernel_band(beta, nu)
        raise ValueError(f"{type(grid).__name__} of band {top} cannot represent the kernel "
                         f"at β = {beta:g} (its first dropped multiplier is {tail:.2g} of the "
                         f"mean's, above {KERNEL_TAIL:g}); use a band of at least {need}.")


def kernel_band(beta: float, nu: float) -> int:
    """The smallest band `M` with `I_{M+1+ν}(β)/I_ν(β) ≤ KERNEL_TAIL` (`ν = d/2 − 1`):
    the least a grid needs to represent the kernel at `β`."""
    m = np.arange(2, 2**20)
    ok = np.flatnonzero(ive(m + 1 + nu, beta) <= KERNEL_TAIL * ive(nu, beta))
    return int(m[ok[0]]) if ok.size else 2**20


def check_size(grid: AbstractGrid, saves: int, steps: int, dtype) -> None:
    """Refuse a solve of more than `MAX_STEPS` steps, or whose arrays (the saved densities
    and coefficients, the steps' work) do not fit in this machine's memory."""
    if steps > MAX_STEPS:
        raise ValueError(f"this solve takes {steps:.3g} steps, more than {MAX_STEPS:.0e}: "
                         "raise `dt0` or shorten `ts`.")
    points = int(np.prod(grid.weights.shape))
    need = jnp.dtype(dtype).itemsize * points * (3 * saves + 40) + 8 * steps
    refuse_first([too_big(need, f"this solve ({saves} saves of {points} grid points) needs "
                               "about", "save fewer times or use a smaller grid")])
