"""`jaxattn loop` for real users: a resume after the weights, tokenizer or prompts
changed is refused in one line (content hashes in config.json); `--text` takes
ordinary sentences (`--tokens` defaults to the shortest prompt, `--pad` pads);
`ja.models.detokenize` shows the tokens kept; `--grid --no-progress` draws no bar;
`ja.models.tokenize` names the argument of every bad input."""

import hashlib
import json
import os

import numpy as np
import pytest

os.environ["HF_HUB_OFFLINE"] = "1"  # tests never download weights
tokenizers = pytest.importorskip("tokenizers")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

import jaxattn as ja  # noqa: E402
from jaxattn._artifacts.folders import RunFolderError  # noqa: E402
from jaxattn.cli import main  # noqa: E402
from jaxattn.cli.experiments import verdict_status  # noqa: E402
from jaxattn.experiments import loop_grid, loop_runner  # noqa: E402

D, LAYERS, POSITIONS = 12, 2, 16
WORDS = ["[UNK]", "[PAD]", "the", "cat", "sat", "on", "a", "mat", "dog", "ran", "far", "away",
         "and", "then", "slept"]
GPT2 = {"model_type": "gpt2", "n_layer": LAYERS, "n_embd": D, "n_head": 3,
        "vocab_size": len(WORDS) + 2, "n_positions": POSITIONS}
SENTENCES = ["the cat sat on a mat", "a dog ran far away and then slept", "the dog sat"]


def gpt2_tensors(seed: int) -> dict[str, np.ndarray]:
    """Every tensor of the tiny GPT-2 (HuggingFace names and layouts)."""
    rng = np.random.default_rng(seed)
    shapes = {"wte.weight": (GPT2["vocab_size"], D), "wpe.weight": (POSITIONS, D),
              "ln_f.weight": (D,), "ln_f.bias": (D,)}
    for i in range(LAYERS):
        for part, shape in [("ln_1.weight", (D,)), ("ln_1.bias", (D,)),
                            ("attn.c_attn.weight", (D, 3 * D)), ("attn.c_attn.bias", (3 * D,)),
                            ("attn.c_proj.weight", (D, D)), ("attn.c_proj.bias", (D,)),
                            ("ln_2.weight", (D,)), ("ln_2.bias", (D,)),
                            ("mlp.c_fc.weight", (D, 4 * D)), ("mlp.c_fc.bias", (4 * D,)),
                            ("mlp.c_proj.weight", (4 * D, D)), ("mlp.c_proj.bias", (D,))]:
            shapes[f"h.{i}.{part}"] = shape
    return {k: (0.3 * rng.normal(size=s)).astype(np.float32) for k, s in shapes.items()}


