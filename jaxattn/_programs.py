"""Compiled programs kept whole in the cache folder: `kept_jit(fn)` is
`eqx.filter_jit(fn)` that keeps the compiled executable itself
(`jax.experimental.serialize_executable`) in JAX's cache folder, under a key computed
without tracing, so that a warm process neither traces nor lowers it (the same program:
the same bits). Which calls are kept, what the key holds and why: docs/usage/speed.md,
"Programs the cache can keep"."""

import contextlib
import functools
import hashlib
import importlib
import inspect
import io
import os
import pickle
import re
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

import equinox as eqx
import jax
import numpy as np
from jax.experimental import serialize_executable
from jax.experimental.compilation_cache import compilation_cache

from ._files import atomic_write

#: Whether calls may take kept programs (the test suite turns it off: tests that patch
#: the library's internals must trace them).
ENABLED = True
#: JAX settings that change what a traced program is (its dtypes, products, keys).
TRACE_SETTINGS = ("jax_enable_x64", "jax_default_matmul_precision", "jax_default_prng_impl",
                  "jax_threefry_partitionable", "jax_numpy_dtype_promotion")
#: JAX's monitoring event of a kept program's load (its duration; the benchmarks read it).
LOAD_EVENT = "/jaxattn/programs/load_duration"
#: The same of a load on another thread (`loaded_ahead`); the caller waits `LOAD_EVENT`.
AHEAD_EVENT = "/jaxattn/programs/load_ahead_duration"
#: The programs of this process, by key (`None`: not keepable, `eqx.filter_jit`'s).
_LOADED: dict[str, tuple[Callable, object] | None] = {}
#: Programs being loaded ahead (`loaded_ahead`), by key; the keys this run took.
_AHEAD: dict[str, Future] = {}
_USED: dict[str, None] = {}


#: The packages whose functions and classes a key may name (their versions are in
#: `source_stamp`): a user's own may change between two runs under the same name.
NAMED = ("jaxattn", "jax", "jaxlib", "equinox", "diffrax", "lineax", "optimistix", "optax",
         "numpy")


@functools.cache
def source_stamp() -> str:
    """The versions of the `NAMED` packages, and the names, sizes and times of
    jaxattn's sources: a program kept before an upgrade or an edit is never loaded."""
    root, stats = os.path.dirname(__file__), []
    for folder, folders, files in os.walk(root):  # not pathlib's rglob: 10× slower here
        folders.sort()
        for name in sorted(f for f in files if f.endswith(".py")):
            info = os.stat(os.path.join(folder, name))
            stats.append((os.path.relpath(os.path.join(folder, name), root), info.st_size,
                          info.st_mtime_ns))
    versions = []
    for name in NAMED:  # installed, imported yet or not (an imported one's own attribute:
        try:  # reading the packages' metadata took 10 ms of a warm `loop`'s first call)
            versions.append(getattr(sys.modules.get(name), "__version__", None)
                            or metadata.version(name))
        except metadata.PackageNotFoundError:
            versions.append(None)
    return hashlib.sha256(repr((versions, stats)).encode()).hexdigest()


