"""`jaxattn sweep --distributed` through `--launch-local`: two processes write the table
of one, byte for byte; a sweep killed on one process resumes on one process to the same
table; bad distributed flags are one line before any work; the sweep's figure and table
say what they show."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from _helpers import kill_one_worker, one_line, start_jaxattn
from matplotlib.collections import PolyCollection

import jaxattn as ja
from jaxattn.sweep import _report

SMALL = {"horizon": 2.0, "saves": 10, "tokens": 5}
GRID = {"beta": [0.5, 1.0]}


def _argv(out, *extra):
    args = ["sweep", "thm41-sphere", "--instances", "6", "--chunk", "3", "--out", str(out),
            "--no-progress", "--grid", "beta=0.5,1"]
    for k, v in SMALL.items():
        args += ["--set", f"{k}={v}"]
    return args + list(extra)


@pytest.fixture(scope="module")
def alone(tmp_path_factory):
    """The one-process sweep, in this process."""
    return ja.sweep("thm41-sphere", GRID, instances=6, chunk=3, set=SMALL,
                    out=tmp_path_factory.mktemp("alone") / "s", progress=False,
                    log=lambda *_: None)


@pytest.mark.slow  # two processes start, join and compile
def test_two_processes_write_the_table_of_one(tmp_path, alone):
    out = tmp_path / "two"
    proc = start_jaxattn(_argv(out, "--launch-local", "2"))
    stdout, stderr = proc.communicate(timeout=300)
    # 4: horizon 2 leaves every instance still converging (undecided, as `jaxattn run`)
    assert proc.returncode == 4, stderr[-3000:]
    assert "process 1 of 2: done" in stdout
    assert (out / "table.csv").read_bytes() == (alone.folder / "table.csv").read_bytes()
    sidecar = json.loads((out / "sweep.json").read_text())
    assert (sidecar["processes"], sidecar["devices"]) == (2, 4)


@pytest.mark.slow  # two processes, killed, then one
def test_killed_on_one_process_resumes_on_one_process(tmp_path, alone):
    out = tmp_path / "killed"
    proc = start_jaxattn(_argv(out, "--launch-local", "2"))
    chunks = out / "chunks"
    kill_one_worker(proc, lambda: chunks.exists() and any(chunks.glob("*.csv")))
    done = len(list(chunks.glob("*.csv")))
    assert (out / "INCOMPLETE").exists() and 1 <= done < 4

    resumed = start_jaxattn(_argv(out, "--resume"))
    stdout, stderr = resumed.communicate(timeout=300)
    assert resumed.returncode == 4, stderr[-3000:]  # every instance still converging
    assert f"{done} of 4 chunks done" in stdout + stderr
    assert (out / "table.csv").read_bytes() == (alone.folder / "table.csv").read_bytes()


@pytest.mark.slow  # two processes start
def test_a_terminated_launcher_stops_its_processes(tmp_path):
    """SIGTERM (`kill`, `timeout`, a scheduler) to `--launch-local`'s launcher stops
    the processes it started, as Ctrl-C does: they no longer run on alone."""
    import signal

    out = tmp_path / "term"
    proc = start_jaxattn(_argv(out, "--launch-local", "2"))
    deadline = time.monotonic() + 120
    while len(pids := subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                     text=True).stdout.split()) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    for pid in map(int, pids):
        with pytest.raises(ProcessLookupError):  # gone, and reaped by the launcher
            os.kill(pid, 0)


@pytest.mark.parametrize(("extra", "words"), [
    (["--distributed", "--devices", "2"], "drop --devices"),
    (["--launch-local", "2", "--devices", "2"], "drop --devices"),
    (["--coordinator", "localhost:1234"], "go with --distributed"),
    (["--distributed", "--num-processes", "2", "--process-id", "2"], "not below"),
    (["--distributed", "--coordinator", "nohost"], "HOST:PORT"),
    (["--launch-local", "0"], "--launch-local must be"),
    (["--launch-local", "1000"], "more processes than this machine has cores"),
    (["--launch-local", "2", "--distributed"], "itself; drop --distributed"),
    (["--launch-local", "2", "--process-id", "1"], "numbers its processes itself"),
])
def test_bad_distributed_flags_are_one_line(extra, words, tmp_path, capsys):
    out = tmp_path / "never"
    line = one_line(capsys, _argv(out, *extra))
    assert words in line, line
    assert not out.exists()


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
def test_an_unreachable_coordinator_is_one_line_after_its_timeout(tmp_path):
    """Process 1 of 2 with no process 0 to reach: refused when the timeout ends."""
    code = ("from jaxattn._process.distributed import DistributedError, initialize\n"
            "try:\n    initialize('localhost:9', 2, 1, timeout=3)\n"
            "except DistributedError as e:\n    print(e)\n")
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=os.environ | {"JAX_PLATFORMS": "cpu"})
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and "cannot reach the coordinator localhost:9" in lines[0], \
        done.stdout + done.stderr[-2000:]
    assert time.monotonic() - start < 100


@pytest.mark.slow  # two processes; the one left waits for gloo's 30 s
def test_mismatched_process_counts_are_one_line_each_and_no_folder(tmp_path):
    from jaxattn._process.distributed import free_port

    out, address = tmp_path / "never", f"localhost:{free_port()}"
    procs = [start_jaxattn(_argv(out, "--distributed", "--coordinator", address,
                            "--num-processes", str(count), "--process-id", str(k)))
             for k, count in ((0, 2), (1, 3))]
    errors = [p.communicate(timeout=200)[1] for p in procs]
    lines = [[line for line in e.splitlines() if not line.startswith("[Gloo]")] for e in errors]
    assert [p.returncode for p in procs] == [2, 2], errors
    assert len(lines[0]) == 1 and "another process stopped" in lines[0][0], errors[0]
    assert len(lines[1]) == 1 and "--num-processes 3, but 2 processes joined" in lines[1][0]
    assert not out.exists()


def test_the_sweep_table_and_figure_say_what_they_show(alone, monkeypatch):
    """The printed table's column is `instances`; the consensus-time axis starts at 0
    (a flat line is flat), its IQR is drawn as bars, and the dashed line is labelled."""
    keys = ["beta"]
    head = _report.format_table(alone.summary, keys).splitlines()[0].split()
    assert "instances" in head and "n" not in head
    figures = []
    monkeypatch.setattr(_report, "save_figure", lambda fig, stem, title: figures.append(fig))
    _report.write_figure(alone.folder, ja.sweep.SweepSpec("thm41-sphere", GRID, instances=6),
                         keys, alone.table)
    ax_t, ax_e = figures[0].axes
    assert ax_t.get_ylim()[0] == 0
    assert not [c for c in ax_t.collections if isinstance(c, PolyCollection)]  # no band
    texts = [t.get_text() for t in ax_e.texts]
    assert any("consensus tolerance 1e-4" in t for t in texts), texts
    assert np.isclose(ax_e.lines[0].get_ydata()[0], ja.metrics.CONSENSUS_TOL) or any(
        np.allclose(line.get_ydata(), ja.metrics.CONSENSUS_TOL) for line in ax_e.lines)
