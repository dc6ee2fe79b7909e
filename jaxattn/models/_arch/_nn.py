"""The layers every family is built from, each written for one sequence `(n, d)`.

Weights follow PyTorch's `(out, in)` layout, so HuggingFace tensors load without
a transpose (GPT-2's `Conv1D` is the one exception, transposed at load time).
Broadcasts are written out (`b[None]`), so the layers also run under
`jax_numpy_rank_promotion="raise"`.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

_ACTIVATIONS = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_fast": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
}


def activation(name: str):
    """The activation function HuggingFace calls `name` (`ValueError` if unknown)."""
    try:
        return _ACTIVATIONS[name]
    except KeyError:
        raise ValueError(
            f"unsupported activation {name!r}; jaxattn knows {sorted(_ACTIVATIONS)}."
        ) from None


def normal(key, shape, std: float, dtype=jnp.float32) -> Array:
    """`N(0, std²)` entries: HuggingFace's initialisation of linear and embedding weights."""
    return std * jax.random.normal(key, shape, dtype)


def _einsum(spec: str, a: Array, b: Array, dtype) -> Array:
    """`einsum` with both operands in `dtype` and float32 accumulation (bfloat16 /
    float16 compute keeps float32 sums; for float32 it is the plain einsum)."""
    out = jnp.einsum(spec, a.astype(dtype), b.astype(dtype), preferred_element_type=jnp.float32)
    return out.astype(dtype)


class Linear(eqx.Module):
    """`y = x Wᵀ + b` on each token; `weight` is `(out, in)`."""

    weight: Float[Array, "o i"]
    bias: Float[Array, " o"] | None

    def __call__(self, x: Float[Array, "n i"]) -> Float[Array, "n o"]:
        y = jnp.matmul(x, self.weight.T.astype(x.dtype), preferred_element_type=jnp.float32)
        y = y.astype(x.dtype)
        return y if self.bias is None else y + self.bias[None].astype(x.dtype)

    @staticmethod
    def init(key, d_in: int, d_out: int, std: float, bias: bool = True) -> "Linear":
        b = jnp.zeros((d_out,), jnp.float32) if bias else None
        return Linear(normal(key, (d_out, d_in), std), b)


