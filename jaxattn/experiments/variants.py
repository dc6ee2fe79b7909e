"""`variants`: which variants of the model escape consensus (issue 17).

A grid of variants (normalisation placement × attention mask × kernel × β), each run on
the same random instances at two sizes (`SIZES`; instance `i` drawn from the seed
`seed + i` alone) and measured on its tokens' directions after `layers` layers. One
compiled program per (size, norm, kernel), saved as one chunk in the run folder's
`chunks/` (`--resume` reuses them); each cell's `command` in `table.csv` repeats it
alone. The study and its findings: `docs/usage/variants_study.md`.
"""

import dataclasses
import functools
import itertools
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jaxtyping import Array, Bool, Float, PRNGKeyArray

from .._artifacts.folders import RunFolderError, clear_partial_writes, save_npz
from .._batch import map_blocks, replicate
from .._dynamics import NORMS, SelfAttentionDynamics, random_mask
from .._horizon import CONSENSUS_TOL
from .._manifold import project
from .._process.distributed import agree, global_mesh, is_writer
from .._process.distributed import gather as gather_all
from .._programs import kept_jit
from ..metrics import cluster_count, misalignment, rank_collapse_residual
from ..theory import Classification, classify, predict
from .base import AbstractExperiment, Config, Param, Verdict, choices
from .pair_density import draw_weights
from .paper001 import with_beta
from .pieces import advance
from .runner import command_line
from .variants_plot import draw_study, format_verdicts, table_csv
from .verdicts import convergence_trend

#: The grid's axes: masks, kernels, β, sizes `(n, d)` (normalisations: `NORMS`).
MASKS = ("full", "causal", "window", "sparse")
KERNELS = ("softmax", "sigmoid")
BETAS = (0.5, 1.0, 4.0, 16.0)
SIZES = ((10, 3), (32, 16))
#: Two tokens are in one cluster when a chain of tokens links them, each step shorter
#: than this on the unit sphere (cos > 0.995).
CLUSTER_EPS = 0.1
#: The settings of one mask each: `--window` the window mask's, `--keep` the sparse's.
MASK_SETTINGS = (("window", "window"), ("keep", "sparse"))
#: Where a run folder keeps the chunks of its unfinished study (removed once it finishes).
CHUNKS = "chunks"
#: The per-instance measurements of a chunk, each `(masks, betas, instances)`.
MEASURES = ("final_E", "consensus_layer", "clusters", "residual", "stalled", "finite")


@dataclasses.dataclass(frozen=True)
class Grid:
    """The cells a run computes: the selected sizes, norms, masks, kernels and β."""

    sizes: tuple
    norms: tuple
    masks: tuple
    kernels: tuple
    betas: tuple

    @classmethod
    def of(cls, config: Config) -> "Grid":
        """The grid of a checked `config` (`--size`, `--norm`, … codes; `--beta 0`: `BETAS`)."""
        return cls(choices(config.size, SIZES), choices(config.norm, NORMS),
                   choices(config.mask, MASKS), choices(config.kernel, KERNELS),
                   BETAS if config.beta == 0 else (float(config.beta),))

    def programs(self) -> list[tuple[int, int, int]]:
        """The static variants, one compiled program and one chunk each: indices
        `(size, norm, kernel)` into the grid, in order."""
        return list(itertools.product(range(len(self.sizes)), range(len(self.norms)),
                                      range(len(self.kernels))))

    @property
    def shape(self) -> tuple[int, ...]:
        """`(sizes, norms, masks, kernels, betas)`."""
        return (len(self.sizes), len(self.norms), len(self.masks), len(self.kernels),
                len(self.betas))


# --- one instance ------------------------------------------------------------------


