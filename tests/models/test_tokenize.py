"""`ja.models.tokenize`: prompts as ids with a model's own tokenizer (the packaged
MiniLM's tokenizer.json, the packaged SmolLM2's gguf vocabulary), cut to a common
length without made-up padding, and `jaxattn loop --text`."""

import json
import sys

import numpy as np
import pytest
from _helpers import MINILM, SMOLLM, needs_minilm, needs_smollm

import jaxattn as ja
from jaxattn.cli import main
from jaxattn.models import packaged_path

pytest.importorskip("tokenizers")
TEXTS = ["The quick brown fox jumps over the lazy dog 12345.",
         "Attention is all you need, they said in 2017!"]


def vocabulary() -> dict[str, int]:
    lines = (packaged_path(MINILM) / "vocab.txt").read_text(encoding="utf-8").splitlines()
    return {word: i for i, word in enumerate(lines)}


@needs_minilm
def test_minilm_ids_are_its_vocabulary_words():
    """WordPiece over the model's own vocab.txt: [CLS], the words, cut to the shortest."""
    vocab = vocabulary()
    ids = ja.models.tokenize(MINILM, TEXTS)
    words = ["[CLS]", "the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog"]
    assert ids.dtype == np.int32 and ids.shape[0] == 2
    assert ids[0, :10].tolist() == [vocab[w] for w in words]
    second = ja.models.tokenize(MINILM, TEXTS[1])
    assert second.ndim == 1 and second[-1] == vocab["[SEP]"]  # uncut: its own length
    assert ids.shape[1] == min(ids.shape[1], len(second))
    np.testing.assert_array_equal(ids[1], second[: ids.shape[1]])
    bare = ja.models.tokenize(packaged_path(MINILM), TEXTS[0], special_tokens=False)
    assert bare[:3].tolist() == [vocab["the"], vocab["quick"], vocab["brown"]]


@needs_minilm
def test_tokens_cut_and_pad_honestly(tmp_path):
    with pytest.warns(UserWarning, match="prompt 0 loses 9"):  # a cut says what it drops
        ids = ja.models.tokenize(packaged_path(MINILM) / "tokenizer.json", TEXTS, tokens=5)
    assert ids.shape == (2, 5)
    with pytest.raises(ValueError, match="prompt 0 has .* fewer than 40") as info:
        ja.models.tokenize(MINILM, TEXTS, tokens=40)
    assert len(str(info.value).splitlines()) == 1
    padded = ja.models.tokenize(MINILM, TEXTS, tokens=40, pad=0)
    assert padded.shape == (2, 40) and padded[0, -1] == 0 and padded[0, 1] != 0
    for bad in ({"tokens": 0}, {"tokens": True}):
        with pytest.raises(ValueError, match="`tokens`"):
            ja.models.tokenize(MINILM, TEXTS, **bad)
    with pytest.raises(ValueError, match="texts"):
        ja.models.tokenize(MINILM, [])
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        ja.models.tokenize(tmp_path, TEXTS)
    with pytest.raises(TypeError, match="folder, file or packaged name"):
        ja.models.tokenize(ja.models.TransformerConfig, TEXTS)  # not a path


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
@needs_smollm
def test_smollm2_gguf_vocabulary_gives_huggingface_ids():
    """The gguf's vocabulary and merges as a byte-level BPE: the ids transformers'
    own gguf conversion (`AutoTokenizer.from_pretrained(…, gguf_file=…)`) gives,
    digits one by one, control tokens whole, Unicode and emoji as bytes."""
    texts = TEXTS + ["<|im_start|>user\nHéllo wörld — ünïcode 😀 tabs\tand  spaces<|im_end|>"]
    want = [
        [504, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767, 216, 33, 34, 35, 36, 37, 30],
        [41319, 314, 511, 346, 737, 28, 502, 1137, 281, 216, 34, 32, 33, 39, 17],
        [1, 4093, 198, 56, 2756, 31394, 267, 29989, 400, 1841, 5549, 137, 94, 25972, 4635,
         40303, 218, 29416, 197, 397, 216, 5600, 2],
    ]
    ids = ja.models.tokenize(SMOLLM, texts, tokens=15, pad=2)
    assert ids.shape == (3, 15)
    for row, expected in zip(ids.tolist(), want):
        assert row == expected[:15]


