"""Kernels and norm placements as families (`ja.AbstractKernel`, `ja.AbstractNorm`):
strings and members give the same model; a user's kernel and norm, defined here
outside the package, run dense, in blocks, in layers, in the flow and under
`jax.grad`; no module of the package branches on a kernel's or a norm's name."""

import re
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxattn as ja


class ReLU(ja.AbstractKernel):
    """`w_ij = max(s_ij, 0) / n` (ReLU attention), written against the base only."""

    name = "relu"
    description = "max(s, 0)/n, not normalised over j"
    normalised = False
    flash = False  # not pointwise-derived: the flash kernel cannot run it
    exponent_shift = None

    def offset(self, beta, n, dtype):
        return None

    def weights(self, s, n):
        return jnp.maximum(s, 0) / n

    def rescale(self, mixed, n):
        return mixed / n

    def block_update(self, state, s, ok, mix):
        top, norm, acc = state
        return top, norm, acc + mix(jnp.where(ok, jnp.maximum(s, 0), 0))

    def block_finish(self, state):
        _, norm, acc = state
        return acc, (norm, norm)

    def block_grad(self, s, ok, a, b, delta, dp):
        w = jnp.where(ok, jnp.maximum(s, 0), 0)
        return w, jnp.where(ok & (s > 0), dp, 0)


class Cosine(ja.AbstractPointwiseKernel):
    """`w_ij = (1 + tanh(s_ij)) / 2`: a pointwise kernel from the intermediate base."""

    name = "tanh"
    description = "(1 + tanh s)/2, not normalised over j"
    exponent_shift = None

    def offset(self, beta, n, dtype):
        return None

    def pointwise(self, s):
        return (1 + jnp.tanh(s)) / 2

    def derivative(self, s, w):
        return 2 * w * (1 - w)

    def rescale(self, mixed, n):
        return mixed


class HalfPost(ja.AbstractNorm):
    """`x ← N(x + (τ/2) v(x))`: post-normalisation at half the step."""

    name = "half-post"
    description = "x ← N_W(x + τ v / 2)"
    stays_on_manifold = True
    papers_default = False

    def reads(self, x, W):
        return x

    def velocity(self, update, x, W):
        v = update(x) / 2
        return v - jnp.sum(x * v, -1, keepdims=True) * x

    def step(self, update, x, tau, W, kick=None):
        y = x + tau * update(x) / 2
        y = y if kick is None else y + kick
        return y / jnp.linalg.norm(y, axis=-1, keepdims=True)

    def equiangular(self, s, m, r):
        return 0.5, 0.0  # post-normalisation's ρ̇ = 2g, halved


N, D, H = 11, 3, 2


def _model(kernel, norm="post", block_size=None, **options):
    k1, k2 = jax.random.split(jax.random.PRNGKey(7))
    P = jax.random.normal(k1, (H, D, D)) / D
    U = jax.random.normal(k2, (H, D, D)) / D + jnp.eye(D)[None]
    return ja.SelfAttentionDynamics(P, U, beta=2.0, kernel=kernel, norm=norm,
                                    block_size=block_size, **options)


def _tokens(batch=()):
    keys = jax.random.split(jax.random.PRNGKey(3), int(np.prod(batch, dtype=int)))
    x = jax.vmap(lambda k: ja.sample_ellipsoid(k, N, D))(keys)
    return x.reshape(tuple(batch) + (N, D))


def _rel(a, b):
    return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))


@pytest.mark.parametrize("name, member", [
    ("softmax", ja.Softmax()), ("sigmoid", ja.Sigmoid()), ("exp", ja.Exp()), ("usa", ja.USA()),
    ("hardmax", ja.Hardmax())])
def test_a_kernel_by_name_is_its_member(name, member):
    by_name, by_member = _model(name), _model(member)
    assert type(by_name.kernel) is type(member) and by_name.kernel.name == name
    assert eqx.tree_equal(by_name, by_member)
    x = _tokens()
    assert jnp.array_equal(ja.run_layers(by_name, x, num_layers=3, tau=0.1),
                           ja.run_layers(by_member, x, num_layers=3, tau=0.1))


@pytest.mark.parametrize("name, member", [
    ("post", ja.PostNorm()), ("pre", ja.PreNorm()), ("peri", ja.PeriNorm()), ("ngpt", ja.NGPT()),
    ("none", ja.NoNorm())])
