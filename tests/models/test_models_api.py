"""jaxattn.models without a reference implementation: presets, HuggingFace's
initialisation scheme, shapes, jit/grad composition, no recompilation, the loop's
consistency with `hidden_states`, weight kinds, and the layers in simulator terms."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxattn as ja
from jaxattn.models import _loop

TINY = {
    "gpt2": {"model_type": "gpt2", "n_layer": 3, "n_embd": 40, "n_head": 5, "vocab_size": 53,
             "n_positions": 24},
    "gpt_neo": {"model_type": "gpt_neo", "num_layers": 2, "hidden_size": 36, "num_heads": 3,
                "vocab_size": 47, "max_position_embeddings": 24, "window_size": 3,
                "attention_types": [[["global", "local"], 1]]},
    "bert": {"model_type": "bert", "num_hidden_layers": 2, "hidden_size": 32,
             "num_attention_heads": 4, "intermediate_size": 44, "vocab_size": 59,
             "max_position_embeddings": 24},
    "albert": {"model_type": "albert", "num_hidden_layers": 3, "hidden_size": 24,
               "num_attention_heads": 2, "intermediate_size": 28, "vocab_size": 43,
               "embedding_size": 12, "max_position_embeddings": 24},
    "llama": {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 48,
              "num_attention_heads": 6, "num_key_value_heads": 2, "intermediate_size": 52,
              "vocab_size": 61, "max_position_embeddings": 64},
}


def tiny(family, key):
    return ja.models.init(TINY[family], key)


def ids_for(model, key, shape):
    return np.asarray(jax.random.randint(key, shape, 0, model.config.vocab_size))


# --- presets and initialisation ----------------------------------------------------


def hf_parameter_count(preset: str) -> int:
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("transformers")
    raw = dict(ja.models.PRESETS[preset])
    cls = {"gpt2": tf.GPT2Model, "gpt_neo": tf.GPTNeoModel, "bert": tf.BertModel,
           "albert": tf.AlbertModel, "llama": tf.LlamaModel}[raw["model_type"]]
    config = tf.AutoConfig.for_model(**raw)
    kwargs = {"add_pooling_layer": False} if raw["model_type"] in ("bert", "albert") else {}
    with torch.device("meta"):
        model = cls(config, **kwargs)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("preset", list(ja.models.PRESETS))
def test_every_preset_has_hf_parameter_count(preset):
    """Each preset builds (shapes only) with exactly HuggingFace's number of weights."""
    shapes = jax.eval_shape(lambda: ja.models.init(preset, jax.random.PRNGKey(0)))
    ours = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(shapes))
    assert ours == hf_parameter_count(preset)


def test_paper_004_table_sizes():
    table = {"albert-base-v2": (768, 12, 12), "albert-large-v2": (1024, 16, 24),
             "albert-xlarge-v2": (2048, 16, 24), "albert-xxlarge-v2": (4096, 64, 12),
             "bert-base-uncased": (768, 12, 12), "bert-large-uncased": (1024, 16, 24),
             "gpt2": (768, 12, 12), "gpt2-medium": (1024, 16, 24), "gpt2-large": (1280, 20, 36),
             "gpt2-xl": (1600, 25, 48), "gpt-neo-125M": (768, 12, 12),
             "gpt-neo-1.3B": (2048, 16, 24), "gpt-neo-2.7B": (2560, 20, 32)}
    for name, (d, h, L) in table.items():
        cfg, _ = ja.models.resolve_config(name)
        assert (cfg.hidden_size, cfg.num_heads, cfg.num_layers) == (d, h, L), name
        assert cfg.causal == name.startswith("gpt")


def test_gpt2_initialisation_scheme(key):
    cfg = {"model_type": "gpt2", "n_layer": 8, "n_embd": 128, "n_head": 4, "vocab_size": 300,
           "n_positions": 64, "initializer_range": 0.03}
    m = ja.models.init(cfg, key)
    b = m.layer_block(5)
    assert np.std(np.asarray(m.wte)) == pytest.approx(0.03, rel=0.03)
    assert np.std(np.asarray(b.attn.query)) == pytest.approx(0.03, rel=0.03)
    assert np.std(np.asarray(b.mlp.fc.weight)) == pytest.approx(0.03, rel=0.03)
    # scaled residual projections: 0.03 / √(2·8)
    assert np.std(np.asarray(b.attn.output)) == pytest.approx(0.03 / 4, rel=0.03)
    assert np.std(np.asarray(b.mlp.proj.weight)) == pytest.approx(0.03 / 4, rel=0.03)
    assert np.all(np.asarray(b.ln_1.weight) == 1) and np.all(np.asarray(b.ln_2.bias) == 0)
    assert np.all(np.asarray(b.attn.query_bias) == 0)
    assert not np.allclose(m.layer_block(0).attn.query, b.attn.query)  # layers differ


