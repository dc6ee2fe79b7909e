"""The looped-model experiments of paper 001 §6.2 as run folders: `run_loop` (one
setting, `jaxattn loop`) and `run_loop_grid` (weights × FFN, `jaxattn run loop-grid`)."""

import os
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from .._runs import create_run_folder, finish_run, package_versions, save_npz, write_json
from ..models._load import PACKAGED, init, load, resolve_config
from ..models._run import WEIGHTS, loop
from .loop_plots import save_grid_figure, save_loop_figure

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def prompt_ids(vocab_size: int, prompts: int, tokens: int, seed: int) -> np.ndarray:
    """`prompts × tokens` ids drawn uniformly from the vocabulary (the paper's 100 × 200)."""
    if prompts < 1 or tokens < 1:
        raise ValueError(f"--prompts and --tokens must be ≥ 1, got {prompts} and {tokens}.")
    return np.random.default_rng(seed).integers(0, vocab_size, (prompts, tokens))


def check_counts(**counts) -> None:
    for name, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"--{name} must be an integer ≥ 1, got {value!r}.")


def get_model(spec, weights: str, key):
    """The model to loop: trained weights are loaded; for random weights a config
    (preset, config.json, model folder) suffices, so nothing is downloaded."""
    if not isinstance(spec, (str, os.PathLike)):
        return spec  # already a model
    if weights == "trained" or str(spec).endswith(".gguf") or str(spec) in PACKAGED:
        return load(spec)
    return init(resolve_config(spec)[0], key)


def _settings(spec, model, **opts) -> dict:
    return {"model": str(spec) if isinstance(spec, (str, os.PathLike)) else type(spec).__name__,
            "model_config": model.config.to_dict(), **opts, "versions": package_versions()}


def _describe(E: np.ndarray, L: int) -> dict:
    mean = E.mean(axis=0)
    return {"E_input_mean": mean[0], "E_after_pass_1_mean": mean[min(L, len(mean) - 1)],
            "E_final_mean": mean[-1], "E_final_p10": np.quantile(E[:, -1], 0.1),
            "E_final_p90": np.quantile(E[:, -1], 0.9)}


def run_loop(model, out=None, seed: int = 0, *, weights="trained", passes=20, ffn=True,
             prompts=100, tokens=200, dtype="float32", save_states=None) -> Path:
    """Loop `model` (a path, hub name, preset/config, or a model) and write a run folder:
    `config.json`, `data.npz` (`E` `(prompts, passes·L+1)`, the ids, saved states),
    `loop.png`/`loop.pdf` and `summary.json`. Returns the folder."""
    if weights not in WEIGHTS:
        raise ValueError(f"--weights must be one of {WEIGHTS}, got {weights!r}.")
    if dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of {list(DTYPES)}, got {dtype!r}.")
    check_counts(passes=passes, prompts=prompts, tokens=tokens)
    key = jax.random.PRNGKey(seed)
    net = get_model(model, weights, key)
    ids = prompt_ids(net.config.vocab_size, prompts, tokens, seed)
    folder = create_run_folder("loop", out)
    write_json(folder / "config.json", _settings(
        model, net, weights=weights, passes=passes, ffn=ffn, prompts=prompts, tokens=tokens,
        dtype=dtype, seed=seed, save_states=save_states))
    t0 = time.perf_counter()
    res = loop(net, ids, passes=passes, ffn=ffn, weights=weights, key=key,
               dtype=DTYPES[dtype], save_states=save_states)
    E, states = res if save_states is not None else (res, None)
    E = np.asarray(jax.block_until_ready(E))
    seconds = time.perf_counter() - t0
    arrays = {"E": E, "ids": ids}
    if states is not None:
        arrays |= {"states": np.asarray(states, np.float32), "depths": np.asarray(save_states)}
    save_npz(folder / "data.npz", **arrays)
    L = net.num_layers
    title = (f"{model}: {weights} weights, {'full blocks' if ffn else 'no FFN'}, "
             f"{prompts}×{tokens} tokens, {passes} passes")
    for suffix in ("png", "pdf"):
        save_loop_figure(E, L, folder / f"loop.{suffix}", title=title,
                         variant="full" if ffn else "attn")
    finish_run(folder, {**_describe(E, L), "layers_per_pass": L, "seconds": seconds,
                        "seconds_per_pass_incl_compile": seconds / passes})
    return folder


def grid_results(model, seed: int = 0, *, passes=20, prompts=100, tokens=200,
                 dtype="float32", weights=WEIGHTS) -> tuple[dict, object, np.ndarray]:
    """`E` for every weight kind in `weights` with and without FFN: a dict
    `(weights, "attn" | "full") → (prompts, passes·L + 1)`, the model, the ids."""
    bad = [w for w in weights if w not in WEIGHTS]
    if bad or not weights:
        raise ValueError(f"weights must be a non-empty subset of {WEIGHTS}, got {weights!r}.")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}.")
    check_counts(passes=passes, prompts=prompts, tokens=tokens)
    key = jax.random.PRNGKey(seed)
    nets = {w: get_model(model, w, key) for w in dict.fromkeys(
        "trained" if w == "trained" else "random" for w in weights)}
    net = next(iter(nets.values()))
    ids = prompt_ids(net.config.vocab_size, prompts, tokens, seed)
    results = {}
    for w in weights:
        src = nets["trained" if w == "trained" else "random"]
        for variant, ffn in (("attn", False), ("full", True)):
            E = loop(src, ids, passes=passes, ffn=ffn, weights=w, key=key, dtype=DTYPES[dtype])
            results[w, variant] = np.asarray(E)
    return results, net, ids


def run_loop_grid(model, out=None, seed: int = 0, *, passes=20, prompts=100, tokens=200,
                  dtype="float32", weights=WEIGHTS) -> Path:
    """The paper's Figs. 7–10 for one model: every weight kind in `weights`
    (trained, random, resample) with and without feed-forward blocks.

    Trained weights need a loadable model (a folder, .gguf, packaged or reachable
    hub name); with a preset/config only, pass `weights=("random", "resample")`.
    Writes `config.json`, `data.npz` (`E_<weights>_<attn|full>`),
    `loop_grid.png/.pdf` and `summary.json`; returns the folder.
    """
    folder = create_run_folder("loop-grid", out)
    results, net, ids = grid_results(model, seed, passes=passes, prompts=prompts,
                                     tokens=tokens, dtype=dtype, weights=weights)
    write_json(folder / "config.json", _settings(
        model, net, weights=list(weights), passes=passes, prompts=prompts, tokens=tokens,
        dtype=dtype, seed=seed))
    save_npz(folder / "data.npz", ids=ids, **{f"E_{w}_{v}": E for (w, v), E in results.items()})
    title = f"{model}: {prompts}×{tokens} random tokens, {passes} passes"
    for suffix in ("png", "pdf"):
        save_grid_figure(results, net.num_layers, folder / f"loop_grid.{suffix}", title=title)
    summary = {f"{w}_{v}": _describe(E, net.num_layers) for (w, v), E in results.items()}
    finish_run(folder, {"layers_per_pass": net.num_layers, **summary})
    return folder
