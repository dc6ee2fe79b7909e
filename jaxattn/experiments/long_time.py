"""Long horizons of the attention flow: what a run to `t = 10⁸` and beyond needs.

The tokens of the unnormalised dynamics (`kernel="usa"`, weights
`exp(β(⟨x_i, x_j⟩ − 1)) / n`) sit near a configuration of a few clusters for a time
exponentially long in `β`, then two clusters merge quickly, and so on (Geshkovski,
Koubbi, Polyanskiy, Rigollet, "Dynamic metastability in the self-attention model",
2024). The flow is then saved on a logarithmic grid (`log_grid`), stopped by an
event when the tokens have merged (`merged`), and read as a staircase of its
interaction energy (`interaction_energy`, `plateaus`); each plateau sits near a
saddle of the energy whose index (`saddle_index`) is the number of its unstable
directions. `rescaled_euler` is the paper's own scheme: Euler steps of constant
length in the rescaled time of its figures.
"""

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ..metrics import cluster_count


def log_grid(t_min: float, t_max: float, count: int) -> np.ndarray:
    """Save times `0, t_min, …, t_max`: `0` then `count` log-spaced times.

    **Arguments:**

    - `t_min`: the first positive time, `> 0`.
    - `t_max`: the last time, `> t_min`.
    - `count`: log-spaced times, `≥ 2`.

    **Returns:**

    The `count + 1` times, float64.
    """
    if not 0 < t_min < t_max:
        raise ValueError(f"a log grid needs 0 < t_min < t_max, got {t_min!r} and {t_max!r}.")
    if count < 2:
        raise ValueError(f"a log grid needs at least 2 times, got {count!r}.")
    return np.concatenate([[0.0], np.geomspace(t_min, t_max, count)])


def merged(eps: float, target: int = 1):
    """The event of `ja.solve_flow(..., solution=True, event=merged(eps, target))`:
    true once the tokens form at most `target` clusters at linking distance `eps`
    (`ja.metrics.cluster_count`); the run stops at the end of that step.

    **Arguments:**

    - `eps`: the linking distance of the clusters, `> 0`.
    - `target`: the number of clusters that stops the run, `≥ 1` (1: consensus).

    **Returns:**

    `cond(t, x) -> bool` for one sequence `x (n, d)`.
    """
    if not eps > 0:
        raise ValueError(f"the merging distance eps must be > 0, got {eps!r}.")
    if target < 1:
        raise ValueError(f"the target cluster count must be ≥ 1, got {target!r}.")
    return lambda t, x: cluster_count(x, eps) <= target


def interaction_energy(x: Float[Array, "*batch n d"], beta, weights=None) -> Float[Array, "*batch"]:
    """The interaction energy `E = (1/n²) Σ_ij m_i m_j exp(β(⟨x_i, x_j⟩ − 1))` of unit tokens.

    It grows along the `usa` flow to its maximum 1 at consensus (the paper's
    energy; `⟨x_i, x_j⟩ − 1 = −‖x_i − x_j‖²/2`, so no cancellation). `weights`
    `m_i` (default all 1, `n = Σ m_i`) let a cluster count for its tokens.

    **Arguments:**

    - `x`: unit tokens `(..., n, d)`.
    - `beta`: the inverse temperature `β`.
    - `weights`: the tokens' masses `(n,)` (default: ones).

    **Returns:**

    `E` with the shape of the leading axes.
    """
    diff = x[..., :, None, :] - x[..., None, :, :]
    gap = -0.5 * jnp.sum(diff * diff, axis=-1)
    m = jnp.ones(x.shape[-2], x.dtype) if weights is None else jnp.asarray(weights, x.dtype)
    pair = m[:, None] * m[None, :] * jnp.exp(beta * gap)
    return jnp.sum(pair, axis=(-2, -1)) / jnp.sum(m) ** 2


class Staircase(NamedTuple):
    """Plateaus and jumps of a curve over save times (`plateaus`)."""

    #: `(k,)` first and last save time of each plateau
    starts: np.ndarray
    ends: np.ndarray
    #: `(k,)` the value on each plateau (its median)
    levels: np.ndarray
    #: `(k − 1,)` each jump's time: the geometric mean of the saves it spans
    jumps: np.ndarray


