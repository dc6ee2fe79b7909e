"""Noisy layers on the fused ensemble path, and the noisy-ensemble benchmark case."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxattn as ja


def _tokens(key, shape):
    return jax.random.normal(key, shape)


@pytest.mark.parametrize("noise", [ja.TokenNoise(0.7), ja.ValueNoise(0.9)],
                         ids=["token", "value"])
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_noisy_fused_equals_general(noise, norm):
    k1, k2, k3 = jax.random.split(jax.random.key(3), 3)
    dyn = ja.random_dynamics(k1, 2, 3, scale=1.0, norm=norm)
    x0 = _tokens(k2, (2, 3, 4, 3))
    run = {s: ja.run_layers(dyn, x0, 5, 0.2, noise=noise, key=k3, strategy=s)
           for s in ("fused", "general")}
    auto = ja.run_layers(dyn, x0, 5, 0.2, noise=noise, key=k3)
    np.testing.assert_allclose(run["fused"], run["general"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(auto, run["fused"], rtol=0, atol=0)
    # The noise moved the tokens: the run is not the deterministic one.
    plain = ja.run_layers(dyn, x0, 5, 0.2)
    assert float(jnp.max(jnp.abs(run["fused"][..., -1, :, :] - plain[..., -1, :, :]))) > 1e-2


def test_noisy_fused_keys_and_observe():
    """Raw `PRNGKey` keys, an observable, and more systems than one chunk."""
    from jaxattn._ensemble import CPU_CHUNK

    k1, k2 = jax.random.split(jax.random.key(5))
    dyn = ja.random_dynamics(k1, 1, 3, scale=1.0)
    x0 = _tokens(k2, (CPU_CHUNK + 3, 4, 3))
    key = jax.random.PRNGKey(11)
    fused, general = (ja.run_layers(dyn, x0, 3, 0.3, noise=ja.TokenNoise(0.5), key=key,
                                    observe=ja.misalignment, strategy=s)
                      for s in ("fused", "general"))
    assert fused.shape == (CPU_CHUNK + 3, 4)
    np.testing.assert_allclose(fused, general, rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # warm: over ~3 s (make test stays the fast loop)
def test_bench_sn_quick(tmp_path, capsys):
    """`jaxattn bench --quick --cases SN`: the jaxattn rows and the torchsde row, with
    their final misalignments, the z-score and the speedup."""
    pytest.importorskip("torch")
    pytest.importorskip("torchsde")
    import json

    from jaxattn.cli import main

    out = tmp_path / "bench.json"
    with jax.default_matmul_precision("float32"):
        code = main(["bench", "--quick", "--repeats", "1", "--cases", "SN", "--out", str(out)])
    assert code == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["library"].split(" [")[0] for r in rows] == [
        "jaxattn", "jaxattn (general)", "torch (torchsde)"]
    assert all(r["case"] == "SN" and "Itô" in r["scheme"] for r in rows)
    jx, general, ref = rows
    assert jx["mean_final_misalignment"] == pytest.approx(general["mean_final_misalignment"],
                                                          rel=1e-5)
    for r in rows:
        assert 0 < r["se_final_misalignment"] < r["mean_final_misalignment"] <= 2
    assert np.isfinite(ref["z_vs_jax"]) and ref["jaxattn_speedup"] > 0
    assert "z vs jaxattn" in capsys.readouterr().out
