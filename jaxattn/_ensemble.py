"""The batch on the last axis (what `ja.BatchLast()` runs), and `interpret`, the one
evaluation loop of a one-system program for every value type.

`batch_last(fn)` traces `fn`, written for one system (`layer`, `velocity`, a user's
`observe`), once and evaluates its program with every batched value carrying the
systems as its last axis (`jax.vmap(fn, in_axes=-1)` does not: its rules move the
batch to the front where operands disagree). Elementwise, reduction and shape
operations keep that axis last; every `dot_general` becomes elementwise products,
unrolled over a small contracted index (`UNROLL`); anything else falls back to
`jax.vmap` for that operation. A stacked model's batched leaves enter as `LastAxis`
values `(..., B)`. Why and how fast: BENCHMARKS.md, "The fused ensemble path".

Precision is kept as named (`jaxattn._precision`); sums run in another order than a
`dot_general`'s, so the two paths agree to rounding, not bit for bit.
"""

import abc
import functools
import math
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax
from jax.extend import core as jex
from jaxtyping import Array, Float, PyTree

# Contractions over at most this many index values are unrolled into a chain of
# multiply–adds (which XLA fuses with their neighbours); larger ones multiply
# and reduce.
UNROLL = 32

_ELEMENTWISE = frozenset("""
abs acos acosh add and asin asinh atan atan2 atanh cbrt ceil clamp convert_element_type
copy copy_p cos cosh digamma div eq erf erf_inv erfc exp exp2 expm1 floor ge gt imag
integer_pow is_finite le lgamma log log1p logistic lt max min mul ne neg nextafter not
or population_count pow real reduce_precision rem round rsqrt select_n shift_left
shift_right_arithmetic shift_right_logical sign sin sinh sqrt square stop_gradient sub
tan tanh xor
""".split())
# Primitives over named leading axes, independent along the others: with the systems
# last, their parameters stay as they are.
_ALONG_AXES = frozenset("""
reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or reduce_xor argmax
argmin cumsum cumprod cummax cummin cumlogsumexp rev squeeze split sort
""".split())
# Calls whose body `interpret` evaluates in place (custom derivatives are then taken
# through the body).
CALLS = {"pjit": "jaxpr", "jit": "jaxpr", "closed_call": "call_jaxpr",
         "core_call": "call_jaxpr", "custom_jvp_call": "call_jaxpr",
         "custom_vjp_call": "call_jaxpr", "custom_vjp_call_jaxpr": "fun_jaxpr",
         "checkpoint": "jaxpr", "remat": "jaxpr"}


# Systems per chunk on the CPU: 100,000 systems of S1 at once (80 MB of logits) left
# the caches; 512 was the fastest chunk measured (BENCHMARKS.md).
CPU_CHUNK = 512


def to_batch_last(x: Float[Array, "*batch n d"]) -> Float[Array, "n d B"]:
    """Sequences `(..., n, d)` as one array `(n, d, B)`, the batch flattened and last."""
    flat = x.reshape((-1,) + x.shape[-2:])
    return jnp.moveaxis(flat, 0, -1)


def from_batch_last(tree: PyTree[Array], batch: tuple[int, ...]) -> PyTree[Array]:
    """Every leaf `(..., B)` back to `batch + (...)`, the inverse of `to_batch_last`."""
    def back(a):
        a = jnp.moveaxis(a, -1, 0)
        return a.reshape(tuple(batch) + a.shape[1:])
    return jax.tree.map(back, tree)


def chunk_size(devices=None) -> int | None:
    """Systems per chunk of a fused run (`in_chunks`): `CPU_CHUNK` on the CPU, where a
    chunk's intermediates then stay in cache; `None` (the whole batch at once) on an
    accelerator, or when the batch is sharded over `devices`."""
    if devices is not None or jax.default_backend() != "cpu":
        return None
    return CPU_CHUNK


class LastAxis(eqx.Module):
    """A value with one entry per system on its last axis, `(..., B)`: a batched leaf
    of a model (one model per system) as `batch_last` takes it."""

    value: Array


def is_batch_last(v) -> bool:
    return isinstance(v, LastAxis)


