"""`PallasKernel`: a whole run of a block of systems in one Pallas kernel."""

import functools
from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp

from .._batch import call_batched, prepare_tokens
from .._ensemble import from_batch_last, to_batch_last
from .._pallas import KernelConfig, key_rows, run_ensemble
from .._pallas.call import as_size
from .._stacked import map_models, models_last
from .._validate import NONFINITE, raise_unless
from .base import NOT_DIFFERENTIABLE, AbstractStrategy, differentiating, refuse_first
from .layers import flag_nonfinite, layer_of
from .solve import FlowResult
from .stepping import (
    chained,
    kernel_plan,
    kernel_saved,
    kernel_stage,
    kernel_stage_saved,
    kernel_step,
)
from .vmap import Vmap


class PallasKernel(AbstractStrategy):
    """The whole run of a block of systems as one Pallas kernel, states in registers
    (`docs/kernels.md`): Triton on CUDA, interpreted elsewhere; one device, not
    differentiable, dense attention only. Layers, and constant steps of Euler or an
    explicit Runge–Kutta solver saved on their step grid, with or without noise.

    **Arguments:**

    - `block`: systems per program (one lane each), a power of two.
    - `num_warps`: warps per program.
    - `backend`: the Pallas GPU backend, `"triton"`.
    """

    block: int = eqx.field(static=True, default=128, converter=as_size)
    num_warps: int = eqx.field(static=True, default=4, converter=as_size)
    backend: str = eqx.field(static=True, default="triton")

    name: ClassVar[str] = "kernel"
    runs_blocks: ClassVar[bool] = False
    differentiable: ClassVar[bool] = False
    splits_tokens: ClassVar[bool] = False
    one_device: ClassVar[bool] = True
    fused: ClassVar[bool] = False

    def __check_init__(self):
        KernelConfig(self.block, self.num_warps, self.backend)  # its one check

    @property
    def config(self) -> KernelConfig:
        return KernelConfig(self.block, self.num_warps, self.backend)

    def run_layers(self, dyn, x0, num_layers, tau, observe, checkpoints, *, devices,
                   shard, noise, keys, checked=True):
        _refuse(devices, shard)
        if x0.size == 0:  # no system: no kernel to launch; the empty result of any member
            return Vmap().run_layers(dyn, x0, num_layers, tau, observe, checkpoints,
                                     devices=devices, shard=shard, noise=noise, keys=keys,
                                     checked=checked)
        return call_batched(_layers_kernel, dyn, x0, None, num_layers, tau, observe,
                            self.config, noise=noise, keys=keys, checked=checked)

    def solve_flow(self, dyn, x0, options, *, adjoint, throw, on_manifold, event,
                   devices, shard, noise, keys, checked=True, progress=False):
        _refuse(devices, shard, checked, event, progress)
        t0, h, saves, per_save, coeffs = kernel_plan(*options)  # its refusals, every batch
        if x0.size == 0:
            return Vmap().solve_flow(dyn, x0, options, adjoint=adjoint, throw=throw,
                                     on_manifold=on_manifold, event=event, devices=devices,
                                     shard=shard, noise=noise, keys=keys, checked=checked)
        (ys, finite), checked = call_batched(
            _flow_kernel, dyn, x0, None, t0, h, saves, per_save, coeffs, bool(on_manifold),
            self.config, noise=noise, keys=keys)
        if throw:
            if not checked:
                raise_unless(finite, NONFINITE)
            return ys
        steps = jnp.full(finite.shape, saves * per_save, jnp.int32)
        return FlowResult(ys, finite, steps)


def _refuse(devices, shard, checked=True, event=None, progress=False) -> None:
    """What `strategy="kernel"` does not run, refused by name."""
    refuse_first("kernel", (
            (not checked, "solves with ja.solve_flow (checked inputs): take "
                          "strategy=ja.BatchLast() ('fused') here."),
            (event is not None, "saves at `ts`: drop `solution=`/`event=`, or take "
                                "strategy=ja.Vmap() ('general')."),
            (devices is not None or shard != "batch",
             "runs on one device: drop `devices=`/`shard=`, or take strategy=ja.BatchLast() "
             "('fused') to split the systems over devices."),
            (progress, "runs a flow in one kernel, with no progress bar: drop `progress=`, "
                       "or take strategy=ja.BatchLast() ('fused').")))


def _refuse_closed(traced) -> None:
    """The differentiated values `observe` or a schedule closes over refused (they
    enter the kernel as inputs: `run_ensemble`), as `refuse` refuses operands."""
    refuse_first("kernel", ((differentiating(traced), NOT_DIFFERENTIABLE),))


def _layer(x, k, params):
    """A layer as the other members run it (`layers.layer_of`: with noise, `ξ` drawn
    from the system's key)."""
    dyn, noise, key, tau = params
    return layer_of(dyn, noise, key, False)(x, k, tau)


def _systems(dyn, x0, checks, keys):
    """The tokens prepared, their batch, the models on the last axis and the keys'
    rows (`None` without noise)."""
    x0 = map_models(lambda d, x: prepare_tokens(d, x, checks=checks), dyn, x0)
    batch = x0.shape[:-2]
    return x0, batch, models_last(dyn, batch), None if keys is None else key_rows(keys)


@eqx.filter_jit
def _layers_kernel(dyn, x0, num_layers, tau, observe, config, checks, noise=None,
                   keys=None):
    """The layers as one Pallas kernel: the layer the other members run, and `observe`."""
    x0, batch, model, rows = _systems(dyn, x0, checks, keys)
    ys, last = run_ensemble(_layer, lambda x, _: observe(x), to_batch_last(x0),
                            (model, noise, rows, tau.astype(x0.dtype)),
                            num_saves=num_layers, steps_per_save=1, config=config,
                            check=_refuse_closed)
    ys, last = from_batch_last(ys, batch), from_batch_last(last, batch)
    finite = jnp.all(jnp.isfinite(last), axis=(-2, -1))
    return flag_nonfinite(ys, finite, checks), finite


@eqx.filter_jit
def _flow_kernel(dyn, x0, t0, h, saves, per_save, coeffs, on_manifold, config, checks,
                 noise=None, keys=None):
    x0, batch, model, rows = _systems(dyn, x0, checks, keys)
    params = (model, jnp.asarray(t0, x0.dtype), jnp.asarray(h, x0.dtype))
    if noise is not None:
        params = params + (noise, rows)
    xb = to_batch_last(x0)
    if noise is None and chained(coeffs):
        step = functools.partial(kernel_stage, coeffs=coeffs, on_manifold=on_manifold)
        saved = functools.partial(kernel_stage_saved, on_manifold=on_manifold)
        xb, per_save = jnp.stack([xb, xb, xb]), per_save * len(coeffs[2])
    else:
        step = functools.partial(kernel_step, coeffs=coeffs, on_manifold=on_manifold,
                                 noisy=noise is not None)
        saved = functools.partial(kernel_saved, on_manifold=on_manifold)
    ys, last = run_ensemble(step, saved, xb, params, num_saves=saves,
                            steps_per_save=per_save, config=config, check=_refuse_closed)
    ys = from_batch_last(ys, batch)
    finite = jnp.all(jnp.isfinite(ys), axis=tuple(range(len(batch), ys.ndim)))
    return flag_nonfinite(ys, finite, checks), finite