def _name(obj) -> str | None:
    """`module:qualname` of a module-level function or class (jitted or not) of one of
    the `NAMED` packages, which another process imports as the same object; else
    `None`."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if (not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname
            or module.partition(".")[0] not in NAMED):
        return None
    found = _attribute(sys.modules.get(module), qualname)
    return f"{module}:{qualname}" if found is obj else None


def _attribute(module, qualname: str):
    """`module.qualname` (dotted), or `None` where a part is missing."""
    for part in qualname.split("."):
        module = getattr(module, part, None)
    return module


class _Pickler(pickle.Pickler):
    """Module-level functions and classes by name (a jitted one does not pickle)."""

    def persistent_id(self, obj):
        return _name(obj) if callable(obj) else None


class _Unpickler(pickle.Unpickler):
    def persistent_load(self, name):
        module, qualname = name.split(":")
        found = _attribute(importlib.import_module(module), qualname)
        if found is None:  # gone since the entry was written: compiled again
            raise pickle.UnpicklingError(f"{name} is not there")
        return found


def _describe(treedef, traced: list[bool], static: list) -> str | None:
    """The arguments' structure (`treedef`, which of its leaves are `traced`) and the
    `static` leaves' values as text another process writes the same, or `None` where it
    holds an address (a function not at a module's top) or names a class or function
    of the user's own (`_ours`)."""
    if any(isinstance(x, set | frozenset) for x in static):  # printed in a random order
        return None
    if not (_ours(treedef) and all(map(_ours, static))):
        return None
    named = [("function", n) if callable(x) and (n := _name(x)) else x for x in static]
    described = repr((treedef, traced, named))
    return None if " at 0x" in described else described


#: Modules whose classes a key may name besides the `NAMED` packages' (unchanging).
_BUILTIN = ("builtins", "collections")


def _ours(x) -> bool:
    """Whether `x` (a treedef, a static value) names only classes and functions of the
    `NAMED` packages or Python's own. A user's class or function is named in a key by
    its short name alone, and `source_stamp` does not see it change: edited between two
    runs, or redefined in a notebook's cell, it would load the program of the old one
    (this process's table holds it by the same key). Its programs go to
    `eqx.filter_jit`, which tells two classes apart by the objects themselves."""
    if isinstance(x, jax.tree_util.PyTreeDef):
        try:
            return _ours_structure(x)
        except TypeError:  # static data that does not hash: walked every time
            return _ours_structure.__wrapped__(x)
    if isinstance(x, type):
        module = getattr(x, "__module__", None)
        return isinstance(module, str) and (module in _BUILTIN
                                            or module.partition(".")[0] in NAMED)
    if x is None or isinstance(x, bool | int | float | complex | str | bytes):
        return True
    if isinstance(x, tuple | list):
        return all(map(_ours, x))
    if isinstance(x, dict):
        return all(map(_ours, x)) and all(map(_ours, x.values()))
    if callable(x) and _name(x) is not None:
        return True
    # an instance of a class of theirs; a function or method (Python's own classes)
    # not named above is a user's, or one with an address: refused all the same
    return _ours(type(x)) and not (callable(x) and type(x).__module__ in _BUILTIN)


@functools.lru_cache(maxsize=4096)  # a treedef hashes in ~0.3 µs; its walk took ~50-100 µs
def _ours_structure(treedef) -> bool:
    data = treedef.node_data()  # (node type, its static data: a Module's static fields)
    return (data is None or _ours(data)) and all(map(_ours, treedef.children()))


def _placement(a):
    """Where `a` is, a host value where `jit` puts it (the default device): one
    program for a NumPy array and the same array on that device."""
    if isinstance(a, jax.Array):
        return a.sharding
    default = jax.config.jax_default_device  # a device, a platform's name or None
    if not isinstance(default, jax.Device):
        default = jax.devices(default)[0]
    return jax.sharding.SingleDeviceSharding(default)


def _key(fn, static: str, leaves) -> str:
    return _hashed(f"{fn.__module__}.{fn.__qualname__}", static,
                   tuple((jax.typeof(a), _placement(a)) for a in leaves),
                   tuple(getattr(jax.config, name) for name in TRACE_SETTINGS),
                   os.environ.get("XLA_FLAGS"))


@functools.lru_cache(maxsize=4096)  # once per process (a call then costs ~20 µs over jit)
def _hashed(*parts) -> str:
    device = jax.devices()[0]
    parts += (device.platform, device.device_kind, jax.device_count(), source_stamp())
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def _keepable(leaves) -> bool:
    return all(isinstance(a, np.ndarray | np.generic | bool | int | float | complex) or (
        isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer)
        and len(a.sharding.device_set) == 1) for a in leaves)


def _compile(fn, leaves):
    """`fn` compiled by XLA past JAX's cache (an executable JAX loaded from its cache
    serializes without its kernels on the CPU: "Function … not found" when run), and
    whether it calls LAPACK; `None` for a program that holds a host callback, or that
    takes its inputs split over devices (a mesh inside: `jit` reshards the arguments, a
    compiled program does not)."""
    lowered = jax.jit(fn).lower(*leaves)
    text = lowered.as_text()
    if "callback" in text:
        return None
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()  # JAX reads the setting once per process
    try:
        compiled = lowered.compile()
    finally:
        jax.config.update("jax_enable_compilation_cache", True)
        compilation_cache.reset_cache()
    shardings = jax.tree.leaves(compiled.input_shardings)
    if not all(len(s.device_set) == 1 for s in shardings):
        return None
    return compiled, "lapack" in text  # whether it calls LAPACK's kernels (`_lapack`)


