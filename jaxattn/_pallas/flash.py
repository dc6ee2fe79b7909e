"""Mean-field attention as Pallas kernels for small head dimensions (flash attention).

`flash_attention` computes `jaxattn._blocks.blocked_attention`'s result in one kernel:
`block_q` queries per program (one lane each) sweep the keys `block_k` at a time, with
a custom VJP (FlashAttention-2's `dq` and `dk`, `dv` kernels); `flash_partial` and
`merge_partial` serve `shard="tokens"`'s ring. The offset and `rescale` stay the
caller's. Design and coverage: `docs/kernels.md`, "Mean-field attention as a kernel".
"""

import dataclasses
import functools
import numbers
import operator

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jaxtyping import Array, Float, Int

from .._kernel import AbstractKernel, as_kernel
from .._validate import refuse_first
from .call import pallas_run, power_of_two, warps_refusal


@dataclasses.dataclass(frozen=True)
class _Spec:
    """The static description of one flash attention (hashable, for the custom VJP):
    the kernel is a member of `AbstractKernel`, compared by its class and name (`kind`;
    its arrays, a sigmoid's bias, enter through the caller's `offset`)."""

    kernel: AbstractKernel = dataclasses.field(compare=False)
    kind: tuple
    causal: bool
    window: int | None
    bq: int
    bk: int
    warps: int


def _allowed(i, j, *, m, n, causal: bool, window, shift=0):
    """Which keys `j` queries `i` may see in a block pair: keys that exist (`j < m`,
    unless `m` is `None`: no padded keys), queries that exist (`i < n`, likewise), and
    the causal and window masks between the global positions `i + shift` and `j`
    (`shift`: how far the queries' first position lies past the keys'); `None` when
    every pair may (no test at all)."""
    tests = []
    if m is not None:
        tests.append(j[None, :] < m)
    if n is not None:
        tests.append(i[:, None] < n)
    lag = (i + shift)[:, None] - j[None, :]
    if causal:
        tests.append(lag >= 0)
    if window is not None:
        tests.append(jnp.abs(lag) < window)
    return functools.reduce(jnp.logical_and, tests) if tests else None


def _where(ok, x, fill):
    return x if ok is None else jnp.where(ok, x, fill)


def _lane_products(rows, cols):
    """`Σ_c rows[c][:, None] · cols[c][None, :]`, `(bq, bk)`: the product of two blocks
    stored as lanes (one vector per coordinate), summed coordinate by coordinate."""
    return functools.reduce(operator.add, (r[:, None] * c[None, :] for r, c in zip(rows, cols)))


def _pair(qs, ks, i, j, off, shift, spec, m, n=None):
    """`(s, ok)` of a block pair: the scores of query lanes `qs` against key lanes `ks`,
    clipped to the float range, then offset (as `jaxattn._blocks` orders them), and
    which pairs are allowed (`_allowed`; `m` keys and `n` queries before padding)."""
    big = float(jnp.finfo(qs[0].dtype).max)  # a literal: Triton negates no constant
    s = jnp.clip(_lane_products(qs, ks), -big, big) + off
    return s, _allowed(i, j, m=None if m % spec.bk == 0 else m,
                       n=None if n is None or n % spec.bq == 0 else n,
                       causal=spec.causal, window=spec.window, shift=shift)


