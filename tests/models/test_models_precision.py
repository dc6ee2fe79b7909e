"""The precision of the models' matrix products, read off the lowered program (so the
test holds on the CPU, where float32 products are exact whatever is asked): true
float32 (`HIGHEST`) on every `dot_general` by default, bfloat16 operands or TF32
operand rounding when asked by name, and results that ignore
`jax_default_matmul_precision`."""

import functools
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxattn as ja

TINY = {
    "gpt2": {"model_type": "gpt2", "n_layer": 2, "n_embd": 24, "n_head": 3, "vocab_size": 37,
             "n_positions": 16},
    "gpt_neo": {"model_type": "gpt_neo", "num_layers": 2, "hidden_size": 18, "num_heads": 3,
                "vocab_size": 29, "max_position_embeddings": 16, "window_size": 3,
                "attention_types": [[["global", "local"], 1]]},
    "bert": {"model_type": "bert", "num_hidden_layers": 2, "hidden_size": 20,
             "num_attention_heads": 4, "intermediate_size": 22, "vocab_size": 31,
             "max_position_embeddings": 16},
    "albert": {"model_type": "albert", "num_hidden_layers": 2, "hidden_size": 16,
               "num_attention_heads": 2, "intermediate_size": 26, "vocab_size": 23,
               "embedding_size": 6, "max_position_embeddings": 16},
    "llama": {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 24,
              "num_attention_heads": 6, "num_key_value_heads": 2, "intermediate_size": 28,
              "vocab_size": 41, "max_position_embeddings": 32},
}
# query, key, value, scores, mixing, output; the MLP's two or three Linear layers;
# ALBERT's embedding projection
DOTS = {"gpt2": 8, "gpt_neo": 8, "bert": 8, "albert": 9, "llama": 9}
DOT = re.compile(r"stablehlo\.dot_general .*precision = \[(\w+), (\w+)\].*"
                 r": \(tensor<[^>]*x(\w+)>, tensor<[^>]*x(\w+)>\) -> tensor<[^>]*x(\w+)>")


@functools.cache
def tiny(family):
    """The model `ja.models.init` builds from a tiny config, its weights drawn by numpy:
    HuggingFace's initialisation compiles a random draw per weight shape (seconds
    each on a busy CPU), and precision does not depend on how weights are drawn."""
    shapes = jax.eval_shape(lambda: ja.models.init(TINY[family], jax.random.PRNGKey(0)))
    rng = np.random.default_rng(7)
    return jax.tree.map(lambda s: jnp.asarray(0.2 * rng.standard_normal(s.shape), s.dtype),
                        shapes)


def ids_for(model, shape=(3, 5)):
    return np.random.default_rng(0).integers(0, model.config.vocab_size, shape)


def lowered(program: str, model, ids, **kwargs) -> str:
    """The StableHLO of `ja.models.loop` (2 passes) or `hidden_states` on `ids`."""
    if program == "loop":
        def fn(m, i):
            return ja.models.loop(m, i, passes=2, **kwargs)
    else:
        def fn(m, i):
            return ja.models.hidden_states(m, i, **kwargs)
    return eqx.filter_jit(fn).lower(model, ids).as_text()


def dots(text: str) -> list[tuple[str, ...]]:
    """`(lhs precision, rhs precision, lhs type, rhs type, result type)` of every
    `dot_general`; fails if a line does not parse."""
    lines = [line for line in text.splitlines() if "stablehlo.dot_general" in line]
    found = [DOT.search(line) for line in lines]
    assert all(found), [line for line, m in zip(lines, found) if not m]
    return [m.groups() for m in found]


@pytest.mark.parametrize("program", ["loop", "hidden_states"])
@pytest.mark.parametrize("family", list(TINY))
def test_default_products_are_true_float32(family, program):
    model = tiny(family)
    found = dots(lowered(program, model, ids_for(model)))
    assert len(found) == DOTS[family]
    assert all(d == ("HIGHEST", "HIGHEST", "f32", "f32", "f32") for d in found), found


@pytest.mark.parametrize("program", ["loop", "hidden_states"])
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_bfloat16_products_take_bfloat16_operands(family, program):
    model = tiny(family)
    found = dots(lowered(program, model, ids_for(model), precision="bfloat16"))
    assert len(found) == DOTS[family]
    assert all(d[2:] == ("bf16", "bf16", "f32") for d in found), found


@pytest.mark.parametrize("program", ["loop", "hidden_states"])
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_tensorfloat32_rounds_the_operands_off_the_gpu(family, program):
    model = tiny(family)
    text = lowered(program, model, ids_for(model), precision="tensorfloat32")
    found = dots(text)
    assert len(found) == DOTS[family]
    if jax.default_backend() == "cpu":  # emulated: rounded operands, exact products
        assert "stablehlo.reduce_precision" in text and "format = e8m10" in text
        assert all(d == ("HIGHEST", "HIGHEST", "f32", "f32", "f32") for d in found), found


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_default_ignores_the_global_matmul_precision(family):
    model = tiny(family)
    ids = ids_for(model)
    E, hs = ja.models.loop(model, ids, passes=2), ja.models.hidden_states(model, ids)
    with jax.default_matmul_precision("bfloat16"):
        text = lowered("loop", model, ids)
        E_low, hs_low = ja.models.loop(model, ids, passes=2), ja.models.hidden_states(model, ids)
    assert all(d[:2] == ("HIGHEST", "HIGHEST") for d in dots(text))
    np.testing.assert_array_equal(E_low, E)
    np.testing.assert_array_equal(hs_low, hs)


def test_reduced_modes_cost_little_and_differ():
    model = tiny("gpt2")
    ids = ids_for(model)
    E = ja.models.loop(model, ids, passes=2)
    for precision, most in (("tensorfloat32", 1e-2), ("bfloat16", 5e-2)):
        gap = np.abs(ja.models.loop(model, ids, passes=2, precision=precision) - E).max()
        assert 0 < gap < most, (precision, gap)


def test_attention_dynamics_carries_the_precision():
    model = tiny("llama")
    assert ja.models.attention_dynamics(model, 1).precision == "float32"
    assert ja.models.attention_dynamics(model, 1, precision="bfloat16").precision == "bfloat16"


@pytest.mark.parametrize("call", [
    lambda m, i: ja.models.loop(m, i, passes=1, precision="float16"),
    lambda m, i: ja.models.hidden_states(m, i, precision="highest"),
    lambda m, i: ja.models.attention_dynamics(m, 0, precision=None),
])
def test_unknown_precision_is_a_one_line_error(call):
    model = tiny("gpt2")
    with pytest.raises(ValueError, match="precision must be one of") as info:
        call(model, ids_for(model))
    assert len(str(info.value).splitlines()) == 1
