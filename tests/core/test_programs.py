"""Programs kept whole in the cache folder (`_programs.kept_jit`, issue #42): a later
process loads them without tracing and gets the same bits; what another process could
not name, traced arguments and programs with host callbacks go to `eqx.filter_jit`;
an unreadable entry is compiled again."""

import io
import json
import os
import pickle
import subprocess
import sys
import textwrap

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxattn import _programs
from jaxattn._process.cache import clear_cache
from jaxattn._programs import kept_jit

TRACES = []


class Scaled(eqx.Module):
    """A model with an array, a static number and a module-level function."""

    w: jax.Array
    power: int = eqx.field(static=True)
    act: object = jnp.tanh


@kept_jit
def _apply(model: Scaled, x, n: int):
    TRACES.append(n)
    y = model.act(model.w * x) ** model.power
    return {"y": y * n, "shape": x.shape, "model": eqx.tree_at(lambda m: m.w, model, y.sum())}


@kept_jit(static_argnames=("n",))
def _scaled(x, scale, *, n):
    TRACES.append(n)
    return jnp.tile(x * scale, n)


@kept_jit
def _checked(x):
    return eqx.error_if(x, jnp.any(x < 0), "negative")  # a host callback



@pytest.fixture(autouse=True)
def ours(monkeypatch):
    """This module's classes and functions stand for the library's own (a user's are
    not kept: `test_a_users_class_edited_or_redefined_gets_its_own_program`)."""
    monkeypatch.setattr(_programs, "NAMED", (*_programs.NAMED, __name__.partition(".")[0]))


def kept(folder):
    return sorted(p.name.rsplit("-", 1)[1] for p in folder.glob("jaxattn_program-*"))


@kept_jit
def _through(kernel, x):
    return kernel(x)


def _users_kernel(factor):
    """A class of a user's notebook, whose cell is run again with another constant."""

    class Kernel(eqx.Module):
        __module__, __qualname__ = "__main__", "Kernel"
        w: jax.Array

        def __call__(self, x):
            return jnp.exp(factor * self.w * x)

    return Kernel


def test_a_new_process_loads_the_program_without_tracing_and_gets_the_same_bits(
        folder, monkeypatch):
    model, x = Scaled(jnp.linspace(-1.0, 1.0, 5), 3), np.linspace(0.0, 2.0, 5)
    del TRACES[:]
    out = _apply(model, x, 2)
    assert TRACES == [2] and kept(folder) == ["atime", "cache"]
    want = eqx.filter_jit(_apply.__wrapped__)(model, x, 2)  # traced on its own
    np.testing.assert_allclose(out["y"], want["y"], rtol=1e-15)
    monkeypatch.setattr(_programs, "_LOADED", {})  # a new process: only the folder
    del TRACES[:]
    again = _apply(model, x, 2)
    assert TRACES == []  # loaded, neither traced nor lowered
    np.testing.assert_array_equal(again["y"], out["y"])
    assert again["shape"] == (5,) and again["model"].power == 3
    assert again["model"].act is jnp.tanh  # a module-level function, by name
    np.testing.assert_array_equal(again["model"].w, out["y"].sum() / 2)
    # another static value, another program; another dtype, another program
    _apply(model, x, 3)
    _apply(model, x.astype(np.float32), 2)
    assert kept(folder) == ["atime"] * 3 + ["cache"] * 3


def test_with_static_argnames_numbers_are_traced_as_under_jax_jit(folder, monkeypatch):
    x = np.arange(3.0)
    del TRACES[:]
    np.testing.assert_array_equal(_scaled(x, 2.0, n=2), np.tile(2 * x, 2))
    np.testing.assert_array_equal(_scaled(x, 3.0, n=2), np.tile(3 * x, 2))  # same program
    assert TRACES == [2] and kept(folder) == ["atime", "cache"]
    monkeypatch.setattr(_programs, "_LOADED", {})
    np.testing.assert_array_equal(_scaled(x, scale=0.5, n=2), np.tile(x / 2, 2))
    assert TRACES == [2]  # loaded: by name or by place, the same arguments
    _scaled(x, 1.0, n=3)
    assert TRACES == [2, 3] and kept(folder) == ["atime"] * 2 + ["cache"] * 2
    # the same array on the device: the same program (`jit` puts a host array there)
    np.testing.assert_array_equal(_scaled(jnp.asarray(x), 1.0, n=3), np.tile(x, 2 + 1))
    assert TRACES == [2, 3] and kept(folder) == ["atime"] * 2 + ["cache"] * 2


