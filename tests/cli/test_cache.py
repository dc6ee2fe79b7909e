"""The compilation cache: the `jaxattn` commands keep their compiled programs in a
folder (`JAXATTN_CACHE_DIR`, …), a second run loads them instead of compiling (counted
from JAX's own cache events), processes share the folder at once, a corrupt entry is
compiled again, `off` writes nothing, `jaxattn cache clear` empties only a cache."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import jaxattn as ja
from jaxattn._process.cache import CONVERTED, cache_dir, foreign
from jaxattn.cli import main

#: A `jaxattn` command in a fresh Python, counting JAX's cache events: programs looked
#: up in the cache (`requests`), loaded from it (`hits`), compiled and written
#: (`misses`), and compiled but refused by JAX for their host callbacks (`refused`,
#: from its log message: none once the library's programs hold no callbacks); and
#: jaxattn's programs kept whole and loaded without tracing (`loaded`, `kept_jit`).
_PROBE = """
import json, logging, sys
import jax

counts = dict(hits=0, misses=0, requests=0, refused=0, loaded=0)
names = {"/jax/compilation_cache/cache_hits": "hits",
         "/jax/compilation_cache/cache_misses": "misses",
         "/jax/compilation_cache/compile_requests_use_cache": "requests",
         "/jaxattn/programs/load_duration": "loaded"}

def count(event, *args, **kwargs):
    if event in names:
        counts[names[event]] += 1

class Refused(logging.Handler):
    def emit(self, record):
        counts["refused"] += "because it uses host callbacks" in record.getMessage()

jax.monitoring.register_event_listener(count)
jax.monitoring.register_event_duration_secs_listener(count)
log = logging.getLogger("jax._src.compiler")
log.setLevel(logging.DEBUG)
log.propagate = False
log.addHandler(Refused())
from jaxattn.cli import main
code = main(sys.argv[1:])
print("COUNTS", json.dumps(counts))
sys.exit(code)
"""
#: A cheap command: 5 tokens, a short flow (consensus by t = 2.7), few saves.
_RUN = ["run", "thm41-sphere", "--no-progress", "--tokens", "5", "--horizon", "3",
        "--saves", "10"]


def _start(cache: str | Path, out: Path, **env) -> subprocess.Popen:
    """`_RUN` into `out` in a fresh Python with the cache folder `cache`."""
    env = os.environ | {"JAXATTN_CACHE_DIR": str(cache), "JAX_PLATFORMS": "cpu"} | env
    return subprocess.Popen([sys.executable, "-c", _PROBE, *_RUN, "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)


def _finish(process: subprocess.Popen) -> tuple[dict, str]:
    """The event counts of a `_start`ed run and its stderr, once it succeeded."""
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, out[-2000:] + err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    return json.loads(out.rpartition("COUNTS ")[2].splitlines()[0]), err


def _data(folder: Path) -> dict:
    with np.load(folder / "data.npz") as data:
        return {name: data[name] for name in data.files}


def _same_results(a: Path, b: Path) -> None:
    """One program run twice: the same arrays, bit for bit, and the same numbers."""
    da, db = _data(a), _data(b)
    assert sorted(da) == sorted(db)
    for name in da:
        np.testing.assert_array_equal(da[name], db[name], err_msg=name)
    numbers = [json.loads((f / "summary.json").read_text())["numbers"] for f in (a, b)]
    assert numbers[0] == numbers[1]


def _entries(folder: Path) -> list[Path]:
    """JAX's own entries."""
    return sorted(p for p in folder.glob("*-cache") if not p.name.startswith("jaxattn_"))


def _kept(folder: Path) -> list[Path]:
    """jaxattn's programs kept whole (`_programs.kept_jit`)."""
    return sorted(folder.glob("jaxattn_program-*-cache"))


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    """A first run in a fresh cache folder: the folder, its run folder and counts."""
    root = tmp_path_factory.mktemp("cache")
    counts, _ = _finish(_start(root / "cache", root / "run"))
    return root / "cache", root / "run", counts


