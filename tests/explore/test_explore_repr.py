"""`print(ja.explore.slow_consensus(...))` is a short summary (issue 43, point 12):
arrays as their dtype and shape (equinox's `short_arrays`), never their contents."""

import re

import jax
from _helpers import random_dynamics, random_tokens

import jaxattn as ja


def test_the_result_repr_shows_shapes_not_contents():
    key = jax.random.PRNGKey(3)
    dyn = random_dynamics(key, h=1, d=3, scale=0.8)
    restarts, n, steps = 2, 5, 2
    x0 = random_tokens(jax.random.fold_in(key, 1), n, 3)
    res = ja.explore.slow_consensus(dyn, init=x0, restarts=restarts, steps=steps,
                                    horizon=0.5, saves=4, model="layers", tau=0.1)
    text = repr(res)
    assert str(res) == text
    assert text.startswith("Exploration(")
    assert f"[{n},3]" in text  # x0
    assert f"[{restarts},{n},3]" in text  # x0s
    assert f"[{steps + 1},{restarts}]" in text  # trace, violation
    # no array contents: no run of numbers as a printed array has, no "array(["
    assert "array(" not in text and not re.search(r"\[\s*-?\d+\.\d+[\s,]+-?\d", text), text
    # bounded: the size of the summary, not of the data (the old repr printed every
    # entry of every array)
    data = sum(a.size for a in jax.tree.leaves(res) if hasattr(a, "size"))
    assert len(text) < 4000 and len(text) < 20 * data, (len(text), data)
