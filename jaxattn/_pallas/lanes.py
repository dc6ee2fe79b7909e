"""A one-system program evaluated on lanes: every scalar a vector over a block of systems.

The model's one-system jaxpr is evaluated with each array a NumPy object array of its
one-system shape whose entries are `(block,)` vectors (one lane per system) or NumPy
constants (folded at trace time); threefry keys are pairs of `uint32` lanes. A
primitive without a rule raises `KernelUnsupported` at trace time. The design:
`docs/kernels.md`, "One implementation of the formulas".
"""

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._ensemble import CALLS, AbstractValues, interpret, round_operand
from .._validate import refuse_first


class KernelUnsupported(ValueError):
    """A one-system program uses an operation the lane evaluation has no rule for."""


_ELEMENTWISE = frozenset("""
abs acos acosh add and asin asinh atan atan2 atanh cbrt ceil clamp convert_element_type
cos cosh div eq erf erf_inv erfc exp exp2 expm1 floor ge gt integer_pow is_finite le
log log1p logistic lt max min mul ne neg nextafter not or pow reduce_precision rem round
rsqrt select_n shift_left shift_right_arithmetic shift_right_logical sign sin sinh sqrt
square sub tan tanh xor bitcast_convert_type
""".split())
_REDUCE = {"reduce_sum": lax.add, "reduce_max": lax.max, "reduce_min": lax.min,
           "reduce_prod": lax.mul, "reduce_and": lax.bitwise_and, "reduce_or": lax.bitwise_or}


class Key:
    """A threefry key of one system's shape `s`: its data, lanes of shape `s + (2,)`."""

    def __init__(self, data: np.ndarray):
        self.data = data


def is_lane(e) -> bool:
    """Whether an entry is a vector over the block (else a constant)."""
    return isinstance(e, jax.Array)


class Lanes:
    """How a block's vectors are made: `size` lanes, constants splat on demand."""

    def __init__(self, size: int):
        self.size = size
        self._splats: dict = {}

    def vec(self, e, dtype):
        """An entry as a vector of `dtype`: a lane as is, a constant splat (once per
        value: a `Lanes` serves one trace, one loop body)."""
        if is_lane(e):
            return e if e.dtype == dtype else lax.convert_element_type(e, dtype)
        c = np.asarray(e).astype(dtype)
        key = (c.tobytes(), np.dtype(dtype).str)
        if key not in self._splats:
            self._splats[key] = jnp.full((self.size,), c, dtype)
        return self._splats[key]


def trace(fn: Callable, *args) -> tuple[Any, Any]:
    """The closed jaxpr of `fn(*args)` for one system (arrays or ShapeDtypeStructs),
    and its output tree."""
    closed, shape = jax.make_jaxpr(fn, return_shape=True)(*args)
    return closed, jax.tree.structure(shape)


def evaluate(closed, ins: list, lanes: Lanes, consts: list | None = None) -> list:
    """Outputs of a closed jaxpr from inputs held as object arrays of lanes (or NumPy
    constants), as such object arrays; `consts` replace the jaxpr's own (a traced one
    loaded as lanes: `ensemble.run_ensemble`)."""
    return interpret(closed.jaxpr, closed.consts if consts is None else consts, ins,
                     _LaneValues(lanes))


def _constant(value) -> bool:
    if isinstance(value, Key):
        return False
    return value.dtype != object or not any(is_lane(e) for e in value.flat)


class _LaneValues(AbstractValues):
    """Object arrays of one system's shape whose entries are lanes or NumPy constants."""

    def __init__(self, lanes: Lanes):
        self.lanes = lanes

    def constant(self, value):
        return value if isinstance(value, Key) else np.asarray(value)  # a traced key stays one

    def fold(self, eqn, ins):
        prim, name = eqn.primitive, eqn.primitive.name
        # Calls are evaluated in place; random draws always run on lanes.
        if name in CALLS or name.startswith("random_") or not all(map(_constant, ins)):
            return None
        with jax.ensure_compile_time_eval():
            args = [np.asarray(v, dtype=var.aval.dtype) for v, var in zip(ins, eqn.invars)]
            out = prim.bind(*args, **prim.get_bind_params(eqn.params))
        return [np.asarray(o) for o in (out if prim.multiple_results else [out])]

    def apply(self, eqn, ins):
        name = eqn.primitive.name
        if name not in _RULES:
            raise KernelUnsupported(f"strategy='kernel' has no rule for the operation "
                                    f"`{name}` of this model's program: use "
                                    "strategy=ja.BatchLast() ('fused').")
        out = _RULES[name](eqn, ins, self.lanes, **eqn.params)
        return out if eqn.primitive.multiple_results else [out]


