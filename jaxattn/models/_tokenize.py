"""Token ids from text with a model's own tokenizer, read with the `tokenizers`
package: a `tokenizer.json` (HuggingFace folders, the packaged MiniLM) or the
vocabulary and merges stored in a llama.cpp `.gguf` file (the packaged SmolLM2)."""

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ._gguf import open_gguf
from ._load import PACKAGED, packaged_path

INSTALL = "pip install tokenizers"
#: llama.cpp's pre-tokenizer names (`tokenizer.ggml.pre`) that `tokenizers` rebuilds:
#: GPT-2's byte-level split, SmolLM2's with every digit on its own.
GGUF_PRE = ("gpt2", "default", "smollm")


def _tokenizers():
    try:
        import tokenizers  # optional (the `models` extra): only text needs it
    except ImportError:
        raise ImportError(f"ja.models.tokenize needs the tokenizers package: {INSTALL}.") from None
    return tokenizers


def tokenizer_source(source) -> Path:
    """The file holding the tokenizer of `source`: a model folder's `tokenizer.json`,
    a `tokenizer.json` or `.gguf` file itself, or a packaged model's (by name)."""
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError("ja.models.tokenize takes the folder, file or packaged name a model "
                        f"was loaded from, not a {type(source).__name__}.")
    path = Path(source)
    if not path.exists() and str(source) in PACKAGED:
        path = packaged_path(str(source))
        if path is None:
            raise FileNotFoundError(f"{source} is not installed: {PACKAGED[str(source)][2]}.")
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file() or path.suffix not in (".json", ".gguf"):
        raise FileNotFoundError(f"{source}: no tokenizer.json there (give a model folder, a "
                                "tokenizer.json or .gguf file, or a packaged model's name).")
    return path


def load_tokenizer(source):
    """A `tokenizers.Tokenizer` for `source` (see `tokenize`), its own truncation and
    padding switched off."""
    tk = _tokenizers()
    path = tokenizer_source(source)
    tok = _from_gguf(tk, path) if path.suffix == ".gguf" else tk.Tokenizer.from_file(str(path))
    tok.no_truncation()
    tok.no_padding()
    return tok


def _from_gguf(tk, path: Path):
    """A byte-level BPE tokenizer from a gguf file's `tokenizer.ggml.*` metadata,
    as llama.cpp runs it (control tokens matched whole, no BOS unless it asks)."""
    reader = open_gguf(path)

    def field(key, default=None):
        f = reader.fields.get(f"tokenizer.ggml.{key}")
        return default if f is None else f.contents()

    def strings(key):  # as `contents()`, without its slow per-item dispatch
        f = reader.fields[f"tokenizer.ggml.{key}"]
        return [bytes(f.parts[i]).decode() for i in f.data]

    kind, pre = field("model"), field("pre", "default")
    if kind != "gpt2" or pre not in GGUF_PRE:
        raise ValueError(f"{path}: its tokenizer ({kind!r}, pre-tokenizer {pre!r}) is not one "
                         f"jaxattn rebuilds (byte-level BPE with {', '.join(GGUF_PRE)}).")
    tokens = strings("tokens")
    merges = [tuple(m.split(" ", 1)) for m in strings("merges")]
    tok = tk.Tokenizer(tk.models.BPE({t: i for i, t in enumerate(tokens)}, merges,
                                     ignore_merges=False))
    byte_level = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.pre_tokenizer = (tk.pre_tokenizers.Sequence(
        [tk.pre_tokenizers.Digits(individual_digits=True), byte_level])
        if pre == "smollm" else byte_level)
    tok.decoder = tk.decoders.ByteLevel()
    types = field("token_type", [])
    tok.add_special_tokens([t for t, kind in zip(tokens, types) if kind == 3])  # control
    bos = field("bos_token_id")
    if field("add_bos_token", False) and bos is not None:
        tok.post_processor = tk.processors.TemplateProcessing(
            single=f"{tokens[bos]} $A", special_tokens=[(tokens[bos], int(bos))])
    return tok


def tokenize(
    source: str | os.PathLike,
    texts: str | Sequence[str],
    *,
    tokens: int | None = None,
    pad: int | None = None,
    special_tokens: bool = True,
) -> np.ndarray:
    """Token ids of `texts` with a model's own tokenizer, for `ja.models.loop`.

    The looped dynamics has no attention mask for padding: every id is a token of
    the sequence. So by default no padding is made up: every prompt is cut to a
    common length (`tokens`, or the shortest prompt's), and a prompt shorter than
    `tokens` is an error unless `pad` names an id to append (appended ids then
    take part in the dynamics and in `E` like any token; in a causal model they
    never change the text tokens before them).

    **Arguments:**

    - `source`: the folder a model was loaded from (with its `tokenizer.json`), a
      `tokenizer.json` or llama `.gguf` file, or a packaged model's name
      (`"all-MiniLM-L6-v2"`, `"SmolLM2-135M-Instruct"`). A `.gguf` file's
      vocabulary and merges are rebuilt as a byte-level BPE (llama.cpp's `gpt2`
      and `smollm` pre-tokenizers).
    - `texts`: one prompt, or a sequence of prompts.
    - `tokens`: the length `n` of every prompt (default: the shortest prompt's).
    - `pad`: the id appended to prompts shorter than `tokens` (default: refuse them).
    - `special_tokens`: add the tokenizer's own special tokens, as HuggingFace does
      by default (BERT's `[CLS]`/`[SEP]`; nothing for SmolLM2); a cut can drop the
      trailing ones.

    **Returns:**

    int32 ids `(n,)` for one prompt, `(B, n)` for a sequence of them.

    Needs the `tokenizers` package (`pip install tokenizers`, or jaxattn's
    `models` extra).
    """
    single = isinstance(texts, str)
    texts = [texts] if single else list(texts)
    if not texts or not all(isinstance(t, str) for t in texts):
        raise ValueError("texts must be a string or a non-empty sequence of strings.")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int)
                               or tokens < 1):
        raise ValueError(f"`tokens` must be None or an integer ≥ 1, got {tokens!r}.")
    tok = load_tokenizer(source)
    encoded = [e.ids for e in tok.encode_batch(texts, add_special_tokens=special_tokens)]
    n = min(len(e) for e in encoded) if tokens is None else tokens
    short = [i for i, e in enumerate(encoded) if len(e) < n]
    if n == 0 or (short and pad is None):
        i = short[0] if short else 0
        raise ValueError(f"prompt {i} has {len(encoded[i])} tokens, fewer than {n or 1}; give "
                         "longer prompts, fewer tokens, or an id to pad with.")
    ids = np.asarray([e[:n] + [pad] * (n - len(e[:n])) for e in encoded], np.int32)
    return ids[0] if single else ids


def read_prompts(path) -> list[str]:
    """The prompts of a text file, one per line (blank lines skipped)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--text {path}: cannot read it ({e}).") from None
    prompts = [line for line in lines if line.strip()]
    if not prompts:
        raise ValueError(f"--text {path} holds no prompts (one per line).")
    return prompts
