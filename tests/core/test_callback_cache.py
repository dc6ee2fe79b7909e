"""The test suite's persistent cache for programs with host callbacks
(`tests/_callback_cache.py`): a program with an `eqx.error_if` is written by one
process and read by the next, whose result is bit-equal and whose check still
raises its own message."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _callback_cache import needed

HERE = Path(__file__).resolve().parents[1]  # tests/, where _callback_cache.py is

SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import _callback_cache
    if sys.argv[2] == "patched":
        _callback_cache.install()  # (or, "started", by the tests' sitecustomize)
    import logging
    import equinox as eqx, jax, jax.numpy as jnp
    hits = []

    class Hits(logging.Handler):  # JAX logs each cache hit by the program's name
        def emit(self, record):
            message = record.getMessage()
            if "cache hit" in message and "'jit_checked'" in message:
                hits.append(message)

    log = logging.getLogger("jax._src.compiler")
    log.setLevel(logging.DEBUG)
    log.addHandler(Hits())

    @jax.jit
    def checked(x):
        x = eqx.error_if(x, x < 0, "x must be at least 0: take its absolute value")
        return jnp.cumsum(jnp.sin(x) * 3.0)

    out = {"value": checked(jnp.arange(5.0)).tolist()}
    try:
        checked(-jnp.arange(1.0, 6.0)).block_until_ready()
        out["error"] = None
    except Exception as e:
        out["error"] = str(e)
    out["hits"] = len(hits)
    print(json.dumps(out))
    """
)


def _run(cache: Path, how: str = "patched") -> dict:
    env = os.environ | {"JAX_COMPILATION_CACHE_DIR": str(cache),
                        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                        "JAX_PLATFORMS": "cpu",
                        "JAXATTN_TEST_CALLBACK_CACHE": "1" if how == "started" else "0"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(HERE), how], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not needed(), reason="this JAX caches programs with callbacks itself")
def test_a_cached_program_keeps_its_callbacks(tmp_path):
    """Written by one patched process, read by the next; a process without the patch
    (a `jaxattn` command a test starts) sharing the folder compiles its own (JAX
    would load the cached one without its callbacks, and crash on the first)."""
    first, second = _run(tmp_path), _run(tmp_path)
    assert first["hits"] == 0 and second["hits"] == 1  # written, then read
    plain = _run(tmp_path, "plain")
    assert plain["hits"] == 0
    for run in (first, second, plain):
        assert run["value"] == first["value"]
        assert "x must be at least 0: take its absolute value" in run["error"]
