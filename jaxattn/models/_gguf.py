"""Llama-family `.gguf` files (llama.cpp): metadata → config, tensors dequantised to
float32 with the `gguf` package, llama.cpp's query/key row permutation undone,
names mapped to HuggingFace's. The converted tensors are cached as an `.npz` in the
compilation cache's folder (`jaxattn._process.cache.cache_dir`: `$JAXATTN_CACHE_DIR`,
default `~/.cache/jaxattn`; none when it is `off`), keyed by the file's content, so a
file is dequantised once; `jaxattn cache clear` removes it with the programs."""

import hashlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np

from .._files import atomic_write
from .._process.cache import cache_dir

T = TypeVar("T")

_FORMAT = "jaxattn-gguf-2"  # bump when the conversion changes: old caches are ignored
_INTEGER_TYPES = ("I8", "I16", "I32", "I64")  # never weights (IQ* are quantised floats)
_NAMES = [
    (r"token_embd\.weight", "embed_tokens.weight"),
    (r"output_norm\.weight", "norm.weight"),
    (r"output\.weight", "lm_head.weight"),
    (r"blk\.(\d+)\.attn_norm\.weight", "layers.{}.input_layernorm.weight"),
    (r"blk\.(\d+)\.ffn_norm\.weight", "layers.{}.post_attention_layernorm.weight"),
    (r"blk\.(\d+)\.attn_q\.(weight|bias)", "layers.{}.self_attn.q_proj.{}"),
    (r"blk\.(\d+)\.attn_k\.(weight|bias)", "layers.{}.self_attn.k_proj.{}"),
    (r"blk\.(\d+)\.attn_v\.(weight|bias)", "layers.{}.self_attn.v_proj.{}"),
    (r"blk\.(\d+)\.attn_output\.(weight|bias)", "layers.{}.self_attn.o_proj.{}"),
    (r"blk\.(\d+)\.ffn_gate\.weight", "layers.{}.mlp.gate_proj.weight"),
    (r"blk\.(\d+)\.ffn_up\.weight", "layers.{}.mlp.up_proj.weight"),
    (r"blk\.(\d+)\.ffn_down\.weight", "layers.{}.mlp.down_proj.weight"),
]


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of every byte of `path`, read in 4 MiB pieces (a file of any size
    in constant memory)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def cache_file(path: Path) -> Path | None:
    """The cache entry for `path` in the cache folder (`cache_dir`; `None` when the cache
    is off), keyed by the conversion's version and the file's content, so a file
    rewritten in place is never served stale, whatever its size and mtime say."""
    root = cache_dir()
    return None if root is None else root / f"{path.stem}-{_FORMAT}-{file_sha256(path)[:32]}.npz"


def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's query/key permutation: it stores each head's rows as
    interleaved pairs `(0, r, 1, r+1, …)`; HuggingFace's rotary layout wants the
    halves `(0, 1, …, r−1 | r, …)` (`r = k/2`)."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_name(name: str) -> str | None:
    for pattern, target in _NAMES:
        m = re.fullmatch(pattern, name)
        if m:
            return target.format(*m.groups())
    return None


