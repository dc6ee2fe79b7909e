"""Attention over key blocks: the online softmax, never the `n × n` matrix.

`blocked_attention(q, k, v, offset, mask, spec)` computes `Σ_j w_ij v_j` for every
query with `w` the weights of `spec.kernel` (which owns its pieces of the sweep):
queries `spec.block_q` at a time (`lax.map`), keys `spec.block_k` at a time
(`lax.scan`). Reverse mode is a custom VJP recomputing each block's scores (`O(n)`
memory); `forward_mode=True` differentiates the sweep itself. How and why, with the
measured equality to the dense path: `docs/mean_field.md`.
"""

import contextlib
import functools

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Bool, Float, Int

from ._kernel import AbstractKernel, as_kernel, static_part
from ._precision import einsum
from ._validate import refuse_first

#: Score elements of one block pair (`h × block_q × block_k`) the automatic query
#: block aims at: a few MB, so a block's scores, weights and products stay in cache.
BLOCK_ELEMENTS = 2**20

#: Keys per block when `block_size=None` chooses blocks.
DEFAULT_BLOCK = 512


class BlockSpec(eqx.Module):
    """The static description of one blocked attention: kernel, blocks, key masks.

    **Arguments:**

    - `kernel`: a member of `ja.AbstractKernel` without its array parameters
      (`block_spec` strips them: they enter through the offset); its `rescale` (such
      as `exp`'s `1/n`) and its `offset` are the caller's.
    - `block_q`, `block_k`: queries and keys per block.
    - `causal`: query `i` sees key `j` only when `j ≤ i`.
    - `window`: and only when `|i − j| < window` (`None`: no window).
    - `has_mask`: a boolean `(n, m)` mask is passed (its diagonal forced on).
    - `precision`: of the products (`jaxattn._precision`).
    - `forward_mode`: differentiate the sweep as JAX does (forward and reverse
      mode) instead of through the custom VJP (reverse mode only, `O(n)` memory).
    """

    kernel: AbstractKernel = eqx.field(static=True)
    block_q: int = eqx.field(static=True)
    block_k: int = eqx.field(static=True)
    causal: bool = eqx.field(static=True, default=False)
    window: int | None = eqx.field(static=True, default=None)
    has_mask: bool = eqx.field(static=True, default=False)
    precision: str = eqx.field(static=True, default="float32")
    forward_mode: bool = eqx.field(static=True, default=False)


