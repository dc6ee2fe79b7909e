"""Runs across processes (hosts) through `jax.distributed`: what the sweep, the
batched studies and `examples/multihost.py` share (docs/usage/distributed.md). The flags
are checked before any work (`check_flags`), joining has a timeout (`initialize`),
process 0 decides and writes (`agree`, `is_writer`), and a process that stops or is
refused stops the others with one line."""

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from .._batch import as_mesh
from .._validate import SimulationError, refuse_first

#: The statuses of a finished run: 0, 3 (`jaxattn run`: its verdict disagrees) or 4
#: (undecided).
FINISHED = (0, 3, 4)
#: Seconds a process waits for the coordinator (and the others) at start-up.
TIMEOUT_S = 60
#: Seconds without a heartbeat after which the coordination service gives up on a
#: process (JAX's default is 100).
HEARTBEAT_S = 30


class DistributedError(ValueError):
    """A distributed run that cannot start or go on: one line."""


class ProcessLost(DistributedError, SimulationError):
    """Another process stopped while the run went on: the run folder stays, marked
    `INCOMPLETE` (a `SimulationError`: the run failed, its arguments were not refused)."""


def check_flags(coordinator=None, num_processes=None, process_id=None, *, devices=None) -> None:
    """Refuse, in one line, flags that cannot make a distributed run: before any work."""
    host, _, port = (coordinator or "").rpartition(":")
    refuse_first((
        (devices is not None, "a distributed run shards over every process's devices; drop "
         "--devices (each process uses all of its own)."),
        (coordinator is not None and not (host and port.isdigit()),
         f"--coordinator takes HOST:PORT of process 0, got {coordinator!r}."),
        (num_processes is not None and num_processes < 1,
         f"--num-processes must be a whole number ≥ 1, got {num_processes}."),
        (process_id is not None and process_id < 0,
         f"--process-id must be a whole number ≥ 0, got {process_id}."),
        (None not in (num_processes, process_id) and process_id >= num_processes,
         f"--process-id {process_id} is not below --num-processes {num_processes}; "
         "the processes are numbered 0 … N-1."),
    ), DistributedError)


def initialize(coordinator=None, num_processes=None, process_id=None, *,
               timeout: int = TIMEOUT_S) -> None:
    """Join the other processes (`jax.distributed.initialize`); the flags default to
    the environment. Once joined, a second call does nothing."""
    if jax.distributed.is_initialized():
        return
    env = os.environ.get
    coordinator = coordinator or env("JAX_COORDINATOR_ADDRESS")
    me = process_id if process_id is not None else env("JAX_PROCESS_ID")
    if coordinator and me is not None and int(me) != 0:
        _reach(coordinator, timeout)  # JAX aborts the process when it cannot
    if os.environ.get("JAX_PLATFORMS") == "cpu":  # collectives between CPU processes
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(coordinator, num_processes, process_id,
                                   initialization_timeout=timeout,
                                   heartbeat_timeout_seconds=HEARTBEAT_S)
    except Exception as e:  # JAX raises several kinds; the user needs one line
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DistributedError(
            f"cannot join the distributed run at {coordinator or '(from the environment)'} "
            f"within {timeout} s ({reason[:200]}); start every process with the same "
            "--coordinator and --num-processes, process 0 among them.") from None
    if num_processes is not None and jax.process_count() != num_processes:
        raise DistributedError(f"--num-processes {num_processes}, but {jax.process_count()} "
                               "processes joined; give every process the same count.")
    with _others_gone():  # every process is here: none refused its flags
        multihost_utils.sync_global_devices("jaxattn: joined")


def _reach(coordinator: str, timeout: float) -> None:
    """Wait until process 0's coordinator takes connections, or refuse in one line."""
    host, _, port = coordinator.rpartition(":")
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return
        except OSError as e:
            if time.monotonic() > deadline:
                raise DistributedError(
                    f"cannot reach the coordinator {coordinator} within {timeout} s "
                    f"({e.strerror or e}); start process 0 there, or check --coordinator."
                ) from None
            time.sleep(0.2)