def objects(entries, shape) -> np.ndarray:
    """An object array of `shape` holding `entries` (lanes, NumPy scalars) in row-major
    order (entry by entry: NumPy would stack a list of lanes)."""
    out = np.empty(len(entries), object)
    for i, e in enumerate(entries):
        out[i] = e
    return out.reshape(shape)


def _entries(value, shape=None):
    """`value` (object or constant array) broadcast to `shape` (its own by default), as
    an object array (a constant's entries NumPy scalars, keeping their dtype)."""
    arr = np.asarray(value)
    if arr.dtype != object:
        arr = objects(list(arr.flat), arr.shape)
    return arr if shape is None else np.broadcast_to(arr, shape)


def call_entry(fn, args, dtypes, lanes):
    """`fn` (lax functions) of one entry of each operand: on lanes, or on constants
    folded now."""
    if not any(is_lane(a) for a in args):
        with jax.ensure_compile_time_eval():
            out = fn(*[jnp.asarray(np.asarray(a, dt)) for a, dt in zip(args, dtypes)])
        return np.asarray(out)[()]
    return fn(*[lanes.vec(a, dt) for a, dt in zip(args, dtypes)])


def _elementwise(eqn, ins, lanes, fn):
    """An elementwise operation, `fn` of lax functions, entry by entry."""
    shape = eqn.outvars[0].aval.shape
    dtypes = [v.aval.dtype for v in eqn.invars]
    ops = [_entries(v, shape) for v in ins]
    out = np.empty(shape, object)
    for idx in np.ndindex(shape):
        args = [o[idx] for o in ops]
        if eqn.primitive is lax.select_n_p and not is_lane(args[0]):
            out[idx] = args[1 + int(args[0])]  # a constant predicate picks its case now
            continue
        out[idx] = call_entry(fn, args, dtypes, lanes)
    return out


def _bound(eqn, ins, lanes, **params):
    """An elementwise primitive of the program, entry by entry."""
    params = eqn.primitive.get_bind_params(params)
    return _elementwise(eqn, ins, lanes, lambda *a: eqn.primitive.bind(*a, **params))


def _is_finite(eqn, ins, lanes):
    """`is_finite` as a comparison, which every Pallas GPU backend lowers."""
    return _elementwise(eqn, ins, lanes, lambda x: lax.le(
        lax.abs(x), jnp.asarray(jnp.finfo(x.dtype).max, x.dtype)))


def _reduce(eqn, ins, lanes, *, binary, axes, **_):
    dtype = eqn.outvars[0].aval.dtype
    arr = _entries(ins[0])
    keep = [a for a in range(arr.ndim) if a not in axes]
    arr = np.transpose(arr, keep + list(axes))
    out_shape = arr.shape[:len(keep)]
    flat = arr.reshape(out_shape + (-1,))
    out = np.empty(out_shape, object)
    for idx in np.ndindex(out_shape):
        out[idx] = functools.reduce(
            lambda a, b: call_entry(binary, [a, b], [dtype, dtype], lanes), flat[idx])
    return out


def _broadcast_in_dim(eqn, ins, lanes, shape, broadcast_dimensions, **_):
    v = _entries(ins[0])
    expanded = np.ones(len(shape), int)
    for i, d in enumerate(broadcast_dimensions):
        expanded[d] = v.shape[i]
    return np.broadcast_to(v.reshape(tuple(expanded)), tuple(shape))


def _reshape(eqn, ins, lanes, new_sizes, dimensions=None, **_):
    v = _entries(ins[0])
    if dimensions is not None:
        v = np.transpose(v, dimensions)
    return v.reshape(tuple(new_sizes))


def _slice(eqn, ins, lanes, start_indices, limit_indices, strides):
    strides = strides or (1,) * len(start_indices)
    index = tuple(slice(a, b, s) for a, b, s in zip(start_indices, limit_indices, strides))
    return _entries(ins[0])[index]


