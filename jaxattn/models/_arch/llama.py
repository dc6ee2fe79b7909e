"""Llama family (SmolLM2, Llama 2/3, …): RMSNorm, rotary positions,
grouped-query attention, gated MLP, no position table."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from ._nn import Attention, GatedMLP, Linear, PreNormBlock, RMSNorm, normal
from ._rope import read_rope, rotary_tables
from .base import (
    AbstractTransformer,
    TransformerConfig,
    check_sizes,
    load_attention,
    next_token_head,
    read_head,
    reject,
    stack,
    token_table,
)


class Llama(AbstractTransformer):
    """A Llama-family decoder (`model_type: llama`), e.g. SmolLM2-135M.

    The last hidden state (and the input of every later pass) goes through the
    final RMSNorm `norm`, as in HuggingFace's `LlamaModel`.

    `config_from_hf` and `read_rope` say which `config.json` fields are read (rotary
    scalings: `default`, `linear`, `dynamic`, `llama3`, `yarn`); a field that would
    change the forward pass and that jaxattn does not implement (`pretraining_tp` ≠ 1,
    `partial_rotary_factor` ≠ 1, another `rope_type`) is refused by name.

    The next-token head (`ja.models.logits`) is the checkpoint's `lm_head.weight`
    (llama.cpp's `output.weight`), else the tied token embedding: docs/usage/models.md,
    "Logits after k passes".
    """

    config: TransformerConfig = eqx.field(static=True)
    embed_tokens: Float[Array, "V d"]
    blocks: PreNormBlock
    norm: RMSNorm
    lm_head: Float[Array, "V d"] | None = None  # None: tied, or untied and missing

    family = "llama"
    hf_classes = ("LlamaModel", "LlamaForCausalLM", "LlamaForSequenceClassification",
                  "LlamaForTokenClassification", "LlamaForQuestionAnswering")
    probe = "embed_tokens.weight"
    prefix = "model."
    bounded_positions = False  # rotary positions

    def embed(self, ids: Int[Array, " n"], *, precision="float32") -> Float[Array, "n d"]:
        return self.embed_tokens[ids]

    def final_norm(self, x):
        return self.norm(x)

    def head(self):
        return next_token_head(self.lm_head, self.embed_tokens, self.config)

    def context(self, n: int, dtype=jnp.float32):
        cfg = self.config
        return rotary_tables(n, cfg.dim_head, cfg.rope_theta, cfg.rope_scaling, cfg.max_positions,
                             dtype)

    @classmethod
    def config_from_hf(cls, hf):
        reject(hf, "pretraining_tp", lambda v: v in (None, 1), "tensor-parallel slicing")
        heads = hf.get("num_attention_heads", 32)
        theta, scaling = read_rope(hf)
        return check_sizes(TransformerConfig(
            model_type="llama", vocab_size=hf.get("vocab_size", 32000),
            hidden_size=hf.get("hidden_size", 4096), num_layers=hf.get("num_hidden_layers", 32),
            num_heads=heads, num_kv_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim"), intermediate_size=hf.get("intermediate_size", 11008),
            max_positions=hf.get("max_position_embeddings", 2048),
            norm_eps=hf.get("rms_norm_eps", 1e-6), activation=hf.get("hidden_act", "silu"),
            initializer_range=hf.get("initializer_range", 0.02), rope_theta=theta,
            rope_scaling=scaling,
            attention_bias=bool(hf.get("attention_bias", False)),
            mlp_bias=bool(hf.get("mlp_bias", False)), pad_token_id=hf.get("pad_token_id"),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        ))

    @classmethod
    def init_block(cls, cfg, key):
        d, std, inner = cfg.hidden_size, cfg.initializer_range, cfg.intermediate_size
        ka, kg, ku, kd = jax.random.split(key, 4)
        attn = Attention.init(ka, d, cfg.num_heads, cfg.kv_heads, cfg.dim_head, std,
                              cfg.attention_bias, cfg.scale)
        mlp = GatedMLP(Linear.init(kg, d, inner, std, cfg.mlp_bias),
                       Linear.init(ku, d, inner, std, cfg.mlp_bias),
                       Linear.init(kd, inner, d, std, cfg.mlp_bias), cfg.activation)
        norm = RMSNorm.init(d, cfg.norm_eps)
        return PreNormBlock(norm, attn, norm, mlp)

    @classmethod
    def init(cls, cfg, key):
        ke, kb = jax.random.split(key)
        norm = RMSNorm.init(cfg.hidden_size, cfg.norm_eps)
        # an untied head of its own, as HuggingFace draws one (from a key of its own)
        head = None if cfg.tie_word_embeddings else normal(
            jax.random.fold_in(ke, 1), (cfg.vocab_size, cfg.hidden_size), cfg.initializer_range)
        return cls(cfg, token_table(cfg, ke, cfg.hidden_size), cls.init_blocks(cfg, kb), norm, head)

    @classmethod
    def from_state(cls, cfg, src):
        d, inner, eps = cfg.hidden_size, cfg.intermediate_size, cfg.norm_eps

        def block(i):
            p = f"layers.{i}"
            attn = load_attention(cfg, src, [f"{p}.self_attn.{n}_proj" for n in "qkvo"],
                                  cfg.attention_bias)
            mb = cfg.mlp_bias
            mlp = GatedMLP(Linear.load(src, f"{p}.mlp.gate_proj", d, inner, mb),
                           Linear.load(src, f"{p}.mlp.up_proj", d, inner, mb),
                           Linear.load(src, f"{p}.mlp.down_proj", inner, d, mb), cfg.activation)
            return PreNormBlock(RMSNorm(src.get(f"{p}.input_layernorm.weight", (d,)), eps), attn,
                                RMSNorm(src.get(f"{p}.post_attention_layernorm.weight", (d,)), eps),
                                mlp)

        return cls(cfg, src.get("embed_tokens.weight", (cfg.vocab_size, d)),
                   stack(map(block, range(cfg.num_layers))),
                   RMSNorm(src.get("norm.weight", (d,)), eps), read_head(src, cfg))