def is_writer() -> bool:
    """Whether this process writes files (process 0; every process when alone)."""
    return jax.process_index() == 0


def agree(decide: Callable[[], Sequence[int]]) -> list[int]:
    """Process 0's `decide()` (a list of whole numbers), on every process. A
    mistake on process 0 is raised there and stops the others with one line."""
    if jax.process_count() == 1:
        return list(decide())
    answer, error = [], None
    if is_writer():
        try:
            answer = list(decide())
        except Exception as e:  # raised below, once the others know
            error = e
    head = _broadcast(np.asarray([error is not None, len(answer)], np.int64))
    if head[0]:  # process 0 refused: its own error there, one line on the others
        raise error or DistributedError("process 0 refused the run (its output says why); "
                                        "this process stops too.")
    return [int(v) for v in _broadcast(np.asarray(answer or [0] * int(head[1]), np.int64))]


def _broadcast(value: np.ndarray) -> np.ndarray:
    with _others_gone():
        return np.asarray(multihost_utils.broadcast_one_to_all(value))


def global_mesh() -> Mesh | None:
    """Every process's devices as one mesh once this process joined a distributed run
    (`initialize`), else `None` (one process: its programs as they are)."""
    return as_mesh(jax.devices()) if jax.distributed.is_initialized() else None


def gather(tree):
    """A pytree of arrays, some sharded over devices of other processes, as whole
    arrays on every process."""
    if jax.process_count() == 1:
        return tree
    with _others_gone():
        return multihost_utils.process_allgather(tree, tiled=True)


@contextlib.contextmanager
def _others_gone():
    """A collective that another process never joined (it stopped, or was refused):
    one line, not JAX's traceback."""
    try:
        yield
    except jax.errors.JaxRuntimeError as e:
        reason = str(e).strip().splitlines()[0][:160]
        raise ProcessLost(f"another process stopped or cannot be reached ({reason}); "
                               "this process stops too.") from None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def launch_local(command: Sequence[str], n: int, *, devices_per_process: int = 2,
                 log=print, after: str = "") -> int:
    """Run `command` as `n` processes on this machine (`--coordinator`,
    `--num-processes`, `--process-id` appended), each with `devices_per_process`
    CPU devices, talking through gloo; wait for them. When one fails, the others
    are stopped (they would wait for it) and one line says which, ending with
    `after` (what to do next). A SIGTERM to the launcher stops them too.

    **Returns:** the run's status when every process finished (`FINISHED`), else the
    first failure's."""
    flags = os.environ.get("XLA_FLAGS", "")
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=(
        f"{flags} --xla_force_host_platform_device_count={devices_per_process}").strip())
    common = [*command, "--coordinator", f"localhost:{free_port()}", "--num-processes", str(n)]
    procs = []

    def failed() -> int | None:
        return next((k for k, p in enumerate(procs) if p.poll() not in (None, *FINISHED)), None)

    def terminated(signum, frame):  # `kill`, `timeout`, a scheduler: stop the workers too
        raise SystemExit(128 + signum)

    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, terminated) if main else None
    try:
        procs += [subprocess.Popen([*common, "--process-id", str(k)], env=env)
                  for k in range(n)]
        while failed() is None and any(p.poll() is None for p in procs):
            time.sleep(0.1)
        first = failed()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        if main:
            signal.signal(signal.SIGTERM, previous)
    if first is None:  # every process finished: the run's status
        return max(p.returncode for p in procs)
    code = procs[first].returncode
    log(f"process {first} of {n} exited with status {code}; the others were stopped"
        f"{after}.")
    return code if code > 0 else 1


def launch_argv(argv: Sequence[str]) -> list[str]:
    """`argv` without its `--launch-local N` (the launcher's own flag)."""
    i = next(k for k, a in enumerate(argv) if a.split("=")[0] == "--launch-local")
    return [*argv[:i], *argv[i + (1 if "=" in argv[i] else 2):]]
