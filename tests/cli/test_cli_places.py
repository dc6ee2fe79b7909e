"""Where `jaxattn demo` writes, an unfinished folder holding files no run writes, the
resume hint of an interrupted sweep or loop, and `jaxattn cache` on a user's folder."""

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _helpers import one_line

from jaxattn._artifacts import folders
from jaxattn._artifacts.folders import write_json
from jaxattn.cli import _resume_hint, main
from jaxattn.cli.demo import FIGURE

RUN = ["run", "thm41-sphere", "--no-progress"]


def _finished_run(folder):
    """A finished run's folder as `write_run` leaves it (no computing)."""
    folder.mkdir(parents=True)
    write_json(folder / "config.json", {"experiment": "thm41-sphere", "kind": "run",
                                        "run_id": "r"})
    write_json(folder / "summary.json", {"run_id": "r"})
    (folder / "thm41_sphere.png").write_bytes(b"png")
    return folder


def _files(folder) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_demo_does_not_write_into_another_commands_results(tmp_path, capsys):
    """It wrote demo_sphere.png into a finished run, inside one and into a sweep's
    folder (exit 0), where `run` and `sweep` refuse in one line."""
    run = _finished_run(tmp_path / "run")
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    write_json(unfinished / "config.json", {"experiment": "thm41-sphere"})
    (unfinished / "INCOMPLETE").write_text("")
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    write_json(sweep / "sweep.json", {"kind": "sweep", "run_id": "s"})
    before = {p: _files(p) for p in (run, unfinished, sweep)}
    for out, inside in ((run, ""), (run / "sub", "inside "), (unfinished, ""), (sweep, "")):
        line = one_line(capsys, ["demo", "--out", str(out)])
        assert line.endswith(f"--out {out} is {inside}the folder of another command's results "
                             f"({out if not inside else run}), which the demo does not write "
                             "into; choose another --out."), line
    assert {p: _files(p) for p in before} == before
    assert not (run / "sub").exists()


def test_demo_refuses_an_empty_out(tmp_path, capsys, monkeypatch):
    """`--out ""` wrote the figure into the current folder; `run` refuses it."""
    monkeypatch.chdir(tmp_path)
    assert one_line(capsys, ["demo", "--out", ""]).endswith(
        "--out is empty; name the folder for the figure (e.g. --out runs).")
    assert "--out is empty" in one_line(capsys, [*RUN, "--out", ""])
    assert list(tmp_path.iterdir()) == []


def test_an_unfinished_folder_holding_other_files_is_not_a_runs(tmp_path, capsys):
    """A folder marked INCOMPLETE was trusted whatever else it held: a run finished in
    one that held the demo's figure."""
    folder = tmp_path / "c6"
    folder.mkdir()
    (folder / "INCOMPLETE").write_text("")
    write_json(folder / "config.json", {"experiment": "thm41-sphere", "kind": "run",
                                        "run_id": "r"})
    (folder / "chunks").mkdir()  # what a run, loop or sweep writes stays its own
    for name in ("data.npz", "thm41_sphere.png", "thm41_sphere.pdf", "table.csv", ".lock",
                 ".data.npz.1a2b.tmp"):
        (folder / name).write_bytes(b"")
    assert folders.written_by_jaxattn(folder)
    for name in (FIGURE, "notes.md"):
        (folder / name).write_bytes(b"")
        assert not folders.written_by_jaxattn(folder)
        line = one_line(capsys, [*RUN, "--out", str(folder)])
        assert f"{folder} holds files jaxattn did not write" in line, line
        (folder / name).unlink()
    assert FIGURE in folders.NOT_IN_A_RUN  # the two names agree
    # only the marker (a run stopped before its settings): jaxattn's
    for p in folder.iterdir():
        p.rmdir() if p.is_dir() else p.unlink()
    (folder / "INCOMPLETE").write_text("")
    assert folders.written_by_jaxattn(folder)


@pytest.mark.slow  # warm: over ~3 s cold, a process (make test stays the fast loop)
def test_a_closed_pipe_still_gets_the_demos_figure(tmp_path):
    """`jaxattn demo | head -1`: the figure was written after the table, so a reader
    gone after one line left none (exit 141)."""
    out = tmp_path / "d"
    env = os.environ | {"MPLBACKEND": "Agg"}
    proc = subprocess.Popen([sys.executable, "-m", "jaxattn", "demo", "--tokens", "3",
                             "--horizon", "1", "--out", str(out)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # before it writes: its first line finds no reader
    stderr = proc.stderr.read()
    assert proc.wait(timeout=120) == 141 and "Traceback" not in stderr, stderr
    assert (out / FIGURE).stat().st_size > 0


def _interrupted_sweep(monkeypatch, save_chunk: bool):
    import jaxattn.sweep

    def interrupted(*args, out=None, **kwargs):
        if save_chunk:
            (Path(out) / "chunks").mkdir(parents=True)
            (Path(out) / "chunks" / "00000.csv").write_text("beta\n1\n")
        raise KeyboardInterrupt

    monkeypatch.setattr(jaxattn.sweep, "run", interrupted)


@pytest.mark.parametrize("saved", [True, False])
def test_an_interrupted_sweep_with_a_grid_says_how_to_go_on(tmp_path, monkeypatch, capsys,
                                                            saved):
    """`sweep --grid` values set `args.grid`, meant for `loop --grid`: no hint. And
    the hint came before a single chunk was saved."""
    _interrupted_sweep(monkeypatch, saved)
    assert main(["sweep", "thm41-sphere", "--grid", "beta=1,2", "--out",
                 str(tmp_path / "s")]) == 130
    line = capsys.readouterr().err.strip().splitlines()[-1]
    hint = "; its finished chunks are saved: the same command with --resume continues it"
    assert line == "jaxattn sweep: interrupted" + (hint if saved else ""), line


def test_the_resume_hint_needs_a_saved_chunk(tmp_path):
    """A loop or sweep interrupted before its first chunk has nothing to continue; a
    partial write (`.*.tmp`) is no chunk; `loop --grid` has no resume."""
    out = tmp_path / "l"

    def args(**kw):
        return argparse.Namespace(**({"command": "loop", "grid": False, "out": str(out),
                                      "resume": False} | kw))

    assert _resume_hint(args()) == ""
    (out / "chunks").mkdir(parents=True)
    (out / "chunks" / ".000000.npz.1a2b.tmp").write_bytes(b"")
    assert _resume_hint(args()) == ""
    (out / "chunks" / "000000.npz").write_bytes(b"")
    assert _resume_hint(args()).endswith("the same command with --resume continues it")
    assert _resume_hint(args(grid=True)) == ""
    assert _resume_hint(args(out=None)).endswith(  # its own folder: said as it started
        "with --out FOLDER (named as it started) --resume continues it")


def test_cache_info_says_a_users_folder_is_unusable(tmp_path, monkeypatch, capsys):
    """It said "0 entries, 0.0 MB" where every command refuses the folder."""
    (tmp_path / "thesis.tex").write_text("mine")
    monkeypatch.setenv("JAXATTN_CACHE_DIR", str(tmp_path))
    assert main(["cache"]) == 0
    assert capsys.readouterr().out == (
        f"compilation cache: {tmp_path}, unusable: it holds files that are not compilation "
        "cache entries (thesis.tex)\n")
