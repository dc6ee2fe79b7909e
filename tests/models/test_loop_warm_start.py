"""`ja.models.loop`'s compiled program kept in the cache folder (issue #42, warm
starts): a later process loads it without tracing, and gets the same bits."""

import jax
import numpy as np
import pytest

import jaxattn as ja
from jaxattn import _programs
from jaxattn._process.cache import cache_size, clear_cache
from jaxattn.models import _loop

TINY_NEO = {"model_type": "gpt_neo", "num_layers": 2, "hidden_size": 24, "num_heads": 3,
            "vocab_size": 41, "max_position_embeddings": 16, "window_size": 3,
            "attention_types": [[["global", "local"], 1]]}



@pytest.fixture(scope="module")
def model():
    """Built before the `folder` fixture (`ja.models.init` keeps its own program)."""
    return ja.models.init(TINY_NEO, jax.random.PRNGKey(3))


def stored(folder):
    return sorted(p.name.rsplit("-", 1)[1] for p in folder.glob("jaxattn_program-*"))


def test_a_warm_process_loads_the_program_and_gets_the_same_bits(model, folder, monkeypatch):
    traces = []
    real = _loop._metric
    monkeypatch.setattr(_loop, "_metric", lambda x: traces.append(1) or real(x))
    ids = np.random.default_rng(3).integers(0, 41, (5, 7))
    E, states = ja.models.loop(model, ids, passes=3, save_states=[0, 4], progress=False)
    assert traces and stored(folder) == ["atime", "cache"]
    # the traced program, compiled on its own: another executable, equal to rounding
    setup = _loop.setup_loop(model, ids, passes=3, save_states=[0, 4])
    want = _loop.loop_program(setup.model, setup.ids, setup.key, passes=3, **setup.options)
    np.testing.assert_allclose(E, want[0], rtol=1e-6)
    np.testing.assert_allclose(states, want[1], rtol=1e-6, atol=1e-6)

    monkeypatch.setattr(_programs, "_LOADED", {})  # a new process: only the folder
    del traces[:]
    again, states_again = ja.models.loop(model, ids, passes=3, save_states=[0, 4],
                                         progress=False)
    assert not traces  # loaded, neither traced nor lowered
    np.testing.assert_array_equal(again, E)  # one program run twice
    np.testing.assert_array_equal(states_again, states)

    # an entry this JAX cannot read is compiled again (and replaced), not trusted
    entry = next(folder.glob("jaxattn_program-*-cache"))
    entry.write_bytes(b"not a program")
    monkeypatch.setattr(_programs, "_LOADED", {})
    np.testing.assert_array_equal(ja.models.loop(model, ids, passes=3, save_states=[0, 4],
                                                 progress=False)[0], E)
    assert entry.read_bytes() != b"not a program" and stored(folder) == ["atime", "cache"]
    # `jaxattn cache --clear` counts and deletes it as one of JAX's entries
    assert cache_size(folder)[0] >= 1
    clear_cache(folder)
    assert stored(folder) == []


def test_what_another_process_could_not_name_is_not_stored(model, folder):
    ids = np.random.default_rng(4).integers(0, 41, (2, 6))
    ja.models.loop(model, ids, passes=2, observe=lambda x: x.sum(), progress=False)
    E = ja.models.loop(model, ids, passes=2, progress=False)
    assert stored(folder) == ["atime", "cache"]  # the plain loop only
    # traced arguments (under jit, grad) take the traced program
    jitted = jax.jit(lambda m: ja.models.loop(m, ids, passes=2, progress=False))(model)
    np.testing.assert_allclose(jitted, E, rtol=1e-6)
    assert stored(folder) == ["atime", "cache"]
    # another option, another program
    ja.models.loop(model, ids, passes=3, progress=False)
    assert stored(folder) == ["atime", "atime", "cache", "cache"]
