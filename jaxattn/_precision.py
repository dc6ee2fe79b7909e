"""The precision of every matrix product jaxattn issues, stated so that results depend
neither on the backend nor on `jax_default_matmul_precision`: `"float32"` (default,
`Precision.HIGHEST`; float64 stays float64), or the opt-in `"tensorfloat32"` (TF32
operands, float32 accumulation; emulated with `lax.reduce_precision` off NVIDIA GPUs)
and `"bfloat16"` (bfloat16 operands, float32 accumulation). Only the attention
follows them; the metric and every measure are always `"float32"`. The policy and
each mode's measured error: `docs/precision.md`.
"""

from typing import Literal

import jax
import jax.numpy as jnp
from jax import lax

Precision = Literal["float32", "tensorfloat32", "bfloat16"]
PRECISIONS: tuple[str, ...] = ("float32", "tensorfloat32", "bfloat16")

_TF32_BITS = {"exponent_bits": 8, "mantissa_bits": 10}


def check_precision(precision) -> str:
    """`precision` if it names a mode of `PRECISIONS`, else a `ValueError` listing them."""
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise ValueError(
            f"precision must be one of {', '.join(map(repr, PRECISIONS))}, got {precision!r}."
        )
    return precision


def on_gpu() -> bool:
    """Whether JAX's default backend is a GPU."""
    return jax.default_backend() in ("gpu", "cuda", "rocm")


def einsum(subscripts: str, *operands, precision: Precision = "float32"):
    """`jnp.einsum` at the named precision (see the module docstring); the result has
    the operands' common dtype. The reduced modes take two operands (a chained
    product's intermediate would be float32 at an unstated precision)."""
    operands = [jnp.asarray(x) for x in operands]
    dtype = jnp.result_type(*operands)
    if precision == "float32":
        return jnp.einsum(subscripts, *operands, precision=lax.Precision.HIGHEST)
    if precision == "bfloat16":
        low = [x.astype(jnp.bfloat16) for x in operands]
        # Stated, so that `jax_default_matmul_precision` cannot change it either. Float32
        # sums also for float64 operands: a GPU has no bfloat16 product into float64.
        out = jnp.einsum(subscripts, *low, precision=lax.Precision.DEFAULT,
                         preferred_element_type=jnp.float32)
        return out.astype(dtype)
    # "tensorfloat32" (the model's `precision` was checked where it was built)
    if on_gpu() and dtype == jnp.float32:
        return jnp.einsum(subscripts, *operands, precision=lax.DotAlgorithmPreset.TF32_TF32_F32)
    rounded = [lax.reduce_precision(x, **_TF32_BITS) for x in operands]
    return jnp.einsum(subscripts, *rounded, precision=lax.Precision.HIGHEST)


def matmul(a, b, precision: Precision = "float32"):
    """`a @ b` (with NumPy's broadcasting of leading axes) at the named precision."""
    a, b = jnp.asarray(a), jnp.asarray(b)
    if a.ndim == 1 or b.ndim == 1:  # a vector: its axis contracted and dropped
        spec = ("i,i->" if a.ndim == b.ndim else
                "i,...ij->...j" if a.ndim == 1 else "...ij,j->...i")
        return einsum(spec, a, b, precision=precision)
    return einsum("...ij,...jk->...ik", a, b, precision=precision)
