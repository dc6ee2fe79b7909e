"""The persistent compilation cache: XLA's compiled programs kept on disk, so that a
second process loads what the first compiled (docs/usage/speed.md).

The folder, first that applies: `enable_cache(path)`'s `path`; `JAXATTN_CACHE_DIR`
(`off` turns the cache off, even over JAX's own variable); JAX's
`JAX_COMPILATION_CACHE_DIR`; `$XDG_CACHE_HOME/jaxattn`; `~/.cache/jaxattn`. No JAX at
import: `jaxattn cache` reads and clears the folder without loading it."""

import os
import re
import shutil
import sys
from pathlib import Path

#: The environment variable of the folder, and its value that turns the cache off.
VARIABLE, OFF = "JAXATTN_CACHE_DIR", "off"
#: JAX's own variables, which keep precedence over jaxattn's defaults.
JAX_VARIABLE = "JAX_COMPILATION_CACHE_DIR"
JAX_MIN_TIME = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
#: Programs that compiled faster than this are not kept: 0, every program (a second
#: `jaxattn run` compiled 4 programs again, 69–82 at 0.1 s: docs/usage/speed.md).
MIN_COMPILE_TIME_S = 0.0
#: What JAX and jaxattn write in a cache folder, by the whole name (a user's
#: `work-order` or `my-cache` is not one): JAX's entries (`jit_{name}-{key}-cache`, with
#: an `-atime` beside each where JAX evicts); jaxattn's kept programs
#: (`jaxattn_program-{key}-cache`, `-atime`, and `-traced`, the marker of a program it
#: does not keep) and the lists of the programs a run took (`jaxattn_run-{key}-order`).
ENTRY = re.compile(r"(jaxattn_program-[0-9a-f]{64}-(cache|atime|traced)"
                   r"|jaxattn_run-[0-9a-f]{64}-order|.+-[0-9a-f]{64}-(cache|atime))")
#: An entry's temporary file, left by a process killed while writing it
#: (`_files.atomic_write`: `.{name}.{8 of tempfile's letters}.tmp`).
TEMPORARY = re.compile(r"\.(?P<name>.+)\.[a-z0-9_]{8}\.tmp")
#: JAX's lock file and XLA's GPU kernel cache (files), and XLA's GPU autotuning folder
#: with the results it holds (`{hash}.textproto`).
_FILES = (".lockfile", "xla_gpu_kernel_cache_file")
_AUTOTUNE, _AUTOTUNED = "xla_gpu_per_fusion_autotune_cache_dir", re.compile(r"[\w=-]+\.textproto")
#: jaxattn's own entries beside them: a model file's tensors, converted once
#: (`models._gguf.cache_file`: `{stem}-jaxattn-gguf-{version}-{content hash}.npz`).
CONVERTED = re.compile(r".+-jaxattn-[a-z]+-\d+-[0-9a-f]{32}\.npz")


def cache_dir(path: str | os.PathLike | None = None) -> Path | None:
    """The cache folder by the rule above (the module's docstring); `None` when off."""
    if path is None:
        setting = os.environ.get(VARIABLE, "").strip()
        if setting.lower() == OFF:
            return None
        path = (setting or os.environ.get(JAX_VARIABLE)
                or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "jaxattn")
    return Path(path).expanduser().absolute()


def enable_cache(path: str | os.PathLike | None = None) -> Path | None:
    """Keep the programs JAX compiles from now on in a folder, and load them from it
    instead of compiling them again: in this process and every later one that uses
    the folder. What the `jaxattn` commands do; worth it where the programs take
    longer to compile than to run (docs/usage/speed.md).

    **Arguments:**

    - `path`: the folder (made with the first program kept). Default: `JAXATTN_CACHE_DIR` (`off`
      turns the cache off), else `JAX_COMPILATION_CACHE_DIR`, else
      `$XDG_CACHE_HOME/jaxattn` (`~/.cache/jaxattn`).

    **Returns:**

    The folder, or `None` when the cache is off.
    """
    if not (path is None or isinstance(path, str | os.PathLike)):
        raise TypeError(f"`path` must be a folder (a str or a path), got "
                        f"{type(path).__name__}.")
    folder = cache_dir(path)
    problem = folder and (unusable(folder) or foreign(folder))
    if problem:
        raise ValueError(refusal(folder, problem))
    options = {"jax_enable_compilation_cache": folder is not None}
    if folder is not None:
        options["jax_compilation_cache_dir"] = str(folder)
        if JAX_MIN_TIME not in os.environ:  # a user's own choice stays
            options["jax_persistent_cache_min_compile_time_secs"] = MIN_COMPILE_TIME_S
    if "jax" not in sys.modules:  # read by JAX when it loads: `jaxattn` loads it late
        os.environ.update({name.upper(): str(value) for name, value in options.items()})
        return folder
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    compilation_cache.reset_cache()  # JAX opens its cache once per process
    for name, value in options.items():
        jax.config.update(name, value)
    return folder