def test_what_another_process_could_not_name_goes_to_filter_jit(folder):
    x = jnp.linspace(0.0, 1.0, 4)
    local = Scaled(x, 1, act=lambda v: v + 1)  # its repr holds an address
    np.testing.assert_allclose(_apply(local, x, 1)["y"], x * x + 1)
    # traced arguments (under the caller's jit) take the traced program
    traced = jax.jit(lambda v: _apply(Scaled(v, 1), v, 1)["y"])(x)
    np.testing.assert_allclose(traced, jnp.tanh(x * x))
    assert kept(folder) == []


def test_a_users_class_edited_or_redefined_gets_its_own_program(folder, tmp_path):
    """A user's class is named in a key by its short name, and its edits change no
    source jaxattn fingerprints: its programs go to `eqx.filter_jit`, in this process
    (a notebook's cell run again) and in the next (the script edited)."""
    x = np.linspace(0.0, 1.0, 4)
    for factor in (1.0, 3.0):
        got = _through(_users_kernel(factor)(jnp.ones(4)), x)
        np.testing.assert_allclose(got, np.exp(factor * x), rtol=1e-6)
    assert kept(folder) == []
    script = textwrap.dedent(f"""
        import os, jax, jax.numpy as jnp, numpy as np, equinox as eqx
        jax.config.update("jax_compilation_cache_dir", {str(tmp_path / "cache")!r})
        from jaxattn import _programs

        class Kernel(eqx.Module):
            w: jax.Array

            def __call__(self, x):
                return jnp.exp(float(os.environ["FACTOR"]) * self.w * x)

        @_programs.kept_jit
        def through(kernel, x):
            return kernel(x)

        print(np.asarray(through(Kernel(jnp.ones(2)), np.ones(2)))[0])
    """)
    path = tmp_path / "edited.py"
    path.write_text(script)
    runs = [subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                           timeout=300, env=os.environ | {"FACTOR": factor})
            for factor in ("1", "3")]
    assert [r.returncode for r in runs] == [0, 0], runs[-1].stderr[-2000:]
    np.testing.assert_allclose([float(r.stdout) for r in runs], np.exp([1.0, 3.0]), rtol=1e-6)


def test_a_program_with_a_host_callback_is_not_kept(folder, monkeypatch):
    x = jnp.arange(3.0)
    np.testing.assert_array_equal(_checked(x), x)
    assert kept(folder) == ["traced"]  # the marker: later processes trace it
    monkeypatch.setattr(_programs, "_LOADED", {})
    with pytest.raises(eqx.EquinoxRuntimeError, match="negative"):
        _checked(-x - 1)
    assert kept(folder) == ["traced"]
    clear_cache(folder)  # `jaxattn cache clear` takes the marker as an entry
    assert kept(folder) == []


def test_an_unreadable_entry_is_compiled_again(folder, monkeypatch):
    model, x = Scaled(jnp.ones(3), 2), np.arange(3.0)
    want = _apply(model, x, 1)["y"]
    entry = next(folder.glob("jaxattn_program-*-cache"))
    for bad in (b"not a program", entry.read_bytes()[:200]):
        entry.write_bytes(bad)
        monkeypatch.setattr(_programs, "_LOADED", {})
        del TRACES[:]
        np.testing.assert_array_equal(_apply(model, x, 1)["y"], want)
        assert TRACES == [1] and entry.read_bytes() != bad  # traced, and replaced