@pytest.mark.slow
def test_a_second_run_loads_what_the_first_compiled(first, tmp_path):
    cache, run, before = first
    assert before["misses"] > 0 and len(_entries(cache)) == before["misses"]
    assert before["loaded"] == 0 and len(_kept(cache)) > 0
    # the programs it took, in order: the next run loads them ahead (`loaded_ahead`)
    order = list(cache.glob("jaxattn_run-*-order"))
    assert len(order) == 1 and set(order[0].read_text().split()) == {
        p.name.split("-")[1] for p in _kept(cache)}
    entries = {p: p.stat().st_mtime_ns for p in cache.iterdir()}
    after, _ = _finish(_start(cache, tmp_path / "again"))
    assert after["misses"] == 0, after  # nothing compiled that JAX could keep
    # Loaded whole, neither traced nor lowered: the programs the first run called from
    # inside those (while tracing them) are not even asked for.
    assert after["loaded"] > 0, after
    assert {p: p.stat().st_mtime_ns for p in cache.glob("*-cache")} == {
        p: t for p, t in entries.items() if p.name.endswith("-cache")}  # nothing new
    # The library's programs hold no host callback: JAX keeps them all.
    assert before["refused"] == after["refused"] == 0, (before, after)
    assert after["requests"] == after["hits"], after
    _same_results(run, tmp_path / "again")


@pytest.mark.slow
def test_a_corrupt_entry_is_compiled_again(first, tmp_path):
    """In place: an entry's key holds the folder's path (JAX passes XLA's GPU autotune
    folder inside it in the compile options), so a copied folder would miss them all."""
    cache, run, _ = first
    truncated, garbage = _entries(cache)[:2]
    programs = _kept(cache)  # jaxattn's, all cut short: compiled again and replaced
    kept = {path: path.read_bytes() for path in (truncated, garbage, *programs)}
    try:
        truncated.write_bytes(kept[truncated][:100])
        garbage.write_bytes(os.urandom(len(kept[garbage])))
        for path in programs:
            path.write_bytes(kept[path][:100])
        counts, err = _finish(_start(cache, tmp_path / "run"))
        replaced = [p.read_bytes() != kept[p][:100] for p in programs]
    finally:
        for path, data in kept.items():
            path.write_bytes(data)
    assert counts["loaded"] == 0 and any(replaced), (counts, replaced)
    assert counts["misses"] == 2, counts  # the two compiled again, the others loaded
    assert counts["hits"] == counts["requests"] - counts["refused"] - 2, counts
    assert err.count("Error reading persistent compilation cache entry") == 2
    _same_results(run, tmp_path / "run")


@pytest.mark.slow
def test_two_processes_share_a_fresh_folder_at_once(first, tmp_path):
    both = [_start(tmp_path / "cache", tmp_path / f"run{i}") for i in range(2)]
    for i, process in enumerate(both):
        counts, _ = _finish(process)
        assert counts["hits"] + counts["misses"] + counts["refused"] == counts["requests"]
        _same_results(first[1], tmp_path / f"run{i}")
    assert len(_entries(tmp_path / "cache")) == len(_entries(first[0]))
    assert len(_kept(tmp_path / "cache")) == len(_kept(first[0]))


@pytest.mark.slow
def test_off_writes_nothing_and_computes_the_same(first, tmp_path):
    """`off` wins over JAX's own variable, and over the default folder."""
    jax_folder = tmp_path / "jax"
    counts, _ = _finish(_start("off", tmp_path / "run", JAX_COMPILATION_CACHE_DIR=str(jax_folder),
                               XDG_CACHE_HOME=str(tmp_path / "xdg")))
    assert counts["requests"] == 0
    assert not jax_folder.exists() and not (tmp_path / "xdg" / "jaxattn").exists()
    _same_results(first[1], tmp_path / "run")


