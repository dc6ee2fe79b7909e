"""The token trajectories a run folder saved, for `jaxattn animate` and `jaxattn view`:
the arrays of its `data.npz` named by `ys` or `paths` (docs/usage/animations.md),
`(T, n, d)` or `(B, T, n, d)` for `B` runs side by side. Their times and misalignment
are the arrays named with `ts` and `E` in their place (`ts_layers`); without saved
times a trajectory is a sequence of layers. A loop folder's `states (B, K, n, d)`
(`jaxattn loop --save-states`) are one per prompt, at the blocks `depths (K,)`.
"""

import dataclasses
import re
from pathlib import Path

import numpy as np

from .._validate import refuse_first
from .folders import INCOMPLETE, RunFolderError, check_not_held, read_data, read_settings

#: Where the tokens are: `ys`, `paths` or `states` as the whole name or one of its `_`
#: parts.
_TOKENS = re.compile(r"(^|_)(ys|paths|states)(_|$)")


def superscript(d: int) -> str:
    """`d` in superscript digits (`R³`)."""
    return str(d).translate(str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹"))


@dataclasses.dataclass(frozen=True)
class Trajectory:
    """One saved trajectory: `xs (T, n, d)`, its times `ts (T,)` (layers when none
    were saved), its misalignment `E (T,)` if saved, and where it came from."""

    name: str
    xs: np.ndarray
    ts: np.ndarray
    E: np.ndarray | None
    layers: bool
    experiment: str = ""  # the run folder's experiment, when its config.json names one
    note: str = ""  # what was left out: the saves from the first NaN or inf on

    @property
    def title(self) -> str:
        where = f"{self.experiment} {self.name}" if self.experiment else self.name
        return f"{where}: {tokens_title(self.xs)}"


def on_sphere(xs: np.ndarray) -> bool:
    """Whether every token of `xs (…, d)` is a unit vector (to 1e-3)."""
    return bool(np.all(np.abs(np.linalg.norm(xs, axis=-1) - 1) < 1e-3))


def tokens_title(xs: np.ndarray) -> str:
    """`n tokens on S^{d−1}` for unit tokens `xs (T, n, d)`, else `n tokens in R^d`."""
    n, d = xs.shape[1:]
    if on_sphere(xs):
        return f"{n} tokens on S{superscript(d - 1)}"
    return f"{n} tokens in R{superscript(d)}"


def trajectory_names(data) -> list[str]:
    """The names of the arrays in `data` that hold tokens: `(T, n, d)` or
    `(B, T, n, d)` with `d ≥ 2`."""
    return [k for k in data if _TOKENS.search(k) and np.ndim(data[k]) in (3, 4)
            and np.shape(data[k])[-1] >= 2 and np.shape(data[k])[-3] >= 1]


def _partner(data, name: str, key: str, shape: tuple) -> np.ndarray | None:
    """The array named like `name` with `ys`/`paths` replaced by `key`, if it has
    `shape` (or one row per run: `(B, T)` for `(B, T, n, d)` tokens)."""
    other = _TOKENS.sub(lambda m: f"{m.group(1)}{key}{m.group(3)}", name, count=1)
    if other != name and other in data and np.shape(data[other]) == shape:
        return np.asarray(data[other], dtype=np.float64)
    return None


def pick(data, name: str | None = None, index: int = 0, *,
         none: str = "no token trajectory in data.npz") -> Trajectory:
    """One trajectory of `data` (a `data.npz`'s arrays): `name` (default: the first
    found), run `index` of a batch of runs. A `ValueError` names what there is
    (saying `none` when there is none)."""
    names = trajectory_names(data)
    name = names[0] if name is None and names else name
    shape = np.shape(data[name]) if name in names else (0, 0, 0)
    runs = shape[0] if len(shape) == 4 else 1
    which = (f"be in 0 … {runs - 1} ({name} holds {runs} runs)" if runs > 1
             else f"be 0: {name} holds one run")
    refuse_first((
        (not names, none),
        (name not in names, f"no trajectory {name!r} in data.npz; it has {', '.join(names)}"
         + (" (the layers are saved by a run with --discrete)." if str(name).endswith("_layers")
            else ".")),
        (not 0 <= index < runs, f"--index must {which}, got {index}."),
    ))
    refuse_first([(np.iscomplexobj(data[name]), f"{name} holds complex values; tokens "
                   "are real vectors.")])
    xs = np.asarray(data[name], dtype=np.float64)
    ts, E = (_partner(data, name, key, xs.shape[:-2]) for key in ("ts", "E"))
    if name == "states" and "depths" in data:  # a loop's: E (B, every block) at `depths`
        depths = np.asarray(data["depths"], dtype=int)
        ts = np.broadcast_to(depths.astype(np.float64), xs.shape[:-2])
        E = np.asarray(data["E"], np.float64)[..., depths] if "E" in data else None
    label = f"{name}[{index}]" if xs.ndim == 4 else name
    if xs.ndim == 4:  # run `index` of a batch (one run: `index` is 0)
        xs, ts, E = (None if a is None else a[index] for a in (xs, ts, E))
    # counted in layers where the saves are layer counts (a loop's depths, or no
    # times); a run's `*_layers` saves their times kτ, and are drawn against them
    layers = ts is None or name == "states"
    if ts is None:
        ts = np.arange(xs.shape[0], dtype=np.float64)
    # A run stopped by an event saves `inf` times (and placeholders) after its end;
    # tokens or E that are not finite before it are a diverged run, drawn up to there.
    timed = np.isfinite(ts)
    kept = timed & np.all(np.isfinite(xs), axis=(1, 2))
    if E is not None:
        kept &= np.isfinite(E)
    end = int(np.argmin(kept)) if not kept.all() else len(kept)
    if end == 0:
        raise ValueError(f"{label} holds no finite save to draw.")
    note = (f"save {end} of {len(kept)} (and maybe later ones) holds NaN or inf: drawn up to "
            f"save {end - 1}" if end < len(kept) and timed[end] else "")
    return Trajectory(label, xs[:end], ts[:end], None if E is None else E[:end], layers,
                      note=note)


def load(folder, name: str | None = None, index: int = 0) -> Trajectory:
    """The trajectory `name` (default: the first) of a run folder's `data.npz`; a
    `ValueError` (one line) when the folder has none, saying how to make one, and a
    `RunFolderError` when a running command holds it (its files are still being
    written) or its run was interrupted before it saved `data.npz`."""
    folder = Path(folder)
    check_not_held(folder)
    saved = (folder / "data.npz").is_file()
    refuse_first((
        (not folder.is_dir(), FileNotFoundError,
         f"{folder} is not a folder (give a run folder of `jaxattn run`, or of "
         "`jaxattn loop --save-states`)."),
        ((folder / INCOMPLETE).exists() and not saved, RunFolderError,
         f"{folder} is an incomplete run (it was interrupted before it saved data.npz); "
         "re-run it (`jaxattn loop … --resume --out DIR` continues a loop)."),
        (not saved, ValueError, f"{folder} has no data.npz: not a run folder."),
    ))
    data = read_data(folder)
    track = pick(data, name, index,
                 none=f"{folder} holds no token trajectory: {how_to_save(folder)}")
    experiment = str(read_settings(folder / "config.json").get("experiment", ""))
    if experiment in ENERGY_NOT_E:  # its `E` is another quantity: the misalignment is drawn
        track = dataclasses.replace(track, E=None)
    return dataclasses.replace(track, experiment=experiment)


#: The experiments whose saved `E` is not the misalignment (metastability's is the
#: interaction energy of its staircase).
ENERGY_NOT_E = ("metastability",)


#: The experiments whose saved runs hold token trajectories, and the arrays.
SAVES_TOKENS = {
    "thm41-sphere": "ys, ys_layers", "thm52-symmetric": "ys, ys_layers",
    "thm32-gradient": "ys, ys_layers", "adversarial-tokens": "sphere_ys_long",
    "conjecture-multihead": "h2_ys, h3_ys", "hardmax": "ys_psd, ys_nsd",
    "metastability": "ys (one run per β: --index)", "oja-bipartite": "fig13_paths",
}


#: How to make a trajectory of the experiments whose runs save none, in one line.
_RECIPES = {
    "thm51-causal": ("`weights, x0 = ja.experiments.get_experiment('thm51-causal').setup(key, "
                     "config)`, `dyn = ja.experiments.paper.causal_dynamics(weights)`, "
                     "`ys = ja.solve_flow(dyn, x0[0], ts)`, `ja.animate(ys, 'movie.mp4', ts)` "
                     "(d > 3: one PCA)"),
}


def how_to_save(folder) -> str:
    """What to do when a folder saved no tokens: by the kind of run it is."""
    folder = Path(folder)
    config = read_settings(folder / "config.json")
    name = config.get("experiment")
    if name is None and "model" in config:
        return ("this loop saved E only: run it with `--save-states 0,L,2L,…` (L: the "
                "model's blocks) to save the tokens after every pass, which animate and "
                "view draw (d > 3: one PCA), one prompt each (--index).")
    if name in _RECIPES:
        return f"{name} saves its measures only; simulate one of its starts: {_RECIPES[name]}."
    return (f"{name or 'this run'} saves its measures only; the runs that save tokens are "
            f"{', '.join(SAVES_TOKENS)} (`jaxattn run thm41-sphere`), and any trajectory "
            "of `ja.solve_flow` or `ja.run_layers` animates with "
            "`ja.animate(ys, 'movie.mp4', ts)`.")
