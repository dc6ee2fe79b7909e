"""`strategy="kernel"`: a whole ensemble run as one Pallas kernel.

One program runs a block of systems (`KernelConfig.block`, one lane each) through a
`fori_loop` over the steps, the model's own one-system step evaluated on lanes
(`jaxattn._pallas.lanes`); model leaves, `τ` and noise keys enter as per-system rows
`(size, B)`. The design and layout: `docs/kernels.md`.
"""

import contextlib
import dataclasses
import math
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, Float, PyTree

from .._ensemble import LastAxis, is_batch_last
from .._validate import refuse_first
from .call import as_size, pallas_run, power_of_two, warps_refusal
from .lanes import KernelUnsupported, Key, Lanes, evaluate, objects, trace

# Mosaic GPU (Pallas's default on CUDA) is not offered: its lane lowering has no
# `sqrt` (JAX 0.10), which every norm placement needs.
BACKENDS = ("triton",)


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """How the ensemble kernel is laid out: systems per program (`block`, a power of
    two), warps per program and the Pallas GPU backend (`"triton"`)."""

    block: int = 128
    num_warps: int = 4
    backend: str = "triton"

    def __post_init__(self):
        refuse_first((
                (not power_of_two(self.block),
                 f"`block` must be a power of two, got {self.block!r}."),
                warps_refusal(self.num_warps),
                (self.backend not in BACKENDS,
                 f"`backend` must be one of {BACKENDS}, got {self.backend!r}.")))
        for name in ("block", "num_warps"):  # a NumPy integer stored as an int
            object.__setattr__(self, name, as_size(getattr(self, name)))


_CONFIG = [KernelConfig()]


def kernel_config() -> KernelConfig:
    """The layout `strategy="kernel"` uses now (static: part of the compiled program)."""
    return _CONFIG[-1]


@contextlib.contextmanager
def use_kernel_config(**changes):
    """Within the block, `strategy="kernel"` runs with `KernelConfig` fields changed
    (e.g. `block=256, num_warps=8`): how `benchmarks/gpu_check.py` sweeps them."""
    _CONFIG.append(dataclasses.replace(_CONFIG[-1], **changes))
    try:
        yield _CONFIG[-1]
    finally:
        _CONFIG.pop()


def _rows(leaf, size: int) -> Array:
    """A per-system input as rows `(prod(core), B)` in a dtype a kernel loads."""
    a = leaf.value if is_batch_last(leaf) else jnp.broadcast_to(
        jnp.asarray(leaf)[..., None], jnp.shape(leaf) + (size,))
    a = a.reshape((-1, size))
    return a.astype(_stored(a.dtype))


def _core(leaf) -> jax.ShapeDtypeStruct:
    if is_batch_last(leaf):
        return jax.ShapeDtypeStruct(leaf.value.shape[:-1], leaf.value.dtype)
    return jax.ShapeDtypeStruct(jnp.shape(leaf), jnp.result_type(leaf))


def _stored(dtype):
    return jnp.int32 if dtype == jnp.bool_ else dtype


def _load(ref, aval) -> np.ndarray:
    rows = [ref[j, :] for j in range(math.prod(aval.shape))]
    return objects([(v != 0) if aval.dtype == jnp.bool_ else v for v in rows], aval.shape)


def _flat(value: np.ndarray, lanes: Lanes, dtype) -> tuple:
    """An object array's entries as a tuple of `(block,)` vectors (constants splat)."""
    return tuple(lanes.vec(e, dtype) for e in value.reshape(-1))


def _store(ref, index, value, lanes: Lanes, dtype) -> None:
    for j, v in enumerate(_flat(np.asarray(value, object), lanes, dtype)):
        ref[index, j, :] = v.astype(ref.dtype)


