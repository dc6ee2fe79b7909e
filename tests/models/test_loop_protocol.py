"""The real-model protocol at full length: `jaxattn loop` streams `E` to disk in
chunks and resumes a killed run to the uninterrupted result; `ja.models.loop`
records any per-block measure, by pass on request, under a progress bar that
does not change the values; the fused attention kernel agrees with the einsums."""

import json
import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import assert_same_values

import jaxattn as ja
from jaxattn.cli import main
from jaxattn.experiments import loop_runner as run_module
from jaxattn.experiments.loop_runner import run_loop
from jaxattn.models._arch import _nn
from jaxattn.models._arch._nn import fused_attention

TINY_GPT2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 24, "n_head": 3, "vocab_size": 37,
             "n_positions": 16}
TINY_NEO = {"model_type": "gpt_neo", "num_layers": 2, "hidden_size": 24, "num_heads": 3,
            "vocab_size": 29, "max_position_embeddings": 16, "window_size": 3,
            "attention_types": [[["global", "local"], 1]]}
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def config_path(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY_GPT2))
    return path


def loop_argv(config_path, out, passes=400, *extra):
    return ["loop", "--model", str(config_path), "--weights", "resample", "--passes",
            str(passes), "--prompts", "3", "--tokens", "5", "--chunk-passes", "7",
            "--save-states", "0,9,401", "--no-progress", "--out", str(out), *extra]


