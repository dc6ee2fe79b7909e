"""The comparison of two programs' values (`_helpers.assert_same_values`): rounding in
units in the last place of the array's scale on every backend, never the bit; and the
tests that compare two programs pass on a CPU without AVX-512 (XLA told to stop at
AVX2, as on an AMD EPYC of that kind)."""

import os
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import assert_same_values, ulps_apart


def test_two_programs_may_differ_by_rounding_on_every_backend():
    x = np.linspace(-3.0, 5.0, 7)
    bumped = x.copy()
    bumped[2] += np.finfo(np.float64).eps * 5.0  # one ulp of the largest entry
    assert ulps_apart(bumped, x) == pytest.approx(1.0)
    assert_same_values(bumped, x)
    assert_same_values(np.float32(bumped), np.float32(x))


@pytest.mark.parametrize("change", ["far", "nan", "shape", "dtype"])
def test_a_real_difference_still_fails(change):
    x = np.linspace(-3.0, 5.0, 7)
    y = {"far": x + 1e-13, "nan": np.where(x > 4, np.nan, x), "shape": x[:6],
         "dtype": np.float32(x)}[change]
    with pytest.raises(AssertionError):
        assert_same_values(y, x)
    assert_same_values(jnp.asarray(x), x)  # a JAX array is compared as NumPy's


# The tests that compare two compiled programs' values (a solution=True run against the
# array run, checkpointed against plain scans, a by-pass observation against the loop).
AUDITED = [
    "tests/core/test_core_conventions.py::test_solve_flow_solution_and_event_stop_at_the_dense_crossing",
    "tests/core/test_core_options.py::test_sqrt_checkpointing_same_values_and_gradient",
    "tests/models/test_loop_protocol.py::test_observe_records_any_measure_by_pass",
]


@pytest.mark.slow  # ~40 s: a fresh process compiles every program for AVX2
def test_program_comparisons_pass_on_an_avx2_cpu():
    root = Path(__file__).resolve().parents[2]
    env = os.environ | {"XLA_FLAGS": "--xla_cpu_max_isa=AVX2", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p",
                          "no:cacheprovider", *AUDITED], cwd=root, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:]
