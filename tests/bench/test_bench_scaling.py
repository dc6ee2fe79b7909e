"""`jaxattn bench --scaling` runs its four sweeps at quick sizes and writes the JSON and
the figure (no timing assertions beyond signs)."""

import json
import math

import pytest

from jaxattn.bench import scaling as bench_scaling
from jaxattn.cli import main


@pytest.fixture(scope="module")
def scaling(tmp_path_factory):
    folder = tmp_path_factory.mktemp("scaling")
    code = main(["bench", "--scaling", "--quick", "--repeats", "3",
                 "--out", str(folder / "bench.json")])
    assert code == 0
    return folder


@pytest.mark.slow  # a scaling sweep; the CLI test covers the wiring
def test_writes_json_and_figure_only(scaling):
    names = {p.name for p in scaling.iterdir()}
    assert {"scaling.json", "scaling.png", "scaling.pdf"} <= names
    assert "bench.json" not in names  # --scaling alone skips the cases
    assert (scaling / "scaling.png").stat().st_size > 10_000


@pytest.mark.slow
def test_json_structure_and_times(scaling):
    result = json.loads((scaling / "scaling.json").read_text())
    assert set(result["sweeps"]) == {"n", "d", "batch", "devices"}
    assert result["meta"]["quick"] and result["meta"]["cores"] >= 1
    for name, s in result["sweeps"].items():
        sizes = bench_scaling.QUICK_SIZES[name]
        assert s["sizes"] == list(sizes)
        for key in ("median_s", "min_s", "max_s", "compile_s", "gflops"):
            assert len(s[key]) == len(sizes), (name, key)
            assert all(math.isfinite(v) and v > 0 for v in s[key]), (name, key, s[key])
        assert all(lo <= med <= hi for lo, med, hi in zip(s["min_s"], s["median_s"], s["max_s"]))
        assert math.isfinite(s["fitted_slope"])
        assert len(s["ideal"]["curve_s"]) == len(sizes)
        assert name not in s["fixed"]
    # A 1024-fold batch costs more than one sequence, whatever the machine's load.
    assert result["sweeps"]["batch"]["fitted_slope"] > 0


@pytest.mark.slow
def test_ideal_slopes_follow_the_flop_count(scaling):
    sweeps = json.loads((scaling / "scaling.json").read_text())["sweeps"]
    for name in ("n", "d"):
        lo, hi = sweeps[name]["ideal"]["local_slope"]
        assert 1 < lo < sweeps[name]["ideal"]["slope"] < hi < 2, name
    assert sweeps["batch"]["ideal"]["slope"] == 1
    devices = sweeps["devices"]["ideal"]
    assert devices["slope"] == -1 and devices["curve_s"][0] == sweeps["devices"]["median_s"][0]
    assert f"beyond {devices['cores']} devices" in devices["note"]


def test_flop_local_slope_matches_finite_difference():
    setup = bench_scaling.SETUP
    for name, v in (("n", 100), ("d", 40)):
        ideal = bench_scaling.ideal(name, [v, v * 1.0001], [1.0, 1.0], setup, 2)
        assert ideal["slope"] == pytest.approx(ideal["local_slope"][0], rel=1e-3), name


@pytest.mark.parametrize("repeats", [0, 2.5, True])
def test_run_scaling_refuses_a_bad_repeats_before_any_work(repeats):
    with pytest.raises(ValueError, match="`repeats` must be a whole number ≥ 1"):
        bench_scaling.run_scaling(quick=True, repeats=repeats, progress=None)
