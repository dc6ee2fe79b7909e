"""What every transformer family provides: a config, embeddings, a stack of blocks
scanned over layers, and a final normalisation applied between passes."""

import abc
import dataclasses
from collections.abc import Iterable
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from ..._precision import Precision
from .._tokenize import detokenize, tokenize
from ._nn import Window, dense_mask, normal


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """The architecture of a model, read from a HuggingFace `config.json`.

    One record for all families; a field a family does not use keeps its default.
    Hashable, so it is a static field of the model.
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_positions: int | None
    norm_eps: float
    activation: str
    initializer_range: float = 0.02
    num_kv_heads: int | None = None
    head_dim: int | None = None
    embedding_size: int | None = None  # ALBERT's factorised embeddings
    type_vocab_size: int = 0  # BERT / ALBERT segment embeddings
    pad_token_id: int | None = None
    window_size: int | None = None  # GPT-Neo local attention
    attention_layers: tuple[str, ...] = ()  # GPT-Neo: "global" / "local" per layer
    rope_theta: float = 10000.0
    rope_scaling: tuple[tuple[str, Any], ...] = ()  # Llama: see `_rope.read_rope`
    attention_scale: float | None = None  # None: 1/√k; GPT-Neo: 1
    attention_bias: bool = False
    mlp_bias: bool = False
    causal: bool = True
    # Llama: the next-token head is the token embedding (`config.json`'s
    # `tie_word_embeddings`; HuggingFace's default for Llama is false). GPT-2 and
    # GPT-Neo always tie theirs.
    tie_word_embeddings: bool = True

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def dim_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def scale(self) -> float:
        return self.dim_head**-0.5 if self.attention_scale is None else self.attention_scale

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    # HuggingFace's spellings of the fields above.
    @property
    def num_hidden_layers(self) -> int:
        return self.num_layers

    @property
    def num_attention_heads(self) -> int:
        return self.num_heads

    @property
    def num_key_value_heads(self) -> int:
        return self.kv_heads

    @property
    def max_position_embeddings(self) -> int | None:
        return self.max_positions


def reject(hf: dict, key: str, ok, what: str) -> None:
    """`ValueError` when `hf[key]` holds a value jaxattn does not implement."""
    if key in hf and not ok(hf[key]):
        raise ValueError(f"config: {key}={hf[key]!r} is not supported ({what}).")


def token_table(cfg: TransformerConfig, key, width: int) -> Float[Array, "V e"]:
    """A token embedding `(vocab_size, width)` drawn `N(0, std²)`, the row of
    `pad_token_id` zeroed (HuggingFace's initialisation)."""
    table = normal(key, (cfg.vocab_size, width), cfg.initializer_range)
    if cfg.pad_token_id is not None and 0 <= cfg.pad_token_id < cfg.vocab_size:
        table = table.at[cfg.pad_token_id].set(0.0)
    return table


def check_sizes(cfg: TransformerConfig) -> TransformerConfig:
    """`ValueError` for head counts that do not divide the sizes (each size itself
    was checked in `config.json`)."""
    for bad, message in (
        (cfg.head_dim is None and cfg.hidden_size % cfg.num_heads,
         f"hidden size {cfg.hidden_size} is not a multiple of the {cfg.num_heads} attention "
         "heads"),
        (cfg.num_heads % cfg.kv_heads, f"{cfg.num_heads} attention heads are not a multiple "
         f"of the {cfg.kv_heads} key-value heads"),
    ):
        if bad:
            raise ValueError(f"config: {message}.")
    return cfg


class AbstractTransformer(eqx.Module):
    """A transformer as a discrete dynamical system: `embed`, then blocks, then
    `final_norm` (the normalisation applied after the last block, and between
    passes when the model is looped).

    `blocks` is one block module whose arrays carry a leading layer axis (of
    length `num_slots`); layer `l` uses slot `slots[l]` (all layers share slot 0
    in ALBERT).

    `embed` and `apply_block` take the keyword `precision` of their matrix products
    (`"float32"` by default, see `jaxattn._precision`): one implementation serves
    every precision, and the blocks stay one stacked module scanned over layers.
    """

    config: eqx.AbstractVar[TransformerConfig]
    blocks: eqx.AbstractVar[eqx.Module]
    # The file holding the model's tokenizer (a folder's `tokenizer.json`, a `.gguf`
    # file), set by `ja.models.load`; `None`: none (random weights, a folder without one).
    tokenizer_file: str | None = eqx.field(static=True, default=None, kw_only=True)

    family: ClassVar[str]
    # The HuggingFace name of a tensor every checkpoint of the family holds (to find
    # where its tensors start), and the prefix HuggingFace's task-head models put
    # before them (their `base_model_prefix`, with the dot).
    probe: eqx.AbstractClassVar[str]
    prefix: eqx.AbstractClassVar[str]
    # Whether `config.max_positions` bounds the sequence length: a learned position
    # table does, rotary positions do not.
    bounded_positions: eqx.AbstractClassVar[bool]
    # The HuggingFace classes of the family (the names `architectures` may hold), and
    # the other spellings of its config fields (the config class's `attribute_map`).
    hf_classes: eqx.AbstractClassVar[tuple[str, ...]]
    hf_aliases: ClassVar[dict[str, str]] = {}

    @abc.abstractmethod
    def embed(
        self, ids: Int[Array, " n"], *, precision: Precision = "float32"
    ) -> Float[Array, "n d"]:
        """Token (+ position, + segment) embeddings of one sequence: the input of block 0
        (`precision`: of ALBERT's projection to the hidden size, the one product here)."""

    @abc.abstractmethod
    def final_norm(self, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        """The normalisation after the last block (identity for BERT/ALBERT)."""

    @classmethod
    @abc.abstractmethod
    def config_from_hf(cls, hf: dict[str, Any]) -> TransformerConfig:
        """Read a HuggingFace `config.json` dict; `ValueError` for what is unsupported."""

    @classmethod
    @abc.abstractmethod
    def init_block(cls, cfg: TransformerConfig, key) -> eqx.Module:
        """One block with HuggingFace's initialisation."""

    @classmethod
    @abc.abstractmethod
    def init(cls, cfg: TransformerConfig, key) -> "AbstractTransformer":
        """The whole model with HuggingFace's initialisation."""

    @classmethod
    @abc.abstractmethod
    def from_state(cls, cfg: TransformerConfig, src) -> "AbstractTransformer":
        """Build from HuggingFace-named tensors (`src.get(name, shape)`)."""

    @property
    def num_layers(self) -> int:
        return self.config.num_layers

    @property
    def slots(self) -> tuple[int, ...]:
        """The block slot each layer uses (layer `l`: slot `l mod num_slots`)."""
        return tuple(layer % self.num_slots(self.config) for layer in range(self.num_layers))

    @classmethod
    def num_slots(cls, cfg: TransformerConfig) -> int:
        return cfg.num_layers

    @classmethod
    def init_blocks(cls, cfg: TransformerConfig, key) -> eqx.Module:
        """All block slots, stacked, each from its own key."""
        keys = jax.random.split(key, cls.num_slots(cfg))
        return eqx.filter_vmap(lambda k: cls.init_block(cfg, k))(keys)

    def head(self) -> Float[Array, "V d"] | None:
        """The output embedding of the next-token logits (`logits = final_norm(x) ·
        headᵀ`, HuggingFace's `lm_head`), or `None`: the family has no next-token
        head (the encoders)."""
        return None

    def tokenize(self, texts, **options):
        """Token ids of `texts` with the tokenizer the model was loaded with (as
        TransformerLens's `to_tokens`): `ja.models.tokenize(model.tokenizer_file,
        texts, **options)`, same options (`tokens`, `pad`, `return_mask`, …)."""
        return tokenize(self._tokenizer(), texts, **options)

    def detokenize(self, ids, **options):
        """The text of token ids with the model's own tokenizer (as TransformerLens's
        `to_string`): `ja.models.detokenize(model.tokenizer_file, ids, **options)`."""
        return detokenize(self._tokenizer(), ids, **options)

    def _tokenizer(self) -> str:
        if self.tokenizer_file is None:
            raise ValueError(f"this {type(self).__name__} carries no tokenizer (it was not "
                             "loaded from a folder with tokenizer.json or a .gguf file): use "
                             "ja.models.tokenize(SOURCE, texts) with the tokenizer's folder.")
        return self.tokenizer_file

    def context(self, n: int) -> Any:
        """Per-sequence-length constants the blocks need (rotary tables)."""
        return None

    def window(self, layer: Int[Array, ""]) -> Window | None:
        """`layer`'s sliding window by index (GPT-Neo's local layers), or `None`."""
        return None

    def mask(self, n: int, layer: Int[Array, ""]) -> Bool[Array, "n n"]:
        """The attention mask of `layer` (which tokens each token may attend to)."""
        return dense_mask(n, self.config.causal, None, self.window(layer))

    def apply_block(
        self, block, x: Float[Array, "n d"], layer: Int[Array, ""], ctx, *, ffn: bool = True,
        precision: Precision = "float32", keys: Bool[Array, " n"] | None = None,
    ) -> Float[Array, "n d"]:
        """Run one block on one sequence (`ffn=False` drops the feed-forward sub-block
        together with its normalisation, keeping the attention residual; `precision`
        of every matrix product in it). The window goes by index, so that a long
        sequence's blocked attention never builds an `n × n` mask. `keys` (the
        attention mask of padding, HuggingFace's `attention_mask`): the tokens every
        token may attend to (`False`: padding, never attended to); `None`: all."""
        mask = None if keys is None else jnp.broadcast_to(keys[None, :], (x.shape[0],) * 2)
        return block(x, mask, ctx, ffn=ffn, precision=precision, causal=self.config.causal,
                     window=self.window(layer))

    def block_attention(
        self, block, x: Float[Array, "n d"], layer: Int[Array, ""], ctx, *,
        precision: Precision = "float32",
    ) -> Float[Array, "h n n"]:
        """The attention probabilities of one block on its input `x` (one sequence),
        per head: HuggingFace's `output_attentions`."""
        return block.attention_probabilities(x, self.mask(x.shape[0], layer), ctx,
                                             precision=precision)

    def layer_block(self, layer: int) -> eqx.Module:
        """The block (weights) used by `layer`, unstacked."""
        slot = self.slots[layer]
        return jax.tree.map(lambda a: a[slot], self.blocks)


def stack(blocks: Iterable) -> Any:
    """The block of each layer (or slot), in order, as one block whose arrays carry a
    leading layer axis. Stacked by NumPy first: weights read from files stay on the
    host until the one transfer of each stacked array."""
    return jax.tree.map(lambda *xs: jnp.asarray(np.stack(xs)), *blocks)
