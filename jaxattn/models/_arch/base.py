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
from ..._validate import refuse_first
from .._tokenize import detokenize, tokenize
from ._nn import (
    MLP,
    Attention,
    LayerNorm,
    Linear,
    PostNormBlock,
    PreNormBlock,
    Window,
    dense_mask,
    normal,
)


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
    # The next-token head is the token embedding (`config.json`'s `tie_word_embeddings`;
    # HuggingFace's default is false for Llama, true for GPT-2 and GPT-Neo), unless the
    # checkpoint holds its own `lm_head.weight` (`read_head`).
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


def load_attention(cfg: TransformerConfig, src, names, bias: bool = True,
                   output_bias: bool | None = None) -> Attention:
    """Per-head attention from HuggingFace's four linear layers `names` (query, key,
    value, output), each with a bias when `bias` (the output's: `output_bias`, by
    default `bias`)."""
    d, h, g, k = cfg.hidden_size, cfg.num_heads, cfg.kv_heads, cfg.dim_head
    q, kk, v = (Linear.load(src, name, d, m * k, bias) for name, m in zip(names, (h, g, g)))
    o = Linear.load(src, names[3], h * k, d, bias if output_bias is None else output_bias)
    return Attention.from_linear(q, kk, v, o, h, g, cfg.scale)


def check_sizes(cfg: TransformerConfig) -> TransformerConfig:
    """`ValueError` for head counts that do not divide the sizes (each size itself
    was checked in `config.json`)."""
    refuse_first((bad, f"config: {message}.") for bad, message in (
        (cfg.head_dim is None and cfg.hidden_size % cfg.num_heads,
         f"hidden size {cfg.hidden_size} is not a multiple of the {cfg.num_heads} attention "
         "heads"),
        (cfg.num_heads % cfg.kv_heads, f"{cfg.num_heads} attention heads are not a multiple "
         f"of the {cfg.kv_heads} key-value heads"),
    ))
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

    def context(self, n: int, dtype=jnp.float32) -> Any:
        """Per-sequence-length constants the blocks need (rotary tables, computed in
        the tokens' `dtype`, at least float32)."""
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


class AbstractLearnedPositionDecoder(AbstractTransformer):
    """What GPT-2 and GPT-Neo share: token plus learned position embeddings, a final
    LayerNorm, random initialisation of both with `initializer_range`, and pre-norm
    blocks whose tensors are named `h.{i}.ln_1`, `h.{i}.mlp.c_fc`, … (each member
    reads its own attention)."""

    wte: eqx.AbstractVar[Float[Array, "V d"]]
    wpe: eqx.AbstractVar[Float[Array, "P d"]]
    ln_f: eqx.AbstractVar[LayerNorm]

    probe = "wte.weight"
    prefix = "transformer."
    bounded_positions = True
    # Whether the linear layers are HuggingFace's `Conv1D`, its weight stored `(in, out)`
    # (GPT-2), and so transposed at load time.
    conv1d: eqx.AbstractClassVar[bool]

    def embed(self, ids: Int[Array, " n"], *, precision="float32") -> Float[Array, "n d"]:
        return self.wte[ids] + self.wpe[: ids.shape[0]]

    lm_head: eqx.AbstractVar[Float[Array, "V d"] | None]

    def final_norm(self, x):
        return self.ln_f(x)

    def head(self):
        return next_token_head(self.lm_head, self.wte, self.config)

    @classmethod
    @abc.abstractmethod
    def read_attention(cls, cfg: TransformerConfig, src, prefix: str) -> Attention:
        """The attention of the block whose tensors start with `prefix` (`h.{i}`)."""

    @classmethod
    def load_linear(cls, src, name: str, d_in: int, d_out: int) -> Linear:
        if not cls.conv1d:
            return Linear.load(src, name, d_in, d_out)
        return Linear(src.get(f"{name}.weight", (d_in, d_out)).T,
                      src.get(f"{name}.bias", (d_out,)))

    @classmethod
    def init(cls, cfg, key):
        ke, kp, kb = jax.random.split(key, 3)
        std = cfg.initializer_range
        return cls(cfg, normal(ke, (cfg.vocab_size, cfg.hidden_size), std),
                   normal(kp, (cfg.max_positions, cfg.hidden_size), std),
                   cls.init_blocks(cfg, kb), LayerNorm.init(cfg.hidden_size, cfg.norm_eps))

    @classmethod
    def from_state(cls, cfg, src):
        d, inner, eps = cfg.hidden_size, cfg.intermediate_size, cfg.norm_eps

        def block(i):
            p = f"h.{i}"
            attn = cls.read_attention(cfg, src, p)
            mlp = MLP(cls.load_linear(src, f"{p}.mlp.c_fc", d, inner),
                      cls.load_linear(src, f"{p}.mlp.c_proj", inner, d), cfg.activation)
            return PreNormBlock(LayerNorm.load(src, f"{p}.ln_1", d, eps), attn,
                                LayerNorm.load(src, f"{p}.ln_2", d, eps), mlp)

        return cls(cfg, src.get("wte.weight", (cfg.vocab_size, d)),
                   src.get("wpe.weight", (cfg.max_positions, d)),
                   stack(map(block, range(cfg.num_layers))), LayerNorm.load(src, "ln_f", d, eps),
                   read_head(src, cfg))


def read_head(src, cfg: TransformerConfig):
    """The checkpoint's own next-token head `lm_head.weight`, or `None`. It sits beside
    the model's tensors, outside their prefix; one saved in a tied checkpoint is read
    too (HuggingFace does not tie a head that differs)."""
    if "lm_head.weight" not in src.readers:
        return None
    return type(src)(src.readers, "").get("lm_head.weight", (cfg.vocab_size, cfg.hidden_size))


