"""XLA's deterministic mode: the flags that make GPU results bit-identical from run to
run, set by every `jaxattn` command before JAX starts (docs/determinism.md). No JAX
at import: the command line reads `OPT_OUT` before it loads anything."""

import os
import sys

#: The XLA flags that make GPU results bit-identical from run to run: deterministic
#: implementations of scatter/GEMM/… and no autotuning (which may pick a different
#: kernel in each process). Flags of other backends: the CPU is deterministic anyway.
DETERMINISTIC_FLAGS = ("--xla_gpu_deterministic_ops=true", "--xla_gpu_autotune_level=0")
#: Set to 1 (or pass `jaxattn --nondeterministic`) to leave XLA_FLAGS alone.
OPT_OUT = "JAXATTN_NONDETERMINISTIC"


def deterministic_xla_flags(flags: str | None = None) -> str:
    """`XLA_FLAGS` with the deterministic GPU flags (`DETERMINISTIC_FLAGS`) appended:
    set before JAX's first computation, the `jaxattn` commands' bit-identical results
    (how, and when it takes effect: docs/determinism.md).

    **Arguments:**

    - `flags`: the flags to extend (default: the environment's `XLA_FLAGS`). A
      flag already given there keeps its value.

    **Returns:**

    The flags, space-separated.
    """
    flags = os.environ.get("XLA_FLAGS", "") if flags is None else flags
    given = {f.split("=")[0] for f in flags.split()}
    extra = [f for f in DETERMINISTIC_FLAGS if f.split("=")[0] not in given]
    return " ".join(flags.split() + extra)


def is_deterministic(flags: str | None = None) -> bool:
    """Whether `flags` (default: the environment's `XLA_FLAGS`) turn XLA's
    deterministic GPU mode on (its last `--xla_gpu_deterministic_ops` is true)."""
    flags = os.environ.get("XLA_FLAGS", "") if flags is None else flags
    values = [f.split("=", 1)[1].lower() if "=" in f else "true"
              for f in flags.split() if f.split("=")[0] == "--xla_gpu_deterministic_ops"]
    return bool(values) and values[-1] in ("true", "1")


def use_deterministic_xla(enable: bool = True) -> bool:
    """Put the deterministic GPU flags into `XLA_FLAGS`, unless `enable` is false,
    the environment opts out (`JAXATTN_NONDETERMINISTIC=1`) or JAX's backend has
    started already (the flags would not take effect; nothing is changed then).

    **Returns:**

    Whether `XLA_FLAGS` now asks for deterministic results.
    """
    opted_out = os.environ.get(OPT_OUT, "").strip().lower() in ("1", "true", "yes")
    if not enable or opted_out or _backend_started():
        return is_deterministic()
    os.environ["XLA_FLAGS"] = deterministic_xla_flags()
    return True


def _backend_started() -> bool:
    # JAX has no public way to ask without starting the backend; JAX not imported
    # yet: not started.
    bridge = sys.modules.get("jax._src.xla_bridge")
    started = getattr(bridge, "backends_are_initialized", None)
    return bool(started()) if started is not None else False