@functools.cache
def _loadable() -> bool:
    """Whether programs can be kept here: on the CPU (the only backend they were tried
    on), with JAX's registration of LAPACK's kernels at hand (`_lapack`)."""
    if jax.default_backend() != "cpu":
        return False
    try:
        from jax._src.lax.linalg import initialize_lapack  # noqa: F401
    except ImportError:  # another JAX: programs are traced as usual
        return False
    return True


@functools.cache
def _lapack() -> None:
    """LAPACK's kernels registered, as `jax.export` does before it runs a program read
    from bytes (a loaded program that calls them crashes otherwise). Only before a
    program that calls them: it imports SciPy's LAPACK, 0.1 s of a warm start."""
    from jax._src.lax.linalg import initialize_lapack

    initialize_lapack()


def _program(fn, key: str, call: Callable, leaves):
    """The compiled program of the entry `key` and its outputs' structure: loaded from
    JAX's cache folder, or compiled and kept there (with the access time JAX's
    eviction reads beside it, as JAX's own entries); `None` if it cannot be kept.
    `call(leaves)` calls `fn` with these leaves (traced) in the arguments."""
    folder = Path(jax.config.jax_compilation_cache_dir)
    path = folder / f"jaxattn_program-{key}-cache"
    if (jax.process_count() > 1 or not _loadable()  # one process: the case tried
            or path.with_name(f"jaxattn_program-{key}-traced").exists()):
        return None
    start = time.perf_counter()
    try:
        ahead = _AHEAD.pop(key, None)
        compiled, rest = (ahead and ahead.result()) or _read(path, key)
        loaded = compiled, _outputs(_Unpickler(rest).load())
        jax.monitoring.record_event_duration_secs(LOAD_EVENT, time.perf_counter() - start,
                                                  fun_name=fn.__qualname__)
        _USED[key] = None
        return loaded
    except Exception:  # missing, or unreadable by this JAX: compiled again below
        pass
    out = []

    def flat(*leaves):
        outputs = call(leaves)
        # the outputs with shapes for arrays: pickled whole (a treedef of Modules is not)
        out.append(jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype)
                                if eqx.is_array(a) else a, outputs))
        return jax.tree.leaves(eqx.filter(outputs, eqx.is_array))

    compiled, lapack = _compile(flat, leaves) or (None, False)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if compiled is None:
            path.with_name(f"jaxattn_program-{key}-traced").touch()
            return None
        entry = io.BytesIO()
        ids = sorted({d.id for s in jax.tree.leaves(compiled.input_shardings)
                      for d in s.device_set} or {jax.devices()[0].id})
        pickle.dump((key, serialize_executable.serialize(compiled), ids, lapack), entry)
        _Pickler(entry).dump(out[0])  # apart: it may import modules (`_read`)
        atomic_write(path, lambda f: f.write(entry.getvalue()))
        _USED[key] = None
        path.with_name(f"jaxattn_program-{key}-atime").write_bytes(
            time.time_ns().to_bytes(8, "little"))
    except Exception:  # unwritable, or outputs another process could not rebuild:
        pass  # this process keeps it, the next compiles it again
    return None if compiled is None else (compiled, _outputs(out[0]))


def _read(path: Path, key: str, ahead: bool = False):
    """The executable kept in `path`, and the rest of the entry: its outputs'
    structure, which may import modules, unpickled by the caller. Nothing is imported
    `ahead` (on another thread, `loaded_ahead`): there an entry that calls LAPACK is
    left to the caller (`None`). Raises if unreadable, or if the entry holds another
    key than `key` (one program's bytes under another's name: copied, renamed)."""
    entry = io.BytesIO(path.read_bytes())
    kept, payload, ids, lapack = pickle.load(entry)
    if kept != key:
        raise ValueError(f"{path.name} holds the program of {kept}")
    if lapack and ahead:
        return None
    if lapack:
        _lapack()
    devices = {d.id: d for d in jax.devices()}  # its own: JAX's default is every device
    return serialize_executable.deserialize_and_load(
        *payload, execution_devices=[devices[i] for i in ids]), entry


def _read_ahead(path: Path, key: str):
    start = time.perf_counter()
    try:
        read = _read(path, key, ahead=True)
    except Exception:  # the caller reads it again, then compiles
        return None
    if read is None:
        return None
    jax.monitoring.record_event_duration_secs(AHEAD_EVENT, time.perf_counter() - start)
    return read


