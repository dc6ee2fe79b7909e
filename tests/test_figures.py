"""Every figure jaxattn draws, rendered from small saved runs and checked as a reviewer
would: no two pieces of text overlap, no text leaves the figure, and no curve is
silently dropped from a log axis.

The data are small real runs (`tests/data/figures/NAME/`: `config.json`, `data.npz`;
the sweep's `table.csv` and `sweep.json`), drawn again here by each experiment's own
`draw(config, data, folder)` and by the loop, sweep and demo figure functions.
`python tests/test_figures.py --regenerate` runs them again at the same sizes.
"""

import itertools
import json
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text

from jaxattn._app.figures import save_sphere_figure
from jaxattn.experiments import EXPERIMENTS
from jaxattn.experiments.loop_grid import loop_title, save_loop_figure
from jaxattn.sweep import SweepSpec, load_table
from jaxattn.sweep._report import write_figure

DATA = Path(__file__).parent / "data" / "figures"
#: Pixels two text boxes may share (antialiasing at the edges), and text may stick out.
SLACK = 1.0


def _load(name: str) -> tuple[dict, dict]:
    config = json.loads((DATA / name / "config.json").read_text())
    with np.load(DATA / name / "data.npz") as f:
        return config, {k: f[k] for k in f.files}


def _draw_experiment(name, folder):
    config, data = _load(name)
    return EXPERIMENTS[name].draw(config, data, folder)


def _draw_loop(name, folder):
    config, data = _load(name)
    return save_loop_figure(data["E"], config["layers_per_pass"], folder / "loop",
                            title=loop_title(config), variant="full")


def _draw_sweep(name, folder):
    sidecar = json.loads((DATA / "sweep" / "sweep.json").read_text())
    (folder / "sweep.json").write_text(json.dumps(sidecar))
    spec = SweepSpec(**sidecar["spec"])
    return write_figure(folder, spec, sidecar["grid_keys"], load_table(DATA / "sweep"))


def _draw_demo(name, folder):
    with np.load(DATA / "demo" / "data.npz") as f:
        return [save_sphere_figure(f["ys"], f["ts"], f["E"], folder / "demo_sphere.png")]


FIGURES = {name: _draw_experiment for name in EXPERIMENTS if (DATA / name).is_dir()}
FIGURES |= {"loop": _draw_loop, "sweep": _draw_sweep, "demo": _draw_demo}


@pytest.fixture
def drawn(monkeypatch):
    """The figures closed while the test runs (each is closed once it is saved). The
    PDFs are skipped (the same figure, twice the time)."""
    figures = []
    close, savefig = plt.close, Figure.savefig

    def keep(fig=None):
        if fig is not None and not isinstance(fig, (str, int)):
            figures.append(fig)
        return close(fig)

    def png_only(fig, fname, *args, **kwargs):
        if kwargs.get("format") == "pdf":
            return fname.write(b"%PDF-skipped")
        return savefig(fig, fname, *args, **kwargs)

    monkeypatch.setattr(plt, "close", keep)
    monkeypatch.setattr(Figure, "savefig", png_only)
    return figures


def _rendered_texts(fig) -> list[tuple[Text, object]]:
    """Every non-empty text the renderer drew, with its box in pixels."""
    texts = []
    draw = Text.draw

    def record(self, renderer):
        draw(self, renderer)
        if self.get_visible() and self.get_text().strip():
            texts.append((self, self.get_window_extent(renderer)))

    Text.draw = record
    try:
        FigureCanvasAgg(fig).draw()  # a closed figure's canvas draws nothing
    finally:
        Text.draw = draw
    return texts


def _overlaps(texts) -> list[str]:
    """Pairs of texts whose boxes share more than `SLACK` pixels each way."""
    found = []
    for (a, ba), (b, bb) in itertools.combinations(texts, 2):
        w = min(ba.x1, bb.x1) - max(ba.x0, bb.x0)
        h = min(ba.y1, bb.y1) - max(ba.y0, bb.y0)
        if w > SLACK and h > SLACK:
            found.append(f"{a.get_text()!r} overlaps {b.get_text()!r}")
    return found


def _outside(texts, fig) -> list[str]:
    """Texts that stick out of the figure (cut off in the saved file)."""
    width, height = fig.get_figwidth() * fig.dpi, fig.get_figheight() * fig.dpi
    return [f"{t.get_text()!r} leaves the figure" for t, b in texts
            if b.x0 < -SLACK or b.y0 < -SLACK or b.x1 > width + SLACK or b.y1 > height + SLACK]


