"""Looping a real model into a run folder: `run_loop` (`jaxattn loop`: one setting,
streamed to disk in chunks, resumable) and `run_loop_grid` (`jaxattn loop --grid`:
the `loop-grid` experiment on any model), both through the one writer of run
folders. The study itself (its figures, its verdict) is `loop_grid.py`'s.
"""

import hashlib
import shutil
import time
from pathlib import Path

import jax
import numpy as np
from tqdm.auto import tqdm

from .._app.folders import (
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
from .._validate import check_count, check_seed
from ..models import WEIGHTS, check_ids, iterate_loop, read_prompts, setup_loop, tokenize
from . import get_experiment
from .loop_grid import (
    DTYPES,
    check_sizes,
    describe,
    get_model,
    grid_data,
    load_grid,
    loop_title,
    prompt_ids,
    save_loop_figure,
    settings,
)
from .runner import resolve_config, run_into_folder


def run_loop(model, out=None, seed: int = 0, *, weights="trained", passes=20, ffn=True,
             prompts=100, tokens=200, dtype="float32", save_states=None,
             precision="float32", text=None, resume: bool = False, chunk_passes: int = 10,
             progress: bool = True, log=print) -> Path:
    """Loop `model` (a path, hub name, preset/config, or a model) and write a run folder:
    `config.json` (with the `dtype` and the `precision` of the matrix products),
    `data.npz` (`E` `(prompts, passes·L+1)`, the ids, saved states),
    `loop.png`/`loop.pdf` and `summary.json`. Returns the folder.

    The loop runs one pass at a time under a progress bar and streams to disk: every
    `chunk_passes` passes, `E` of those passes goes to `chunks/NNNNNN.npz` and the
    hidden state after them (the carry) to `chunks/carry.npz`, each written
    atomically. With `resume`, a folder whose run was killed continues from its last
    chunk, to the same `data.npz` as a run left alone (bit for bit on the CPU); its
    settings must be the same. At the end the chunks are gathered into `data.npz`
    and removed.

    **Arguments:**

    - `text`: a file of prompts, one per line, tokenized with the model's own
      tokenizer (`ja.models.tokenize`, `tokens` per prompt) in place of `prompts`
      random ids; `model` must then name a folder, file or packaged model.
    - `resume`: continue the loop in `out` (needs `out`); a finished one is left as it is.
    - `chunk_passes`: passes per saved chunk (what a kill can lose).
    - `progress`, `log`: a progress bar (passes, time left); where messages go
      (`None`: nowhere).
    """
    log = log or (lambda line: None)
    if weights not in WEIGHTS:
        raise ValueError(f"--weights must be one of {WEIGHTS}, got {weights!r}.")
    if resume and out is None:
        raise ValueError("--resume needs --out DIR: the folder of the loop to continue.")
    check_sizes(passes, prompts, tokens, dtype)
    check_count(chunk_passes, "--chunk-passes", 1)
    check_precision(precision)
    seed = check_seed(seed)
    key = jax.random.PRNGKey(seed)
    net = get_model(model, weights, key)  # before the folder: a bad model leaves none
    ids, source = loop_prompts(model, net, prompts, tokens, seed, text)
    check_ids(net, ids)  # before the folder too: more tokens than positions leave none
    setup = setup_loop(net, ids, passes=passes, ffn=ffn, weights=weights, key=key,
                       dtype=DTYPES[dtype], save_states=save_states, precision=precision)
    config = settings(model, net) | {
        "weights": weights, "passes": passes, "ffn": ffn, "prompts": int(ids.shape[0]),
        "tokens": int(ids.shape[1]), "dtype": dtype, "precision": precision, "seed": seed,
        "save_states": save_states, "chunk_passes": chunk_passes} | source
    with hold_folder(folder_path("loop", out), "run") as folder:
        finished, run_id = reopen_run(folder, config, resume, what="loop", command="loop")
        if finished:
            log(f"{folder} holds this loop, finished; nothing to run")
            return folder
        seconds = stream_loop(folder, setup, chunk_passes, progress, log)
        data = gather_loop(folder, setup, ids)
        save_npz(folder / "data.npz", **data)
        L = net.num_layers
        figures = save_loop_figure(data["E"], L, folder / "loop", title=loop_title(config),
                                   variant="full" if ffn else "attn")
        summary = describe(data["E"], L) | {
            "layers_per_pass": L, "seconds_per_pass_incl_compile": seconds / passes}
        finish_run(folder, summary, figures=figures, seconds=seconds, run_id=run_id)
        shutil.rmtree(folder / "chunks", ignore_errors=True)
    return folder


def loop_prompts(model, net, prompts: int, tokens: int, seed: int, text):
    """The ids a loop runs, `(prompts, tokens)` random ones or the lines of the file
    `text` tokenized, and what `config.json` records of them."""
    if text is None:
        return prompt_ids(net.config.vocab_size, prompts, tokens, seed), {}
    lines = read_prompts(text)
    ids = tokenize(model, lines, tokens=tokens)
    digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()
    return ids, {"text": str(text), "text_sha256": digest}


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


def run_loop_grid(model, out=None, seed: int = 0, *, passes=20, prompts=100, tokens=200,
                  dtype="float32", weights=WEIGHTS, precision="float32") -> Path:
    """The `loop-grid` experiment (paper 001 Figs. 7–10) on any model: every weight
    kind in `weights` (trained, random, resample) with and without feed-forward blocks.

    Trained weights need a loadable model (a folder, .gguf, packaged or reachable
    hub name); with a preset/config only, pass `weights=("random", "resample")`.
    Writes `config.json` (with `dtype` and `precision`), `data.npz`
    (`E_<weights>_<attn|full>`, `ids`,
    `layers_per_pass`), `loop_grid.png/.pdf` and `summary.json` (the experiment's
    verdict, `layers_per_pass` and per-setting statistics); returns the folder.
    """
    experiment = get_experiment("loop-grid")
    check_sizes(passes, prompts, tokens, dtype)
    check_precision(precision)
    seed = check_seed(seed)
    weights = tuple(weights)
    nets, ids = load_grid(model, weights, prompts, tokens, seed)  # before the folder
    config = resolve_config(experiment, {"passes": passes, "prompts": prompts,
                                         "tokens": tokens}, seed)
    config |= settings(model, next(iter(nets.values()))) | {
        "weights": list(weights), "dtype": dtype, "precision": precision}
    folder, _ = run_into_folder(
        experiment, config, command=None, out=out, log=None,
        simulate=lambda: grid_data(nets, ids, seed, passes=passes, dtype=dtype,
                                   weights=weights, precision=precision))
    return folder
