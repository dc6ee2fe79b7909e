"""Files written whole or not at all: the one atomic write of jaxattn (run folders,
converted model files)."""

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def atomic_write(path, write: Callable[[Any], object]) -> Path:
    """Write a file through `write(binary_file)` under a temporary name, then rename
    it to `path`: a reader never sees it half-written.

    **Returns:**

    `path`.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~umask())  # mkstemp makes 0600, whatever the umask
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def umask() -> int:
    """The process's umask (read without changing it)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
