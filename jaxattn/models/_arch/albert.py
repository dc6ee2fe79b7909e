"""ALBERT: BERT's post-norm block shared by every layer, with factorised
embeddings (width `embedding_size`, then a linear map to the hidden size)."""

import equinox as eqx
import jax
from jaxtyping import Array, Float, Int

from ._nn import LayerNorm, Linear, PostNormBlock
from .base import AbstractEncoder, TransformerConfig, encoder_config, reject, stack


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
    block_names = ("attention.query", "attention.key", "attention.value", "attention.dense",
                   "attention.LayerNorm", "ffn", "ffn_output", "full_layer_layer_norm")

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
        return cls(cfg, *cls.init_embeddings(cfg, ke, e), project, cls.init_blocks(cfg, kb))

    @classmethod
    def from_state(cls, cfg, src):
        block = cls.load_block(cfg, src, "encoder.albert_layer_groups.0.albert_layers.0")
        e, d = cfg.embedding_size, cfg.hidden_size
        project = Linear.load(src, "encoder.embedding_hidden_mapping_in", e, d)
        return cls(cfg, *cls.load_embeddings(cfg, src, e), project, stack([block]))