@kept_jit(static_argnames=("n", "d", "heads"))
def draw_instance(key: PRNGKeyArray, n: int, d: int, heads: int):
    """One instance: `P`, `U` `(h, d, d)` (Gaussian key–query, `U_η = I/h`), a start
    `(n, d)` and the key of its sparse mask."""
    k_w, k_x, k_m = jax.random.split(key, 3)
    P, U = draw_weights(k_w, d, heads, key_query=1, value=0)
    return P, U, jax.random.normal(k_x, (n, d)), k_m


@kept_jit(static_argnames=("kind", "n", "window", "keep"))
def make_mask(kind: str, n: int, key: PRNGKeyArray, window: int, keep: float
              ) -> Bool[Array, "n n"]:
    """The boolean attention mask of `kind` (one of `MASKS`; True = attends)."""
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    if kind == "full":
        return jnp.ones((n, n), bool)
    if kind == "causal":
        return jnp.asarray(j <= i)
    if kind == "window":
        return jnp.asarray(np.abs(i - j) < window)
    return random_mask(key, n, keep)


def depth_run(dyn: SelfAttentionDynamics, x0: Float[Array, "n d"], num_layers: int,
              tau: float) -> tuple[Float[Array, " L+1"], Float[Array, "n d"]]:
    """`num_layers` layers from `x0` put on `E_W` (as `run_layers` starts): `E` of the
    directions after every layer (index 0: the start) and the last tokens."""
    def step(x, k):
        x = dyn.layer(k * tau, x, tau)
        return x, misalignment(x)

    x0 = project(x0, dyn.W)
    last, E = jax.lax.scan(step, x0, jnp.arange(num_layers, dtype=x0.dtype))
    return jnp.concatenate([misalignment(x0)[None], E]), last


def measure(x: Float[Array, "n d"]):
    """Clusters and rank-collapse residual of the directions of `x`, and whether `x`
    is finite."""
    u = project(x, None)
    return cluster_count(u, CLUSTER_EPS), rank_collapse_residual(u), jnp.all(jnp.isfinite(x))


@kept_jit
def draw_batch(keys: PRNGKeyArray, *, size: tuple[int, int], heads: int,
               masks: tuple[str, ...], window: int, keep: float):
    """Every instance of a cell (`draw_instance`, one key each `(I,)`) and its masks.

    **Returns:**

    `P`, `U` `(I, h, d, d)`, `x0` `(I, n, d)` and the masks `(M, I, n, n)` of the
    kinds `masks` (`MASKS`) with their `window` and `keep`.
    """
    n, d = size
    P, U, x0, mkeys = jax.vmap(lambda key: draw_instance(key, n, d, heads))(keys)
    M = jnp.stack([jax.vmap(lambda key, m=m: make_mask(m, n, key, window, keep))(mkeys)
                   for m in masks])
    return P, U, x0, M


#: Instances run together as one block (`run_program`): a program runs its instances
#: block by block, so that an instance's numbers do not depend on how many there are
#: or how many devices share them (`--distributed`).
BLOCK = 8


@kept_jit
def run_program(P, U, x0, masks, betas, *, num_layers: int, tau: float, norm: str,
                kernel: str, mesh: Mesh | None = None):
    """One static variant over a batch: every mask × β × instance, vmapped over
    blocks of `BLOCK` instances (the blocks split over `mesh`'s devices, if given).

    **Arguments:**

    - `P`, `U`, `x0`, `masks`: as `draw_batch` returns them; `betas`: `(B,)`.
    - `num_layers`, `tau`, `norm`, `kernel`: the depth, step and static variant.
    - `mesh`: the devices the blocks are split over (`None`: this process's first).

    **Returns:**

    `E (M, B, I, L+1)`, `clusters`, `residual`, `finite` `(M, B, I)`.
    """
    def one(P, U, x0, mask, beta):
        dyn = with_beta(SelfAttentionDynamics(P, U, norm=norm, kernel=kernel, mask=mask), beta)
        E, last = depth_run(dyn, x0, num_layers, tau)
        return (E, *measure(last))

    def block(args, betas):  # BLOCK instances and their masks (BLOCK, M, n, n)
        over_i = jax.vmap(one, in_axes=(0, 0, 0, 0, None))
        over_b = jax.vmap(over_i, in_axes=(None, None, None, None, 0), out_axes=1)
        return jax.vmap(over_b, in_axes=(None, None, None, 1, None), out_axes=1)(*args, betas)

    out = map_blocks(block, (P, U, x0, jnp.moveaxis(masks, 0, 1)), mesh, (betas,),
                     block=BLOCK)  # each (I, M, B, …)
    return tuple(jnp.moveaxis(a, 0, 2) for a in out)