def run_ensemble(
    step: Callable,
    observe: Callable,
    x0: Float[Array, "n d B"],
    params: PyTree,
    *,
    num_saves: int,
    steps_per_save: int,
    config: KernelConfig,
    check: Callable[[list], None] | None = None,
) -> tuple[PyTree[Array], Float[Array, "n d B"]]:
    """Run `num_saves × steps_per_save` steps of every system in one kernel.

    **Arguments:**

    - `step`: one system's step, `step(x, k, params) -> x` (`x` `(n, d)`, `k` the
      step's index as a float of `x`'s dtype).
    - `observe`: what is saved of one system, `observe(x, params) -> pytree of arrays`.
    - `x0`: the systems' tokens, stored last, `(n, d, B)`.
    - `params`: a pytree passed to `step`: its `LastAxis` leaves are per system
      `(..., B)`, other arrays shared, anything else static.
    - `num_saves`, `steps_per_save`: `observe` runs at the start and after every
      `steps_per_save` steps, `num_saves` times.
    - `config`: the layout (`KernelConfig`).
    - `check`: called with the traced values `step` and `observe` close over (they
      enter the kernel as shared inputs) before the kernel is built: a caller's
      refusal (`PallasKernel`: not while differentiated).

    **Returns:**

    `(saved, last)`: `observe`'s outputs with leaves `(num_saves + 1, ..., B)`, and the
    last tokens `(n, d, B)`.
    """
    size = x0.shape[-1]
    dtype = x0.dtype
    leaves, tree = jax.tree.flatten(params, is_leaf=is_batch_last)
    dynamic = [i for i, a in enumerate(leaves) if is_batch_last(a) or eqx.is_array(a)]

    def rebuild(arrays):
        full = list(leaves)
        for i, a in zip(dynamic, arrays):
            full[i] = a
        return jax.tree.unflatten(tree, full)

    x_aval = jax.ShapeDtypeStruct(x0.shape[:-1], dtype)
    avals = [_core(leaves[i]) for i in dynamic]
    step_jaxpr, _ = trace(lambda x, k, *arrays: step(x, k, rebuild(arrays)), x_aval,
                          jax.ShapeDtypeStruct((), dtype), *avals)
    watch_jaxpr, watch_tree = trace(lambda x, *arrays: observe(x, rebuild(arrays)), x_aval,
                                    *avals)
    out_avals = watch_jaxpr.out_avals
    # Values `step` or `observe` close over that are traced (by an enclosing `jit`,
    # `vmap`, …) cannot be folded as constants: they enter as shared inputs.
    traced = list({id(c): c for j in (step_jaxpr, watch_jaxpr) for c in j.consts
                   if isinstance(c, jax.core.Tracer)}.values())
    if check is not None:
        check(traced)
    # a traced key enters as its threefry words and is a key again inside (`Key`)
    keyed = [jnp.issubdtype(c.dtype, jax.dtypes.prng_key) for c in traced]
    impls = {str(jax.random.key_impl(c)) for c, k in zip(traced, keyed) if k}
    refuse_first([(not all("fry" in name for name in impls), KernelUnsupported,
                   f"strategy='kernel' draws noise with threefry keys only, got key "
                   f"implementation {', '.join(sorted(impls))!r}: use jax.random.key "
                   "(default).")])
    shared = [jax.random.key_data(c) if k else c for c, k in zip(traced, keyed)]

    block = config.block
    padded = -(-size // block) * block
    inputs = [_rows(LastAxis(x0), size)]
    inputs += [_rows(a, size) for a in [leaves[i] for i in dynamic] + shared]
    in_avals = [x_aval] + avals + [_core(c) for c in shared]
    keep = [j for j, a in enumerate(inputs) if a.shape[0] > 0]
    inputs = [_pad(inputs[j], padded) for j in keep]
    out_shapes = [jax.ShapeDtypeStruct((num_saves + 1, max(1, math.prod(a.shape)), padded),
                                       _stored(a.dtype)) for a in out_avals]
    out_shapes.append(jax.ShapeDtypeStruct((max(1, math.prod(x_aval.shape)), padded), dtype))

    def kernel(*refs):
        in_refs, out_refs = refs[:len(keep)], refs[len(keep):]
        vals = [np.empty(a.shape, object) for a in in_avals]
        for j, ref in zip(keep, in_refs):
            vals[j] = _load(ref, in_avals[j])
        args = vals[1:1 + len(dynamic)]
        loaded = {id(c): Key(v) if k else v
                  for c, k, v in zip(traced, keyed, vals[1 + len(dynamic):])}
        step_consts, watch_consts = ([loaded.get(id(c), c) for c in j.consts]
                                     for j in (step_jaxpr, watch_jaxpr))

        def save(index, x):
            lanes = Lanes(block)  # one per loop body: its splats live in that trace
            outs = evaluate(watch_jaxpr, [x] + args, lanes, watch_consts)
            for ref, a, v in zip(out_refs, out_avals, outs):
                _store(ref, index, v, lanes, _stored(a.dtype))

        def advance(k, carry):
            lanes = Lanes(block)
            x = objects(carry, x_aval.shape)
            kf = objects((lax.broadcast(lax.convert_element_type(k, dtype), (block,)),), ())
            x_new, = evaluate(step_jaxpr, [x, kf] + args, lanes, step_consts)
            return _flat(np.asarray(x_new, object), lanes, dtype)

        def saving(s, carry):
            if steps_per_save == 1:
                carry = advance(s, carry)
            else:
                carry = lax.fori_loop(s * steps_per_save, (s + 1) * steps_per_save,
                                      advance, carry)
            save(s + 1, objects(carry, x_aval.shape))
            return carry

        save(0, vals[0])
        last = lax.fori_loop(0, num_saves, saving, _flat(vals[0], Lanes(block), dtype))
        for j, v in enumerate(last):
            out_refs[-1][j, :] = v

    from jax.experimental import pallas as pl  # on the kernel's first use (`call.py`)
    outs = pallas_run(
        kernel, inputs, grid=(padded // block,),
        in_specs=[pl.BlockSpec((a.shape[0], block), lambda i: (0, i)) for a in inputs],
        out_specs=[pl.BlockSpec(s.shape[:-1] + (block,),
                                lambda i, r=len(s.shape): (0,) * (r - 1) + (i,))
                   for s in out_shapes],
        out_shape=out_shapes, num_warps=config.num_warps, name="ensemble_run")
    saved = [o[..., :size].reshape((num_saves + 1,) + a.shape + (size,))
             for o, a in zip(outs[:-1], out_avals)]
    saved = [o != 0 if a.dtype == jnp.bool_ else o for o, a in zip(saved, out_avals)]
    last = outs[-1][:, :size].reshape(x0.shape)
    return jax.tree.unflatten(watch_tree, saved), last


def _pad(a: Array, padded: int) -> Array:
    """Rows `(k, B)` padded to `padded` systems with copies of the first."""
    pad = padded - a.shape[-1]
    if not pad:
        return a
    return jnp.concatenate([a, jnp.broadcast_to(a[:, :1], (a.shape[0], pad))], axis=-1)


def key_rows(keys) -> LastAxis:
    """Per-system threefry keys `(*batch,)` (typed) or `(*batch, 2)` (raw, as
    `jaxattn._noise.check_noise` takes them) as the kernel's rows `(2, B)` of `uint32`;
    other key implementations are refused."""
    if jnp.issubdtype(keys.dtype, jax.dtypes.prng_key):
        impl = str(jax.random.key_impl(keys))
        if "threefry" not in impl:
            raise ValueError(f"strategy='kernel' draws noise with threefry keys only, got "
                             f"{impl!r}: use jax.random.key(seed).")
        keys = jax.random.key_data(keys)
    return LastAxis(jnp.moveaxis(keys.reshape((-1, 2)), 0, -1))
