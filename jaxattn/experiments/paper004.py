"""Paper 004 ("Analogies between transformer layers and the power method"): the
shared frame of its experiments (`power-shared`, `power-layers`, `steer`,
`oja-bipartite`): the real model a run's flags ask for, random prompts, and the
base of its members (their own parameters only)."""

import jax
import numpy as np

from ..models import PRESETS, init, load, resolve_config
from ..spectral import LayerAlignment, random_tokens
from .base import AbstractExperiment, Param

_TRAINED = {"minilm": "all-MiniLM-L6-v2", "smollm2": "SmolLM2-135M-Instruct"}
_RANDOM = {"bert": "bert-base-uncased", "gpt_neo": "gpt-neo-125M"}
#: The config keys of the width and the head count, by `model_type` (else BERT's).
_WIDTH_KEYS = {"gpt2": ("n_embd", "n_head"), "gpt_neo": ("hidden_size", "num_heads")}

MODEL_FLAGS = (
    Param("minilm", bool, False, "all-MiniLM-L6-v2, trained weights (pip package)"),
    Param("smollm2", bool, False, "SmolLM2-135M-Instruct, trained weights (gguf)"),
    Param("hidden", int, 384, "width d of the random config (0: the preset's)", 0),
    Param("heads", int, 6, "heads of the random config (0: the preset's)", 0),
    Param("std", float, 0.02, "std of the random weights (HF initializer_range)", 0.0),
)
TOKENS = (
    Param("prompts", int, 100, "random prompts", 1),
    Param("tokens", int, 10, "tokens per prompt (initial tokens N(0, I))", 1),
    Param("tau", float, 1.0, "step τ of eq. 3", 0.0),
)


def prompts_refusal(config) -> tuple[bool, str]:
    """`refusals`' entry of the experiments whose verdict's errors are over prompts (a
    prompt's tokens move together): one prompt gives none."""
    return (config.prompts < 2, f"--prompts must be ≥ 2: the verdict's standard errors are "
            f"over prompts (a prompt's tokens move together), got {config.prompts}.")


def _chosen(config, default: str) -> tuple[str, bool]:
    """The name of the model a config asks for, and whether it is a trained one."""
    trained = [_TRAINED[k] for k in _TRAINED if config.get(k)]
    if trained:
        return trained[0], True
    return next((_RANDOM[k] for k in _RANDOM if config.get(k)), default), False


def native_depth(config, default: str) -> int:
    """The number of layers of the model a config asks for, read from its config
    alone (no weights: cheap enough for `refusals`)."""
    return resolve_config(_chosen(config, default)[0])[0].num_layers


def model_from_flags(config, default: str):
    """The model a config asks for (at most one model flag: `check_config`), and a
    name for it."""
    preset, trained = _chosen(config, default)
    if trained:
        return load(preset), preset + " (trained)"
    cfg = dict(PRESETS[preset], initializer_range=config.std)
    width, heads = _WIDTH_KEYS.get(cfg["model_type"], ("hidden_size", "num_attention_heads"))
    if config.hidden:
        cfg[width] = config.hidden
    if config.heads:
        cfg[heads] = config.heads
    key = jax.random.PRNGKey(config.seed + 1000)
    return init(cfg, key), (f"{preset} config, random N(0, {config.std:g}²), "
                            f"d={cfg[width]}, h={cfg[heads]}")


def stats_arrays(stats: LayerAlignment) -> dict[str, np.ndarray]:
    """A `LayerAlignment` (with a layer axis) as NumPy arrays, for `data.npz`."""
    return {f"stat_{f}": np.asarray(getattr(stats, f)) for f in stats.__dataclass_fields__}


def random_prompts(config, d, offset=0):
    key = jax.random.PRNGKey(config.seed + offset)
    return random_tokens(key, config.prompts, config.tokens, d)


#: The smallest `--std`: the random weights' products (of order std²) stay above
#: float32's smallest normal number, where the models compute.
MIN_STD = float(np.sqrt(np.finfo(np.float32).tiny))
#: The largest `--std`: past it the products overflow float32.
MAX_STD = float(np.sqrt(np.finfo(np.float32).max))


class AbstractPowerExperiment(AbstractExperiment):
    """A paper 004 experiment: its own parameters only (no flow horizon or saves)."""

    # A trained model has its own width and heads: `--hidden`/`--heads` beside it are
    # refused, and the run records 0 ("the model's").
    presets = {flag: {"hidden": 0, "heads": 0} for flag in _TRAINED}

    def refusals(self, config):
        chosen = ["--" + k.replace("_", "-") for k in (*_TRAINED, *_RANDOM) if config.get(k)]
        return ((len(chosen) > 1, f"choose at most one model flag ({', '.join(chosen)})."),
                (bool(config.get("hidden")) and bool(config.get("heads"))
                 and config.get("hidden") % config.get("heads") != 0,
                 f"--hidden {config.get('hidden')} is not a multiple of --heads "
                 f"{config.get('heads')}: each head takes hidden/heads coordinates."),
                ("std" in config and config.get("std") < MIN_STD,
                 f"--std {config.get('std')!r}: the random weights' products (of order std²) "
                 "underflow float32, where the models compute (all zero); choose --std ≥ "
                 f"{MIN_STD:.2g}."),
                ("std" in config and config.get("std") > MAX_STD,
                 f"--std {config.get('std')!r}: the random weights' products (of order std²) "
                 f"overflow float32, where the models compute; choose --std ≤ {MAX_STD:.2g}."))


#: The family of the random config (default GPT-2).
FAMILY_FLAGS = (
    Param("bert", bool, False, "random BERT config instead of GPT-2"),
    Param("gpt_neo", bool, False, "random GPT-Neo config instead of GPT-2"),
)