def _forward_kernel(q_ref, k_ref, v_ref, off_ref, shift_ref, o_ref, lse_ref, *, spec, a, cv,
                    m):
    bq, bk, kernel = spec.bq, spec.bk, spec.kernel
    qs = [q_ref[c, :] for c in range(a)]
    off, shift = off_ref[0], shift_ref[0]
    i = pl.program_id(1) * bq + lax.iota(jnp.int32, bq)

    def body(jb, carry):
        mx, norm, acc = carry
        keys = pl.ds(jb * bk, bk)
        s, ok = _pair(qs, [k_ref[c, keys] for c in range(a)], i,
                      jb * bk + lax.iota(jnp.int32, bk), off, shift, spec, m)
        if kernel.normalised:  # the online softmax, one row's state in lanes
            s = _where(ok, s, -jnp.inf)
            new = jnp.maximum(mx, jnp.max(s, axis=1))
            safe = jnp.where(new == -jnp.inf, 0.0, new)
            p = jnp.exp(s - safe[:, None])
            scale = jnp.exp(mx - safe)
            norm = scale * norm + jnp.sum(p, axis=1)
        else:
            p = _where(ok, kernel.pointwise(s), 0.0)
            new, scale = mx, 1.0
        acc = tuple(scale * acc[c] + jnp.sum(p * v_ref[c, keys][None, :], axis=1)
                    for c in range(cv))
        return new, norm, acc

    zero = jnp.zeros((bq,), qs[0].dtype)
    mx, norm, acc = lax.fori_loop(0, pl.cdiv(m, bk), body,
                                  (jnp.full((bq,), -jnp.inf, zero.dtype), zero, (zero,) * cv))
    if kernel.normalised:
        # A row that sees no key (a padding row, or in a ring a share of keys all
        # masked for it) gives 0, its log-normaliser −∞ (it adds nothing when merged).
        seen = norm > 0
        for c in range(cv):
            o_ref[c, :] = jnp.where(seen, acc[c] / jnp.where(seen, norm, 1.0), 0.0)
        lse_ref[...] = jnp.where(seen, mx + jnp.log(jnp.where(seen, norm, 1.0)), -jnp.inf)
    else:
        for c in range(cv):
            o_ref[c, :] = acc[c]
        lse_ref[...] = zero


def _dq_kernel(q_ref, k_ref, v_ref, off_ref, shift_ref, lse_ref, do_ref, delta_ref, dq_ref,
               doff_ref, *, spec, a, cv, m):
    bq, bk = spec.bq, spec.bk
    qs = [q_ref[c, :] for c in range(a)]
    dos = [do_ref[c, :] for c in range(cv)]
    lse, delta, off, shift = lse_ref[...], delta_ref[...], off_ref[0], shift_ref[0]
    i = pl.program_id(1) * bq + lax.iota(jnp.int32, bq)

    def body(jb, carry):
        dq, doff = carry
        keys = pl.ds(jb * bk, bk)
        s, ok = _pair(qs, [k_ref[c, keys] for c in range(a)], i,
                      jb * bk + lax.iota(jnp.int32, bk), off, shift, spec, m)
        dp = _lane_products(dos, [v_ref[c, keys] for c in range(cv)])
        # the member's `block_grad` (its `a`: the rows' log-normaliser for softmax)
        _, ds = spec.kernel.block_grad(s, True if ok is None else ok, lse, lse, delta, dp)
        dq = tuple(dq[c] + jnp.sum(ds * k_ref[c, keys][None, :], axis=1) for c in range(a))
        return dq, doff + jnp.sum(ds, axis=1)

    zero = jnp.zeros((bq,), qs[0].dtype)
    dq, doff = lax.fori_loop(0, pl.cdiv(m, bk), body, ((zero,) * a, zero))
    for c in range(a):
        dq_ref[c, :] = dq[c]
    doff_ref[...] = doff


