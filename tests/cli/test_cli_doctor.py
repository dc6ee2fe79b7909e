"""`jaxattn doctor`: versions, device, whether float32 is faithful (exit status 1 when
not), the determinism flags, the compilation cache, matmul speed per precision and the
optional parts."""

import functools
import re
import subprocess
import sys

from jaxattn._process.cache import cache_dir
from jaxattn.cli import doctor, main


def test_doctor_reports_every_part_and_passes(capsys):
    assert main(["doctor", "--size", "32"]) == 0
    out = capsys.readouterr().out
    for part in ("jaxattn ", "jax ", "jaxlib ", "python ", "device: ", "backend ",
                 "determinism: ", "float32: ", "faithful", "matmul 32×32", "float32 ",
                 "tensorfloat32 ", "bfloat16 ", "GFLOP/s"):
        assert part in out, part
    assert "NOT faithful" not in out
    # The folder in force (the test suite's, which other test processes may be filling).
    assert re.search(rf"compilation cache: {re.escape(str(cache_dir()))}, [1-9]\d* entries, "
                     r"\d+\.\d MB( \(of which \d+ converted \.gguf models?, \d+\.\d MB\))?\n",
                     out), out
    for name in doctor.OPTIONAL:
        assert f"optional {name}: " in out


def test_doctor_exits_1_when_float32_is_not_faithful(monkeypatch, capsys):
    """A device whose float32 products are bfloat16 ones fails the check."""
    monkeypatch.setattr(doctor, "faithful_float32",
                        functools.partial(doctor.faithful_float32, precision="bfloat16"))
    assert main(["doctor", "--size", "8"]) == 1
    assert "NOT faithful" in capsys.readouterr().out


def test_the_threshold_separates_float32_from_reduced_products():
    assert doctor.faithful_float32() <= doctor.THRESHOLD
    for precision in ("tensorfloat32", "bfloat16"):
        assert doctor.faithful_float32(precision=precision) > doctor.THRESHOLD, precision


def test_the_float32_check_computes_in_float32_with_x64_on(monkeypatch):
    """With float64 enabled (as in these tests, or a user's session), `run_layers`
    computes float32 tokens in float64: the check's float32 run turns it off, so that
    its error is float32's own (about 1e-7 here), not the weights' rounding alone."""
    import jax

    from jaxattn import _layers

    seen, real = [], _layers.run_layers
    monkeypatch.setattr(_layers, "run_layers",
                        lambda dyn, x0, *a: seen.append((x0.dtype, real(dyn, x0, *a).dtype))
                        or real(dyn, x0, *a))
    assert jax.config.jax_enable_x64
    error = doctor.faithful_float32()
    assert [str(a) for pair in seen for a in pair] == ["float64"] * 2 + ["float32"] * 2
    assert 2.0**-26 < error <= doctor.THRESHOLD


def test_doctor_refuses_a_bad_size(capsys):
    assert main(["doctor", "--size", "0"]) == 2
    assert "`--size` must be a whole number ≥ 1" in capsys.readouterr().err


def test_optional_parts_are_found_not_imported():
    code = ("import sys; from jaxattn.cli.doctor import OPTIONAL, optional_parts; "
            "found = optional_parts(); assert set(found) == set(OPTIONAL); "
            "print(sorted(m for m in OPTIONAL if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "[]"