def _window(idx, shape, sizes, what) -> tuple:
    """The slices of a dynamic slice or update at fixed indices, clamped as XLA clamps."""
    if not all(_constant(i) for i in idx):
        raise KernelUnsupported(f"strategy='kernel' takes {what} at fixed indices only "
                                "(a PiecewiseConstant schedule indexes its stack by time): "
                                "use strategy=ja.BatchLast() ('fused').")
    start = [min(max(int(np.asarray(i)), 0), n - k) for i, n, k in zip(idx, shape, sizes)]
    return tuple(slice(s, s + k) for s, k in zip(start, sizes))


def _dynamic_slice(eqn, ins, lanes, slice_sizes):
    v = _entries(ins[0])
    return v[_window(ins[1:], v.shape, slice_sizes, "dynamic slices")]


def _dynamic_update_slice(eqn, ins, lanes):
    out, u = np.array(_entries(ins[0])), _entries(ins[1])
    out[_window(ins[2:], out.shape, u.shape, "dynamic updates")] = u
    return out


def _dot_general(eqn, ins, lanes, dimension_numbers, precision=None, **_):
    """Products summed over the contracted index, in order, at the named precision."""
    (lc, rc), (lb, rb) = dimension_numbers
    out_dtype = eqn.outvars[0].aval.dtype
    a, c = (_entries(v) for v in ins)
    a = _rounded(a, eqn.invars[0].aval.dtype, precision, out_dtype, lanes)
    c = _rounded(c, eqn.invars[1].aval.dtype, precision, out_dtype, lanes)
    lfree = [i for i in range(a.ndim) if i not in lc and i not in lb]
    rfree = [i for i in range(c.ndim) if i not in rc and i not in rb]
    a = np.transpose(a, list(lb) + lfree + list(lc))
    c = np.transpose(c, list(rb) + rfree + list(rc))
    nb = len(lb)
    k = int(np.prod([a.shape[i] for i in range(nb + len(lfree), a.ndim)]))
    a = a.reshape(a.shape[:nb + len(lfree)] + (k,))
    c = c.reshape(c.shape[:nb + len(rfree)] + (k,))
    shape = a.shape[:-1] + c.shape[nb:-1]
    out = np.empty(shape, object)
    dt = [out_dtype, out_dtype]
    for idx in np.ndindex(shape):
        bi, li, ri = idx[:nb], idx[nb:nb + len(lfree)], idx[nb + len(lfree):]
        acc = None
        for j in range(k):
            term = call_entry(lax.mul, [a[bi + li + (j,)], c[bi + ri + (j,)]], dt, lanes)
            acc = term if acc is None else call_entry(lax.add, [acc, term], dt, lanes)
        out[idx] = np.zeros((), out_dtype)[()] if acc is None else acc
    return out


def _rounded(v, dtype, precision, out_dtype, lanes):
    """Each entry as `round_operand` presents it to a product (a constant stays one)."""
    out = np.empty(v.shape, object)
    for idx in np.ndindex(v.shape):
        out[idx] = call_entry(lambda e: round_operand(e, precision, out_dtype), [v[idx]],
                              [dtype], lanes)
    return out


def threefry2x32(k1, k2, x1, x2, lanes):
    """The threefry-2x32 hash (20 rounds) of counters `(x1, x2)` under key `(k1, k2)`,
    on `uint32` lanes or constants: the function `jax.random`'s threefry keys use."""
    u32 = jnp.uint32
    xor = functools.partial(_bin, lax.bitwise_xor, lanes)
    add = functools.partial(_bin, lax.add, lanes)
    ks = [k1, k2, xor(xor(k1, k2), np.uint32(0x1BD11BDA))]
    rotations = ((13, 15, 26, 6), (17, 29, 16, 24))
    x = [add(x1, ks[0]), add(x2, ks[1])]
    for i in range(5):
        for r in rotations[i % 2]:
            x[0] = add(x[0], x[1])
            left = _bin(lax.shift_left, lanes, x[1], np.uint32(r))
            right = _bin(lax.shift_right_logical, lanes, x[1], np.uint32(32 - r))
            x[1] = xor(x[0], _bin(lax.bitwise_or, lanes, left, right))
        x = [add(x[0], ks[(i + 1) % 3]), add(add(x[1], ks[(i + 2) % 3]), u32(i + 1))]
    return x[0], x[1]


