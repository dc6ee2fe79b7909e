"""BERT: post-norm encoder blocks with full attention; word + position + segment
embeddings followed by a LayerNorm."""

import equinox as eqx
import jax
from jaxtyping import Array, Float, Int

from ._nn import LayerNorm, PostNormBlock
from .base import AbstractEncoder, TransformerConfig, encoder_config, stack


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
    block_names = ("attention.self.query", "attention.self.key", "attention.self.value",
                   "attention.output.dense", "attention.output.LayerNorm", "intermediate.dense",
                   "output.dense", "output.LayerNorm")

    def embed(self, ids: Int[Array, " n"], *, precision="float32") -> Float[Array, "n d"]:
        return self.embeddings(ids)

    @classmethod
    def config_from_hf(cls, hf):
        return encoder_config(hf, "bert")

    @classmethod
    def init(cls, cfg, key):
        ke, kb = jax.random.split(key)
        return cls(cfg, *cls.init_embeddings(cfg, ke, cfg.hidden_size), cls.init_blocks(cfg, kb))

    @classmethod
    def from_state(cls, cfg, src):
        blocks = (cls.load_block(cfg, src, f"encoder.layer.{i}") for i in range(cfg.num_layers))
        return cls(cfg, *cls.load_embeddings(cfg, src, cfg.hidden_size), stack(blocks))