def next_token_head(head, embedding, cfg: TransformerConfig):
    """The head of `ja.models.logits`: the checkpoint's `head`, else the tied token
    `embedding`; a model untied by its config with no head of its own has none."""
    if head is not None:
        return head
    if not cfg.tie_word_embeddings:
        raise ValueError(
            f"this {cfg.model_type} checkpoint has no lm_head.weight and its config.json "
            "says tie_word_embeddings: false, so it has no next-token head: add the "
            "checkpoint's lm_head.weight, or set tie_word_embeddings: true if the head is "
            "the token embedding.")
    return embedding


def decoder_config(hf: dict, model_type: str, **extra) -> TransformerConfig:
    """The fields GPT-2 and GPT-Neo configs share."""
    return check_sizes(TransformerConfig(
        model_type=model_type, vocab_size=hf.get("vocab_size", 50257),
        norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        activation=hf.get("activation_function", "gelu_new"),
        initializer_range=hf.get("initializer_range", 0.02),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)), **extra,
    ))


def encoder_config(hf: dict, model_type: str, **extra) -> TransformerConfig:
    """The fields BERT and ALBERT configs share."""
    reject(hf, "position_embedding_type", lambda v: v == "absolute", "only absolute positions")
    reject(hf, "is_decoder", lambda v: not v, "decoder use of an encoder")
    return check_sizes(TransformerConfig(
        model_type=model_type, vocab_size=hf.get("vocab_size", 30522),
        hidden_size=hf.get("hidden_size", 768), num_layers=hf.get("num_hidden_layers", 12),
        num_heads=hf.get("num_attention_heads", 12),
        intermediate_size=hf.get("intermediate_size", 3072),
        max_positions=hf.get("max_position_embeddings", 512),
        norm_eps=hf.get("layer_norm_eps", 1e-12), activation=hf.get("hidden_act", "gelu"),
        initializer_range=hf.get("initializer_range", 0.02),
        type_vocab_size=hf.get("type_vocab_size", 2), pad_token_id=hf.get("pad_token_id", 0),
        causal=False, **extra,
    ))


class AbstractEncoder(AbstractTransformer):
    """What BERT and ALBERT share: word + position + segment embeddings (segment ids
    all 0, HuggingFace's default) through a LayerNorm, post-norm blocks with
    HuggingFace's initialisation, and no final norm (the last block ends with its
    own LayerNorm)."""

    word: eqx.AbstractVar[Float[Array, "V e"]]
    position: eqx.AbstractVar[Float[Array, "P e"]]
    segment: eqx.AbstractVar[Float[Array, "T e"]]
    ln_embed: eqx.AbstractVar[LayerNorm]

    probe = "embeddings.word_embeddings.weight"
    bounded_positions = True
    # HuggingFace's names of a block's tensors after the block's prefix: the query,
    # key, value and output of the attention, its LayerNorm, the feed-forward layers
    # in and out, and their LayerNorm.
    block_names: eqx.AbstractClassVar[tuple[str, ...]]

    def embeddings(self, ids: Int[Array, " n"]) -> Float[Array, "n e"]:
        """The normalised sum of the word, segment and position embeddings."""
        return self.ln_embed(self.word[ids] + self.segment[0][None] + self.position[: ids.shape[0]])

    def final_norm(self, x):
        return x

    @classmethod
    def init_block(cls, cfg, key):
        d, std = cfg.hidden_size, cfg.initializer_range
        ka, kf, kp = jax.random.split(key, 3)
        attn = Attention.init(ka, d, cfg.num_heads, cfg.num_heads, cfg.dim_head, std, True,
                              cfg.scale)
        mlp = MLP(Linear.init(kf, d, cfg.intermediate_size, std),
                  Linear.init(kp, cfg.intermediate_size, d, std), cfg.activation)
        ln = LayerNorm.init(d, cfg.norm_eps)
        return PostNormBlock(attn, ln, mlp, ln)

    @staticmethod
    def init_embeddings(cfg: TransformerConfig, key, width: int):
        """Word, position and segment tables (`N(0, std²)`, padding row zeroed, as HF
        does) and their LayerNorm."""
        kw, kp, kt = jax.random.split(key, 3)
        std = cfg.initializer_range
        return (token_table(cfg, kw, width), normal(kp, (cfg.max_positions, width), std),
                normal(kt, (cfg.type_vocab_size, width), std), LayerNorm.init(width, cfg.norm_eps))

    @staticmethod
    def load_embeddings(cfg: TransformerConfig, src, width: int):
        p = "embeddings"
        return (src.get(f"{p}.word_embeddings.weight", (cfg.vocab_size, width)),
                src.get(f"{p}.position_embeddings.weight", (cfg.max_positions, width)),
                src.get(f"{p}.token_type_embeddings.weight", (cfg.type_vocab_size, width)),
                LayerNorm.load(src, f"{p}.LayerNorm", width, cfg.norm_eps))

    @classmethod
    def load_block(cls, cfg: TransformerConfig, src, prefix: str) -> PostNormBlock:
        """The block whose tensors are `{prefix}.{name}`, `name` in `block_names`."""
        d, inner, eps = cfg.hidden_size, cfg.intermediate_size, cfg.norm_eps
        *attention, ln_attn, fc, proj, ln_out = (f"{prefix}.{n}" for n in cls.block_names)
        attn = load_attention(cfg, src, attention)
        mlp = MLP(Linear.load(src, fc, d, inner), Linear.load(src, proj, inner, d),
                  cfg.activation)
        return PostNormBlock(attn, LayerNorm.load(src, ln_attn, d, eps), mlp,
                             LayerNorm.load(src, ln_out, d, eps))
