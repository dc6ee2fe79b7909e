"""The mean-field case MF: one layer and its gradient against their floors."""

import dataclasses
import json

import jax
import pytest

from jaxattn.bench import suite, table
from jaxattn.cli import main


@pytest.fixture
def tiny_mf(monkeypatch):
    """`--quick` runs MF at n = 2,000 (blocked: one float32 head's n² weights pass
    `DENSE_LIMIT`) with a small exp array, to keep the test fast."""
    quick = suite.PRESETS["quick"]
    prob = dataclasses.replace(quick.problems["meanfield"], n=2000)
    monkeypatch.setitem(quick.problems, "meanfield", prob)
    monkeypatch.setitem(suite.PRESETS, "quick", dataclasses.replace(quick, copy_bytes=2**20))
    return prob


def test_mf_case_runs_and_reports_its_floor(tiny_mf, tmp_path, capsys):
    out = tmp_path / "bench.json"
    with jax.enable_x64(False):
        code = main(["bench", "--quick", "--repeats", "1", "--cases", "MF", "--no-torch",
                     "--out", str(out)])
    assert code == 0
    forward, gradient = json.loads(out.read_text())["rows"]
    for row, grad in ((forward, False), (gradient, True)):
        assert row["case"] == "MF" and row["n"] == tiny_mf.n and row["blocked"]
        assert row["median_s"] > 0 and row["memory_bytes"] > 0
        assert "temp + argument + output" in row["memory_source"]
        assert row["exp_elements"] == 2**20 // 4
        madds, exps = suite.pair_work(3, grad)
        assert (row["madds_per_pair"], row["exps_per_pair"]) == (madds, exps)
        pairs = tiny_mf.n**2
        assert row["floor_matmul_s"] == pytest.approx(
            2 * madds * pairs / (row["matmul_peak_gflops"] * 1e9))
        assert row["exp_per_s"] == max(row["exp_stream_per_s"], row["exp_cached_per_s"])
        assert row["floor_exp_s"] == pytest.approx(exps * pairs / row["exp_per_s"])
        assert row["floor_s"] == max(row["floor_matmul_s"], row["floor_exp_s"])
        assert row["ratio_to_floor"] == pytest.approx(row["median_s"] / row["floor_s"])
    assert gradient["gradient_over_forward"] == pytest.approx(
        gradient["median_s"] / forward["median_s"])
    text = capsys.readouterr().out
    assert text.count("  floor ") == 2 and "grad/fwd" in text and "jnp.exp" in text


def test_pair_floor_is_the_larger_of_its_two_floors():
    exp_bound = suite.pair_floor(1e6, 3, False, peak_gflops=1e6, exps_per_s=1e6)
    assert exp_bound["floor_s"] == exp_bound["floor_exp_s"] == 1.0
    flop_bound = suite.pair_floor(1e6, 3, True, peak_gflops=1e-3, exps_per_s=1e12)
    assert flop_bound["floor_s"] == flop_bound["floor_matmul_s"] == pytest.approx(42.0)
    row = {"case": "MF", "variant": "one layer", "library": "jaxattn", "median_s": 2.0,
           "min_s": 2.0, "max_s": 2.0, "calls": 1, "token_steps_per_s": 1.0, "gflops": None,
           "fraction_of_peak": None, "compile_s": None, "memory_bytes": 10**6,
           "ratio_to_floor": 2.0, **exp_bound}
    assert "floor 1 s" in table._line(row) and "×2.00" in table._line(row)


def test_mf_is_a_case_of_the_cli():
    assert "MF" in suite.ALL_CASES
    from jaxattn.cli.bench import ALL_CASES, CASES
    assert "MF" in ALL_CASES
    assert CASES == suite.CASES and CASES["meanfield"] == "MF"


def test_cases_are_taken_by_name_or_label():
    """`--cases` and `run_suite(cases=)` take a case's name or its short label."""
    assert suite.case_names(["MF", "meanfield", "S1L", "peak"]) == (
        "meanfield", "meanfield", "small_systems_large_batch", "peak")
    with pytest.raises(ValueError, match="unknown case"):
        suite.case_names(["S9"])


def test_the_header_says_where_the_matmul_peak_came_from():
    """Without the `peak` case the header said "not measured" above an MF floors line
    that reports the peak it measured: it now says the floors measured JAX's alone."""
    from jaxattn.bench import table

    mf = {"rows": [{"exp_per_s": 1e9}]}
    assert table.header(mf)[-1] == ("matmul peaks: case `peak` not run (the MF floors "
                                    "below measure JAX's alone)")
    assert table.header({"rows": []})[-1] == "matmul peaks: case `peak` not run"
