"""The looped-model study of paper 001 §6.2: real transformers fed their own output
far past their depth, the misalignment `E` recorded after every block. `jaxattn loop`
runs one setting, `loop-grid` every weight kind with and without feed-forward blocks
(Figs. 7–10); their run folders are written by `loop_runner.py`.
"""

import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._artifacts import figures
from .._horizon import CONSENSUS_TOL
from .._validate import check_count, refuse_first
from ..models import (
    ALIASES,
    PACKAGED,
    PRESETS,
    WEIGHTS,
    init,
    load,
    loop,
    resolve_config,
)
from .base import AbstractExperiment, Param, Verdict
from .verdicts import short

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def check_sizes(passes, prompts: int, tokens: int, dtype: str, weights=WEIGHTS, *, pad=None,
                text=None) -> None:
    """`ValueError` unless the counts are whole numbers ≥ 1, `dtype` is known,
    `weights` are weight kinds (a non-empty subset of `WEIGHTS`) and a `pad` comes
    with its `text`."""
    for name, value in (("--passes", passes), ("--prompts", prompts), ("--tokens", tokens)):
        check_count(value, name, 1)
    kinds = (weights,) if isinstance(weights, str) else tuple(weights)
    refuse_first((
        (dtype not in DTYPES, f"--dtype must be one of {list(DTYPES)}, got {dtype!r}."),
        (not kinds or not set(kinds) <= set(WEIGHTS),
         f"--weights must be one or more of {WEIGHTS}, got {weights!r}."),
        (pad is not None and text is None,
         "--pad applies to --text prompts; random prompts have --tokens ids."),
    ))


def prompt_ids(vocab_size: int, prompts: int, tokens: int, seed: int) -> np.ndarray:
    """`prompts × tokens` ids drawn uniformly from the vocabulary (the paper's 100 × 200)."""
    return np.random.default_rng(seed).integers(0, vocab_size, (prompts, tokens))


def get_model(spec, weights: str, key):
    """The model to loop: trained weights are loaded; for random weights a config
    (preset, config.json, model folder) suffices, so nothing is downloaded."""
    if not isinstance(spec, (str, os.PathLike)):
        return spec  # already a model
    if weights == "trained" or str(spec).endswith(".gguf") or str(spec) in PACKAGED:
        return load(spec)
    return init(resolve_config(spec)[0], key)


def grid_weights(model) -> tuple[str, ...]:
    """The weight kinds a grid can loop `model` with: all three, except for a bare
    preset or config (nothing trained to load)."""
    name = str(model)
    bare = name in PRESETS or name in ALIASES or name.endswith(".json")
    return ("random", "resample") if bare else WEIGHTS


def passes(count: int) -> str:
    """"1 pass", "20 passes"."""
    return f"{count} pass" + ("es" if count != 1 else "")


def settings(spec, model) -> dict[str, Any]:
    """The config entries that name the model looped (and its architecture)."""
    name = str(spec) if isinstance(spec, (str, os.PathLike)) else type(spec).__name__
    return {"model": name, "model_config": model.config.to_dict()}


def describe(E: np.ndarray, layers_per_pass: int) -> dict[str, float]:
    """Mean `E` at the input, after the first pass and at the end; the final 10–90 %."""
    mean = E.mean(axis=0)
    return {"E_input_mean": mean[0],
            "E_after_pass_1_mean": mean[min(layers_per_pass, len(mean) - 1)],
            "E_final_mean": mean[-1], "E_final_p10": np.quantile(E[:, -1], 0.1),
            "E_final_p90": np.quantile(E[:, -1], 0.9)}


# --- loop-grid: weights × FFN ---------------------------------------------------------


def load_grid(model, weights, prompts: int, tokens: int, seed: int):
    """The models a grid loops by kind (`"trained"` and/or `"random"`, which
    `"resample"` shares) and the prompts' ids `(prompts, tokens)`, loaded before any run
    folder is made."""
    key = jax.random.PRNGKey(seed)
    nets = {kind: get_model(model, kind, key) for kind in dict.fromkeys(
        "trained" if w == "trained" else "random" for w in weights)}
    ids = prompt_ids(next(iter(nets.values())).config.vocab_size, prompts, tokens, seed)
    return nets, ids


