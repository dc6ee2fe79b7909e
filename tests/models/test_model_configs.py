"""Model configs read faithfully: Llama's rotary scalings against HuggingFace, the
refusal of config fields jaxattn does not implement, HuggingFace's spellings of
config fields, checks of `architectures` / `tie_word_embeddings` and of ambiguous
weight folders; attention patterns and the activation cache against HuggingFace."""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import assert_same_values

torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")

from test_models_parity import TOL, hf_hidden_states, rel_error, tiny  # noqa: E402

import jaxattn as ja  # noqa: E402

SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 3.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 12},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8},
}
N = 21  # tokens: past max_position_embeddings, where `dynamic` rescales


def tiny_llama(rope: dict | None):
    params = {"rope_theta": 1000.0, **(rope or {"rope_type": "default"})}
    cfg = tf.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=88, vocab_size=71,
                         max_position_embeddings=16, rope_parameters=params)
    cfg._attn_implementation = "eager"
    torch.manual_seed(5)
    return tf.LlamaModel(cfg).eval()


@pytest.fixture(scope="module")
def ids():
    return np.random.default_rng(11).integers(0, 71, (2, N))


@pytest.mark.parametrize("kind", [  # dynamic: warm over ~4 s (make test stays the fast loop)
    pytest.param(k, marks=pytest.mark.slow) if k == "dynamic" else k for k in sorted(SCALINGS)])
def test_rope_scaling_matches_hf(tmp_path, ids, kind):
    hf = tiny_llama(SCALINGS[kind])
    hf.save_pretrained(tmp_path)
    model = ja.models.load(tmp_path)
    ref = hf_hidden_states(hf, ids)
    err = rel_error(ja.models.hidden_states(model, ids), ref)
    print(f"{kind}: max relative Frobenius error {err:.2e}")
    assert err <= TOL
    # the scaling changes the forward pass: unscaled rotary positions are far off
    plain = ja.models.init({**json.loads((tmp_path / "config.json").read_text()),
                            "rope_parameters": {"rope_type": "default", "rope_theta": 1000.0}},
                           jax.random.PRNGKey(0))
    plain = type(model)(plain.config, model.embed_tokens, model.blocks, model.norm)
    assert rel_error(ja.models.hidden_states(plain, ids), ref) > 10 * TOL


def test_rotary_tables_of_a_float64_run_are_float64(tmp_path):
    """A float64 loop is a reference: its tables were float32 (as HuggingFace's), off
    by 1e-4 at position 2048 and 5e-4 at SmolLM2's 8192."""
    from jaxattn.models._arch._rope import rotary_tables

    inv = 1 / 1e5 ** (np.arange(0, 64, 2) / 64)
    angle = np.arange(8192)[:, None] * inv
    exact = np.cos(np.concatenate([angle, angle], -1))
    wide, _ = rotary_tables(8192, 64, 1e5, dtype=jnp.float64)
    narrow, _ = rotary_tables(8192, 64, 1e5)  # float32, as HuggingFace
    assert wide.dtype == jnp.float64 and np.abs(np.asarray(wide) - exact).max() < 1e-10
    assert narrow.dtype == jnp.float32 and np.abs(np.asarray(narrow) - exact).max() > 1e-5
    hf = tiny_llama(None)
    hf.save_pretrained(tmp_path)
    model = ja.models.load(tmp_path)
    assert model.context(N, jnp.float64)[0].dtype == jnp.float64  # what loop(dtype=...) passes
    assert model.context(N, jnp.bfloat16)[0].dtype == jnp.float32


def test_rope_scaling_in_the_older_format_matches_hf(tmp_path, ids):
    """`rope_scaling` beside a top-level `rope_theta` (transformers < 5)."""
    hf = tiny_llama(SCALINGS["linear"])
    hf.save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    raw.pop("rope_parameters")
    raw.update(rope_theta=1000.0, rope_scaling={"type": "linear", "factor": 4})
    (tmp_path / "config.json").write_text(json.dumps(raw))
    err = rel_error(ja.models.hidden_states(ja.models.load(tmp_path), ids),
                    hf_hidden_states(hf, ids))
    assert err <= TOL


