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
- **The compilation cache for programs with host callbacks** (`_callback_cache.py`),
  installed once `jax` has finished importing: nothing heavy is imported at start-up,
  so a process that never imports JAX (a CLI refusal, `mkdocs`) stays light.
  `JAXATTN_TEST_CALLBACK_CACHE=0` leaves JAX's cache as it is in that process.
"""

import importlib.util
import os
import sys
from pathlib import Path

#: The test suite's additions to `XLA_FLAGS`: the CPU backend without its MLIR
#: fusion emitters (the elemental emitters compile faster) at LLVM level 1.
TEST_XLA_FLAGS = "--xla_cpu_use_fusion_emitters=false --xla_backend_optimization_level=1"
#: The environment variables: the flags to add, and the cache switch.
FLAGS_VARIABLE, CACHE_SWITCH = "JAXATTN_TEST_XLA_FLAGS", "JAXATTN_TEST_CALLBACK_CACHE"
#: The folder the processes the tests start find `sitecustomize.py` in.
HOOK = Path(__file__).resolve().parent / "_subprocesses"


def with_flags(flags: str, extra: str) -> str:
    """`flags` with each flag of `extra` appended unless one of its name is given.

    The rule of `jaxattn._determinism.deterministic_xla_flags`, not imported from it:
    this runs in `sitecustomize`, before the child's own path entry (its script's
    folder, or the working directory) is on `sys.path`, so importing `jaxattn` here
    could load another checkout than the one the child imports."""
    given = {f.split("=")[0] for f in flags.split()}
    return " ".join(flags.split() + [f for f in extra.split() if f.split("=")[0] not in given])


def start() -> None:
    """The suite's XLA flags and compilation cache for this process, and the start-up
    hook for the processes it starts. Call before JAX's backend starts."""
    os.environ.setdefault(FLAGS_VARIABLE, TEST_XLA_FLAGS)
    os.environ["XLA_FLAGS"] = with_flags(os.environ.get("XLA_FLAGS", ""),
                                         os.environ[FLAGS_VARIABLE])
    path = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(HOOK) not in path:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(HOOK), *filter(None, path)])
    if os.environ.get(CACHE_SWITCH, "1") == "0":
        return
    if "jax" in sys.modules:
        _install_cache()
    elif not any(isinstance(f, _AfterJax) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterJax())


def _install_cache() -> None:
    module = sys.modules.get("_callback_cache")
    if module is None:  # loaded from its file: the tests' folder may not be on the path
        spec = importlib.util.spec_from_file_location(
            "_callback_cache", Path(__file__).with_name("_callback_cache.py"))
        module = sys.modules["_callback_cache"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    module.install()


class _AfterJax:
    """A finder that answers for `jax` alone: the spec the other finders give, its
    loader told to install the cache once the package has run."""

    def find_spec(self, name, path=None, target=None):
        if name != "jax":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _install_cache()

        spec.loader.exec_module = exec_module
        return spec
