"""Paper 004's programs kept in the cache folder (issue #42, warm starts): the layers of
`shared_alignment` (its observation a module, not a closure), `layerwise`'s layer maps
and `steer`'s edit are loaded by a later process without tracing, with the same bits."""

import jax
import numpy as np
import pytest

import jaxattn as ja
from jaxattn import _programs

KEPT = ("layers_program", "_layer_maps", "_steer", "_spectrum", "random_tokens")



@pytest.mark.slow  # warm: over ~3 s (make test stays the fast loop)
def test_a_warm_process_traces_none_of_paper_004_s_programs(folder, monkeypatch, traced):
    cfg = {**ja.models.PRESETS["gpt2"], "n_embd": 12, "n_head": 3, "n_layer": 2,
           "vocab_size": 13, "n_positions": 16}
    model = ja.models.init(cfg, jax.random.PRNGKey(0))
    u = np.eye(12)[2]

    def runs():
        x0 = ja.spectral.random_tokens(jax.random.PRNGKey(1), 3, 5, 12)
        _, cos = ja.spectral.shared_alignment(model, x0, 4)
        stats, eigs, xs = ja.spectral.layerwise(ja.spectral.steer(model, u, 10.0), x0)
        return cos, stats, eigs, xs

    first = runs()  # the kept programs traced as `flat`: none of them by its name
    assert not set(KEPT) & set(traced) and "flat" in traced, traced
    count = len(list(folder.glob("jaxattn_program-*-cache")))
    assert count >= len(KEPT)
    monkeypatch.setattr(_programs, "_LOADED", {})  # a new process: only the folder
    del traced[:]
    again = runs()
    assert not {*KEPT, "flat"} & set(traced), traced
    for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(again), strict=True):
        np.testing.assert_array_equal(a, b)  # one program run twice
    assert len(list(folder.glob("jaxattn_program-*-cache"))) == count  # nothing new