def _dkv_kernel(q_ref, k_ref, v_ref, off_ref, shift_ref, lse_ref, do_ref, delta_ref, dk_ref,
                dv_ref, *, spec, a, cv, m, n):
    bq, bk = spec.bq, spec.bk
    ks = [k_ref[c, :] for c in range(a)]
    vs = [v_ref[c, :] for c in range(cv)]
    off, shift = off_ref[0], shift_ref[0]
    j = pl.program_id(1) * bk + lax.iota(jnp.int32, bk)

    def body(ib, carry):
        dk, dv = carry
        rows = pl.ds(ib * bq, bq)
        qs = [q_ref[c, rows] for c in range(a)]
        dos = [do_ref[c, rows] for c in range(cv)]
        s, ok = _pair(qs, ks, ib * bq + lax.iota(jnp.int32, bq), j, off, shift, spec, m, n)
        lse = lse_ref[rows]
        p, ds = spec.kernel.block_grad(s, True if ok is None else ok, lse, lse,
                                       delta_ref[rows], _lane_products(dos, vs))
        dv = tuple(dv[c] + jnp.sum(p * dos[c][:, None], axis=0) for c in range(cv))
        dk = tuple(dk[c] + jnp.sum(ds * qs[c][:, None], axis=0) for c in range(a))
        return dk, dv

    zero = jnp.zeros((bk,), ks[0].dtype)
    dk, dv = lax.fori_loop(0, pl.cdiv(n, bq), body, ((zero,) * a, (zero,) * cv))
    for c in range(a):
        dk_ref[c, :] = dk[c]
    for c in range(cv):
        dv_ref[c, :] = dv[c]


def _pad_last(x, size):
    pad = size - x.shape[-1]
    return x if pad == 0 else jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)])