def test_the_folder_rule(monkeypatch, tmp_path):
    for name in ("JAXATTN_CACHE_DIR", "JAX_COMPILATION_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "jaxattn"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "jaxattn"
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax"))
    assert cache_dir() == tmp_path / "jax"
    monkeypatch.setenv("JAXATTN_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
    assert cache_dir(tmp_path / "given") == tmp_path / "given"
    monkeypatch.setenv("JAXATTN_CACHE_DIR", "OFF")
    assert cache_dir() is None


def test_a_gguf_conversion_is_kept_in_the_cache_folder_and_not_when_it_is_off(
        monkeypatch, tmp_path):
    """`.gguf` tensors are converted once into the cache's folder by its rule, and into
    no folder (not one named `off`) when the cache is off."""
    from jaxattn.models import _gguf

    model = tmp_path / "model.Q4_1.gguf"
    model.write_bytes(b"gguf")
    monkeypatch.delenv("JAXATTN_CACHE_DIR", raising=False)
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax"))
    entry = _gguf.cache_file(model)
    assert entry.parent == tmp_path / "jax" and CONVERTED.fullmatch(entry.name)
    monkeypatch.setenv("JAXATTN_CACHE_DIR", "off")
    assert _gguf.cache_file(model) is None
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(_gguf, "convert", lambda path, check: ({"model_type": "llama"}, {}))
    assert _gguf.converted(model, print, lambda *made: made) == ({"model_type": "llama"}, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.Q4_1.gguf"]


def test_enable_cache_refuses_a_folder_it_cannot_use(tmp_path):
    (tmp_path / "file").write_text("mine")
    with pytest.raises(ValueError, match=r"file is not a folder; choose another folder "
                                         r"\(JAXATTN_CACHE_DIR=DIR\) or turn the cache off"):
        ja.enable_cache(tmp_path / "file" / "cache")
    with pytest.raises(TypeError, match="`path` must be a folder"):
        ja.enable_cache(3)
    assert (tmp_path / "file").read_text() == "mine"


@pytest.mark.parametrize("action", ["info", "clear"])
def test_the_cache_command_refuses_a_file_as_its_folder(tmp_path, monkeypatch, capsys, action):
    """`jaxattn cache` and `cache clear` said "0 entries" of a file named as the cache
    folder; they refuse it as every other command does, and leave it alone."""
    from _helpers import one_line

    (tmp_path / "file").write_text("mine")
    monkeypatch.setenv("JAXATTN_CACHE_DIR", str(tmp_path / "file"))
    assert "file is not a folder; choose another folder" in one_line(capsys, ["cache", action])
    assert (tmp_path / "file").read_text() == "mine"


def _cache_command(capsys, *words) -> tuple[int, str, str]:
    code = main(["cache", *words])
    out, err = capsys.readouterr()
    return code, out, err


#: A name as JAX writes its entries: the program's name, then the key's 64 hex digits.
JIT = f"jit_f-{'0a' * 32}"


def test_cache_info_and_clear(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("JAXATTN_CACHE_DIR", str(tmp_path))
    (tmp_path / f"{JIT}-cache").write_bytes(b"x" * 3000)
    (tmp_path / f"{JIT}-atime").write_bytes(b"t" * 8)
    (tmp_path / "xla_gpu_per_fusion_autotune_cache_dir").mkdir()
    (tmp_path / "xla_gpu_per_fusion_autotune_cache_dir" / f"{'Ab_-' * 10}Ab0.textproto"
     ).write_bytes(b"y" * 1000)
    # a .gguf file's tensors, converted once (`models._gguf.cache_file`)
    (tmp_path / f"model.Q4_1-jaxattn-gguf-2-{'0a' * 16}.npz").write_bytes(b"w" * 100)
    for words in ([], ["info"]):
        assert _cache_command(capsys, *words)[:2] == (
            0, f"compilation cache: {tmp_path}, 1 entries, 0.0 MB (of which 1 converted "
               ".gguf model, 0.0 MB)\n")
    code, out, _ = _cache_command(capsys, "clear")
    assert (code, out) == (0, f"cleared {tmp_path}: 1 entries, 0.0 MB\n")
    assert list(tmp_path.iterdir()) == []


def test_cache_clear_refuses_a_folder_with_other_files(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("JAXATTN_CACHE_DIR", str(tmp_path))
    (tmp_path / f"{JIT}-cache").write_bytes(b"x")
    (tmp_path / "thesis.tex").write_text("mine")
    code, out, err = _cache_command(capsys, "clear")
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert "holds files that are not compilation cache entries (thesis.tex); nothing " \
           "deleted: is JAXATTN_CACHE_DIR the folder you meant?" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{JIT}-cache", "thesis.tex"]


@pytest.mark.parametrize("name", ["2026-11-purchase-order", "work-order", "my-cache",
                                  "trip-atime", "not-traced", "xla_gpu_kernel_cache_file",
                                  "xla_gpu_per_fusion_autotune_cache_dir", ".my.notes123.tmp",
                                  f"jit_f-{'0a' * 32}-cache.bak"])
def test_a_user_file_named_like_an_entry_is_not_one(capsys, monkeypatch, tmp_path, name):
    """Entries are told by their whole names (and XLA's folder by what it holds): a
    user's file whose name ends as theirs is neither deleted nor proof of a cache."""
    monkeypatch.setenv("JAXATTN_CACHE_DIR", str(tmp_path))
    mine = tmp_path / name
    if name.startswith("xla_"):  # a user's folder of that name, with notes in it
        mine.mkdir()
        (mine / "notes.txt").write_text("mine")
    else:
        mine.write_text("mine")
    if not name.startswith("."):  # (a hidden file is not shown: `foreign`)
        assert foreign(tmp_path) == (
            f"it holds files that are not compilation cache entries ({name})")
    (tmp_path / f"{JIT}-cache").write_bytes(b"x")
    code, out, err = _cache_command(capsys, "clear")
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert f"not compilation cache entries ({name}); nothing deleted" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"{JIT}-cache", name])
    assert mine.is_file() or (mine / "notes.txt").read_text() == "mine"


def test_clear_removes_what_a_process_killed_while_writing_left(capsys, monkeypatch, tmp_path):
    """`_files.atomic_write`'s temporary file of an entry (the process killed before
    its rename) is the cache's own: cleared, and not counted as an entry."""
    monkeypatch.setenv("JAXATTN_CACHE_DIR", str(tmp_path))
    key = "5f" * 32
    for name in (f"jaxattn_program-{key}-cache", f".jaxattn_program-{key}-cache.a_b9xy0z.tmp",
                 f".jaxattn_run-{key}-order.k2m4_q8w.tmp"):
        (tmp_path / name).write_bytes(b"x" * 100)
    assert _cache_command(capsys, "info")[:2] == (
        0, f"compilation cache: {tmp_path}, 1 entries, 0.0 MB\n")
    assert _cache_command(capsys, "clear")[:2] == (0, f"cleared {tmp_path}: 1 entries, 0.0 MB\n")
    assert list(tmp_path.iterdir()) == []


def test_cache_off(capsys, monkeypatch):
    monkeypatch.setenv("JAXATTN_CACHE_DIR", "off")
    for words in ([], ["clear"]):
        assert _cache_command(capsys, *words)[:2] == (
            0, "compilation cache: off (JAXATTN_CACHE_DIR=off)\n")


def test_a_command_refuses_a_cache_folder_it_cannot_use(capsys, monkeypatch, tmp_path):
    """Before any work: one line, and no run folder made."""
    (tmp_path / "file").write_text("mine")
    monkeypatch.setenv("JAXATTN_CACHE_DIR", str(tmp_path / "file"))
    assert main(["run", "thm41-sphere", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"jaxattn run: error: cannot use {tmp_path / 'file'} for the "
                          "compilation cache") and "(JAXATTN_CACHE_DIR=off)" in err
    assert not (tmp_path / "run").exists()


def test_a_command_refuses_a_cache_folder_holding_a_users_files(capsys, monkeypatch, tmp_path):
    """A mistaken JAXATTN_CACHE_DIR: a run filled the user's folder with 17 programs,
    which `jaxattn cache clear` then refused to remove."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "important.txt").write_text("x")
    monkeypatch.setenv("JAXATTN_CACHE_DIR", str(folder))
    assert main(["run", "thm41-sphere", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "holds files that are not compilation cache entries (important.txt)" in err, err
    assert sorted(p.name for p in folder.iterdir()) == ["important.txt"]
    assert not (tmp_path / "run").exists()


def test_a_command_loads_ahead_by_its_arguments_less_where_it_writes(monkeypatch):
    """`jaxattn run`, `sweep` and `loop` load ahead the programs of their last run with
    the same arguments: `--out` and `--no-progress` do not count, any other does; a
    distributed run loads nothing ahead."""
    import argparse
    import contextlib

    from jaxattn import _programs
    from jaxattn.cli._common import loaded_ahead

    tags = []
    monkeypatch.setattr(_programs, "loaded_ahead",
                        lambda tag: tags.append(tag) or contextlib.nullcontext())

    def args(**kw):
        return argparse.Namespace(**{"name": "thm41-sphere", "seed": 0, "out": "a",
                                     "no_progress": False, "func": print, **kw})

    for a in (args(), args(out="b", no_progress=True), args(seed=1)):
        with loaded_ahead("sweep", a):
            pass
    with loaded_ahead("loop", args()), loaded_ahead("sweep", args(), distributed=True):
        pass
    assert tags[0] == tags[1] and len(set(tags)) == 3 and len(tags) == 4
