"""Looping a real model into a run folder: `run_loop` (`jaxattn loop`: one setting,
streamed to disk in chunks, resumable) and `run_loop_grid` (`jaxattn loop --grid`:
the `loop-grid` experiment on any model), both through the one writer of run
folders. The study itself (its figures, its verdict) is `loop_grid.py`'s.
"""

import functools
import hashlib
import json
import os
import shutil
import time
import warnings
from pathlib import Path

import jax
import numpy as np
from tqdm.auto import tqdm

from .._artifacts.folders import (
    INCOMPLETE,
    RunFolderError,
    clear_partial_writes,
    finish_run,
    folder_path,
    hold_folder,
    read_json,
    reopen_run,
    save_npz,
)
from .._files import atomic_write
from .._precision import check_precision
from .._validate import check_count, check_seed, refuse_first
from ..models import (
    ALIASES,
    FAMILIES,
    PACKAGED,
    PRESETS,
    WEIGHTS,
    _checks,
    check_ids,
    depths_refusal,
    detokenize,
    file_sha256,
    iterate_loop,
    read_prompts,
    resolve_config,
    setup_loop,
    tokenize,
    tokenizer_source,
    too_long,
    weight_files,
)
from . import get_experiment, loop_grid
from .runner import check_sizes, experiment_config, run_into_folder

#: Tokens per random prompt when none are asked for (the paper's 100 × 200).
TOKENS = 200
#: The config entries that record the content of the files a loop reads, and what
#: each file is, for the message that refuses to resume after one changed.
FILE_HASHES = {"weights_sha256": ("weight file", "two models"),
               "tokenizer_sha256": ("tokenizer file", "two tokenizations"),
               "text_sha256": ("prompts file", "two sets of prompts")}
#: The config entries a loop records under another name than the flag that sets
#: them, for the message that refuses another value in an existing loop's folder.
FLAGS = {"model": "--model", "chunk_passes": "--chunk-passes", "save_states": "--save-states",
         "ffn": "--no-ffn",
         **{k: f"--{k}" for k in ("passes", "prompts", "tokens", "seed", "weights", "dtype",
                                  "precision", "pad", "text")}}


