"""The layer index of `ja.models.attention_dynamics` and its siblings: Python's
indexing, documented (`-1` is the last layer, `-L` the first); anything outside
`[-L, L)` or not an integer is refused with one line naming the range."""

import jax
import numpy as np
import pytest

import jaxattn as ja

TINY = {"model_type": "gpt2", "n_layer": 3, "n_embd": 12, "n_head": 2, "vocab_size": 17,
        "n_positions": 8}


@pytest.fixture(scope="module")
def model():
    return ja.models.init(TINY, jax.random.PRNGKey(0))


def test_negative_layers_count_from_the_end(model):
    last = ja.models.attention_weights(model, 2)
    np.testing.assert_array_equal(ja.models.attention_weights(model, -1).query, last.query)
    np.testing.assert_array_equal(ja.models.attention_weights(model, np.int64(-3)).query,
                                  ja.models.attention_weights(model, 0).query)
    np.testing.assert_array_equal(ja.models.attention_dynamics(model, -1).Q(0.0),
                                  ja.models.attention_dynamics(model, 2).Q(0.0))


@pytest.mark.parametrize("layer", [3, -4, 1.0, True, "0", None])
@pytest.mark.parametrize("fn", ["attention_dynamics", "attention_weights", "layer_weights"])
def test_layers_outside_the_model_are_refused(model, fn, layer):
    match = (r"^`layer` must be an integer in \[0, 3\) for this 3-layer model, or in "
             r"\[-3, 0\) to count from the last layer \(-1\), got ")
    with pytest.raises(ValueError, match=match):
        getattr(ja.models, fn)(model, layer)
    with pytest.raises(ValueError, match=match):
        ja.models.replace_attention(model, layer, ja.models.attention_weights(model, 0))
