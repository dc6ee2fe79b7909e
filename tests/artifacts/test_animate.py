"""`ja.animate` and `jaxattn animate`: movies of token trajectories.

Checked against what a movie must be: the frame count and size read back from the
file (ffmpeg's own reader, Pillow), every frame's change where the tokens move, the
200-frame MP4 of 10 tokens within 30 s, memory that does not grow with the length
(tracemalloc), the PCA against numpy's SVD, the Lambert maps' equal-area property
(uniform tokens give density 1), and every saved run that holds tokens animated by
the command."""

import json
import resource
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import jaxattn as ja
from jaxattn._artifacts.animate import _rotation, facing, lambert_maps, pca3
from jaxattn._artifacts.trajectories import SAVES_TOKENS, load, trajectory_names
from jaxattn.cli import main

RUNS = Path(__file__).parents[1] / "data" / "figures"


def _trajectory(T=200, n=10, d=3, seed=0):
    """Tokens on S^{d−1} pulled towards one direction: a smooth, moving trajectory."""
    rng = np.random.default_rng(seed)
    x0 = rng.normal(size=(n, d))
    target = np.eye(d)[0]
    s = np.linspace(0.0, 4.0, T)[:, None, None]
    xs = x0[None] + s * target
    return xs / np.linalg.norm(xs, axis=-1, keepdims=True), np.linspace(0.0, 4.0, T)


def _mp4_frames(path):
    import imageio_ffmpeg

    reader = imageio_ffmpeg.read_frames(str(path))
    meta = reader.__next__()
    frames = [np.frombuffer(f, np.uint8).reshape(meta["size"][1], meta["size"][0], 3)
              for f in reader]
    return meta, frames


def _cpu_seconds() -> float:
    """CPU time of this process and of its finished children (ffmpeg)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.mark.slow  # 6 s of CPU, but 30–40 s of wall time on the shared machine
def test_200_frame_mp4_of_10_tokens_in_under_30_s(tmp_path):
    """Timed in CPU seconds (Python and the ffmpeg it runs): on the shared 2-core
    machine the wall time follows the other jobs' load (7 s alone, 39 s at load 16)."""
    xs, ts = _trajectory()
    ja.misalignment(xs[:2])  # JAX's start-up is not the movie's
    start, wall = _cpu_seconds(), time.perf_counter()
    path = ja.animate(xs, tmp_path / "tokens.mp4", ts, progress=False)
    seconds, wall = _cpu_seconds() - start, time.perf_counter() - wall
    print(f"200 frames of 10 tokens: {seconds:.1f} s of CPU, {wall:.1f} s wall")
    assert seconds < 30.0
    meta, frames = _mp4_frames(path)
    assert len(frames) == 200 and tuple(meta["size"]) == (640, 720)
    # the tokens move: consecutive frames differ, and the first from the last a lot
    changed = np.abs(frames[0].astype(int) - frames[-1]).max(axis=-1) > 40
    assert changed.sum() > 10 * 40  # ten tokens of ≥ 40 pixels each moved away
    assert all(np.any(a != b) for a, b in zip(frames[:20], frames[1:21]))
    # not a blank picture: the shaded sphere and coloured tokens
    assert frames[0].std() > 20


@pytest.mark.slow  # tracemalloc slows every allocation: a minute here
def test_mp4_memory_does_not_grow_with_its_length(tmp_path):
    xs, ts = _trajectory(T=160, n=10)
    ja.animate(xs[:5], tmp_path / "warm.mp4", ts[:5], progress=False, dpi=40)  # JAX, imports
    peaks = []
    for count in (40, 160):
        tracemalloc.start()
        ja.animate(xs, tmp_path / f"m{count}.mp4", ts, frames=count, progress=False, dpi=40)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    frame = 256 * 288 * 3
    print(f"peak Python memory: {peaks[0] / 1e6:.1f} MB (40 frames), "
          f"{peaks[1] / 1e6:.1f} MB (160 frames); a frame is {frame / 1e6:.2f} MB")
    assert peaks[1] - peaks[0] < 20 * frame  # 120 more frames held would be 120 frames


def test_gif_keeps_the_tokens_colours(tmp_path):
    from PIL import Image

    xs, ts = _trajectory(T=30, n=5)
    path = ja.animate(xs, tmp_path / "tokens.gif", ts, frames=12, dpi=50, progress=False)
    with Image.open(path) as im:
        assert im.n_frames == 12
        first = np.asarray(im.convert("RGB"))
    tab10 = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189)]
    for color in tab10:  # each token's colour is drawn exactly (the palette holds it)
        assert np.any(np.all(first == color, axis=-1)), color