def grid_data(nets, ids, seed: int, *, passes: int, dtype: str, weights,
              precision: str = "float32", progress: bool | None = None) -> dict:
    """`E` for every weight kind with and without FFN, as saved in `data.npz`:
    `E_<weights>_<attn|full>` `(prompts, passes·L + 1)`, `ids`, `layers_per_pass`
    (`precision`, `progress`: of the matrix products, the bars, as `ja.models.loop`
    takes them)."""
    key = jax.random.PRNGKey(seed)
    data = {}
    for w in weights:
        net = nets["trained" if w == "trained" else "random"]
        for variant, ffn in (("attn", False), ("full", True)):
            E = loop(net, ids, passes=passes, ffn=ffn, weights=w, key=key, dtype=DTYPES[dtype],
                     precision=precision, progress=progress)
            data[f"E_{w}_{variant}"] = np.asarray(E)
    L = next(iter(nets.values())).num_layers
    return data | {"ids": ids, "layers_per_pass": np.asarray(L)}


def _grid(data) -> dict[tuple[str, str], np.ndarray]:
    return {tuple(k[2:].split("_")): v for k, v in data.items() if k.startswith("E_")}


#: A setting agrees with the paper's E → 0 when the mean E at the end of its last pass is
#: below `CONSENSUS_TOL`, or at most `FALL` times its value at the end of the middle
#: pass: still falling. It contradicts it above `STALL` times that value: E has stopped
#: falling. Between the two E falls too slowly to tell: undecided. (Trained MiniLM's
#: orbit: × 1.00 and × 0.98; its random weights fall by orders of magnitude, its
#: resampled ones × 0.31–0.36.)
FALL, STALL = 0.9, 0.99


# Boolean switches choose the model (`jaxattn run` parameters are numbers or flags).
_MODELS = {"gpt_neo": "gpt-neo-125M", "minilm": "all-MiniLM-L6-v2",
           "smollm2": "SmolLM2-135M-Instruct"}