def run_loop(model, out=None, seed: int = 0, *, weights="trained", passes=20, ffn=True,
             prompts=100, tokens=None, dtype="float32", save_states=None,
             precision="float32", text=None, pad=None, resume: bool = False,
             chunk_passes: int = 10, progress: bool = True, log=print) -> Path:
    """Loop `model` (a path, hub name, preset/config, or a model) and write a run folder:
    `config.json` (with the `dtype` and the `precision` of the matrix products),
    `data.npz` (`E` `(prompts, passes·L+1)`, the ids, saved states),
    `loop.png`/`loop.pdf` and `summary.json`. Returns the folder.

    The loop streams to disk in chunks of `chunk_passes` passes (`chunks/`), from which
    `resume` continues a killed run to the same `data.npz` (`docs/usage/models.md`).

    `config.json` records the SHA-256 of the files the loop reads (the weight files
    of trained weights, the tokenizer and the prompts of `text`), and a resume
    after any of them changed is refused: it would mix two models in one `data.npz`.

    **Arguments:**

    - `tokens`: tokens per prompt (default: 200 random ids; with `text`, the
      shortest prompt's length, or the longest's with `pad`).
    - `text`: a file of prompts, one per line, tokenized with the model's own
      tokenizer (`ja.models.tokenize`) in place of `prompts` random ids; `model`
      must then name a folder, file or packaged model.
    - `pad`: with `text`, the id appended to prompts shorter than `tokens`, or
      `"auto"` (the tokenizer's padding token); the padding is masked: no token
      attends to it and `E` counts the text tokens only (`ja.models.loop(…, mask=)`).
      Default: prompts are cut to the shortest one's length (and the cut is said).
    - `resume`: continue the loop in `out` (needs `out`); a finished one is left as it is.
    - `chunk_passes`: passes per saved chunk (what a kill can lose).
    - `progress`, `log`: a progress bar (passes, time left); where messages go
      (`None`: nowhere).
    """
    log = log or (lambda line: None)
    out = folder_path("loop", out, resume=resume)
    tokens = TOKENS if tokens is None and text is None else tokens
    loop_grid.check_sizes(passes, prompts, 1 if tokens is None else tokens, dtype, weights,
                          pad=pad, text=text)
    check_count(chunk_passes, "--chunk-passes", 1)
    check_precision(precision)
    seed = check_seed(seed)
    if text is None:  # random ids: the arrays follow from the flags (and the model's sizes)
        check_sizes("loop", {"prompts": prompts, "tokens": tokens, "passes": passes},
                    footprint=loop_footprint(model, dtype, save_states))
    if (cfg := _sizes(model)) is not None:  # before drawing or reading the weights
        refuse_first([*(() if text is not None else
                        [too_long(FAMILIES[cfg.model_type], cfg, tokens)]),
                      depths_refusal(tuple(int(d) for d in save_states or ()), passes,
                                     cfg.num_layers)])
    key = jax.random.PRNGKey(seed)
    net = loop_grid.get_model(model, weights, key)  # before the folder: a bad model leaves none
    ids, mask, source = loop_prompts(model, net, prompts, tokens, seed, text, pad, log=log)
    # the model's own sizes, now known (a packaged or hub model, a text's prompts)
    check_sizes("loop", {"prompts": ids.shape[0], "tokens": ids.shape[1], "passes": passes},
                footprint=loop_footprint(net, dtype, save_states))
    source |= file_hashes(model, weights, text)
    check_ids(net, ids)  # before the folder too: more tokens than positions leave none
    setup = setup_loop(net, ids, passes=passes, ffn=ffn, weights=weights, key=key,
                       dtype=loop_grid.DTYPES[dtype], save_states=save_states,
                       precision=precision, mask=mask)
    config = loop_grid.settings(model, net) | {
        "weights": weights, "passes": passes, "ffn": ffn, "prompts": int(ids.shape[0]),
        "tokens": int(ids.shape[1]), "dtype": dtype, "precision": precision, "seed": seed,
        "save_states": save_states, "chunk_passes": chunk_passes} | source
    with hold_folder(out, "run") as folder:
        path = folder / "config.json"
        old = read_json(path) if path.exists() else {}  # the loop already there, if any
        if resume:
            config["model"] = same_model(old, config)
            if old.get("model", config["model"]) == config["model"]:  # else: another --model
                check_same_files(folder, old, config, log)
        check_same_flags(folder, old, config)
        finished, run_id = reopen_run(folder, config, resume, what="loop", command="loop",
                                      same=tuple(k for k in config if k not in FILE_HASHES))
        if finished:
            log(f"{folder} holds this loop, finished; nothing to run")
            return folder
        seconds = stream_loop(folder, setup, chunk_passes, progress, log)
        data = gather_loop(folder, setup, ids) | ({} if mask is None else {"mask": mask})
        save_npz(folder / "data.npz", **data)
        figures = loop_grid.redraw_loop(config, data, folder)  # the figure `jaxattn plot` redraws
        summary = loop_grid.describe(data["E"], net.num_layers) | {
            "layers_per_pass": net.num_layers, "seconds_per_pass_incl_compile": seconds / passes}
        finish_run(folder, summary, figures=figures, seconds=seconds, run_id=run_id)
        shutil.rmtree(folder / "chunks", ignore_errors=True)
    return folder


#: The hidden states a loop holds at its peak, per prompt (shared with `ja.models.loop`'s
#: own check, `models._checks.loop_bytes`).
HIDDEN_COPIES = _checks.HIDDEN_COPIES


def loop_footprint(model, dtype: str, save_states) -> tuple[tuple, ...]:
    """The arrays a loop of random prompts holds, as `runner.FOOTPRINT` writes them
    (products of `prompts`, `tokens`, `passes` and constants, in 8-byte values): the
    hidden states (`HIDDEN_COPIES`), the saved states and `E` when the model's sizes are
    known without loading it (a preset, a config.json, a model folder, a model), and the
    ids."""
    config = _sizes(model)
    ids = (("prompts", "tokens"),)  # int64
    if config is None:
        return ids
    # four hidden states a prompt at the peak (measured: GPT-2, 500 → 2,000 prompts)
    width = HIDDEN_COPIES * config.hidden_size * np.dtype(loop_grid.DTYPES[dtype]).itemsize / 8
    saved = config.hidden_size * len(save_states or ()) / 2  # float32
    return (("prompts", "tokens", width), *ids, ("prompts", "passes", config.num_layers / 2),
            *((("prompts", "tokens", saved),) if saved else ()))