def _bin(fn, lanes, a, b):
    return call_entry(fn, [a, b], [jnp.uint32, jnp.uint32], lanes)


def _random_wrap(eqn, ins, lanes, impl):
    name = str(getattr(impl, "name", impl))
    if "fry" not in name:
        raise KernelUnsupported(f"strategy='kernel' draws noise with threefry keys only, got "
                                f"key implementation {name!r}: use jax.random.key (default).")
    return Key(_entries(ins[0]))


def _random_fold_in(eqn, ins, lanes):
    key, data = ins
    data = _entries(data, key.data.shape[:-1])
    out = np.empty(key.data.shape, object)
    for idx in np.ndindex(key.data.shape[:-1]):
        d = data[idx]
        d = lax.convert_element_type(d, jnp.uint32) if is_lane(d) else np.uint32(d)
        out[idx + (0,)], out[idx + (1,)] = threefry2x32(
            key.data[idx + (0,)], key.data[idx + (1,)], np.uint32(0), d, lanes)
    return Key(out)


def _random_bits(eqn, ins, lanes, bit_width, shape):
    """`jax.random.bits` of a threefry key (partitionable counters: the row-major index
    as high and low words)."""
    key, = ins
    refuse_first(((refused, f"strategy='kernel' {message}") for refused, message in (
            (key.data.shape != (2,), "draws from one key per system."),
            # JAX's default, and the only mode once the flag is gone.
            (not getattr(jax.config, "jax_threefry_partitionable", True),
             "draws noise with jax_threefry_partitionable=True (JAX's default)."),
            (bit_width not in (32, 64), f"draws 32- or 64-bit noise, not {bit_width}-bit."))),
        KernelUnsupported)
    k1, k2 = key.data
    out = np.empty(tuple(shape), object)
    for i, idx in enumerate(np.ndindex(tuple(shape))):
        y1, y2 = threefry2x32(k1, k2, np.uint32(i >> 32), np.uint32(i & 0xFFFFFFFF), lanes)
        if bit_width == 32:
            out[idx] = _bin(lax.bitwise_xor, lanes, y1, y2)
        else:
            u64 = jnp.uint64
            wide = functools.partial(lax.convert_element_type, new_dtype=u64)
            hi = call_entry(wide, [y1], [jnp.uint32], lanes)
            lo = call_entry(wide, [y2], [jnp.uint32], lanes)
            hi = call_entry(lax.shift_left, [hi, np.uint64(32)], [u64, u64], lanes)
            out[idx] = call_entry(lax.bitwise_or, [hi, lo], [u64, u64], lanes)
    return out


def _copy(eqn, ins, lanes, **_):
    return ins[0]


_RULES = {
    "broadcast_in_dim": _broadcast_in_dim, "reshape": _reshape, "slice": _slice,
    "transpose": lambda eqn, ins, lanes, permutation: np.transpose(_entries(ins[0]),
                                                                   permutation),
    "squeeze": lambda eqn, ins, lanes, dimensions: np.squeeze(_entries(ins[0]),
                                                              tuple(dimensions)),
    "rev": lambda eqn, ins, lanes, dimensions: np.flip(_entries(ins[0]), tuple(dimensions)),
    "concatenate": lambda eqn, ins, lanes, dimension: np.concatenate(
        [_entries(v) for v in ins], axis=dimension),
    "dynamic_slice": _dynamic_slice, "dynamic_update_slice": _dynamic_update_slice,
    # A kernel is not differentiated: stop_gradient is the identity in it.
    "copy": _copy, "copy_p": _copy, "stop_gradient": _copy, "dot_general": _dot_general,
    "random_wrap": _random_wrap, "random_unwrap": lambda eqn, ins, lanes: ins[0].data,
    "random_fold_in": _random_fold_in, "random_bits": _random_bits, "is_finite": _is_finite,
    **{name: _bound for name in _ELEMENTWISE - {"is_finite"}},
    **{name: functools.partial(_reduce, binary=binary) for name, binary in _REDUCE.items()},
}
