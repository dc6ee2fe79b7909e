"""The documentation runs as written.

Every ```python block of README.md and docs/*.md runs, each file's blocks in order
in one namespace, in a subprocess with a temporary working directory (so that the
run folders a snippet writes land there). A block that cannot run offline is marked
in the markdown by an HTML comment `<!-- no-run: why -->` on the line just before
its fence; only those are skipped, and the test counts them. The examples of the
namespace faces (`jaxattn/__init__.py`, `jaxattn/*/__init__.py`) run as doctests.
"""

import doctest
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# README's blocks load two packaged models and compile a dozen programs: ~90 s here
SLOW = {"README.md", "determinism.md", "index.md", "meanfield_equation.md", "noise.md",
        "precision.md"}  # over ~7 s warm each: the slow tests
FACES = ["jaxattn"] + sorted(
    f"jaxattn.{p.parent.name}" for p in (ROOT / "jaxattn").glob("*/__init__.py")
)
_FENCE = re.compile(r"^```(\S*)\s*$")
_NO_RUN = re.compile(r"^<!--\s*no-run:\s*(.+?)\s*-->\s*$")


def python_blocks(text: str) -> list[tuple[int, str, str | None]]:
    """The ```python blocks of a markdown text.

    **Arguments:**

    - `text`: the markdown.

    **Returns:** `(line, code, why_not)` per block, in order: the 1-based line of
    its opening fence, its code, and the reason of a `<!-- no-run: why -->` comment
    on the line before the fence (`None` when the block runs).
    """
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        if match.group(1) == "python":
            mark = _NO_RUN.match(lines[i - 1]) if i else None
            code = "\n".join(lines[i + 1 : end])
            blocks.append((i + 1, code, mark.group(1) if mark else None))
        i = end + 1
    return blocks


def test_python_blocks_reads_fences_and_marks():
    text = (
        "```bash\nls\n```\n```python\na = 1\n```\n"
        "<!-- no-run: needs the model hub -->\n```python\nb = 2\n```\n"
    )
    assert python_blocks(text) == [
        (4, "a = 1", None),
        (8, "b = 2", "needs the model hub"),
    ]


def _program(path: Path) -> tuple[str, int]:
    """One script of a file's runnable blocks, each announced, and the skip count."""
    parts, skipped = [], 0
    for line, code, why_not in python_blocks(path.read_text()):
        if why_not is not None:
            skipped += 1
            continue
        label = f"--- {path.name}:{line}"
        parts.append(f"print({label!r}, round(_time() - _t0, 1), 's', flush=True)\n{code}\n")
    head = "from time import perf_counter as _time\n_t0 = _time()\n"
    return (head + "".join(parts) if parts else ""), skipped


@pytest.mark.parametrize(
    "path",
    [pytest.param(p, marks=pytest.mark.slow) if p.name in SLOW else p for p in DOCS],
    ids=[p.name for p in DOCS],
)
def test_markdown_python_blocks_run(path, tmp_path):
    program, skipped = _program(path)
    print(f"{path.name}: {skipped} block(s) marked no-run")
    if not program:
        pytest.skip(f"{path.name} has no runnable python block")
    env = dict(os.environ, MPLBACKEND="Agg", JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run(
        [sys.executable, "-c", program],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    marks = [ln for ln in proc.stdout.splitlines() if ln.startswith("--- ")]
    print("\n".join(marks))  # each block's start time
    tail = marks[-1:]  # the last announced block is the one that failed
    assert proc.returncode == 0, f"{tail}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"


#: The faces whose docstrings hold `>>>` examples (the others show no code, or only
#: code that needs a model folder or runs minutes, as ```python blocks).
WITH_EXAMPLES = {"jaxattn.explore", "jaxattn.spectral"}


@pytest.mark.parametrize("name", FACES)
def test_face_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(
        module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    )
    assert result.failed == 0, f"{name}: {result.failed} example(s) failed"
    assert (result.attempted > 0) == (name in WITH_EXAMPLES), result