# --- one chunk -----------------------------------------------------------------------


def simulate_chunk(config: Config, grid: Grid, program: tuple[int, int, int]) -> dict:
    """Run one static variant of the grid (all its masks, β and instances) and reduce
    it to per-instance measurements (`MEASURES`, each `(M, B, I)`) and the median `E`
    over instances after every layer, `E_median (M, B, L+1)`. In a distributed run
    (`--distributed`) its blocks are split over every process's devices."""
    s, a, k = program
    keys = jnp.stack([jax.random.PRNGKey(config.seed + i)
                      for i in range(config.instances)])
    drawn = (*draw_batch(keys, size=tuple(grid.sizes[s]), heads=config.heads,
                         masks=grid.masks, window=config.window, keep=config.keep),
             jnp.asarray(grid.betas, float))
    mesh = global_mesh()
    out = run_program(*(drawn if mesh is None else replicate(drawn, mesh)),
                      num_layers=config.layers, tau=config.tau, norm=grid.norms[a],
                      kernel=grid.kernels[k], mesh=mesh)
    E, clusters, residual, finite = gather_all(out)
    E = np.asarray(E)
    return {"final_E": E[..., -1], "consensus_layer": consensus_layer(E),
            "clusters": np.asarray(clusters), "residual": np.asarray(residual),
            "stalled": stalled(E, config.tau), "finite": np.asarray(finite),
            "E_median": np.median(E, axis=-2)}


def consensus_layer(E: np.ndarray) -> np.ndarray:
    """The first layer with `E < CONSENSUS_TOL`, per leading index (`inf`: not reached)."""
    below = E < CONSENSUS_TOL
    return np.where(below.any(-1), np.argmax(below, -1).astype(float), np.inf)


def stalled(E: np.ndarray, tau: float) -> np.ndarray:
    """Whether `E` (`(..., L+1)`) neither reached `CONSENSUS_TOL` nor falls
    measurably over the last third of the run (`convergence_trend`: stalled or
    rising), per leading index."""
    ts = tau * np.arange(E.shape[-1])
    flat = E.reshape(-1, E.shape[-1])
    states = [convergence_trend(ts, e, CONSENSUS_TOL).contradicts for e in flat]
    return np.asarray(states, bool).reshape(E.shape[:-1])


# --- the chunks of a run, resumable ----------------------------------------------------


def run_chunks(config: Config, grid: Grid, folder: Path | None, *, progress: bool,
               desc: str) -> list[dict]:
    """Every program's chunk: loaded from `folder` when an earlier, interrupted run
    saved it there (`--resume`), else computed and saved atomically into it (`None`:
    computed, not saved). The run folder is held and its settings checked
    (`write_run`): a chunk in it belongs to this study. In a distributed run process 0
    alone reads and writes the folder, and tells the others which chunks to compute
    (they return those alone)."""
    programs = grid.programs()
    if folder is not None and is_writer():
        folder.mkdir(exist_ok=True)
        clear_partial_writes(folder)
        if not config.resume:  # a fresh run does not mix in an old one's chunks
            for old in folder.glob("*.npz"):
                old.unlink()
    todo = set(agree(lambda: [i for i in range(len(programs)) if folder is None
                              or not (folder / f"{i:04d}.npz").exists()]))
    width = jnp.result_type(float)

    def piece(index, chunks):
        if folder is None or not is_writer():
            chunks += [simulate_chunk(config, grid, programs[index])] if index in todo else []
            return chunks, None
        path = folder / f"{index:04d}.npz"
        if index in todo:
            save_npz(path, **simulate_chunk(config, grid, programs[index]))
        with np.load(path) as f:
            chunk = {key: f[key] for key in f.files}
        if chunk["E_median"].dtype != width:
            raise RunFolderError(f"{path} holds {chunk['E_median'].dtype} numbers, this process "
                                 f"computes in {width}; resume it with the same precision.")
        chunks.append(chunk)
        return chunks, None

    chunks, _ = advance(piece, [], len(programs), desc=desc, progress=progress)
    return chunks