def test_a_norm_by_name_is_its_member(name, member):
    by_name = _model("softmax", name)
    assert type(by_name.norm) is type(member) and by_name.norm.name == name
    assert eqx.tree_equal(by_name, _model("softmax", member))
    assert by_name.stays_on_manifold == (name in ("post", "ngpt"))


def test_the_sigmoid_bias_lives_in_its_kernel():
    dyn = _model("sigmoid", bias=0.25)
    assert isinstance(dyn.kernel, ja.Sigmoid) and float(dyn.bias) == 0.25
    assert eqx.tree_equal(dyn, _model(ja.Sigmoid(bias=0.25)))
    assert _model("softmax").bias is None
    with pytest.raises(ValueError, match="needs kernel='sigmoid'"):
        _model("exp", bias=0.25)
    with pytest.raises(ValueError, match="goes into the kernel"):
        _model(ja.Sigmoid(), bias=0.25)


def test_unknown_kernels_and_norms_are_refused_by_name():
    with pytest.raises(ValueError, match=r"`kernel` must be one of 'softmax'.*AbstractKernel"):
        _model("relu")
    with pytest.raises(ValueError, match=r"`norm` must be one of 'post'.*AbstractNorm"):
        _model("softmax", "layer")
    with pytest.raises(TypeError):
        ja.AbstractKernel()  # abstract


@pytest.mark.parametrize("kernel", [ReLU(), Cosine()])
@pytest.mark.parametrize("options", [{}, {"causal": True}, {"window": 4}])
def test_a_users_kernel_runs_dense_and_in_blocks(kernel, options):
    x = _tokens()
    dense = _model(kernel, block_size=0, **options).raw_update(0.0, x)
    blocks = _model(kernel, block_size=4, **options).raw_update(0.0, x)
    assert _rel(blocks, dense) < 1e-12
    # the dense weights are the kernel's own formula of the scores
    dyn = _model(kernel, block_size=0, **options)
    s = dyn.scores(0.0, x)
    allowed = dyn.allowed(N)
    expected = kernel.weights(s if allowed is None else jnp.where(allowed, s, -jnp.inf), N)
    assert jnp.allclose(dyn.attention(0.0, x), expected, rtol=1e-14, atol=0)


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
@pytest.mark.parametrize("kernel", [ReLU(), Cosine()])
def test_a_users_kernel_in_layers_flow_and_grad(kernel):
    xs = _tokens(batch=(4,))
    dense, blocks = _model(kernel, block_size=0), _model(kernel, block_size=4)
    layers = [ja.run_layers(m, xs, num_layers=5, tau=0.1) for m in (dense, blocks)]
    assert _rel(layers[1], layers[0]) < 1e-12
    assert float(jnp.max(jnp.abs(jnp.linalg.norm(layers[0], axis=-1) - 1))) < 1e-12
    ts = jnp.linspace(0.0, 1.0, 3)
    # constant steps: the same steps on both paths (adaptive ones would pick their own)
    flows = [ja.solve_flow(m, xs, ts, solver=ja.RK4(), dt0=0.05) for m in (dense, blocks)]
    assert _rel(flows[1], flows[0]) < 1e-12

    def loss(model, x):
        return jnp.sum(ja.run_layers(model, x, num_layers=3, tau=0.2)[-1] ** 3)

    g_dense, g_blocks = (jax.grad(loss, argnums=1)(m, xs[0]) for m in (dense, blocks))
    assert _rel(g_blocks, g_dense) < 1e-10
    if isinstance(kernel, ReLU):
        return  # its kinks sit near some logits: finite differences only for the smooth one
    v = jax.random.normal(jax.random.PRNGKey(9), xs[0].shape)
    eps = 1e-6
    fd = (loss(blocks, xs[0] + eps * v) - loss(blocks, xs[0] - eps * v)) / (2 * eps)
    assert abs(float(jnp.sum(g_blocks * v)) - float(fd)) < 1e-6 * max(1.0, abs(float(fd)))