def test_circle_ball_and_density_draw(tmp_path):
    xs2, ts = _trajectory(T=20, n=6, d=2)
    ja.animate(xs2, tmp_path / "circle.mp4", ts, progress=False, dpi=40)
    xs5, _ = _trajectory(T=20, n=6, d=5)
    ja.animate(xs5, tmp_path / "ball.mp4", ts, progress=False, dpi=40)
    xsn, _ = _trajectory(T=20, n=2500, d=3)
    meta, frames = _mp4_frames(ja.animate(xsn, tmp_path / "density.mp4", ts, progress=False,
                                          dpi=40))
    assert len(frames) == 20 and frames[-1].std() > 10


def test_pca_keeps_what_numpy_svd_says():
    rng = np.random.default_rng(1)
    xs = rng.normal(size=(30, 7, 6)) * np.array([3.0, 2.0, 1.5, 0.3, 0.2, 0.1])
    projected, kept = pca3(xs)
    s = np.linalg.svd(xs.reshape(-1, 6), compute_uv=False)
    np.testing.assert_allclose(kept, (s[:3] ** 2).sum() / (s ** 2).sum(), rtol=1e-12)
    # the projection keeps exactly that share of Σ‖x‖²
    np.testing.assert_allclose((projected ** 2).sum() / (xs ** 2).sum(), kept, rtol=1e-12)


def test_lambert_maps_are_equal_area():
    points = np.random.default_rng(2).normal(size=(400_000, 3))
    near, far = lambert_maps(points, 24)
    centers = np.linspace(-1, 1, 25)[:-1] + 1 / 24
    X, Y = np.meshgrid(centers, centers)
    inside = X**2 + Y**2 < 0.8  # cells wholly inside the disk
    for density in (near, far):  # uniform tokens: density 1 everywhere, to sampling noise
        assert abs(density[inside].mean() - 1) < 0.01
        assert density[inside].std() < 0.1
        assert density[X**2 + Y**2 > 1.2].sum() == 0
    # the map is honest about mass: the two disks hold every token
    cell = (2 / 24) ** 2
    total = (near.sum() + far.sum()) * 2 * cell / (4 * np.pi)
    assert abs(total - 1) < 1e-12


def test_the_view_faces_the_tokens_and_rotations_are_rotations():
    xs, _ = _trajectory(T=10, n=4)
    azimuth, elevation = facing(xs)
    center = xs.reshape(-1, 3).mean(0)
    depth = (_rotation(azimuth, elevation) @ (center / np.linalg.norm(center)))[2]
    assert depth > 0.99
    R = _rotation(37.0, -12.0)
    np.testing.assert_allclose(R @ R.T, np.eye(3), atol=1e-14)
    assert np.isclose(np.linalg.det(R), 1.0)
    # the elevation is the viewer's height: from above, the north pole is nearer
    assert (_rotation(0.0, 30.0) @ np.array([0, 0, 1.0]))[2] > 0


def test_misalignment_is_the_librarys_when_not_given(tmp_path, monkeypatch):
    import jaxattn._artifacts.animate as animate_module

    seen = {}
    real = animate_module.Scene.__init__

    def spy(self, xs, ts, E, *args, **kwargs):
        seen["E"] = E
        real(self, xs, ts, E, *args, **kwargs)

    monkeypatch.setattr(animate_module.Scene, "__init__", spy)
    xs, ts = _trajectory(T=8, n=4)
    ja.animate(xs, tmp_path / "e.gif", ts, progress=False, dpi=30)
    np.testing.assert_allclose(seen["E"], np.asarray(ja.misalignment(xs)), rtol=1e-12)