def plateaus(ts, values, jump: float) -> Staircase:
    """Split a curve into plateaus and the jumps between them.

    A jump is a run of consecutive save intervals over which the curve moves by more
    than `jump`; the saves between two jumps are a plateau (a plateau of one save
    counts). Infinite times (after an event) are dropped first.

    **Arguments:**

    - `ts`: the save times `(T,)`, positive where a log axis reads them.
    - `values`: the curve at those times `(T,)`.
    - `jump`: the smallest change between two saves that is part of a jump, `> 0`.

    **Returns:**

    A `Staircase`.
    """
    ts, values = np.asarray(ts, float), np.asarray(values, float)
    keep = np.isfinite(ts) & np.isfinite(values)
    ts, values = ts[keep], values[keep]
    moving = np.abs(np.diff(values)) > jump
    cuts = np.flatnonzero(np.diff(np.concatenate([[0], moving.astype(int), [0]])))
    rises, falls = cuts[::2], cuts[1::2]  # jump k spans saves rises[k] … falls[k]
    first = np.concatenate([[0], falls])
    last = np.concatenate([rises, [len(ts) - 1]])
    levels = np.array([np.median(values[a:b + 1]) for a, b in zip(first, last)])
    mids = np.sqrt(np.abs(ts[rises] * ts[falls]))
    return Staircase(ts[first], ts[last], levels, mids)


def tangent_basis(x: Float[Array, "n d"]) -> Float[Array, "n d-1 d"]:
    """An orthonormal basis of each token's tangent space `x_iᗮ` (`x_i` unit)."""
    d = x.shape[-1]
    # Householder reflection sending e_1 to x_i: its other columns span x_iᗮ
    e1 = jnp.zeros((1, d), x.dtype).at[0, 0].set(1.0)
    sign = jnp.where(x[:, :1] >= 0, 1.0, -1.0)
    v = x + sign * e1
    H = jnp.eye(d, dtype=x.dtype)[None] - 2 * v[:, :, None] * v[:, None, :] / jnp.sum(
        v * v, axis=-1)[:, None, None]
    return jnp.swapaxes(H[:, :, 1:], 1, 2)


def tangent_hessian(x: Float[Array, "n d"], beta, weights=None) -> Float[Array, "m m"]:
    """The Riemannian Hessian of `interaction_energy` on the product of spheres, in
    an orthonormal basis of the tangent spaces (`m = n (d − 1)`).

    `Hess E[u, u] = uᵀ ∇²E u − Σ_i ⟨x_i, ∇_i E⟩ ‖u_i‖²` for tangent `u` (the
    Euclidean Hessian by `jax.hessian`, plus the sphere's curvature term).

    **Arguments:**

    - `x`: unit tokens `(n, d)`; take float64.
    - `beta`: the inverse temperature.
    - `weights`: the tokens' masses `(n,)` (default: ones).

    **Returns:**

    The symmetric `(n (d − 1), n (d − 1))` matrix.
    """
    return _tangent_hessian(x, beta, weights)


@jax.jit  # one program per shape (op by op, the Hessian compiled ~50 programs)
def _tangent_hessian(x: Float[Array, "n d"], beta, weights) -> Float[Array, "m m"]:
    n, d = x.shape

    def energy(flat):
        return interaction_energy(flat.reshape(n, d), beta, weights)

    flat = x.reshape(-1)
    hess = jax.hessian(energy)(flat).reshape(n, d, n, d)
    normal = jnp.sum(x * jax.grad(energy)(flat).reshape(n, d), axis=-1)
    B = tangent_basis(x)  # (n, d-1, d)
    H = jnp.einsum("iad,idje,jbe->iajb", B, hess, B, precision="highest")
    H = H - jnp.einsum("i,ab,ij->iajb", normal, jnp.eye(d - 1, dtype=x.dtype),
                       jnp.eye(n, dtype=x.dtype))
    m = n * (d - 1)
    H = H.reshape(m, m)
    return (H + H.T) / 2


def saddle_index(x: Float[Array, "n d"], beta, weights=None, rtol: float = 1e-8) -> int:
    """The number of unstable directions of the flow at `x`: the positive eigenvalues
    of the energy's tangent Hessian (the flow climbs `E`; equivalently the negative
    eigenvalues of `−E`'s), those below `rtol · max |λ|` counted as zero.

    **Arguments:**

    - `x`, `beta`, `weights`: as `tangent_hessian`.
    - `rtol`: the relative size under which an eigenvalue is a zero (a symmetry).

    **Returns:**

    The index, an int.
    """
    lam = np.linalg.eigvalsh(np.asarray(tangent_hessian(x, beta, weights)))
    return int(np.sum(lam > rtol * np.max(np.abs(lam))))