@pytest.mark.slow  # warm: over ~3 s (make test stays the fast loop)
def test_a_users_norm_in_layers_flow_noise_and_grad():
    xs = _tokens(batch=(3,))
    dyn, post = _model("softmax", HalfPost()), _model("softmax", "post")
    # half the step of post-normalisation, layer for layer
    assert _rel(ja.run_layers(dyn, xs, num_layers=4, tau=0.2),
                ja.run_layers(post, xs, num_layers=4, tau=0.1)) < 1e-12
    ts = jnp.linspace(0.0, 1.0, 3)
    assert _rel(ja.solve_flow(dyn, xs, 2 * ts, solver=ja.RK4(), dt0=0.1),
                ja.solve_flow(post, xs, ts, solver=ja.RK4(), dt0=0.05)) < 1e-12
    noisy = ja.run_layers(dyn, xs, num_layers=4, tau=0.2, noise=ja.TokenNoise(0.1),
                          key=jax.random.key(1))
    assert noisy.shape == (3, 5, N, D) and bool(jnp.all(jnp.isfinite(noisy)))
    assert float(jnp.max(jnp.abs(jnp.linalg.norm(noisy, axis=-1) - 1))) < 1e-12
    g = jax.grad(lambda x: jnp.sum(ja.run_layers(dyn, x, num_layers=3, tau=0.2)[-1] ** 3))(xs[0])
    assert bool(jnp.all(jnp.isfinite(g)))


def test_stacked_models_batch_the_sigmoid_bias():
    biases = jnp.asarray([-1.0, 0.0, 1.0])
    stacked = eqx.filter_vmap(lambda b: _model("sigmoid", bias=b))(biases)
    xs = _tokens(batch=(3, 2))
    together = ja.run_layers(stacked, xs, num_layers=3, tau=0.1)
    for m, b in enumerate(biases):
        alone = ja.run_layers(_model("sigmoid", bias=float(b)), xs[m], num_layers=3, tau=0.1)
        assert _rel(together[m], alone) < 1e-12


PACKAGE = Path(ja.__file__).parent
# A comparison of a model's, a spec's or a loop variable's kernel or norm with a name.
NAMES = "softmax|sigmoid|exp|usa|hardmax|post|pre|peri|ngpt|none"
NAME_BRANCH = re.compile(
    rf"""\b(kernel|norm)\s*(==|!=|in|not in)\s*\(?\s*["']({NAMES})["']"""
    rf"""|["']({NAMES})["']\s*(==|!=)\s*\w*(kernel|norm)\b""")


def test_no_module_branches_on_a_kernel_or_norm_name():
    found = []
    for path in PACKAGE.rglob("*.py"):
        # the CLI and the families' faces turn names into members
        if path.parts[-2] == "cli" or path.name == "__init__.py" and path.parts[-2] in (
                "_kernel", "_norm"):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if NAME_BRANCH.search(line.split("#")[0]):
                found.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert not found, "branches on a kernel's or norm's name:\n" + "\n".join(found)


def test_a_users_members_answer_the_capabilities():
    """What the library asks of a member it asks of the member's capabilities, so a
    user's members get them too: `HalfPost` clusters at half post's equiangular rate,
    the flash route refuses `ReLU` and takes `Cosine`, `classify` reads neither as
    the papers' model, and `ja.meanfield` refuses a kernel with no `exponent_shift`."""
    post = ja.theory.equiangular_asymptotics(4, 1.0, norm="post")
    half = ja.theory.equiangular_asymptotics(4, 1.0, norm=HalfPost())
    assert half.kind == "exponential" and half.rate == post.rate / 2
    rho = jnp.asarray([0.2, 0.7])
    np.testing.assert_allclose(ja.theory.equiangular_rate(rho, 4, 1.0, norm=HalfPost()),
                               ja.theory.equiangular_rate(rho, 4, 1.0) / 2, rtol=1e-14)
    assert not ReLU().flash and Cosine().flash and ja.Softmax().flash
    assert not ja.Hardmax().flash
    assert ja.Softmax().normalised and ja.Hardmax().normalised and not Cosine().normalised
    report = ja.theory.classify(_model("softmax", HalfPost()))
    assert not report.reports[0].checks[0].holds
    with pytest.raises(ValueError, match="`kernel` must be one of"):
        ja.meanfield.coupling_of(1.0, 1.0, Cosine())
    assert ja.meanfield.coupling_of(2.0, 1.5, ja.USA()) == pytest.approx(2.0 * np.exp(-1.5))