@pytest.mark.parametrize("bad, message", [
    (dict(path="movie.avi"), "must end in .mp4 or .gif"),
    (dict(xs=np.ones((5, 3))), "must be (T, n, d)"),
    (dict(xs=np.ones((5, 3, 1))), "d ≥ 2"),
    (dict(xs=np.full((5, 3, 3), np.nan)), "NaN"),
    (dict(ts=np.arange(4.0)), "one time per frame"),
    (dict(E=np.arange(3.0)), "one value per frame"),
    (dict(frames=0), "frames must be"),
    (dict(fps=0), "fps must be"),
    (dict(path="/nonexistent/folder/movie.mp4"), "is not a folder"),
    (dict(dpi=100_000), "dpi must be at most 1000"),
    (dict(path="movie.gif", fps=120), "a GIF plays at most 50 fps"),
    # these drew a movie: an empty sphere, an empty E panel, E "below resolution"
    (dict(spin=float("nan")), "spin must be a finite number"),
    (dict(ts=np.arange(5.0)[::-1]), "ts must be finite and nondecreasing"),
    (dict(E=-np.ones(5)), "E must be ≥ 0"),
    (dict(xs=np.ones((5, 3, 3)) + 0j), "must be real"),  # was cast, with NumPy's warning
    # a NaN elevation drew no token; 0 tokens as a density was read as the default
    (dict(elevation=float("nan")), "elevation must be a number of degrees in"),
    (dict(elevation=200), "elevation must be a number of degrees in"),
    (dict(density_above=-1), "density_above must be a whole number ≥ 0"),
])
def test_bad_input_is_refused_in_one_line(tmp_path, bad, message):
    xs, ts = _trajectory(T=5, n=3)
    args = dict(xs=xs, path=tmp_path / "movie.mp4", ts=ts) | bad
    if isinstance(args["path"], str) and not args["path"].startswith("/"):
        args["path"] = tmp_path / args["path"]
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ja.animate(args.pop("xs"), args.pop("path"), args.pop("ts"), progress=False, **args)
    assert not list(tmp_path.iterdir())  # nothing written


def test_an_mp4_at_a_dpi_matplotlib_truncates_holds_every_frame_whole(tmp_path):
    """At dpi 33 matplotlib draws 211 × 237 pixels (7.2 · 33 = 237.6, truncated): a
    size rounded to 238 rows gave ffmpeg short frames, 4 of 5 of them, shifted."""
    xs, ts = _trajectory(T=5, n=3)
    ja.animate(xs, tmp_path / "m.mp4", ts, dpi=33, frames=5, trail=0, progress=False)
    meta, frames = _mp4_frames(tmp_path / "m.mp4")
    assert len(frames) == 5
    top = [f[:12].astype(float) for f in frames]  # the title's band stays where it is
    assert max(np.abs(t - top[0]).mean() for t in top) < 2.0


def test_a_gif_plays_at_the_rate_its_frames_can_last():
    """A GIF's frames last whole hundredths of a second: the nearest rate is played
    (and `jaxattn animate` says so)."""
    from jaxattn._artifacts.animate import gif_fps

    assert [round(gif_fps(f), 2) for f in (10, 25, 30, 40, 45, 50)] == \
        [10.0, 25.0, 33.33, 33.33, 50.0, 50.0]


def test_the_misalignment_of_float64_tokens_is_float64_without_x64():
    """`E` not saved: computed in the tokens' precision (it was float32, so a float64
    run's E stopped at float32's resolution)."""
    import jax

    from jaxattn._artifacts.animate import trajectory_arrays

    xs, _ = _trajectory(T=30, n=4)
    xs = xs + (np.arange(30) * 1e-3)[:, None, None]  # off the sphere: no rounding to it
    with jax.enable_x64(False):
        _, _, E, dtype = trajectory_arrays(xs)
    with jax.enable_x64(True):
        want = np.asarray(ja.misalignment(xs))
    assert dtype == np.float64
    np.testing.assert_allclose(E, want, rtol=1e-13)


def test_a_saved_trajectory_that_diverges_is_drawn_up_to_its_first_nan_and_says_so():
    from jaxattn._artifacts.trajectories import pick

    xs, ts = _trajectory(T=8, n=3)
    xs[5, 1, 0] = np.nan
    track = pick({"ys": xs, "ts": ts})
    assert len(track.xs) == 5 and track.note.startswith("save 5 of 8")
    xs[5, 1, 0], ts[6:] = 0.0, np.inf  # an event stopped the run: no news
    track = pick({"ys": np.where(np.isfinite(ts)[:, None, None], xs, 0.0), "ts": ts})
    assert len(track.xs) == 6 and track.note == ""


def test_metastabilitys_energy_is_not_drawn_as_the_misalignment():
    """metastability saves its interaction energy as `E`: the movie draws E(t)."""
    track = load(RUNS / "metastability")
    assert track.E is None and track.experiment == "metastability"


