"""Looped models' next-token logits and predictions (`ja.models.logits`,
`ja.models.predict`), padding kept out of the dynamics (`mask=`), and a loaded
model's own tokenizer (`model.tokenize`, `model.detokenize`).

References: HuggingFace's LM-head models (`GPT2LMHeadModel`, `LlamaForCausalLM`,
float32, eager attention) for one pass, and their blocks looped by hand for
several; for the mask, each prompt run alone, unpadded."""

import os
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import MINILM, SMOLLM, assert_same_values, needs_minilm, needs_smollm

import jaxattn as ja
from jaxattn.models import _tokenize

os.environ["HF_HUB_OFFLINE"] = "1"  # tests never download weights
TOL = 1e-4  # as tests/models/test_models_parity.py: relative error of float32 against HF
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Attention is all you need.",
         "Hello there"]


def rel_error(ours, ref) -> float:
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    return float(np.max(np.linalg.norm(ours - ref, axis=(-2, -1))
                        / np.linalg.norm(ref, axis=(-2, -1))))


# --- logits against HuggingFace -----------------------------------------------------


def hf_lm(family: str, tied: bool = True):
    """A small random LM-head model, every parameter perturbed (norms included)."""
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("transformers")
    if family == "gpt2":
        cfg = tf.GPT2Config(n_layer=3, n_embd=96, n_head=4, vocab_size=101, n_positions=40,
                            n_inner=136, tie_word_embeddings=tied)
        cls = tf.GPT2LMHeadModel
    elif family == "gpt_neo":
        cfg = tf.GPTNeoConfig(num_layers=2, hidden_size=96, num_heads=4, vocab_size=103,
                              max_position_embeddings=40, window_size=5,
                              attention_types=[[["global", "local"], 1]],
                              tie_word_embeddings=tied)
        cls = tf.GPTNeoForCausalLM
    else:
        cfg = tf.LlamaConfig(num_hidden_layers=3, hidden_size=96, num_attention_heads=6,
                             num_key_value_heads=2, intermediate_size=136, vocab_size=107,
                             max_position_embeddings=64, rope_theta=1000.0,
                             tie_word_embeddings=tied)
        cls = tf.LlamaForCausalLM
    cfg._attn_implementation = "eager"
    torch.manual_seed(11)
    model = cls(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def hf_looped_logits(hf, ids, passes: int) -> np.ndarray:
    """`passes` passes of HF's own blocks (final norm between passes, as
    `ja.models.loop`), then HF's `lm_head`."""
    import torch

    n = ids.shape[1]
    mask = torch.full((n, n), torch.finfo(torch.float32).min).triu(1)[None, None]
    with torch.no_grad():
        t = torch.from_numpy(ids)
        if hasattr(hf, "transformer"):  # GPT-2
            base = hf.transformer
            h = base.wte(t) + base.wpe(torch.arange(n)[None])
            layers, norm, extra = base.h, base.ln_f, {}
        else:  # Llama: rotary tables from HF's own rotary module
            base = hf.model
            h = base.embed_tokens(t)
            extra = {"position_embeddings": base.rotary_emb(h, torch.arange(n)[None]),
                     "position_ids": torch.arange(n)[None]}
            layers, norm = base.layers, base.norm
        for _ in range(passes):
            for block in layers:
                h = block(h, attention_mask=mask, **extra)
                h = h[0] if isinstance(h, tuple) else h
            h = norm(h)
        return hf.lm_head(h).numpy()


@pytest.mark.parametrize("family,tied", [("gpt2", True), ("llama", True), ("llama", False),
                                         # GPT-2's and GPT-Neo's own heads were dropped
                                         ("gpt2", False), ("gpt_neo", False)])
def test_one_pass_logits_are_huggingfaces(tmp_path, family, tied, seed):
    import torch

    hf = hf_lm(family, tied)
    hf.save_pretrained(tmp_path)
    model = ja.models.load(tmp_path)
    # an untied checkpoint's own head is read, a tied one shares the token embedding
    assert (model.lm_head is None) == tied
    ids = np.random.default_rng(seed).integers(0, hf.config.vocab_size, (2, 11))
    with torch.no_grad():
        ref = hf(torch.from_numpy(ids)).logits.numpy()
    ours = ja.models.logits(model, ids)
    assert ours.shape == ref.shape == (2, 11, hf.config.vocab_size)
    assert ours.dtype == jnp.float32
    err = rel_error(ours, ref)
    print(f"{family} (tied {tied}): max relative error {err:.2e}")
    assert err <= TOL
    np.testing.assert_array_equal(ja.models.predict(model, ids), ref.argmax(-1))
    # one prompt and a batch of two are two programs: equal to rounding
    assert_same_values(ja.models.logits(model, ids[0]), ours[0])


def _rewrite_checkpoint(folder, change) -> None:
    from safetensors.numpy import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    change(tensors)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def test_a_tied_llama_with_a_head_of_its_own_reads_it_as_huggingface(tmp_path, seed):
    """A tied checkpoint with an `lm_head.weight` that differs from the embedding:
    HuggingFace does not tie them and reads the head, and so does jaxattn."""
    import torch
    import transformers

    hf = hf_lm("llama", tied=True)
    hf.save_pretrained(tmp_path)
    rng = np.random.default_rng(seed)
    _rewrite_checkpoint(tmp_path, lambda t: t.__setitem__(
        "lm_head.weight", rng.normal(size=t["model.embed_tokens.weight"].shape)
        .astype(np.float32)))
    ref_model = transformers.LlamaForCausalLM.from_pretrained(tmp_path,
                                                              attn_implementation="eager")
    ids = rng.integers(0, hf.config.vocab_size, (1, 9))
    with torch.no_grad():
        ref = ref_model(torch.from_numpy(ids)).logits.numpy()
    model = ja.models.load(tmp_path)
    assert model.lm_head is not None
    assert rel_error(ja.models.logits(model, ids), ref) <= TOL


def test_an_untied_llama_without_its_head_loads_and_refuses_logits(tmp_path, seed):
    """Untied (`tie_word_embeddings` false, or missing: HuggingFace's default for
    Llama) and no `lm_head.weight`: the hidden states load; `logits` says why not."""
    hf = hf_lm("llama", tied=False)
    hf.save_pretrained(tmp_path)
    _rewrite_checkpoint(tmp_path, lambda t: t.pop("lm_head.weight"))
    model = ja.models.load(tmp_path)
    ids = np.random.default_rng(seed).integers(0, hf.config.vocab_size, (1, 7))
    assert ja.models.hidden_states(model, ids).shape[-2:] == (7, 96)
    with pytest.raises(ValueError, match=r"no lm_head\.weight .* tie_word_embeddings: "
                                         r"false") as e:
        ja.models.logits(model, ids)
    assert "\n" not in str(e.value)


def test_an_initialised_llama_has_the_head_its_config_asks_for(key):
    cfg = {"model_type": "llama", "num_hidden_layers": 1, "hidden_size": 16,
           "num_attention_heads": 2, "intermediate_size": 24, "vocab_size": 31,
           "max_position_embeddings": 16}
    untied = ja.models.init(cfg, key)  # HuggingFace's default for Llama: untied
    tied = ja.models.init(cfg | {"tie_word_embeddings": True}, key)
    assert tied.lm_head is None and untied.lm_head.shape == (31, 16)
    assert not np.array_equal(untied.lm_head, untied.embed_tokens)
    assert np.array_equal(untied.embed_tokens, tied.embed_tokens)


@pytest.mark.parametrize("family,tied", [("gpt2", True), ("llama", False)])
def test_k_passes_are_hfs_blocks_looped_k_times(tmp_path, family, tied, seed):
    hf = hf_lm(family, tied)
    hf.save_pretrained(tmp_path)
    model = ja.models.load(tmp_path)
    ids = np.random.default_rng(seed).integers(0, hf.config.vocab_size, (2, 9))
    both = np.asarray(ja.models.logits(model, ids, passes=[3, 1]))
    assert both.shape == (2, 2, 9, hf.config.vocab_size)
    for i, k in enumerate((3, 1)):
        ref = hf_looped_logits(hf, ids, k)
        err = rel_error(both[:, i], ref)
        print(f"{family}, {k} passes: max relative error {err:.2e}")
        assert err <= TOL
        np.testing.assert_allclose(ja.models.logits(model, ids, passes=k), both[:, i],
                                   rtol=1e-5, atol=1e-5)
    assert not np.allclose(both[:, 0], both[:, 1], rtol=1e-2)  # the passes did something


def test_logits_are_the_final_norm_of_the_looped_state_through_the_head(seed):
    """k passes of `ja.models.loop` (its saved state after the last block), the final
    norm, the tied head: the logits, in float64."""
    model = ja.models.init({"model_type": "gpt2", "n_layer": 2, "n_embd": 24, "n_head": 3,
                            "vocab_size": 53, "n_positions": 16}, jax.random.PRNGKey(seed))
    ids = np.random.default_rng(seed).integers(0, 53, (3, 7))
    for k in (1, 4):
        _, states = ja.models.loop(model, ids, passes=k, dtype=jnp.float64,
                                   save_states=[2 * k])
        x = jax.vmap(model.final_norm)(states[:, 0])
        want = np.einsum("bnd,vd->bnv", np.asarray(x), np.asarray(model.wte, np.float64))
        got = ja.models.logits(model, ids, passes=k, dtype=jnp.float64)
        assert got.dtype == jnp.float64
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_logits_refusals():
    bert = ja.models.init({"model_type": "bert", "num_hidden_layers": 1, "hidden_size": 16,
                           "num_attention_heads": 2, "intermediate_size": 20,
                           "vocab_size": 30}, jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="Bert .* no next-token head") as info:
        ja.models.logits(bert, np.zeros((1, 4), int))
    assert len(str(info.value).splitlines()) == 1
    gpt = ja.models.init({"model_type": "gpt2", "n_layer": 1, "n_embd": 16, "n_head": 2,
                          "vocab_size": 30, "n_positions": 8}, jax.random.PRNGKey(0))
    for bad in (0, [], [2, 0], "3", True, 2.0):
        with pytest.raises(ValueError, match="`passes`"):
            ja.models.logits(gpt, np.zeros((1, 4), int), passes=bad)


# --- padding kept out of the dynamics ------------------------------------------------


def tiny(model_type: str, key):
    if model_type == "gpt2":
        cfg = {"model_type": "gpt2", "n_layer": 2, "n_embd": 24, "n_head": 3,
               "vocab_size": 61, "n_positions": 20}
    else:
        cfg = {"model_type": "bert", "num_hidden_layers": 2, "hidden_size": 24,
               "num_attention_heads": 3, "intermediate_size": 40, "vocab_size": 61,
               "max_position_embeddings": 20}
    return ja.models.init(cfg, key)


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
@pytest.mark.parametrize("model_type", ["gpt2", "bert"])
def test_masked_padding_leaves_the_text_tokens_as_if_alone(model_type, key, seed):
    """Prompts of 6 and 1 tokens padded to 9 with random ids: with the mask, each
    prompt's `E`, hidden states and logits are those of the prompt run alone (to
    rounding: float64 loops, float32 hidden states); without it, a bidirectional
    model's text tokens change."""
    model = tiny(model_type, key)
    rng = np.random.default_rng(seed)
    lengths, n = (6, 1), 9
    ids = rng.integers(0, 61, (2, n))
    mask = np.arange(n) < np.asarray(lengths)[:, None]
    E = ja.models.loop(model, ids, passes=3, mask=mask, dtype=jnp.float64)
    hs = ja.models.hidden_states(model, ids, mask=mask)
    for i, m in enumerate(lengths):
        alone = ids[i, :m]
        np.testing.assert_allclose(E[i], ja.models.loop(model, alone, passes=3,
                                                        dtype=jnp.float64),
                                   rtol=1e-12, atol=1e-14)
        assert rel_error(hs[i, :, :m], ja.models.hidden_states(model, alone)) <= 1e-6  # f32
    # one text token: consensus by definition, to rounding (the padding rows are
    # copies of it inside `E`)
    assert float(np.max(E[1])) <= ja.metrics.misalignment_floor(jnp.float64, n, 24)
    if model_type == "gpt2":
        logits = ja.models.logits(model, ids, passes=[1, 3], mask=mask, dtype=jnp.float64)
        np.testing.assert_allclose(
            logits[0, :, :6], ja.models.logits(model, ids[0, :6], passes=[1, 3],
                                               dtype=jnp.float64), rtol=1e-12, atol=1e-12)
    else:  # the mask is what keeps the padding out
        unmasked = ja.models.hidden_states(model, ids)
        assert not np.allclose(unmasked[0, :, :6], hs[0, :, :6], rtol=1e-3)


def test_masked_loop_is_the_same_segmented_sharded_and_chunked(key, seed):
    model = tiny("bert", key)
    ids = np.random.default_rng(seed).integers(0, 61, (5, 8))
    mask = np.arange(8) < np.asarray([8, 3, 5, 1, 6])[:, None]
    whole = ja.models.loop(model, ids, passes=4, mask=mask, progress=False)
    for options in ({"devices": len(jax.devices())}, {"chunk": 2}):
        np.testing.assert_allclose(ja.models.loop(model, ids, passes=4, mask=mask, **options),
                                   whole, rtol=1e-6, atol=1e-7)
    setup = ja.models.setup_loop(model, ids, passes=4, mask=mask)
    parts = [seg.values for seg in ja.models.iterate_loop(setup, every=2)]
    np.testing.assert_allclose(np.concatenate(parts, axis=1), whole, rtol=1e-6, atol=1e-7)


def test_bad_masks_are_refused_in_one_line(key):
    model = tiny("gpt2", key)
    ids = np.zeros((2, 4), int)
    good = np.ones((2, 4), bool)
    cases = [
        (np.ones((2, 3), bool), ValueError, "shape"),
        (np.ones((2, 4), int), TypeError, "dtype"),
        (np.asarray([[1, 0, 1, 1], [1, 1, 1, 1]], bool), ValueError, "row 0"),
        (np.asarray([[1, 1, 1, 1], [0, 0, 0, 0]], bool), ValueError, "row 1"),
        (np.asarray([[0, 1, 1, 1], [1, 1, 1, 1]], bool), ValueError, "row 0"),
    ]
    for mask, error, match in cases:
        for call in (ja.models.loop, ja.models.logits):
            with pytest.raises(error, match=match) as info:
                call(model, ids, passes=1, mask=mask)
            assert len(str(info.value).splitlines()) == 1
    with pytest.raises(ValueError, match="observe"):
        ja.models.loop(model, ids, passes=1, mask=good, observe=ja.metrics.misalignment)


# --- real text: the packaged models and their tokenizers -----------------------------


@needs_minilm
def test_minilm_real_prompts_padded_loop_as_if_alone():
    """Three sentences of different lengths through MiniLM (bidirectional) with the
    tokenizer it was loaded with: every word kept, each prompt's `E` its own."""
    model = ja.models.load(MINILM)
    assert model.tokenizer_file.endswith("tokenizer.json")
    # float64 weights: the comparison is then to float64 rounding (float32 embeddings
    # of prompts of other lengths already differ by an ulp)
    model = jax.tree.map(lambda a: a.astype(jnp.float64) if eqx.is_inexact_array(a) else a,
                         model)
    ids, mask = model.tokenize(TEXTS, pad="auto", return_mask=True)
    np.testing.assert_array_equal(ids, ja.models.tokenize(MINILM, TEXTS, pad="auto"))
    assert ids.shape[1] == mask.sum(1).max() and mask.dtype == bool
    kept = model.detokenize([row[m] for row, m in zip(ids, mask)][0], special_tokens=False)
    assert kept == TEXTS[0].lower()
    E = ja.models.loop(model, ids, passes=2, mask=mask, dtype=jnp.float64)
    for i, text in enumerate(TEXTS):
        alone = model.tokenize(text)
        assert alone.tolist() == ids[i, : mask[i].sum()].tolist()
        np.testing.assert_allclose(E[i], ja.models.loop(model, alone, passes=2,
                                                        dtype=jnp.float64),
                                   rtol=1e-10, atol=1e-12)


@needs_minilm
def test_a_cut_names_the_prompts_and_the_words_it_drops():
    with pytest.warns(UserWarning, match=r"prompt 0 loses \d+ \('.*lazy dog") as record:
        ids = ja.models.tokenize(MINILM, TEXTS)
    message = str(record[0].message)
    assert "prompt 1 loses" in message and "prompt 2" not in message  # the shortest
    assert ids.shape[1] == len(ja.models.tokenize(MINILM, TEXTS[2]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # padding: nothing cut, no warning
        ja.models.tokenize(MINILM, TEXTS, pad="auto")
    with pytest.warns(UserWarning, match="`tokens` asked for, 3"):  # a cut always warns
        ja.models.tokenize(MINILM, TEXTS, tokens=3)


@needs_minilm
def test_a_models_tokenizer_is_built_once(key):
    model = ja.models.load(MINILM)
    model.tokenize(TEXTS[0])
    before = _tokenize._built_tokenizer.cache_info()
    for _ in range(3):
        model.detokenize(model.tokenize(TEXTS))
    after = _tokenize._built_tokenizer.cache_info()
    assert after.misses == before.misses and after.hits >= before.hits + 6


def test_a_model_without_a_tokenizer_says_so_in_one_line(key, tmp_path):
    model = tiny("gpt2", key)
    assert model.tokenizer_file is None
    for call in (lambda: model.tokenize("a"), lambda: model.detokenize([1, 2])):
        with pytest.raises(ValueError, match="carries no tokenizer") as info:
            call()
        assert len(str(info.value).splitlines()) == 1


@needs_smollm
@pytest.mark.slow  # a 135M-parameter gguf
def test_smollm2_predicts_after_passes_with_its_own_tokenizer():
    """SmolLM2 (its head tied to the token embedding) carries the gguf's tokenizer;
    padded prompts predict as each alone, after one pass and after four."""
    model = ja.models.load(SMOLLM)
    assert model.lm_head is None and model.tokenizer_file.endswith(".gguf")
    ids, mask = model.tokenize(TEXTS[:2], pad="auto", return_mask=True)
    np.testing.assert_array_equal(ids, ja.models.tokenize(SMOLLM, TEXTS[:2], pad="auto"))
    both = ja.models.logits(model, ids, passes=[1, 4], mask=mask)
    m = int(mask[1].sum())
    alone = ja.models.logits(model, ids[1, :m], passes=[1, 4])
    assert rel_error(both[1, :, :m], alone) <= 1e-5  # float32 rounding
    predicted = ja.models.predict(model, ids, passes=[1, 4], mask=mask)
    assert predicted.shape == (2, 2) + ids.shape[1:] and predicted.dtype == jnp.int32
    np.testing.assert_array_equal(predicted, np.argmax(both, axis=-1))
    words = model.detokenize(predicted[:, 0])
    assert len(words) == 2 and all(isinstance(w, str) and w for w in words)
