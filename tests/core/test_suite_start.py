"""The suite's start-up in every Python the tests start (`tests/_suite_start.py`): the
suite's XLA flags, added to the flags a test gives its child, and the compilation
cache for programs with host callbacks, installed once JAX is imported and not
before."""

import json
import os
import subprocess
import sys

import pytest
from _callback_cache import needed
from _suite_start import HOOK, TEST_XLA_FLAGS, with_flags
from test_callback_cache import _run

PROBE = ("import json, os, sys; print(json.dumps([os.environ.get('XLA_FLAGS', ''), "
         "'jax' in sys.modules, '_callback_cache' in sys.modules]))")


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
    flags, has_jax, has_cache = _probe(XLA_FLAGS="--xla_force_host_platform_device_count=4")
    assert flags.split() == ["--xla_force_host_platform_device_count=4", *TEST_XLA_FLAGS.split()]
    assert not has_jax and not has_cache  # the hook waits for `jax`
    flags, _, _ = _probe(XLA_FLAGS="--xla_backend_optimization_level=3")
    assert "--xla_backend_optimization_level=3" in flags.split()
    assert "--xla_backend_optimization_level=1" not in flags.split()
    assert _probe(XLA_FLAGS="--x=1", JAXATTN_TEST_XLA_FLAGS="")[0] == "--x=1"


@pytest.mark.skipif(not needed(), reason="this JAX caches programs with callbacks itself")
def test_the_processes_the_tests_start_share_the_cache(tmp_path):
    """Started with the suite's environment, a process installs the cache once JAX is
    imported, without being told: the second such process reads the program."""
    first, second = _run(tmp_path, "started"), _run(tmp_path, "started")
    assert first["hits"] == 0 and second["hits"] == 1
    assert second["value"] == first["value"]
    assert "x must be at least 0: take its absolute value" in second["error"]