def test_an_entry_under_another_key_is_compiled_again(folder, monkeypatch):
    """Entries swapped (one program's bytes under another's name): the key kept inside
    tells them apart, and a loaded program that does not take the arguments (whatever
    the cause) gives way to the traced one; the results are right either way."""
    model, x = Scaled(jnp.ones(3), 2), np.arange(3.0)
    want = [_apply(model, x, 1)["y"], _apply(model, x, 2)["y"], _scaled(x, 2.0, n=2)]
    new = sorted(folder.glob("jaxattn_program-*-cache"), key=lambda p: p.stat().st_mtime_ns)
    entries = [p.read_bytes() for p in new]
    for i, j in ((0, 1), (1, 0), (2, 0)):  # the same arguments' types; others
        new[i].write_bytes(entries[j])
    monkeypatch.setattr(_programs, "_LOADED", {})
    del TRACES[:]
    got = [_apply(model, x, 1)["y"], _apply(model, x, 2)["y"], _scaled(x, 2.0, n=2)]
    assert TRACES == [1, 2, 2]  # compiled again, each
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    # past the key's check: the call fails, and the traced program runs instead
    read = _programs._read
    monkeypatch.setattr(_programs, "_read", lambda path, key, ahead=False: read(new[0], (
        pickle.load(io.BytesIO(new[0].read_bytes()))[0]), ahead))
    monkeypatch.setattr(_programs, "_LOADED", {})
    np.testing.assert_array_equal(_scaled(x, 2.0, n=2), want[2])


def test_a_run_loads_the_programs_of_its_last_run_ahead(folder, monkeypatch):
    """`loaded_ahead(tag)` writes down the programs a run took; the next run of the
    same tag loads them on another thread, ahead of their first call (same bits, no
    trace); a list naming a lost entry, or another tag, costs nothing but a compile."""
    model, x = Scaled(jnp.linspace(-1.0, 1.0, 4), 2), np.arange(4.0)
    with _programs.loaded_ahead("run a"):
        want = _apply(model, x, 2)["y"], _scaled(x, 2.0, n=2)
    order = list(folder.glob("jaxattn_run-*-order"))
    assert len(order) == 1 and len(order[0].read_text().split()) == 2
    order[0].write_text(order[0].read_text() + "\n../../elsewhere")  # not a key: ignored
    monkeypatch.setattr(_programs, "_LOADED", {})  # a new process: only the folder
    with _programs.loaded_ahead("run b"):
        assert not _programs._AHEAD  # another command, or other settings
    del TRACES[:]
    with _programs.loaded_ahead("run a"):
        assert len(_programs._AHEAD) == 2  # both on their way before the first call
        got = _apply(model, x, 2)["y"], _scaled(x, 2.0, n=2)
    assert TRACES == [] and not _programs._AHEAD
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    # an entry lost since (`jaxattn cache clear` on another terminal): compiled again
    next(folder.glob("jaxattn_program-*-cache")).unlink()
    monkeypatch.setattr(_programs, "_LOADED", {})
    with _programs.loaded_ahead("run a"):
        got = _apply(model, x, 2)["y"], _scaled(x, 2.0, n=2)
    assert len(TRACES) == 1 and len(list(folder.glob("jaxattn_run-*-order"))) == 1
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    clear_cache(folder)  # the list is one of the folder's entries
    assert not list(folder.iterdir())


def test_a_loaded_program_that_calls_lapack_runs_in_a_fresh_process(tmp_path):
    """A CPU program calling LAPACK (eigenvalues) crashed the process when loaded
    before any LAPACK call had been lowered: the kernels register first."""
    script = textwrap.dedent(f"""
        import json, jax, jax.numpy as jnp, numpy as np
        jax.config.update("jax_compilation_cache_dir", {str(tmp_path)!r})
        from jaxattn import _programs
        loaded = []
        jax.monitoring.register_event_duration_secs_listener(
            lambda event, s, **kw: loaded.append(event) if event == _programs.LOAD_EVENT else 0)

        @_programs.kept_jit
        def eig(a):
            return jnp.linalg.eigvalsh(a + a.T)

        a = np.arange(9.0).reshape(3, 3) / 7
        values = np.asarray(eig(a)).tolist()
        print(len(loaded), json.dumps(values))
    """)
    path = tmp_path / "eig.py"
    path.write_text(script)
    runs = [subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                           timeout=300) for _ in range(2)]
    assert [r.returncode for r in runs] == [0, 0], runs[1].stderr[-2000:]
    (n0, first), (n1, second) = (r.stdout.split(" ", 1) for r in runs)
    assert (n0, n1) == ("0", "1") and first == second  # compiled, then loaded: same bits
    a = np.arange(9.0).reshape(3, 3) / 7
    np.testing.assert_allclose(json.loads(first), np.linalg.eigvalsh(a + a.T), atol=1e-5)  # float32


