"""What a model's attention does, layer by layer: the attention probabilities of
every head (HuggingFace's `output_attentions`), and a cache of the named
activations of a looped model, both computed from the hidden states that
`hidden_states` and `loop` return."""

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from .._precision import Precision
from .._programs import kept_jit
from ._arch import AbstractTransformer
from ._loop import hidden_states, loop, setup_loop


@kept_jit
def _patterns(model, inputs, layers, *, precision: str):
    """The attention probabilities `(T, h, n, n)` of the blocks of `layers (T,)` on
    their inputs `(T, n, d)`, one block at a time (no copy of the weights per step)."""
    ctx, slots = model.context(inputs.shape[1], inputs.dtype), jnp.asarray(model.slots)

    def one(args):
        x, layer = args
        block = jax.tree.map(lambda a: a[slots[layer]], model.blocks)
        return model.block_attention(block, x, layer, ctx, precision=precision)

    return jax.lax.map(one, (inputs, layers))


def attention_patterns(
    model: AbstractTransformer, ids: Int[Array, " n"], *, precision: Precision = "float32"
) -> Float[Array, "L h n n"]:
    """The attention probabilities of every layer and head for one sequence, as
    HuggingFace's `output_attentions=True` returns them.

    **Arguments:**

    - `model`: from `ja.models.load` or `ja.models.init`.
    - `ids`: token ids `(n,)` of one sequence (`jax.vmap` over a batch).
    - `precision`: of every matrix product (see `ja.models.hidden_states`).

    **Returns:**

    `(L, h, n, n)`: entry `[l, η, i, j]` is how much token `i` attends to token `j`
    in head `η` of layer `l` (rows sum to 1; 0 where the mask forbids). Dense at
    every `n`, as the patterns are `n × n` by definition (one layer at a time), while
    the forward passes behind them take key blocks at long context.
    """
    if np.ndim(ids) != 1:
        raise ValueError(f"`ids` must be one sequence (n,), got shape {np.shape(ids)}; "
                         f"use jax.vmap for a batch.")
    hs = hidden_states(model, ids, precision=precision, progress=False)
    return _patterns(model, hs[:-1], jnp.arange(model.num_layers), precision=precision)


def run_with_cache(
    model: AbstractTransformer, ids: Int[Array, "*B n"], *, passes: int = 1, ffn: bool = True,
    precision: Precision = "float32",
) -> dict[str, Array]:
    """Run a model `passes` times over (as `ja.models.loop`) and keep its named
    activations.

    **Arguments:**

    - `model`: from `ja.models.load` or `ja.models.init`.
    - `ids`: token ids `(n,)` or `(B, n)`.
    - `passes`, `ffn`, `precision`: as in `ja.models.loop`.

    **Returns:**

    A dict of arrays (with a leading `B` for a batch), `T = passes·L` blocks:

    - `"hidden_states"`: `(T + 1, n, d)`, the embeddings then the output of every
      block, before the final norm (the states `loop` saves);
    - `"attention_patterns"`: `(T, h, n, n)`, the attention probabilities of every
      block on its input (after the final norm at the start of a later pass);
    - `"E"`: `(T + 1,)`, `loop`'s measure at the same depths.
    """
    setup = setup_loop(model, ids, passes=passes, ffn=ffn, precision=precision)
    L = model.num_layers
    T = setup.passes * L
    E, states = loop(model, setup.ids, passes=setup.passes, ffn=ffn, precision=precision,
                     save_states=range(T + 1), progress=False)
    depth = np.arange(T)
    again = jnp.asarray((depth % L == 0) & (depth > 0))[:, None, None]

    def patterns(xs):
        inputs = jnp.where(again, jax.vmap(model.final_norm)(xs[:-1]), xs[:-1])
        return _patterns(model, inputs, jnp.asarray(depth % L), precision=precision)

    cache = {"hidden_states": states, "attention_patterns": jax.vmap(patterns)(states), "E": E}
    return {k: v[0] for k, v in cache.items()} if np.ndim(ids) == 1 else cache
