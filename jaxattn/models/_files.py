"""The files a model's weights are read from: what a resumed loop hashes
(`file_sha256`) to be sure it continues with the same weights (a file rewritten in
place keeps its name, not its bytes)."""

import os
from pathlib import Path

from ._load import INDEX, download, read_index, weight_file
from ._packaged import PACKAGED, installed_path


def weight_files(source: str | os.PathLike) -> list[Path]:
    """The files `ja.models.load(source)` reads the weights from: a `.gguf` file, a
    folder's index and the shards it names, or its one `*.safetensors` file.

    **Arguments:**

    - `source`: as `ja.models.load` takes it (a folder, its `config.json`, a `.gguf`
      file, a packaged model's name, or a hub name already in the local cache).

    **Returns:**

    The paths, the index first when there is one.
    """
    path = Path(source)
    if not path.exists():
        path = installed_path(str(source)) if str(source) in PACKAGED else download(str(source))
    if path.is_file():
        return [path] if path.suffix == ".gguf" else weight_files(path.parent)
    if (path / INDEX).exists():
        shards = sorted(set(read_index(path / INDEX).values()))
        return [path / INDEX] + [path / shard for shard in shards]
    return [weight_file(path)]
