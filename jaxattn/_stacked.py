"""Stacked models: a batch of `SelfAttentionDynamics`, one per instance, as one model.

A study that draws a model per instance (a sweep, restarts with trained weights, a
phase diagram with random weights, β as a batched leaf) builds them together, e.g.
`eqx.filter_vmap(make_model)(keys)`: one `SelfAttentionDynamics` whose array leaves
carry leading batch axes. `ja.run_layers` and `ja.solve_flow` take such a model with
tokens whose batch axes start with the model's, `x0 (*models, *systems, n, d)`:
model `m` runs the systems `x0[m]`. The batch axes of a leaf are found from its rank:
one model's weights are `(h, a, b)` in a `Constant` (`(L, h, a, b)` in a
`PiecewiseConstant`), `W` and `mask` are matrices, `β`, the sigmoid's `bias` and `dt` scalars; a
leaf of a `Schedule`'s `params` is batched when it starts with the model's batch
axes. Leaves without batch axes are shared by every model (a common `W`, one β).

The models' batch axes are flattened to one, `M`, for the run (`stack_tokens`); the
general path vmaps over it (`map_models`), the fused path spreads each batched leaf
over its model's systems with the systems last (`models_last`); `jaxattn._batch.
map_systems` runs a simulator's program on either path.
"""

import math
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PyTree

from ._ensemble import LastAxis, from_batch_last, in_chunks, is_batch_last
from ._validate import refuse_first

# One model's rank of each leaf of known role, by its path in the model.
_TOP_RANK = {"W": 2, "beta": 0, "mask": 2}
_SCHEDULE_RANK = {"value": 3, "values": 4, "dt": 0}
# The built-in kernels' parameters (the sigmoid's bias) are scalars; a user kernel's
# leaves are batched when they start with the models' batch axes.
_KERNEL_RANK = {"bias": 0}


def _base_rank(path) -> int | None:
    """One model's rank of the leaf at `path`, `None` when unknown (a `Schedule`'s params)."""
    names = [getattr(k, "name", None) for k in path]
    if len(names) == 1:
        return _TOP_RANK.get(names[0])
    if len(names) == 2 and names[0] in ("P", "Q", "K", "U"):
        return _SCHEDULE_RANK.get(names[1])
    if len(names) == 2 and names[0] == "kernel":
        return _KERNEL_RANK.get(names[1])
    return None


def _batches(dyn) -> list[tuple[int, ...]]:
    """The distinct batch axes of a stacked model's leaves (one entry when consistent)."""
    found = set()
    for path, leaf in jax.tree_util.tree_flatten_with_path(dyn)[0]:
        rank = _base_rank(path)
        if rank is not None and eqx.is_array(leaf) and leaf.ndim > rank:
            found.add(tuple(leaf.shape[:leaf.ndim - rank]))
    return sorted(found)


def model_batch(dyn) -> tuple[int, ...]:
    """The batch axes of a stacked model (see the module doc, checked by
    `stack_tokens`); `()` for one model."""
    found = _batches(dyn)
    return found[0] if found else ()


def batched_leaves(dyn, batch: tuple[int, ...]) -> PyTree[bool]:
    """Per leaf of `dyn`, whether it carries the models' batch axes `batch`."""
    def batched(path, leaf):
        if not batch or not eqx.is_array(leaf):
            return False
        rank = _base_rank(path)
        if rank is not None:
            return leaf.ndim > rank
        return tuple(leaf.shape[:len(batch)]) == tuple(batch)
    return jax.tree_util.tree_map_with_path(batched, dyn)


def first_model(dyn):
    """The first model of a stacked one (its shapes and options), or `dyn` itself."""
    batch = model_batch(dyn)
    if not batch:
        return dyn
    index = (0,) * len(batch)
    return jax.tree.map(lambda a, b: a[index] if b else a, dyn, batched_leaves(dyn, batch))


def stack_tokens(dyn, x0) -> tuple:
    """A stacked model and its tokens with the models' batch axes flattened to one.

    **Returns:**

    `(dyn, x0, unflatten)`: the model with leaves `(M, ...)`, the tokens `(M, ..., n,
    d)` and `unflatten(tree)`, which gives every output leaf `(M, ...)` back its
    models' batch axes. For one model, `dyn`, `x0` and the identity.
    """
    found = _batches(dyn)
    batch = found[0] if found else ()
    shape = tuple(jnp.shape(x0))
    refuse_first((
        (len(found) > 1, f"a stacked model's leaves must share their batch axes, got {found}; "
                         "build it with eqx.filter_vmap(make_model)(keys)."),
        (batch and (len(shape) < len(batch) + 2 or shape[:len(batch)] != batch),
         f"a stacked model with batch axes {batch} runs tokens (*{batch}, ..., n, d), one "
         f"batch per model; got x0 of shape {shape}."),
    ))
    if not batch:
        return dyn, x0, lambda tree: tree
    size = math.prod(batch)
    flags = batched_leaves(dyn, batch)
    flat = jax.tree.map(lambda a, b: a.reshape((size,) + a.shape[len(batch):]) if b else a,
                        dyn, flags)
    x0 = jnp.reshape(x0, (size,) + shape[len(batch):])

    def unflatten(tree):
        return jax.tree.map(lambda a: a.reshape(batch + a.shape[1:]), tree)
    return flat, x0, unflatten


