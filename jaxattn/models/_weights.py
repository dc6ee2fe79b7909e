"""Per-layer weights of real models in the simulator's terms (`Q_η`, `K_η`,
`U_η = W_O^η W_V^η`), and editing them (e.g. rank-1 steering of a layer)."""

import operator

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._dynamics import SelfAttentionDynamics
from .._precision import Precision, check_precision, einsum
from .._validate import is_concrete, refuse_first
from ._arch import AbstractTransformer
from ._arch._nn import Attention
from ._checks import check_model


def _check_layer(model: AbstractTransformer, layer) -> int:
    """`layer` as an index in `[0, L)`: Python's indexing, so `-1` is the last layer
    and `-L` the first; anything else (`L`, `-L - 1`, a float, a bool) is refused."""
    check_model(model)
    L = model.num_layers
    try:
        index = None if isinstance(layer, bool) else operator.index(layer)
    except TypeError:
        index = None
    if index is None or not -L <= index < L:
        raise ValueError(f"`layer` must be an integer in [0, {L}) for this {L}-layer model, or "
                         f"in [-{L}, 0) to count from the last layer (-1), got {layer!r}.")
    return index % L


def layer_weights(model: AbstractTransformer, layer: int) -> eqx.Module:
    """The block used by `layer` (`-1` is the last), unstacked: its norms, `attn` (an
    `Attention` with per-head `query`, `key`, `value` `(h, k, d)` and `output`
    `(d, h, k)`) and `mlp`.

    ALBERT's layers all return the one shared block.
    """
    return model.layer_block(_check_layer(model, layer))


def attention_weights(model: AbstractTransformer, layer: int) -> Attention:
    """The attention sub-module of `layer` (per-head weights and biases, `scale`);
    `-1` is the last layer."""
    return layer_weights(model, layer).attn


def value_output(attn: Attention, *, precision: Precision = "float32") -> Float[Array, "h d d"]:
    """`U_η = W_O^η W_V^η` for every head (key–value heads shared across a group),
    a product at `precision` (true float32 by default, see `jaxattn._precision`)."""
    refuse_first([(not isinstance(attn, Attention), TypeError, "value_output takes a "
                   f"ja.models.Attention (attention_weights(model, layer)), got "
                   f"{type(attn).__name__}.")])
    group = attn.num_heads // attn.num_kv_heads
    value = jnp.repeat(attn.value, group, axis=0)
    return einsum("dhk,hke->hde", attn.output, value, precision=check_precision(precision))


def attention_dynamics(
    model: AbstractTransformer, layer: int, *, precision: Precision = "float32"
) -> SelfAttentionDynamics:
    """The simulator's view of one layer: `SelfAttentionDynamics.from_factors(Q, K, U)`.

    `Q_η`, `K_η` are the head's query/key projections `(k, d)`, `U_η = W_O^η W_V^η`
    (`(d, d)`, paper 004's per-head term of the layer matrix `Ω = Σ_η U_η`),
    `β` the model's score scale (`1/√k`; 1 for GPT-Neo), `causal` the model's and,
    on GPT-Neo's `local` layers, `window` its `window_size`. Shared key heads stay
    shared (`K` is `(g, k, d)`, as Llama's `num_key_value_heads`). What the
    simulator does not model is left out: biases, the layer's norms and positions
    (learned or rotary).

    **Arguments:**

    - `model`: from `ja.models.load` / `ja.models.init`.
    - `layer`: the layer index in `[0, L)`, or in `[-L, 0)` counting from the end
      as Python does (`-1` is the last layer); any other value is refused.
    - `precision`: the dynamics' `precision` (of its attention products when it
      runs); `U_η` itself is formed in true float32 once.

    **Returns:**

    A `ja.SelfAttentionDynamics` with `h` heads in dimension `d`.
    """
    precision = check_precision(precision)
    layer = _check_layer(model, layer)
    attn, window = model.layer_block(layer).attn, model.window(layer)
    return SelfAttentionDynamics.from_factors(
        attn.query, attn.key, value_output(attn), beta=attn.scale, causal=model.config.causal,
        window=window.size if window is not None and window.on else None, precision=precision,
    )


def replace_attention(model: AbstractTransformer, layer: int, attn: Attention):
    """A copy of `model` whose `layer` (`-1` is the last) uses the attention weights
    `attn` (same shapes).

    For ALBERT the shared block changes, so every layer sees `attn`.
    """
    layer = _check_layer(model, layer)
    old = model.layer_block(layer).attn
    refuse_first([(not isinstance(attn, Attention), TypeError, "replace_attention takes a "
                   f"ja.models.Attention (e.g. attention_weights(model, {layer})), got "
                   f"{type(attn).__name__}.")])
    none = {"is_leaf": lambda x: x is None}  # an absent bias is a leaf on both sides
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(attn, **none),
                            jax.tree.leaves(old, **none)):
        name = f"`attn{jax.tree_util.keystr(path)}`"
        refuse_first([(np.shape(a) != np.shape(b), f"replace_attention: {name} has shape "
                       f"{np.shape(a)}; layer {layer}'s has {np.shape(b)} (a replacement keeps "
                       "the shapes)."),
                      # a NaN ran, and the loop's E after the layer was NaN
                      (a is not None and is_concrete(a) and not np.all(np.isfinite(a)),
                       f"replace_attention: {name} holds NaN or inf entries; pass finite "
                       "weights.")])
    slot = model.slots[layer]
    new = jax.tree.map(lambda stacked, a: stacked.at[slot].set(a), model.blocks.attn, attn)
    return eqx.tree_at(lambda m: m.blocks.attn, model, new)
