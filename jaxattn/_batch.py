"""Shared batch handling of the simulators: one sequence `(n, d)` per function,
leading batch axes mapped with `jax.vmap` (the general path) or carried last (the
fused path, `jaxattn._ensemble`), one model or one per instance (`jaxattn._stacked`);
`devices=` spreads the batch over devices (`as_mesh`; padding, placement and several
hosts: `docs/multihost.md`).
"""

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jaxtyping import Array, Float

from ._dynamics import SelfAttentionDynamics
from ._manifold import project
from ._noise import check_noise, system_keys
from ._stacked import first_model, stack_tokens
from ._validate import (
    as_float_array,
    check_tokens,
    check_tokens_now,
    is_concrete,
    refuse_first,
    too_big,
)


def as_mesh(devices) -> Mesh | None:
    """A one-axis mesh (axis `"batch"`) from the `devices=` option, or `None`."""
    if devices is None or isinstance(devices, Mesh):
        return devices
    available = jax.devices()
    count = isinstance(devices, (int, np.integer)) and not isinstance(devices, bool)
    if count and 1 <= devices <= len(available):
        devices = available[:devices]
    ok = isinstance(devices, Sequence) and not isinstance(devices, str) and len(devices) > 0 \
        and all(isinstance(d, jax.Device) for d in devices)
    if not ok:
        raise ValueError(
            f"devices={devices}, but {len(available)} device(s) are available "
            f"({available[0].platform}). For several CPU devices set "
            "XLA_FLAGS=--xla_force_host_platform_device_count=N before importing jax."
        ) if count else TypeError(
            "devices= takes None, an int, a non-empty sequence of jax devices or a "
            f"jax.sharding.Mesh; got {devices!r}."
        )
    return Mesh(np.asarray(list(devices)), ("batch",))


def shard_batch(x: Array, mesh: Mesh, batch_ndim: int) -> tuple[Array, int]:
    """Flatten the leading `batch_ndim` axes, pad, and shard them over `mesh`.

    **Returns:** the placed array `(B', ...)` and the true batch size `B`.
    """
    flat = x.reshape((-1,) + x.shape[batch_ndim:])
    size = flat.shape[0]
    pad = (-size) % mesh.devices.size
    if pad:
        flat = jnp.concatenate([flat, jnp.repeat(flat[:1], pad, axis=0)])
    spec = PartitionSpec(mesh.axis_names[0])
    return jax.device_put(flat, NamedSharding(mesh, spec)), size