def _upside_down(texts) -> list[str]:
    """Texts that read top to bottom or upside down (3-D axis labels can)."""
    return [f"{t.get_text()!r} is upside down ({t.get_rotation():.0f}°)"
            for t, _ in texts if 95 < t.get_rotation() % 360 < 275]


def _dropped_from_log_axes(fig) -> list[str]:
    """Lines on a log axis with no positive finite point inside the axis limits."""
    found = []
    for ax in fig.axes:
        if not isinstance(ax, Axes) or ax.name != "rectilinear":
            continue
        logx, logy = ax.get_xscale() == "log", ax.get_yscale() == "log"
        if not (logx or logy):
            continue
        (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
        for line in ax.lines:
            x = np.asarray(line.get_xdata(), float)
            y = np.asarray(line.get_ydata(), float)
            x, y = np.broadcast_arrays(x, y)
            # a coordinate in axes units (axhline, axvline) is no data on the log axis
            in_x, in_y = line.get_transform().contains_branch_seperately(ax.transData)
            x, y = (x if in_x else np.full_like(x, x0)), (y if in_y else np.full_like(y, y0))
            ok = np.isfinite(x) & np.isfinite(y) & (x >= x0) & (x <= x1) & (y >= y0) & (y <= y1)
            ok &= (x > 0) if logx else True
            ok &= (y > 0) if logy else True
            if not ok.any():
                found.append(f"{ax.get_title()!r}: line {line.get_label()!r} has no positive "
                             "point inside the log axis")
    return found


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_figure_is_readable(name, tmp_path, drawn):
    paths = FIGURES[name](name, tmp_path)
    assert paths and all(Path(p).stat().st_size > 0 for p in paths)
    assert drawn, "the figure was not closed after saving"
    fig = drawn[0]
    texts = _rendered_texts(fig)
    problems = (_overlaps(texts) + _outside(texts, fig) + _upside_down(texts)
                + _dropped_from_log_axes(fig))
    assert not problems, f"{name}: " + "; ".join(problems[:8])


def test_every_experiment_has_a_saved_run():
    """A new experiment gets its figure checked too: add it to `RUNS` and regenerate."""
    assert sorted(n for n in EXPERIMENTS if not (DATA / n).is_dir()) == []
    assert sorted(n for n in EXPERIMENTS if n != "loop-grid") == sorted(RUNS)


def test_the_checks_catch_what_they_look_for():
    """A figure with every fault: overlapping labels, a title cut off at the edge, an
    upside-down label, a curve of zeros on a log axis."""
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([1, 2], [1e-3, 1e-1], label="fine")
    ax.plot([1, 2], [0.0, 0.0], label="zeros")
    ax.set_yscale("log")
    ax.text(1.5, 1e-2, "one label")
    ax.text(1.5, 1e-2, "another label")
    ax.set_title("a title far too long to fit into a figure only three inches wide")
    ax.set_ylabel("upside down", rotation=180)
    try:
        texts = _rendered_texts(fig)
        assert any("'one label' overlaps 'another label'" in p for p in _overlaps(texts))
        assert any("leaves the figure" in p for p in _outside(texts, fig))
        assert any("'upside down' is upside down" in p for p in _upside_down(texts))
        assert [p for p in _dropped_from_log_axes(fig) if "'zeros'" in p]
        assert not [p for p in _dropped_from_log_axes(fig) if "'fine'" in p]
    finally:
        plt.close(fig)


# --- regenerating the saved runs ---------------------------------------------------

#: The runs behind `tests/data/figures`, as `jaxattn` command lines.
RUNS = {
    "thm41-sphere": "--tokens 5 --horizon 8 --saves 40 --tau 0.05 --discrete",
    "thm51-causal": "--tokens 6 --dim 12 --samples 5 --horizon 14 --saves 40 --tau 0.2 "
                    "--discrete",
    "thm52-symmetric": "--tokens 4 --horizon 20 --saves 40 --tau 0.1 --discrete",
    "thm32-gradient": "--tokens 4 --horizon 60 --saves 60 --tau 0.1 --discrete",
    "adversarial-tokens": "--steps 5 --restarts 2 --tokens 5 --dim 6 --causal-tokens 5 "
                          "--saves 10",
    "adversarial-weights": "--steps 5 --restarts 2 --tokens 4 --saves 10",
    "conjecture-multihead": "--steps 5 --restarts 2 --tokens 4 --saves 10",
    "conjecture-bipartite": "--steps 10 --restarts 2 --tokens 4 --split 2 --layers 50",
    "power-shared": "--hidden 16 --heads 2 --prompts 3 --tokens 4 --depth 3 --std 0.3",
    "power-layers": "--hidden 16 --heads 2 --prompts 3 --tokens 4",
    "steer": "--hidden 16 --heads 2 --prompts 3 --tokens 4",
    "oja-bipartite": "--instances 2 --tokens 4",
    "phase-diagram": "--betas 4 --systems 8 --tokens 6 --times 20",
    "norm-beta": "--betas 3 --systems 4 --tokens 6 --dim 4 --heads 2 --horizon 5 --times 20",
    "variants": "--instances 2 --layers 20",
}
TINY_GPT2 = {"model_type": "gpt2", "n_layer": 4, "n_embd": 24, "n_head": 3, "vocab_size": 37,
             "n_positions": 16}
_NOISE = ("versions", "started", "argv", "run_id", "backend", "deterministic", "kind",
          "model_config", "command")


def _keep(folder: Path, name: str, **extra) -> None:
    import shutil

    config = json.loads((folder / "config.json").read_text())
    config = {k: v for k, v in config.items() if k not in _NOISE} | extra
    (DATA / name).mkdir(parents=True, exist_ok=True)
    (DATA / name / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    shutil.copy(folder / "data.npz", DATA / name / "data.npz")


def regenerate(work: Path) -> None:
    """Run every saved run again into `work` and copy its data to `tests/data/figures`."""
    import jax
    import jax.numpy as jnp

    from jaxattn import solve_flow
    from jaxattn.cli import main
    from jaxattn.experiments import paper
    from jaxattn.metrics import misalignment

    for name, args in RUNS.items():
        assert main(["run", name, "--out", str(work / name), "--no-progress",
                     *args.split()]) in (0, 3)
        _keep(work / name, name)
    (work / "tiny-gpt2.json").write_text(json.dumps(TINY_GPT2))
    loop = ["--model", str(work / "tiny-gpt2.json"), "--passes", "8", "--prompts", "4",
            "--tokens", "6"]
    assert main(["loop", *loop, "--weights", "random", "--out", str(work / "loop")]) == 0
    assert main(["loop", *loop, "--grid", "--out", str(work / "loop-grid")]) == 0
    for name in ("loop", "loop-grid"):
        # a model path as long as a user's: the title must still fit
        _keep(work / name, name, model="models/tiny-gpt2/config.json",
              layers_per_pass=TINY_GPT2["n_layer"])
    assert main(["sweep", "thm41-sphere", "--grid", "beta=0.5,1,2", "--grid", "heads=1,2",
                 "--instances", "4", "--set", "horizon=3", "--set", "saves=20", "--set",
                 "tokens=5", "--out", str(work / "sweep"), "--no-progress"]) == 0
    sidecar = json.loads((work / "sweep" / "sweep.json").read_text())
    (DATA / "sweep").mkdir(parents=True, exist_ok=True)
    (DATA / "sweep" / "sweep.json").write_text(json.dumps(
        {k: sidecar[k] for k in ("spec", "grid_keys", "tolerance")}, indent=1) + "\n")
    (DATA / "sweep" / "table.csv").write_bytes((work / "sweep" / "table.csv").read_bytes())
    with jax.enable_x64(False):  # as `jaxattn demo` runs: float32
        k_model, k_x = jax.random.split(jax.random.PRNGKey(0))
        dyn = paper.sphere_dynamics(k_model)
        ts = jnp.linspace(0.0, 10.0, 401)
        ys = solve_flow(dyn, paper.hemisphere_tokens(k_x, 10, 3), ts)
        (DATA / "demo").mkdir(parents=True, exist_ok=True)
        np.savez_compressed(DATA / "demo" / "data.npz", ts=np.asarray(ts), ys=np.asarray(ys),
                            E=np.asarray(misalignment(ys)))


if __name__ == "__main__" and "--regenerate" in sys.argv:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        regenerate(Path(tmp))
