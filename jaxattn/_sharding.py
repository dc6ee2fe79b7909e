"""Spreading a batch over several devices with `jax.sharding`.

Every batched entry point takes `devices=`: `None` (one device, the default), an
int (the first that many devices), a sequence of devices, or a `jax.sharding.Mesh`
(its first axis shards the batch). The batch is flattened, padded to a multiple
of the device count with copies of its first sample, placed with a
`NamedSharding`, run by the same compiled program, and the padding is dropped.
XLA partitions the program, so each device computes its own share of the batch;
the program must contain no host callback (`eqx.error_if`), which XLA would place
on one device with the whole batch (see `_batch.call_batched`). Results equal the
single-device run. On several hosts, call `jax.distributed.initialize()` first and
pass a `Mesh` over `jax.devices()`.
"""

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jaxtyping import Array


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
