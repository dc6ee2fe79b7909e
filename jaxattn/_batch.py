"""Shared batch handling of the simulators: one sequence `(n, d)` per function,
leading batch axes mapped with `jax.vmap` (the general path) or carried last (the
fused path, `jaxattn._ensemble`), one model or one per instance (`jaxattn._stacked`).

The batch spread over several devices with `jax.sharding`: every batched entry point
takes `devices=`: `None` (one device, the default), an int (the first that many
devices), a sequence of devices, or a `jax.sharding.Mesh` (its first axis shards the
batch). The batch is flattened, padded to a multiple of the device count with copies of
its first sample, placed with a `NamedSharding`, run by the same compiled program, and
the padding is dropped. XLA partitions the program, so each device computes its own
share of the batch; the program must contain no host callback (`eqx.error_if`), which
XLA would place on one device with the whole batch (see `call_batched`). Results equal
the single-device run. On several hosts, call `jax.distributed.initialize()` first and
pass a `Mesh` over `jax.devices()`.
"""

from collections.abc import Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jaxtyping import Array, Float, PyTree

from ._dynamics import SelfAttentionDynamics
from ._ensemble import from_batch_last, in_chunks, is_batch_last, to_batch_last
from ._manifold import project
from ._stacked import map_models, models_last
from ._validate import as_float_array, check_tokens, check_tokens_now, is_concrete