# Both spellings in one config (and the top-level fields beside them): transformers 5
# lets a non-empty `rope_scaling` replace `rope_parameters` whole, theta included.
_LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
ROPE_PAIRS = {
    "issue": {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4},
              "rope_scaling": {"rope_type": "linear", "factor": 4.0}},
    "conflicting factors": {"rope_parameters": {"rope_type": "linear", "factor": 2.0},
                            "rope_scaling": {"rope_type": "linear", "factor": 4.0}},
    "agreeing, theta in rope_parameters": {
        "rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000.0},
        "rope_scaling": {"rope_type": "linear", "factor": 4.0}},
    "agreeing, top-level theta": {
        "rope_theta": 3e4, "rope_parameters": {"rope_type": "linear", "factor": 4.0},
        "rope_scaling": {"type": "linear", "factor": 4.0}},
    "theta in both": {"rope_theta": 3e4,
                      "rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 5e4},
                      "rope_scaling": {"rope_type": "linear", "factor": 4.0, "rope_theta": 2e3}},
    "llama3 against yarn": {"rope_parameters": {"rope_type": "yarn", "factor": 2.0},
                            "rope_scaling": {**_LLAMA3, "original_max_position_embeddings": 12}},
    "top-level original length": {"original_max_position_embeddings": 8,
                                  "rope_parameters": dict(_LLAMA3)},
    "empty rope_scaling": {"rope_parameters": {"rope_type": "linear", "factor": 2.0},
                           "rope_scaling": {}},
    "null rope_scaling": {"rope_parameters": {"rope_type": "linear", "factor": 2.0},
                          "rope_scaling": None},
}


@pytest.mark.parametrize("pair", sorted(ROPE_PAIRS))
def test_both_rope_spellings_read_as_transformers_reads_them(pair):
    """The inverse frequencies and cos/sin factor of transformers' own rotary
    embedding, built from the same config dict."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from jaxattn.models._arch._rope import read_rope, rope_frequencies

    raw = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
           "num_hidden_layers": 1, "intermediate_size": 88, "vocab_size": 71,
           "max_position_embeddings": 16, **ROPE_PAIRS[pair]}
    hf = LlamaRotaryEmbedding(tf.LlamaConfig.from_dict(json.loads(json.dumps(raw))))
    theta, scaling = read_rope(json.loads(json.dumps(raw)))
    inv_freq, attention = rope_frequencies(16, 16, theta, scaling, 16)
    np.testing.assert_allclose(np.asarray(inv_freq), hf.inv_freq.numpy(), rtol=1e-6)
    assert attention == pytest.approx(hf.attention_scaling, rel=1e-12)


def test_rope_scaling_beside_rope_parameters_matches_hf(tmp_path, ids):
    """The config of the issue: `rope_parameters` plain, `rope_scaling` linear; the
    model loaded from the folder matches HuggingFace's from the same folder."""
    hf = tiny_llama(None)
    hf.save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    raw.update(ROPE_PAIRS["issue"])
    (tmp_path / "config.json").write_text(json.dumps(raw))
    ref = tf.LlamaModel.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert ref.config.rope_parameters["rope_type"] == "linear"
    err = rel_error(ja.models.hidden_states(ja.models.load(tmp_path), ids),
                    hf_hidden_states(ref, ids))
    assert err <= TOL


LLAMA = {"model_type": "llama", "num_hidden_layers": 1, "hidden_size": 16,
         "num_attention_heads": 2, "intermediate_size": 24, "vocab_size": 19}


