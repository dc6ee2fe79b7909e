"""`check_kernel`: a kernel evaluated once on a tiny input where a model is built, so
that a member whose output has the wrong shape (which would broadcast silently) or is
NaN at ordinary logits is refused by name before any run."""

import jax
import jax.numpy as jnp
import numpy as np

from .._validate import is_concrete
from .base import AbstractKernel
from .pointwise import AbstractPointwiseKernel

#: The logits of the check: two rows of four keys, one masked (`−∞`) in each.
_LOGITS = ((-np.inf, -1.5, 0.0, 1.5), (-np.inf, -0.5, 0.5, 2.0))
_SHAPE = np.shape(_LOGITS)

#: Kernels without parameters that passed (their checks depend on nothing else).
_PASSED: set = set()


def _refuse(kernel, message: str):
    raise ValueError(f"kernel {type(kernel).__name__}: {message}")


def _same_shape(kernel, what: str, out, shape) -> None:
    got = jnp.shape(out)
    if got != tuple(shape):
        _refuse(kernel, f"{what} must return shape {tuple(shape)} on logits {_SHAPE}, got "
                        f"{got}: fix its shape (a wrong one would broadcast silently in a run).")


def _finite(kernel, method: str, out, s) -> None:
    """`out` finite where the logits are, and 0 where they are masked (`−∞`)."""
    if not is_concrete(out):  # a traced parameter (a vmap over models): shapes only
        return
    out, s = np.asarray(out), np.asarray(s)
    if not np.all(np.isfinite(out[np.isfinite(s)])):
        _refuse(kernel, f"`{method}` gives NaN or inf at finite logits (of {_LOGITS}); a "
                        "kernel's weights must be finite wherever its logits are.")
    if np.any(out[~np.isfinite(s)] != 0):
        _refuse(kernel, f"`{method}` must give weight 0 at masked logits (−∞), got "
                        f"{out[~np.isfinite(s)].tolist()}.")


def check_kernel(kernel: AbstractKernel) -> None:
    """Refuse, with one line naming the member and the method, a kernel whose
    `offset`, `pointwise`, `weights`, `rescale` or key-block pieces give the wrong
    shape on a tiny input, or whose weights are NaN or inf at finite logits."""
    plain = not jax.tree.leaves(kernel)  # no parameters: `kernel` is hashable
    if plain and kernel in _PASSED:
        return
    _check(kernel)
    if plain:
        _PASSED.add(kernel)


def _check(kernel: AbstractKernel) -> None:
    dtype = jnp.result_type(float)
    s = jnp.asarray(_LOGITS, dtype)
    rows, m = s.shape
    offset = kernel.offset(jnp.ones((), dtype), m, dtype)
    if offset is not None and jnp.shape(offset) != ():
        _refuse(kernel, f"`offset` must return None or a scalar, got shape {jnp.shape(offset)}.")
    if isinstance(kernel, AbstractPointwiseKernel):
        w = kernel.pointwise(s)
        _same_shape(kernel, "`pointwise`", w, s.shape)
        _finite(kernel, "pointwise", w, s)
        _same_shape(kernel, "`derivative`", kernel.derivative(s, w), s.shape)
    w = kernel.weights(s, m)
    _same_shape(kernel, "`weights`", w, s.shape)
    _finite(kernel, "weights", w, s)
    values = jnp.ones((m, 3), dtype)
    _same_shape(kernel, "`rescale`", kernel.rescale(jnp.ones((rows, 3), dtype), m), (rows, 3))
    state = (jnp.full((rows,), -jnp.inf, dtype), jnp.zeros((rows,), dtype),
             jnp.zeros((rows, 3), dtype))
    ok = jnp.isfinite(s)
    top, norm, acc = kernel.block_update(state, s, ok, lambda p: p @ values)
    for part, got, shape in (("top", top, (rows,)), ("norm", norm, (rows,)),
                             ("acc", acc, (rows, 3))):
        _same_shape(kernel, f"`block_update`'s `{part}`", got, shape)
    out, (a, b) = kernel.block_finish((top, norm, acc))
    _same_shape(kernel, "`block_finish`", out, (rows, 3))
    zero = jnp.zeros((rows,), dtype)
    w, ds = kernel.block_grad(s, ok, a, b, zero, jnp.ones_like(s))
    _same_shape(kernel, "`block_grad`", w, s.shape)
    _same_shape(kernel, "`block_grad`", ds, s.shape)
