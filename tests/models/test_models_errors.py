"""Bad input to jaxattn.models: every problem is one clear error that names the file
and the tensor; never a silent partial load. Plus the gguf path on a tiny file
written here (llama.cpp's Q/K permutation applied, then undone by the loader)."""

import json
import os
import shutil
import time

import numpy as np
import pytest

os.environ["HF_HUB_OFFLINE"] = "1"  # tests never download weights
torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

import jax  # noqa: E402

import jaxattn as ja  # noqa: E402
from jaxattn.models import _gguf  # noqa: E402


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory):
    cfg = tf.GPT2Config(n_layer=2, n_embd=48, n_head=4, vocab_size=61, n_positions=32)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("gpt2")
    tf.GPT2Model(cfg).save_pretrained(folder)
    return folder


def copy_folder(src, dst):
    shutil.copytree(src, dst)
    return dst


def edit_config(folder, **changes):
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    cfg.update(changes)
    path.write_text(json.dumps(cfg))


def test_folder_without_config(gpt2_folder, tmp_path):
    folder = copy_folder(gpt2_folder, tmp_path / "m")
    (folder / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"m/config\.json: no config\.json"):
        ja.models.load(folder)


def test_folder_without_weights(gpt2_folder, tmp_path):
    folder = copy_folder(gpt2_folder, tmp_path / "m")
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match=r"no \*\.safetensors.*pytorch_model\.bin"):
        ja.models.load(folder)


def test_truncated_weights_name_file_and_tensor(gpt2_folder, tmp_path):
    folder = copy_folder(gpt2_folder, tmp_path / "m")
    path = folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    with pytest.raises(ValueError, match=r"model\.safetensors: truncated file: tensor '.+'"):
        ja.models.load(folder)
    path.write_bytes(data[:5])
    with pytest.raises(ValueError, match=r"model\.safetensors: truncated"):
        ja.models.load(folder)


def test_a_header_that_is_no_table_of_tensors_is_named(gpt2_folder, tmp_path, monkeypatch):
    """JSON of another shape in a safetensors header ended in a bare TypeError or
    KeyError (a traceback from `jaxattn loop`); a folder given as `~/…` is found."""
    folder = copy_folder(gpt2_folder, tmp_path / "m")
    path = folder / "model.safetensors"
    for header in (b'{"a":1}', b"[1,2,3]", b'{"a":{"dtype":"F32"}}'):
        path.write_bytes(len(header).to_bytes(8, "little") + header)
        with pytest.raises(ValueError, match=r"model\.safetensors: not a safetensors file "
                                             r"\(its header is no table of tensors\)\."):
            ja.models.load(folder)
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "gpt2").symlink_to(gpt2_folder)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert type(ja.models.load("~/gpt2")).__name__ == "GPT2"
    with pytest.raises(ValueError, match="got an empty path"):
        ja.models.load("")


def test_missing_tensor_is_named(gpt2_folder, tmp_path):
    folder = copy_folder(gpt2_folder, tmp_path / "m")
    path = folder / "model.safetensors"
    tensors = safetensors_numpy.load_file(path)
    del tensors["h.1.mlp.c_fc.weight"]
    safetensors_numpy.save_file(tensors, path)
    with pytest.raises(ValueError, match=r"missing tensor 'h\.1\.mlp\.c_fc\.weight'"):
        ja.models.load(folder)


def test_shape_mismatch_names_tensor(gpt2_folder, tmp_path):
    folder = copy_folder(gpt2_folder, tmp_path / "m")
    edit_config(folder, n_inner=100)  # weights have 4·48 = 192
    with pytest.raises(ValueError, match=r"model\.safetensors: tensor 'h\.0\.mlp\.c_fc\.weight' "
                       r"has shape \(48, 192\), but the config implies \(48, 100\)"):
        ja.models.load(folder)


def test_fewer_layers_in_config_is_not_a_silent_partial_load(gpt2_folder, tmp_path):
    folder = copy_folder(gpt2_folder, tmp_path / "m")
    edit_config(folder, n_layer=1)
    with pytest.raises(ValueError, match=r"unexpected tensor 'h\.1\..+': .*config\.json"):
        ja.models.load(folder)


@pytest.mark.parametrize("changes, match", [
    ({"model_type": "t5"}, r"model_type 't5' is not supported.*gpt2"),
    ({"scale_attn_by_inverse_layer_idx": True}, r"scale_attn_by_inverse_layer_idx"),
    # refused by name: it was "unexpected tensor … crossattention …"
    ({"add_cross_attention": True}, r"add_cross_attention=True is not supported"),
])
def test_unsupported_config(gpt2_folder, tmp_path, changes, match):
    folder = copy_folder(gpt2_folder, tmp_path / "m")
    edit_config(folder, **changes)
    with pytest.raises(ValueError, match=match):
        ja.models.load(folder)
    with pytest.raises(ValueError, match=match):
        ja.models.init(folder / "config.json", jax.random.PRNGKey(0))