def gather(grid: Grid, chunks: list[dict]) -> dict[str, np.ndarray]:
    """The chunks as arrays over the grid: each measure `(S, N, M, K, B, I)`,
    `E_median (S, N, M, K, B, L+1)`."""
    S, N, M, K, B = grid.shape
    out = {}
    for key in MEASURES + ("E_median",):
        parts = np.stack([c[key] for c in chunks])  # (S·N·K, M, B, …)
        parts = parts.reshape((S, N, K) + parts.shape[1:])
        out[key] = np.moveaxis(parts, 2, 3)  # → (S, N, M, K, B, …)
    return out


# --- verdicts ----------------------------------------------------------------------------

#: The outcome of a cell, from its instances at the final depth.
OUTCOMES = ("consensus", "apart", "slow", "overflow")


def outcome(reached: np.ndarray, stall: np.ndarray, clusters: np.ndarray,
            finite: np.ndarray) -> str:
    """`"consensus"` when ≥ 90 % of the instances reached `E < CONSENSUS_TOL`;
    `"overflow"` when most overflowed (tokens that grow without a normalisation
    leave float64 before the final depth); `"apart"` when most stalled (E flat or
    rising over the last third) with two clusters or more; else `"slow"` (still
    converging at the final depth)."""
    if np.mean(reached) >= 0.9:
        return "consensus"
    if np.mean(finite) < 0.5:
        return "overflow"
    if np.mean(stall & (clusters >= 2)) > 0.5:
        return "apart"
    return "slow"


@functools.lru_cache(maxsize=64)
def classified(size: tuple[int, int], heads: int, norm: str, mask: str, kernel: str,
               window: int, keep: float, seed: int) -> Classification:
    """`ja.theory.classify` of a variant's canonical form (`causal=True`, `window=w`
    or the sparse mask, rather than the study's mask arrays) with the weights of the
    instance of `seed`."""
    return classify(_canonical(size, heads, norm, mask, kernel, window, keep, seed))


def _canonical(size, heads: int, norm: str, mask: str, kernel: str, window: int, keep: float,
               seed: int) -> SelfAttentionDynamics:
    """A variant's canonical form (`classified`) with the weights of the instance of
    `seed`."""
    P, U, _, key = draw_instance(jax.random.PRNGKey(seed), *size, heads)
    form = {"causal": mask == "causal", "window": window if mask == "window" else None,
            "mask": make_mask(mask, size[0], key, window, keep) if mask == "sparse" else None}
    return SelfAttentionDynamics(P, U, beta=1.0, norm=norm, kernel=kernel, **form)


@functools.lru_cache(maxsize=16)
def in_domain(size: tuple[int, int], heads: int, mask: str, window: int, keep: float,
              seed: int, instances: int) -> np.ndarray:
    """Per instance `(I,)`, whether its start lies in the domain of attraction of a
    theorem that covers the post-norm softmax model with `mask` (`ja.theory.predict`:
    an open hemisphere for Theorem 4.1, `x₂ ≠ −x₁` for 5.1). Those domains read the
    tokens and the sphere alone, so one model serves every instance."""
    dyn = _canonical(size, heads, "post", mask, "softmax", window, keep, seed)
    keys = jnp.stack([jax.random.PRNGKey(seed + i) for i in range(instances)])
    x0 = np.asarray(jax.vmap(lambda key: draw_instance(key, *size, heads)[2])(keys))
    found = predict(dyn, x0)
    return np.logical_or.reduce([p.in_domain for p in (found, *found.others)])