@pytest.mark.slow  # warm: over ~3 s (make test stays the fast loop)
def test_the_library_s_solves_and_layer_runs_are_kept(folder, monkeypatch, traced):
    """`ja.solve_flow` (with an event of `merged`, a module) and `ja.run_layers` on
    concrete inputs: kept, loaded by a new process with the same bits, equal to the
    traced programs to rounding."""
    import jaxattn as ja
    from jaxattn.experiments.long_time import merged

    dyn = ja.random_dynamics(jax.random.PRNGKey(0), 1, 3)
    x0 = ja.sample_ellipsoid(jax.random.PRNGKey(1), 6, 3)

    ts = jnp.linspace(0.0, 2.0, 5)

    def runs():
        flow = ja.solve_flow(dyn, x0, ts, solution=True, event=merged(0.05))
        return flow.ys, ja.run_layers(dyn, x0, num_layers=4, tau=0.1)

    first = runs()
    count = len(list(folder.glob("jaxattn_program-*-cache")))
    monkeypatch.setattr(_programs, "_LOADED", {})
    del traced[:]
    again = runs()
    assert "solve_batched" not in traced and "layers_program" not in traced, traced
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    assert len(list(folder.glob("jaxattn_program-*-cache"))) == count  # nothing new
    monkeypatch.setattr(_programs, "ENABLED", False)
    for a, b in zip(first, runs(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.slow  # warm: over ~3 s (make test stays the fast loop)
def test_a_process_with_several_devices_loads_programs_for_one(tmp_path):
    """On 4 devices a program compiled for one (device 0, or device 1 by its input)
    is loaded for that device only: JAX's default loads it for every device, and the
    call then wants 4 shards of each argument."""
    script = textwrap.dedent(f"""
        import jax, numpy as np
        import jaxattn as ja
        from jaxattn import _programs
        ja.enable_cache({str(tmp_path / "cache")!r})  # (the script lies beside it)
        loaded = []
        jax.monitoring.register_event_duration_secs_listener(
            lambda event, s, **kw: loaded.append(event) if event == _programs.LOAD_EVENT else 0)
        dyn = ja.random_dynamics(jax.random.PRNGKey(0), 1, 3)
        x0 = np.asarray(ja.sample_ellipsoid(jax.random.PRNGKey(1), 6, 3))
        y = [ja.run_layers(dyn, x, num_layers=3, tau=0.1)
             for x in (x0, jax.device_put(x0, jax.devices()[1]))]
        print(jax.device_count(), len(loaded), np.asarray(y[0]).tobytes().hex(),
              np.asarray(y[1]).tobytes().hex())
    """)
    path = tmp_path / "devices.py"
    path.write_text(script)
    env = os.environ | {"XLA_FLAGS": "--xla_force_host_platform_device_count=4",
                        "JAX_PLATFORMS": "cpu"}
    runs = [subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                           timeout=300, env=env) for _ in range(2)]
    assert [r.returncode for r in runs] == [0, 0], runs[-1].stderr[-2000:]
    (d0, n0, a0, b0), (d1, n1, a1, b1) = (r.stdout.split() for r in runs)
    assert d0 == d1 == "4" and n0 == "0" and int(n1) >= 2  # compiled, then loaded
    assert a0 == a1 and b0 == b1  # each program compiled, then loaded: the same bits
    # programs compiled for two devices: equal to float32 rounding
    np.testing.assert_allclose(*(np.frombuffer(bytes.fromhex(h), np.float32) for h in (a0, b0)),
                               rtol=1e-5)