class LoopGridExperiment(AbstractExperiment):
    """Trained / random / resampled weights × with / without FFN on one model:
    `config.model` when given (`jaxattn loop --grid`), else the one a flag names
    (GPT-2 by default)."""

    name = "loop-grid"
    title = ("looped transformer (paper 001 §6.2, Figs. 7-10): E after every block for "
             "trained/random/resampled weights, with and without FFN")
    theorem = "5.1-5.3 (beyond their assumptions)"
    params = (
        Param("passes", int, 20, "passes through the model (the verdict reads the trend over "
              "the second half)", 2),
        Param("prompts", int, 100, "random prompts", 1),
        Param("tokens", int, 200, "tokens per prompt (E needs 2)", 2),
        Param("gpt_neo", bool, False, "GPT-Neo 125M config (random weights only, offline)"),
        Param("minilm", bool, False, "all-MiniLM-L6-v2, trained weights included"),
        Param("smollm2", bool, False, "SmolLM2-135M-Instruct (gguf), trained weights included"),
    )

    #: `dtype`: what the grid computes in (float32, as `jaxattn loop --grid` by default),
    #: recorded as such in config.json, not the float64 of the other experiments.
    recorded = (("model", None), ("dtype", "float32"))

    def refusals(self, config):
        return ((config.model is None and sum(bool(config[k]) for k in _MODELS) > 1,
                 "choose at most one of --gpt-neo, --minilm, --smollm2."),)

    def model(self, config) -> str:
        """The name of the model `config` loops."""
        if config.model is not None:
            return config.model
        chosen = [_MODELS[k] for k in _MODELS if config[k]]
        return chosen[0] if chosen else "gpt2"

    def simulate(self, config, progress):
        name = self.model(config)  # a packaged one not installed: `load` says how to install it
        weights = grid_weights(name)
        nets, ids = load_grid(name, weights, config.prompts, config.tokens, config.seed)
        return grid_data(nets, ids, config.seed, passes=config.passes, dtype=config.dtype,
                         weights=weights, progress=None if progress else False)

    def verdict(self, config, data) -> Verdict:
        grid, L = _grid(data), int(data["layers_per_pass"])
        ratios = {f"{w}_{v}": float(E[:, -1].mean() / E[:, 0].mean())
                  for (w, v), E in grid.items()}
        # the pass ends' mean E: the paper's claim is E → 0, and the first pass alone
        # takes E from ~1 to 0.3–0.5 even where it then settles on an orbit
        ends = {f"{w}_{v}": E[:, ::L].mean(axis=0) for (w, v), E in grid.items()}
        half = {k: float(e[-1] / e[max(1, (len(e) - 1) // 2)]) for k, e in ends.items()}
        falling = {k: bool(ends[k][-1] < CONSENSUS_TOL or r <= FALL) for k, r in half.items()}
        stalled = [k for k, r in half.items() if not falling[k] and not r <= STALL]
        slow = [k for k in half if not falling[k] and k not in stalled]
        passes = len(next(iter(ends.values()))) - 1
        ok = all(falling.values())
        mid = max(1, passes // 2)

        def listed(keys):
            return ", ".join(f"{k} (end of pass {mid} → {passes}: {short(ends[k][mid])} → "
                             f"{short(ends[k][-1])})" for k in keys)

        line = "; ".join(
            ["mean E still falling towards 0 (or below the consensus tolerance) in every "
             "setting"] if ok else
            ([f"mean E NOT falling towards 0 in: {listed(stalled)}"] if stalled else [])
            + ([f"mean E falling too slowly to tell in: {listed(slow)}"] if slow else []))
        line += (f"; over the second half of the passes, × ≤ {FALL:g} judged falling, "
                 f"× > {STALL:g} stalled (" + ", ".join(f"{k} ×{short(r)}" for k, r in half.items())
                 + "); final/initial: " + ", ".join(f"{k} {short(r)}" for k, r in ratios.items()))
        undecided = (
            "one pass has no second half to judge the trend on: raise --passes to 2 or more"
            if passes < 2 else "" if ok or stalled else
            f"mean E falls by less than ×{FALL:g} over the second half of the passes in "
            f"{', '.join(slow)}: raise --passes")
        extra = {"layers_per_pass": L} | {f"{w}_{v}": describe(E, L) for (w, v), E in grid.items()}
        numbers = ratios | {f"{k}_second_half": r for k, r in half.items()}
        return Verdict(ok, line, numbers, extra, undecided)

    def draw(self, config, data, folder: Path) -> list[Path]:
        name = self.model(config)
        bare = "" if "trained" in grid_weights(name) else \
            " (a config: random and resampled weights only)"
        title = (f"{name}{bare}: {config.prompts}×{config.tokens} random tokens, "
                 f"{passes(config.passes)}")
        return save_grid_figure(_grid(data), int(data["layers_per_pass"]),
                                Path(folder) / "loop_grid", title=title)


# --- figures: median misalignment with its spread versus depth ------------------------

COLORS = {"attn": "tab:blue", "full": "tab:orange"}
LABELS = {"attn": "pure attention (no FFN)", "full": "full blocks"}
#: Line width and style of each variant's mean in the grid: full blocks wide, pure
#: attention thin and dashed over them, so that where the two coincide both show.
STROKES = {"attn": (1.1, (0, (4, 2))), "full": (2.4, "-")}


#: The fewest prompts whose 10–90 % band is drawn; fewer show their whole range.
BAND_PROMPTS = 10


def spread(E: np.ndarray) -> tuple[np.ndarray, np.ndarray, str]:
    """The band of `E (prompts, depth)` over prompts and its words: 10–90 % from
    `BAND_PROMPTS` prompts on, else the range (the smallest and the largest)."""
    if E.shape[0] >= BAND_PROMPTS:
        lo, hi = np.quantile(E, [0.1, 0.9], axis=0)
        return lo, hi, "10–90 %"
    return E.min(axis=0), E.max(axis=0), f"range of {E.shape[0]}"


def draw_loop(ax, E, layers_per_pass: int, *, label=None, color="tab:blue", lw=1.6,
              ls="-") -> None:
    """Median `E (prompts, depth)` over prompts versus depth (column 0: the input),
    with their spread (`spread`), on a log axis: the median, not the mean, which the
    largest prompts pull to the top of the band. Below the resolution of `E`'s dtype
    (`_artifacts.figures.resolution`) a dotted line marks the floor. Alternate passes of
    `layers_per_pass` blocks are shaded; the legend reads `label: median, <spread>`."""
    dtype = np.asarray(E).dtype if np.issubdtype(np.asarray(E).dtype, np.floating) else np.float32
    floor = figures.resolution(dtype)
    E = np.asarray(E, dtype=np.float64)
    depth = np.arange(E.shape[1])
    lo, hi, words = spread(E)
    ax.fill_between(depth, np.maximum(lo, floor), np.maximum(hi, floor), color=color,
                    alpha=0.22, lw=0)
    median, cut = figures.above_floor(np.median(E, axis=0), floor, stop=False)
    ax.plot(depth, median, color=color, lw=lw, ls=ls,
            label=f"{label}: median, {words}" if label else None)
    if cut or lo.min() <= floor:
        figures.mark_floor(ax, floor, dtype)
    ax.set_yscale("log")
    figures.plain_log_labels(ax.yaxis)
    ax.set_xlim(0, depth[-1])
    figures.integer_ticks(ax.xaxis)  # blocks are whole
    mark_passes(ax, (E.shape[1] - 1) // layers_per_pass, layers_per_pass)
    ax.set(xlabel=f"depth (blocks; a pass = {layers_per_pass})", ylabel=r"misalignment $E$")


def mark_passes(ax, passes: int, layers_per_pass: int) -> None:
    """Shade every other pass and count the passes on the top axis (with more than 40
    passes, only the count); no vertical grid, which would read as pass boundaries."""
    if any(a.get_gid() == "passes" for a in ax.child_axes):
        return  # a second curve on the same axis
    ax.grid(False, axis="x")
    if 1 < passes <= 40:
        for p in range(1, passes, 2):
            ax.axvspan(p * layers_per_pass, (p + 1) * layers_per_pass, color="0.5",
                       alpha=0.08, lw=0, zorder=0)
    top = ax.secondary_xaxis("top", functions=(lambda d: d / layers_per_pass,
                                               lambda p: p * layers_per_pass))
    top.set_gid("passes")
    top.xaxis.get_major_locator().set_params(integer=True)
    top.set_xlabel("pass", fontsize=8)
    top.tick_params(labelsize=8)


def save_loop_figure(E, layers_per_pass: int, stem, *, title: str, variant: str) -> list[Path]:
    """One looped run: median `E` with its spread versus depth (`draw_loop`), as
    `stem.png` and `stem.pdf`; returns their paths."""
    fig, ax = figures.pyplot().subplots(figsize=(6.4, 3.8))
    draw_loop(ax, E, layers_per_pass, label=LABELS[variant], color=COLORS[variant])
    ax.set_title(figures.wrap(title, fig.get_figwidth(), 10), fontsize=10)
    figures.legend_below(ax, ncol=2)
    return figures.save_figure(fig, stem)


#: What a `jaxattn loop` folder's config.json holds (and an experiment's does not).
LOOP_KEYS = ("model", "model_config", "weights", "ffn", "passes", "prompts", "tokens")


def is_loop_config(config: dict[str, Any]) -> bool:
    """Whether `config` (a run folder's config.json) is that of a `jaxattn loop` run."""
    return "experiment" not in config and all(k in config for k in LOOP_KEYS)


def loop_title(config: dict[str, Any]) -> str:
    """The title of a `jaxattn loop` figure, from the run's config."""
    blocks = "full blocks" if config["ffn"] else "no FFN"
    text = "text " if config.get("text") else ""
    kind = WORDS.get(config["weights"], config["weights"])
    return (f"{config['model']}: {kind} weights, {blocks}, "
            f"{config['prompts']}×{config['tokens']} {text}tokens, {passes(config['passes'])}")


def redraw_loop(config: dict[str, Any], data: dict[str, np.ndarray], folder) -> list[Path]:
    """The figure of a `jaxattn loop` folder (again), from its config and `data["E"]`."""
    return save_loop_figure(data["E"], int(config["model_config"]["num_layers"]),
                            Path(folder) / "loop", title=loop_title(config),
                            variant="full" if config["ffn"] else "attn")


#: A weight kind in a title: "resampled weights".
WORDS = {"resample": "resampled"}


def save_grid_figure(results: dict, layers_per_pass: int, stem, *, title: str) -> list[Path]:
    """The paper's Figs. 7–10 for one model: a panel per weight kind, pure attention
    and full blocks in each, as `stem.png` and `stem.pdf`. `results` maps
    `(weights, variant)` to `E`. Full blocks are drawn first and wide, pure attention
    over them thin and dashed (`STROKES`): where the two coincide, both show."""
    kinds = [w for w in WEIGHTS if any(k[0] == w for k in results)]
    fig, axes = figures.pyplot().subplots(1, len(kinds), figsize=(4.2 * len(kinds), 3.6),
                                          sharey=True, squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        for variant in ("full", "attn"):
            if (kind, variant) in results:
                lw, ls = STROKES[variant]
                draw_loop(ax, results[kind, variant], layers_per_pass, label=LABELS[variant],
                          color=COLORS[variant], lw=lw, ls=ls)
        ax.set_title(f"{WORDS.get(kind, kind)} weights", fontsize=10)
        if ax is not axes[0][0]:
            ax.set_ylabel("")
    figures.legend_under_panels(fig, axes[0][0], ncol=2)  # each panel draws both variants
    return figures.save_figure(fig, stem, title)
