"""JAX's persistent compilation cache for programs with host callbacks, in the test
suite only.

jax 0.10's cache neither writes nor reads a program that holds a host callback
(`jax._src.compiler._cache_write`: "because it uses host callbacks"). Every diffrax
solve holds one (diffrax checks `SaveAt(ts=…)` with `eqx.error_if`, a
`pure_callback`), so without this each `make test` compiled every `solve_flow`
program again, in each worker: about half the warm suite's time (BENCHMARKS.md, the
test suite). The callbacks are not part of the compiled program: the program calls
the `index`-th entry of the list the executable is loaded with. Upstream JAX lifted
the restriction the same way (jax-ml/jax pull request 38405): write the program, and
load a cached one with the callbacks of the program just traced, which are the same
ones in the same order (the cache key is the traced module itself). Such programs
are kept under their key with `SUFFIX` appended: a process without this patch (the
`jaxattn` commands the tests start share the cache folder) never finds them, since
JAX would load one without its callbacks, and the first callback it reached would
crash the process.

`install()` does that for the test process alone, and only on a JAX whose
`_cache_write` still refuses callbacks. The library and the `jaxattn` commands the
tests start keep JAX's own behaviour. `tests/core/test_callback_cache.py` checks that a
cached program's error check still raises its message and its result is bit-equal.
"""

import inspect
import threading

_current = threading.local()
#: Appended to the cache key of a program with callbacks.
SUFFIX = "-with-callbacks"


def needed() -> bool:
    from jax._src import compiler

    """Whether this JAX refuses to cache programs with callbacks (patched or not)."""
    return (getattr(compiler, "_jaxattn_callback_cache", False)
            or "because it uses host" in inspect.getsource(compiler._cache_write))


def install() -> bool:
    """Patch the cache once; True where it was needed (and now done)."""
    from jax._src import compilation_cache, compiler

    if not needed() or getattr(compiler, "_jaxattn_callback_cache", False):
        return False
    if not _same_signatures(compiler, compilation_cache):
        return False  # another JAX's internals: leave its cache as it is
    compile_or_get_cached = compiler.compile_or_get_cached
    cache_write = compiler._cache_write
    read = compilation_cache.get_executable_and_time

    def compile_with_callbacks(backend, computation, devices, compile_options,
                               host_callbacks, *args, **kwargs):
        _current.callbacks = list(host_callbacks)
        try:
            return compile_or_get_cached(backend, computation, devices, compile_options,
                                         host_callbacks, *args, **kwargs)
        finally:
            _current.callbacks = []

    def write_with_callbacks(cache_key, compile_time, module_name, backend, executable,
                             host_callbacks):
        key = cache_key + SUFFIX if host_callbacks else cache_key
        return cache_write(key, compile_time, module_name, backend, executable, ())

    def read_with_callbacks(cache_key, compile_options, backend, executable_devices):
        callbacks = getattr(_current, "callbacks", [])
        if not callbacks:
            return read(cache_key, compile_options, backend, executable_devices)
        cache = compilation_cache._get_cache(backend)
        entry = None if cache is None else cache.get(cache_key + SUFFIX)
        if entry is None:
            return None, None
        serialized, compile_time = compilation_cache.extract_executable_and_time(
            compilation_cache.decompress_executable(entry))
        executable = backend.deserialize_executable(
            serialized, executable_devices, compile_options, host_callbacks=callbacks)
        return executable, compile_time

    compiler.compile_or_get_cached = compile_with_callbacks
    compiler._cache_write = write_with_callbacks
    compilation_cache.get_executable_and_time = read_with_callbacks
    compiler._jaxattn_callback_cache = True
    return True


def _same_signatures(compiler, compilation_cache) -> bool:
    """Whether the three functions patched take the arguments this patch passes on."""
    expected = (
        (compiler.compile_or_get_cached,
         ("backend", "computation", "devices", "compile_options", "host_callbacks")),
        (compiler._cache_write, ("cache_key", "compile_time_secs", "module_name", "backend",
                                 "executable", "host_callbacks")),
        (compilation_cache.get_executable_and_time,
         ("cache_key", "compile_options", "backend", "executable_devices")),
    )
    return all(tuple(inspect.signature(f).parameters)[:len(names)] == names
               for f, names in expected)
