"""Mean-field attention as Pallas kernels for small head dimensions (flash attention).

At mean-field scale (one system of `n = 10⁶` tokens in R³) attention is the whole
cost, and neither cuDNN's nor XLA's fused attention takes a head dimension of 3; the
key-block sweep of `jaxattn._blocks` runs as many XLA kernels per block. Here the
sweep is one kernel: each program holds `block_q` queries (one lane each) and loops
over the keys `block_k` at a time, keeping each row's running maximum, normaliser and
output sum in registers (the online softmax). The head dimension is unrolled: a
query is `a` vectors of its coordinates, so any `a` from 1 up runs without padding
to a tensor-core tile (for `a ≥ 16` a `dot` would be the faster choice).

`flash_attention(q, k, v, offset, kernel=…, causal=…, window=…)` computes what
`jaxattn._blocks.blocked_attention` computes, for the kernels that declare `flash`:
the softmax (`normalised`: the online softmax, its state in registers) and every
pointwise member of the kernel family (`ja.Exp()`, `ja.USA()`, `ja.Sigmoid()`, a
user's `AbstractPointwiseKernel`: its `pointwise` weight), with causal and window
masks; the backward pass takes each member's own `block_grad`. The offset and
`rescale` (`1/n`) stay the caller's, as for the blocked path. Boolean masks and the
other kernels (`ja.Hardmax()`) are refused by name. Reverse
mode is a custom VJP whose backward pass recomputes the blocks (FlashAttention-2's
two kernels: one over query blocks for `dq`, one over key blocks for `dk`, `dv`), so
a gradient costs `O(n)` memory.

For `shard="tokens"`'s ring, `flash_partial` attends one share of the keys (the
queries' positions shifted past the share's for the masks) and returns each row's
log-normaliser beside the output, both differentiable; `merge_partial` merges shares.

On CUDA the kernels are compiled with Triton; elsewhere they run in interpret mode
(the platform chosen at lowering, as in `jaxattn._pallas`).
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jaxtyping import Array, Float, Int

from .._kernel import AbstractKernel, as_kernel


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
    total = None
    for r, c in zip(rows, cols):
        term = r[:, None] * c[None, :]
        total = term if total is None else total + term
    return total


def _scores(qs, ks, off, big):
    """`(bq, bk)` scores of query lanes `qs` against key lanes `ks`, clipped to the
    float range, then offset (as `jaxattn._blocks` orders them)."""
    return jnp.clip(_lane_products(qs, ks), -big, big) + off


def _forward_kernel(q_ref, k_ref, v_ref, off_ref, shift_ref, o_ref, lse_ref, *, a, cv, m,
                    bq, bk, kernel, causal, window):
    qi = pl.program_id(1)
    qs = [q_ref[c, :] for c in range(a)]
    off, shift = off_ref[0], shift_ref[0]
    mk = None if m % bk == 0 else m  # padded keys to mask
    i = qi * bq + lax.iota(jnp.int32, bq)
    dtype = qs[0].dtype
    big = jnp.asarray(jnp.finfo(dtype).max, dtype)

    def body(jb, carry):
        mx, norm, acc = carry
        start = jb * bk
        j = start + lax.iota(jnp.int32, bk)
        s = _scores(qs, [k_ref[c, pl.ds(start, bk)] for c in range(a)], off, big)
        ok = _allowed(i, j, m=mk, n=None, causal=causal, window=window, shift=shift)
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
        acc = tuple(scale * acc[c] + jnp.sum(p * v_ref[c, pl.ds(start, bk)][None, :], axis=1)
                    for c in range(cv))
        return new, norm, acc

    zero = jnp.zeros((bq,), dtype)
    init = (jnp.full((bq,), -jnp.inf, dtype), zero, tuple(zero for _ in range(cv)))
    mx, norm, acc = lax.fori_loop(0, pl.cdiv(m, bk), body, init)
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


def _grad_weights(kernel, s, ok, lse, dp, delta):
    """`(w, ds)`: the member's `block_grad` of one block pair (its `a` the rows'
    log-normaliser for softmax, unused by pointwise kernels)."""
    return kernel.block_grad(s, True if ok is None else ok, lse, lse, delta, dp)


def _dq_kernel(q_ref, k_ref, v_ref, off_ref, shift_ref, lse_ref, do_ref, delta_ref, dq_ref,
               doff_ref, *, a, cv, m, bq, bk, kernel, causal, window):
    qi = pl.program_id(1)
    qs = [q_ref[c, :] for c in range(a)]
    dos = [do_ref[c, :] for c in range(cv)]
    lse, delta, off, shift = lse_ref[...], delta_ref[...], off_ref[0], shift_ref[0]
    mk = None if m % bk == 0 else m
    i = qi * bq + lax.iota(jnp.int32, bq)
    dtype = qs[0].dtype
    big = jnp.asarray(jnp.finfo(dtype).max, dtype)

    def body(jb, carry):
        dq, doff = carry
        start = jb * bk
        j = start + lax.iota(jnp.int32, bk)
        s = _scores(qs, [k_ref[c, pl.ds(start, bk)] for c in range(a)], off, big)
        ok = _allowed(i, j, m=mk, n=None, causal=causal, window=window, shift=shift)
        dp = _lane_products(dos, [v_ref[c, pl.ds(start, bk)] for c in range(cv)])
        _, ds = _grad_weights(kernel, s, ok, lse, dp, delta)
        dq = tuple(dq[c] + jnp.sum(ds * k_ref[c, pl.ds(start, bk)][None, :], axis=1)
                   for c in range(a))
        return dq, doff + jnp.sum(ds, axis=1)

    zero = jnp.zeros((bq,), dtype)
    dq, doff = lax.fori_loop(0, pl.cdiv(m, bk), body, (tuple(zero for _ in range(a)), zero))
    for c in range(a):
        dq_ref[c, :] = dq[c]
    doff_ref[...] = doff


def _dkv_kernel(q_ref, k_ref, v_ref, off_ref, shift_ref, lse_ref, do_ref, delta_ref, dk_ref,
                dv_ref, *, a, cv, m, n, bq, bk, kernel, causal, window):
    kj = pl.program_id(1)
    ks = [k_ref[c, :] for c in range(a)]
    vs = [v_ref[c, :] for c in range(cv)]
    off, shift = off_ref[0], shift_ref[0]
    mk = None if m % bk == 0 else m
    j = kj * bk + lax.iota(jnp.int32, bk)
    dtype = ks[0].dtype
    big = jnp.asarray(jnp.finfo(dtype).max, dtype)

    def body(ib, carry):
        dk, dv = carry
        start = ib * bq
        i = start + lax.iota(jnp.int32, bq)
        qs = [q_ref[c, pl.ds(start, bq)] for c in range(a)]
        dos = [do_ref[c, pl.ds(start, bq)] for c in range(cv)]
        s = _scores(qs, ks, off, big)
        ok = _allowed(i, j, m=mk, n=None if n % bq == 0 else n, causal=causal,
                      window=window, shift=shift)
        dp = _lane_products(dos, vs)
        p, ds = _grad_weights(kernel, s, ok, lse_ref[pl.ds(start, bq)], dp,
                              delta_ref[pl.ds(start, bq)])
        dv = tuple(dv[c] + jnp.sum(p * dos[c][:, None], axis=0) for c in range(cv))
        dk = tuple(dk[c] + jnp.sum(ds * qs[c][:, None], axis=0) for c in range(a))
        return dk, dv

    zero = jnp.zeros((bk,), dtype)
    dk, dv = lax.fori_loop(0, pl.cdiv(n, bq), body,
                           (tuple(zero for _ in range(a)), tuple(zero for _ in range(cv))))
    for c in range(a):
        dk_ref[c, :] = dk[c]
    for c in range(cv):
        dv_ref[c, :] = dv[c]


def _call(kernel_fn, grid, in_specs, out_specs, out_shape, num_warps, name, *args):
    """One `pallas_call`: Triton on CUDA, interpret mode elsewhere (chosen at lowering)."""
    def run(interpret, *xs):
        params = None
        if not interpret:
            from jax.experimental.pallas import triton as pltriton
            params = pltriton.CompilerParams(num_warps=num_warps, num_stages=1)
        return pl.pallas_call(kernel_fn, grid=grid, in_specs=in_specs, out_specs=out_specs,
                              out_shape=out_shape, interpret=interpret,
                              compiler_params=params, name=name)(*xs)
    return lax.platform_dependent(*args, cuda=functools.partial(run, False),
                                  default=functools.partial(run, True))


def _pad_last(x, size):
    pad = size - x.shape[-1]
    return x if pad == 0 else jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)])


class _Spec:
    """The static description of one flash attention (hashable, for the custom VJP):
    the kernel is a member of `AbstractKernel`, compared by its class and name (its
    arrays, a sigmoid's bias, enter through the caller's `offset`)."""

    def __init__(self, kernel, causal, window, block_q, block_k, num_warps):
        kernel = as_kernel(kernel)
        if not kernel.flash:
            raise ValueError(f"the attention kernel runs softmax and pointwise kernels "
                             f"(exp, usa, sigmoid, …); got {kernel.name!r}: use the blocked "
                             "XLA path.")
        self.kernel = kernel
        self.key = (type(kernel), kernel.name, bool(causal), window, int(block_q),
                    int(block_k), int(num_warps))
        _, _, self.causal, self.window, self.bq, self.bk, self.warps = self.key

    def __hash__(self):
        return hash(self.key)

    def __eq__(self, other):
        return isinstance(other, _Spec) and self.key == other.key


def _layout(q, k, v, spec):
    """Coordinates first (`(h, a, n)`), sequences padded to whole blocks."""
    n, m = q.shape[1], k.shape[1]
    npad, mpad = pl.cdiv(n, spec.bq) * spec.bq, pl.cdiv(m, spec.bk) * spec.bk
    qt = _pad_last(jnp.swapaxes(q, 1, 2), npad)
    kt = _pad_last(jnp.swapaxes(k, 1, 2), mpad)
    vt = _pad_last(jnp.swapaxes(v, 1, 2), mpad)
    return qt, kt, vt, n, m, npad, mpad


def _specs(h, g, a, cv, npad, mpad, spec):
    group = h // g
    q_block = pl.BlockSpec((None, a, spec.bq), lambda hh, i: (hh, 0, i))
    k_all = pl.BlockSpec((None, a, mpad), lambda hh, i: (hh // group, 0, 0))
    v_all = pl.BlockSpec((None, cv, mpad), lambda hh, i: (hh // group, 0, 0))
    scalar = pl.BlockSpec((1,), lambda hh, i: (0,))  # the offset, the shift
    row = pl.BlockSpec((None, spec.bq), lambda hh, i: (hh, i))
    return q_block, k_all, v_all, scalar, row


def _fwd(q, k, v, offset, shift, spec):
    h, g, a, cv = q.shape[0], k.shape[0], q.shape[2], v.shape[2]
    qt, kt, vt, n, m, npad, mpad = _layout(q, k, v, spec)
    q_block, k_all, v_all, scalar, row = _specs(h, g, a, cv, npad, mpad, spec)
    o_block = pl.BlockSpec((None, cv, spec.bq), lambda hh, i: (hh, 0, i))
    kernel = functools.partial(_forward_kernel, a=a, cv=cv, m=m, bq=spec.bq, bk=spec.bk,
                               kernel=spec.kernel, causal=spec.causal, window=spec.window)
    out, lse = _call(kernel, (h, npad // spec.bq), [q_block, k_all, v_all, scalar, scalar],
                     [o_block, row],
                     [jax.ShapeDtypeStruct((h, cv, npad), q.dtype),
                      jax.ShapeDtypeStruct((h, npad), q.dtype)],
                     spec.warps, "flash_forward", qt, kt, vt, offset.reshape(1),
                     shift.reshape(1))
    return out, lse


def _outputs(out, lse, n):
    """The kernel's `(h, c, npad)` outputs and `(h, npad)` log-normalisers as `(h, n, c)`
    and `(h, n)`."""
    return jnp.swapaxes(out, 1, 2)[:, :n], lse[:, :n]


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _flash(q, k, v, offset, shift, spec):
    return _outputs(*_fwd(q, k, v, offset, shift, spec), q.shape[1])


def _flash_fwd(q, k, v, offset, shift, spec):
    out, lse = _fwd(q, k, v, offset, shift, spec)
    return _outputs(out, lse, q.shape[1]), (q, k, v, offset, shift, out, lse)


def _flash_bwd(spec, res, cotangents):
    """FlashAttention-2's backward pass, with a cotangent on the log-normaliser too (a
    ring merges partial results by it): `∂lse/∂s = w`, so it enters as `Δ − dlse` in
    softmax's `w (dp − Δ)`; pointwise kernels have no log-normaliser."""
    q, k, v, offset, shift, out, lse = res
    dout, dlse = cotangents
    h, g, a, cv = q.shape[0], k.shape[0], q.shape[2], v.shape[2]
    qt, kt, vt, n, m, npad, mpad = _layout(q, k, v, spec)
    dot = _pad_last(jnp.swapaxes(dout, 1, 2), npad)
    delta = jnp.sum(dot * out, axis=1)  # (h, npad): Σ_c dout·out, softmax's row term
    if spec.kernel.normalised:
        delta = delta - _pad_last(dlse, npad)
    lse = jnp.where(jnp.isfinite(lse), lse, 0.0)  # rows that saw no key: every weight 0
    q_block, k_all, v_all, scalar, row = _specs(h, g, a, cv, npad, mpad, spec)
    do_block = pl.BlockSpec((None, cv, spec.bq), lambda hh, i: (hh, 0, i))
    common = dict(a=a, cv=cv, m=m, bq=spec.bq, bk=spec.bk, kernel=spec.kernel,
                  causal=spec.causal, window=spec.window)
    offs, shifts = offset.reshape(1), shift.reshape(1)
    dq, doff = _call(functools.partial(_dq_kernel, **common), (h, npad // spec.bq),
                     [q_block, k_all, v_all, scalar, scalar, row, do_block, row],
                     [pl.BlockSpec((None, a, spec.bq), lambda hh, i: (hh, 0, i)), row],
                     [jax.ShapeDtypeStruct((h, a, npad), q.dtype),
                      jax.ShapeDtypeStruct((h, npad), q.dtype)],
                     spec.warps, "flash_dq", qt, kt, vt, offs, shifts, lse, dot, delta)
    # Keys per head: a group's keys are read by `h / g` heads, their gradients summed.
    group = h // g
    q_all = pl.BlockSpec((None, a, npad), lambda hh, j: (hh, 0, 0))
    k_block = pl.BlockSpec((None, a, spec.bk), lambda hh, j: (hh // group, 0, j))
    v_block = pl.BlockSpec((None, cv, spec.bk), lambda hh, j: (hh // group, 0, j))
    rows_all = pl.BlockSpec((None, npad), lambda hh, j: (hh, 0))
    do_all = pl.BlockSpec((None, cv, npad), lambda hh, j: (hh, 0, 0))
    dk, dv = _call(functools.partial(_dkv_kernel, n=n, **common), (h, mpad // spec.bk),
                   [q_all, k_block, v_block, scalar, scalar, rows_all, do_all, rows_all],
                   [pl.BlockSpec((None, a, spec.bk), lambda hh, j: (hh, 0, j)),
                    pl.BlockSpec((None, cv, spec.bk), lambda hh, j: (hh, 0, j))],
                   [jax.ShapeDtypeStruct((h, a, mpad), q.dtype),
                    jax.ShapeDtypeStruct((h, cv, mpad), q.dtype)],
                   spec.warps, "flash_dkv", qt, kt, vt, offs, shifts, lse, dot, delta)
    dq = jnp.swapaxes(dq, 1, 2)[:, :n]
    dk = jnp.swapaxes(dk, 1, 2)[:, :m].reshape(g, group, m, a).sum(1)
    dv = jnp.swapaxes(dv, 1, 2)[:, :m].reshape(g, group, m, cv).sum(1)
    doff = jnp.sum(jnp.where(jnp.arange(npad) < n, doff, 0.0)).astype(offset.dtype)
    return dq, dk.astype(k.dtype), dv.astype(v.dtype), doff.reshape(offset.shape), None


_flash.defvjp(_flash_fwd, _flash_bwd)


def _checked(q, k, v, offset, kernel, causal, window, block_q, block_k, num_warps):
    """The arguments in one dtype and the static `_Spec`, or a one-line error."""
    for name, b in (("block_q", block_q), ("block_k", block_k)):
        if not (isinstance(b, int) and b >= 1 and b & (b - 1) == 0):
            raise ValueError(f"`{name}` must be a power of two, got {b!r}.")
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3 or q.shape[0] % k.shape[0] \
            or k.shape[:2] != v.shape[:2] or q.shape[2] != k.shape[2]:
        raise ValueError(f"expected q (h, n, a), k (g, m, a), v (g, m, c) with g dividing h; "
                         f"got {q.shape}, {k.shape}, {v.shape}.")
    spec = _Spec(kernel, causal, window, block_q, block_k, num_warps)
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
