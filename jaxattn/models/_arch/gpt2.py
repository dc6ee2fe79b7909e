"""GPT-2: pre-norm blocks, learned positions, causal attention scaled by `1/√k`."""

import math

import equinox as eqx
import jax
import numpy as np
from jaxtyping import Array, Float, Int

from ._nn import (
    MLP,
    Attention,
    LayerNorm,
    Linear,
    PreNormBlock,
    bias_heads,
    heads_in,
    heads_out,
    normal,
)
from .base import AbstractTransformer, TransformerConfig, check_sizes, reject, stack


class AbstractLearnedPositionDecoder(AbstractTransformer):
    """What GPT-2 and GPT-Neo share: token plus learned position embeddings, a final
    LayerNorm, and random initialisation of both with `initializer_range`."""

    wte: eqx.AbstractVar[Float[Array, "V d"]]
    wpe: eqx.AbstractVar[Float[Array, "P d"]]
    ln_f: eqx.AbstractVar[LayerNorm]

    probe = "wte.weight"
    prefix = "transformer."
    bounded_positions = True

    def embed(self, ids: Int[Array, " n"], *, precision="float32") -> Float[Array, "n d"]:
        return self.wte[ids] + self.wpe[: ids.shape[0]]

    def final_norm(self, x):
        return self.ln_f(x)

    def head(self):
        return self.wte  # HuggingFace's LM-head models tie it to the token embedding

    @classmethod
    def init(cls, cfg, key):
        ke, kp, kb = jax.random.split(key, 3)
        std = cfg.initializer_range
        return cls(cfg, normal(ke, (cfg.vocab_size, cfg.hidden_size), std),
                   normal(kp, (cfg.max_positions, cfg.hidden_size), std),
                   cls.init_blocks(cfg, kb), LayerNorm.init(cfg.hidden_size, cfg.norm_eps))


class GPT2(AbstractLearnedPositionDecoder):
    """GPT-2 (`model_type: gpt2`), every size from `gpt2` to `gpt2-xl`."""

    config: TransformerConfig = eqx.field(static=True)
    wte: Float[Array, "V d"]
    wpe: Float[Array, "P d"]
    blocks: PreNormBlock
    ln_f: LayerNorm

    family = "gpt2"
    hf_classes = ("GPT2Model", "GPT2LMHeadModel", "GPT2DoubleHeadsModel",
                  "GPT2ForSequenceClassification", "GPT2ForTokenClassification",
                  "GPT2ForQuestionAnswering")
    hf_aliases = {"hidden_size": "n_embd", "max_position_embeddings": "n_positions",
                  "num_attention_heads": "n_head", "num_hidden_layers": "n_layer"}

    @classmethod
    def config_from_hf(cls, hf):
        reject(hf, "scale_attn_by_inverse_layer_idx", lambda v: not v, "layer-dependent scaling")
        d = hf.get("n_embd", 768)
        return check_sizes(TransformerConfig(
            model_type="gpt2", vocab_size=hf.get("vocab_size", 50257), hidden_size=d,
            num_layers=hf.get("n_layer", 12), num_heads=hf.get("n_head", 12),
            intermediate_size=hf.get("n_inner") or 4 * d,
            max_positions=hf.get("n_positions", 1024),
            norm_eps=hf.get("layer_norm_epsilon", 1e-5),
            activation=hf.get("activation_function", "gelu_new"),
            initializer_range=hf.get("initializer_range", 0.02),
            attention_scale=None if hf.get("scale_attn_weights", True) else 1.0,
        ))

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
    def from_state(cls, cfg, src):
        d, h, inner, eps = cfg.hidden_size, cfg.num_heads, cfg.intermediate_size, cfg.norm_eps

        def conv(name, d_in, d_out):  # GPT-2's Conv1D stores (in, out)
            return Linear(src.get(f"{name}.weight", (d_in, d_out)).T,
                          src.get(f"{name}.bias", (d_out,)))

        def block(i):
            p = f"h.{i}"
            qkv = conv(f"{p}.attn.c_attn", d, 3 * d)
            (wq, wk, wv), (bq, bk, bv) = np.split(qkv.weight, 3), np.split(qkv.bias, 3)
            out = conv(f"{p}.attn.c_proj", d, d)
            attn = Attention(heads_in(wq, h), heads_in(wk, h), heads_in(wv, h),
                             heads_out(out.weight, h), bias_heads(bq, h), bias_heads(bk, h),
                             bias_heads(bv, h), out.bias, cfg.scale)
            mlp = MLP(conv(f"{p}.mlp.c_fc", d, inner), conv(f"{p}.mlp.c_proj", inner, d),
                      cfg.activation)
            return PreNormBlock(LayerNorm.load(src, f"{p}.ln_1", d, eps), attn,
                                LayerNorm.load(src, f"{p}.ln_2", d, eps), mlp)

        return cls(cfg, src.get("wte.weight", (cfg.vocab_size, d)),
                   src.get("wpe.weight", (cfg.max_positions, d)),
                   stack(map(block, range(cfg.num_layers))), LayerNorm.load(src, "ln_f", d, eps))