def test_unsupported_rope_scaling():
    cfg = {"model_type": "llama", "rope_scaling": {"rope_type": "longrope", "factor": 4.0}}
    with pytest.raises(ValueError, match="rotary scaling 'longrope'"):
        ja.models.init(cfg, jax.random.PRNGKey(0))


def test_bad_config_file(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"config\.json: not a valid config\.json"):
        ja.models.init(tmp_path / "config.json", jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="neither a preset"):
        ja.models.init("gpt-7", jax.random.PRNGKey(0))


def test_hub_name_offline_fails_fast_with_a_hint(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t = time.perf_counter()
    with pytest.raises(FileNotFoundError, match=r"'gpt2-xl' is not a local path.*local copy"):
        ja.models.load("gpt2-xl")
    assert time.perf_counter() - t < 10
    with pytest.raises(FileNotFoundError, match="no such file"):
        ja.models.load("./no/such/folder")


def test_bad_ids_and_options(gpt2_folder):
    model = ja.models.load(gpt2_folder)
    with pytest.raises(ValueError, match=r"must lie in \[0, 61\)"):
        ja.models.hidden_states(model, np.array([1, 61]))
    with pytest.raises(TypeError, match="integers"):
        ja.models.hidden_states(model, np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="exceed the model's 32 learned positions: give "
                                         "prompts of at most 32 tokens"):  # (it named no fix)
        ja.models.hidden_states(model, np.zeros(33, int))
    with pytest.raises(ValueError, match=r"\(n,\) or \(B, n\)"):
        ja.models.loop(model, np.zeros((2, 2, 3), int), passes=2)
    with pytest.raises(ValueError, match="passes"):
        ja.models.loop(model, np.zeros(3, int), passes=0)
    with pytest.raises(ValueError, match="weights"):
        ja.models.loop(model, np.zeros(3, int), passes=1, weights="pretrained")
    with pytest.raises(ValueError, match="layer"):
        ja.models.attention_dynamics(model, 2)
    with pytest.raises(TypeError, match="ja.models.load"):
        ja.models.loop(object(), np.zeros(3, int), passes=1)


# --- gguf -------------------------------------------------------------------------


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf.py does to q_proj / k_proj rows."""
    return (w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def test_unpermute_inverts_llama_cpp(seed):
    w = np.random.default_rng(seed).normal(size=(3 * 8, 5))
    assert np.array_equal(_gguf.unpermute(llama_cpp_permute(w, 3), 3), w)
    assert not np.array_equal(llama_cpp_permute(w, 3), w)


def write_gguf(hf, path, arch="llama", scaling=None, heads=None, blocks=None):
    cfg = hf.config
    w = gguf.GGUFWriter(str(path), arch)
    if scaling is not None:  # (llama.rope.scaling.type, factor)
        w.add_rope_scaling_type(gguf.RopeScalingType(scaling[0]))
        w.add_rope_scaling_factor(scaling[1])
    w.add_block_count(cfg.num_hidden_layers if blocks is None else blocks)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads if heads is None else heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    sub = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
           "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
           "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
           "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for name, t in hf.state_dict().items():
        a = t.numpy().astype(np.float32)
        if name.startswith("layers."):
            _, i, rest = name.split(".", 2)
            part = rest.rsplit(".", 1)[0]
            if part == "self_attn.q_proj":
                a = llama_cpp_permute(a, cfg.num_attention_heads)
            elif part == "self_attn.k_proj":
                a = llama_cpp_permute(a, cfg.num_key_value_heads)
            gname = f"blk.{i}.{sub[part]}.weight"
        else:
            gname = {"embed_tokens": "token_embd", "norm": "output_norm"}[name.split(".")[0]]
            gname += ".weight"
        w.add_tensor(gname, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny_llama():
    cfg = tf.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=88, vocab_size=71,
                         max_position_embeddings=64, rope_theta=500.0)
    cfg._attn_implementation = "eager"
    torch.manual_seed(3)
    return tf.LlamaModel(cfg).eval()


def test_tiny_gguf_matches_hf_and_is_cached(tiny_llama, tmp_path, monkeypatch, seed):
    monkeypatch.setenv("JAXATTN_CACHE_DIR", str(tmp_path / "cache"))
    path = write_gguf(tiny_llama, tmp_path / "tiny.gguf")
    calls = []
    real = _gguf.convert
    monkeypatch.setattr(_gguf, "convert", lambda p, check: calls.append(p) or real(p, check))
    model = ja.models.load(path)
    again = ja.models.load(path)
    assert len(calls) == 1 and len(list((tmp_path / "cache").glob("*.npz"))) == 1
    assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), model, again))
    ids = np.random.default_rng(seed).integers(0, 71, (2, 9))
    with torch.no_grad():
        ref = tiny_llama(torch.from_numpy(ids), output_hidden_states=True).hidden_states
    ref = np.stack([h.numpy() for h in ref], axis=1)
    ours = np.asarray(ja.models.hidden_states(model, ids))
    err = np.linalg.norm(ours - ref, axis=(-2, -1)) / np.linalg.norm(ref, axis=(-2, -1))
    assert err.max() <= 1e-4


def test_gguf_rope_scaling_is_read_or_refused(tiny_llama, tmp_path, monkeypatch, seed):
    """llama.cpp's linear rope scaling equals HuggingFace's; another kind is refused by
    name, never ignored (ignored, the hidden states were those of an unscaled model)."""
    monkeypatch.setenv("JAXATTN_CACHE_DIR", str(tmp_path / "cache"))
    cfg = tf.LlamaConfig(**{**tiny_llama.config.to_dict(),
                            "rope_scaling": {"rope_type": "linear", "factor": 4.0}})
    cfg._attn_implementation = "eager"
    scaled = tf.LlamaModel(cfg).eval()
    scaled.load_state_dict(tiny_llama.state_dict())
    model = ja.models.load(write_gguf(scaled, tmp_path / "linear.gguf", scaling=("linear", 4.0)))
    ids = np.random.default_rng(seed).integers(0, 71, (1, 40))
    with torch.no_grad():
        ref = scaled(torch.from_numpy(ids)).last_hidden_state.numpy()
        plain = tiny_llama(torch.from_numpy(ids)).last_hidden_state.numpy()
    ours = np.asarray(ja.models.hidden_states(model, ids))[:, -1]
    err, ignored = (np.linalg.norm(a - ref) / np.linalg.norm(ref) for a in (ours, plain))
    assert err <= 1e-5 < ignored
    path = write_gguf(tiny_llama, tmp_path / "yarn.gguf", scaling=("yarn", 4.0))
    with pytest.raises(ValueError, match=r"yarn\.gguf: gguf rope scaling 'yarn' .* not "
                                         r"implemented for gguf files") as err:
        ja.models.load(path)
    assert "\n" not in str(err.value)


def test_gguf_head_counts_are_refused_before_its_tensors(tiny_llama, tmp_path, monkeypatch):
    """Zero heads ended in a ZeroDivisionError, and heads that do not divide the width
    in NumPy's "cannot reshape" (unpermuting the queries): both are named in one line
    before any tensor is read. A file whose tensors do not fit its config fills no
    cache."""
    monkeypatch.setenv("JAXATTN_CACHE_DIR", str(tmp_path / "cache"))
    for heads, words in ((0, r"`num_attention_heads` must be an integer ≥ 1, got 0"),
                         (3, r"its embedding length 64 is not a multiple of its 3 attention "
                             r"heads")):
        path = write_gguf(tiny_llama, tmp_path / f"h{heads}.gguf", heads=heads)
        with pytest.raises(ValueError, match=rf"h{heads}\.gguf: {words}") as err:
            ja.models.load(path)
        assert "\n" not in str(err.value)
    path = write_gguf(tiny_llama, tmp_path / "blocks.gguf", blocks=1)
    with pytest.raises(ValueError, match=r"unexpected tensor 'layers\.1\."):
        ja.models.load(path)
    assert not list((tmp_path / "cache").glob("*.npz"))


def test_truncated_gguf_is_named(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("JAXATTN_CACHE_DIR", str(tmp_path / "cache"))
    path = write_gguf(tiny_llama, tmp_path / "tiny.gguf")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 4096])
    match = r"tiny\.gguf: truncated file: tensor 'blk\.1\..+' ends at byte"
    with pytest.raises(ValueError, match=match):
        ja.models.load(path)


def test_gguf_of_unsupported_architecture(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("JAXATTN_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "other.gguf"
    w = gguf.GGUFWriter(str(path), "gemma")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    match = r"other\.gguf: gguf architecture 'gemma' is not supported"
    with pytest.raises(ValueError, match=match):
        ja.models.load(path)


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
def test_init_reads_packaged_names_and_gguf_files_and_refuses_what_cannot_fit(monkeypatch):
    """`init` took presets and config.json only: a packaged name was "neither a preset",
    a .gguf file "not a valid config.json"; a config whose sizes a mixed spelling left at
    Llama's defaults (7B) ended in XLA's RESOURCE_EXHAUSTED; `load(None)` in pathlib."""
    from _helpers import MINILM, SMOLLM

    from jaxattn.models import _load, packaged_path

    key = jax.random.PRNGKey(0)
    for name, width in ((SMOLLM, 576), (MINILM, 384)):
        if packaged_path(name) is None:
            continue
        assert ja.models.init(name, key).config.hidden_size == width
        assert ja.models.resolve_config(packaged_path(name))[0].hidden_size == width
    mixed = dict(ja.models.PRESETS["gpt2"], n_layer=1, n_embd=32, n_head=4, model_type="llama")
    monkeypatch.setattr(_load, "machine_memory", lambda: 8 * 10**9)
    with pytest.raises(ValueError, match=r"the weights of this llama config \(32 layers, "
                                         r"width 4096\) need 2\d.\d GB, more than this "
                                         r"machine's memory \(8 GB\)"):
        ja.models.init(mixed, key)
    with pytest.raises(TypeError, match="ja.models.load takes a model folder, .* got NoneType"):
        ja.models.load(None)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match=r"init a preset: `ja.models.init\(PRESET"):
        ja.models.load("no-such-model")  # `init('no-such-model')` fails too: not offered
