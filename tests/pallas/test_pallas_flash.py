"""Mean-field attention as Pallas kernels (`jaxattn._pallas.flash`), in interpret mode against
the blocked XLA path (`jaxattn._blocks`), finite differences, and lowered for CUDA."""

import jax
import jax.numpy as jnp
import pytest
from jax.test_util import check_grads

import jaxattn as ja
from jaxattn._blocks import block_spec, blocked_attention, use_flash
from jaxattn._pallas.flash import flash_attention, flash_partial, merge_partial

H, G, N, A = 2, 1, 37, 3  # 37 tokens: neither block size divides them


def _inputs(key, h=H, g=G, n=N, a=A, c=A):
    kq, kk, kv = jax.random.split(key, 3)
    return (jax.random.normal(kq, (h, n, a)), jax.random.normal(kk, (g, n, a)),
            jax.random.normal(kv, (g, n, c)), jnp.asarray(-0.3))


def _pair(kernel, causal=False, window=None, n=N, h=H):
    spec = block_spec(kernel, n, n, h, 16, causal=causal, window=window)

    def flash(q, k, v, o):
        return flash_attention(q, k, v, o, kernel=kernel, causal=causal, window=window,
                               block_q=16, block_k=8)

    def blocked(q, k, v, o):
        return blocked_attention(q, k, v, o, None, spec)
    return jax.jit(flash), jax.jit(blocked)


def _rel(a, b) -> float:
    return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
@pytest.mark.parametrize("kernel,causal,window", [
    ("softmax", False, None), ("softmax", True, 7), ("exp", True, None),
    ("usa", False, None), ("sigmoid", False, 5)])
def test_equals_blocked_with_gradients(key, kernel, causal, window):
    """Forward and reverse mode equal the blocked path's (its custom VJP) in float64."""
    args = _inputs(key)
    flash, blocked = _pair(kernel, causal, window)
    assert _rel(flash(*args), blocked(*args)) < 1e-12

    # A linear loss: its gradient is as well conditioned as the attention itself.
    weights = jax.random.normal(jax.random.fold_in(key, 1), (H, N, A))

    def grads(fn):
        return jax.jit(jax.grad(lambda *x: jnp.sum(fn(*x) * weights), argnums=(0, 1, 2, 3)))(
            *args)
    gf, gb = grads(flash), grads(blocked)
    for a, b in zip(gf[:3], gb[:3]):
        assert _rel(a, b) < 1e-12
    # Softmax is shift-invariant: the offset's gradient is 0 up to rounding on both.
    scale = max(float(jnp.max(jnp.abs(g))) for g in gb[:3])
    assert abs(float(gf[3] - gb[3])) < 1e-12 * scale * N


@pytest.mark.slow  # warm: over ~3 s (make test stays the fast loop)
@pytest.mark.parametrize("kernel", ["softmax", "exp"])
def test_whole_blocks(key, kernel):
    """n a multiple of both block sizes: the kernels test no padding at all."""
    args = _inputs(key, n=32)
    flash, blocked = _pair(kernel, n=32)
    assert _rel(flash(*args), blocked(*args)) < 1e-12
    gf, gb = (jax.jit(jax.grad(lambda *x, f=f: jnp.sum(f(*x)[..., 0]), argnums=(0, 1, 2)))(
        *args) for f in (flash, blocked))
    for a, b in zip(gf, gb):
        assert _rel(a, b) < 1e-12


def test_float32_and_key_groups(key):
    """Two query heads reading one key group, in float32 (1e-5 relative)."""
    with jax.enable_x64(False):
        args = [a.astype(jnp.float32) for a in _inputs(key, h=2, g=1)]
        flash, blocked = _pair("softmax")
        out = flash(*args)
        assert out.dtype == jnp.float32 and _rel(out, blocked(*args)) < 1e-5


def test_finite_differences(key):
    q, k, v, o = _inputs(key, n=9)
    check_grads(lambda q, k, v, o: flash_attention(q, k, v, o, block_q=4, block_k=4,
                                                   causal=True),
                (q, k, v, o), order=1, modes=("rev",), atol=1e-6, rtol=1e-6)


_SHARE_KERNELS = [(ja.Softmax(), 5), (ja.Softmax(), None), (ja.Exp(), None)]
_SHARE_IDS = ["softmax-window", "softmax", "exp"]