def as_mesh(devices) -> Mesh | None:
    """A one-axis mesh (axis `"batch"`) from the `devices=` option, or `None`."""
    if devices is None or isinstance(devices, Mesh):
        return devices
    available = jax.devices()
    if isinstance(devices, (int, np.integer)) and not isinstance(devices, bool):
        if not 1 <= devices <= len(available):
            raise ValueError(
                f"devices={devices}, but {len(available)} device(s) are available "
                f"({available[0].platform}). For several CPU devices set "
                "XLA_FLAGS=--xla_force_host_platform_device_count=N before importing jax."
            )
        devices = available[:devices]
    ok = isinstance(devices, Sequence) and not isinstance(devices, str) and len(devices) > 0
    if not ok or not all(isinstance(d, jax.Device) for d in devices):
        raise TypeError(
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


def unshard(out, size: int, batch_shape: tuple[int, ...]):
    """Drop the padding and restore the batch shape on every output leaf."""
    return jax.tree.map(lambda a: a[:size].reshape(batch_shape + a.shape[1:]), out)


def check_token_shape(
    dyn: SelfAttentionDynamics, x0, name: str = "x0"
) -> Float[Array, "*batch n d"]:
    """`x0` as a float array of shape `(..., n, d)` in the compute dtype, or an error."""
    if not isinstance(dyn, SelfAttentionDynamics):
        raise TypeError(
            f"`dyn` must be a ja.SelfAttentionDynamics (the model), got {type(dyn).__name__}."
        )
    x0 = as_float_array(x0, name)
    d = dyn.dim
    if x0.ndim < 2 or x0.shape[-1] != d or x0.shape[-2] < 1:
        raise ValueError(
            f"`{name}` must have shape (..., n, d) with d={d} (the model's dimension), "
            f"got {x0.shape}."
        )
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


def map_systems(
    program: Callable, dyn, x0: Float[Array, "*batch n d"], *, fused: bool,
    chunk: int | None
) -> PyTree[Array]:
    """Run `program` on every system of `x0`, on the general or the fused path.

    **Arguments:**

    - `program`: one run, `program(model, x, fused)`. With `fused=False`: one model
      and one sequence `x` `(n, d)`, vmapped over the batch. With `fused=True`: a
      chunk of systems `x` `(n, d, B)`, stored last, and the model with its batched
      leaves as `LastAxis` values `(..., B)` (one per system); every output leaf
      then carries the systems last too.
    - `dyn`: the model, or a flattened stacked model (`jaxattn._stacked.stack_tokens`).
    - `x0`: the tokens, `(..., n, d)` (`(M, ..., n, d)` for a stacked model).
    - `fused`: whether to take the fused path (`jaxattn._strategy.choose_strategy`).
    - `chunk`: systems per chunk of the fused path (`jaxattn._ensemble.chunk_size`).

    **Returns:**

    `program`'s outputs, each leaf with the batch axes of `x0` in front.
    """
    if not fused:
        return map_models(lambda d, x: map_batch(lambda y: program(d, y, False), x), dyn, x0)
    batch = x0.shape[:-2]
    spread, model = eqx.partition(models_last(dyn, batch), is_batch_last,
                                  is_leaf=is_batch_last)

    def run_chunk(args):
        xb, part = args
        return program(eqx.combine(part, model, is_leaf=is_batch_last), xb, True)

    return from_batch_last(in_chunks(run_chunk, (to_batch_last(x0), spread), chunk), batch)


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
    count = mesh.devices.size
    n = x0.shape[-2]
    if n % count:
        raise ValueError(f"shard='tokens' splits the n={n} tokens over {count} devices: n "
                         f"must be a multiple of {count}; pick n or devices so.")
    axis = mesh.axis_names[0]
    spec = PartitionSpec(*([None] * (x0.ndim - 2)), axis, None)
    return dyn.on_tokens(mesh), jax.device_put(x0, NamedSharding(mesh, spec))


def check_shard(shard, dyn, one) -> str:
    """`shard` if it names a split (`SHARDS`) the model allows, else an error."""
    if not isinstance(shard, str) or shard not in SHARDS:
        raise ValueError(f"`shard` must be one of {', '.join(map(repr, SHARDS))}, got "
                         f"{shard!r}.")
    if shard == "tokens" and dyn is not one:
        raise ValueError("shard='tokens' splits one model's tokens: run a stacked model "
                         "with shard='batch'.")
    return shard


def call_batched(jitted: Callable, dyn, x0, devices, *args, shard: str = "batch", keys=None,
                 **kwargs):
    """Call `jitted(dyn, x0, *args, checks, **kwargs)`, sharding the batch axes of `x0` over
    `devices`.

    When an input is traced (an outer `jit`/`grad`), the value checks run inside
    the program (`checks=True`, `eqx.error_if`). A run of concrete inputs leaves
    them out (`checks=False`): the tokens are checked here, before the run, and the
    caller checks the outputs after it. `eqx.error_if` is a host callback, and a
    program with one is compiled again in every process (JAX's persistent
    compilation cache does not store programs with host callbacks); sharded, XLA
    would also place it on one device, so the whole batch would be gathered there
    and an error raised by that device would leave the others waiting in a
    collective.

    `keys` (one noise key per system, `(*batch,)`) are split over the devices with the
    batch and passed on as `keys=`.

    **Returns:** `(out, checked)`; with `checked=False` the caller must check `out`
    on the host.
    """
    x0 = as_float_array(x0, "x0")
    if keys is not None:  # the noise's key per system, split as the batch is
        kwargs["keys"] = keys
    # Every input counts, keyword ones too: a noise whose σ is traced (a `vmap` over σ)
    # or traced keys need the checks inside the program, as a traced model does.
    concrete = all(is_concrete(a) for a in jax.tree.leaves((dyn, x0, args, kwargs)))
    if concrete and x0.size:  # the shape is the caller's to check (a stacked model's)
        check_tokens_now(x0)
    if shard == "tokens":
        dyn, x0 = on_tokens(dyn, x0, devices)
        return jitted(dyn, x0, *args, not concrete, **kwargs), not concrete
    mesh = as_mesh(devices)
    batch = x0.shape[:-2]
    if mesh is None or not batch:
        return jitted(dyn, x0, *args, not concrete, **kwargs), not concrete
    flat, size = shard_batch(x0, mesh, len(batch))
    if keys is not None:
        kwargs["keys"] = shard_batch(keys, mesh, len(batch))[0]
    return unshard(jitted(dyn, flat, *args, not concrete, **kwargs), size, batch), not concrete
