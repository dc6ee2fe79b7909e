"""`check_kernel`: a kernel evaluated once on a tiny input where a model is built, so
that a member whose output has the wrong shape (which would broadcast silently) or is
NaN at ordinary logits is refused by name before any run."""

import jax
import jax.numpy as jnp
import numpy as np

from .._programs import kept_jit
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


def _same_shape(kernel, what: str, piece, shape) -> None:
    """`piece()` (traced for its shape alone: no program is compiled) of `shape`."""
    got = jax.eval_shape(piece).shape
    if got != tuple(shape):
        _refuse(kernel, f"{what} must return shape {tuple(shape)} on logits {_SHAPE}, got "
                        f"{got}: fix its shape (a wrong one would broadcast silently in a run).")


@kept_jit
def _values(kernel: AbstractKernel, s):
    """The weights (and pointwise weights) on the logits `s`: one program per member."""
    pointwise = kernel.pointwise(s) if isinstance(kernel, AbstractPointwiseKernel) else None
    return pointwise, kernel.weights(s, s.shape[-1])


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
    """Every piece's shape by tracing alone, then the weights' values from one program
    (the checks run on the host: no piece is run eagerly, op by op)."""
    dtype = jnp.result_type(float)
    s = np.asarray(_LOGITS, dtype)
    rows, m = s.shape
    offset = jax.eval_shape(lambda: kernel.offset(np.ones((), dtype), m, dtype))
    if offset is not None and offset.shape != ():
        _refuse(kernel, f"`offset` must return None or a scalar, got shape {offset.shape}.")
    pointwise = isinstance(kernel, AbstractPointwiseKernel)
    if pointwise:
        _same_shape(kernel, "`pointwise`", lambda: kernel.pointwise(s), s.shape)
    _same_shape(kernel, "`weights`", lambda: kernel.weights(s, m), s.shape)
    wp, w = _values(kernel, s)
    if pointwise:
        _finite(kernel, "pointwise", wp, s)
        _same_shape(kernel, "`derivative`", lambda: kernel.derivative(s, wp), s.shape)
    _finite(kernel, "weights", w, s)
    values = np.ones((m, 3), dtype)
    _same_shape(kernel, "`rescale`", lambda: kernel.rescale(np.ones((rows, 3), dtype), m),
                (rows, 3))
    state = (np.full((rows,), -np.inf, dtype), np.zeros((rows,), dtype),
             np.zeros((rows, 3), dtype))
    ok = np.isfinite(s)
    for k, (part, shape) in enumerate((("top", (rows,)), ("norm", (rows,)),
                                       ("acc", (rows, 3)))):
        _same_shape(kernel, f"`block_update`'s `{part}`",
                    lambda k=k: kernel.block_update(state, s, ok, lambda p: p @ values)[k], shape)
    done = jax.eval_shape(lambda: kernel.block_update(state, s, ok, lambda p: p @ values))
    done = tuple(np.zeros(d.shape, d.dtype) for d in done)
    _same_shape(kernel, "`block_finish`", lambda: kernel.block_finish(done)[0], (rows, 3))
    zero = np.zeros((rows,), dtype)

    def grad(k):
        _, (a, b) = kernel.block_finish(done)
        return kernel.block_grad(s, ok, a, b, zero, np.ones_like(s))[k]

    for k in (0, 1):
        _same_shape(kernel, "`block_grad`", lambda k=k: grad(k), s.shape)