def map_batch(fn: Callable, x0: Float[Array, "*batch n d"], *rest):
    """`fn(x, *rest_b)` for every sequence `x` `(n, d)` of `x0`, one vmapped program;
    each of `rest` (a system's keys) has the batch axes of `x0` in front, as do the
    outputs."""
    batch = x0.shape[:-2]
    if not batch:
        return fn(x0, *rest)
    flat = [a.reshape((-1,) + a.shape[len(batch):]) for a in (x0, *rest)]
    out = jax.vmap(fn)(*flat)
    return jax.tree.map(lambda a: a.reshape(batch + a.shape[1:]), out)


def map_models(fn: Callable, dyn, x: Float[Array, "M ..."], *rest):
    """`fn(model, x[m], *rest)` for every model `m` of a flattened stacked model
    (`stack_tokens`), one vmapped program; `fn(dyn, x, *rest)` for one model."""
    batch = model_batch(dyn)
    if not batch:
        return fn(dyn, x, *rest)
    axes = jax.tree.map(lambda b: 0 if b else None, batched_leaves(dyn, batch))
    return eqx.filter_vmap(lambda d, y: fn(d, y, *rest), in_axes=(axes, 0))(dyn, x)


def models_last(dyn, batch: tuple[int, ...]):
    """A flattened stacked model for the fused path over tokens with batch axes
    `batch = (M, ...)`: each batched leaf `(M, ...)` repeated for its model's systems
    and stored `(..., B)` with the systems last, as a `LastAxis`; one model as is."""
    flags = batched_leaves(dyn, model_batch(dyn))

    def spread(a, b):
        if not b:
            return a
        a = jnp.reshape(a, a.shape[:1] + (1,) * (len(batch) - 1) + a.shape[1:])
        a = jnp.broadcast_to(a, tuple(batch) + a.shape[len(batch):])
        a = a.reshape((-1,) + a.shape[len(batch):])
        return LastAxis(jnp.moveaxis(a, 0, -1))
    return jax.tree.map(spread, dyn, flags)


def map_systems(program: Callable, dyn, x0: Float[Array, "*batch n d"], *rest, fused: bool,
                chunk: int | None) -> PyTree[Array]:
    """Run `program` on every system of `x0`, on the general or the fused path.

    **Arguments:**

    - `program`: one run, `program(model, x, *rest_b, fused)`. With `fused=False`: one
      model, one sequence `x` `(n, d)` and its entries of `rest`, vmapped over the
      batch. With `fused=True`: a chunk of systems `x` `(n, d, B)` and their entries
      of `rest`, stored last, and the model with its batched leaves as `LastAxis`
      values `(..., B)` (one per system); every output leaf then carries the systems
      last too.
    - `dyn`: the model, or a flattened stacked model (`stack_tokens`).
    - `x0`: the tokens, `(..., n, d)` (`(M, ..., n, d)` for a stacked model).
    - `rest`: arrays with the batch axes of `x0` in front, one entry per system (the
      data of its noise key).
    - `fused`: whether to take the fused path (`jaxattn._strategy.choose_strategy`).
    - `chunk`: systems per chunk of the fused path (`jaxattn._ensemble.chunk_size`).

    **Returns:**

    `program`'s outputs, each leaf with the batch axes of `x0` in front.
    """
    if not fused:
        return map_models(lambda d, xr: map_batch(lambda *a: program(d, *a, False), *xr), dyn,
                          (x0, *rest))
    batch = x0.shape[:-2]
    spread, model = eqx.partition(models_last(dyn, batch), is_batch_last,
                                  is_leaf=is_batch_last)
    last = [jnp.moveaxis(a.reshape((-1,) + a.shape[len(batch):]), 0, -1) for a in (x0, *rest)]

    def run_chunk(args):
        *arrays, part = args
        return program(eqx.combine(part, model, is_leaf=is_batch_last), *arrays, True)

    return from_batch_last(in_chunks(run_chunk, (*last, spread), chunk), batch)
