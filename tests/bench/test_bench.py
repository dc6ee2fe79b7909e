"""The benchmark suite runs and counts flops correctly (no timing assertions)."""

import json
import re

import jax
import jax.numpy as jnp
import pytest

from jaxattn.bench import suite, table
from jaxattn.cli import main


@pytest.mark.parametrize("k", [None, 6])
def test_flop_formula_matches_xla_cost_analysis(k):
    """The formula against XLA's flop count *on the CPU backend*, whatever the default
    backend is: XLA's GPU cost analysis counts fused products differently (137,519
    flops where the formula and the CPU count 184,320), so only the CPU's count is
    an independent check of the formula."""
    prob = suite.Problem(n=24, d=16, h=3, batch=1, causal=False, k=k)
    arrays = prob.arrays()
    cpu = jax.devices("cpu")[0]
    with jax.enable_x64(False), jax.default_device(cpu):
        dyn = jax.device_put(prob.dynamics(arrays), cpu)
        x = jax.device_put(jnp.asarray(arrays["x0"][0]), cpu)
        lowered = jax.jit(lambda dyn, x: dyn.raw_update(0.0, x)).lower(dyn, x)
        cost = lowered.compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    formula = suite.flops_raw_update(24, 16, 3, k)
    print(f"formula {formula}, XLA {cost['flops']}")
    # The formula counts the matrix products only; XLA adds softmax and sums.
    assert formula <= cost["flops"] <= 1.25 * formula


@pytest.mark.slow
def test_bench_cli_quick(tmp_path, capsys):
    out = tmp_path / "bench.json"
    with jax.enable_x64(False):
        code = main(["bench", "--quick", "--repeats", "1", "--cases", "S1", "S2", "--no-torch",
                     "--out", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    cases = {(r["case"], r["variant"]) for r in result["rows"]}
    assert ("S2", "10 layers") in cases and any(c == "S1" for c, _ in cases)
    assert all(r["median_s"] > 0 for r in result["rows"])
    meta = result["meta"]
    assert meta["size"] == "quick" and meta["precision"] == "float32"
    assert meta["device_kind"] == jax.devices()[0].device_kind
    assert meta["platform"] == jax.devices()[0].platform
    assert all(r["precision"] == "float32" for r in result["rows"])
    out = capsys.readouterr().out
    assert "median s" in out and f"device: {meta['device_label']}" in out


def test_a_figure_leaves_out_the_first_call(monkeypatch):
    """The first call (a program's first execution, ~10× a later one) is untimed; it
    is the figure only where the budget allows no other call."""
    from jaxattn.bench import timing

    clock = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])

    def calls(*seconds):
        left = list(seconds)

        def fn():
            clock[0] += left.pop(0)
            return len(left)
        return fn

    figure, out = timing.Timing.run(calls(10.0, 1.0, 2.0, 3.0), repeats=3)
    assert (figure.median, figure.min, figure.max, figure.calls, out) == (2.0, 1.0, 3.0, 3, 0)
    # a budget of 8 s: 4 + 3 spent, a third call at the mean (3.5) would pass it
    figure, _ = timing.Timing.run(calls(4.0, 3.0, 1.0), repeats=3, budget_s=8.0)
    assert (figure.median, figure.calls) == (3.0, 1)
    figure, _ = timing.Timing.run(calls(10.0), repeats=3, budget_s=12.0)  # no room: the first
    assert (figure.median, figure.calls) == (10.0, 1)


def test_percent_of_peak_uses_the_precision_of_the_row():
    """`%peak` divides by the peak of the precision the row ran at; no peak (TF32 on
    a CPU: not applicable) gives no `%peak`, and the table says so."""
    peaks = {"float32": {"jax": 100.0, "best": 100.0}, "tensorfloat32": None,
             "bfloat16": {"jax": 400.0, "best": 400.0}}
    timing = suite.Timing(1.0, 1.0, 1.0)
    fractions = {}
    for precision in ("float32", "tensorfloat32", "bfloat16"):
        ctx = suite.Context(suite.Repeats(1), precision, peaks)
        row = ctx.row("S2", "1 layer", "jaxattn", timing, token_steps=1, flops=50e9)
        assert row["precision"] == precision
        fractions[precision] = row["fraction_of_peak"]
    assert fractions == {"float32": 0.5, "tensorfloat32": None, "bfloat16": 0.125}
    result = {"peak_gflops": peaks, "bandwidth": {"bytes": 2**20, "jax": 12.5}, "rows": [],
              "meta": {"device_label": "cpu (2 cores)", "peak_size": 512}}
    text = table.format_table(result)
    assert "tensorfloat32 not applicable" in text and "jax 12.5" in text
    assert "device: cpu (2 cores)" in text


def test_bench_cli_rejects_quick_with_another_size(capsys):
    assert main(["bench", "--quick", "--size", "large"]) == 2
    assert "--quick and --size large" in capsys.readouterr().err


def test_bench_cli_rejects_unknown_case(capsys):
    assert main(["bench", "--cases", "S9"]) == 2
    assert "unknown case" in capsys.readouterr().err


@pytest.mark.parametrize("argv, words", [
    # each ran, ignoring the flag or (S4) timing nothing, and exited 0
    (["--cases", "S4", "--no-torch"], "needs torch: drop --no-torch or S4"),
    (["--scaling", "--precision", "bfloat16"], "--precision applies to the cases"),
    (["--scaling", "--budget", "1"], "--budget applies to the cases"),
    (["--scaling", "--size", "large"], "--size large applies to the cases"),
])
def test_bench_cli_refuses_flags_it_would_ignore(tmp_path, capsys, argv, words):
    out = tmp_path / "b.json"
    assert main(["bench", *argv, "--out", str(out)]) == 2
    assert words in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize("kwargs, words", [
    ({"repeats": 0}, "`repeats` must be a whole number ≥ 1"),  # no median, after the work
    ({"repeats": 2.5}, "`repeats` must be a whole number ≥ 1"),
    ({"size": "huge"}, "`size` must be one of"),  # a KeyError
    ({"budget_s": float("nan")}, "`budget_s` must be a number of seconds > 0"),
    ({"cases": "S2"}, "write ['S2']"),  # unknown case(s) ['S', '2']
])
def test_run_suite_refuses_bad_arguments_before_any_work(kwargs, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        suite.run_suite(**kwargs, progress=None)


def test_a_suite_without_torch_says_s4_is_skipped():
    result = suite.run_suite(size="quick", repeats=1, cases=["S4"], torch=False,
                             progress=lambda line: None)
    assert result["rows"] == []
    assert "needs torch and transformers" in result["meta"]["skipped"]["S4"]
    assert "skipped: S4 (times jaxattn against HuggingFace" in table.format_table(result)


def test_s1_large_prints_its_floor():
    """S1L carries its floor (flops at the matmul peak, unavoidable bytes at the copy
    bandwidth) and the table prints it beside the time; S1 times the fused and the
    general paths in the same run."""
    with jax.enable_x64(False):
        result = suite.run_suite(size="quick", repeats=1, cases=("peak", "S1L"), torch=False,
                                 progress=lambda line: None)
    (row,) = [r for r in result["rows"] if r["case"] == "S1L"]
    prob = suite.QUICK["small_systems_large_batch"]
    assert row["moved_bytes"] == 4 * prob.batch * (prob.n * prob.d + 20 + 1)
    assert row["floor_flops_s"] > 0 and row["floor_bytes_s"] > 0
    assert "floor" in table.format_table(result)
    no_peak = {**row, "floor_flops_s": None}
    assert "run the `peak` case" in table._line(no_peak)