def test_a_path_that_is_a_folder_is_refused_before_any_frame(tmp_path):
    xs, ts = _trajectory(T=5, n=3)
    (tmp_path / "movie.gif").mkdir()
    with pytest.raises(ValueError, match="movie.gif is a folder; name a file"):
        ja.animate(xs, tmp_path / "movie.gif", ts, progress=False)
    assert not list((tmp_path / "movie.gif").iterdir())


def test_an_mp4_without_imageio_ffmpeg_names_the_extra(tmp_path, monkeypatch, capsys):
    """`make run` installs no `movies` extra: an MP4 was a ModuleNotFoundError traceback."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "imageio_ffmpeg" else real(name, *a))
    xs, ts = _trajectory(T=5, n=3)
    with pytest.raises(ValueError, match=r"pip install imageio-ffmpeg \(jaxattn's `movies` "
                                         r"extra\), or write a .gif"):
        ja.animate(xs, tmp_path / "movie.mp4", ts, progress=False)
    assert not list(tmp_path.iterdir())
    ja.animate(xs, tmp_path / "movie.gif", ts, progress=False, dpi=30)  # a GIF needs no ffmpeg


@pytest.mark.parametrize("name", sorted(SAVES_TOKENS))
def test_every_saved_run_with_tokens_animates(name, tmp_path, capsys):
    """The command on each saved run whose experiment saves tokens: every trajectory
    it holds becomes a GIF with the requested frames."""
    from PIL import Image

    with np.load(RUNS / name / "data.npz") as f:
        names = trajectory_names({k: f[k] for k in f.files})
    assert names, f"{name}'s saved run holds no trajectory, but SAVES_TOKENS lists it"
    for which in names:
        out = tmp_path / f"{which}.gif"
        code = main(["animate", str(RUNS / name), "--which", which, "--out", str(out),
                     "--frames", "4", "--dpi", "30", "--no-progress"])
        assert code == 0, capsys.readouterr().err
        with Image.open(out) as im:
            assert im.n_frames == min(4, load(RUNS / name, which).xs.shape[0])


def test_runs_without_tokens_say_how_to_make_them():
    """Every saved run whose experiment is not in SAVES_TOKENS holds no tokens, and
    its refusal names a way to make a trajectory."""
    for folder in sorted(RUNS.iterdir()):
        config_file = folder / "config.json"
        if not (folder / "data.npz").is_file() or not config_file.is_file():
            continue
        name = json.loads(config_file.read_text()).get("experiment")
        if name in SAVES_TOKENS:
            continue
        with np.load(folder / "data.npz") as f:
            assert not trajectory_names({k: f[k] for k in f.files}), folder.name
        with pytest.raises(ValueError, match="ja.animate|jaxattn run thm41-sphere|--save-states"):
            load(folder)


def test_a_folder_being_written_or_interrupted_before_its_data_is_refused(tmp_path):
    """`load` (`jaxattn animate`, `jaxattn view`) refuses a folder a running command
    holds, and one whose run was interrupted before it saved data.npz."""
    from jaxattn._artifacts import folders

    out = tmp_path / "run"
    with folders.hold_folder(out, "run"):
        folders.start_run(out)
        with pytest.raises(folders.RunFolderError, match="is being written by a running"):
            load(out)
    with pytest.raises(folders.RunFolderError, match="interrupted before it saved data.npz"):
        load(out)


def test_the_encoder_starts_without_forking_this_process(tmp_path):
    """imageio-ffmpeg's `preexec_fn` forked the JAX process (and JAX warned of a
    deadlock) on every MP4: the encoder is spawned without one."""
    import warnings

    xs, ts = _trajectory(T=4, n=3)
    ja.misalignment(xs)  # JAX started: its threads and its fork warning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ja.animate(xs, tmp_path / "m.mp4", ts, progress=False, dpi=32)
    forks = [w for w in caught if "fork" in str(w.message)]
    assert not forks, forks[0].message
    assert "IMAGEIO_FFMPEG_NO_PREVENT_SIGINT" not in __import__("os").environ


def _first_frame(xs, ts=None, **kwargs):
    """The scene of `ja.animate` with its first frame drawn (its figure still open)."""
    from jaxattn._artifacts.animate import Scene, frame_unit, trajectory_arrays

    unit = frame_unit(ts, False)
    xs, ts, E, dtype = trajectory_arrays(xs, ts, kwargs.pop("E", None))
    scene = Scene(xs, ts, E, dtype, title=None, unit=unit, trail=8, spin=60.0,
                  elevation=None, dpi=30, density_above=kwargs.pop("density_above", None))
    frames = scene.frames(np.array([len(xs) - 1]), progress=False)
    next(frames)
    return scene, frames


def test_a_movie_without_times_counts_steps_and_E_stops_at_its_resolution():
    xs, _ = _trajectory(T=60, n=5)
    s = np.linspace(0.0, 40.0, 60)[:, None, None]
    xs = (np.eye(3)[2] + xs[:1] * np.exp(-s)).astype(np.float32)  # consensus in float32
    xs /= np.linalg.norm(xs, axis=-1, keepdims=True)
    scene, frames = _first_frame(xs)
    from jaxattn._artifacts.figures import resolution

    floor = resolution(np.float32)
    assert scene.fig.texts[0].get_text() == "5 tokens on S²"
    assert scene.label.get_text().startswith("step 59")
    assert f"E < {floor:.1e} (float32 resolution)" in scene.label.get_text()
    assert scene.ax_e.get_xlabel() == "step"
    curve = scene.ax_e.lines[0].get_ydata()
    drawn = curve[np.isfinite(curve)]
    assert drawn.size and np.all(drawn > floor) and np.isnan(curve[-1])
    assert scene.ax_e.get_ylim()[0] < floor  # the floor's dotted line is on the axis
    frames.close()


def test_many_tokens_on_the_circle_are_a_density_ring_with_the_order_parameter():
    rng = np.random.default_rng(3)
    angle = rng.vonmises(0.5, 2.0, size=(3, 2000))
    xs = np.stack([np.cos(angle), np.sin(angle)], -1)
    scene, frames = _first_frame(xs, np.arange(3.0))
    assert scene.mode == "ring" and not hasattr(scene, "trails")
    r = np.linalg.norm(xs[-1].mean(0))
    assert scene.order.get_text() == f"order parameter |mean x| = {r:.3f}"
    density = scene.ring.get_array()
    assert abs(density.sum() / scene.bins - 1) < 1e-12  # every token in one arc
    assert scene.fig.texts[0].get_text() == "2000 tokens on S¹"
    frames.close()
    few, frames = _first_frame(xs[:, :150], np.arange(3.0))
    assert few.mode == "circle"
    frames.close()


def test_a_gif_of_many_tokens_keeps_a_palette(tmp_path):
    from PIL import Image

    xs, ts = _trajectory(T=6, n=70)
    path = ja.animate(xs, tmp_path / "many.gif", ts, frames=3, dpi=30, progress=False)
    with Image.open(path) as im:
        assert im.n_frames == 3


def test_a_runs_layers_are_drawn_against_their_times():
    """`ys_layers` saves its times kτ beside it (1000 layers of τ = 0.01 to t = 10): the
    movie said "layer 3" at t = 3, layer 300; it is drawn against the times now. A loop's
    `states` at `depths` are layers, and a missing `ys_layers` says how to save it."""
    from jaxattn._artifacts.trajectories import pick

    xs = np.tile(np.eye(3)[None, :2], (11, 1, 1))
    data = {"ys": xs, "ts": np.linspace(0.0, 10.0, 11), "ys_layers": xs,
            "ts_layers": np.linspace(0.0, 10.0, 11)}
    assert not pick(data, "ys_layers").layers and not pick(data, "ys").layers
    loop = {"states": xs[None, :3], "depths": np.array([0, 12, 24])}
    assert pick(loop, "states").layers
    with pytest.raises(ValueError, match=r"no trajectory 'ys_layers' in data.npz; it has ys "
                                         r"\(the layers are saved by a run with --discrete\)"):
        pick({"ys": xs, "ts": data["ts"]}, "ys_layers")


def test_tokens_off_the_sphere_are_said_to_be_so():
    """Tokens on an ellipsoid are scaled into the unit ball: the note under the
    picture (movie and page) says they are off the sphere; unit tokens get none."""
    from jaxattn._artifacts.animate import unit_ball

    xs, _ = _trajectory(T=5, n=3)
    assert unit_ball(xs)[1] == ""
    _, note = unit_ball(xs * np.array([1.0, 2.0, 0.5]))
    assert note.startswith("tokens off the unit sphere")