def refusal(folder: Path, problem: str) -> str:
    """The one line refusing `folder` as the cache for `problem` (`unusable`)."""
    return (f"cannot use {folder} for the compilation cache: {problem}; choose another "
            f"folder ({VARIABLE}=DIR) or turn the cache off ({VARIABLE}={OFF}).")


def unusable(folder: Path) -> str | None:
    """Why JAX cannot make `folder` (on its first program) or write to it; None if it can."""
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir():
        return f"{existing} is not a folder"
    return None if os.access(existing, os.W_OK | os.X_OK) else f"{existing} is not writable"


def foreign(folder: Path) -> str | None:
    """What a folder that holds no cache entry holds instead (a mistaken
    `JAXATTN_CACHE_DIR`: a command would fill a user's folder that `clear_cache` then
    refuses to clear), or None. A folder with entries is a cache already: a file of
    a kind the cache's writers start to write later does not lock the user out."""
    names = os.listdir(folder) if folder.is_dir() else []
    if any(map(_entry_name, names)):
        return None
    names = sorted(n for n in names if not n.startswith(".") and not is_entry(folder / n))
    return (f"it holds files that are not compilation cache entries ({', '.join(names[:3])}"
            f"{', …' if len(names) > 3 else ''})") if names else None


def _entry_name(name: str) -> bool:
    """Whether a name in a cache folder is an entry JAX or jaxattn writes there (by the
    name alone: no `stat` per entry when a command starts)."""
    return ENTRY.fullmatch(name) is not None or CONVERTED.fullmatch(name) is not None


def is_entry(path: Path) -> bool:
    """Whether `path`, in a cache folder, is something JAX, XLA or jaxattn wrote there:
    an entry, one's temporary file, a file of `_FILES`, or XLA's autotuning folder
    holding nothing but its results."""
    if path.is_symlink():
        return False
    if path.name == _AUTOTUNE and path.is_dir():
        return all(p.is_file() and not p.is_symlink() and _AUTOTUNED.fullmatch(p.name)
                   for p in path.iterdir())
    temporary = TEMPORARY.fullmatch(path.name)
    return path.is_file() and (path.name in _FILES or _entry_name(path.name) or (
        temporary is not None and _entry_name(temporary["name"])))


def cache_size(folder: Path) -> tuple[int, int]:
    """The number of entries (`{key}-cache` files) in `folder` and the bytes of all
    it holds; `(0, 0)` for a folder that does not exist."""
    if not folder.is_dir():
        return 0, 0
    files = [p for p in folder.rglob("*") if p.is_file()]
    return (sum(p.parent == folder and ENTRY.fullmatch(p.name) is not None
                and p.name.endswith("-cache") for p in files),
            sum(p.stat().st_size for p in files))


def clear_cache(folder: Path) -> tuple[int, int]:
    """Delete the entries of the cache `folder`, refusing (`ValueError`, nothing
    deleted) a folder that holds anything else: a mistaken `JAXATTN_CACHE_DIR`
    never costs a user's files.

    **Returns:**

    The entries and bytes deleted (`cache_size` before).
    """
    if not folder.is_dir():
        return 0, 0
    foreign = sorted(p.name for p in folder.iterdir() if not is_entry(p))
    if foreign:
        raise ValueError(f"{folder} holds files that are not compilation cache entries "
                         f"({', '.join(foreign[:3])}{', …' if len(foreign) > 3 else ''}); "
                         f"nothing deleted: is {VARIABLE} the folder you meant?")
    size = cache_size(folder)
    for p in folder.iterdir():
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)
    return size