def theorems_for(size: tuple[int, int], heads: int, norm: str, mask: str, kernel: str,
                 window: int, keep: float, seed: int) -> tuple[tuple[str, ...], str]:
    """The theorems that cover a variant, and why none does (the model-form
    hypotheses it fails; empty when one applies), as `ja.theory.classify` says.

    `classify` adds three checks of the model's form to every theorem — post-
    normalisation, softmax, no window or mask — beside hypotheses on the weights
    alone (`docs/variants.md`), so its answer factorises: it is read from the
    classifications of `(post, mask, softmax)`, `(norm, full, softmax)` and `(post,
    full, kernel)`, nine compiled classifications per size instead of one per variant.
    """
    args = (window, keep, seed)
    by_mask = classified(size, heads, "post", mask, "softmax", *args)
    others = [classified(size, heads, norm, "full", "softmax", *args),
              classified(size, heads, "post", "full", kernel, *args)]
    form = [c for r in [by_mask, *others] for c in r["4.1"].checks[:3]]  # the form first
    theorems = by_mask.theorems if all(c.holds for c in form) else ()
    return theorems, "; ".join(dict.fromkeys(c.detail for c in form if not c.holds))


def verdict_words(theorems: tuple[str, ...], result: str, layers: int,
                  starts: str = "") -> tuple[str, str]:
    """`(kind, words)` for a cell: `"theorem"` (its outcome follows from a theorem),
    `"new"` (no theorem covers it) or `"theorem, not reached"`; `starts` says which
    starts the theorem covers, where not all."""
    if theorems:
        names = " and ".join(f"Theorem {t}" for t in theorems)
        if result == "consensus":
            return "theorem", f"consensus, as {names} predicts{starts}"
        return "theorem, not reached", f"{names} applies{starts}; not reached by layer {layers}"
    words = {"consensus": "new observation: collapses without a theorem",
             "apart": "new observation: keeps tokens apart (E stalled, ≥ 2 clusters)",
             "slow": f"no theorem; not in consensus by layer {layers} (still converging)",
             "overflow": "no theorem; the tokens overflow float64 (unbounded growth)"}
    return "new", words[result]


def cell_rows(config: Config, grid: Grid, data: dict) -> list[dict]:
    """One row per cell (size × norm × mask × kernel × β): medians over instances,
    the outcome, the theorems and the verdict, and the command that repeats it."""
    rows = []
    for s, a, m, k in itertools.product(*(range(x) for x in grid.shape[:4])):
        theorems, why = theorems_for(tuple(grid.sizes[s]), config.heads, grid.norms[a],
                                   grid.masks[m], grid.kernels[k], config.window,
                                   config.keep, config.seed)
        # a theorem speaks for the starts in its domain alone (Theorem 4.1: an open
        # hemisphere, which most of size 1's ten random tokens are not in)
        inside = (in_domain(tuple(grid.sizes[s]), config.heads, grid.masks[m], config.window,
                            config.keep, config.seed, data["finite"].shape[-1])
                  if theorems else None)
        if inside is not None and not inside.any():
            why = f"no start in the domain of Theorem {' or '.join(theorems)}"
            theorems = ()
        starts = ("" if inside is None or inside.all() else
                  f" (for the {inside.sum()} of {inside.size} starts in its domain)")
        for b, beta in enumerate(grid.betas):
            at = (s, a, m, k, b)
            reached = np.isfinite(data["consensus_layer"][at])
            judged = slice(None) if not theorems else inside
            result = outcome(reached[judged], data["stalled"][at][judged],
                             data["clusters"][at][judged], data["finite"][at][judged])
            kind, words = verdict_words(theorems, result, config.layers, starts)
            n, d = grid.sizes[s]
            rows.append({
                "size": SIZES.index(grid.sizes[s]) + 1, "tokens": n, "dim": d,
                "norm": grid.norms[a], "mask": grid.masks[m], "kernel": grid.kernels[k],
                "beta": beta, "reached": float(np.mean(reached)),
                **{f"{key}_median": float(np.median(data[key][at]))
                   for key in ("consensus_layer", "final_E", "clusters", "residual")},
                **{key: float(np.mean(data[key][at])) for key in ("stalled", "finite")},
                "theorem": " ".join(theorems) or "none", "no_theorem_because": why,
                "in_domain": float(np.mean(inside)) if theorems else 0.0,
                "outcome": result, "kind": kind,
                "verdict": words, "command": cell_command(config, grid, at)})
    return rows


