"""Long horizons of the attention flow: what a run to `t = 10⁸` and beyond needs
(`metastability`; the mechanism: `docs/limits.md`, "Metastability and long horizons").

The flow is saved on a logarithmic grid (`log_grid`), stopped by an event when the
tokens have merged (`merged`), and read as a staircase of plateaus
(`ja.metrics.interaction_energy`, `ja.metrics.plateaus`), each plateau's saddle index
read with the clusters as point masses (`cluster_index`, on
`ja.metrics.cluster_labels`). The integrators that reach those horizons, the paper's
`rescaled_euler` and `rescaled_flow`, are `ja.metrics`'; they are re-exported here,
with `SNAP` (`ja.metrics.RESCALED_SNAP`).
"""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._manifold import normalize
from .._programs import kept_jit
from ..metrics import RESCALED_SNAP, cluster_count, cluster_labels, saddle_index
from ..metrics import rescaled_euler as rescaled_euler
from ..metrics import rescaled_flow as rescaled_flow

#: The snapping distance of `rescaled_flow` (chord): points this close become one.
SNAP = RESCALED_SNAP
#: `cluster_labels` as one program per shape and `eps` (called eagerly, its dense
#: path's loop was traced anew on every call: 115 programs per `metastability` run).
_labels = kept_jit(cluster_labels, static_argnames=("eps",))


def log_grid(t_min: float, t_max: float, count: int) -> np.ndarray:
    """Save times `0, t_min, …, t_max` (float64): `0` then `count ≥ 2` log-spaced times,
    `0 < t_min < t_max` (`Metastability.refusals` refuses others)."""
    return np.concatenate([[0.0], np.geomspace(t_min, t_max, count)])


def merged(eps: float, target: int = 1) -> "Merged":
    """The event of `ja.solve_flow(..., solution=True, event=merged(eps, target))`:
    true once the tokens form at most `target` clusters at linking distance `eps`
    (`ja.metrics.cluster_count`, `eps > 0`; `target ≥ 1`, 1: consensus), as `cond(t, x)`
    of one sequence `x (n, d)`; the run stops at the end of that step."""
    return Merged(eps, target)


class Merged(eqx.Module):
    """`merged`'s condition: a module, not a closure, so that another process names
    the solve that holds it the same (its program is kept: `_programs.kept_jit`)."""

    eps: float
    target: int

    def __call__(self, t, x):
        return cluster_count(x, self.eps) <= self.target