def gguf_field(reader, key: str, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


#: The llama metadata a gguf file must hold (`llama.…`).
_REQUIRED = ("embedding_length", "attention.head_count", "block_count", "feed_forward_length",
             "attention.layer_norm_rms_epsilon")


def gguf_config(reader, path: Path) -> dict:
    """A HuggingFace-style `config.json` dict from the gguf metadata."""

    def llama(key, default=None):
        return gguf_field(reader, f"llama.{key}", default)

    arch = gguf_field(reader, "general.architecture")
    missing = [key for key in _REQUIRED if llama(key) is None]
    rope, problem = {}, None
    if arch != "llama":
        problem = (f"gguf architecture {arch!r} is not supported (jaxattn reads 'llama' gguf "
                   "files: Llama, SmolLM2, …).")
    elif missing:
        problem = f"gguf metadata has no 'llama.{missing[0]}'."
    else:
        d, heads = int(llama("embedding_length")), int(llama("attention.head_count"))
        head_dim = int(llama("attention.key_length", d // heads if heads > 0 else d))
        rope, problem = _rope_scaling(reader)
        if int(llama("rope.dimension_count", head_dim)) != head_dim:
            problem = "partial rotary embeddings are not supported."
        if heads > 0 and llama("attention.key_length") is None and d % heads:
            problem = (f"its embedding length {d} is not a multiple of its {heads} attention "
                       "heads (and it gives no 'llama.attention.key_length').")
    if problem:
        raise ValueError(f"{path}: {problem}")
    return {
        "model_type": "llama", "hidden_size": d, "num_attention_heads": heads,
        "num_key_value_heads": int(llama("attention.head_count_kv", heads)),
        "num_hidden_layers": int(llama("block_count")),
        "intermediate_size": int(llama("feed_forward_length")),
        "rms_norm_eps": float(llama("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(llama("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(llama("context_length", 2048)),
        "head_dim": head_dim,
        # llama.cpp ties the head to the embedding when it has no `output.weight`
        "tie_word_embeddings": not any(t.name == "output.weight" for t in reader.tensors),
        **rope,
    }


def _rope_scaling(reader) -> tuple[dict, str | None]:
    """The config's `rope_scaling` from llama.cpp's `llama.rope.scaling.*` metadata (or
    the older `llama.rope.scale_linear`), and the problem with it: linear scaling is
    read (llama.cpp's is HuggingFace's); any other kind is refused by name, never
    ignored."""
    kind = gguf_field(reader, "llama.rope.scaling.type")
    factor = gguf_field(reader, "llama.rope.scaling.factor")
    old = gguf_field(reader, "llama.rope.scale_linear")
    if kind in (None, "none") and old not in (None, 1.0):
        kind, factor = "linear", old
    if kind in (None, "none"):
        return {}, None
    if kind != "linear":
        return {}, (f"gguf rope scaling {kind!r} (llama.rope.scaling.type) is not implemented "
                    "for gguf files (jaxattn reads 'linear'); convert the model to a "
                    "HuggingFace folder, whose rope_scaling jaxattn reads in full.")
    if factor is None or not float(factor) > 0:
        return {}, f"gguf linear rope scaling needs llama.rope.scaling.factor > 0, got {factor!r}."
    return {"rope_scaling": {"rope_type": "linear", "factor": float(factor)}}, None


class _Truncated(ValueError):
    pass


def _checked_reader(gguf):
    """`GGUFReader` that names the first tensor a truncated file cuts off (the stock
    reader fails with a bare reshape error)."""

    class Reader(gguf.GGUFReader):
        def _build_tensors(self, start_offs, fields):
            for field in fields:
                _, name, _, dims, raw_dtype, offset = field.parts
                block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(raw_dtype[0])]
                end = int(start_offs + offset[0]) + int(np.prod(dims)) * size // block
                if end > len(self.data):
                    raise _Truncated(
                        f"truncated file: tensor {bytes(name).decode()!r} ends at byte {end} "
                        f"but the file has {len(self.data)} bytes."
                    )
            super()._build_tensors(start_offs, fields)

    return Reader


def open_gguf(path: Path):
    """A gguf reader of `path`; a truncated or unreadable file is a one-line ValueError."""
    import gguf

    try:
        return _checked_reader(gguf)(str(path))
    except Exception as e:  # gguf raises ValueError / struct errors on bad files
        why = e if isinstance(e, _Truncated) else (
            f"not a readable gguf file ({type(e).__name__}: {e}).")
        raise ValueError(f"{path}: {why}") from None


def _dequantise(t) -> tuple[np.ndarray | None, str | None]:
    """Tensor `t` as float32, or `None` and why it cannot be."""
    import gguf

    kind = t.tensor_type.name
    if kind in _INTEGER_TYPES:
        return None, (f"tensor {t.name!r} has type {kind}; weights must be floating-point "
                      "or quantised floating-point.")
    try:
        w = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
    except Exception as e:
        return None, f"cannot dequantise tensor {t.name!r} ({kind}): {e}"
    shape = tuple(int(s) for s in t.shape[::-1])
    return np.ascontiguousarray(w, dtype=np.float32).reshape(shape), None


def convert(path: Path, check: Callable[[dict], object]) -> tuple[dict, dict[str, np.ndarray]]:
    """The config and float32 HuggingFace-named tensors of a gguf file; `check(config)`
    refuses a config before any tensor is read (the queries and keys are unpermuted by
    their head counts)."""
    reader = open_gguf(path)
    hf = gguf_config(reader, path)
    embed = [t for t in reader.tensors if t.name == "token_embd.weight"]
    hf["vocab_size"] = int(embed[0].shape[-1]) if embed else int(
        gguf_field(reader, "llama.vocab_size", 0))
    check(hf)
    arrays = {}
    for t in reader.tensors:
        name = hf_name(t.name)
        w, problem = _dequantise(t) if name else (
            None, f"unexpected tensor {t.name!r} for a llama gguf file.")
        if problem:
            raise ValueError(f"{path}: {problem}")
        if name.endswith("q_proj.weight"):
            w = unpermute(w, hf["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            w = unpermute(w, hf["num_key_value_heads"])
        arrays[name] = w
    return hf, arrays


def converted(path: Path, check: Callable[[dict], object], make: Callable[[dict, dict], T]) -> T:
    """`make(*convert(path, check))`: the conversion read from the cache when it was done
    before, and kept there once `make` took it (a file whose tensors do not fit its
    config fills no cache)."""
    cache = cache_file(path)
    if cache is not None and cache.exists():
        try:
            with np.load(cache) as data:
                arrays = {k: data[k] for k in data.files if k != "__config__"}
                hf = json.loads(str(data["__config__"]))
            return make(hf, arrays)
        except Exception:  # a damaged or wrong cache entry is rebuilt, never trusted
            cache.unlink(missing_ok=True)
    hf, arrays = convert(path, check)
    out = make(hf, arrays)
    try:  # uncompressed: compressing float32 weights gains little, costs seconds a load
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(cache, lambda f: np.savez(f, __config__=np.asarray(json.dumps(hf)),
                                                   **arrays))
    except OSError:
        pass  # caching is an optimisation; an unwritable cache dir is not an error
    return out
