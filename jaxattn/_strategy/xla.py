"""`AbstractXlaStrategy`: the members that run the one-system program through XLA,
`Vmap` and `BatchLast`; they differ only in where the systems sit (`fused`)."""

from typing import ClassVar

import diffrax as dfx
import jax.numpy as jnp

from .._batch import call_batched
from .._ensemble import chunk_size
from .._stacked import first_model
from .base import AbstractStrategy
from .layers import layers_program
from .solve import (
    FlowResult,
    FlowSolution,
    manifold_solver,
    names_event,
    raise_failure,
    solve_batched,
)


class AbstractXlaStrategy(AbstractStrategy):
    """Layers as a checkpointed `lax.scan`, flows as diffrax solves, both of the
    model's one-system `layer`/`velocity`: vmapped over the systems (`fused = False`)
    or with the systems on the last axis of every array (`fused = True`, in chunks of
    `chunk_size` systems on the CPU)."""

    runs_blocks: ClassVar[bool]
    differentiable: ClassVar[bool] = True
    one_device: ClassVar[bool] = False

    def _chunk(self, devices):
        return chunk_size(devices) if self.fused else None

    def run_layers(self, dyn, x0, num_layers, tau, observe, checkpoints, *, devices,
                   shard, noise, keys, checked=True):
        return call_batched(layers_program, dyn, x0, devices, num_layers, tau, observe,
                            checkpoints, shard=shard, keys=keys, checked=checked,
                            fused=self.fused, chunk=self._chunk(devices), noise=noise)

    def solve_flow(self, dyn, x0, options, *, adjoint, throw, on_manifold, event,
                   devices, shard, noise, keys, checked=True, progress=False):
        ts, solver, *rest = options
        if on_manifold:  # its metric is each system's own in the run (`solve._with_metric`)
            solver = manifold_solver(solver, first_model(dyn).W, fused=self.fused)
        if x0.size == 0:  # an empty batch (`solve_flow` refuses it with `solution=True`)
            return _empty(x0, ts, throw)
        args = (ts, solver, *rest, adjoint, bool(throw) and checked, bool(on_manifold))
        # Unchecked (`solve_flow_unchecked`), `throw` is False: a `FlowResult` below.
        (ys, solved, finite, steps, result, started), in_program = call_batched(
            solve_batched, dyn, x0, devices, *args, shard=shard, keys=keys, host=checked,
            checked=checked, fused=self.fused, chunk=self._chunk(devices), event=event,
            noise=noise, progress=progress)
        if throw and not in_program:
            raise_failure(solved, finite, result, started, names_event(event, solver))
        if event is not None:
            saved, ys, t_end, y_end, stats = ys
            stopped = result == dfx.RESULTS.event_occurred
            return FlowSolution(saved, ys, t_end, y_end, stats, result, solved & finite,
                                stopped)
        return ys if throw else FlowResult(ys, solved & finite, steps)


def _empty(x0, ts, throw: bool):
    """What `solve_flow` returns for a batch with no sequence in it."""
    batch = x0.shape[:-2]
    ys = jnp.zeros(batch + (ts.shape[0],) + x0.shape[-2:], x0.dtype)
    if throw:
        return ys
    return FlowResult(ys, jnp.zeros(batch, bool), jnp.zeros(batch, jnp.int32))
