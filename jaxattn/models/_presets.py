"""The `config.json` of every model size in paper 004's table (and SmolLM2-135M),
as published on the HuggingFace hub, so random-weight runs need no download; and
the types and ranges of the fields jaxattn reads from any `config.json`.

Only architecture fields are kept (dropout, task heads and tokenizer ids do not
change the hidden states).
"""

from ._arch._nn import ACTIVATIONS
from ._arch._rope import real_problem

_GPT2 = {"model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024, "n_inner": None,
         "activation_function": "gelu_new", "layer_norm_epsilon": 1e-05,
         "initializer_range": 0.02, "scale_attn_weights": True}
_NEO = {"model_type": "gpt_neo", "vocab_size": 50257, "max_position_embeddings": 2048,
        "window_size": 256, "intermediate_size": None, "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-05, "initializer_range": 0.02}
_BERT = {"model_type": "bert", "vocab_size": 30522, "max_position_embeddings": 512,
         "type_vocab_size": 2, "hidden_act": "gelu", "layer_norm_eps": 1e-12,
         "initializer_range": 0.02, "pad_token_id": 0, "position_embedding_type": "absolute"}
_ALBERT = {"model_type": "albert", "vocab_size": 30000, "embedding_size": 128,
           "max_position_embeddings": 512, "type_vocab_size": 2, "hidden_act": "gelu_new",
           "layer_norm_eps": 1e-12, "initializer_range": 0.02, "num_hidden_groups": 1,
           "inner_group_num": 1, "pad_token_id": 0, "position_embedding_type": "absolute"}


def _neo(d, layers, heads):
    return {**_NEO, "hidden_size": d, "num_layers": layers, "num_heads": heads,
            "attention_types": [[["global", "local"], layers // 2]]}


PRESETS: dict[str, dict] = {
    "gpt2": {**_GPT2, "n_embd": 768, "n_layer": 12, "n_head": 12},
    "gpt2-medium": {**_GPT2, "n_embd": 1024, "n_layer": 24, "n_head": 16},
    "gpt2-large": {**_GPT2, "n_embd": 1280, "n_layer": 36, "n_head": 20},
    "gpt2-xl": {**_GPT2, "n_embd": 1600, "n_layer": 48, "n_head": 25},
    "gpt-neo-125M": _neo(768, 12, 12),
    "gpt-neo-1.3B": _neo(2048, 24, 16),
    "gpt-neo-2.7B": _neo(2560, 32, 20),
    "bert-base-uncased": {**_BERT, "hidden_size": 768, "num_hidden_layers": 12,
                          "num_attention_heads": 12, "intermediate_size": 3072},
    "bert-large-uncased": {**_BERT, "hidden_size": 1024, "num_hidden_layers": 24,
                           "num_attention_heads": 16, "intermediate_size": 4096},
    "albert-base-v2": {**_ALBERT, "hidden_size": 768, "num_hidden_layers": 12,
                       "num_attention_heads": 12, "intermediate_size": 3072},
    "albert-large-v2": {**_ALBERT, "hidden_size": 1024, "num_hidden_layers": 24,
                        "num_attention_heads": 16, "intermediate_size": 4096},
    "albert-xlarge-v2": {**_ALBERT, "hidden_size": 2048, "num_hidden_layers": 24,
                         "num_attention_heads": 16, "intermediate_size": 8192},
    "albert-xxlarge-v2": {**_ALBERT, "hidden_size": 4096, "num_hidden_layers": 12,
                          "num_attention_heads": 64, "intermediate_size": 16384},
    "SmolLM2-135M": {
        "model_type": "llama", "vocab_size": 49152, "hidden_size": 576,
        "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
        "num_key_value_heads": 3, "max_position_embeddings": 8192, "rms_norm_eps": 1e-05,
        "rope_theta": 100000.0, "hidden_act": "silu", "initializer_range": 0.041666666666666664,
        "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False,
    },
}

# Hub ids people type, mapped to the presets above.
ALIASES = {
    "openai-community/gpt2": "gpt2", "openai-community/gpt2-medium": "gpt2-medium",
    "openai-community/gpt2-large": "gpt2-large", "openai-community/gpt2-xl": "gpt2-xl",
    "EleutherAI/gpt-neo-125M": "gpt-neo-125M", "EleutherAI/gpt-neo-1.3B": "gpt-neo-1.3B",
    "EleutherAI/gpt-neo-2.7B": "gpt-neo-2.7B",
    "google-bert/bert-base-uncased": "bert-base-uncased",
    "google-bert/bert-large-uncased": "bert-large-uncased",
    "albert/albert-base-v2": "albert-base-v2", "albert/albert-large-v2": "albert-large-v2",
    "albert/albert-xlarge-v2": "albert-xlarge-v2", "albert/albert-xxlarge-v2": "albert-xxlarge-v2",
    "HuggingFaceTB/SmolLM2-135M": "SmolLM2-135M",
    "HuggingFaceTB/SmolLM2-135M-Instruct": "SmolLM2-135M",
}


# --- the fields of any config.json ------------------------------------------------

# HuggingFace config keys the families read, by kind; each is checked where present.
_INTEGERS = {  # key → smallest value
    "vocab_size": 1, "n_embd": 1, "n_layer": 1, "n_head": 1, "n_inner": 1, "n_positions": 1,
    "hidden_size": 1, "num_layers": 1, "num_heads": 1, "num_hidden_layers": 1,
    "num_attention_heads": 1, "num_key_value_heads": 1, "intermediate_size": 1,
    "max_position_embeddings": 1, "head_dim": 1, "embedding_size": 1, "window_size": 1,
    "type_vocab_size": 0, "pad_token_id": None,
}
# Keys HuggingFace itself writes as null ("derive it from the others").
_NULLABLE = {"n_inner", "intermediate_size", "num_key_value_heads", "head_dim", "pad_token_id"}
_POSITIVE = ("layer_norm_epsilon", "layer_norm_eps", "rms_norm_eps", "rope_theta")
_FLAGS = ("scale_attn_weights", "attention_bias", "mlp_bias", "tie_word_embeddings")
_ACTIVATION_KEYS = ("activation_function", "hidden_act")


def _field_problem(key: str, value) -> str | None:
    """What is wrong with the config field `key` = `value`, or None."""
    if key in _INTEGERS:
        least = _INTEGERS[key]
        integer = isinstance(value, int) and not isinstance(value, bool)
        if (value is None and key in _NULLABLE) or (
                integer and (least is None or value >= least)):
            return None
        return f"`{key}` must be an integer{'' if least is None else f' ≥ {least}'}, got {value!r}."
    if key in _POSITIVE or key == "initializer_range":
        return real_problem(key, value, strict=key != "initializer_range")
    if key in _FLAGS and not isinstance(value, bool):
        return f"`{key}` must be true or false, got {value!r}."
    if key in _ACTIVATION_KEYS and not (isinstance(value, str) and value in ACTIVATIONS):
        return f"`{key}`: unsupported activation {value!r}; jaxattn knows {sorted(ACTIVATIONS)}."
    return None


def fields_problem(hf: dict, classes: tuple[str, ...]) -> str | None:
    """The first config field of the wrong type or range (a null size, a boolean
    head count, a negative or NaN epsilon, an unknown activation), before anything
    is built from it; or `architectures` (when given) not a list of HuggingFace
    class names of the config's `model_type`, `classes`. None when all are right."""
    problems = [_field_problem(key, value) for key, value in hf.items()]
    names = [] if hf.get("architectures") is None else hf["architectures"]
    if not (isinstance(names, list) and all(isinstance(v, str) for v in names)):
        problems.append(f"`architectures` must be a list of class names, got {names!r}.")
    else:
        problems += [f"`architectures` names {name!r}, not a class of model_type "
                     f"{hf.get('model_type')!r} ({', '.join(classes)}); fix `architectures` "
                     f"or `model_type`." for name in names if name not in classes]
    return next(filter(None, problems), None)


def canonical_names(hf: dict, aliases: dict[str, str]) -> tuple[dict, str | None]:
    """`hf` with HuggingFace's other spellings of a field (a config class's
    `attribute_map`, e.g. GPT-2's `num_hidden_layers` for `n_layer`) renamed to the
    one the family reads, and the problem when both spellings are given, differently."""
    out = dict(hf)
    for alias, name in aliases.items():
        if alias not in out:
            continue
        value = out.pop(alias)
        if name in out and (out[name] != value or type(out[name]) is not type(value)):
            return out, (f"`{alias}`={value!r} and `{name}`={out[name]!r} are two "
                         f"spellings of one field with different values; give one.")
        out[name] = value
    return out, None