def clusters(x: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """Single-linkage clusters of tokens at distance `eps`, on the host: each
    cluster's unit mean direction `(k, d)` and its number of tokens `(k,)`."""
    x = np.asarray(x, float)
    near = np.linalg.norm(x[:, None] - x[None], axis=-1) < eps
    label = np.arange(len(x))
    for _ in range(len(x)):  # propagate the smallest label along the links
        new = np.min(np.where(near, label[None, :], len(x)), axis=1)
        if np.array_equal(new, label):
            break
        label = new
    ids = np.unique(label)
    means = np.stack([x[label == i].mean(axis=0) for i in ids])
    return means / np.linalg.norm(means, axis=-1, keepdims=True), np.array(
        [np.sum(label == i) for i in ids])


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


def two_cluster_time(x: np.ndarray, beta: float, eps: float) -> tuple[float, float]:
    """The predicted time before the next merger from tokens `x` on a plateau, and the
    angle `δ` of the closest two clusters: those two alone, of `m_a`, `m_b` tokens,
    close at the rate `dδ/dt = −(m_a + m_b)/n · e^{−β(1 − cos δ)} sin δ` (the `usa`
    flow), which takes `n e^{β(1 − cos δ)} / ((m_a + m_b) β sin² δ)` to leading
    order in `β` (Laplace's method): exponentially long in `β`."""
    means, masses = clusters(x, eps)
    if len(means) < 2:
        return math.inf, 0.0
    cos = np.clip(means @ means.T, -1, 1) - 2 * np.eye(len(means))
    a, b = np.unravel_index(np.argmax(cos), cos.shape)
    delta = float(np.arccos(cos[a, b]))
    n, m = int(np.sum(masses)), int(masses[a] + masses[b])
    log_t = beta * (1 - cos[a, b]) + math.log(n / (m * beta * math.sin(delta) ** 2))
    return float(log_t), delta


def _snap(theta: Float[Array, " n"], dist: float) -> Float[Array, " n"]:
    """Each later token within `dist` of an earlier one takes its angle, in order."""
    n = theta.shape[0]

    def pair(p, th):
        j, k = p // n, p % n
        close = (k > j) & (jnp.abs(th[j] - th[k]) < dist)
        return th.at[k].set(jnp.where(close, th[j], th[k]))

    return jax.lax.fori_loop(0, n * n, pair, theta)


def rescaled_euler(theta0: Float[Array, " n"], beta, lr: float, steps: int, *,
                   snap_norm: float = 1e-5, snap_dist: float = 1e-3) -> Float[Array, " steps"]:
    """The paper's scheme on the circle: Euler steps of constant length in its
    rescaled time, `θ ← θ + lr log β · g/‖g‖` with `g_i = (1/n²) Σ_j sin(θ_j − θ_i)
    e^{−2β sin²((θ_i − θ_j)/2)}` (the `usa` flow's angular velocity over `n`), tokens
    closer than `snap_dist` snapped together while `‖g‖` is below `snap_norm`; the
    interaction energy after each step.

    The velocity is taken in angles, not from `dyn.velocity`'s tangent vectors: on
    a plateau `‖g‖` falls to `10⁻¹²` and below while the projection `P_x` of the
    tangent form rounds at `10⁻¹⁶` of the weights, and the direction `g/‖g‖` of this
    scheme amplifies that (measured: the energies part after 2,889 steps of the
    reference setting). In angles a snapped pair adds exactly 0.

    **Arguments:**

    - `theta0`: the initial angles `(n,)`.
    - `beta`: the inverse temperature `β`.
    - `lr`: the step of rescaled time.
    - `steps`: the number of steps.
    - `snap_norm`, `snap_dist`: the snapping rule (the reference script's defaults).

    **Returns:**

    The energy `(1/n²) Σ_ij e^{β(cos(θ_i − θ_j) − 1)}` after each step `(steps,)`.
    """
    n = theta0.shape[0]

    def energy_terms(theta):
        delta = theta[:, None] - theta[None, :]
        return delta, jnp.exp(-2 * beta * jnp.sin(delta / 2) ** 2)

    def step(theta, _):
        delta, w = energy_terms(theta)
        g = jnp.sum(-jnp.sin(delta) * w, axis=1) / n**2
        norm = jnp.sqrt(jnp.sum(g * g))
        theta = theta + lr * jnp.log(beta) * g / norm
        theta = jax.lax.cond(norm < snap_norm, _snap, lambda th, _: th, theta, snap_dist)
        return theta, jnp.sum(energy_terms(theta)[1]) / n**2

    return jax.lax.scan(step, theta0, None, length=steps)[1]
