"""Every matrix product of the core states its precision: a test the CPU cannot fool.

A CPU computes float32 products in float32 whatever they ask for, so results alone
cannot show that a GPU or TPU would run them at TensorFloat-32 or bfloat16. The
lowered StableHLO can: each public program is lowered and every `dot_general` is
read. In the default mode every one carries `precision = [HIGHEST, HIGHEST]`; in
`"bfloat16"` the attention's products take bfloat16 operands and return float32;
in `"tensorfloat32"` (emulated off the GPU) their operands are rounded to 10
mantissa bits first, and on a GPU they name XLA's TF32 algorithm (lowered for CUDA
here too, from the CPU). Metric products (`w_inner`, Gram matrices, the measures)
stay true float32 in every mode.
"""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxattn as ja
from jaxattn import _precision

F32 = jnp.float32
N, D, H, K = 5, 4, 2, 3  # distinct sizes, so that a swapped axis fails

_DOT = re.compile(
    r"(%\S+) = stablehlo\.dot_general (%[^,\s]+), (%[^,\s]+),(.*) : \((.*)\) -> (\S+)$"
)
_TF32 = re.compile(r"(%\S+) = stablehlo\.reduce_precision \S+, format = e8m10\b")
_ALGORITHM = re.compile(r"algorithm = <lhs_precision_type = (\w+), rhs_precision_type = (\w+), "
                        r"accumulation_type = (\w+)")


@dataclasses.dataclass(frozen=True)
class Dot:
    """One `dot_general` of a lowered program."""

    precision: str  # e.g. "HIGHEST, HIGHEST"
    operands: tuple[str, str]  # element types, e.g. ("f32", "f32")
    result: str
    rounded: bool  # both operands come from a TF32 `reduce_precision` (e8m10)
    algorithm: str = ""  # XLA's dot algorithm, e.g. "tf32, tf32, f32" (a GPU's TF32)

    @property
    def tf32(self) -> bool:
        """A TensorFloat-32 product: emulated (rounded operands, HIGHEST) or a GPU's."""
        return (self.rounded and self.precision == "HIGHEST, HIGHEST") or \
            self.algorithm == "tf32, tf32, f32"


@pytest.fixture(autouse=True)
def float32():
    """The programs run in float32 here (with float64 on, the simulators compute in
    float64, whose products are exact on every backend anyway)."""
    with jax.enable_x64(False):
        yield


def _element(tensor_type: str) -> str:
    return tensor_type.removeprefix("tensor<").rstrip(">").split("x")[-1]


def dots(text: str) -> list[Dot]:
    """The `dot_general`s of a lowered program (SSA names are per function)."""
    found, rounded = [], set()
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("func.func"):
            rounded = set()
        if m := _TF32.match(line):
            rounded.add(m.group(1))
        if m := _DOT.match(line):
            _, lhs, rhs, attrs, types, out = m.groups()
            prec = re.search(r"precision = \[([^\]]*)\]", attrs)
            a, b = (_element(t) for t in types.split(", "))
            algorithm = _ALGORITHM.search(attrs)
            found.append(Dot(prec.group(1) if prec else "none", (a, b), _element(out),
                             lhs in rounded and rhs in rounded,
                             ", ".join(algorithm.groups()) if algorithm else ""))
    return found


def lowered(fn, *args) -> str:
    """`fn`'s StableHLO for this backend, or for CUDA where `ON_CUDA` is set."""
    if ON_CUDA:
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    return jax.jit(fn).lower(*args).as_text()


ON_CUDA = False  # set by `as_if_on_a_gpu`


def assert_float32(text: str, *, some: bool = True) -> list[Dot]:
    """Every product is a true float32 one (`some`: and there is at least one)."""
    found = dots(text)
    assert found or not some, "no dot_general in the program"
    assert_float32_dots(found)
    return found


def assert_float32_dots(found: list[Dot]):
    bad = [d for d in found if d.precision != "HIGHEST, HIGHEST" or "bf16" in d.operands
           or d.algorithm]
    assert not bad, f"{len(bad)} of {len(found)} products are not true float32: {bad}"


def assert_reduced(fn, make, *, metric: bool):
    """`make(precision)` → args of `fn`; checks the three modes against each other.

    float32: all HIGHEST. bfloat16: the attention's products (bf16, bf16) → f32, all
    others HIGHEST float32. tensorfloat32: all HIGHEST float32, and exactly the
    attention's products (as many as in bfloat16) have TF32-rounded operands.
    """
    full = assert_float32(lowered(fn, *make("float32")))
    assert all(d.operands == ("f32", "f32") for d in full), "float32 inputs stay float32"
    bf16 = dots(lowered(fn, *make("bfloat16")))
    low = [d for d in bf16 if d.operands == ("bf16", "bf16")]
    assert low, "no product took bfloat16 operands"
    assert all(d.result == "f32" for d in low), "bfloat16 products must accumulate in float32"
    rest = [d for d in bf16 if d not in low]
    assert all(d.precision == "HIGHEST, HIGHEST" and d.operands == ("f32", "f32")
               for d in rest), rest
    assert bool(rest) == metric, "metric products (W) stay float32, and only they"
    tf32 = dots(lowered(fn, *make("tensorfloat32")))
    reduced = [d for d in tf32 if d.tf32]
    assert len(reduced) == len(low), "exactly the attention's products are TF32"
    assert all(d.operands == ("f32", "f32") and d.result == "f32" for d in tf32)
    assert_float32_dots([d for d in tf32 if d not in reduced])
    on_gpu = jax.default_backend() == "gpu" or ON_CUDA
    assert all(bool(d.algorithm) == on_gpu for d in reduced), "a GPU's TF32, emulated elsewhere"
    assert len(tf32) == len(bf16) == len(full)
    return len(low)


