"""The suite's start-up in every Python the tests start (`tests/_suite_start.py`): the
suite's XLA flags, added to the flags a test gives its child, no JAX imported by the
hook, and the compilation cache shared with them (the library's programs hold no host
callback, so JAX's own cache keeps them)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from _suite_start import HOOK, TEST_XLA_FLAGS, with_flags

PROBE = ("import json, os, sys; print(json.dumps([os.environ.get('XLA_FLAGS', ''), "
         "'jax' in sys.modules]))")

#: A started process runs one `ja.run_layers` and one refused run; JAX's own events
#: count the programs it read from the cache and those it did not find there.
SCRIPT = textwrap.dedent(
    """
    import json
    import jax, jax.numpy as jnp
    from jax import monitoring
    import jaxattn as ja
    counts = {"hits": 0, "misses": 0}
    EVENTS = {"/jax/compilation_cache/cache_hits": "hits",
              "/jax/compilation_cache/cache_misses": "misses"}
    def count(event, **kw):
        if event in EVENTS:
            counts[EVENTS[event]] += 1
    monitoring.register_event_listener(count)
    x = ja.sample_ellipsoid(jax.random.PRNGKey(0), 5, 3)
    dyn = ja.random_dynamics(jax.random.PRNGKey(1), 1, 3, beta=2.0)
    out = {"value": ja.run_layers(dyn, x, 4, 0.1).tolist()}
    try:
        ja.run_layers(dyn, x.at[0, 0].set(jnp.nan), 4, 0.1)
        out["error"] = None
    except ValueError as e:
        out["error"] = str(e)
    print(json.dumps(out | counts))
    """
)


def _run(cache) -> dict:
    env = os.environ | {"JAX_COMPILATION_CACHE_DIR": str(cache),
                        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                        "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _probe(**env) -> list:
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          timeout=60, env=os.environ | env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_a_flag_given_keeps_its_value():
    assert with_flags("--a=1 --b", "--a=2 --c=3") == "--a=1 --b --c=3"
    assert with_flags("", "") == ""


def test_a_child_gets_the_suites_flags_beside_its_own_and_no_jax():
    assert str(HOOK) in os.environ["PYTHONPATH"].split(os.pathsep)
    flags, has_jax = _probe(XLA_FLAGS="--xla_force_host_platform_device_count=4")
    assert flags.split() == ["--xla_force_host_platform_device_count=4", *TEST_XLA_FLAGS.split()]
    assert not has_jax  # the hook imports no JAX
    flags, _ = _probe(XLA_FLAGS="--xla_backend_optimization_level=3")
    assert "--xla_backend_optimization_level=3" in flags.split()
    assert "--xla_backend_optimization_level=1" not in flags.split()
    assert _probe(XLA_FLAGS="--x=1", JAXATTN_TEST_XLA_FLAGS="")[0] == "--x=1"


@pytest.mark.slow  # warm: over ~3 s (make test stays the fast loop)
def test_the_processes_the_tests_start_share_the_cache(tmp_path):
    """A library program compiled by one started process is read by the next from
    JAX's own cache, with no patch: the same bits, and the same refusal message (its
    check runs on the host, so the program holds no callback)."""
    first, second = _run(tmp_path), _run(tmp_path)
    assert first["misses"] >= 1 and second["hits"] >= first["misses"]
    assert second["misses"] == 0, second  # every program read, none compiled again
    assert second["value"] == first["value"]
    assert first["error"] and second["error"] == first["error"]
    assert "NaN" in second["error"] or "nan" in second["error"].lower(), second["error"]
