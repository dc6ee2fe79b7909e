"""The layers every family is built from, each written for one sequence `(n, d)`.

Weights follow PyTorch's `(out, in)` layout, so HuggingFace tensors load without
a transpose (GPT-2's `Conv1D` is the one exception, transposed at load time).
Broadcasts are written out (`b[None]`), so the layers also run under
`jax_numpy_rank_promotion="raise"`. Every matrix product goes through `product`,
which states its `precision` (docs/precision.md), orthogonal to the compute dtype."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Bool, Float

from ... import _precision
from ..._blocks import DEFAULT_BLOCK, block_spec, blocked_attention, blocks_needed
from ..._precision import Precision

#: Bytes of one layer's `(h, n, n)` float32 scores above which `Attention` takes key
#: blocks (`jaxattn._blocks`) off the cuDNN path: 1 MiB, n > 170 for SmolLM2's 9 heads,
#: where the blocks get faster (BENCHMARKS.md, "Measured claims behind design choices").
#: Below it the dense path keeps HuggingFace's rounding and forward-mode autodiff.
DENSE_LIMIT = 2**20

#: HuggingFace's activation names (a config's `activation_function` / `hidden_act`).
ACTIVATIONS = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_fast": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
}


def normal(key, shape, std: float, dtype=jnp.float32) -> Array:
    """`N(0, std²)` entries: HuggingFace's initialisation of linear and embedding weights.
    The barrier keeps the draw's own rounding inside one program (`ja.models.init`):
    XLA would fold `std` into it, one ulp off the weights drawn op by op."""
    return std * lax.optimization_barrier(jax.random.normal(key, shape, dtype))


def product(spec: str, a: Array, b: Array, dtype, precision: Precision) -> Array:
    """`einsum(spec, a, b)` with both operands in the compute `dtype`.

    **Arguments:**

    - `spec`: the einsum subscripts of two operands.
    - `a`, `b`: the operands, cast to `dtype`.
    - `dtype`: the compute dtype. float32 and float64 products run at `precision`
      (`jaxattn._precision.einsum`); bfloat16 / float16 products are exact products
      of the narrow operands summed in float32, as HuggingFace computes them.
    - `precision`: `"float32"`, `"tensorfloat32"` or `"bfloat16"`.

    **Returns:**

    The product, in `dtype` (float32 for a reduced `dtype`: the caller casts it).
    """
    a, b = a.astype(dtype), b.astype(dtype)
    if jnp.finfo(dtype).bits >= 32:
        return _precision.einsum(spec, a, b, precision=precision)
    return jnp.einsum(spec, a, b, precision=lax.Precision.HIGHEST,
                      preferred_element_type=jnp.float32)


def accumulation_dtype(dtype) -> jnp.dtype:
    """The dtype of statistics (norms, scores): float32, or float64 for float64 compute."""
    return jnp.promote_types(dtype, jnp.float32)


class Linear(eqx.Module):
    """`y = x Wᵀ + b` on each token; `weight` is `(out, in)`."""

    weight: Float[Array, "o i"]
    bias: Float[Array, " o"] | None

    def __call__(self, x: Float[Array, "n i"], *,
                 precision: Precision = "float32") -> Float[Array, "n o"]:
        y = product("ni,oi->no", x, self.weight, x.dtype, precision).astype(x.dtype)
        return y if self.bias is None else y + self.bias[None].astype(x.dtype)

    @staticmethod
    def init(key, d_in: int, d_out: int, std: float, bias: bool = True) -> "Linear":
        b = jnp.zeros((d_out,), jnp.float32) if bias else None
        return Linear(normal(key, (d_out, d_in), std), b)

    @staticmethod
    def load(src, name: str, d_in: int, d_out: int, bias: bool = True) -> "Linear":
        """From the HuggingFace tensors `{name}.weight` and `{name}.bias` of `src`."""
        b = src.get(f"{name}.bias", (d_out,)) if bias else None
        return Linear(src.get(f"{name}.weight", (d_out, d_in)), b)


class LayerNorm(eqx.Module):
    """LayerNorm over the features of each token (biased variance, as PyTorch)."""

    weight: Float[Array, " d"]
    bias: Float[Array, " d"]
    eps: float = eqx.field(static=True)

    def __call__(self, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        x32 = x.astype(accumulation_dtype(x.dtype))  # statistics in float32 for reduced precisions
        mean = jnp.mean(x32, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
        y = ((x32 - mean) * jax.lax.rsqrt(var + self.eps)).astype(x.dtype)
        return y * self.weight[None].astype(x.dtype) + self.bias[None].astype(x.dtype)

    @staticmethod
    def init(d: int, eps: float) -> "LayerNorm":
        return LayerNorm(jnp.ones((d,), jnp.float32), jnp.zeros((d,), jnp.float32), eps)

    @staticmethod
    def load(src, name: str, d: int, eps: float) -> "LayerNorm":
        return LayerNorm(src.get(f"{name}.weight", (d,)), src.get(f"{name}.bias", (d,)), eps)


class RMSNorm(eqx.Module):
    """Root-mean-square normalisation (Llama), computed in float32 as HuggingFace does."""

    weight: Float[Array, " d"]
    eps: float = eqx.field(static=True)

    def __call__(self, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        x32 = x.astype(accumulation_dtype(x.dtype))
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

    Called with `mask` (which tokens each token may attend to, or `None`: all),
    `causal` (also only `j ≤ i`), `window` (a `Window` by index, GPT-Neo's local
    layers) and `precision=` (see `product`). The attention runs as cuDNN's fused
    kernel (`attention_kernel`), dense einsums up to `DENSE_LIMIT` bytes, or key blocks
    above it (docs/usage/models.md); scores and softmax are float32 for reduced
    precisions, as in HuggingFace.
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

    def _project(self, w, b, x, precision):
        y = product("hkd,nd->hnk", w, x, x.dtype, precision).astype(x.dtype)
        return y if b is None else y + b[:, None, :].astype(x.dtype)

    def _queries_keys(self, x, rotary, precision):
        q = self._project(self.query, self.query_bias, x, precision)
        k = self._project(self.key, self.key_bias, x, precision)
        if rotary is None:
            return q, k
        return apply_rotary(q, *rotary), apply_rotary(k, *rotary)

    def __call__(
        self,
        x: Float[Array, "n d"],
        mask: Bool[Array, "n n"] | None,
        rotary: tuple[Array, Array] | None = None,
        *,
        precision: Precision = "float32",
        causal: bool = False,
        window: "Window | None" = None,
    ) -> Float[Array, "n d"]:
        q, k = self._queries_keys(x, rotary, precision)
        v = self._project(self.value, self.value_bias, x, precision)
        n = x.shape[0]
        kernel = attention_kernel(x.dtype, q.shape[-1])
        if kernel is not None and mask is None and (causal or window is None):
            o = fused_attention(q, k, v, window, self.scale, causal=causal,
                                implementation=kernel)
        elif self.blocked(n, x.dtype):
            o = self._blocked_mix(q, k, v, mask, window, causal, precision)
        else:
            o = self._mix(q, k, v, dense_mask(n, causal, mask, window), precision)
        y = product("ihk,dhk->id", o, self.output, x.dtype, precision).astype(x.dtype)
        return y if self.output_bias is None else y + self.output_bias[None].astype(x.dtype)

    def _weights(self, q, k, mask, precision) -> Float[Array, "h n n"]:
        """The attention probabilities `α^η_ij` (softmax over `j`), in float32 for
        reduced precisions (as HuggingFace computes them)."""
        group = self.num_heads // self.num_kv_heads
        if group > 1:
            k = jnp.repeat(k, group, axis=0)
        s = product("hik,hjk->hij", q, k, q.dtype, precision).astype(accumulation_dtype(q.dtype))
        s = s * self.scale
        s = jnp.where(mask[None], s, jnp.finfo(jnp.float32).min)
        return jax.nn.softmax(s, axis=-1)

    def _mix(self, q, k, v, mask, precision) -> Float[Array, "n h k"]:
        """`Σ_j α_ij v_j` per head, as einsums at `precision` (the path off the GPU)."""
        dtype = q.dtype
        group = self.num_heads // self.num_kv_heads
        if group > 1:
            v = jnp.repeat(v, group, axis=0)
        a = self._weights(q, k, mask, precision).astype(dtype)
        return product("hij,hjk->ihk", a, v, dtype, precision).astype(dtype)

    def blocked(self, n: int, dtype) -> bool:
        """Whether `n` tokens take key blocks: the `(h, n, n)` float32 (float64)
        scores would exceed `DENSE_LIMIT` bytes."""
        itemsize = accumulation_dtype(dtype).itemsize
        return blocks_needed(self.num_heads, n, itemsize, DENSE_LIMIT)

    def _blocked_mix(self, q, k, v, mask, window, causal, precision) -> Float[Array, "n h k"]:
        """`Σ_j α_ij v_j` per head in key blocks (`jaxattn._blocks`), grouped keys
        never repeated; reduced precisions compute in float32 (exact products of the
        narrow operands, as `product`)."""
        dtype, wide = q.dtype, accumulation_dtype(q.dtype)
        if jnp.finfo(dtype).bits < 32:
            precision = "float32"
        q, k, v = (q * self.scale).astype(wide), k.astype(wide), v.astype(wide)
        (h, n, _), m = q.shape, k.shape[1]

        def attend(size):
            spec = block_spec("softmax", n, m, h, DEFAULT_BLOCK, causal=causal, window=size,
                              has_mask=mask is not None, precision=precision)
            return blocked_attention(q, k, v, 0.0, mask, spec)

        if window is None:
            o = attend(None)
        else:
            o = lax.cond(window.on, lambda: attend(window.size), lambda: attend(None))
        return o.swapaxes(0, 1).astype(dtype)

    def probabilities(
        self, x: Float[Array, "n d"], mask: Bool[Array, "n n"] | None,
        rotary: tuple[Array, Array] | None = None, *, precision: Precision = "float32",
        causal: bool = False,
    ) -> Float[Array, "h n n"]:
        """The attention probabilities of every head on `x` (the arguments of
        `__call__`): HuggingFace's `output_attentions`. Always the dense `(h, n, n)`
        array, which is what they are, at any `n` (`__call__` takes key blocks)."""
        q, k = self._queries_keys(x, rotary, precision)
        return self._weights(q, k, dense_mask(x.shape[0], causal, mask), precision)

    @staticmethod
    def init(key, d: int, h: int, g: int, k: int, std: float, bias: bool, scale: float):
        kq, kk, kv, ko = jax.random.split(key, 4)

        def b(shape):
            return jnp.zeros(shape, jnp.float32) if bias else None

        return Attention(
            normal(kq, (h, k, d), std), normal(kk, (g, k, d), std), normal(kv, (g, k, d), std),
            normal(ko, (d, h, k), std), b((h, k)), b((g, k)), b((g, k)), b((d,)), scale,
        )

    @staticmethod
    def from_linear(q: Linear, k: Linear, v: Linear, o: Linear, h: int, g: int,
                    scale: float) -> "Attention":
        """Per-head attention from HuggingFace's query, key, value and output layers
        (`h` query heads, `g` key–value heads): projection rows `(h·k, d)` → `(h, k, d)`,
        the output's columns `(d, h·k)` → `(d, h, k)`."""

        def heads(w, count):
            return None if w is None else w.reshape(count, w.shape[0] // count, *w.shape[1:])

        return Attention(heads(q.weight, h), heads(k.weight, g), heads(v.weight, g),
                         o.weight.reshape(o.weight.shape[0], h, -1), heads(q.bias, h),
                         heads(k.bias, g), heads(v.bias, g), o.bias, scale)


def apply_rotary(x: Float[Array, "h n k"], cos: Array, sin: Array) -> Float[Array, "h n k"]:
    """Rotate query/key features by position (`x cos + rotate_half(x) sin`)."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[None].astype(x.dtype) + rotated * sin[None].astype(x.dtype)


class Window(eqx.Module):
    """A sliding window by index: query `i` sees key `j` only when `i − j < size`,
    in the layers where `on` (GPT-Neo's `local` layers; a traced flag, as the layer
    index is under `lax.scan`).

    **Arguments:**

    - `size`: the window, keys per query counting itself.
    - `on`: whether this layer has the window.
    """

    size: int = eqx.field(static=True)
    on: Bool[Array, ""]

    def mask(self, n: int) -> Bool[Array, "n n"]:
        """The window as a dense mask (`i − j < size`, or all pairs where off)."""
        i, j = jnp.arange(n)[:, None], jnp.arange(n)[None, :]
        return i - j < jnp.where(self.on, self.size, n)


def dense_mask(n: int, causal: bool, mask: Bool[Array, "n n"] | None,
               window: Window | None = None) -> Bool[Array, "n n"]:
    """`mask` (default: all pairs), restricted to `j ≤ i` when `causal` and to the
    keys of `window` when given."""
    base = jnp.ones((n, n), bool)
    base = jnp.tril(base) if causal else base
    base = base if mask is None else base & mask
    return base if window is None else base & window.mask(n)


def attention_kernel(dtype, head_dim: int) -> str | None:
    """The `implementation` of `jax.nn.dot_product_attention` to use, or `None` for
    the einsum path: `"cudnn"` (flash attention) for bfloat16/float16 compute on an
    NVIDIA GPU with a head size cuDNN takes (a multiple of 8, at most 128); the
    einsums elsewhere, where every product states its precision (float32 and
    float64 compute, the CPU)."""
    if jnp.dtype(dtype) not in (jnp.bfloat16, jnp.float16) or head_dim % 8 or head_dim > 128:
        return None
    if jax.default_backend() != "gpu" or "rocm" in jax.devices()[0].client.platform_version:
        return None
    return "cudnn"


def fused_attention(
    q: Float[Array, "h n k"], k: Float[Array, "g n k"], v: Float[Array, "g n k"],
    window: Window | None, scale: float, *, causal: bool, implementation: str,
) -> Float[Array, "n h k"]:
    """`Σ_j α_ij v_j` per head through `jax.nn.dot_product_attention` (grouped
    key–value heads as `Attention`: query head `η` reads `g(η) = η // (h/g)`).

    **Arguments:**

    - `q`, `k`, `v`: one sequence's projected queries, keys and values.
    - `window`: GPT-Neo's local window (by index: the kernel's own sliding window,
      no `n × n` mask is built), or `None`; a window needs `causal`.
    - `scale`: the factor on the scores; `causal`: only `j ≤ i` (cuDNN then skips
      the masked blocks).
    - `implementation`: `"cudnn"` or `"xla"` (the reference, on any backend).

    **Returns:**

    The mixed values `(n, h, k)`, in the dtype of `q` (scores and softmax in float32).
    No dense mask is taken: cuDNN's batching rule fails on a window's mask under `vmap`
    (BENCHMARKS.md, "cuDNN attention under `vmap`").
    """
    q, k, v = (a.swapaxes(0, 1) for a in (q, k, v))

    def attend(local):
        return jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=causal,
                                            local_window_size=local,
                                            implementation=implementation)

    if window is None:
        return attend(None)
    if not causal:
        raise ValueError("a fused sliding window needs causal attention (cuDNN keeps no "
                         "keys to the right of a query); use the einsum path.")
    # `i − j < size` with `j ≤ i`: the `size − 1` keys before the query and itself.
    return jax.lax.cond(window.on, lambda: attend((window.size - 1, 0)),
                        lambda: attend(None))


class MLP(eqx.Module):
    """The feed-forward sub-block `proj(act(fc(x)))`."""

    fc: Linear
    proj: Linear
    act: str = eqx.field(static=True)

    def __call__(self, x: Float[Array, "n d"], *,
                 precision: Precision = "float32") -> Float[Array, "n d"]:
        h = ACTIVATIONS[self.act](self.fc(x, precision=precision))
        return self.proj(h, precision=precision)


class GatedMLP(eqx.Module):
    """Llama's feed-forward sub-block `down(act(gate(x)) · up(x))`."""

    gate: Linear
    up: Linear
    down: Linear
    act: str = eqx.field(static=True)

    def __call__(self, x: Float[Array, "n d"], *,
                 precision: Precision = "float32") -> Float[Array, "n d"]:
        gate = ACTIVATIONS[self.act](self.gate(x, precision=precision))
        return self.down(gate * self.up(x, precision=precision), precision=precision)