def test_init_is_one_program_with_the_weights_drawn_op_by_op(key):
    """`ja.models.init` runs as one program, with the weights of the family's draws run
    op by op: two programs, so equal to rounding (on the AMD EPYC of BENCHMARKS.md
    bit for bit, which `_nn.normal`'s barrier keeps)."""
    cfg, _ = ja.models.resolve_config(TINY["gpt2"])
    one = jax.tree.leaves(ja.models.init(TINY["gpt2"], key))
    by_op = jax.tree.leaves(ja.models.FAMILIES["gpt2"].init(cfg, key))
    assert len(one) == len(by_op)
    for a, b in zip(one, by_op, strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-7, atol=0)


@pytest.mark.slow  # initialises two families
def test_encoder_and_llama_initialisation(key):
    bert = ja.models.init({**TINY["bert"], "initializer_range": 0.05}, key)
    assert np.all(np.asarray(bert.word[0]) == 0)  # padding row, as HF's padding_idx
    assert np.std(np.asarray(bert.layer_block(1).mlp.fc.weight)) == pytest.approx(0.05, rel=0.1)
    albert = tiny("albert", key)
    assert albert.blocks.attn.query.shape[0] == 1  # one shared layer
    llama = ja.models.init({**TINY["llama"], "hidden_size": 120, "initializer_range": 0.04}, key)
    assert np.std(np.asarray(llama.layer_block(0).mlp.gate.weight)) == pytest.approx(0.04, rel=0.05)
    assert np.all(np.asarray(llama.layer_block(1).ln_2.weight) == 1)


# --- running -------------------------------------------------------------------------


@pytest.mark.parametrize("family", [f if f == "gpt2" else pytest.param(f, marks=pytest.mark.slow)
                                    for f in TINY])
