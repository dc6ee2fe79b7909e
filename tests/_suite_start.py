"""What every Python process of the test suite does first: the pytest workers
(`tests/conftest.py` calls `start()`) and every Python they start (`jaxattn`
commands, documentation pages, notebook kernels, 4-device scripts), which import
`tests/_subprocesses/sitecustomize.py` at start-up since conftest puts that folder
first on `PYTHONPATH`.

- **XLA's CPU compiler set for compile time** (`TEST_XLA_FLAGS`, appended to
  `XLA_FLAGS` unless a flag of the same name is there): most of a fresh clone's test
  time is compilation, and these flags compile the suite's programs 30–40 % faster
  with the same run time on the tests measured (BENCHMARKS.md, Measured claims:
  `tests/_suite_start.py`). Users' runs keep XLA's defaults. Where a test needs a
  child's `XLA_FLAGS` exactly as it gave them, it sets `JAXATTN_TEST_XLA_FLAGS=""`.

Nothing heavy is imported at start-up, so a process that never imports JAX (a CLI
refusal, `mkdocs`) stays light. The persistent compilation cache needs no help: the
library's programs hold no host callback on concrete inputs (BENCHMARKS.md, "Warm
starts").
"""

import os
from pathlib import Path

#: The test suite's additions to `XLA_FLAGS`: the CPU backend without its MLIR
#: fusion emitters (the elemental emitters compile faster) at LLVM level 1.
TEST_XLA_FLAGS = "--xla_cpu_use_fusion_emitters=false --xla_backend_optimization_level=1"
#: The environment variable of the flags to add.
FLAGS_VARIABLE = "JAXATTN_TEST_XLA_FLAGS"
#: The folder the processes the tests start find `sitecustomize.py` in.
HOOK = Path(__file__).resolve().parent / "_subprocesses"


def with_flags(flags: str, extra: str) -> str:
    """`flags` with each flag of `extra` appended unless one of its name is given.

    The rule of `jaxattn._process.determinism.deterministic_xla_flags`, not imported from it:
    this runs in `sitecustomize`, before the child's own path entry (its script's
    folder, or the working directory) is on `sys.path`, so importing `jaxattn` here
    could load another checkout than the one the child imports."""
    given = {f.split("=")[0] for f in flags.split()}
    return " ".join(flags.split() + [f for f in extra.split() if f.split("=")[0] not in given])


def start() -> None:
    """The suite's XLA flags for this process, and the start-up hook for the processes
    it starts. Call before JAX's backend starts."""
    os.environ.setdefault(FLAGS_VARIABLE, TEST_XLA_FLAGS)
    os.environ["XLA_FLAGS"] = with_flags(os.environ.get("XLA_FLAGS", ""),
                                         os.environ[FLAGS_VARIABLE])
    path = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(HOOK) not in path:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(HOOK), *filter(None, path)])