class PreNormBlock(eqx.Module):
    """GPT-2 / GPT-Neo / Llama block: `x + attn(ln_1(x))`, then `x + mlp(ln_2(x))`.

    Without the feed-forward sub-block (`ffn=False`) the block is `x + attn(ln_1(x))`:
    the MLP, its normalisation `ln_2` and its residual are all dropped.
    """

    ln_1: LayerNorm | RMSNorm
    attn: Attention
    ln_2: LayerNorm | RMSNorm
    mlp: MLP | GatedMLP

    def __call__(self, x: Float[Array, "n d"], mask: Bool[Array, "n n"] | None, rotary=None,
                 *, ffn: bool = True, precision: Precision = "float32",
                 causal: bool = False, window: Window | None = None) -> Float[Array, "n d"]:
        x = x + self.attn(self.ln_1(x), mask, rotary, precision=precision, causal=causal,
                          window=window)
        return x + self.mlp(self.ln_2(x), precision=precision) if ffn else x

    def attention_probabilities(self, x: Float[Array, "n d"], mask, rotary=None, *,
                                precision: Precision = "float32") -> Float[Array, "h n n"]:
        return self.attn.probabilities(self.ln_1(x), mask, rotary, precision=precision)


class PostNormBlock(eqx.Module):
    """BERT / ALBERT block: `ln_attn(x + attn(x))`, then `ln_out(x + mlp(x))`.

    Without the feed-forward sub-block (`ffn=False`) the block is
    `ln_attn(x + attn(x))`: the MLP, its residual and `ln_out` are dropped.
    """

    attn: Attention
    ln_attn: LayerNorm
    mlp: MLP
    ln_out: LayerNorm

    def __call__(self, x: Float[Array, "n d"], mask: Bool[Array, "n n"] | None, rotary=None,
                 *, ffn: bool = True, precision: Precision = "float32",
                 causal: bool = False, window: Window | None = None) -> Float[Array, "n d"]:
        x = self.ln_attn(x + self.attn(x, mask, precision=precision, causal=causal,
                                       window=window))
        return self.ln_out(x + self.mlp(x, precision=precision)) if ffn else x

    def attention_probabilities(self, x: Float[Array, "n d"], mask, rotary=None, *,
                                precision: Precision = "float32") -> Float[Array, "h n n"]:
        return self.attn.probabilities(x, mask, precision=precision)