@pytest.mark.slow  # two loops and a process of their own: 30 s of CPU
def test_a_killed_loop_resumes_to_the_uninterrupted_result(config_path, tmp_path):
    """SIGKILL a `jaxattn loop` process once it has saved a chunk, resume the folder
    with `--resume`, and compare with a run left alone: the same E and states, bit
    for bit (the CPU), and a folder as a run left alone leaves it."""
    killed = tmp_path / "killed"
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.Popen([sys.executable, "-m", "jaxattn", *loop_argv(config_path, killed)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    carry = killed / "chunks" / "carry.npz"
    deadline = time.monotonic() + 120
    while not carry.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    assert (killed / "INCOMPLETE").exists() and not (killed / "summary.json").exists()
    assert 0 < len(list((killed / "chunks").glob("0*.npz"))) < 58  # stopped mid-run

    with jax.enable_x64(False):  # as the command runs
        assert main(loop_argv(config_path, killed, 400, "--resume")) == 0
        alone = tmp_path / "alone"
        assert main(loop_argv(config_path, alone)) == 0
    a, b = np.load(killed / "data.npz"), np.load(alone / "data.npz")
    assert a["E"].shape == (3, 400 * 2 + 1) and a["states"].shape == (3, 3, 5, 24)
    for name in ("E", "states", "ids", "depths"):
        np.testing.assert_array_equal(a[name], b[name])
    assert sorted(p.name for p in killed.iterdir()) == sorted(p.name for p in alone.iterdir())
    assert not (killed / "chunks").exists() and not (killed / "INCOMPLETE").exists()


def test_resume_refuses_other_settings_in_one_line(config_path, tmp_path, capsys):
    out = tmp_path / "run"
    folder = run_loop(str(config_path), out, weights="random", passes=3, prompts=2,
                      tokens=4, progress=False, log=None)
    before = (folder / "summary.json").read_text()
    capsys.readouterr()
    argv = ["loop", "--model", str(config_path), "--weights", "random", "--prompts", "2",
            "--tokens", "4", "--out", str(out), "--no-progress"]
    assert main([*argv, "--passes", "4", "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert "another --passes (3, not 4)" in err and len(err.splitlines()) == 1
    assert main([*argv, "--passes", "3"]) == 2  # no --resume: an existing loop is refused
    # finished: nothing to continue, so no "pass --resume to continue it"
    assert capsys.readouterr().err.strip().endswith("holds a finished loop; choose another "
                                                    "--out.")
    assert main([*argv, "--passes", "3", "--resume"]) == 0  # finished: nothing to run
    assert (folder / "summary.json").read_text() == before
    assert main(["loop", "--model", str(config_path), "--weights", "random", "--resume"]) == 2
    assert "--resume needs --out" in capsys.readouterr().err
    assert main(["loop", "--grid", "--model", str(config_path), "--resume", "--out",
                 str(tmp_path / "grid")]) == 2
    assert "--resume applies to a single loop" in capsys.readouterr().err


def test_the_folder_holds_what_ja_models_loop_returns(config_path, tmp_path, monkeypatch):
    """A loop stopped between a chunk and its carry resumes to `ja.models.loop`'s
    values (the streamed chunks gathered), whatever the chunking."""
    kw = dict(weights="random", passes=5, prompts=3, tokens=6, save_states=[10, 0, 3, 3],
              progress=False, log=None)
    saved = []
    real = run_module._save_carry

    def stop_at_the_second(*args):
        saved.append(args[2])
        if len(saved) == 2:
            raise KeyboardInterrupt  # after chunk 2's E, before its carry
        real(*args)

    monkeypatch.setattr(run_module, "_save_carry", stop_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        run_loop(str(config_path), tmp_path / "a", chunk_passes=2, **kw)
    monkeypatch.setattr(run_module, "_save_carry", real)
    chunks = sorted(p.name for p in (tmp_path / "a" / "chunks").iterdir())
    assert chunks == ["000000.npz", "000002.npz", "carry.npz"]
    folder = run_loop(str(config_path), tmp_path / "a", chunk_passes=2, resume=True, **kw)
    with np.load(folder / "data.npz") as data:
        E, states, ids = data["E"], data["states"], data["ids"]
    model = ja.models.init(TINY_GPT2, jax.random.PRNGKey(0))
    want, want_states = ja.models.loop(model, ids, passes=5, weights="random",
                                       key=jax.random.PRNGKey(0), save_states=[10, 0, 3, 3])
    assert_same_values(E, want)
    assert_same_values(states, want_states)
    other = run_loop(str(config_path), tmp_path / "b", chunk_passes=5, **kw)
    assert_same_values(np.load(other / "data.npz")["E"], E)


@pytest.fixture(scope="module")
def neo():
    return ja.models.init(TINY_NEO, jax.random.PRNGKey(1))


def ids_of(model, shape=(4, 7)):
    return np.random.default_rng(0).integers(0, model.config.vocab_size, shape)


def test_progress_segments_give_the_same_values(neo):
    ids = ids_of(neo)
    one = ja.models.loop(neo, ids, passes=5, weights="resample", save_states=[0, 3, 10],
                         progress=False)
    segmented = ja.models.loop(neo, ids, passes=5, weights="resample", save_states=[0, 3, 10],
                               progress=True)
    for a, b in zip(one, segmented):
        assert_same_values(a, b)
    hs = ja.models.hidden_states(neo, ids, progress=False)
    assert_same_values(ja.models.hidden_states(neo, ids, progress=True), hs)
    with pytest.raises(TypeError, match="progress"):
        ja.models.loop(neo, ids, passes=1, progress="yes")


def test_observe_records_any_measure_by_pass(neo):
    ids = ids_of(neo)
    L = neo.num_layers
    E = ja.models.loop(neo, ids, passes=3)
    by_pass = ja.models.loop(neo, ids, passes=3, by_pass=True)
    assert by_pass.shape == (4, 3, L)
    assert_same_values(by_pass.reshape(4, -1), E[:, 1:])  # another program
    r = ja.models.loop(neo, ids, passes=3, observe=ja.metrics.rank_collapse_residual,
                       by_pass=True)
    _, states = ja.models.loop(neo, ids, passes=3, save_states=[1, 2, 3, 6])
    want = ja.metrics.rank_collapse_residual(states)
    np.testing.assert_allclose(r[:, 0, :], want[:, :2], rtol=1e-6)
    np.testing.assert_allclose(r[:, 2, 1], want[:, 3], rtol=1e-6)
    counts = ja.models.loop(neo, ids, passes=2, observe=lambda x: ja.metrics.cluster_count(
        x, 1e-3))
    assert counts.shape == (4, 2 * L + 1) and jnp.issubdtype(counts.dtype, jnp.integer)
    vec = ja.models.loop(neo, ids[0], passes=2, observe=lambda x: x[:, :2].sum(0), by_pass=True)
    assert vec.shape == (2, L, 2)
    with pytest.raises(TypeError, match="observe"):
        ja.models.loop(neo, ids, passes=1, observe="entropy")


def test_float64_compute_returns_float64_E(neo):
    ids = ids_of(neo)
    E64 = ja.models.loop(neo, ids, passes=2, dtype=jnp.float64)
    assert E64.dtype == jnp.float64
    E32 = ja.models.loop(neo, ids, passes=2)
    assert E32.dtype == jnp.float32
    np.testing.assert_allclose(E64, E32, rtol=1e-3, atol=1e-6)
    assert not np.array_equal(np.asarray(E64, np.float32), E32)  # computed in float64
    with jax.enable_x64(False), pytest.raises(ValueError, match="jax_enable_x64"):
        ja.models.loop(neo, ids, passes=1, dtype=jnp.float64)


def test_a_float64_loop_embeds_in_float64(neo):
    """The embeddings of a float64 loop are float64 sums of the (float32) tables, not
    float32 sums cast (2.7e-8 relative from HuggingFace's double model, now rounding)."""
    ids = ids_of(neo)
    _, states = ja.models.loop(neo, ids, passes=1, dtype=jnp.float64, save_states=[0])
    wte, wpe = (np.asarray(t, np.float64) for t in (neo.wte, neo.wpe))
    want = wte[np.asarray(ids)] + wpe[: ids.shape[-1]]
    np.testing.assert_array_equal(np.asarray(states)[:, 0], want)


ON_GPU = jax.default_backend() == "gpu"


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
@pytest.mark.parametrize("implementation", [
    "xla", pytest.param("cudnn", marks=pytest.mark.skipif(not ON_GPU, reason="cuDNN: a GPU"))])
@pytest.mark.parametrize("config", [TINY_GPT2, TINY_NEO], ids=["gpt2", "gpt_neo"])
def test_fused_attention_agrees_with_the_einsums(config, implementation, monkeypatch):
    """`jax.nn.dot_product_attention` (its XLA implementation, the reference of the
    cuDNN kernel a GPU runs; on a GPU the cuDNN kernel too) gives the einsum path's
    values within bfloat16 rounding, through `ja.models.loop`'s vmap over prompts,
    causal masks and GPT-Neo's local window (3 of 12 tokens) included."""
    model = ja.models.init(config, jax.random.PRNGKey(2))
    ids = ids_of(model, (3, 12))
    with jax.enable_x64(False):
        monkeypatch.setattr(_nn, "attention_kernel", lambda dtype, k: None)
        jax.clear_caches()  # the einsums on every backend
        einsum = ja.models.loop(model, ids, passes=2, dtype=jnp.bfloat16, save_states=[2, 4])
        calls = []
        monkeypatch.setattr(_nn, "fused_attention", lambda *a, **kw: calls.append(kw) or
                            fused_attention(*a, **kw))
        monkeypatch.setattr(_nn, "attention_kernel", lambda dtype, k: implementation)
        jax.clear_caches()  # trace again, with the fused kernel
        fused = ja.models.loop(model, ids, passes=2, dtype=jnp.bfloat16, save_states=[2, 4])
    jax.clear_caches()
    E, states = (np.asarray(a, np.float32) for a in einsum)
    E_f, states_f = (np.asarray(a, np.float32) for a in fused)
    assert np.abs(states_f - states).max() <= 0.05 * np.abs(states).max()
    np.testing.assert_allclose(E_f, E, rtol=0.05, atol=1e-3)
    assert calls and all(c == {"causal": True, "implementation": implementation}
                         for c in calls)


@pytest.mark.parametrize("layer", [0, 1], ids=["global", "local"])
def test_fused_attention_of_a_local_layer(neo, layer):
    """One GPT-Neo layer: the fused call with the layer's window (by index: the
    kernel's sliding window) equals the einsum mixing with the dense mask (float32:
    to rounding); the local layer masks out the tokens beyond the window."""
    model = neo
    attn = model.layer_block(layer).attn
    x = jax.random.normal(jax.random.PRNGKey(4), (9, 24))
    q, k, v = (attn._project(w, None, x, "float32") for w in (attn.query, attn.key, attn.value))
    dense = model.mask(9, layer)
    assert bool(dense[8, 0]) == (layer == 0) and bool(dense[8, 6]) and not bool(dense[0, 1])
    fused = _nn.fused_attention(q, k, v, model.window(layer), attn.scale, causal=True,
                                implementation="xla")
    ref = attn._mix(q, k, v, dense, "float32")
    np.testing.assert_allclose(fused, ref, rtol=1e-5, atol=1e-6)


def test_a_fused_window_needs_causal_attention(neo):
    q = jnp.ones((3, 5, 8))
    with pytest.raises(ValueError, match="needs causal attention"):
        _nn.fused_attention(q, q, q, neo.window(1), 1.0, causal=False, implementation="xla")


def test_the_fused_kernel_is_chosen_only_for_narrow_dtypes_on_a_gpu(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    assert _nn.attention_kernel(jnp.bfloat16, 64) is None  # the CPU

    class Client:
        platform_version = "cuda 12080"

    class Device:
        client = Client()

    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(jax, "devices", lambda *a: [Device()])
    assert _nn.attention_kernel(jnp.bfloat16, 64) == "cudnn"
    assert _nn.attention_kernel(jnp.float16, 128) == "cudnn"
    assert _nn.attention_kernel(jnp.float32, 64) is None  # stated precision: einsums
    assert _nn.attention_kernel(jnp.bfloat16, 160) is None  # beyond cuDNN's head sizes