@contextlib.contextmanager
def loaded_ahead(tag: str):
    """Within it, the kept programs the last run of `tag` (a command line) took are
    loaded on two other threads, in the order that run took them, ahead of their first
    call; at its end, the programs this run took are written down for the next.
    Loading (~0.1 s per MB of program) then overlaps the run's own start-up."""
    folder = jax.config.jax_compilation_cache_dir
    if not (ENABLED and folder and jax.config.jax_enable_compilation_cache and _loadable()
            and jax.process_count() == 1):
        yield
        return
    order = Path(folder) / f"jaxattn_run-{hashlib.sha256(tag.encode()).hexdigest()}-order"
    try:  # keys only: a word that is not one names no file
        keys = [k for k in order.read_text().split() if re.fullmatch("[0-9a-f]{64}", k)]
    except (OSError, UnicodeDecodeError):
        keys = []
    _USED.clear()
    pool = ThreadPoolExecutor(2, thread_name_prefix="jaxattn-load")
    for key in keys:
        if key not in _LOADED:
            _AHEAD[key] = pool.submit(_read_ahead,
                                      order.with_name(f"jaxattn_program-{key}-cache"), key)
    try:
        yield
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        _AHEAD.clear()
    if list(_USED) != keys:
        try:
            atomic_write(order, lambda f: f.write("\n".join(_USED).encode()))
        except OSError:  # unwritable: the next run loads as it goes
            pass


def _outputs(skeleton):
    """The structure of a program's array outputs, and its other outputs."""
    shaped, rest = eqx.partition(skeleton, lambda a: isinstance(a, jax.ShapeDtypeStruct))
    return jax.tree.structure(shaped), rest


def kept_jit(fn: Callable | None = None, *, static_argnames: tuple[str, ...] | None = None):
    """`eqx.filter_jit(fn)` whose compiled programs are kept in JAX's cache folder and
    loaded by later processes without tracing (the module's docstring). With
    `static_argnames`, `jax.jit(fn, static_argnames=…)` instead: every other argument
    traced, Python numbers too. `fn` is a module-level function: its name, with its
    arguments, names its program."""
    if fn is None:
        return functools.partial(kept_jit, static_argnames=static_argnames)
    if static_argnames is None:
        jitted = eqx.filter_jit(fn)

        def split(args, kwargs):  # traced: the arrays, as `eqx.filter_jit` splits them
            leaves, treedef = jax.tree.flatten((args, kwargs))
            return leaves, treedef, [eqx.is_array(a) for a in leaves]

        def apply(args, kwargs):
            return fn(*args, **kwargs)
    else:
        jitted, signature = jax.jit(fn, static_argnames=static_argnames), inspect.signature(fn)

        def split(args, kwargs):  # every argument by name traced but the static ones
            named = signature.bind(*args, **kwargs).arguments
            dynamic = {k: v for k, v in named.items() if k not in static_argnames}
            leaves, treedef = jax.tree.flatten(
                (dynamic, {k: v for k, v in named.items() if k in static_argnames}))
            count = treedef.children()[0].num_leaves
            return leaves, treedef, [i < count for i in range(len(leaves))]

        def apply(dynamic, static):
            return fn(**dynamic, **static)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if not (ENABLED and jax.config.jax_enable_compilation_cache
                and jax.config.jax_compilation_cache_dir):
            return jitted(*args, **kwargs)
        every, treedef, traced = split(args, kwargs)  # one flatten: a Module's is slow
        leaves = [a for a, t in zip(every, traced) if t]
        static = [a for a, t in zip(every, traced) if not t]
        described = _describe(treedef, traced, static)
        if described is None or not _keepable(leaves):
            return jitted(*args, **kwargs)
        key = _key(fn, described, leaves)
        if key not in _LOADED:

            def rebuilt(arrays):  # `fn` on these arrays in place of the traced leaves
                arrays, rest = iter(arrays), iter(static)
                return apply(*jax.tree.unflatten(
                    treedef, [next(arrays) if t else next(rest) for t in traced]))

            _LOADED[key] = _program(fn, key, rebuilt, leaves)
        if _LOADED[key] is None:
            return jitted(*args, **kwargs)
        compiled, (structure, rest) = _LOADED[key]
        try:
            return eqx.combine(jax.tree.unflatten(structure, compiled(*leaves)), rest)
        except Exception:  # a kept program that does not take these arguments (or fails
            _LOADED[key] = None  # as the traced one will): `eqx.filter_jit`'s from now on
            return jitted(*args, **kwargs)

    call.lower = jitted.lower  # ahead-of-time compilation, as the jitted function's
    return call
