"""Token ids from text with a model's own tokenizer, read with the `tokenizers`
package: a `tokenizer.json` (HuggingFace folders, the packaged MiniLM) or the
vocabulary and merges stored in a llama.cpp `.gguf` file (the packaged SmolLM2)."""

import functools
import os
import sys
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path

import equinox
import numpy as np

from .._validate import check_count, check_flag, refuse_first
from ._gguf import gguf_field, open_gguf
from ._packaged import PACKAGED, installed_path

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
        error, problem = TypeError, ("`source` must be the folder, file or packaged name a "
                                     "model was loaded from (a str or path), not a "
                                     f"{type(source).__name__}.")
    else:
        path = Path(source).expanduser()
        if not path.exists() and str(source) in PACKAGED:
            path = installed_path(str(source))
        if path.is_dir():
            path = path / "tokenizer.json"
        if path.is_file() and path.suffix in (".json", ".gguf"):
            return path
        error, problem = FileNotFoundError, (f"{source}: no tokenizer.json there (give a model "
                                             "folder, a tokenizer.json or .gguf file, or a "
                                             "packaged model's name).")
    raise error(problem)


def load_tokenizer(source):
    """A `tokenizers.Tokenizer` for `source` (see `tokenize`), its own truncation and
    padding switched off. Built once per file and kept while the file is unchanged
    (its path, size and modification time): a GPT-2 tokenizer takes seconds to build,
    a `.gguf` vocabulary longer."""
    _tokenizers()  # its absence named first
    path = tokenizer_source(source).resolve()
    stat = path.stat()
    return _built_tokenizer(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _built_tokenizer(path: str, size: int, mtime_ns: int):
    tk = _tokenizers()
    tok = _from_gguf(tk, Path(path)) if path.endswith(".gguf") else _from_json(tk, path)
    tok.no_truncation()
    tok.no_padding()
    return tok


def _from_json(tk, path: str):
    """`tokenizers.Tokenizer.from_file`, its bare `Exception` for a file that is not a
    tokenizer (a model's config.json, a broken file) a one-line `ValueError`."""
    try:
        return tk.Tokenizer.from_file(path)
    except Exception as e:  # tokenizers raises a bare Exception
        reason = " ".join(str(e).split())
        raise ValueError(f"{path} is not a tokenizer.json (a HuggingFace tokenizers file): "
                         f"{reason}.") from None


def _from_gguf(tk, path: Path):
    """A byte-level BPE tokenizer from a gguf file's `tokenizer.ggml.*` metadata,
    as llama.cpp runs it (control tokens matched whole, no BOS unless it asks)."""
    reader = open_gguf(path)

    def field(key, default=None):
        return gguf_field(reader, f"tokenizer.ggml.{key}", default)

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


#: The padding tokens `pad="auto"` looks for, in this order (BERT's, T5's, GPT-2's
#: and SmolLM2's end of text).
PAD_TOKENS = ("[PAD]", "<pad>", "<|endoftext|>", "</s>")


def tokenize(
    source: str | os.PathLike,
    texts: str | Sequence[str],
    *,
    tokens: int | None = None,
    pad: int | str | None = None,
    special_tokens: bool = True,
    return_mask: bool = False,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Token ids of `texts` with a model's own tokenizer, for `ja.models.loop`: cut to
    a common length (a warning names what each prompt lost, whenever one is cut) or
    padded with a mask (docs/usage/models.md, "Real text, padding, and predictions
    after k passes").
    Needs the `tokenizers` package (jaxattn's `models` extra).

    **Arguments:**

    - `source`: the folder a model was loaded from (with its `tokenizer.json`), a
      `tokenizer.json` or llama `.gguf` file (its vocabulary rebuilt as a byte-level
      BPE), or a packaged model's name (`"all-MiniLM-L6-v2"`, `"SmolLM2-135M-Instruct"`).
    - `texts`: one prompt, or a sequence of prompts.
    - `tokens`: the length `n` of every prompt (default: the shortest prompt's; with
      `pad`, the longest's); a shorter prompt is refused unless padded, a longer one
      cut with a warning.
    - `pad`: the id appended to prompts shorter than `tokens`, or `"auto"`: the
      tokenizer's own padding token (`[PAD]`, `<pad>`, else its end of text)
      (default: refuse them).
    - `special_tokens`: add the tokenizer's own special tokens, as HuggingFace does
      by default (BERT's `[CLS]`/`[SEP]`); a cut can drop the trailing ones.
    - `return_mask`: also return the mask of the text tokens (`True`) against the
      padding (`False`), HuggingFace's `attention_mask`.

    **Returns:**

    int32 ids `(n,)` for one prompt, `(B, n)` for a sequence of them; with
    `return_mask`, the pair `(ids, mask)`, the mask boolean of the same shape.
    """
    single, texts = _check_texts(texts)
    tokens = None if tokens is None else check_count(tokens, "tokens", 1)
    wrong_pad = pad is not None and pad != "auto" and not is_int(pad, 0)
    check_flag(special_tokens, "special_tokens")
    check_flag(return_mask, "return_mask")
    tok = load_tokenizer(source)
    size = tok.get_vocab_size()
    if pad == "auto":  # the tokenizer's own padding token, if it has one
        pad = next((tok.token_to_id(t) for t in PAD_TOKENS if tok.token_to_id(t) is not None),
                   "auto")
    encoded = [e.ids for e in tok.encode_batch(texts, add_special_tokens=special_tokens)]
    lengths = [len(e) for e in encoded]
    n = tokens if tokens is not None else min(lengths) if pad is None else max(lengths)
    short = [i for i, e in enumerate(encoded) if len(e) < n] or [lengths.index(min(lengths))]
    refuse_first((
        (wrong_pad, ValueError if is_int(pad, -(1 << 62)) else TypeError,
         f'`pad` must be None, "auto" or a token id ≥ 0, got {pad!r}.'),
        (pad == "auto", ValueError, f"{source}'s tokenizer has no padding token "
         f"({', '.join(PAD_TOKENS)}); give the id to pad with (`pad=ID`, --pad ID)."),
        (is_int(pad, 0) and pad >= size, ValueError,
         f"`pad` {pad} is not an id of {source}'s tokenizer (0 to {size - 1})."),
        (pad is not None and 0 in lengths, ValueError, f"prompt {(lengths + [0]).index(0)} has 0 "
         "tokens: padding would leave it no token to attend to; drop the empty prompt."),
        (n == 0 or (len(encoded[short[0]]) < n and pad is None), ValueError,
         f"prompt {short[0]} has {lengths[short[0]]} tokens, fewer than {n or 1}: give longer "
         "prompts, fewer tokens (`tokens`, --tokens; default: the shortest prompt's), or pad "
         "them (`pad`, --pad)."),
    ))
    _warn_cut(tok, encoded, n, asked=tokens is not None)
    ids = np.asarray([e[:n] + [pad] * (n - len(e[:n])) for e in encoded], np.int32)
    mask = np.asarray([[True] * min(len(e), n) + [False] * (n - len(e)) for e in encoded])
    if single:
        ids, mask = ids[0], mask[0]
    return (ids, mask) if return_mask else ids


def _warn_cut(tok, encoded: list[list[int]], n: int, asked: bool = False) -> None:
    """Warn, naming each prompt and the text it loses, when cutting to `n` drops tokens
    (`asked`: `n` is the `tokens` asked for, not the shortest prompt's length)."""
    lost = [f"prompt {i} loses {len(e) - n} ({tok.decode(e[n:], skip_special_tokens=False)!r})"
            for i, e in enumerate(encoded) if len(e) > n]
    if not lost:
        return
    if asked:
        head, keep = f"the `tokens` asked for, {n}", "a larger `tokens` (with pad=\"auto\")"
    else:
        head = f"the shortest one's {n} tokens"
        keep = 'pad="auto", return_mask=True and loop(…, mask=mask)'
    warnings.warn(f"prompts cut to {head}: {'; '.join(lost)}. Keep every token with {keep}.",
                  stacklevel=_caller_level())


def _caller_level() -> int:
    """The `stacklevel` of the first frame outside jaxattn (`tokenize` is reached
    directly or through `model.tokenize`, which Equinox wraps)."""
    inside = (str(Path(__file__).resolve().parents[1]), str(Path(equinox.__file__).parent))
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(inside):
        frame, level = frame.f_back, level + 1
    return level


def detokenize(
    source: str | os.PathLike,
    ids,
    *,
    special_tokens: bool = True,
) -> str | list[str]:
    """The text of token ids with a model's own tokenizer: `tokenize`'s inverse, to
    see what a cut kept (`jaxattn loop --text` saves the ids looped in `data.npz`).

    **Arguments:**

    - `source`: as `tokenize` takes it (a model folder, a `tokenizer.json` or
      `.gguf` file, or a packaged model's name).
    - `ids`: integer ids `(n,)` of one prompt, or `(B, n)` of several.
    - `special_tokens`: show the special tokens (`[CLS]`, `[SEP]`, padding) among
      the words (default), or leave them out.

    **Returns:**

    The text of one prompt, or a list of `B` texts.
    """
    check_flag(special_tokens, "special_tokens")
    tok = load_tokenizer(source)
    size = tok.get_vocab_size()
    try:
        array = np.asarray(ids) if isinstance(ids, (np.ndarray, list, tuple)) or hasattr(
            ids, "__array__") else None
        error, got = TypeError, None if array is not None else type(ids).__name__
    except ValueError:
        array, error, got = None, ValueError, "rows of different lengths"
    if array is not None and not (np.issubdtype(array.dtype, np.integer) or array.size == 0):
        got = f"dtype {array.dtype}"
    elif array is not None and array.ndim not in (1, 2):
        error, got = ValueError, f"shape {array.shape}"
    problem = got and f"`ids` must be integer token ids of shape (n,) or (B, n), got {got}."
    if not got and array.size and (array.min() < 0 or array.max() >= size):
        bad = array.min() if array.min() < 0 else array.max()
        error, problem = ValueError, (f"`ids` holds {bad}, not an id of {source}'s tokenizer "
                                      f"(0 to {size - 1}).")
    if problem:
        raise error(problem)
    rows = [row.tolist() for row in np.atleast_2d(array)]
    texts = tok.decode_batch(rows, skip_special_tokens=not special_tokens)
    return texts[0] if array.ndim == 1 else texts


def is_int(value, low: int) -> bool:
    """Whether `value` is an integer `≥ low` (a NumPy one too; a bool is not)."""
    return (isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
            and value >= low)


def _check_texts(texts) -> tuple[bool, list[str]]:
    """Whether `texts` is one prompt, and its prompts as a list."""
    if isinstance(texts, str):
        return True, [texts]
    many = isinstance(texts, Iterable) and not isinstance(texts, (bytes, bytearray))
    texts = list(texts) if many else texts
    if not many:
        got = f"a {type(texts).__name__}"
    elif not texts:
        got = "an empty sequence"
    else:
        got = next((f"a sequence holding a {type(t).__name__}" for t in texts
                    if not isinstance(t, str)), None)
    if got:
        error = ValueError if got == "an empty sequence" else TypeError
        raise error(f"`texts` must be a string or a non-empty sequence of strings, got {got}.")
    return False, texts


def read_prompts(path) -> list[str]:
    """The prompts of a text file, one per line (blank lines skipped)."""
    try:
        prompts = [line for line in Path(path).read_text(encoding="utf-8").splitlines()
                   if line.strip()]
        problem = None if prompts else "holds no prompts (one per line)"
    except (OSError, UnicodeDecodeError) as e:
        problem = f"cannot be read ({e})"
    if problem:
        raise ValueError(f"the prompts file {path} (`text`, --text) {problem}.")
    return prompts