def map_blocks(fn: Callable, xs, mesh: Mesh | None = None, shared=(), *,
               block: int | None = None):
    """`jax.lax.map`: `fn(block, *shared)` over the leading (block) axis of `xs`'s
    leaves, one block after another, each block the same program. With `mesh`, the
    blocks are split over its devices (`shard_map`; their number a multiple of the
    devices'): each device maps its own, so that a block's numbers do not depend on
    how many devices, or processes, share the batch. Called inside `jit`.

    With `block`, the leading axis of `xs`'s leaves holds items instead: they are
    padded by repeating them from the first (as `np.resize` pads) to whole blocks of
    `block` items on every device, `fn` gets `block` items and returns one row per
    item, and the result holds one row per item of `xs`, the padding dropped."""
    if block is not None:
        size = jax.tree.leaves(xs)[0].shape[0]
        step = block * (1 if mesh is None else mesh.devices.size)
        cycle = jnp.arange(-(-size // step) * step) % size
        xs = jax.tree.map(lambda a: a[cycle].reshape(-1, block, *a.shape[1:]), xs)
        out = map_blocks(fn, xs, mesh, shared)
        return jax.tree.map(lambda a: a.reshape(-1, *a.shape[2:])[:size], out)
    if mesh is None:
        return jax.lax.map(lambda x: fn(x, *shared), xs)
    split, whole = PartitionSpec(mesh.axis_names[0]), PartitionSpec()
    # check_vma=False: the value checks inside (`eqx.error_if`'s `cond`) are typed
    # for one device
    return jax.shard_map(lambda x, s: jax.lax.map(lambda b: fn(b, *s), x), mesh=mesh,
                         in_specs=(split, whole), out_specs=split,
                         check_vma=False)(xs, tuple(shared))


def replicate(tree, mesh: Mesh):
    """Every leaf of `tree` whole on every device of `mesh` (of every process: each
    process holds the same values), as the input of a program over `mesh`."""
    return jax.device_put(tree, NamedSharding(mesh, PartitionSpec()))


def unshard(out, size: int, batch_shape: tuple[int, ...]):
    """Drop the padding and restore the batch shape on every output leaf."""
    return jax.tree.map(lambda a: a[:size].reshape(batch_shape + a.shape[1:]), out)


def check_token_shape(
    dyn: SelfAttentionDynamics, x0, name: str = "x0"
) -> Float[Array, "*batch n d"]:
    """`x0` as a float array of shape `(..., n, d)` in the compute dtype, or an error."""
    d = dyn.dim if isinstance(dyn, SelfAttentionDynamics) else None
    x0 = as_float_array(x0, name) if d else x0
    refuse_first((
        (d is None, TypeError,
         f"`dyn` must be a ja.SelfAttentionDynamics (the model), got {type(dyn).__name__}."),
        (d and (x0.ndim < 2 or x0.shape[-1] != d or x0.shape[-2] < 1), ValueError,
         f"`{name}` must have shape (..., n, d): n ≥ 1 tokens of the model's dimension "
         f"d={d}, got {jnp.shape(x0) if d else None}."),
    ))
    return x0.astype(jnp.result_type(x0.dtype, jnp.result_type(float)))


def prepare_tokens(
    dyn: SelfAttentionDynamics, x0, name: str = "x0", *, checks: bool = True
) -> Float[Array, "*batch n d"]:
    """Check `x0` against the model and put it on `E_W`.

    Initial tokens need not lie on the ellipsoid: they are normalised with `N_W`
    (documented behaviour of every simulator). NaN/inf entries or zero tokens
    raise an error instead (inside `jit`; with `checks=False` the caller has
    checked them already).
    """
    x0 = check_token_shape(dyn, x0, name)
    if checks:
        x0 = check_tokens(x0)
    return project(x0, dyn.W)


SHARDS = ("batch", "tokens")


def on_tokens(dyn, x0, devices):
    """`shard="tokens"`: the model with its attention as a ring over `devices`, and the
    tokens placed with their token axis split over them (`jaxattn._blocks.ring_attention`).

    **Returns:** `(dyn, x0)` for the ordinary program, which XLA then partitions by
    tokens: every step but attention is token by token, attention passes key shares
    around the ring.
    """
    mesh = as_mesh(1 if devices is None else devices)
    if not isinstance(devices, Mesh):
        mesh = Mesh(mesh.devices, ("tokens",))
    axis = mesh.axis_names[0]
    spec = PartitionSpec(*([None] * (x0.ndim - 2)), axis, None)
    return dyn.on_tokens(mesh), jax.device_put(x0, NamedSharding(mesh, spec))


def check_shard(shard, dyn, one, devices, x0) -> str:
    """`shard` if it names a split (`SHARDS`) that the model (`dyn`, stacked unless it
    is its first model `one`) allows over `devices` for tokens `x0`, else an error."""
    stacked = dyn is not one
    tokens = shard == "tokens" and not stacked and x0.ndim >= 2
    count = as_mesh(1 if devices is None else devices).devices.size if tokens else 1
    n = x0.shape[-2] if tokens else 0
    refuse_first((
        (not isinstance(shard, str) or shard not in SHARDS,
         f"`shard` must be one of {', '.join(map(repr, SHARDS))}, got {shard!r}."),
        (stacked and devices is not None, "`devices=` shards one model's batch: run a stacked "
                                          "model without `devices`, or shard the models yourself."),
        (stacked and shard == "tokens", "shard='tokens' splits one model's tokens: run a stacked "
                                        "model with shard='batch'."),
        (n % count, f"shard='tokens' splits the n={n} tokens over {count} devices: n must be "
                    f"a multiple of {count}; pick n or devices so."),
    ))
    return shard


def check_run(dyn, x0, devices, shard, noise, key) -> tuple:
    """The arguments `ja.run_layers` and `ja.solve_flow` share, checked once.

    **Returns:**

    `(dyn, x0, unflatten, one, shard, noise, keys)`: the model and its tokens with a
    stacked model's batch axes flattened (`jaxattn._stacked.stack_tokens`), `unflatten`
    for the outputs, the first model, the split, and the noise with one key per system
    (`None`, `None` without noise).
    """
    noise, key = check_noise(noise, key, shard=shard)
    dyn, x0, unflatten = stack_tokens(dyn, as_float_array(x0, "x0"))
    one = first_model(dyn)
    shard = check_shard(shard, dyn, one, devices, x0)
    x0 = check_token_shape(one, x0)
    n = x0.shape[-2]
    dense = one.block_size == 0 and one.token_mesh is None  # the (h, n, n) weights asked for
    refuse_first([too_big(
        float(np.prod(x0.shape[:-2], dtype=float)) * one.num_heads * n * n * x0.dtype.itemsize
        if dense else 0.0, f"the dense attention weights of {n} tokens (block_size=0) need",
        "take key blocks (block_size=None, the default, or a block size ≥ 1)")])
    keys = None if noise is None else system_keys(key, x0.shape[:-2])
    return dyn, x0, unflatten, one, shard, noise, keys


def call_batched(jitted: Callable, dyn, x0, devices, *args, shard: str = "batch", keys=None,
                 checked: bool = True, **kwargs):
    """Call `jitted(dyn, x0, *args, checks, **kwargs)`, sharding the batch axes of `x0`
    (and `keys`, one noise key per system) over `devices`. With `checked=False` (a
    strategy's unchecked run) the program runs as is: no checks, no sharding.

    With a traced input (an outer `jit`/`grad`) the value checks run inside the
    program (`checks=True`, `eqx.error_if`). Concrete inputs are checked here before
    the run and the program has none: a host callback makes JAX's persistent cache
    skip the program, and sharded, XLA would gather the whole batch on one device
    for it.

    **Returns:** `(out, checked)`; with `checked=False` the caller must check `out`
    on the host.
    """
    if keys is not None:
        kwargs["keys"] = keys
    if not checked:
        return jitted(dyn, x0, *args, False, **kwargs), False
    # Keyword inputs count too: a traced σ or traced keys need the checks inside.
    concrete = all(is_concrete(a) for a in jax.tree.leaves((dyn, x0, args, kwargs)))
    if concrete and x0.size:  # x0: the caller's checked float array (`check_token_shape`)
        check_tokens_now(x0)
    mesh = as_mesh(devices)
    batch = x0.shape[:-2]
    sharded = shard != "tokens" and mesh is not None and bool(batch)
    if shard == "tokens":
        dyn, x0 = on_tokens(dyn, x0, devices)
    elif sharded:
        x0, size = shard_batch(x0, mesh, len(batch))
        if keys is not None:
            kwargs["keys"] = shard_batch(keys, mesh, len(batch))[0]

    def run(checks: bool):
        out = jitted(dyn, x0, *args, checks, **kwargs)
        return unshard(out, size, batch) if sharded else out

    out = run(not concrete)
    if concrete and any(isinstance(a, jax.core.Tracer) for a in jax.tree.leaves(out)):
        # concrete arguments, traced results: `observe` or a schedule closes over a
        # value an enclosing `jit`, `vmap` or `grad` traces, and the host cannot read
        # them; the run again with the checks inside (under `jit` the first is dropped
        # unused; under `vmap` or `grad` it ran, twice the work of this rare case)
        return run(True), True
    return out, not concrete
