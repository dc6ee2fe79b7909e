"""GPT-Neo: GPT-2's pre-norm block with unscaled scores and alternating global /
local (sliding-window) causal attention."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from ._nn import MLP, Attention, LayerNorm, Linear, PreNormBlock, Window, normal
from .base import AbstractLearnedPositionDecoder, TransformerConfig, decoder_config, load_attention


def expand_attention_types(types, layers: int) -> tuple[str, ...]:
    """`[[["global", "local"], 6]]` → `("global", "local", …)` (12 entries), one
    `"global"` or `"local"` for each of the `layers` layers."""
    try:
        out = tuple(kind for kinds, repeat in types for _ in range(repeat) for kind in kinds)
    except (TypeError, ValueError):
        out = None
    if out is None or not set(out) <= {"global", "local"} or len(out) != layers:
        raise ValueError(
            f"config: attention_types must look like [[['global', 'local'], 6]] and describe "
            f"num_layers={layers} layers, each 'global' or 'local', got {types!r}."
        )
    return out


class GPTNeo(AbstractLearnedPositionDecoder):
    """GPT-Neo (`model_type: gpt_neo`): 125M, 1.3B, 2.7B.

    Unlike GPT-2, the scores are not divided by `√k` (HuggingFace's GPT-Neo has no
    scaling), and every `local` layer lets a token attend only to the
    `window_size` most recent tokens, itself included.
    """

    config: TransformerConfig = eqx.field(static=True)
    wte: Float[Array, "V d"]
    wpe: Float[Array, "P d"]
    blocks: PreNormBlock
    ln_f: LayerNorm
    lm_head: Float[Array, "V d"] | None = None  # None: tied to `wte`

    family = "gpt_neo"
    conv1d = False
    hf_classes = ("GPTNeoModel", "GPTNeoForCausalLM", "GPTNeoForSequenceClassification",
                  "GPTNeoForTokenClassification", "GPTNeoForQuestionAnswering")
    hf_aliases = {"num_attention_heads": "num_heads", "num_hidden_layers": "num_layers"}

    def window(self, layer: Int[Array, ""]) -> Window:
        local = jnp.asarray([kind == "local" for kind in self.config.attention_layers])
        return Window(self.config.window_size, local[layer])

    @classmethod
    def config_from_hf(cls, hf):
        d = hf.get("hidden_size", 2048)
        layers = hf.get("num_layers", 24)
        kinds = expand_attention_types(hf.get("attention_types", [[["global", "local"], 12]]),
                                       layers)
        return decoder_config(
            hf, "gpt_neo", hidden_size=d, num_layers=layers, num_heads=hf.get("num_heads", 16),
            intermediate_size=hf.get("intermediate_size") or 4 * d,
            max_positions=hf.get("max_position_embeddings", 2048),
            window_size=hf.get("window_size", 256), attention_layers=kinds, attention_scale=1.0,
        )

    @classmethod
    def init_block(cls, cfg, key):
        d, h, std = cfg.hidden_size, cfg.num_heads, cfg.initializer_range
        kq, kk, kv, ko, kf, kp = jax.random.split(key, 6)
        k = cfg.dim_head
        attn = Attention(normal(kq, (h, k, d), std), normal(kk, (h, k, d), std),
                         normal(kv, (h, k, d), std), normal(ko, (d, h, k), std), None, None,
                         None, jnp.zeros((d,), jnp.float32), cfg.scale)
        mlp = MLP(Linear.init(kf, d, cfg.intermediate_size, std),
                  Linear.init(kp, cfg.intermediate_size, d, std), cfg.activation)
        ln = LayerNorm.init(d, cfg.norm_eps)
        return PreNormBlock(ln, attn, ln, mlp)

    @classmethod
    def read_attention(cls, cfg, src, prefix):
        names = [f"{prefix}.attn.attention.{n}_proj" for n in ("q", "k", "v", "out")]
        return load_attention(cfg, src, names, bias=False, output_bias=True)