def cell_command(config: Config, grid: Grid, at: tuple[int, ...]) -> str:
    """The `jaxattn run variants` command that computes the cell `at` alone."""
    s, a, m, k, b = at
    cell = {"size": SIZES.index(grid.sizes[s]) + 1, "norm": NORMS.index(grid.norms[a]) + 1,
            "mask": MASKS.index(grid.masks[m]) + 1,
            "kernel": KERNELS.index(grid.kernels[k]) + 1, "beta": grid.betas[b]}
    defaults = {p.name: p.default for p in VariantsExperiment.params}
    cell |= {flag: defaults[flag] for flag, mask in MASK_SETTINGS if grid.masks[m] != mask}
    return command_line(config | cell, VariantsExperiment())


class VariantsExperiment(AbstractExperiment):
    distributable = True
    name = "variants"
    title = ("which variants escape consensus: norm × mask × kernel × β on random weights, "
             "at a fixed depth")
    theorem = "4.1, 5.1 for post + softmax; no theorem for the variants"
    params = (
        Param("size", int, 0, "size: 0 both, 1 n = 10 tokens in R³, 2 n = 32 in R¹⁶"),
        Param("norm", int, 0, "placement: all, post, pre, peri, ngpt or none (or its code "
              "0–5)", names=("all", "post", "pre", "peri", "ngpt", "none")),
        Param("mask", int, 0, "mask: all, full, causal, window or sparse (random; or its "
              "code 0–4)", names=("all", "full", "causal", "window", "sparse")),
        Param("kernel", int, 0, "kernel: both, softmax or sigmoid (or its code 0–2)",
              names=("both", "softmax", "sigmoid")),
        Param("beta", float, 0.0, "β: 0 the grid 0.5, 1, 4, 16; else this β alone"),
        Param("window", int, 2, "width w of the window mask (i attends to |i − j| < w)", 1),
        Param("keep", float, 0.3, "keep-probability p of the random sparse mask"),
        Param("instances", int, 24, "random instances (weights, start, mask) per cell", 1),
        Param("layers", int, 400, "depth L: the layers run", 1),
        Param("tau", float, 0.25, "step τ of a layer", 0.0),
        Param("heads", int, 2, "heads h (U_η = I/h, P_η Gaussian)", 1),
        Param("resume", bool, False, "continue the interrupted run in --out DIR, reusing "
              "its saved chunks (run it again with the same settings and --resume)"),
    )

    def refusals(self, config):
        # `convert` checks the named choices (norm, mask, kernel); --size has no names
        listed = ", ".join(f"{i + 1} {n}" for i, n in enumerate(SIZES))
        sized = 0 <= config.size <= len(SIZES)
        grid = Grid.of(config) if sized else None
        fewest = min(n for n, _ in grid.sizes) if sized else 0
        default = {p.name: p.default for p in self.params}
        return ((sized and "window" in grid.masks and config.window >= fewest,
                 f"--window {config.window} is at least the n = {fewest} tokens: the window "
                 f"mask would be the full one; choose --window below {fewest}."),
                (not config.beta >= 0, f"--beta must be ≥ 0 (0: the grid "
                 f"{', '.join(map(str, BETAS))}), got {config.beta!r}."),
                (not 0 < config.keep <= 1, f"--keep is a keep-probability in (0, 1], got "
                 f"{config.keep!r}."),
                (sized and "sparse" in grid.masks and config.keep == 1, "--keep 1 keeps every "
                 "pair: the sparse mask would be the full one; choose --keep below 1."),
                # a mask's setting changed for a run without that mask: nothing reads it
                *((sized and config[flag] != default[flag] and mask not in grid.masks,
                   f"--{flag} sets the {mask} mask, which this run's --mask leaves out; drop "
                   f"--{flag} or add the {mask} mask.") for flag, mask in MASK_SETTINGS),
                (not sized, f"--size must be 0 (all) or one of "
                 f"{listed}; got {config.size!r}."))

    def simulate(self, config, progress, folder: Path | None = None):
        """The study's arrays; its chunks are kept in `folder/chunks` until it is done
        (`folder`: the run folder; `None`: nothing saved, nothing to resume)."""
        grid = Grid.of(config)
        chunks = None if folder is None else Path(folder) / CHUNKS
        computed = run_chunks(config, grid, chunks, progress=progress, desc=self.name)
        if not is_writer():  # process 0 has every chunk
            return {}
        data = gather(grid, computed)
        if chunks is not None:
            shutil.rmtree(chunks, ignore_errors=True)
        return data | {"betas": np.asarray(grid.betas), "norms": np.asarray(grid.norms),
                       "masks": np.asarray(grid.masks), "kernels": np.asarray(grid.kernels),
                       "sizes": np.asarray(grid.sizes)}

    def verdict(self, config, data):
        grid = _grid_of_data(data)
        rows = cell_rows(config, grid, data)
        line, per_variant = format_verdicts(rows)
        counts = {kind: sum(r["kind"] == kind for r in rows)
                  for kind in ("theorem", "theorem, not reached", "new")}
        outcomes = {o: sum(r["outcome"] == o for r in rows) for o in OUTCOMES}
        # a cell a theorem covers not in consensus by the last layer is judged neither
        # way (it may be slow, or its stall a finite depth's): the run is undecided
        missed = counts["theorem, not reached"]
        undecided = (f"{missed} cell{'s' * (missed != 1)} a theorem covers not in consensus "
                     f"by layer {config.layers}: raise --layers") if missed else ""
        return Verdict(not missed, line, {"cells": len(rows), **counts, **outcomes},
                       {"verdicts": per_variant, "cells": rows,
                        "cluster_eps": CLUSTER_EPS, "tolerance": CONSENSUS_TOL,
                        "residual": "‖X̂ − 1 x̄ᵀ‖_F / ‖X̂‖_F of the normalised tokens X̂"},
                       undecided)

    def draw(self, config, data, folder: Path):
        grid = _grid_of_data(data)
        rows = cell_rows(config, grid, data)
        table_csv(folder / "table.csv", rows)
        return draw_study(config, grid, data, rows, folder / "variants")


def _grid_of_data(data: dict) -> Grid:
    """The grid saved in `data.npz` (so that `jaxattn plot` needs no recomputation)."""
    if "sizes" not in data:
        raise RunFolderError("this variants folder has no `sizes` in data.npz; re-run it.")
    return Grid(tuple(tuple(int(v) for v in s) for s in data["sizes"]),
                tuple(str(v) for v in data["norms"]), tuple(str(v) for v in data["masks"]),
                tuple(str(v) for v in data["kernels"]),
                tuple(float(v) for v in data["betas"]))
