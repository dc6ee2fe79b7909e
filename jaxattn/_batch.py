"""Shared input handling of the simulators: one sequence `(n, d)` per function,
leading batch axes mapped with `jax.vmap`."""

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from ._dynamics import SelfAttentionDynamics
from ._manifold import project
from ._sharding import as_mesh, shard_batch, unshard
from ._validate import as_float_array, check_tokens


def prepare_tokens(dyn: SelfAttentionDynamics, x0, name: str = "x0") -> Float[Array, "*batch n d"]:
    """Check `x0` against the model and put it on `E_W`.

    Initial tokens need not lie on the ellipsoid: they are normalised with `N_W`
    (documented behaviour of every simulator). NaN/inf entries or zero tokens
    raise an error instead.
    """
    if not isinstance(dyn, SelfAttentionDynamics):
        raise TypeError(
            f"expected a ja.SelfAttentionDynamics as the model, got {type(dyn).__name__}."
        )
    x0 = as_float_array(x0, name)
    d = dyn.dim
    if x0.ndim < 2 or x0.shape[-1] != d or x0.shape[-2] < 1:
        raise ValueError(
            f"`{name}` must have shape (..., n, d) with d={d} (the model's dimension), "
            f"got {x0.shape}."
        )
    dtype = jnp.result_type(x0.dtype, jnp.result_type(float))
    x0 = check_tokens(x0.astype(dtype), dyn.W)
    return project(x0, dyn.W)


def map_batch(fn: Callable, x0: Float[Array, "*batch n d"]):
    """Apply `fn(x: (n, d))` to every sequence of `x0`, one vmapped program.

    Outputs get the batch axes of `x0` in front.
    """
    batch = x0.shape[:-2]
    if not batch:
        return fn(x0)
    flat = x0.reshape((-1,) + x0.shape[-2:])
    out = jax.vmap(fn)(flat)
    return jax.tree.map(lambda a: a.reshape(batch + a.shape[1:]), out)


def call_batched(jitted: Callable, dyn, x0, devices, *args):
    """Call `jitted(dyn, x0, *args)`, sharding the batch axes of `x0` over `devices`."""
    mesh = as_mesh(devices)
    x0 = as_float_array(x0, "x0")
    batch = x0.shape[:-2]
    if mesh is None or not batch:
        return jitted(dyn, x0, *args)
    flat, size = shard_batch(x0, mesh, len(batch))
    return unshard(jitted(dyn, flat, *args), size, batch)
