"""BERT: post-norm encoder blocks with full attention; word + position + segment
embeddings followed by a LayerNorm."""

import equinox as eqx
import jax
from jaxtyping import Array, Float, Int

from ._nn import MLP, Attention, LayerNorm, Linear, PostNormBlock, bias_heads, heads_in, normal
from .base import AbstractTransformer, TransformerConfig, check_sizes, reject, stack, token_table


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


def init_embeddings(cfg: TransformerConfig, key, width: int):
    """Word, position and segment tables (`N(0, std²)`, padding row zeroed, as HF does)."""
    kw, kp, kt = jax.random.split(key, 3)
    std = cfg.initializer_range
    return (token_table(cfg, kw, width), normal(kp, (cfg.max_positions, width), std),
            normal(kt, (cfg.type_vocab_size, width), std), LayerNorm.init(width, cfg.norm_eps))


def load_embeddings(cfg: TransformerConfig, src, width: int):
    p = "embeddings"
    return (src.get(f"{p}.word_embeddings.weight", (cfg.vocab_size, width)),
            src.get(f"{p}.position_embeddings.weight", (cfg.max_positions, width)),
            src.get(f"{p}.token_type_embeddings.weight", (cfg.type_vocab_size, width)),
            LayerNorm.load(src, f"{p}.LayerNorm", width, cfg.norm_eps))


def load_attention(cfg: TransformerConfig, src, names: dict[str, str]) -> Attention:
    """Per-head attention from the `query`, `key`, `value`, `output` linear layers."""
    d, h = cfg.hidden_size, cfg.num_heads
    q, k, v, o = (Linear.load(src, names[n], d, d) for n in ("query", "key", "value", "output"))
    return Attention(heads_in(q.weight, h), heads_in(k.weight, h), heads_in(v.weight, h),
                     o.weight.reshape(d, h, d // h), bias_heads(q.bias, h), bias_heads(k.bias, h),
                     bias_heads(v.bias, h), o.bias, cfg.scale)


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


class Bert(AbstractEncoder):
    """BERT (`model_type: bert`): base, large, and checkpoints such as all-MiniLM-L6-v2."""

    config: TransformerConfig = eqx.field(static=True)
    word: Float[Array, "V d"]
    position: Float[Array, "P d"]
    segment: Float[Array, "T d"]
    ln_embed: LayerNorm
    blocks: PostNormBlock

    family = "bert"
    hf_classes = ("BertModel", "BertForMaskedLM", "BertForMultipleChoice",
                  "BertForNextSentencePrediction", "BertForPreTraining",
                  "BertForQuestionAnswering", "BertForSequenceClassification",
                  "BertForTokenClassification", "BertLMHeadModel")
    prefix = "bert."

    def embed(self, ids: Int[Array, " n"], *, precision="float32") -> Float[Array, "n d"]:
        return self.embeddings(ids)

    @classmethod
    def config_from_hf(cls, hf):
        return encoder_config(hf, "bert")

    @classmethod
    def init(cls, cfg, key):
        ke, kb = jax.random.split(key)
        return cls(cfg, *init_embeddings(cfg, ke, cfg.hidden_size), cls.init_blocks(cfg, kb))

    @classmethod
    def from_state(cls, cfg, src):
        d, inner = cfg.hidden_size, cfg.intermediate_size

        def block(i):
            p = f"encoder.layer.{i}"
            attn = load_attention(cfg, src, {
                "query": f"{p}.attention.self.query", "key": f"{p}.attention.self.key",
                "value": f"{p}.attention.self.value", "output": f"{p}.attention.output.dense"})
            mlp = MLP(Linear.load(src, f"{p}.intermediate.dense", d, inner),
                      Linear.load(src, f"{p}.output.dense", inner, d), cfg.activation)
            return PostNormBlock(
                attn, LayerNorm.load(src, f"{p}.attention.output.LayerNorm", d, cfg.norm_eps), mlp,
                LayerNorm.load(src, f"{p}.output.LayerNorm", d, cfg.norm_eps))

        return cls(cfg, *load_embeddings(cfg, src, d), stack(map(block, range(cfg.num_layers))))