def in_chunks(fn: Callable, xb: PyTree[Array], chunk: int | None) -> PyTree[Array]:
    """`fn(xb)` (every leaf of `xb` and of the output `(..., B)`), computed `chunk`
    systems at a time with `lax.map` (the last chunk padded with copies of the first
    system)."""
    size = jax.tree.leaves(xb)[0].shape[-1]
    if chunk is None or size <= chunk:
        return fn(xb)
    count = -(-size // chunk)
    pad = count * chunk - size

    def split(a):
        if pad:
            a = jnp.concatenate([a, jnp.broadcast_to(a[..., :1], a.shape[:-1] + (pad,))], -1)
        return jnp.moveaxis(a.reshape(a.shape[:-1] + (count, chunk)), -2, 0)
    out = lax.map(fn, jax.tree.map(split, xb))

    def join(a):
        a = jnp.moveaxis(a, 0, -2)
        return a.reshape(a.shape[:-2] + (count * chunk,))[..., :size]
    return jax.tree.map(join, out)


def batch_last(fn: Callable) -> Callable:
    """`fn` written for one system, applied to a batch carried on the last axis.

    **Arguments:**

    - `fn`: a function `fn(x, *rest)` of one system's array `x` (e.g. tokens
      `(n, d)`) and arguments `rest` (any pytrees: the model, times), unbatched
      except for their `LastAxis` leaves (one value per system, last).

    **Returns:**

    `g(xb, *rest)` with `xb` of shape `x.shape + (B,)`, returning `fn`'s outputs
    each with a trailing batch axis `B`: the same values as `jax.vmap(fn,
    in_axes=(-1, None, …), out_axes=-1)`, to rounding.
    """

    def mapped(xb, *rest):
        size = xb.shape[-1]
        leaves, tree = jax.tree.flatten(rest, is_leaf=is_batch_last)
        dynamic = [i for i, a in enumerate(leaves) if is_batch_last(a) or eqx.is_array(a)]
        ins = [(xb, True)] + [(leaves[i].value, True) if is_batch_last(leaves[i])
                              else (jnp.asarray(leaves[i]), False) for i in dynamic]

        def flat(x, *arrays):
            full = list(leaves)
            for i, a in zip(dynamic, arrays):
                full[i] = a
            return fn(x, *jax.tree.unflatten(tree, full))

        avals = [jax.ShapeDtypeStruct(v.shape[:-1] if b else v.shape, v.dtype) for v, b in ins]
        closed, out_shape = jax.make_jaxpr(flat, return_shape=True)(*avals)
        outs = interpret(closed.jaxpr, closed.consts, ins, _LastAxisValues(size))
        outs = [v if b else _broadcast(v, size) for v, b in outs]
        return jax.tree.unflatten(jax.tree.structure(out_shape), outs)

    return mapped


class AbstractValues(abc.ABC):
    """A value type of `interpret`: how a one-system program's values are held (arrays
    with the systems last here; lanes inside a Pallas kernel, `jaxattn._pallas.lanes`)
    and its table of rules, one per operation."""

    @abc.abstractmethod
    def constant(self, value):
        """A literal or a closed-over constant, as a value."""

    @abc.abstractmethod
    def fold(self, eqn, ins) -> list | None:
        """The outputs of `eqn` computed now when no input varies by system, else `None`."""

    @abc.abstractmethod
    def apply(self, eqn, ins) -> list:
        """The outputs of `eqn` (not a call) by the value type's rule."""


def interpret(jaxpr, consts, ins: list, values: AbstractValues) -> list:
    """Evaluate a one-system `jaxpr` on values of one type: the one evaluation loop of
    both `batch_last` and the ensemble kernel. Calls (`CALLS`) are evaluated in place.
    **Returns:** the outputs, as values."""
    env: dict = {}

    def read(v):
        return values.constant(v.val) if isinstance(v, jex.Literal) else env[v]

    env.update(zip(jaxpr.constvars, [values.constant(c) for c in consts]))
    env.update(zip(jaxpr.invars, ins))
    for eqn in jaxpr.eqns:
        args = [read(v) for v in eqn.invars]
        outs = values.fold(eqn, args)
        if outs is None:
            body = CALLS.get(eqn.primitive.name)
            if body in eqn.params:
                sub = eqn.params[body]
                outs = interpret(getattr(sub, "jaxpr", sub), getattr(sub, "consts", ()), args,
                                 values)
            else:
                outs = values.apply(eqn, args)
        for var, out in zip(eqn.outvars, outs):
            if not isinstance(var, jex.DropVar):
                env[var] = out
    return [read(v) for v in jaxpr.outvars]


class _LastAxisValues(AbstractValues):
    """`(value, batched)` pairs; a batched value carries `size` systems last."""

    def __init__(self, size: int):
        self.size = size

    def constant(self, value):
        return value, False

    def fold(self, eqn, ins):
        if any(b for _, b in ins):
            return None
        prim = eqn.primitive
        out = prim.bind(*[v for v, _ in ins], **prim.get_bind_params(eqn.params))
        return [(o, False) for o in (out if prim.multiple_results else [out])]

    def apply(self, eqn, ins):
        prim, name = eqn.primitive, eqn.primitive.name
        rule = _RULES.get(name)
        if name in _ELEMENTWISE or name in _ALONG_AXES:
            rule = functools.partial(_elementwise if name in _ELEMENTWISE else _along_axes,
                                     shape=eqn.outvars[0].aval.shape)
        out = None if rule is None else rule(prim, ins, self.size, **eqn.params)
        if out is None:  # no rule, or a case it does not cover (e.g. batched indices)
            return _fallback(eqn, ins)
        return [(o, True) for o in (out if prim.multiple_results else [out])]


def _fallback(eqn, ins):
    """One operation through `jax.vmap`, the systems moved back to the last axis."""
    params = eqn.primitive.get_bind_params(eqn.params)
    out = jax.vmap(lambda *a: eqn.primitive.bind(*a, **params),
                   in_axes=[-1 if b else None for _, b in ins], out_axes=-1)(
        *[v for v, _ in ins])
    return [(o, True) for o in (out if eqn.primitive.multiple_results else [out])]


def _broadcast(v, size):
    """An unbatched value with `size` systems last, `v.shape + (size,)`."""
    v = jnp.asarray(v)
    return lax.broadcast_in_dim(v, v.shape + (size,), tuple(range(v.ndim)))


def _to_batched(v, b, shape, size):
    """`v` (batched or not; a scalar, or of `shape`'s rank with size-1 axes that
    broadcast) as a batched value of core shape `shape`."""
    v = jnp.asarray(v)
    full = tuple(shape) + (size,)
    if b and v.shape == full:
        return v
    dims = (len(shape),) if b and v.ndim == 1 else tuple(range(v.ndim))
    return lax.broadcast_in_dim(v, full, dims)


def _elementwise(prim, ins, size, shape, **params):
    return prim.bind(*[_to_batched(v, b, shape, size) for v, b in ins], **params)


def _along_axes(prim, ins, size, shape, **params):
    # Operands share one core shape: that of any batched one.
    return _elementwise(prim, ins, size, next(v.shape[:-1] for v, b in ins if b), **params)


def _broadcast_in_dim(prim, ins, size, shape, broadcast_dimensions, sharding=None, **params):
    (v, _), *dyn_shape = ins
    if dyn_shape:
        return None
    return lax.broadcast_in_dim(v, tuple(shape) + (size,),
                                tuple(broadcast_dimensions) + (len(shape),))


def _reshape(prim, ins, size, new_sizes, dimensions=None, **params):
    (v, _), = ins[:1]
    if dimensions is not None:
        v = jnp.transpose(v, tuple(dimensions) + (v.ndim - 1,))
    return lax.reshape(v, tuple(new_sizes) + (size,))


def _transpose(prim, ins, size, permutation):
    (v, _), = ins
    return lax.transpose(v, tuple(permutation) + (len(permutation),))


def _slice(prim, ins, size, start_indices, limit_indices, strides):
    (v, _), = ins
    strides = None if strides is None else tuple(strides) + (1,)
    return lax.slice(v, tuple(start_indices) + (0,), tuple(limit_indices) + (size,), strides)


def _concatenate(prim, ins, size, dimension):
    ops = [v if b else _broadcast(v, size) for v, b in ins]
    return lax.concatenate(ops, dimension)


def _pad(prim, ins, size, padding_config):
    (v, b), (pad, pad_b) = ins
    if pad_b:
        return None
    v = v if b else _broadcast(v, size)
    return lax.pad(v, pad, tuple(padding_config) + ((0, 0, 0),))


def _dynamic_slice(prim, ins, size, slice_sizes):
    (v, b), *idx = ins
    if any(ib for _, ib in idx):
        return None
    zero = jnp.zeros((), jnp.result_type(idx[0][0]) if idx else jnp.int32)
    return lax.dynamic_slice(v, [i for i, _ in idx] + [zero], tuple(slice_sizes) + (size,))


def _dynamic_update_slice(prim, ins, size):
    (v, b), (u, ub), *idx = ins
    if any(ib for _, ib in idx):
        return None
    v, u = (v if b else _broadcast(v, size)), (u if ub else _broadcast(u, size))
    zero = jnp.zeros((), jnp.result_type(idx[0][0]) if idx else jnp.int32)
    return lax.dynamic_update_slice(v, u, [i for i, _ in idx] + [zero])


def round_operand(x, precision, out_dtype):
    """An operand as the named precision presents it to the product (see module doc)."""
    name = getattr(precision, "name", "")
    if name.startswith("TF32") and x.dtype == jnp.float32:
        x = lax.reduce_precision(x, exponent_bits=8, mantissa_bits=10)
    elif name.startswith("BF16"):
        x = x.astype(jnp.bfloat16)
    return x.astype(out_dtype)


def _dot_general(prim, ins, size, dimension_numbers, precision=None,
                 preferred_element_type=None, **params):
    """A `dot_general` as elementwise products summed over the contracted index,
    the systems last: `out[batch, lhs free, rhs free, B]`."""
    (a, ab), (c, cb) = ins
    (lc, rc), (lbd, rbd) = dimension_numbers
    out_dtype = preferred_element_type or jnp.result_type(a, c)
    a, c = (round_operand(x, precision, out_dtype) for x in (jnp.asarray(a), jnp.asarray(c)))
    an, cn = a.ndim - ab, c.ndim - cb
    lfree = [i for i in range(an) if i not in lc and i not in lbd]
    rfree = [i for i in range(cn) if i not in rc and i not in rbd]
    nb, nl, nr = len(lbd), len(lfree), len(rfree)
    k = math.prod(a.shape[i] for i in lc)
    out = ([a.shape[i] for i in lbd] + [a.shape[i] for i in lfree]
           + [c.shape[i] for i in rfree] + [size])
    # Each operand as (batch, free, K[, systems]); its axes' places in `out`.
    a = _gather_axes(a, ab, list(lbd) + lfree, list(lc))
    c = _gather_axes(c, cb, list(rbd) + rfree, list(rc))
    a_dims = list(range(nb + nl)) + ([nb + nl + nr] if ab else [])
    c_dims = list(range(nb)) + list(range(nb + nl, nb + nl + nr)) + ([nb + nl + nr] if cb else [])
    if k == 0:
        return jnp.zeros(out, out_dtype)
    if k > UNROLL:
        kd = nb + nl + nr
        shape = out[:-1] + [k, size]
        prod = (lax.broadcast_in_dim(a, shape, _with_k(a_dims, kd, ab))
                * lax.broadcast_in_dim(c, shape, _with_k(c_dims, kd, cb)))
        return jnp.sum(prod, axis=kd)
    acc = None
    for j in range(k):
        term = (lax.broadcast_in_dim(lax.index_in_dim(a, j, nb + nl, keepdims=False), out, a_dims)
                * lax.broadcast_in_dim(lax.index_in_dim(c, j, nb + nr, keepdims=False), out,
                                       c_dims))
        acc = term if acc is None else acc + term
    return acc


def _with_k(dims, kd, batched):
    """Broadcast dimensions of a `(…, K[, systems])` operand into `(…, K, systems)`."""
    return dims[:-1] + [kd, kd + 1] if batched else dims + [kd]


def _gather_axes(x, batched, keep, contract):
    """`x` transposed to `(keep…, contract…[, systems])`, the contracted axes flattened."""
    perm = keep + contract + ([x.ndim - 1] if batched else [])
    x = lax.transpose(x, tuple(perm))
    k = math.prod(x.shape[len(keep):len(keep) + len(contract)])
    return lax.reshape(x, tuple(x.shape[:len(keep)]) + (k,) + ((x.shape[-1],) if batched else ()))


_RULES = {
    "broadcast_in_dim": _broadcast_in_dim, "reshape": _reshape, "transpose": _transpose,
    "slice": _slice, "concatenate": _concatenate, "pad": _pad,
    "dynamic_slice": _dynamic_slice, "dynamic_update_slice": _dynamic_update_slice,
    "dot_general": _dot_general
}