def test_without_the_tokenizers_package_one_line_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(ImportError, match="pip install tokenizers"):
        ja.models.tokenize("anything", TEXTS)


@needs_minilm
def test_loop_command_runs_on_text(tmp_path, capsys):
    text = tmp_path / "prompts.txt"
    text.write_text("\n".join(TEXTS) + "\n\n")
    out = tmp_path / "run"
    argv = ["loop", "--model", MINILM, "--text", str(text), "--tokens", "6", "--passes", "2",
            "--no-ffn", "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    assert "2×6 tokens" in capsys.readouterr().out
    with np.load(out / "data.npz") as data:
        with pytest.warns(UserWarning, match="cut to the `tokens` asked for, 6"):
            ids = ja.models.tokenize(MINILM, TEXTS, tokens=6)
        np.testing.assert_array_equal(data["ids"], ids)
        assert data["E"].shape == (2, 2 * 6 + 1)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["text"] == str(text) and len(cfg["text_sha256"]) == 64 and cfg["prompts"] == 2
    assert main([*argv[:5], "--tokens", "60", "--out", str(tmp_path / "long")]) == 2
    err = capsys.readouterr().err.strip()
    assert "fewer than 60" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "long").exists()  # refused before the folder


def test_the_tokenizer_is_built_once_per_file(tmp_path, monkeypatch):
    """tokenize and detokenize reuse the tokenizer built from a file until the file
    changes (it took seconds per call to rebuild)."""
    import tokenizers

    def save(words):
        tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(
            {w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
        tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
        tok.save(str(tmp_path / "tokenizer.json"))

    save(["[UNK]", "the", "cat", "sat"])
    built = []
    real = tokenizers.Tokenizer.from_file
    monkeypatch.setattr(tokenizers.Tokenizer, "from_file",
                        staticmethod(lambda path: built.append(path) or real(path)))
    for _ in range(3):
        ids = ja.models.tokenize(tmp_path, "the cat sat")
        assert ja.models.detokenize(tmp_path, ids) == "the cat sat"
    assert len(built) == 1
    save(["[UNK]", "sat", "cat", "the", "on"])  # another vocabulary: built again
    assert ja.models.tokenize(tmp_path, "the cat").tolist() == [3, 2]
    assert len(built) == 2


def test_a_prompts_file_that_gives_no_prompts_is_one_line(tmp_path):
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"prompts file .*blank.txt \(`text`, --text\) holds "
                                         r"no prompts \(one per line\)\.$"):
        ja.models.read_prompts(blank)
    with pytest.raises(ValueError, match=r"missing.txt \(`text`, --text\) cannot be read"):
        ja.models.read_prompts(tmp_path / "missing.txt")
    (tmp_path / "two.txt").write_text("a b\n\nc\n", encoding="utf-8")
    assert ja.models.read_prompts(tmp_path / "two.txt") == ["a b", "c"]


@needs_smollm
def test_an_empty_prompt_is_refused_when_padded_too():
    """SmolLM2 adds no special token: "" padded was an all-False mask row, which `loop`
    then refused, pointing back at `tokenize`."""
    with pytest.raises(ValueError, match="prompt 0 has 0 tokens: padding would leave it no "
                                         "token to attend to; drop the empty prompt"):
        ja.models.tokenize(SMOLLM, ["", "hello world"], pad="auto", return_mask=True)


@needs_minilm
def test_a_cut_prompt_names_the_fix_that_applies():
    """With --pad already given, the cut comes from --tokens: its hint said "--pad keeps
    every prompt whole"; the words lost are shortened to 60 characters."""
    from jaxattn.experiments.loop_runner import cut_prompts

    long = " ".join(["word"] * 80)
    padded = cut_prompts(MINILM, [long], 10, pad=0)
    cut = cut_prompts(MINILM, [long], 10)
    assert len(padded) == len(cut) == 1
    assert padded[0].endswith("a larger --tokens keeps it whole"), padded
    assert cut[0].endswith("--pad keeps every prompt whole"), cut
    lost = padded[0].split("(", 1)[1].rsplit(")", 1)[0]
    assert len(lost) <= 62 and lost.endswith("…'"), lost