def block_spec(kernel: AbstractKernel | str, n: int, m: int, heads: int, block_k: int, *,
               causal=False, window=None, has_mask=False, precision="float32",
               forward_mode=False) -> BlockSpec:
    """A `BlockSpec` with `block_k` keys per block (at most `m`, the key count) and as
    many queries per block as keep a block pair near `BLOCK_ELEMENTS` score elements;
    `kernel` a member of `ja.AbstractKernel` or its name."""
    block_k = max(1, min(block_k, m))
    block_q = max(1, min(n, BLOCK_ELEMENTS // (heads * block_k)))
    return BlockSpec(static_part(as_kernel(kernel)), block_q, block_k, causal, window, has_mask,
                     precision, forward_mode)


def blocked_attention(
    q: Float[Array, "h n a"], k: Float[Array, "g m a"], v: Float[Array, "g m c"],
    offset: Float[Array, ""], mask: Bool[Array, "n m"] | None, spec: BlockSpec,
) -> Float[Array, "h n c"]:
    """`Σ_j w_ij v_j` per head, in key blocks (the module docstring).

    **Arguments:**

    - `q`: the queries, `(h, n, a)`, any factor (`β`, a scale) already applied.
    - `k`, `v`: the keys `(g, m, a)` and values `(g, m, c)`, `g` dividing `h`.
    - `offset`: a scalar added to every score after clipping (the sigmoid's bias;
      `0` otherwise); differentiable.
    - `mask`: a boolean `(n, m)` array, `True` where `i` may see `j`, or `None`.
    - `spec`: the kernel, blocks and key masks (`block_spec`).

    **Returns:**

    `(h, n, c)`: for softmax the weights sum to one over the keys a query sees;
    `sigmoid` and `exp` are not normalised (masked weights are 0). On CUDA the sweep
    is the Pallas flash kernel where it applies (`use_flash`).
    """
    if mask is None:
        mask = jnp.zeros((0, 0), bool)
    offset = jnp.asarray(offset, q.dtype)
    if spec.forward_mode:
        return _forward(q, k, v, offset, mask, spec)[0]
    route = _flash_route(spec, max(q.shape[2], v.shape[2]))
    if route is None:
        return _attend(q, k, v, offset, mask, spec)
    flash = functools.partial(_flash, spec=spec)
    if route == "always":
        return flash(q, k, v, offset)
    return lax.platform_dependent(q, k, v, offset, cuda=flash,
                                  default=lambda *a: _attend(*a, mask, spec))


#: Where `blocked_attention` runs the Pallas flash kernel (`jaxattn._pallas.flash`), for the
#: specs it takes: a mode of `FLASH_MODES` (`docs/kernels.md`; `"cuda"` is chosen at
#: lowering, `lax.platform_dependent`) and a layout. The last entry holds (`use_flash`);
#: it is read when a program is traced, so a function traced before keeps its choice.
_FLASH = [{"mode": "auto", "block_q": 64, "block_k": 64, "num_warps": 4}]
FLASH_MODES = ("auto", "cuda", "always", "never")
#: The largest head dimension the kernel takes on its own (`"cuda"`, `"auto"`): it
#: unrolls the coordinates, where at larger ones XLA's products run on tensor cores.
FLASH_MAX_DIM = 16


@contextlib.contextmanager
def use_flash(mode: str | None = None, **layout):
    """Within the block, `blocked_attention` takes the flash kernel per `mode` (see
    `_FLASH`) with its layout changed (`block_q`, `block_k`, `num_warps`)."""
    from ._pallas.call import power_of_two, warps_refusal

    unknown = sorted(set(layout) - {"block_q", "block_k", "num_warps"})
    refuse_first(((mode is not None and mode not in FLASH_MODES,
                   f"`mode` must be one of {FLASH_MODES}, got {mode!r}."),
                  (unknown, f"unknown flash layout field {', '.join(map(repr, unknown))}."),
                  # checked here, not at the first flash call inside a program
                  *((not power_of_two(layout[b]), f"`{b}` must be a power of two, got "
                     f"{layout[b]!r}.") for b in ("block_q", "block_k") if b in layout),
                  *([warps_refusal(layout["num_warps"])] if "num_warps" in layout else [])))
    _FLASH.append({**_FLASH[-1], **layout, **({"mode": mode} if mode else {})})
    try:
        yield dict(_FLASH[-1])
    finally:
        _FLASH.pop()


def _flash_route(spec: BlockSpec, dim: int) -> str | None:
    """`"always"`, `"cuda"` or `None` (the XLA sweep alone): the flash kernel takes
    the kernels that declare `flash` (softmax and the pointwise ones) with causal and
    window masks at true float32 products, no boolean mask, and (unless `"always"`)
    head and value dimensions `dim` up to `FLASH_MAX_DIM`."""
    mode = _FLASH[-1]["mode"]
    if mode == "auto":
        mode = "cuda" if jax.default_backend() == "gpu" else "never"
    if mode == "never" or spec.has_mask or spec.precision != "float32" \
            or not spec.kernel.flash \
            or (mode == "cuda" and dim > FLASH_MAX_DIM):
        return None
    return mode


def _flash_options(spec: BlockSpec, n: int, m: int) -> dict:
    """The flash kernel's keywords for `n` queries and `m` keys: `spec`'s kernel and
    masks, `use_flash`'s layout with blocks no larger than the sequences need (16 at
    least: Triton)."""
    layout = _FLASH[-1]

    def block(size, count):
        return min(size, max(16, 1 << max(0, (count - 1).bit_length())))
    return dict(kernel=spec.kernel, causal=spec.causal, window=spec.window,
                block_q=block(layout["block_q"], n), block_k=block(layout["block_k"], m),
                num_warps=layout["num_warps"])


def _flash(q, k, v, offset, *, spec: BlockSpec):
    from ._pallas.flash import flash_attention  # Pallas imported on the kernel's first use
    return flash_attention(q, k, v, offset, **_flash_options(spec, q.shape[1], k.shape[1]))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _attend(q, k, v, offset, mask, spec):
    return _forward(q, k, v, offset, mask, spec)[0]


def _attend_fwd(q, k, v, offset, mask, spec):
    out, lse = _forward(q, k, v, offset, mask, spec)
    return out, (q, k, v, offset, mask, out, lse)


def _attend_bwd(spec, res, dout):
    q, k, v, offset, mask, out, lse = res
    return (*_backward(q, k, v, offset, mask, out, lse, dout, spec), None)  # no mask cotangent


_attend.defvjp(_attend_fwd, _attend_bwd)


def _pad_to(x: Array, axis: int, size: int) -> Array:
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, pad)


def _query_blocks(q: Float[Array, "h n a"], g: int, bq: int) -> Float[Array, "nq g r bq a"]:
    h, n, a = q.shape
    nq = -(-n // bq)
    q = _pad_to(q, 1, nq * bq).reshape(g, h // g, nq, bq, a)
    return jnp.moveaxis(q, 2, 0)


def _key_blocks(k: Float[Array, "g m a"], bk: int) -> Float[Array, "nk g bk a"]:
    g, m, a = k.shape
    nk = -(-m // bk)
    return jnp.moveaxis(_pad_to(k, 1, nk * bk).reshape(g, nk, bk, a), 1, 0)


def _from_query_blocks(x: Float[Array, "nq g r bq ..."], n: int) -> Float[Array, "h n ..."]:
    nq, g, r, bq = x.shape[:4]
    x = jnp.moveaxis(x, 0, 2).reshape((g * r, nq * bq) + x.shape[4:])
    return x[:, :n]


def _visible(spec: BlockSpec, mask: Bool[Array, "n m"], i: Int[Array, " bq"],
             j: Int[Array, " bk"], m: int, row0=0) -> Bool[Array, "bq bk"]:
    """Which keys `j` each query `i` of a block pair may see (padding, `j ≥ m`,
    never); `mask` holds the rows from `row0` on (a device's share of the queries)."""
    ok = jnp.broadcast_to(j[None, :] < m, (i.shape[0], j.shape[0]))
    if spec.causal:
        ok = ok & (j[None, :] <= i[:, None])
    if spec.window is not None:
        ok = ok & (jnp.abs(i[:, None] - j[None, :]) < spec.window)
    if spec.has_mask:
        n = mask.shape[0]
        rows = jnp.take(mask, jnp.clip(i - row0, 0, n - 1), axis=0)
        given = jnp.take(rows, jnp.minimum(j, m - 1), axis=1)
        ok = ok & (given | (i[:, None] == j[None, :]))
    return ok


def _scores(qb, kb, offset, spec: BlockSpec):
    """A block pair's clipped scores `(g, r, bq, bk)` and where the clip held them."""
    s = einsum("grqa,gka->grqk", qb, kb, precision=spec.precision)
    big = jnp.finfo(s.dtype).max
    inside = jnp.abs(s) < big
    return jnp.clip(s, -big, big) + offset, inside


def _forward(q, k, v, offset, mask, spec: BlockSpec):
    h, n, _ = q.shape
    g, m, c = v.shape
    qs, q_index = _query_blocks(q, g, spec.block_q), _block_index(n, spec.block_q)
    state = _sweep(_empty(qs, c), qs, q_index, k, v, jnp.zeros((), jnp.int32), offset, mask,
                   spec, m)
    # The outputs, and what the backward pass reads of each row (softmax's
    # log-normaliser, hardmax's top score and tie count).
    out, (lse, norm) = spec.kernel.block_finish(state)
    return _from_query_blocks(out, n), (_from_query_blocks(lse, n),
                                        _from_query_blocks(norm, n))


def _block_index(n: int, size: int) -> Int[Array, "blocks size"]:
    """The positions `0, 1, …` of `n` items cut into blocks of `size` (padding past `n`)."""
    blocks = -(-n // size)
    return jnp.arange(blocks * size).reshape(blocks, size)


def _empty(qs: Float[Array, "nq g r bq a"], c: int):
    """The running state of every query row before any key: `(top, norm, acc)`
    (softmax's running maximum and normaliser; 0 for the other kernels)."""
    rows = qs.shape[:-1]
    return (jnp.full(rows, -jnp.inf, qs.dtype), jnp.zeros(rows, qs.dtype),
            jnp.zeros(rows + (c,), qs.dtype))


def _sweep(state, qs, q_index, k, v, k0, offset, mask, spec: BlockSpec, m: int, row0=0):
    """The state of every query block after the keys `k`, `v` (global positions from
    `k0`, `m` keys in all), `spec.block_k` at a time."""
    ks, vs = _key_blocks(k, spec.block_k), _key_blocks(v, spec.block_k)
    local = _block_index(k.shape[1], spec.block_k)
    k_index = jnp.where(local < k.shape[1], k0 + local, m)  # padding: never seen

    def query_block(args):
        qb, i, carry = args

        def step(carry, blk):
            kb, vb, j = blk
            s, _ = _scores(qb, kb, offset, spec)
            ok = jnp.broadcast_to(_visible(spec, mask, i, j, m, row0), s.shape)

            def mix(w):
                return einsum("grqk,gkc->grqc", w, vb, precision=spec.precision)
            return spec.kernel.block_update(carry, s, ok, mix), None

        return lax.scan(step, carry, (ks, vs, k_index))[0]

    return lax.map(query_block, (qs, q_index, state))


def ring_attention(
    q: Float[Array, "h n a"], k: Float[Array, "g m a"], v: Float[Array, "g m c"],
    offset: Float[Array, ""], mask: Bool[Array, "n m"] | None, spec: BlockSpec, mesh,
) -> Float[Array, "h n c"]:
    """`blocked_attention` with the tokens split over the devices of `mesh` (its first
    axis), as ring attention: each device keeps its share of the queries and passes
    its keys and values to the next device, `D` times (`jax.shard_map`,
    `lax.ppermute`), folding each share into the running state of its queries. The
    token count must be a multiple of `D`; `spec`'s blocks are a device's share at
    most. Memory per device: `O(n / D)`. Reverse mode differentiates through the
    ring (its blocks' scores are then stored, not recomputed).

    Where `blocked_attention` takes the flash kernel (`use_flash`), each device runs
    it on every share it receives (`_ring_flash`), and reverse mode recomputes the
    blocks as the kernel's own backward pass does."""
    axis = mesh.axis_names[0]
    devices = mesh.devices.size
    split = jax.sharding.PartitionSpec(None, axis)
    rows = jax.sharding.PartitionSpec(axis, None)
    offset = jnp.asarray(offset, q.dtype)
    if mask is None:
        mask = jnp.zeros((devices, 0), bool)

    def sweep(q, k, v, offset, mask):
        p = lax.axis_index(axis)
        g, share, c = v.shape
        qs = _query_blocks(q, g, spec.block_q)
        q_index = p * share + _block_index(share, spec.block_q)
        ring = [(i, (i + 1) % devices) for i in range(devices)]

        def step(carry, hop):
            state, k, v = carry
            owner = (p - hop) % devices
            state = _sweep(state, qs, q_index, k, v, owner * share, offset, mask, spec,
                           share * devices, p * share)
            return (state, lax.ppermute(k, axis, ring), lax.ppermute(v, axis, ring)), None

        (state, _, _), _ = lax.scan(step, (_empty(qs, c), k, v), jnp.arange(devices))
        return _from_query_blocks(spec.kernel.block_finish(state)[0], q.shape[1])

    local = sweep
    route = None if spec.forward_mode else _flash_route(spec, max(q.shape[2], v.shape[2]))
    if route is not None:
        flash = functools.partial(_ring_flash, spec=spec, axis=axis, devices=devices)
        local = flash if route == "always" else (
            lambda *a: lax.platform_dependent(*a, cuda=flash, default=sweep))
    return jax.shard_map(local, mesh=mesh, in_specs=(split, split, split,
                                                     jax.sharding.PartitionSpec(), rows),
                         out_specs=split, check_vma=False)(q, k, v, offset, mask)


def _ring_flash(q, k, v, offset, mask, *, spec: BlockSpec, axis, devices: int):
    """One device's part of `ring_attention` with the flash kernel: its own share of
    keys first (every query sees itself there, so each row's log-normaliser is finite
    from the start), then each share passed around the ring, merged by the kernel's
    log-normalisers (`flash_partial`, `merge_partial`)."""
    from ._pallas.flash import flash_partial, merge_partial
    del mask  # the flash route takes no boolean mask
    p = lax.axis_index(axis)
    share = k.shape[1]
    options = _flash_options(spec, q.shape[1], share)
    ring = [(i, (i + 1) % devices) for i in range(devices)]

    def attend(k, v, owner):
        return flash_partial(q, k, v, offset, (p - owner) * share, **options)

    def step(carry, hop):
        acc, k, v = carry
        k, v = lax.ppermute(k, axis, ring), lax.ppermute(v, axis, ring)
        return (merge_partial(acc, attend(k, v, (p - hop) % devices), spec.kernel), k, v), None

    (acc, _, _), _ = lax.scan(step, (attend(k, v, p), k, v), jnp.arange(1, devices))
    return acc[0]


def _backward(q, k, v, offset, mask, out, lse, dout, spec: BlockSpec):
    h, n, a = q.shape
    g, m, c = v.shape
    qs, ks, vs = _query_blocks(q, g, spec.block_q), _key_blocks(k, spec.block_k), \
        _key_blocks(v, spec.block_k)
    dos = _query_blocks(dout, g, spec.block_q)
    lses, counts, deltas = (_query_blocks(row[..., None], g, spec.block_q)[..., 0]
                            for row in (*lse, jnp.sum(dout * out, -1)))
    key_index, query_index = _block_index(m, spec.block_k), _block_index(n, spec.block_q)
    prec = spec.precision

    def query_block(carry, args):
        dk, dv, doff = carry
        qb, dob, lb, cb, db, i = args

        def step(inner, blk):
            dqb, doffb = inner
            kb, vb, j = blk
            s, inside = _scores(qb, kb, offset, spec)
            ok = jnp.broadcast_to(_visible(spec, mask, i, j, m), s.shape)
            dp = einsum("grqc,gkc->grqk", dob, vb, precision=prec)
            w, ds = spec.kernel.block_grad(s, ok, lb, cb, db, dp)
            ds = jnp.where(inside, ds, 0)
            dqb = dqb + einsum("grqk,gka->grqa", ds, kb, precision=prec)
            # Key-side sums with the key axis last: XLA's CPU dot writes (a, k) far
            # faster than (k, a) (BENCHMARKS.md, measured claims).
            dkb = einsum("grqk,grqa->gak", ds, qb, precision=prec).swapaxes(-1, -2)
            dvb = einsum("grqk,grqc->gck", w, dob, precision=prec).swapaxes(-1, -2)
            return (dqb, doffb + ds.sum()), (dkb, dvb)

        zero = jnp.zeros((), q.dtype)
        (dqb, doffb), (dkb, dvb) = lax.scan(step, (jnp.zeros_like(qb), zero),
                                            (ks, vs, key_index))
        return (dk + dkb, dv + dvb, doff + doffb), dqb

    init = (jnp.zeros_like(ks), jnp.zeros_like(vs), jnp.zeros((), q.dtype))
    (dk, dv, doff), dq = lax.scan(query_block, init,
                                  (qs, dos, lses, counts, deltas, query_index))
    dk = jnp.moveaxis(dk, 0, 1).reshape(g, -1, a)[:, :m]
    dv = jnp.moveaxis(dv, 0, 1).reshape(g, -1, c)[:, :m]
    return _from_query_blocks(dq, n), dk, dv, doff


def dense_bytes(heads: int, n: int, itemsize: int) -> int:
    """The bytes of one `(h, n, n)` score array: what the dense path holds several of."""
    return heads * n * n * itemsize


def blocks_needed(heads: int, n: int, itemsize: int, limit: int) -> bool:
    """Whether the dense path's scores would exceed `limit` bytes."""
    return dense_bytes(heads, n, itemsize) > limit