def _shares(key, kernel, window):
    """A ring's arithmetic on one device: the later half of 16 queries against each
    half of the keys (`shift` their distance), causal, merged by log-normalisers."""
    n, half = 16, 8
    q, k, v, o = _inputs(key, n=n)
    opts = dict(kernel=kernel, causal=True, window=window, block_q=4, block_k=4)

    def merged(q2, k, v, o):
        own = flash_partial(q2, k[:, half:], v[:, half:], o, 0, **opts)
        earlier = flash_partial(q2, k[:, :half], v[:, :half], o, half, **opts)
        return merge_partial(own, earlier, kernel)[0]

    def whole(q, k, v, o):
        return flash_attention(q, k, v, o, **opts)[:, half:]
    return (q, k, v, o), half, merged, whole, opts


@pytest.mark.parametrize("kernel,window", _SHARE_KERNELS, ids=_SHARE_IDS)
def test_shares_of_keys_merge_to_the_whole(key, kernel, window):
    """Merged shares equal attention over all keys; a share all masked for its rows
    gives 0 and, for softmax, a log-normaliser of −∞."""
    (q, k, v, o), half, merged, whole, opts = _shares(key, kernel, window)
    assert _rel(merged(q[:, half:], k, v, o), whole(q, k, v, o)) < 1e-12
    out, lse = flash_partial(q[:, :half], k[:, half:], v[:, half:], o, -half, **opts)
    assert float(jnp.max(jnp.abs(out))) == 0.0
    if isinstance(kernel, ja.Softmax):
        assert bool(jnp.all(lse == -jnp.inf))


@pytest.mark.slow  # warm: over ~4 s each (make test stays the fast loop)
@pytest.mark.parametrize("kernel,window", _SHARE_KERNELS, ids=_SHARE_IDS)
def test_merged_shares_have_the_wholes_gradient(key, kernel, window):
    """Through both outputs of each share (the log-normaliser's cotangent enters the
    backward pass): finite differences, and the whole kernel's gradient."""
    (q, k, v, o), half, merged, whole, _ = _shares(key, kernel, window)
    check_grads(merged, (q[:, half:], k, v, o), order=1, modes=("rev",), atol=1e-6,
                rtol=1e-6)
    weights = jax.random.normal(jax.random.fold_in(key, 2), (H, 16 - half, A))

    def grads(fn, *args):
        return jax.grad(lambda *x: jnp.sum(fn(*x) * weights), argnums=(0, 1, 2))(*args)
    g_whole = grads(lambda q, k, v: whole(q, k, v, o), q, k, v)
    g_merged = grads(lambda q, k, v: merged(q[:, half:], k, v, o), q, k, v)
    for a, b in zip(g_merged, g_whole):
        assert _rel(a, b) < 1e-12


def test_family_members(key):
    """A member of the kernel family runs as its name does (its own `pointwise`)."""
    args = _inputs(key, n=20)
    by_name = flash_attention(*args, kernel="usa", block_q=8, block_k=8)
    by_member = flash_attention(*args, kernel=ja.USA(), block_q=8, block_k=8)
    assert _rel(by_member, by_name) == 0.0


def test_refusals(key):
    q, k, v, o = _inputs(key)
    with pytest.raises(ValueError, match="hardmax"):
        flash_attention(q, k, v, o, kernel="hardmax")
    with pytest.raises(ValueError, match="power of two"):
        flash_attention(q, k, v, o, block_q=24)
    with pytest.raises(ValueError, match="g dividing h"):
        flash_attention(q, k[:, :5], v, o)
    # these ran and lowered for CUDA (3 or 64 warps), or gave rows of zeros (window 0)
    for warps in (3, 0, 64):
        with pytest.raises(ValueError, match="`num_warps` must be a power of two .* up to 32"):
            flash_attention(q, k, v, o, num_warps=warps)
    for window in (0, -2, 1.5):
        with pytest.raises(ValueError, match="`window` must be a whole number ≥ 1"):
            flash_attention(q, k, v, o, window=window)
    for layout in ({"num_warps": 3}, {"block_q": 48}):
        with pytest.raises(ValueError, match="must be a power of two"), use_flash(**layout):
            pass


def test_lowers_for_cuda(key):
    """Forward and gradient lower to Triton kernels for CUDA on this CPU machine."""
    with jax.enable_x64(False):
        q, k, v, o = [a.astype(jnp.float32) for a in _inputs(key)]

        def loss(q, k, v):
            return flash_attention(q, k, v, o, kernel="softmax").sum()
        text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(q, k, v).lower(
            lowering_platforms=("cuda",)).as_text()
    assert text.count("__gpu$xla.gpu.triton") == 3  # forward, dq, dk/dv