def clusters(x: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """The clusters of `ja.metrics.cluster_labels` at distance `eps` (in float64), as
    point masses on the host: each cluster's unit mean direction `(k, d)` and its
    number of tokens `(k,)`, in the order of their first tokens."""
    x = np.asarray(x, float)
    label = _float64_labels(x, eps)
    with jax.enable_x64(True):
        ids = np.unique(label)
        means = np.stack([x[label == i].mean(axis=0) for i in ids])
        return np.asarray(normalize(jnp.asarray(means))), np.array(
            [np.sum(label == i) for i in ids])


def _float64_labels(x: np.ndarray, eps: float) -> np.ndarray:
    """`ja.metrics.cluster_labels` of `x` at distance `eps`, in float64, on the host."""
    with jax.enable_x64(True):
        return np.asarray(_labels(jnp.asarray(np.asarray(x, float), jnp.float64),
                                  eps=float(eps)))


def cluster_index(x: np.ndarray, beta: float, eps: float) -> int:
    """The index of the saddle a plateau sits near: the clusters of `x` at distance
    `eps` as point masses, `saddle_index` on their positions. (The tokens' relative
    motions inside a cluster are stable, `∂²E ∝ −β`, and decouple from the clusters'
    motions at the saddle, where each cluster is one point.)"""
    means, masses = clusters(x, eps)
    if len(means) < 2:
        return 0
    with jax.enable_x64(True):
        return saddle_index(jnp.asarray(means, jnp.float64), beta, masses.astype(float))


def coupling_span(x: np.ndarray, beta: float, eps: float) -> float:
    """How many decades the couplings that hold the clusters of `x` together span:
    with `c_ab = m_a m_b e^{−β(1 − cos δ_ab)}` between clusters `a`, `b` (point masses
    at distance `eps`), the `log₁₀` of the largest over the smallest coupling of the
    tree of strongest couplings (Kruskal's, largest first) that joins them all; on
    the circle, the neighbouring pairs but the widest gap. `0` with fewer than two
    clusters. A Hessian in float64 resolves the modes of the weak ones beside the
    strong ones only while this is well below 16."""
    logs = _tree_couplings(x, beta, eps)
    return float((max(logs) - min(logs)) / math.log(10)) if logs else 0.0


def weakest_coupling(x: np.ndarray, beta: float, eps: float) -> float:
    """The `log₁₀` of the weakest coupling of `coupling_span`'s tree, `m_a m_b
    e^{−β(1 − cos δ_ab)}`, kept in the logarithm (`inf` with fewer than two
    clusters). The span alone cannot see a Hessian whose entries all underflow: two
    clusters span `0` decades at any `β`, but past `β(1 − cos δ) ≈ 708` their coupling
    is below float64's smallest normal number (`10⁻³⁰⁸`) and the saddle index reads
    `0` (Hessian all zeros), not `1`."""
    logs = _tree_couplings(x, beta, eps)
    return float(min(logs) / math.log(10)) if logs else math.inf


def _tree_couplings(x: np.ndarray, beta: float, eps: float) -> list[float]:
    """The natural logs of the couplings of the tree of strongest couplings that
    joins the clusters of `x` (`coupling_span`); empty with fewer than two."""
    means, masses = clusters(x, eps)
    k = len(means)
    if k < 2:
        return []
    cos = np.clip(means @ means.T, -1, 1)
    log_c = np.log(np.outer(masses, masses)) - beta * (1 - cos)
    group, kept = list(range(k)), []
    for flat in np.argsort(-log_c, axis=None):
        a, b = divmod(int(flat), k)
        if a < b and group[a] != group[b]:
            old = group[b]
            group = [group[a] if g == old else g for g in group]
            kept.append(float(log_c[a, b]))
    return kept


def groups(x: np.ndarray, eps: float) -> frozenset:
    """The clusters of `x` at distance `eps` as sets of token indices (a partition
    of `range(n)`, comparable between two readings of the same tokens)."""
    label = _float64_labels(x, eps)
    return frozenset(frozenset(np.flatnonzero(label == i).tolist()) for i in np.unique(label))


def closest_pair(x: np.ndarray, eps: float) -> tuple[float, int, int]:
    """The angle `δ` of the closest two clusters of `x` at distance `eps`, their
    combined number of tokens `m_a + m_b` and the number of tokens `n`; `δ = 0` with
    fewer than two clusters."""
    means, masses = clusters(x, eps)
    n = int(np.sum(masses))
    if len(means) < 2:
        return 0.0, n, n
    cos = np.clip(means @ means.T, -1, 1) - 2 * np.eye(len(means))
    a, b = np.unravel_index(np.argmax(cos), cos.shape)
    return float(np.arccos(cos[a, b])), int(masses[a] + masses[b]), n


def two_cluster_time(x: np.ndarray, beta: float, eps: float) -> tuple[float, float]:
    """The predicted time before the next merger from tokens `x` on a plateau, and the
    angle `δ` of the closest two clusters: those two alone, of `m_a`, `m_b` tokens,
    close at the rate `dδ/dt = −(m_a + m_b)/n · e^{−β(1 − cos δ)} sin δ` (the `usa`
    flow), which takes `n e^{β(1 − cos δ)} / ((m_a + m_b) β sin² δ)` to leading
    order in `β` (Laplace's method): exponentially long in `β`. Its logarithm."""
    delta, m, n = closest_pair(x, eps)
    # in logs: at a tiny β the product m β sin²δ underflows to 0
    sin = abs(math.sin(delta))
    if sin == 0:
        return math.inf, delta
    log_t = beta * (1 - math.cos(delta)) + math.log(n) - math.log(m) - math.log(beta) \
        - 2 * math.log(sin)
    return float(log_t), delta


def merge_time(x: np.ndarray, beta: float, eps: float) -> float:
    """The logarithm of the exact time the closest two clusters of `x` (alone, as
    point masses) take to come within `eps` of each other: the integral of
    `dδ/dt = −(m_a + m_b)/n · e^{−β(1 − cos δ)} sin δ` (`two_cluster_time`) from
    their angle `δ₀` to `δ_e = 2 arcsin(eps/2)` (chord `eps`),

        T = n/(m_a + m_b) · e^{β(1 − cos δ₀)} ∫_{δ_e}^{δ₀} e^{−β(cos δ − cos δ₀)} / sin δ dδ,

    by scipy's `quad` (the factor `e^{β(1 − cos δ₀)}` kept in the logarithm).
    Laplace's `two_cluster_time` is its leading term as `β → ∞` (4 % above it at
    β = 10, δ₀ = 1.87; 0.6 % at β = 100). `inf` with fewer than two clusters, `−inf`
    when `δ₀ ≤ δ_e`."""
    from scipy.integrate import quad

    delta, m, n = closest_pair(x, eps)
    if delta == 0.0:
        return math.inf
    end = 2 * math.asin(min(eps / 2, 1.0))
    if delta <= end:
        return -math.inf
    c0 = math.cos(delta)

    def integrand(d):
        # cos δ − cos δ₀ = 2 sin((δ₀ − δ)/2) sin((δ₀ + δ)/2), without cancellation
        return math.exp(-2 * beta * math.sin((delta - d) / 2) * math.sin((delta + d) / 2)) \
            / math.sin(d)

    width = 1 / max(beta * math.sin(delta), 1e-300)  # the peak at δ₀
    points = [p for p in (delta - width, delta - 10 * width) if end < p < delta]
    value, _ = quad(integrand, end, delta, points=points or None, limit=200,
                    epsabs=0, epsrel=1e-10)
    return float(beta * (1 - c0) + math.log(n) - math.log(m) + math.log(value))