def _sizes(model):
    """The config of `model` when it can be read without loading weights or a
    download (a preset or packaged name, a config.json, model folder or .gguf file, a
    model); else `None`."""
    if not isinstance(model, (str, os.PathLike)):
        return model.config
    path = Path(model)
    if str(model) not in {**PRESETS, **ALIASES, **PACKAGED} \
            and not (path / "config.json").is_file() \
            and not (path.suffix in (".json", ".gguf") and path.is_file()):
        return None
    try:
        return resolve_config(model)[0]
    except (ValueError, TypeError, OSError):  # reported where the model is loaded
        return None


def loop_prompts(model, net, prompts: int, tokens: int | None, seed: int, text, pad, log):
    """The ids a loop runs, `(prompts, tokens)` random ones or the lines of the file
    `text` tokenized, the mask of their text tokens (`None` without `pad`: no
    padding), and what `config.json` records of them (the SHA-256 of the prompts,
    blank lines skipped). `log` is told which prompts were cut and the words they
    lost."""
    if text is None:
        return loop_grid.prompt_ids(net.config.vocab_size, prompts, tokens, seed), None, {}
    lines = read_prompts(text)
    with warnings.catch_warnings():  # the cut is told below, one line a prompt
        warnings.simplefilter("ignore", UserWarning)
        ids, mask = tokenize(model, lines, tokens=tokens, pad=pad, return_mask=True)
    for line in cut_prompts(model, lines, ids.shape[1], pad):
        log(line)
    digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()
    return ids, (mask if pad is not None else None), {"text": str(text),
                                                       "text_sha256": digest, "pad": pad}


def cut_prompts(model, lines: list[str], n: int, pad=None) -> list[str]:
    """One line per prompt cut to `n` tokens: how many tokens it lost, and their text
    (the first 60 characters; without `--pad`, prompts share the shortest one's
    length)."""
    said = []
    for i, line in enumerate(lines):
        full = tokenize(model, line)
        if len(full) > n:
            lost = " ".join(detokenize(model, full[n:], special_tokens=False).split())
            lost = lost if len(lost) <= 60 else lost[:59] + "…"
            keep = "a larger --tokens keeps it whole" if pad is not None else \
                "--pad keeps every prompt whole"
            said.append(f"prompt {i} cut to {n} tokens: it lost {len(full) - n} "
                        f"({lost!r}); {keep}")
    return said


def file_hashes(model, weights: str, text) -> dict[str, dict[str, str]]:
    """The SHA-256 of the weight files a loop of `weights` reads (trained weights
    only: random ones are drawn from the config) and of the tokenizer of `text`,
    each file hashed once, by name: `config.json`'s `weights_sha256` and
    `tokenizer_sha256`."""
    if not isinstance(model, (str, os.PathLike)):
        return {}
    digest = functools.cache(file_sha256)  # a gguf holds both weights and tokenizer
    found = {}
    if weights == "trained":
        found["weights_sha256"] = {p.name: digest(p) for p in weight_files(model)}
    if text is not None:
        path = tokenizer_source(model)
        found["tokenizer_sha256"] = {path.name: digest(path)}
    return found


def same_model(old: dict, config: dict) -> str:
    """The model's name as the loop's recorded config `old` has it, when `config` names
    the same model another way (another path to the same folder or file, or a copy of
    its weights: the same architecture and weight hashes); else `config`'s own."""
    was, now = old.get("model"), config["model"]
    if not isinstance(was, str) or was == now:
        return now
    try:
        same_path = Path(was).resolve() == Path(now).resolve() and Path(now).exists()
    except (OSError, RuntimeError):
        same_path = False
    same_weights = (bool(config.get("weights_sha256"))
                    and old.get("weights_sha256") == config.get("weights_sha256")
                    and _plain(old.get("model_config")) == _plain(config.get("model_config")))
    return was if same_path or same_weights else now


