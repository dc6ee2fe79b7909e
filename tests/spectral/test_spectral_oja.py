"""Equilibria of the Oja system and of the single-head map (paper 004 App. D):
the `jax.jacfwd` tangent classification against the closed form (Lemma 4 /
Theorem 3) and against direct simulation from small perturbations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxattn as ja
from jaxattn.spectral import (
    equilibria,
    oja_system,
    perturbation_growth,
    single_head,
    spectral_radius,
    tangent_jacobian,
)


def _instance(key, d):
    ku, kp = jax.random.split(key)
    A, B = jax.random.normal(ku, (d, d)), jax.random.normal(kp, (d, d))
    return (A + A.T) / 2, (B + B.T)  # symmetric U, and P of larger scale


@pytest.mark.parametrize("make", ["oja", "head"])
def test_jacobian_classification_agrees_with_simulation(key, make):
    n, d, tau = 5, 3, 1.0
    decided = stable = 0
    for k in jax.random.split(key, 4):
        U, P = _instance(k, d)
        dyn = oja_system(U) if make == "oja" else single_head(U, P)
        eq = equilibria(dyn, n, tau=tau)
        fixed = np.asarray(eq.is_fixed)
        radius = np.asarray(eq.radius)
        growth = np.asarray(perturbation_growth(dyn, eq.points, k, eps=1e-6, layers=400,
                                                tau=tau))
        sure = fixed & (np.abs(radius - 1) > 0.02)
        np.testing.assert_array_equal((growth < 1)[sure], (radius < 1)[sure])
        np.testing.assert_allclose(np.asarray(eq.predicted)[fixed], radius[fixed], rtol=1e-8)
        np.testing.assert_array_equal(np.asarray(eq.theorem3)[fixed], (radius < 1)[fixed])
        decided += sure.sum()
        stable += (sure & (radius < 1)).sum()
        # Theorem 2 / Lemma 4: at most one stable consensus pair, at the eigenvalue
        # leading |1 + τλ| and only if it is positive.
        cons = fixed & np.asarray(eq.is_consensus) & (radius < 1)
        lam = np.linalg.eigvalsh(np.asarray(U))
        top = lam[np.argmax(np.abs(1 + tau * lam))]
        assert cons.sum() == (1 if top > 0 else 0)
        if make == "oja":  # Theorem 2: no stable bipartite point without attention
            assert not np.any(fixed & ~np.asarray(eq.is_consensus) & (radius < 1))
    assert decided >= 20 and 0 < stable < decided  # both outcomes were exercised


def test_stable_bipartite_point_of_the_single_head_map():
    """Paper 004 Remark 10: with attention, bipartite points can be stable."""
    U = jnp.diag(jnp.array([1.0, 0.5, -0.3]))
    dyn = single_head(U, 2.0 * jnp.eye(3))
    eq = equilibria(dyn, 10)
    sel = np.nonzero((np.asarray(eq.index) == 0) & (np.asarray(eq.m) == 8))[0][0]
    assert float(eq.residual[sel]) < 1e-12 and float(eq.radius[sel]) < 0.9
    x = eq.points[sel]  # 8 tokens at v, 2 at −v
    np.testing.assert_allclose(x, ja.explore.bipartite_point(x[0], 10, 8), atol=1e-15)
    growth = perturbation_growth(dyn, eq.points[sel][None], jax.random.PRNGKey(0),
                                 eps=1e-3, layers=200)
    assert float(growth[0]) < 1e-6
    # Without attention (Oja) the same point is unstable (Theorem 2).
    eq0 = equilibria(oja_system(U), 10)
    assert float(eq0.radius[sel]) > 1


def test_tangent_jacobian_against_finite_differences(key):
    U, P = _instance(key, 3)
    dyn = single_head(U, P)
    eq = equilibria(dyn, 4)
    x = eq.points[0]
    J = np.asarray(tangent_jacobian(dyn, x))
    assert J.shape == (4 * 2, 4 * 2)
    # Central differences along one tangent direction of token 1, retracted onto S².
    t = jnp.cross(x[1], jnp.array([0.3, -0.2, 0.9]))
    t = t / jnp.linalg.norm(t)
    h = 1e-6

    def moved(s):
        y = x.at[1].set((x[1] + s * t) / jnp.linalg.norm(x[1] + s * t))
        return dyn.layer(0.0, y, 1.0)

    fd = (moved(h) - moved(-h)) / (2 * h)  # (n, d), tangent at the equilibrium
    full = jax.jacfwd(lambda y: dyn.layer(0.0, y, 1.0))(x)
    np.testing.assert_allclose(fd, jnp.einsum("iab,b->ia", full[:, :, 1, :], t), atol=1e-7)
    # The intrinsic eigenvalues are among the extrinsic ones (paper 004 Remark 2).
    ext = np.linalg.eigvals(np.asarray(full).reshape(12, 12))
    for ev in np.linalg.eigvals(J):
        assert np.min(np.abs(ext - ev)) < 1e-8
    # The radius is traceable and an array; a host number is the caller's float().
    rho = jax.jit(spectral_radius)(jnp.asarray(J))
    assert isinstance(rho, jax.Array) and rho.shape == ()
    np.testing.assert_allclose(float(rho), np.max(np.abs(np.linalg.eigvals(J))), rtol=1e-12)


def test_equilibria_refuses_asymmetric_or_causal(key):
    A = jax.random.normal(key, (3, 3))
    with pytest.raises(ValueError, match="symmetric"):
        equilibria(oja_system(A), 4)
    causal = ja.SelfAttentionDynamics(jnp.zeros((1, 3, 3)), (A + A.T)[None], causal=True)
    with pytest.raises(ValueError, match="causal"):
        equilibria(causal, 4)


def test_equilibria_is_one_program():
    """`equilibria` of a concrete map compiles one program (no eager one-op programs,
    each of which costs tracing and lowering in every new process, #42), and still
    refuses a non-symmetric `Ω`."""
    compiled = []

    def listen(event, seconds, **kwargs):
        compiled.append(event == "/jax/core/compile/backend_compile_duration")

    U = np.diag([1.0, 0.5, -0.3, 0.2, 0.1])  # d = 5 and n = 9: shapes no other test uses
    dyn = oja_system(U)
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        eq = equilibria(dyn, 9)
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert sum(compiled) == 1 and eq.points.shape == (5 * 5, 9, 5)
    with pytest.raises(ValueError, match="symmetric layer matrix"):
        equilibria(oja_system(U + np.triu(U, 1) + np.eye(5, k=1)), 9)


def test_equilibria_are_fixed_in_float32():
    """In float32 one layer leaves residuals of 1e-8..1e-7: a fixed `1e-9` read every
    equilibrium as not fixed (stability −2, Theorem 3 False throughout)."""
    U = np.array([[0.5, 0.3, -0.2], [0.3, -0.4, 0.1], [-0.2, 0.1, 0.8]])
    with jax.enable_x64(False):
        eq = equilibria(single_head(U, np.eye(3)), 10)
        assert eq.residual.dtype == jnp.float32
        fixed, stability = np.asarray(eq.is_fixed), np.asarray(eq.stability())
        theorem3 = np.asarray(eq.theorem3)
    with jax.enable_x64(True):
        ref = equilibria(single_head(U, np.eye(3)), 10)
    np.testing.assert_array_equal(fixed, np.asarray(ref.is_fixed))
    assert fixed.sum() >= 6 and np.all(stability[fixed] != -2)
    np.testing.assert_array_equal(theorem3, np.asarray(ref.theorem3))
    assert theorem3.any()


@pytest.mark.parametrize("dyn, match", [
    (ja.SelfAttentionDynamics(np.zeros((1, 3, 3)), np.eye(3)[None], norm="ngpt"),
     r"norm='post'\); got norm='ngpt'"),
    (ja.SelfAttentionDynamics(np.zeros((1, 3, 3)), np.eye(3)[None], norm="pre"),
     r"got norm='pre'"),
    (ja.SelfAttentionDynamics(np.zeros((1, 3, 3)), np.eye(3)[None], W=np.diag([1.0, 2, 3])),
     r"unit sphere \(W = I\); got another metric W"),
])
def test_equilibria_refuses_dynamics_its_closed_form_does_not_model(dyn, match):
    """These gave a closed-form radius (ngpt: Theorem 3 True at radius 1.894) that does
    not describe their maps."""
    with pytest.raises(ValueError, match=match):
        equilibria(dyn, 4)


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
def test_tangent_jacobian_past_the_blocked_attention_threshold():
    """Above n ≈ 362 tokens the default attention takes key blocks (a custom VJP), which
    `jax.jacfwd` cannot go through: the Oja and single-head maps stay dense."""
    U = np.diag([1.0, -0.5])
    J = tangent_jacobian(oja_system(U), ja.spectral.bipartite_point(np.eye(2)[0], 370, 370))
    assert J.shape == (370, 370)
    np.testing.assert_allclose(float(spectral_radius(J)), 1 / (1 + 1.0), rtol=1e-12)  # Lemma 4


@pytest.mark.parametrize("call, match", [
    (lambda p: perturbation_growth(oja_system(np.eye(3)), p, jax.random.PRNGKey(0), eps=0.0),
     "`eps` must be > 0"),
    (lambda p: perturbation_growth(oja_system(np.eye(3)), p, jax.random.PRNGKey(0), layers=-1),
     "`layers` must be a whole number ≥ 1"),
    (lambda p: ja.spectral.bipartite_closed_form(jnp.array([1.0, 0.5, 0.2]), 5, 3, 4, 0.0, 1.0),
     r"`k` indexes the 3 eigenvalues: it must be a whole number in \[0, 3\), got 5"),
    # these ran: radius 0.43 and "stable" for m > n, NaN for τ < 0, an IndexError
    (lambda p: ja.spectral.bipartite_closed_form(jnp.array([1.0, 0.5, 0.2]), 0, 7, 4, 0.0, 1.0),
     r"`m` tokens of `n` sit at e_k: it must lie in 0..n, got m = 7, n = 4"),
    (lambda p: ja.spectral.bipartite_closed_form(jnp.array([1.0, 0.5, 0.2]), 0, 2, 4, 0.0, -1.0),
     "`tau` must be > 0"),
    (lambda p: perturbation_growth(oja_system(np.eye(3)), p[0], jax.random.PRNGKey(0)),
     r"takes equilibria \(E, n, d\), got shape \(4, 3\)"),
    (lambda p: oja_system(np.eye(3) * (1 + 1j)), "real matrices"),  # dropped the imaginary part
])
def test_growth_and_closed_form_refuse_meaningless_arguments(call, match):
    """eps = 0 gave NaN, layers = −1 a scan error, k = 5 of d = 3 the last eigenvalue."""
    points = ja.spectral.bipartite_point(np.eye(3)[0], 4, 4)[None]
    with pytest.raises(ValueError, match=match):
        call(points)