def _weights(key, factored: bool):
    kq, kk, ku, kw = jax.random.split(key, 4)
    U = jax.random.normal(ku, (H, D, D), F32) / D
    B = jax.random.normal(kw, (D, D), F32)
    W = B @ B.T / D + jnp.eye(D, dtype=F32)
    if factored:
        return {"Q": jax.random.normal(kq, (H, K, D), F32),
                "K": jax.random.normal(kk, (H, K, D), F32), "U": U, "W": W}
    return {"P": jax.random.normal(kq, (H, D, D), F32), "U": U, "W": W}


def _dynamics(w, causal, precision, metric=True):
    W = w["W"] if metric else None
    # float32 is the default: left unsaid, as most users leave it.
    kw = {} if precision == "float32" else {"precision": precision}
    if "P" in w:
        return ja.SelfAttentionDynamics(w["P"], w["U"], W, causal=causal, **kw)
    return ja.SelfAttentionDynamics.from_factors(w["Q"], w["K"], w["U"], W, causal=causal, **kw)


def _tokens(key, W):
    return ja.sample_ellipsoid(key, N, D, W, dtype=F32)


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
@pytest.mark.parametrize("factored", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_solve_flow_states_its_precision(key, factored, causal):
    w = _weights(key, factored)
    x0 = _tokens(jax.random.fold_in(key, 1), w["W"])
    ts = jnp.linspace(0.0, 1.0, 3, dtype=F32)
    assert_reduced(lambda dyn, x: ja.solve_flow(dyn, x, ts),
                   lambda p: (_dynamics(w, causal, p), x0), metric=True)


@pytest.mark.parametrize(("factored", "causal", "metric"),
                         [(False, False, False), (True, True, True), (False, True, True),
                          (True, False, False)])
def test_run_layers_states_its_precision(key, factored, causal, metric):
    w = _weights(key, factored)
    x0 = _tokens(jax.random.fold_in(key, 1), w["W"] if metric else None)
    assert_reduced(lambda dyn, x: ja.run_layers(dyn, x, 3, 0.1, observe=ja.misalignment),
                   lambda p: (_dynamics(w, causal, p, metric), x0), metric=metric)


@pytest.fixture
def as_if_on_a_gpu(monkeypatch):
    """Trace as on a GPU (`_precision` takes XLA's TF32 algorithm there) and lower for
    CUDA: the GPU's programs, read on any machine."""
    monkeypatch.setattr(_precision, "on_gpu", lambda: True)
    monkeypatch.setitem(globals(), "ON_CUDA", True)
    jax.clear_caches()
    yield
    jax.clear_caches()


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
@pytest.mark.parametrize(("factored", "causal"), [(False, True), (True, False)])
def test_tensorfloat32_takes_the_gpus_algorithm_on_a_gpu(key, factored, causal, as_if_on_a_gpu):
    """A layer and the flow's velocity (programs without value checks: a host callback
    lowers for CUDA only on a GPU)."""
    w = _weights(key, factored)
    x0 = _tokens(jax.random.fold_in(key, 1), w["W"])
    for program in (lambda dyn, x: dyn.layer(0.0, x, 0.1), lambda dyn, x: dyn.velocity(0.0, x)):
        assert assert_reduced(program, lambda p: (_dynamics(w, causal, p), x0), metric=True) > 0


def test_theorem_tests_state_their_precision(key):
    w = _weights(key, False)
    x0 = _tokens(jax.random.fold_in(key, 1), w["W"])
    x = _tokens(jax.random.fold_in(key, 2), w["W"])

    def tests(dyn, x0, x):
        t32, t52 = ja.theory.theorem_test("3.2", dyn), ja.theory.theorem_test("5.2", dyn)
        return t32.reached(x0, x, 0.5), t52.domain(x0), t52.reached(x0, x, 0.5)

    assert_reduced(tests, lambda p: (_dynamics(w, True, p), x0, x), metric=True)


def test_metrics_are_true_float32(key):
    w = _weights(key, False)
    x = jax.random.normal(key, (3, N, D), F32)
    # The misalignment's cosines are elementwise: no product at all, nothing to round.
    assert_float32(lowered(ja.misalignment, x), some=False)
    assert_float32(lowered(ja.metrics.potential, x, w["P"][0]))
    assert_float32(lowered(lambda x: ja.metrics.pairwise_lyapunov(x, w["W"]), x))
    assert_float32(lowered(lambda x: ja.metrics.cluster_count(x, 0.5), x))


def test_span_coordinates_are_true_float32(key):
    """The sweep's causal instance: weights and Gram matrix in span coordinates."""
    paper = ja.experiments.paper
    weights = jax.tree.map(lambda a: a.astype(F32), paper.causal_weights(key, 6, 2))

    def program(weights, x0):
        dyn, G = paper.span_dynamics(weights, x0)
        y0 = jnp.eye(x0.shape[0], dtype=x0.dtype)
        ys = ja.run_layers(dyn, y0, 3, 0.1)
        return paper.span_misalignment(ys, G)

    x0 = ja.sample_ellipsoid(jax.random.fold_in(key, 1), 3, 6, dtype=F32)
    assert_float32(lowered(program, weights, x0))


@pytest.mark.parametrize("precision", ["float32", "tensorfloat32", "bfloat16"])
def test_global_matmul_precision_changes_nothing(key, precision):
    """`jax.default_matmul_precision` is not consulted: the same program either way."""
    w = _weights(key, True)
    dyn, x0 = _dynamics(w, True, precision), _tokens(jax.random.fold_in(key, 1), w["W"])

    def program(dyn, x):
        return ja.run_layers(dyn, x, 3, 0.1, observe=ja.misalignment)

    plain = lowered(program, dyn, x0)
    for mode in ("bfloat16", "tensorfloat32", "float32"):
        with jax.default_matmul_precision(mode):
            assert lowered(program, dyn, x0) == plain


def _curve_errors(key, num_layers=20, n=8, d=12):
    """max |E_mode − E_float64| over a misalignment curve, per mode, and the
    float32 one under a global `default_matmul_precision("bfloat16")`."""
    kq, kk, ku, kx = jax.random.split(key, 4)
    rng = np.random.default_rng(int(jax.random.randint(kq, (), 0, 2**30)))
    w = {"Q": rng.standard_normal((H, K, d)), "K": rng.standard_normal((H, K, d)),
         "U": rng.standard_normal((H, d, d)) / np.sqrt(d)}
    x0 = rng.standard_normal((n, d))

    def curve(precision, dtype):
        cast = {k: jnp.asarray(v, dtype) for k, v in w.items()}
        dyn = ja.SelfAttentionDynamics.from_factors(cast["Q"], cast["K"], cast["U"],
                                                    causal=True, precision=precision)
        E = ja.run_layers(dyn, jnp.asarray(x0, dtype), num_layers, 0.1,
                          observe=ja.misalignment)
        assert E.dtype == dtype
        return np.asarray(E, np.float64)

    with jax.enable_x64(True):
        ref = curve("float32", jnp.float64)
    modes = ("float32", "tensorfloat32", "bfloat16")
    errors = {p: float(np.abs(curve(p, F32) - ref).max()) for p in modes}
    with jax.default_matmul_precision("bfloat16"):
        errors["float32 under bfloat16 default"] = float(np.abs(curve("float32", F32) - ref).max())
    return errors


def test_modes_cost_what_they_say(key):
    """float32 stays within float32 rounding of float64, even under a global bfloat16
    default; TF32 (emulated here) and bfloat16 are visibly coarser, in that order."""
    err = _curve_errors(key)
    assert err["float32"] < 1e-6
    assert err["float32 under bfloat16 default"] < 1e-6
    assert 10 * err["float32"] < err["tensorfloat32"] < err["bfloat16"]
    assert err["bfloat16"] < 0.1


def test_precision_is_checked():
    assert ja.PRECISIONS == ("float32", "tensorfloat32", "bfloat16")
    U = jnp.eye(2)[None]
    with pytest.raises(ValueError, match="tensorfloat32"):
        ja.SelfAttentionDynamics(U, U, precision="tf32")
    assert ja.SelfAttentionDynamics(U, U).precision == "float32"


@pytest.mark.parametrize("causal", [False, True])
def test_fused_ensemble_path_states_its_precision(key, causal):
    """The fused path (`strategy="fused"`) writes the attention's products as
    elementwise multiply–adds, not `dot_general`s: exact products in float32 for
    `"float32"`, after rounding the operands to bfloat16 or TF32 (10 mantissa bits)
    for the reduced modes, as the general path's products see them."""
    w = _weights(key, False)
    x0 = jnp.stack([_tokens(jax.random.fold_in(key, i), w["W"]) for i in range(3)])

    def run(dyn, x):
        return ja.run_layers(dyn, x, 2, 0.1, observe=ja.misalignment, strategy="fused")

    full = lowered(run, _dynamics(w, causal, "float32"), x0)
    assert_float32(full, some=False)
    assert "bf16" not in full and "e8m10" not in full
    low = lowered(run, _dynamics(w, causal, "bfloat16"), x0)
    assert not [d for d in dots(low) if "bf16" in d.operands]
    assert re.search(r"stablehlo\.convert .* -> tensor<[0-9x]*bf16>", low)
    assert "format = e8m10" in lowered(run, _dynamics(w, causal, "tensorfloat32"), x0)