def _plain(value):
    """`value` as its JSON file reads back (tuples as lists)."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def check_same_files(folder: Path, old: dict, config: dict, log) -> None:
    """Refuse, in one line, to resume the loop in `folder` (its recorded config `old`)
    when a file it reads (weights, tokenizer, prompts) has other contents than when the
    loop began; a loop recorded before these hashes is resumed with a warning."""
    for key, (what, mix) in FILE_HASHES.items():
        was, now = old.get(key), config.get(key)
        if not old or was == now or now is None:
            continue
        if was is None:
            log(f"warning: {folder} records no {key} (begun by an older jaxattn): resuming "
                f"without checking that its {what}s are the ones it began with")
            continue
        was, now = (was, now) if isinstance(now, dict) else ({"": was}, {"": now})
        name = next(n for n in sorted(set(was) | set(now)) if was.get(n) != now.get(n))
        where = (config["text"] if key == "text_sha256" else
                 f"{name} of {config['model']}" if name else config["model"])
        change = ("is new" if name not in was else "is gone" if name not in now else
                  f"changed (sha256 {was[name][:12]}…, now {now[name][:12]}…)")
        raise RunFolderError(
            f"{folder}: the {what} {where} {change} since this loop began; resuming would "
            f"mix {mix} in one data.npz: restore the file, or start afresh with "
            "another --out.")


def check_same_flags(folder: Path, old: dict, config: dict) -> None:
    """Refuse, naming the flag (`FLAGS`), a loop whose first difference from the loop
    already in `folder` (its recorded config `old`) is a setting recorded under another
    name than its flag (`chunk_passes` is `--chunk-passes`); `reopen_run` words every
    other difference."""
    if "experiment" in old or "model" not in old or "passes" not in old:
        return  # no loop's folder: `reopen_run` says whose it is
    keys = sorted((k for k in config if k not in FILE_HASHES),
                  key=lambda k: k not in ("model", "passes"))
    key = next((k for k in keys if _plain(old.get(k)) != _plain(config[k])), None)
    if key not in FLAGS:
        return
    flag, was, now = FLAGS[key], old[key], config[key]

    def shown(value) -> str:  # the flag's value as a command line gives it
        if key == "ffn":
            return "off" if value else "on"
        if key == "save_states":
            return ",".join(map(str, value)) if value else "none"
        return str(value)

    def given(value) -> str:
        if key == "ffn":
            return f"{'without' if value else 'with'} {flag}"
        return f"with {flag} {shown(value)}" if value or value == 0 else f"without {flag}"

    finished = not (folder / INCOMPLETE).exists() and (folder / "summary.json").exists()
    raise RunFolderError(
        f"{folder} holds {'a finished' if finished else 'an unfinished'} loop with another "
        f"{flag} ({shown(was)}, not {shown(now)}); "
        + ("one folder holds one loop (choose another --out)." if finished else
           f"resume it {given(was)}, as it began, or choose another --out."))


def _chunk_file(folder: Path, start: int) -> Path:
    return folder / "chunks" / f"{start:06d}.npz"


def _save_carry(folder: Path, x, done: int, seconds: float) -> None:
    """The hidden state after `done` passes, byte for byte (bfloat16 included)."""
    x = np.ascontiguousarray(np.asarray(x))
    arrays = {"x": x.reshape(-1).view(np.uint8), "shape": np.asarray(x.shape),
              "dtype": np.asarray(str(x.dtype)), "done": np.asarray(done),
              "seconds": np.asarray(seconds)}
    atomic_write(folder / "chunks" / "carry.npz", lambda f: np.savez(f, **arrays))


def _load_carry(folder: Path):
    """`(passes done, x, seconds)` of a stopped loop, or `(0, None, 0.0)`."""
    path = folder / "chunks" / "carry.npz"
    if not path.exists():
        return 0, None, 0.0
    with np.load(path) as f:
        x = f["x"].view(jax.numpy.dtype(str(f["dtype"]))).reshape(tuple(f["shape"]))
        return int(f["done"]), jax.numpy.asarray(x), float(f["seconds"])


def stream_loop(folder: Path, setup, chunk_passes: int, progress: bool, log) -> float:
    """Run the loop from its last saved chunk (none: from the start), one pass at a
    time, saving `E` (and the states reached) every `chunk_passes` passes and then
    the carry. Returns the computing seconds of every session together."""
    (folder / "chunks").mkdir(exist_ok=True)
    clear_partial_writes(folder / "chunks")
    done, x, seconds = _load_carry(folder)
    if done:
        log(f"resuming {folder}: {done} of {setup.passes} passes done")
    values, states, index, lo = [], [], [], done
    with tqdm(total=setup.passes, initial=done, unit="pass", desc="loop", smoothing=0.1,
              disable=not progress) as bar:
        start = time.perf_counter()
        for seg in iterate_loop(setup, start=done, x=x):
            values.append(np.asarray(seg.values))
            states.append(np.asarray(seg.states)[:, seg.hit])
            index.append(np.flatnonzero(seg.hit))
            bar.update(seg.stop - seg.start)
            if seg.stop == setup.passes or (seg.stop and seg.stop % chunk_passes == 0):
                spent = seconds + time.perf_counter() - start
                save_npz(_chunk_file(folder, lo), E=np.concatenate(values, axis=1),
                         states=np.concatenate(states, axis=1), index=np.concatenate(index))
                _save_carry(folder, seg.x, seg.stop, spent)
                values, states, index, lo = [], [], [], seg.stop
    return seconds + time.perf_counter() - start


def gather_loop(folder: Path, setup, ids) -> dict[str, np.ndarray]:
    """The chunks of a finished loop as `data.npz`'s arrays: `E`, `ids` and, when
    asked for, `states` and `depths`."""
    chunk_passes = read_json(folder / "config.json")["chunk_passes"]
    starts = range(0, setup.passes, chunk_passes)
    missing = [s for s in starts if not _chunk_file(folder, s).exists()]
    if missing:
        raise RunFolderError(f"{folder} lacks the chunk of passes from {missing[0]}; "
                             "its chunks do not fit its config.json (re-run it).")
    parts = [np.load(_chunk_file(folder, s)) for s in starts]
    E = np.concatenate([p["E"] for p in parts], axis=1)
    data = {"E": E, "ids": np.asarray(ids)}
    depths = setup.options["depths"]
    if depths:  # each chunk's states, with their places in `depths`
        found = np.concatenate([p["states"] for p in parts], axis=1)
        states = np.empty_like(found)
        states[:, np.concatenate([p["index"] for p in parts])] = found
        data |= {"states": states.astype(np.float32), "depths": np.asarray(depths)}
    return data


def run_loop_grid(model, out=None, seed: int = 0, *, passes=20, prompts=100, tokens=TOKENS,
                  dtype="float32", weights=WEIGHTS, precision="float32",
                  progress: bool = True) -> Path:
    """The `loop-grid` experiment (paper 001 Figs. 7–10) on any model: every weight
    kind in `weights` (trained, random, resample) with and without feed-forward blocks.

    Trained weights need a loadable model (a folder, .gguf, packaged or reachable
    hub name); with a preset/config only, pass `weights=("random", "resample")`.
    Writes `config.json` (with `dtype` and `precision`), `data.npz`
    (`E_<weights>_<attn|full>`, `ids`, `layers_per_pass`), `loop_grid.png/.pdf` and
    `summary.json` (the verdict and per-setting statistics); returns the folder.
    `progress`: a bar for each of the loops when they are long (`False`: none).
    """
    experiment = get_experiment("loop-grid")
    weights = tuple(weights)
    loop_grid.check_sizes(passes, prompts, tokens, dtype, weights)
    check_precision(precision)
    seed = check_seed(seed)
    # the grid's own bounds (2 passes, 2 tokens) before the model is read
    config = experiment_config(experiment, {"passes": passes, "prompts": prompts,
                                            "tokens": tokens}, seed)
    nets, ids = loop_grid.load_grid(model, weights, prompts, tokens, seed)  # before the folder
    recorded = loop_grid.settings(model, next(iter(nets.values()))) | {
        "weights": list(weights), "dtype": dtype, "precision": precision}
    config |= {"model": recorded["model"]}
    folder, _ = run_into_folder(
        experiment, config, command=None, out=out, log=None, record=recorded,
        simulate=lambda: loop_grid.grid_data(nets, ids, seed, passes=passes, dtype=dtype,
                                             weights=weights, precision=precision,
                                             progress=None if progress else False))
    return folder
