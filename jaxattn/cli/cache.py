"""`jaxattn cache`: where the compilation cache is and what it holds (`info`, the
default), or empty it (`clear`). Reads the folder only: no JAX."""

import argparse

from .._process.cache import (
    CONVERTED,
    OFF,
    VARIABLE,
    cache_dir,
    cache_size,
    clear_cache,
    foreign,
    refusal,
    unusable,
)


def describe() -> str:
    """The cache's folder, entries and size in one line (`doctor` prints it too)."""
    folder = cache_dir()
    if folder is None:
        return f"compilation cache: off ({VARIABLE}={OFF})"
    if problem := unusable(folder) or foreign(folder):  # as the commands refuse it
        return f"compilation cache: {folder}, unusable: {problem}"
    entries, size = cache_size(folder)
    models = [p.stat().st_size for p in folder.glob("*.npz") if CONVERTED.fullmatch(p.name)] \
        if folder.is_dir() else []
    return (f"compilation cache: {folder}, {entries} entries, {size / 1e6:.1f} MB"
            + (f" (of which {len(models)} converted .gguf model"
               f"{'s' if len(models) > 1 else ''}, {sum(models) / 1e6:.1f} MB)" if models else ""))


def _cache(args: argparse.Namespace) -> int:
    folder = cache_dir()
    if folder is not None and (problem := unusable(folder)):
        raise ValueError(refusal(folder, problem))
    if args.action == "clear" and folder is not None:
        entries, size = clear_cache(folder)
        print(f"cleared {folder}: {entries} entries, {size / 1e6:.1f} MB")
    else:
        print(describe())
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "cache", help="the compilation cache: where it is and its size, or clear it",
        description=f"The compilation cache, where the commands keep the programs XLA "
        f"compiled for the next run: `jaxattn cache` (or `cache info`) prints its folder, "
        f"entries and size, `jaxattn cache clear` empties it (refused for a folder that "
        f"holds anything else). The folder: {VARIABLE} ({VARIABLE}={OFF} turns the cache "
        f"off), else JAX_COMPILATION_CACHE_DIR, else $XDG_CACHE_HOME/jaxattn "
        f"(~/.cache/jaxattn).")
    p.add_argument("action", nargs="?", choices=("info", "clear"), default="info",
                   help="info (default) or clear")
    p.set_defaults(func=_cache)
