"""The families' abstract/final rule and their members checked where a model is built
(issue 43, point 8): a user's member may implement abstract methods only; a kernel
whose output has the wrong shape, or is NaN, is refused by name when the model is
built; a run whose tokens turn NaN names the kernel's own weights among the causes."""

import diffrax as dfx
import jax
import jax.numpy as jnp
import pytest

import jaxattn as ja
from jaxattn._noise import AbstractNoise

N, D, H = 7, 3, 2


def _model(kernel, norm="post", block_size=None):
    k1, k2 = jax.random.split(jax.random.PRNGKey(7))
    P = jax.random.normal(k1, (H, D, D)) / D
    U = jax.random.normal(k2, (H, D, D)) / D + jnp.eye(D)[None]
    return ja.SelfAttentionDynamics(P, U, beta=2.0, kernel=kernel, norm=norm,
                                    block_size=block_size)


def _pointwise_kernel(name, f):
    """A pointwise kernel `f(s)` written against `ja.AbstractPointwiseKernel`."""
    def derivative(self, s, w):
        return jax.grad(lambda u: jnp.sum(f(u)))(s)

    return type(name, (ja.AbstractPointwiseKernel,), {
        "name": name.lower(), "description": name, "exponent_shift": None,
        "offset": lambda self, beta, n, dtype: None, "pointwise": lambda self, s: f(s),
        "derivative": derivative, "rescale": lambda self, mixed, n: mixed})


_Tanh = _pointwise_kernel("_Tanh", lambda s: (1 + jnp.tanh(s)) / 2)


def test_a_member_may_not_override_a_concrete_kernel_method():
    with pytest.raises(TypeError, match=r"overrides `weights`.*concrete.*abstract"):
        class Doubled(_Tanh):  # noqa: F841 — the dense path would differ from the blocked
            def weights(self, s, n):
                return 2 * self.pointwise(s)


def test_a_member_may_not_override_a_concrete_method_of_an_intermediate_base():
    with pytest.raises(TypeError, match=r"overrides `pointwise`.*subclass AbstractPointwiseKernel"):
        class Shifted(ja.USA):  # noqa: F841 — `pointwise` is AbstractExponentialKernel's
            def pointwise(self, s):
                return jnp.exp(s) + 1


def test_a_member_may_not_override_a_concrete_norm_method():
    with pytest.raises(TypeError, match=r"overrides `step`"):
        class Stepped(ja.PreNorm):  # noqa: F841 — `step` is AbstractEulerNorm's
            def step(self, update, x, tau, W, kick=None):
                return x


def test_a_member_may_not_override_a_concrete_noise_method():
    with pytest.raises(TypeError, match=r"overrides `kick`"):
        class Louder(ja.TokenNoise):  # noqa: F841
            def kick(self, dyn, t, x, dB):
                return 2 * dB


def test_implementing_abstract_methods_is_allowed():
    class Half(AbstractNoise):
        def shape(self, n, d):
            return (n, d)

        def kick(self, dyn, t, x, dB):
            return self.sigma * dB / 2

        @property
        def default_solver(self):
            return dfx.Heun()

    assert Half(0.1).shape(2, 3) == (2, 3)
    assert _model(_Tanh()).kernel.name == "_tanh"


def test_a_pointwise_of_the_wrong_shape_is_refused_when_the_model_is_built():
    # one weight per row: broadcasts silently against the logits
    Summed = _pointwise_kernel("Summed", lambda s: jnp.sum(jax.nn.sigmoid(s), -1, keepdims=True))

    with pytest.raises(ValueError, match=r"Summed.*pointwise.*shape"):
        _model(Summed())


def test_a_kernel_whose_weights_have_the_wrong_shape_is_refused():
    class Rowwise(ja.AbstractKernel):
        name = "rowwise"
        description = "one weight per row"
        normalised = True
        flash = False
        exponent_shift = None

        def offset(self, beta, n, dtype):
            return None

        def weights(self, s, n):
            return jax.nn.softmax(s, axis=-1)[..., :1]

        def rescale(self, mixed, n):
            return mixed

        def block_update(self, state, s, ok, mix):
            return ja.Softmax().block_update(state, s, ok, mix)

        def block_finish(self, state):
            return ja.Softmax().block_finish(state)

        def block_grad(self, s, ok, a, b, delta, dp):
            return ja.Softmax().block_grad(s, ok, a, b, delta, dp)

    with pytest.raises(ValueError, match=r"Rowwise.*weights.*shape"):
        _model(Rowwise())


def test_a_kernel_that_gives_nan_is_named_when_the_model_is_built():
    Root = _pointwise_kernel("Root", jnp.sqrt)  # NaN for negative logits

    with pytest.raises(ValueError, match=r"Root.*pointwise.*NaN"):
        _model(Root())


def test_a_run_whose_kernel_turns_nan_names_the_kernels_own_weights():
    # finite on small logits (the check when the model is built), NaN past 5
    Cliff = _pointwise_kernel("Cliff", lambda s: jnp.where(s > 5, jnp.nan, jax.nn.sigmoid(s)))

    dyn = _model(Cliff())
    dyn = ja.SelfAttentionDynamics(20 * dyn.P.value, dyn.U, beta=2.0, kernel=Cliff())
    x = ja.sample_ellipsoid(jax.random.PRNGKey(1), N, D)
    with pytest.raises(ja.SimulationError, match=r"kernel's own weights"):
        ja.run_layers(dyn, x, num_layers=2, tau=0.1)


@pytest.mark.parametrize("kernel", ["softmax", "sigmoid", "exp", "usa", "hardmax"])
@pytest.mark.parametrize("norm", ["post", "pre", "peri", "ngpt", "none"])
def test_the_builtin_members_pass_their_checks(kernel, norm):
    dyn = _model(kernel, norm)
    x = ja.sample_ellipsoid(jax.random.PRNGKey(1), N, D)
    assert bool(jnp.all(jnp.isfinite(ja.run_layers(dyn, x, num_layers=2, tau=0.1))))
