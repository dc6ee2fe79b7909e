"""GPT-2: pre-norm blocks, learned positions, causal attention scaled by `1/√k`."""

import math

import equinox as eqx
import jax
import numpy as np
from jaxtyping import Array, Float

from ._nn import MLP, Attention, LayerNorm, Linear, PreNormBlock, normal
from .base import AbstractLearnedPositionDecoder, TransformerConfig, decoder_config, reject


class GPT2(AbstractLearnedPositionDecoder):
    """GPT-2 (`model_type: gpt2`), every size from `gpt2` to `gpt2-xl`."""

    config: TransformerConfig = eqx.field(static=True)
    wte: Float[Array, "V d"]
    wpe: Float[Array, "P d"]
    blocks: PreNormBlock
    ln_f: LayerNorm
    lm_head: Float[Array, "V d"] | None = None  # None: tied to `wte`

    family = "gpt2"
    conv1d = True
    hf_classes = ("GPT2Model", "GPT2LMHeadModel", "GPT2DoubleHeadsModel",
                  "GPT2ForSequenceClassification", "GPT2ForTokenClassification",
                  "GPT2ForQuestionAnswering")
    hf_aliases = {"hidden_size": "n_embd", "max_position_embeddings": "n_positions",
                  "num_attention_heads": "n_head", "num_hidden_layers": "n_layer"}

    @classmethod
    def config_from_hf(cls, hf):
        reject(hf, "scale_attn_by_inverse_layer_idx", lambda v: not v, "layer-dependent scaling")
        reject(hf, "add_cross_attention", lambda v: not v, "cross-attention to an encoder")
        d = hf.get("n_embd", 768)
        return decoder_config(
            hf, "gpt2", hidden_size=d, num_layers=hf.get("n_layer", 12),
            num_heads=hf.get("n_head", 12), intermediate_size=hf.get("n_inner") or 4 * d,
            max_positions=hf.get("n_positions", 1024),
            attention_scale=None if hf.get("scale_attn_weights", True) else 1.0,
        )

    @classmethod
    def init_block(cls, cfg, key):
        d, std = cfg.hidden_size, cfg.initializer_range
        # GPT-2's scaled residual projections: std / √(2 L) for both c_proj.
        proj_std = std / math.sqrt(2 * cfg.num_layers)
        ka, ko, kf, kp = jax.random.split(key, 4)
        attn = Attention.init(ka, d, cfg.num_heads, cfg.num_heads, cfg.dim_head, std, True,
                              cfg.scale)
        attn = eqx.tree_at(lambda a: a.output, attn, normal(ko, attn.output.shape, proj_std))
        mlp = MLP(Linear.init(kf, d, cfg.intermediate_size, std),
                  Linear.init(kp, cfg.intermediate_size, d, proj_std), cfg.activation)
        ln = LayerNorm.init(d, cfg.norm_eps)
        return PreNormBlock(ln, attn, ln, mlp)

    @classmethod
    def read_attention(cls, cfg, src, prefix):
        d, h = cfg.hidden_size, cfg.num_heads
        qkv = cls.load_linear(src, f"{prefix}.attn.c_attn", d, 3 * d)
        q, k, v = map(Linear, np.split(qkv.weight, 3), np.split(qkv.bias, 3))
        out = cls.load_linear(src, f"{prefix}.attn.c_proj", d, d)
        return Attention.from_linear(q, k, v, out, h, h, cfg.scale)