def save_tokenizer(path, words=WORDS) -> None:
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(
        {w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.decoder = tokenizers.decoders.WordPiece()  # words joined by spaces
    tok.add_special_tokens(["[UNK]", "[PAD]"])
    tok.save(str(path))


@pytest.fixture
def model_folder(tmp_path):
    """A tiny GPT-2 folder with trained-looking weights and a word-level tokenizer."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(GPT2))
    safetensors_numpy.save_file(gpt2_tensors(0), folder / "model.safetensors")
    save_tokenizer(folder / "tokenizer.json")
    return folder


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(SENTENCES) + "\n")
    return path


def interrupted_loop(monkeypatch, folder, out, **kw):
    """A loop stopped by Ctrl-C after its first chunk (as a kill leaves it)."""
    real = loop_runner._save_carry

    def stop(*args):
        real(*args)
        raise KeyboardInterrupt

    monkeypatch.setattr(loop_runner, "_save_carry", stop)
    with pytest.raises(KeyboardInterrupt):
        loop_runner.run_loop(str(folder), out, passes=4, chunk_passes=2, progress=False,
                             log=None, **kw)
    monkeypatch.setattr(loop_runner, "_save_carry", real)
    assert (out / "chunks" / "carry.npz").exists() and not (out / "data.npz").exists()


def resume_argv(folder, out, *extra):
    return ["loop", "--model", str(folder), "--passes", "4", "--chunk-passes", "2",
            "--no-progress", "--out", str(out), "--resume", *extra]


def test_resume_after_the_weights_changed_is_refused(model_folder, tmp_path, monkeypatch,
                                                     capsys):
    """Rewriting model.safetensors under a stopped loop: the resume names the file and
    the fix in one line, and writes nothing; with the file restored it finishes, to
    the uninterrupted loop's E."""
    out = tmp_path / "run"
    interrupted_loop(monkeypatch, model_folder, out, prompts=2, tokens=5)
    weights = model_folder / "model.safetensors"
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["weights_sha256"] == {
        "model.safetensors": hashlib.sha256(weights.read_bytes()).hexdigest()}
    original = weights.read_bytes()
    safetensors_numpy.save_file(gpt2_tensors(1), weights)
    chunks = sorted(p.name for p in (out / "chunks").iterdir())
    argv = resume_argv(model_folder, out, "--prompts", "2", "--tokens", "5")
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "weight file model.safetensors" in err and "changed" in err
    assert "restore the file" in err and "another --out" in err
    assert sorted(p.name for p in (out / "chunks").iterdir()) == chunks
    assert not (out / "data.npz").exists()

    weights.write_bytes(original)
    assert main(argv) == 0
    alone = loop_runner.run_loop(str(model_folder), tmp_path / "alone", passes=4,
                                 chunk_passes=2, prompts=2, tokens=5, progress=False, log=None)
    np.testing.assert_array_equal(np.load(out / "data.npz")["E"],
                                  np.load(alone / "data.npz")["E"])


def test_resume_after_the_tokenizer_or_prompts_changed_is_refused(model_folder, prompts,
                                                                  tmp_path, monkeypatch):
    out = tmp_path / "run"
    interrupted_loop(monkeypatch, model_folder, out, text=prompts)
    cfg = json.loads((out / "config.json").read_text())
    tokenizer = model_folder / "tokenizer.json"
    assert cfg["tokenizer_sha256"] == {
        "tokenizer.json": hashlib.sha256(tokenizer.read_bytes()).hexdigest()}
    kw = dict(passes=4, chunk_passes=2, progress=False, log=None, resume=True, text=prompts)
    original = tokenizer.read_bytes()
    save_tokenizer(tokenizer, WORDS[:2] + WORDS[2:][::-1])  # other ids, same words
    with pytest.raises(RunFolderError, match="tokenizer file tokenizer.json .*changed") as e:
        loop_runner.run_loop(str(model_folder), out, **kw)
    assert len(str(e.value).splitlines()) == 1
    tokenizer.write_bytes(original)
    prompts.write_text("the dog ran far away\nthe cat slept on a mat\n")
    with pytest.raises(RunFolderError, match=f"prompts file {prompts} changed"):
        loop_runner.run_loop(str(model_folder), out, **kw)
    prompts.write_text("\n".join(SENTENCES) + "\n\n")  # a blank line more: the same prompts
    assert (loop_runner.run_loop(str(model_folder), out, **kw) / "summary.json").exists()


def test_text_takes_ordinary_sentences(model_folder, prompts, tmp_path, capsys):
    """No --tokens: every prompt is cut to the shortest (3 words); the output shows
    the tokens kept and names ja.models.detokenize."""
    out = tmp_path / "run"
    argv = ["loop", "--model", str(model_folder), "--text", str(prompts), "--passes", "1",
            "--no-progress"]
    assert main([*argv, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    ids = np.load(out / "data.npz")["ids"]
    with pytest.warns(UserWarning, match=r"prompt 0 loses 3 \('on a mat'\)"):
        want = ja.models.tokenize(model_folder, SENTENCES)
    assert want.shape == (3, 3)
    np.testing.assert_array_equal(ids, want)
    assert "3×3 tokens" in printed and "'the cat sat'" in printed
    assert "ja.models.detokenize" in printed
    assert ja.models.detokenize(model_folder, ids) == ["the cat sat", "a dog ran", "the dog sat"]
    # what the cut dropped is said, prompt by prompt
    assert "prompt 0 cut to 3 tokens: it lost 3 ('on a mat')" in printed, printed
    assert "prompt 1 cut to 3 tokens: it lost 5 ('far away and then slept')" in printed
    assert "prompt 2 cut" not in printed


def test_pad_pads_shorter_prompts(model_folder, prompts, tmp_path, capsys):
    """--pad without an id: the tokenizer's [PAD], to the longest prompt; with an id
    and --tokens, that id; --help says how padding is treated."""
    argv = ["loop", "--model", str(model_folder), "--text", str(prompts), "--passes", "1",
            "--no-progress"]
    assert main([*argv, "--pad", "--out", str(tmp_path / "a")]) == 0
    ids = np.load(tmp_path / "a" / "data.npz")["ids"]
    assert ids.shape == (3, 8) and ids[2, 3:].tolist() == [WORDS.index("[PAD]")] * 5
    assert ja.models.detokenize(model_folder, ids[2], special_tokens=False) == "the dog sat"
    assert main([*argv, "--pad", "0", "--tokens", "7", "--out", str(tmp_path / "b")]) == 0
    ids = np.load(tmp_path / "b" / "data.npz")["ids"]
    assert ids.shape == (3, 7) and ids[0, 6] == 0 and ids[1, 6] != 0
    capsys.readouterr()
    assert main([*argv, "--tokens", "7", "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip()
    assert "fewer than 7" in err and "--pad" in err and len(err.splitlines()) == 1
    for bad in (["--pad", "-1"], ["--pad", "x"]):
        assert main([*argv, *bad]) == 2
        assert "--pad takes a token id" in capsys.readouterr().err
    assert main(["loop", "--model", str(model_folder), "--pad", "1", "--passes", "1",
                 "--out", str(tmp_path / "d")]) == 2
    assert "--pad applies to --text" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["loop", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--pad [ID]" in help_text and "The padding is masked" in help_text


def test_padding_is_masked_out_of_the_loop(model_folder, prompts, tmp_path):
    """--pad: a padded prompt's E is that of the prompt looped alone (no token attends
    to the padding, and E counts the text tokens); data.npz keeps the mask."""
    argv = ["loop", "--model", str(model_folder), "--passes", "2", "--no-progress"]
    assert main([*argv, "--text", str(prompts), "--pad", "--out", str(tmp_path / "all")]) == 0
    data = np.load(tmp_path / "all" / "data.npz")
    np.testing.assert_array_equal(data["mask"], data["ids"] != WORDS.index("[PAD]"))
    alone = tmp_path / "alone.txt"
    alone.write_text(SENTENCES[2] + "\n")  # the shortest: padded with 5 [PAD] above
    assert main([*argv, "--text", str(alone), "--out", str(tmp_path / "one")]) == 0
    np.testing.assert_allclose(data["E"][2], np.load(tmp_path / "one" / "data.npz")["E"][0],
                               rtol=1e-5, atol=1e-7)  # float32: two programs


def test_grid_no_progress_draws_no_bar(tmp_path, monkeypatch):
    """Each of the grid's loops is told `progress=False` (a long one otherwise
    draws its own bar)."""
    asked = []

    def spy(*args, progress=None, **kw):
        asked.append(progress)
        return real(*args, **kw)

    real = loop_grid.loop
    monkeypatch.setattr(loop_grid, "loop", spy)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(GPT2))
    argv = ["loop", "--grid", "--model", str(config), "--passes", "2", "--prompts", "2",
            "--tokens", "3"]
    code = main([*argv, "--out", str(tmp_path / "quiet"), "--no-progress"])
    # 0, or 3/4 when the verdict is against or undecided (`jaxattn run loop-grid`'s status)
    assert code == verdict_status(json.loads((tmp_path / "quiet" / "summary.json").read_text()))[0]
    assert asked == [False] * 4  # random and resample weights, with and without FFN


def test_tokenize_names_the_bad_argument(model_folder):
    cases = [((model_folder, None), {}, TypeError, "`texts` must be a string or a non-empty"),
             ((model_folder, ["a", 3]), {}, TypeError, "`texts` .* holding a int"),
             ((model_folder, SENTENCES), {"pad": -1}, ValueError, "`pad` must be None"),
             ((model_folder, SENTENCES), {"pad": 2.5}, TypeError, "`pad` must be None"),
             ((model_folder, SENTENCES), {"pad": 99}, ValueError, "`pad` 99 is not an id"),
             ((model_folder, SENTENCES), {"special_tokens": None}, TypeError,
              "`special_tokens` must be True or False"),
             ((None, SENTENCES), {}, TypeError, "`source` must be the folder")]
    for args, kw, error, match in cases:
        with pytest.raises(error, match=match) as e:
            ja.models.tokenize(*args, **kw)
        assert len(str(e.value).splitlines()) == 1


def test_detokenize_inverts_tokenize_and_names_bad_ids(model_folder):
    ids = ja.models.tokenize(model_folder, SENTENCES, pad=1)
    texts = ja.models.detokenize(model_folder, ids, special_tokens=False)
    assert texts == SENTENCES
    assert ja.models.detokenize(model_folder, ids[1].tolist()) == SENTENCES[1]
    for bad, error, match in [("the", TypeError, "integer token ids"),
                              (np.zeros(3), TypeError, "dtype float64"),
                              (np.zeros((1, 2, 3), int), ValueError, r"shape \(1, 2, 3\)"),
                              ([[2, 3], [4]], ValueError, "different lengths"),
                              ([2, len(WORDS)], ValueError, f"holds {len(WORDS)}")]:
        with pytest.raises(error, match=match):
            ja.models.detokenize(model_folder, bad)


def test_weight_files_are_what_load_reads(model_folder):
    assert ja.models.weight_files(model_folder) == [model_folder / "model.safetensors"]
    assert ja.models.weight_files(model_folder / "config.json") == ja.models.weight_files(
        model_folder)
    model = ja.models.load(model_folder)
    assert model.config.vocab_size == GPT2["vocab_size"]
    assert ja.models.file_sha256(model_folder / "config.json") == hashlib.sha256(
        (model_folder / "config.json").read_bytes()).hexdigest()


def test_resume_names_the_same_model_by_another_path(model_folder, tmp_path, monkeypatch):
    """The model folder given again through a symbolic link (or a relative path): the
    same model, resumed; the recorded name stays the one the loop began with."""
    out = tmp_path / "run"
    interrupted_loop(monkeypatch, model_folder, out, prompts=2, tokens=5)
    link = tmp_path / "link"
    link.symlink_to(model_folder)
    assert main(resume_argv(link, out, "--prompts", "2", "--tokens", "5")) == 0
    assert json.loads((out / "config.json").read_text())["model"] == str(model_folder)
    assert (out / "data.npz").exists()


def test_run_and_sweep_into_an_unfinished_loop_folder_say_it_is_a_loop(model_folder, tmp_path,
                                                                       monkeypatch, capsys):
    out = tmp_path / "run"
    interrupted_loop(monkeypatch, model_folder, out, prompts=2, tokens=5)
    for argv in (["run", "thm41-sphere", "--saves", "10", "--out", str(out)],
                 ["sweep", "thm41-sphere", "--instances", "2", "--out", str(out)]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "`jaxattn loop`" in err, err
        assert "dtype" not in err, err


def test_resume_with_another_model_names_the_flag(model_folder, tmp_path, monkeypatch, capsys):
    """Another --model under a stopped loop: "another --model", not a weight file that
    "is new"."""
    out = tmp_path / "run"
    interrupted_loop(monkeypatch, model_folder, out, prompts=2, tokens=5)
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps(GPT2))
    safetensors_numpy.save_file(gpt2_tensors(1), other / "model.safetensors")
    assert main(resume_argv(other, out, "--prompts", "2", "--tokens", "5")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is new" not in err, err
    assert f"another --model ({model_folder}, not {other})" in err, err


def test_tokenize_warns_whenever_it_cuts_and_names_a_json_that_is_no_tokenizer(model_folder):
    import warnings

    for pad in (None, 1):  # an asked-for length cuts too, padded or not
        with pytest.warns(UserWarning, match=r"`tokens` asked for, 3: prompt 0 loses 3"):
            ja.models.tokenize(model_folder, SENTENCES[:1], tokens=3, pad=pad)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing cut: no warning
        ja.models.tokenize(model_folder, SENTENCES, pad=1)
    with pytest.raises(ValueError, match=r"config\.json is not a tokenizer\.json") as e:
        ja.models.tokenize(model_folder / "config.json", ["a"])
    assert len(str(e.value).splitlines()) == 1
