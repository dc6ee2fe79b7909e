"""Metrics at the mean-field scale: blocked counts and energies equal to the dense
ones, no n × n array in the compiled program, the order parameter and the density
of tokens on S²."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxattn as ja
from jaxattn.metrics import _pairs

M = ja.metrics


def _chain(key, n, d, step):
    """`n` tokens along a random walk of steps of length `step`, in shuffled order:
    one cluster for any `eps > step`, but only through a chain of n − 1 links."""
    k1, k2 = jax.random.split(key)
    steps = jax.random.normal(k1, (n, d))
    steps = step * steps / jnp.linalg.norm(steps, axis=-1, keepdims=True)
    return jax.random.permutation(k2, jnp.cumsum(steps, axis=0))


def _groups(key, n, d, groups, spread):
    """`n` tokens around `groups` random centres, at Gaussian distance `spread`."""
    k1, k2, k3 = jax.random.split(key, 3)
    centres = 3 * jax.random.normal(k1, (groups, d))
    which = jax.random.randint(k2, (n,), 0, groups)
    return centres[which] + spread * jax.random.normal(k3, (n, d))


def _scipy_labels(x, eps):
    """Independent reference: connected components of the eps-graph (scipy), each
    named by its smallest token index."""
    from scipy.sparse.csgraph import connected_components
    from scipy.spatial.distance import cdist

    x = np.asarray(x)
    _, component = connected_components(cdist(x, x) < eps, directed=False)
    first = {c: i for i, c in reversed(list(enumerate(component)))}
    return np.array([first[c] for c in component])


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
@pytest.mark.parametrize("block", [3, 64, 300])
def test_blocked_cluster_count_equals_dense(key, block):
    """Random groups at several eps, long shuffled chains (which need many merges)
    and a chain cut in two: the blocked labels equal the dense ones and scipy's
    components exactly, and so do the counts."""
    cases = []
    for i, (n, d) in enumerate([(120, 3), (97, 2), (150, 5)]):
        x = _groups(jax.random.fold_in(key, i), n, d, groups=6, spread=0.3)
        cases += [(x, eps) for eps in (0.05, 0.3, 0.8, 2.0)]
        chain = _chain(jax.random.fold_in(key, 10 + i), n, d, step=0.1)
        cases += [(chain, 0.1001), (chain, 0.0999)]
    cut = _chain(jax.random.fold_in(key, 20), 120, 3, step=0.1)
    cut = cut.at[:60].add(10.0)  # one shuffled walk split into two far-apart pieces
    cases.append((cut, 0.1001))
    # eps traced: one program per shape, not per case.
    dense_labels = jax.jit(_pairs.dense_labels)
    blocked_labels = jax.jit(lambda x, eps: M.cluster_labels(x, eps, block_size=block))
    blocked_count = jax.jit(lambda x, eps: M.cluster_count(x, eps, block_size=block))
    for x, eps in cases:
        want = _scipy_labels(x, eps)
        np.testing.assert_array_equal(dense_labels(x, eps), want, err_msg=f"{x.shape}, {eps}")
        np.testing.assert_array_equal(blocked_labels(x, eps), want, err_msg=f"{x.shape}, {eps}")
        assert int(blocked_count(x, eps)) == len(np.unique(want)), (x.shape, eps)


def test_cluster_count_chain_needs_few_sweeps(key):
    """A chain of 400 tokens (shuffled, in walk order, reversed) is one cluster,
    found in at most 2 log₂ n sweeps: merging roots, not labels one link a sweep as
    plain label propagation does (which needs up to n − 1)."""
    n = 400
    walk = _chain(key, n, 3, step=0.1)
    order = jnp.argsort(walk[:, 0])  # any fixed order of the same tokens
    for x in (walk, walk[order], walk[order][::-1]):
        roots, sweeps = _pairs.component_roots(x, 0.1001, 64)
        assert np.all(np.asarray(roots) == 0)
        print(f"sweeps: {int(sweeps)}")
        assert int(sweeps) <= 2 * math.ceil(math.log2(n))
        assert int(M.cluster_count(x, 0.1001, block_size=64)) == 1


def test_blocked_cluster_count_batches_and_default(key):
    x = jnp.stack([_groups(jax.random.fold_in(key, i), 80, 3, 4, 0.2) for i in range(3)])
    labels = np.stack([_scipy_labels(xi, 0.5) for xi in x])
    expected = [len(np.unique(row)) for row in labels]
    assert M.cluster_count(x, 0.5).tolist() == expected  # n = 80: the blocked default
    assert jax.jit(lambda y: M.cluster_count(y, 0.5, block_size=16))(x).tolist() == expected
    np.testing.assert_array_equal(M.cluster_labels(x, 0.5), labels)
    np.testing.assert_array_equal(M.cluster_labels(x[:, :40], 0.5),  # n = 40: dense
                                  np.stack([_scipy_labels(xi, 0.5) for xi in x[:, :40]]))
    # block_size=0: the dense count at any n (as a model's); a negative one is refused
    assert M.cluster_count(x, 0.5, block_size=0).tolist() == expected
    with pytest.raises(ValueError, match="block_size"):
        M.cluster_count(x, 0.5, block_size=-1)


def _potential_bound(x, P, beta, dtype):
    """How far two orders of the same positive sum may differ: `2 (n² − 1) u` for the
    sums, plus `β |Δs|` for scores `x_iᵀ P x_j` rounded differently (two products of
    length d: `|Δs| ≤ 2 · 2d u · max |x_i| |P| |x_j|`)."""
    u = float(jnp.finfo(dtype).eps) / 2
    n, d = x.shape
    r = float(jnp.max(jnp.linalg.norm(x, axis=-1)))
    return 2 * (n * n - 1) * u + abs(beta) * 4 * d * u * r * r * float(jnp.linalg.norm(P))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_blocked_potential_equals_dense(key, dtype):
    n, d, beta = 300, 3, 0.7
    x = jax.random.normal(key, (n, d), dtype) / math.sqrt(d)
    P = jax.random.normal(jax.random.fold_in(key, 1), (d, d), dtype) / d
    dense = float(_pairs.exp_score_sum(x, P, beta, n)) / 2
    ref = float(0.5 * np.sum(np.exp(beta * np.asarray(x, np.float64) @ np.asarray(P, np.float64)
                                    @ np.asarray(x, np.float64).T)))
    bound = _potential_bound(x, P, beta, dtype)
    for block in (1, 7, 64, 299):
        blocked = float(M.potential(x, P, beta, block_size=block))
        assert abs(blocked - dense) <= bound * dense
        assert abs(blocked - ref) <= bound * ref


def test_blocked_potential_gradient_and_batch(key):
    x = jax.random.normal(key, (2, 50, 3))
    P = jnp.eye(3) + 0.1 * jax.random.normal(jax.random.fold_in(key, 1), (3, 3))
    dense = jax.grad(lambda y: jnp.sum(M.potential(y, P, 0.5)))(x)
    blocked = jax.grad(lambda y: jnp.sum(M.potential(y, P, 0.5, block_size=8)))(x)
    np.testing.assert_allclose(blocked, dense, rtol=1e-12)
    np.testing.assert_allclose(M.potential(x, P, 0.5, block_size=8), M.potential(x, P, 0.5),
                               rtol=1e-12)


def _temp_bytes(f, x):
    return jax.jit(f).lower(x).compile().memory_analysis().temp_size_in_bytes


def test_large_n_programs_need_no_n_by_n_array():
    """At n = 20,000 an n × n float32 matrix is 1.6 GB: the compiled blocked programs
    need a few blocks of `block · n`, far below it."""
    n, d = 20_000, 3
    x = jax.ShapeDtypeStruct((n, d), jnp.float32)
    P = jnp.eye(d, dtype=jnp.float32)
    square = n * n * 4
    block = _pairs.block_rows(n, None)
    for f in (lambda y: M.cluster_count(y, 0.1), lambda y: M.potential(y, P, 1.0)):
        temp = _temp_bytes(f, x)
        print(f"temp {temp / 2**20:.1f} MiB, n² float32 {square / 2**20:.0f} MiB")
        assert temp < square / 20
        assert temp < 8 * block * n * d * 4  # a few blocks of rows, not n²


def test_moderate_n_default_blocks_match_references(key):
    """n = 3000 (n² above one block): the default blocks against scipy's components
    and a float64 NumPy sum."""
    n = 3000
    x = _groups(key, n, 3, groups=5, spread=0.4).astype(jnp.float32)
    assert _pairs.block_rows(n, None) < n
    for eps in (0.1, 0.5):
        assert int(M.cluster_count(x, eps)) == len(np.unique(_scipy_labels(x, eps)))
    y = x / 4
    P = jnp.eye(3, dtype=jnp.float32)
    y64 = np.asarray(y, np.float64)
    ref = 0.5 * np.sum(np.exp(y64 @ y64.T))
    assert abs(float(M.potential(y, P, 1.0)) - ref) <= _potential_bound(y, P, 1.0,
                                                                        jnp.float32) * ref


# --- the order parameter --------------------------------------------------------------


def test_order_parameter(key):
    n, d = 2000, 3
    u = jax.random.normal(key, (5, n, d))
    u = u / jnp.linalg.norm(u, axis=-1, keepdims=True)
    r = M.order_parameter(u)
    assert r.shape == (5,)
    # E|x̄|² = 1/n for independent uniform unit tokens: the mean over 5 draws of n|x̄|²
    # is a mean of χ²₃/3 variables, within 4 standard deviations (√(2/3)/√5) of 1.
    assert abs(float(jnp.mean(n * r**2)) - 1) < 4 * math.sqrt(2 / 3 / 5)
    collapsed = jnp.broadcast_to(u[0, 0], (n, d))
    np.testing.assert_allclose(M.order_parameter(collapsed), 1.0, rtol=1e-12)
    balanced = jnp.concatenate([u[0], -u[0]])
    assert float(M.order_parameter(balanced)) < 1e-15
    np.testing.assert_allclose(jax.jit(M.order_parameter)(u), r, rtol=1e-12)


# --- the density on S² ----------------------------------------------------------------


def test_sphere_density_of_uniform_tokens_is_flat(key):
    """Uniform tokens: every cell's count is binomial(n, 1/cells); all lie within 4.5
    standard deviations (for 72 cells a false alarm has probability < 1e-3) and the
    chi-square statistic is within 5 of its own standard deviations of its mean."""
    n, bands, sectors = 72_000, 6, 12
    u = jax.random.normal(key, (n, 3))  # uniform directions, of lengths that vary
    s = M.sphere_density(u, cells=(bands, sectors))
    assert s.counts.shape == (bands, sectors) and int(s.counts.sum()) == n
    cells = bands * sectors
    p = 1 / cells
    sd = math.sqrt(n * p * (1 - p))
    assert float(jnp.max(jnp.abs(s.counts - n * p))) < 4.5 * sd
    chi2 = float(jnp.sum((s.counts - n * p) ** 2 / (n * p)))
    assert abs(chi2 - (cells - 1)) < 5 * math.sqrt(2 * (cells - 1))
    np.testing.assert_allclose(jnp.sum(s.density) * 4 * math.pi / cells, 1.0, rtol=1e-12)
    np.testing.assert_allclose(s.z_edges, np.linspace(-1, 1, bands + 1), atol=1e-15)
    np.testing.assert_allclose(s.lon_edges, np.linspace(-np.pi, np.pi, sectors + 1),
                               atol=1e-15)


def test_sphere_density_is_not_flat_for_a_gaussian_blob(key):
    """Gaussian tokens stretched along x₃ (not uniform directions): the same test
    sees it, so the flatness test above has power."""
    n = 72_000
    u = jax.random.normal(key, (n, 3)) * jnp.array([[1.0, 1.0, 1.2]])
    s = M.sphere_density(u, cells=(6, 12))
    p = 1 / 72
    chi2 = float(jnp.sum((s.counts - n * p) ** 2 / (n * p)))
    assert chi2 - 71 > 5 * math.sqrt(2 * 71)


def test_sphere_density_collapsed_batched_and_refusals(key):
    v = jnp.array([0.3, -0.5, 0.2])
    collapsed = jnp.broadcast_to(v, (2, 50, 3)) * jnp.arange(1.0, 51.0)[None, :, None]
    s = M.sphere_density(collapsed, cells=(4, 8))
    assert s.counts.shape == (2, 4, 8)
    for c in s.counts:
        assert int(c.max()) == 50 and int(jnp.sum(c > 0)) == 1
    z = 0.2 / float(jnp.linalg.norm(v))
    lon = math.atan2(-0.5, 0.3)
    band, sector = np.unravel_index(int(jnp.argmax(s.counts[0])), (4, 8))
    assert s.z_edges[band] <= z < s.z_edges[band + 1]
    assert s.lon_edges[sector] <= lon < s.lon_edges[sector + 1]
    poles = jnp.array([[0.0, 0.0, 1.0], [0.0, 0.0, -1.0], [-1.0, 0.0, 0.0]])
    assert int(M.sphere_density(poles, cells=(3, 4)).counts.sum()) == 3
    with pytest.raises(ValueError, match="d = 4.*three coordinates"):
        M.sphere_density(jnp.ones((5, 4)))
    with pytest.raises(ValueError, match="cells"):
        M.sphere_density(poles, cells=(3,))
    with pytest.raises(ValueError, match="bands"):
        M.sphere_density(poles, cells=(0, 4))


def test_draw_sphere_density(key):
    from jaxattn._artifacts.figures import draw_sphere_density, pyplot

    plt = pyplot()
    s = M.sphere_density(jax.random.normal(key, (2, 500, 3)), cells=(4, 6))
    fig, ax = plt.subplots()
    mesh = draw_sphere_density(ax, jax.tree.map(lambda a: a[0] if a.ndim == 3 else a, s))
    np.testing.assert_allclose(np.asarray(mesh.get_array()).reshape(4, 6),
                               4 * np.pi * np.asarray(s.density[0]))
    assert ax.get_xlim() == (-np.pi, np.pi) and ax.get_ylim() == (-1, 1)
    with pytest.raises(ValueError, match="one map"):
        draw_sphere_density(ax, s)
    plt.close(fig)