@pytest.mark.parametrize("changes, match", [
    ({"rope_scaling": {"rope_type": "longrope", "factor": 2.0}},
     r"rope_scaling\.rope_type='longrope': jaxattn does not implement"),
    ({"rope_parameters": {"rope_type": "proportional", "rope_theta": 1e4}},
     r"rope_parameters\.rope_type='proportional': jaxattn does not implement"),
    ({"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}},
     r"partial_rotary_factor=0\.5: jaxattn does not implement"),
    ({"rope_scaling": {"rope_type": "linear"}}, r"rope_scaling of rope_type 'linear' needs"),
    ({"rope_scaling": {"rope_type": "linear", "factor": "4"}},
     r"`rope_scaling\.factor` must be a finite number"),
    ({"tie_word_embeddings": "yes"}, r"`tie_word_embeddings` must be true or false, got 'yes'"),
    ({"architectures": "LlamaForCausalLM"}, r"`architectures` must be a list of class names"),
    ({"architectures": [3]}, r"`architectures` must be a list of class names"),
    ({"architectures": ["GPT2LMHeadModel"]},
     r"`architectures` names 'GPT2LMHeadModel', not a class of model_type 'llama'"),
])
def test_unimplemented_or_bad_fields_are_refused_by_name(changes, match):
    with pytest.raises(ValueError, match=match) as info:
        ja.models.init({**LLAMA, **changes}, jax.random.PRNGKey(0))
    assert "\n" not in str(info.value)


def test_huggingface_spellings_are_accepted():
    ours = {"model_type": "gpt2", "n_layer": 2, "n_embd": 24, "n_head": 3, "n_positions": 9,
            "vocab_size": 13}
    theirs = {"model_type": "gpt2", "num_hidden_layers": 2, "hidden_size": 24,
              "num_attention_heads": 3, "max_position_embeddings": 9, "vocab_size": 13}
    a, _ = ja.models.resolve_config(ours)
    b, _ = ja.models.resolve_config(theirs)
    assert a == b and b.num_hidden_layers == 2 and b.max_position_embeddings == 9
    neo, _ = ja.models.resolve_config({**ja.models.PRESETS["gpt-neo-125M"],
                                       "num_hidden_layers": 12, "num_attention_heads": 12})
    assert (neo.num_layers, neo.num_heads) == (12, 12)
    preset = {**ja.models.PRESETS["gpt2"], "num_hidden_layers": 12}
    assert ja.models.resolve_config(preset)[0] == ja.models.resolve_config("gpt2")[0]
    cfg = {**LLAMA, "architectures": ["LlamaForCausalLM"], "tie_word_embeddings": True}
    assert ja.models.init(cfg, jax.random.PRNGKey(0)).num_layers == 1


def test_two_spellings_with_different_values_are_refused():
    with pytest.raises(ValueError, match=r"`num_hidden_layers`=2 and `n_layer`=12 are two "
                                         r"spellings of one field"):
        ja.models.init({**ja.models.PRESETS["gpt2"], "num_hidden_layers": 2},
                       jax.random.PRNGKey(0))


def test_index_beside_a_stray_model_safetensors_is_refused(tmp_path):
    hf = tiny("gpt2")
    hf.save_pretrained(tmp_path / "one")
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    shutil.copy(tmp_path / "one" / "config.json", sharded)
    shutil.copy(tmp_path / "one" / "model.safetensors", sharded / "shard-1.safetensors")
    names = [k for k in json.loads(
        (tmp_path / "one" / "model.safetensors").read_bytes()[8:].split(b"}}")[0] + b"}}")
        if k != "__metadata__"]
    index = {"weight_map": {k: "shard-1.safetensors" for k in names}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    ja.models.load(sharded)  # the index alone is fine
    shutil.copy(tmp_path / "one" / "model.safetensors", sharded)
    with pytest.raises(ValueError, match="model.safetensors it does not list") as info:
        ja.models.load(sharded)
    assert "\n" not in str(info.value)


def hf_attentions(model, ids) -> np.ndarray:
    with torch.no_grad():
        out = model(torch.from_numpy(ids), output_attentions=True)
    return np.stack([a.numpy() for a in out.attentions], axis=1)


@pytest.mark.slow  # warm: over ~3 s (make test stays the fast loop)
@pytest.mark.parametrize("family", ["gpt2", "gpt_neo", "bert", "albert", "llama"])
def test_attention_patterns_match_hf(tmp_path, family, seed):
    hf = tiny(family)
    hf.save_pretrained(tmp_path)
    model = ja.models.load(tmp_path)
    ids = np.random.default_rng(seed).integers(0, hf.config.vocab_size, (2, 9))
    ref = hf_attentions(hf, ids)
    ours = np.asarray(jax.vmap(lambda s: ja.models.attention_patterns(model, s))(ids))
    assert ours.shape == ref.shape == (2, model.num_layers, model.config.num_heads, 9, 9)
    np.testing.assert_allclose(ours, ref, atol=TOL)
    one = ja.models.attention_patterns(model, ids[1])
    np.testing.assert_allclose(one, ours[1], atol=1e-6)


def test_attention_patterns_want_one_sequence():
    model = ja.models.init(LLAMA, jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match=r"one sequence \(n,\).*jax.vmap"):
        ja.models.attention_patterns(model, np.zeros((2, 3), int))


@pytest.mark.slow  # warm: over ~3 s (make test stays the fast loop)
def test_run_with_cache_is_the_loop_with_its_attention(seed):
    model = ja.models.init({**ja.models.PRESETS["gpt2"], "n_layer": 2, "n_embd": 24,
                            "n_head": 3, "vocab_size": 31, "n_positions": 16},
                           jax.random.PRNGKey(seed))
    ids = np.random.default_rng(seed).integers(0, 31, (3, 7))
    cache = ja.models.run_with_cache(model, ids, passes=3)
    E, states = ja.models.loop(model, ids, passes=3, save_states=range(7))
    assert cache["hidden_states"].shape == (3, 7, 7, 24)
    assert cache["attention_patterns"].shape == (3, 6, 3, 7, 7)
    np.testing.assert_allclose(cache["hidden_states"], states)
    np.testing.assert_allclose(cache["E"], E)
    # pass 1 sees the final-normed output of pass 0, as the loop feeds it
    x = jax.vmap(model.final_norm)(states[:, 2])
    ref = ja.models.attention_patterns(model, ids[0])
    assert np.allclose(cache["attention_patterns"][0, :2], ref, atol=1e-6)
    again = model.block_attention(model.layer_block(0), x[0], 0, None)
    np.testing.assert_allclose(cache["attention_patterns"][0, 2], again, atol=1e-6)
    one = ja.models.run_with_cache(model, ids[0], passes=3)
    assert_same_values(one["attention_patterns"], cache["attention_patterns"][0])
