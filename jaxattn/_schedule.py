"""Weight schedules `t ↦ (h, a, b)`: the time-varying `P_η(t)`, `U_η(t)`, `Q_η(t)`, `K_η(t)`.

One schedule serves both models: the continuous flow reads it at any `t`, the
discrete layer `k` reads it at `t = kτ` (paper 001 eq. 4).
"""

import abc
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PyTree, Real

from ._validate import as_float_array, check_finite, check_flag, check_scalar, is_real


class AbstractSchedule(eqx.Module):
    """A differentiable map `t ↦ weights` with `weights` of shape `(h, a, b)`."""

    @abc.abstractmethod
    def __call__(self, t: Real[Array, ""]) -> Float[Array, "h a b"]:
        """The weights at time `t`."""

    def is_constant(self) -> bool:
        """Whether the weights are the same at every time (known statically)."""
        return False


class Constant(AbstractSchedule):
    """Time-invariant weights."""

    value: Float[Array, "h a b"]

    def __init__(self, value):
        self.value = check_finite(as_float_array(value, "weights"), "Constant value")

    def __call__(self, t):
        return self.value

    def is_constant(self) -> bool:
        return True


class PiecewiseConstant(AbstractSchedule):
    """A stack of `L` layers' weights, layer `k` in force on `[k dt, (k+1) dt)`.

    With `periodic=True` (the default) the stack repeats, as in a looped
    transformer: time `t` uses layer `floor(t / dt) mod L`. Otherwise the last
    layer stays in force after `L dt`. A time within `1e-4 dt` below a boundary
    counts as the next layer, so that `t = kτ` computed in floating point selects
    layer `k` exactly.

    **Arguments:**

    - `values`: the weights, `(L, h, a, b)`.
    - `dt`: the duration of one layer, finite and `> 0`; use the `tau` of the
      discrete model.
    - `periodic`: repeat the stack (default) or hold the last layer.
    """

    values: Float[Array, "L h a b"]
    dt: Float[Array, ""]
    periodic: bool = eqx.field(static=True, default=True)

    def __init__(self, values, dt=1.0, periodic: bool = True):
        values = as_float_array(values, "values")
        if values.ndim != 4 or values.shape[0] == 0:
            raise ValueError(
                f"PiecewiseConstant needs a stack of shape (L, h, a, b) with L ≥ 1 pieces, got "
                f"{values.shape}."
            )
        self.values = check_finite(values, "PiecewiseConstant values")
        # Checked in the weights' dtype: a dt that underflows to 0 or overflows is bad too.
        dt = check_scalar(as_float_array(dt, "dt", values.dtype), "dt", positive=True)
        self.dt = as_float_array(dt, "dt", values.dtype)
        self.periodic = check_flag(periodic, "periodic")

    def index(self, t: Real[Array, ""]) -> Array:
        """The layer in force at time `t`."""
        num = self.values.shape[0]
        # Reduced (mod L, or clipped) in the float dtype, where `floor` is an exact
        # whole number: only an index in [0, L) is cast, so no int32 overflow at large t.
        k = jnp.floor(t / self.dt + 1e-4)
        k = jnp.mod(k, num) if self.periodic else k
        return jnp.clip(k, 0, num - 1).astype(jnp.int32)

    def __call__(self, t):
        return self.values[self.index(t)]


class Schedule(AbstractSchedule):
    """Weights given by a user function `fn(t, params)` (or `fn(t)` without params).

    `params` is any PyTree of arrays; gradients flow into it. `fn` is part of the
    compiled program's identity: reuse one function object across calls to avoid
    recompilation. `fn` may also be an `eqx.Module`, whose arrays are then
    differentiable parameters.
    """

    fn: Callable
    params: PyTree[Any]

    def __init__(self, fn: Callable, params: PyTree[Any] = None):
        if not callable(fn):
            raise TypeError(
                f"Schedule needs a callable `fn(t[, params])`, got {type(fn).__name__}."
            )
        self.fn = fn
        self.params = params

    def __call__(self, t):
        out = self.fn(t) if self.params is None else self.fn(t, self.params)
        return jnp.asarray(out)


def as_schedule(value, name: str) -> AbstractSchedule:
    """An array, a callable or a schedule, as a schedule."""
    if isinstance(value, AbstractSchedule):
        return value
    if callable(value) and not hasattr(value, "shape"):
        return Schedule(value)
    return Constant(check_finite(as_float_array(value, name), name))


def schedule_shape(sched: AbstractSchedule, name: str) -> tuple[int, ...]:
    """The shape of the weights a schedule returns, found without computing them."""
    try:
        out, failure = jax.eval_shape(sched, jax.ShapeDtypeStruct((), jnp.result_type(float))), None
    except Exception as e:  # a user function that fails to trace
        out, failure = None, e
    for bad, error, message in (
        (failure is not None, ValueError,
         f"the `{name}` schedule failed when called at t = 0: {failure}"),
        (not (hasattr(out, "shape") and is_real(out.dtype)), TypeError,
         f"the `{name}` schedule must return real weights (an array), got "
         f"{f'dtype {out.dtype}' if hasattr(out, 'dtype') else repr(out)}."),
    ):
        if bad:
            raise error(message) from failure
    return tuple(out.shape)
