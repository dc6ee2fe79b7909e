"""ALBERT: BERT's post-norm block shared by every layer, with factorised
embeddings (width `embedding_size`, then a linear map to the hidden size)."""

import equinox as eqx
import jax
from jaxtyping import Array, Float, Int

from ._nn import MLP, LayerNorm, Linear, PostNormBlock
from .base import TransformerConfig, reject, stack
from .bert import AbstractEncoder, encoder_config, init_embeddings, load_attention, load_embeddings


class Albert(AbstractEncoder):
    """ALBERT (`model_type: albert`): base, large, xlarge, xxlarge (v1 and v2).

    `blocks` holds one block (slot 0) that all `num_hidden_layers` layers apply.
    Only the standard layout is supported: one hidden group with one inner layer.
    """

    config: TransformerConfig = eqx.field(static=True)
    word: Float[Array, "V e"]
    position: Float[Array, "P e"]
    segment: Float[Array, "T e"]
    ln_embed: LayerNorm
    project: Linear
    blocks: PostNormBlock

    family = "albert"
    hf_classes = ("AlbertModel", "AlbertForMaskedLM", "AlbertForMultipleChoice",
                  "AlbertForPreTraining", "AlbertForQuestionAnswering",
                  "AlbertForSequenceClassification", "AlbertForTokenClassification")
    prefix = "albert."

    @classmethod
    def num_slots(cls, cfg) -> int:
        return 1

    def embed(self, ids: Int[Array, " n"], *, precision="float32") -> Float[Array, "n d"]:
        return self.project(self.embeddings(ids), precision=precision)

    @classmethod
    def config_from_hf(cls, hf) -> TransformerConfig:
        reject(hf, "num_hidden_groups", lambda v: v == 1, "only one hidden group")
        reject(hf, "inner_group_num", lambda v: v == 1, "only one layer per group")
        hf = {"vocab_size": 30000, "hidden_size": 4096, "num_attention_heads": 64,
              "intermediate_size": 16384, "hidden_act": "gelu_new", **hf}
        return encoder_config(hf, "albert", embedding_size=hf.get("embedding_size", 128))

    @classmethod
    def init(cls, cfg, key):
        ke, kp, kb = jax.random.split(key, 3)
        e = cfg.embedding_size
        project = Linear.init(kp, e, cfg.hidden_size, cfg.initializer_range)
        return cls(cfg, *init_embeddings(cfg, ke, e), project, cls.init_blocks(cfg, kb))

    @classmethod
    def from_state(cls, cfg, src):
        d, e, inner = cfg.hidden_size, cfg.embedding_size, cfg.intermediate_size
        p = "encoder.albert_layer_groups.0.albert_layers.0"
        attn = load_attention(cfg, src, {
            "query": f"{p}.attention.query", "key": f"{p}.attention.key",
            "value": f"{p}.attention.value", "output": f"{p}.attention.dense"})
        mlp = MLP(Linear.load(src, f"{p}.ffn", d, inner),
                  Linear.load(src, f"{p}.ffn_output", inner, d), cfg.activation)
        eps = cfg.norm_eps
        block = PostNormBlock(attn, LayerNorm.load(src, f"{p}.attention.LayerNorm", d, eps),
                              mlp, LayerNorm.load(src, f"{p}.full_layer_layer_norm", d, eps))
        project = Linear.load(src, "encoder.embedding_hidden_mapping_in", e, d)
        return cls(cfg, *load_embeddings(cfg, src, e), project, stack([block]))