def _layout(q, k, v, spec):
    """Coordinates first (`(h, a, n)`), sequences padded to whole blocks; the block
    specs every kernel reads, by query block (`q_block`, `row`) with all keys."""
    h, n, a = q.shape
    g, m, cv = v.shape
    npad, mpad = pl.cdiv(n, spec.bq) * spec.bq, pl.cdiv(m, spec.bk) * spec.bk
    qt, kt, vt = (_pad_last(jnp.swapaxes(x, 1, 2), p) for x, p in ((q, npad), (k, mpad),
                                                                     (v, mpad)))
    group = h // g
    specs = dict(
        q_block=pl.BlockSpec((None, a, spec.bq), lambda hh, i: (hh, 0, i)),
        v_block=pl.BlockSpec((None, cv, spec.bq), lambda hh, i: (hh, 0, i)),
        k_all=pl.BlockSpec((None, a, mpad), lambda hh, i: (hh // group, 0, 0)),
        v_all=pl.BlockSpec((None, cv, mpad), lambda hh, i: (hh // group, 0, 0)),
        scalar=pl.BlockSpec((1,), lambda hh, i: (0,)),  # the offset, the shift
        row=pl.BlockSpec((None, spec.bq), lambda hh, i: (hh, i)))
    return qt, kt, vt, (h, g, a, cv, n, m, npad, mpad), specs


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _flash(q, k, v, offset, shift, spec):
    return _flash_fwd(q, k, v, offset, shift, spec)[0]


def _flash_fwd(q, k, v, offset, shift, spec):
    """The outputs `(h, n, c)` and log-normalisers `(h, n)`, with the residuals."""
    qt, kt, vt, (h, g, a, cv, n, m, npad, mpad), sp = _layout(q, k, v, spec)
    out, lse = pallas_run(
        functools.partial(_forward_kernel, spec=spec, a=a, cv=cv, m=m),
        (qt, kt, vt, offset.reshape(1), shift.reshape(1)), grid=(h, npad // spec.bq),
        in_specs=[sp["q_block"], sp["k_all"], sp["v_all"], sp["scalar"], sp["scalar"]],
        out_specs=[sp["v_block"], sp["row"]],
        out_shape=[jax.ShapeDtypeStruct((h, cv, npad), q.dtype),
                   jax.ShapeDtypeStruct((h, npad), q.dtype)],
        num_warps=spec.warps, name="flash_forward")
    return (jnp.swapaxes(out, 1, 2)[:, :n], lse[:, :n]), (q, k, v, offset, shift, out, lse)


def _flash_bwd(spec, res, cotangents):
    """FlashAttention-2's backward pass, with a cotangent on the log-normaliser too (a
    ring merges partial results by it): `∂lse/∂s = w`, so it enters as `Δ − dlse` in
    softmax's `w (dp − Δ)`; pointwise kernels have no log-normaliser."""
    q, k, v, offset, shift, out, lse = res
    dout, dlse = cotangents
    qt, kt, vt, (h, g, a, cv, n, m, npad, mpad), sp = _layout(q, k, v, spec)
    dot = _pad_last(jnp.swapaxes(dout, 1, 2), npad)
    delta = jnp.sum(dot * out, axis=1)  # (h, npad): Σ_c dout·out, softmax's row term
    if spec.kernel.normalised:
        delta = delta - _pad_last(dlse, npad)
    lse = jnp.where(jnp.isfinite(lse), lse, 0.0)  # rows that saw no key: every weight 0
    args = (qt, kt, vt, offset.reshape(1), shift.reshape(1), lse, dot, delta)
    common = dict(spec=spec, a=a, cv=cv, m=m)
    dq, doff = pallas_run(
        functools.partial(_dq_kernel, **common), args, grid=(h, npad // spec.bq),
        in_specs=[sp["q_block"], sp["k_all"], sp["v_all"], sp["scalar"], sp["scalar"],
                  sp["row"], sp["v_block"], sp["row"]],
        out_specs=[sp["q_block"], sp["row"]],
        out_shape=[jax.ShapeDtypeStruct((h, a, npad), q.dtype),
                   jax.ShapeDtypeStruct((h, npad), q.dtype)],
        num_warps=spec.warps, name="flash_dq")
    # Keys per head: a group's keys are read by `h / g` heads, their gradients summed.
    group = h // g

    def key_block(c, of_group=False):  # one block of keys (of the head's group)
        return pl.BlockSpec((None, c, spec.bk),
                            lambda hh, j: (hh // group if of_group else hh, 0, j))

    def every_query(*c):
        return pl.BlockSpec((None, *c, npad), lambda hh, j: (hh,) + (0,) * (len(c) + 1))
    dk, dv = pallas_run(
        functools.partial(_dkv_kernel, n=n, **common), args, grid=(h, mpad // spec.bk),
        in_specs=[every_query(a), key_block(a, True), key_block(cv, True), sp["scalar"],
                  sp["scalar"], every_query(), every_query(cv), every_query()],
        out_specs=[key_block(a), key_block(cv)],
        out_shape=[jax.ShapeDtypeStruct((h, a, mpad), q.dtype),
                   jax.ShapeDtypeStruct((h, cv, mpad), q.dtype)],
        num_warps=spec.warps, name="flash_dkv")
    dq = jnp.swapaxes(dq, 1, 2)[:, :n]
    dk = jnp.swapaxes(dk, 1, 2)[:, :m].reshape(g, group, m, a).sum(1)
    dv = jnp.swapaxes(dv, 1, 2)[:, :m].reshape(g, group, m, cv).sum(1)
    doff = jnp.sum(jnp.where(jnp.arange(npad) < n, doff, 0.0)).astype(offset.dtype)
    return dq, dk.astype(k.dtype), dv.astype(v.dtype), doff.reshape(offset.shape), None


_flash.defvjp(_flash_fwd, _flash_bwd)


def _checked(q, k, v, offset, kernel, causal, window, block_q, block_k, num_warps):
    """The arguments in one dtype and the static `_Spec`, or a one-line error."""
    kernel = as_kernel(kernel)
    refusals = [(not power_of_two(b), f"`{name}` must be a power of two, got {b!r}.")
                for name, b in (("block_q", block_q), ("block_k", block_k))]
    refusals += [
        warps_refusal(num_warps),
        # a window of 0 gave rows with no key: exact zeros for softmax, not an error
        (window is not None and (isinstance(window, bool)
                                 or not isinstance(window, numbers.Integral) or window < 1),
         f"`window` must be a whole number ≥ 1 (or None), got {window!r}."),
        (q.ndim != 3 or k.ndim != 3 or v.ndim != 3 or q.shape[0] % k.shape[0]
         or k.shape[:2] != v.shape[:2] or q.shape[2] != k.shape[2],
         f"expected q (h, n, a), k (g, m, a), v (g, m, c) with g dividing h; got {q.shape}, "
         f"{k.shape}, {v.shape}."),
        (not kernel.flash, f"the attention kernel runs softmax and pointwise kernels (exp, "
                           f"usa, sigmoid, …); got {kernel.name!r}: use the blocked XLA path.")]
    refuse_first(refusals)
    spec = _Spec(kernel, (type(kernel), kernel.name), bool(causal), window, int(block_q),
                 int(block_k), int(num_warps))
    dtype = jnp.result_type(q, k, v)
    return (q.astype(dtype), k.astype(dtype), v.astype(dtype), jnp.asarray(offset, dtype),
            spec)


def flash_attention(
    q: Float[Array, "h n a"], k: Float[Array, "g m a"], v: Float[Array, "g m c"],
    offset: Float[Array, ""] = 0.0, *, kernel: str | AbstractKernel = "softmax",
    causal: bool = False,
    window: int | None = None, block_q: int = 64, block_k: int = 64, num_warps: int = 4,
) -> Float[Array, "h n c"]:
    """`Σ_j w_ij v_j` per head as Pallas kernels: `jaxattn._blocks.blocked_attention`'s
    result for the same arguments (no boolean mask).

    **Arguments:**

    - `q`, `k`, `v`: queries `(h, n, a)` (any factor applied), keys `(g, m, a)` and
      values `(g, m, c)`, `g` dividing `h`.
    - `offset`: added to every score after clipping (the sigmoid's bias, usa's `−β`).
    - `kernel`: a member of the kernel family or its name: `"softmax"` (rows
      normalised) or a pointwise kernel (`"exp"`, `"usa"`, `"sigmoid"`, …: `f(s)`,
      unnormalised; its `rescale`, such as `1/n`, is the caller's).
    - `causal`, `window`: key masks as in `BlockSpec`.
    - `block_q`, `block_k`, `num_warps`: the layout (powers of two; Triton warps).

    **Returns:** `(h, n, c)`.
    """
    return flash_partial(q, k, v, offset, 0, kernel=kernel, causal=causal, window=window,
                         block_q=block_q, block_k=block_k, num_warps=num_warps)[0]


def flash_partial(
    q: Float[Array, "h n a"], k: Float[Array, "g m a"], v: Float[Array, "g m c"],
    offset: Float[Array, ""], shift: Int[Array, ""], *,
    kernel: str | AbstractKernel = "softmax", causal: bool = False,
    window: int | None = None, block_q: int = 64, block_k: int = 64, num_warps: int = 4,
) -> tuple[Float[Array, "h n c"], Float[Array, "h n"]]:
    """`flash_attention` over one share of the keys, for a ring (`jaxattn._blocks`'s
    `ring_attention`): the queries' global positions lie `shift` past the keys' (a
    traced int: `(query device − key device) × share`), for the causal and window
    masks. Returns the share's output and, for softmax, each row's log-normaliser
    (`−∞` where the row sees no key of the share; 0 for pointwise kernels), both
    differentiable: shares merge by `merge_partial`."""
    q, k, v, offset, spec = _checked(q, k, v, offset, kernel, causal, window, block_q,
                                     block_k, num_warps)
    return _flash(q, k, v, offset, jnp.asarray(shift, jnp.int32), spec)


def merge_partial(a: tuple[Array, Array], b: tuple[Array, Array], kernel: AbstractKernel
                  ) -> tuple[Array, Array]:
    """Two shares' `(output, log-normaliser)` as one: softmax's outputs weighted by
    their normalisers (`exp(lse − lse_total)`); pointwise kernels' outputs summed.
    `a`'s rows must each have seen a key (its `lse` finite): the ring starts from the
    device's own share, where every query sees itself."""
    (oa, la), (ob, lb) = a, b
    if not kernel.normalised:
        return oa + ob, la
    lse = jnp.logaddexp(la, lb)
    return (oa * jnp.exp(la - lse)[..., None] + ob * jnp.exp(lb - lse)[..., None], lse)