class LayerNorm(eqx.Module):
    """LayerNorm over the features of each token (biased variance, as PyTorch)."""

    weight: Float[Array, " d"]
    bias: Float[Array, " d"]
    eps: float = eqx.field(static=True)

    def __call__(self, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        x32 = x.astype(jnp.float32)  # statistics in float32 for reduced precisions
        mean = jnp.mean(x32, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
        y = ((x32 - mean) * jax.lax.rsqrt(var + self.eps)).astype(x.dtype)
        return y * self.weight[None].astype(x.dtype) + self.bias[None].astype(x.dtype)

    @staticmethod
    def init(d: int, eps: float) -> "LayerNorm":
        return LayerNorm(jnp.ones((d,), jnp.float32), jnp.zeros((d,), jnp.float32), eps)


class RMSNorm(eqx.Module):
    """Root-mean-square normalisation (Llama), computed in float32 as HuggingFace does."""

    weight: Float[Array, " d"]
    eps: float = eqx.field(static=True)

    def __call__(self, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.eps)
        return self.weight[None].astype(x.dtype) * y.astype(x.dtype)

    @staticmethod
    def init(d: int, eps: float) -> "RMSNorm":
        return RMSNorm(jnp.ones((d,), jnp.float32), eps)


class Attention(eqx.Module):
    """Multi-head attention with per-head weights, in the simulator's terms.

    Head `η` uses `Q_η = query[η]`, `K_η = key[g(η)]`, `V_η = value[g(η)]` (all
    `(k, d)`, `g` groups query heads onto key–value heads for grouped-query
    attention) and `W_O^η = output[:, η]` (`(d, k)`). Scores are
    `scale · (Q_η x_i + b)·(K_η x_j + b)`; the update is
    `Σ_η W_O^η Σ_j α^η_ij (V_η x_j + b) + b_O`.

    **Arguments:**

    - `query`: `(h, k, d)`; `key`, `value`: `(g, k, d)` with `h` a multiple of `g`.
    - `output`: `(d, h, k)`.
    - `query_bias`, `key_bias`, `value_bias`: `(h, k)`, `(g, k)`, `(g, k)` or `None`.
    - `output_bias`: `(d,)` or `None`.
    - `scale`: the factor on the scores (`1/√k`, or 1 for GPT-Neo).
    """

    query: Float[Array, "h k d"]
    key: Float[Array, "g k d"]
    value: Float[Array, "g k d"]
    output: Float[Array, "d h k"]
    query_bias: Float[Array, "h k"] | None
    key_bias: Float[Array, "g k"] | None
    value_bias: Float[Array, "g k"] | None
    output_bias: Float[Array, " d"] | None
    scale: float = eqx.field(static=True)

    @property
    def num_heads(self) -> int:
        return self.query.shape[-3]

    @property
    def num_kv_heads(self) -> int:
        return self.key.shape[-3]

    def _project(self, w, b, x):
        y = _einsum("hkd,nd->hnk", w, x, x.dtype)
        return y if b is None else y + b[:, None, :].astype(x.dtype)

    def __call__(
        self,
        x: Float[Array, "n d"],
        mask: Bool[Array, "n n"],
        rotary: tuple[Array, Array] | None = None,
    ) -> Float[Array, "n d"]:
        q = self._project(self.query, self.query_bias, x)
        k = self._project(self.key, self.key_bias, x)
        v = self._project(self.value, self.value_bias, x)
        if rotary is not None:
            q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        group = self.num_heads // self.num_kv_heads
        if group > 1:
            k, v = jnp.repeat(k, group, axis=0), jnp.repeat(v, group, axis=0)
        # Scores and softmax in float32 (as HuggingFace does for reduced precisions).
        s = jnp.einsum("hik,hjk->hij", q, k, preferred_element_type=jnp.float32) * self.scale
        s = jnp.where(mask[None], s, jnp.finfo(jnp.float32).min)
        a = jax.nn.softmax(s, axis=-1).astype(x.dtype)
        o = _einsum("hij,hjk->ihk", a, v, x.dtype)
        y = _einsum("ihk,dhk->id", o, self.output, x.dtype)
        return y if self.output_bias is None else y + self.output_bias[None].astype(x.dtype)

    @staticmethod
    def init(key, d: int, h: int, g: int, k: int, std: float, bias: bool, scale: float):
        kq, kk, kv, ko = jax.random.split(key, 4)

        def b(shape):
            return jnp.zeros(shape, jnp.float32) if bias else None

        return Attention(
            normal(kq, (h, k, d), std), normal(kk, (g, k, d), std), normal(kv, (g, k, d), std),
            normal(ko, (d, h, k), std), b((h, k)), b((g, k)), b((g, k)), b((d,)), scale,
        )


def rotary_tables(n: int, dim: int, theta: float) -> tuple[Array, Array]:
    """`cos`, `sin` tables `(n, dim)` of rotary position embeddings (HF's `rotate_half`
    layout: frequency `i` on features `i` and `i + dim/2`)."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
    freqs = jnp.arange(n, dtype=jnp.float32)[:, None] * inv_freq[None, :]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def apply_rotary(x: Float[Array, "h n k"], cos: Array, sin: Array) -> Float[Array, "h n k"]:
    """Rotate query/key features by position (`x cos + rotate_half(x) sin`)."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[None].astype(x.dtype) + rotated * sin[None].astype(x.dtype)


def causal_mask(n: int, window: Array | int | None = None) -> Bool[Array, "n n"]:
    """`j ≤ i` (and `i − j < window` when a window is given)."""
    i = jnp.arange(n)[:, None]
    j = jnp.arange(n)[None, :]
    mask = j <= i
    return mask if window is None else mask & (i - j < window)


def full_mask(n: int) -> Bool[Array, "n n"]:
    return jnp.ones((n, n), dtype=bool)


class MLP(eqx.Module):
    """The feed-forward sub-block `proj(act(fc(x)))`."""

    fc: Linear
    proj: Linear
    act: str = eqx.field(static=True)

    def __call__(self, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        return self.proj(activation(self.act)(self.fc(x)))


class GatedMLP(eqx.Module):
    """Llama's feed-forward sub-block `down(act(gate(x)) · up(x))`."""

    gate: Linear
    up: Linear
    down: Linear
    act: str = eqx.field(static=True)

    def __call__(self, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        return self.down(activation(self.act)(self.gate(x)) * self.up(x))


def heads_in(w: Array, h: int) -> Array:
    """`(h·k, d)` projection rows → per-head `(h, k, d)`."""
    return w.reshape(h, w.shape[0] // h, w.shape[1])


def heads_out(w: Array, h: int) -> Array:
    """`(d, h·k)` output projection → per-head `(d, h, k)`."""
    return w.reshape(w.shape[0], h, w.shape[1] // h)


def bias_heads(b: Array | None, h: int) -> Array | None:
    return None if b is None else b.reshape(h, b.shape[0] // h)


class PreNormBlock(eqx.Module):
    """GPT-2 / GPT-Neo / Llama block: `x + attn(ln_1(x))`, then `x + mlp(ln_2(x))`.

    Without the feed-forward sub-block (`ffn=False`) the block is `x + attn(ln_1(x))`:
    the MLP, its normalisation `ln_2` and its residual are all dropped.
    """

    ln_1: LayerNorm | RMSNorm
    attn: Attention
    ln_2: LayerNorm | RMSNorm
    mlp: MLP | GatedMLP

    def __call__(self, x: Float[Array, "n d"], mask: Bool[Array, "n n"], rotary=None, *,
                 ffn: bool = True) -> Float[Array, "n d"]:
        x = x + self.attn(self.ln_1(x), mask, rotary)
        return x + self.mlp(self.ln_2(x)) if ffn else x


class PostNormBlock(eqx.Module):
    """BERT / ALBERT block: `ln_attn(x + attn(x))`, then `ln_out(x + mlp(x))`.

    Without the feed-forward sub-block (`ffn=False`) the block is
    `ln_attn(x + attn(x))`: the MLP, its residual and `ln_out` are dropped.
    """

    attn: Attention
    ln_attn: LayerNorm
    mlp: MLP
    ln_out: LayerNorm

    def __call__(self, x: Float[Array, "n d"], mask: Bool[Array, "n n"], rotary=None, *,
                 ffn: bool = True) -> Float[Array, "n d"]:
        x = self.ln_attn(x + self.attn(x, mask))
        return self.ln_out(x + self.mlp(x)) if ffn else x
