"""`make run` installs what the demo needs and nothing more (the package with its
core dependencies: no `dev` extra, no torch); `make test` installs the `dev` extra;
the demo runs without any optional package."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OPTIONAL = ("torch", "transformers", "tokenizers", "safetensors", "gguf", "huggingface_hub",
            "pytest", "hypothesis", "jupytext", "nbclient", "mkdocs", "imageio_ffmpeg")


def _planned(target: str, *args: str) -> list[str]:
    """The pip commands `make TARGET` would run in a fresh environment (make -n)."""
    if shutil.which("make") is None:
        pytest.skip("needs make")
    out = subprocess.run(["make", "-n", target, "VENV=/nonexistent-venv", *args], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if "pip install" in line]


def test_make_run_installs_only_the_package():
    installs = _planned("run")
    assert installs[-1].endswith("pip install --quiet -e '.'"), installs
    assert not any("torch" in line or "dev" in line or "smollm" in line for line in installs)
    gpu = _planned("run", "EXTRAS=dev,cuda")
    assert gpu[-1].endswith("-e '.[cuda]'"), gpu  # the GPU build, still no dev extra
    assert any(line.endswith("-e '.[dev]'") for line in _planned("test"))


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
def test_the_demo_runs_without_the_optional_packages(tmp_path):
    # as if not installed: the import system finds none of them
    script = f"""
import sys
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {OPTIONAL!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Absent())
from jaxattn.cli import main
sys.exit(main(["demo", "--horizon", "0.5", "--out", {str(tmp_path)!r}]))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, env={"MPLBACKEND": "Agg", "PATH": "/usr/bin:/bin",
                                           "HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "demo_sphere.png").exists()