def test_shapes_single_and_batch(family, key):
    m = tiny(family, key)
    ids = ids_for(m, key, (3, 7))
    hs = ja.models.hidden_states(m, ids)
    assert hs.shape == (3, m.num_layers + 1, 7, m.config.hidden_size)
    one = ja.models.hidden_states(m, ids[1])
    assert one.shape == hs.shape[1:]
    np.testing.assert_allclose(one, hs[1], rtol=1e-5, atol=1e-6)
    E = ja.models.loop(m, ids, passes=2, ffn=False)
    assert E.shape == (3, 2 * m.num_layers + 1) and E.dtype == jnp.float32


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
@pytest.mark.parametrize("family", ["gpt2", "bert", "llama"])
def test_loop_agrees_with_hidden_states(family, key):
    m = tiny(family, key)
    ids = ids_for(m, key, (2, 6))
    L = m.num_layers
    hs = ja.models.hidden_states(m, ids)
    E, states = ja.models.loop(m, ids, passes=1, save_states=[0, L])
    np.testing.assert_allclose(E[:, :L], ja.misalignment(hs[:, :L]), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(states[:, 0], hs[:, 0], rtol=1e-5, atol=1e-6)
    # the last hidden state is the last block's output after the final norm
    last = jax.vmap(m.final_norm)(states[:, 1])
    np.testing.assert_allclose(last, hs[:, L], rtol=1e-4, atol=1e-5)


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
def test_jit_and_grad_compose(key):
    m = tiny("gpt2", key)
    ids = ids_for(m, key, (2, 5))
    hs = ja.models.hidden_states(m, ids)
    jitted = eqx.filter_jit(lambda m, ids: ja.models.hidden_states(m, ids))(m, jnp.asarray(ids))
    np.testing.assert_allclose(jitted, hs, rtol=1e-5, atol=1e-6)

    def final_E(model):
        return jnp.mean(ja.models.loop(model, ids, passes=2, ffn=False)[:, -1])

    grads = eqx.filter_grad(final_E)(m)
    g = grads.blocks.attn.query
    assert g.shape == m.blocks.attn.query.shape and bool(jnp.all(jnp.isfinite(g)))
    assert float(jnp.abs(g).max()) > 0


def test_loop_does_not_recompile(key, monkeypatch):
    traces = []
    real = _loop._metric
    monkeypatch.setattr(_loop, "_metric", lambda x: traces.append(1) or real(x))
    m = tiny("gpt_neo", key)
    ja.models.loop(m, ids_for(m, key, (2, 6)), passes=3)
    before = len(traces)
    assert before > 0
    ja.models.loop(m, ids_for(m, jax.random.fold_in(key, 1), (2, 6)), passes=3)
    assert len(traces) == before


def test_weight_kinds(key):
    m = tiny("gpt2", key)
    ids = ids_for(m, key, (2, 8))
    k1, k2 = jax.random.PRNGKey(1), jax.random.PRNGKey(2)
    random = ja.models.loop(m, ids, passes=2, weights="random", key=k1)
    # "random" is one draw of init(config, key), embeddings included
    direct = ja.models.loop(ja.models.init(m.config, k1), ids, passes=2)
    np.testing.assert_allclose(random, direct, rtol=1e-6)
    assert not np.allclose(random, ja.models.loop(m, ids, passes=2))
    again = ja.models.loop(m, ids, passes=2, weights="resample", key=k1)
    np.testing.assert_array_equal(again, ja.models.loop(m, ids, passes=2, weights="resample",
                                                        key=k1))
    assert not np.allclose(again, ja.models.loop(m, ids, passes=2, weights="resample", key=k2))
    np.testing.assert_allclose(again[:, 0], random[:, 0])  # same embeddings
    # resampled passes differ from each other; one fixed draw repeats its blocks
    L = m.num_layers
    fixed = ja.models.loop(m, ids, passes=2, weights="random", key=k1, save_states=[L, 2 * L])
    assert not np.allclose(again[:, 1:], random[:, 1:])
    assert fixed[1].shape == (2, 2, 8, 40)


def test_bfloat16_loop_is_close_to_float32(key):
    m = tiny("llama", key)
    ids = ids_for(m, key, (2, 8))
    E32 = ja.models.loop(m, ids, passes=2)
    E16 = ja.models.loop(m, ids, passes=2, dtype=jnp.bfloat16)
    assert E16.dtype == jnp.float32
    np.testing.assert_allclose(E16, E32, atol=0.05)


# --- layers in the simulator's terms ----------------------------------------------


def zero_biases(attn):
    return ja.models.Attention(attn.query, attn.key, attn.value, attn.output, None, None, None,
                               None, attn.scale)


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
@pytest.mark.parametrize("family, layer", [("gpt2", 1), ("bert", -1), ("llama", 0),
                                           ("albert", 2), ("gpt_neo", 0), ("gpt_neo", 1)])
def test_attention_dynamics_is_the_layer_without_biases(family, layer, key):
    """`SelfAttentionDynamics.raw_update` with `U_η = W_O^η W_V^η` equals the model's
    own attention on the same tokens (biases removed, no positions)."""
    m = tiny(family, key)
    dyn = ja.models.attention_dynamics(m, layer)
    attn = zero_biases(ja.models.attention_weights(m, layer))
    x = jax.random.normal(key, (7, m.config.hidden_size), jnp.float32)
    mask = m.mask(7, jnp.asarray(layer % m.num_layers))
    np.testing.assert_allclose(dyn.raw_update(0.0, x), attn(x, mask), rtol=1e-4, atol=1e-5)
    assert dyn.causal == m.config.causal and dyn.num_heads == m.config.num_heads


def test_layer_matrix_is_output_times_value(key):
    m = tiny("gpt2", key)
    attn = ja.models.attention_weights(m, 2)
    d = m.config.hidden_size
    omega = ja.models.value_output(attn).sum(axis=0)
    # The reference in float64 NumPy: a float32 `@` is TF32 on a GPU by default.
    W_O, W_V = (np.asarray(w, np.float64).reshape(d, d) for w in (attn.output, attn.value))
    np.testing.assert_allclose(omega, W_O @ W_V, rtol=1e-4, atol=1e-6)


def test_replace_attention(key):
    m = tiny("gpt2", key)
    attn = ja.models.attention_weights(m, 1)
    bigger = jax.tree.map(lambda a: 2 * a, attn)
    m2 = ja.models.replace_attention(m, 1, bigger)
    np.testing.assert_allclose(ja.models.attention_weights(m2, 1).query, 2 * attn.query)
    np.testing.assert_array_equal(ja.models.attention_weights(m2, 0).query,
                                  ja.models.attention_weights(m, 0).query)
    albert = tiny("albert", key)
    a2 = ja.models.replace_attention(albert, 0, jax.tree.map(jnp.zeros_like,
                                     ja.models.attention_weights(albert, 0)))
    assert float(jnp.abs(ja.models.attention_weights(a2, 2).query).max()) == 0  # shared
    with pytest.raises(ValueError, match="shapes"):
        ja.models.replace_attention(m, 0, ja.models.attention_weights(albert, 0))
    with pytest.raises(ValueError, match=r"^replace_attention: `attn\.\w+` has shape \(.*\); "
                                         r"layer 0's has \("):  # one line, not two pytrees
        ja.models.replace_attention(m, 0, ja.models.attention_weights(albert, 0))
    nan = eqx.tree_at(lambda t: t.query, attn, attn.query.at[0, 0, 0].set(jnp.nan))
    with pytest.raises(ValueError, match=r"`attn\.query` holds NaN or inf"):  # E was NaN
        ja.models.replace_attention(m, 1, nan)
    for call in (lambda: ja.models.replace_attention(m, 0, 3),
                 lambda: ja.models.value_output(3)):  # was an AttributeError
        with pytest.raises(TypeError, match="takes a ja.models.Attention"):
            call()


def test_layer_weights_albert_shared(key):
    m = tiny("albert", key)
    a, b = ja.models.layer_weights(m, 0), ja.models.layer_weights(m, 2)
    assert jax.tree.all(jax.tree.map(lambda x, y: bool((x == y).all()), a, b))


def test_random_gpt2_collapses_to_consensus(key):
    """The paper's qualitative result on a small random GPT-2 without FFN (the case
    the theory covers): with one random draw E falls by an order of magnitude over
    30 passes; with weights resampled every pass (aperiodic, slower, as in the paper)
    it still more than halves. With HF's default std 0.02 at d = 40 the updates are
    tiny and the fall takes far longer, so the weights are drawn with std 0.1."""
    m = ja.models.init({**TINY["gpt2"], "initializer_range": 0.1}, key)
    ids = ids_for(m, key, (4, 16))
    E = np.asarray(ja.models.loop(m, ids, passes=30, ffn=False, weights="random", key=key))
    assert E[:, -1].mean() < 0.1 * E[:, 0].mean()
    E = np.asarray(ja.models.loop(m, ids, passes=30, ffn=False, weights="resample", key=key))
    assert E[:, -1].mean() < 0.5 * E[:, 0].mean()


def test_loop_chunks_give_the_vmapped_result(key):
    m = tiny("gpt2", key)
    ids = ids_for(m, key, (5, 8))
    whole = ja.models.loop(m, ids, passes=2, chunk=5)
    for chunk in (1, 2, 3):
        np.testing.assert_allclose(ja.models.loop(m, ids, passes=2, chunk=chunk), whole,
                                   rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="chunk"):
        ja.models.loop(m, ids, passes=1, chunk=0)


def test_no_prompts_and_a_non_boolean_ffn_are_refused_by_name(key):
    m = tiny("gpt2", key)
    with pytest.raises(ValueError, match="at least one prompt"):
        ja.models.loop(m, np.zeros((0, 5), np.int32), passes=1)
    for call in (ja.models.loop, ja.models.hidden_states):
        kw = {"passes": 1} if call is ja.models.loop else {}
        with pytest.raises(TypeError, match="`ffn` must be True or False, got 'no'"):
            call(m, ids_for(m, key, (2, 5)), ffn="no", **kw)


def test_non_integer_depths_and_loops_past_memory_are_refused_before_work(key):
    """`save_states=[2.9]` is no depth 2; ids or passes past the machine's memory (or
    JAX's int32 counts) are refused in one line before the ids are read."""
    m = tiny("gpt2", key)
    ids = np.zeros((1, 4), np.int32)
    for depths in ([2.9], [1.5], [True]):
        with pytest.raises(TypeError, match="must be integer depths"):
            ja.models.loop(m, ids, passes=2, save_states=depths)
    huge = np.broadcast_to(np.int32(0), (10**8, 24))  # no memory of its own
    for fn in (ja.models.loop, ja.models.hidden_states):
        with pytest.raises(ValueError, match="the loop's arrays need at least") as e:
            fn(m, huge, **({"passes": 10**6} if fn is ja.models.loop else {}))
        assert len(str(e.value).splitlines()) == 1
    with pytest.raises(ValueError, match="JAX counts in int32"):
        ja.models.loop(m, ids, passes=2**31)
