"""Shared test set-up: float64 by default (tests that check float32 behaviour wrap
themselves in `jax.enable_x64(False)`), strict rank promotion, a seeded key."""

import gc
import os
import sys
from pathlib import Path

# A full collection per 1,000 younger ones, not 10: each walks JAX's caches of every
# program the worker traced, 46 s of the fast tier's CPU at Python's default
# (BENCHMARKS.md, "The collector at start-up").
gc.set_threshold(*gc.get_threshold()[:2], 1000)

# The tests mirror the package in folders; their shared helpers (`_helpers.py`, …) live
# here, importable from every folder.
sys.path.insert(0, str(Path(__file__).resolve().parent))

os.environ.setdefault("MPLBACKEND", "Agg")
# JAX's persistent compilation cache, shared by both pytest workers and by the
# `jaxattn` subprocesses the tests start (they inherit these variables): a second
# `make test` reuses the programs the first compiled. Every program is kept: most of
# the suite's compile time is in programs under 0.3 s (BENCHMARKS.md, the test suite).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      str(Path(__file__).resolve().parent.parent / ".pytest_cache" / "jax"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

from _suite_start import start  # noqa: E402  (imports no JAX)

from jaxattn._process.determinism import deterministic_xla_flags  # noqa: E402  (does not start a backend)

# The suite's XLA flags (compiled for compile time), in every Python the tests start
# (`jaxattn` commands, documentation pages, notebook kernels, 4-device scripts):
# _suite_start.py.
start()
# The same deterministic XLA flags as the `jaxattn` commands, set before any
# computation, so that on a GPU in-process results equal the CLI's bit for bit.
os.environ["XLA_FLAGS"] = deterministic_xla_flags()

import jax  # noqa: E402
import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# The same examples on every run (`HYPOTHESIS_PROFILE=explore` draws new ones).
settings.register_profile("derandomized", derandomize=True, deadline=None)
settings.register_profile("explore", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "derandomized"))

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")

from jaxattn import _programs  # noqa: E402

# Programs kept whole (`_programs.kept_jit`) are loaded without tracing: tests that
# patch the library's internals must trace them. tests/core/test_programs.py turns
# them on.
_programs.ENABLED = False


@pytest.fixture
def seed(request) -> int:
    """A per-test seed, printed so a failure can be replayed."""
    value = int(os.environ.get("JAXATTN_TEST_SEED", "1234"))
    print(f"{request.node.name}: seed {value}")
    return value


@pytest.fixture
def key(seed):
    return jax.random.PRNGKey(seed)


@pytest.fixture
def compiles():
    """A counter of the programs XLA compiles (or loads from a cache) while it is held."""
    count = [0]

    def listen(event, seconds, **kwargs):
        count[0] += event == "/jax/core/compile/backend_compile_duration"

    jax.monitoring.register_event_duration_secs_listener(listen)
    yield count
    jax.monitoring.unregister_event_duration_listener(listen)


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A fresh cache folder with kept programs on (`_programs.kept_jit`), none of this
    process remembered: what a new process with that folder sees."""
    from jax.experimental.compilation_cache import compilation_cache

    monkeypatch.setattr(_programs, "ENABLED", True)
    monkeypatch.setattr(_programs, "_LOADED", {})
    before = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", str(tmp_path))
    compilation_cache.reset_cache()
    yield tmp_path
    jax.config.update("jax_compilation_cache_dir", before)
    compilation_cache.reset_cache()


@pytest.fixture
def traced():
    """The names of the functions JAX traces while the test runs (from JAX's
    monitoring events): a program loaded whole is not among them."""
    names = []

    def listen(event, seconds, **kwargs):
        if event == "/jax/core/compile/jaxpr_trace_duration":
            names.append(kwargs.get("fun_name"))

    jax.monitoring.register_event_duration_secs_listener(listen)
    yield names
    jax.monitoring.unregister_event_duration_listener(listen)
