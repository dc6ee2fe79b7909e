"""The multi-agent discrete-time Oja system and the single-head self-attention map
(paper 004 App. D, eqs. 8–9): consensus and bipartite-consensus equilibria along
eigenvectors, their Jacobian on the tangent space, and Theorem 3.

Both maps are the core simulator's layer with `W = I`:

- Oja (eq. 9): `x_i ↦ N(x_i + τ U x̄)`, uniform attention, i.e. `P = 0`;
- single head (eq. 8): `x_i ↦ N(x_i + τ Σ_j α_ij U x_j)`,
  `α_ij = softmax_j(β x_iᵀ P x_j)`.

A bipartite point puts `m` tokens at `v` and `n − m` at `−v` (`m = n`: consensus),
`v` a unit eigenvector of the symmetric `U` (`U v = μ v`).

Closed form (a reconstruction of Lemma 14 / Theorem 3, whose formulas were lost
from our copy of the paper; `tests/spectral/test_spectral_oja.py` checks it against
`jax.jacfwd`). With `q = β vᵀ P v`, the attention at the point takes four values,
`a_AA = e^q / D_A`, `a_AB = e^{−q} / D_A`, `a_BA = e^{−q} / D_B`, `a_BB = e^q / D_B`
(`D_A = m e^q + (n−m) e^{−q}`, `D_B = m e^{−q} + (n−m) e^q`). Every token moves
along `v`: `x_i + τ(...) = (s_i + τ μ c_i) v` with `c_A = m a_AA − (n−m) a_AB`,
`c_B = m a_BA − (n−m) a_BB`; the point is an equilibrium iff `r_A = 1 + τμ c_A > 0`
and `r_B = 1 − τμ c_B > 0`. The variation of the attention moves tokens only
along `v` and is removed by the normalisation, so on the tangent space the
Jacobian splits over the other eigenvectors `e_k` (eigenvalue `λ_k`) into
`diag(1/r_i)(I + τλ_k A)` with `A` the `n × n` attention matrix. Its eigenvalues:

1. `1/r_A` (multiplicity `(m−1)(d−1)`) and `1/r_B` (`(n−m−1)(d−1)`), from
   perturbations summing to zero within each group;
2. for each `k`, the two eigenvalues of
   `M_k = diag(1/r_A, 1/r_B) (I + τλ_k G)`, `G = [[m a_AA, (n−m) a_AB],
   [m a_BA, (n−m) a_BB]]` (one, `(1 + τλ_k)/r_A`, at consensus).

Stable iff all lie in the unit disk: Theorem 3's conditions `r_A > 1`, `r_B > 1`
and, by Schur–Cohn, `|det M_k| < 1`, `|tr M_k| < 1 + det M_k` for every `k`.
At consensus this is Lemma 4: `μ > 0` and `|1 + τλ_k| < 1 + τμ` for all `k`.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from .._dynamics import SelfAttentionDynamics
from .._manifold import project
from .._precision import einsum
from .._programs import kept_jit
from .._validate import check_count, check_scalar, check_square, is_concrete, refuse_first
from ..metrics import tangent_basis
from ._spectrum import layer_matrix


def oja_system(U: Float[Array, "d d"]) -> SelfAttentionDynamics:
    """The multi-agent discrete-time Oja system (paper 004 eq. 9) as a one-head
    `ja.SelfAttentionDynamics` with `P = 0` (uniform attention)."""
    (U,) = _one_head(U)
    return SelfAttentionDynamics(np.zeros_like(U) if isinstance(U, np.ndarray)
                                 else jnp.zeros_like(U), U, block_size=0)


def single_head(U: Float[Array, "d d"], P: Float[Array, "d d"], *, beta: float = 1.0):
    """The single-head self-attention map (paper 004 eq. 8) as a one-head
    `ja.SelfAttentionDynamics`."""
    U, P = _one_head(U, P)
    return SelfAttentionDynamics(P, U, beta=beta, block_size=0)


# Both maps take the dense `(1, n, n)` attention weights at every `n` (`block_size=0`):
# `tangent_jacobian`'s `jax.jacfwd` cannot go through the blocked path's custom VJP.


def _one_head(*weights):
    """`(d, d)` weights as one head `(1, d, d)` in the default float dtype: NumPy's when
    all are concrete (eager JAX would compile a program per operation), JAX's when one
    is traced."""
    xp = np if all(map(is_concrete, weights)) else jnp
    refuse_first([(jnp.iscomplexobj(w), "the weights must be real matrices (d, d), got a "
                   "complex one (its imaginary part was dropped).") for w in weights])
    return [xp.asarray(w, dtype=jnp.result_type(float))[None] for w in weights]


def bipartite_point(v: Float[Array, " d"], n: int, m) -> Float[Array, "n d"]:
    """The bipartite point: `m` tokens at the unit vector `v`, then `n − m` at `−v`
    (`m = n`: consensus).

    **Arguments:**

    - `v`: the direction `(d,)` (normalised here).
    - `n`: the number of tokens (a Python int); `m`: how many sit at `+v` (may be
      traced, e.g. under `jax.vmap`).

    **Returns:**

    The tokens `(n, d)`.
    """
    n, v = check_count(n, "n", 1), jnp.asarray(v)
    refuse_first([
        (v.ndim != 1, f"bipartite_point: `v` must be one direction (d,), got shape {v.shape}."),
        (is_concrete(m) and not (0 <= m <= n and float(m).is_integer()),
         f"bipartite_point: `m` counts the tokens at +v: it must lie in [0, n] = [0, {n}], "
         f"a whole number, got {m}."),
        (is_concrete(v) and not (np.isfinite(v).all() and np.any(np.asarray(v) != 0)),
         "bipartite_point: `v` must be a finite nonzero direction."),
    ])
    signs = jnp.where(jnp.arange(n) < m, 1.0, -1.0).astype(v.dtype)
    return signs[:, None] * (v / jnp.linalg.norm(v))[None, :]


def tangent_jacobian(
    dyn: SelfAttentionDynamics, x: Float[Array, "n d"], tau: float = 1.0
) -> Float[Array, "n(d-1) n(d-1)"]:
    """The Jacobian of one layer at an equilibrium `x`, on the tangent space.

    Traceable and differentiable in the weights of `dyn` (`ja.explore`
    minimises a bound on its spectral radius).

    **Arguments:**

    - `dyn`: the map (time-invariant weights; read at `t = 0`).
    - `x`: unit tokens `(n, d)` with `layer(x) = x` (so the layer maps the tangent
      space of `(S^{d−1})ⁿ` at `x` to itself).
    - `tau`: the step `τ`.

    **Returns:**

    `Bᵀ J B`, `J = jax.jacfwd(layer)(x)` (the extrinsic `nd × nd` Jacobian, paper
    004 Remark 2) and `B` block-diagonal orthonormal bases of the `x_i^⊥`: the
    intrinsic Jacobian `(n(d−1), n(d−1))` whose spectral radius decides local
    stability.
    """
    n, d = x.shape
    J = jax.jacfwd(lambda y: dyn.layer(0.0, y, tau))(x)  # (n, d, n, d)
    B = tangent_basis(x)  # (n, d-1, d)
    # Pairwise: `_precision.einsum` states the precision of each two-operand product.
    JB = einsum("iajb,jqb->iajq", J, B, precision=dyn.precision)
    JT = einsum("ipa,iajq->ipjq", B, JB, precision=dyn.precision)
    return JT.reshape(n * (d - 1), n * (d - 1))


def spectral_radius(M: Float[Array, "k k"]) -> Float[Array, ""]:
    """The spectral radius `max |eig(M)|`, traceable (`jnp.linalg.eigvals`, which
    runs on the CPU).

    **Arguments:**

    - `M`: a square matrix `(k, k)`, e.g. a `tangent_jacobian`.

    **Returns:**

    A 0-d array; `float(spectral_radius(M))` for a host number.
    """
    return jnp.max(jnp.abs(jnp.linalg.eigvals(check_square(M, "M", "spectral_radius"))))


def fixed_tolerance(dtype) -> float:
    """The residual `max_i |layer(x)_i − x_i|` below which a point is fixed: 1000
    rounding units of `dtype` (2e-13 in float64, 1e-4 in float32, where one layer's
    rounding alone leaves 1e-7); a point that is not fixed moves by order one."""
    return 1000 * float(jnp.finfo(dtype).eps)


class Equilibria(eqx.Module):
    """Consensus and bipartite-consensus points of a map along the eigenvectors of
    its symmetric `Ω`, with their local stability.

    Entry `e` puts `m[e]` tokens at `v = eigenvector[e]` and the rest at `−v`
    (`m = n`: consensus); only `m ≥ n/2` is listed (the map commutes with
    `x ↦ −x`, so `m` and `n − m` are the same point up to that symmetry).

    - `points (E, n, d)`, `index (E,)` (eigenvector, by decreasing eigenvalue),
      `eigenvalue (E,)`, `m (E,)`.
    - `residual (E,)`: `max_i |layer(x)_i − x_i|`; an `m` whose tokens would
      overshoot to `−v` (`r ≤ 0`) is not a fixed point and shows a residual ≈ 2.
      `is_fixed`: below `fixed_tolerance` of its dtype.
    - `radius (E,)`: spectral radius of `tangent_jacobian` (`jax.jacfwd`).
    - `predicted (E,)`: the closed-form radius of the module docstring
      (Theorem 3 / Lemma 4), NaN where it does not apply (several heads with
      non-zero `P`).
    - `theorem3 (E,)`: Theorem 3's sufficient-and-necessary conditions (`r > 1`
      for both groups and Schur–Cohn for every `M_k`), False where not fixed.
    """

    points: Float[Array, "E n d"]
    index: Int[Array, " E"]
    eigenvalue: Float[Array, " E"]
    m: Int[Array, " E"]
    residual: Float[Array, " E"]
    radius: Float[Array, " E"]
    predicted: Float[Array, " E"]
    theorem3: Bool[Array, " E"]

    @property
    def is_fixed(self) -> Bool[Array, " E"]:
        """Whether the residual is rounding: below `fixed_tolerance` of its dtype."""
        return self.residual < fixed_tolerance(self.residual.dtype)

    @property
    def is_consensus(self) -> Bool[Array, " E"]:
        return self.m == self.points.shape[1]

    def stability(self, tol: float = 1e-9) -> Int[Array, " E"]:
        """`+1` stable (`radius < 1 − tol`), `−1` unstable (`> 1 + tol`), `0`
        undecided at first order; `−2` for entries that are not fixed points."""
        s = jnp.where(self.radius < 1 - tol, 1, jnp.where(self.radius > 1 + tol, -1, 0))
        return jnp.where(self.is_fixed, s, -2)


def equilibria(dyn: SelfAttentionDynamics, n: int, *, tau=1.0) -> Equilibria:
    """Enumerate consensus and bipartite equilibria along eigenvectors and classify
    them with `jax.jacfwd` (paper 004 Lemmas 1, 8; Theorems 2, 3).

    **Arguments:**

    - `dyn`: a time-invariant map with symmetric `Ω`, full attention, the papers'
      normalisation (`norm="post"`) and the Euclidean metric (`W = I`): the Oja
      system (`oja_system`), the single-head map (`single_head`) or any
      multi-head `ja.SelfAttentionDynamics` (then points along eigenvectors of
      `Ω` need not be fixed; `residual` says which are).
    - `n`: number of tokens; `tau`: the step `τ`.

    **Returns:**

    `Equilibria` with `d (n − ⌈n/2⌉ + 1)` entries.
    """
    refuse_first([(not isinstance(dyn, SelfAttentionDynamics), TypeError, "equilibria: `dyn` "
                   "must be a ja.SelfAttentionDynamics (e.g. ja.spectral.oja_system(U)), got "
                   f"{type(dyn).__name__}."),
                  (getattr(dyn, "causal", False), ValueError,
                   "equilibria enumerates full-attention maps; got causal=True.")])
    d = dyn.dim
    refuse_first([
        (not dyn.norm.papers_default, "equilibria's closed form is the papers' step "
         f"x ↦ N(x + τ v) (norm='post'); got norm={dyn.norm.name!r}."),
        (dyn.W is not None and not np.array_equal(np.asarray(dyn.W), np.eye(d)),
         "equilibria's closed form is on the unit sphere (W = I); got another metric W: "
         "pass W=None."),
    ])
    tau = check_scalar(tau, "tau", positive=True)
    eq, Omega = _enumerate(dyn, check_count(n, "n", 1), tau)  # one program; Ω checked on its return
    if not np.allclose(np.asarray(Omega), np.asarray(Omega).T, rtol=1e-10, atol=1e-12):
        raise ValueError("equilibria needs a symmetric layer matrix Ω = Σ_η U_η (paper 004 "
                         "Assumption 1); symmetrise U with (U + Uᵀ)/2.")
    return eq


@kept_jit
def _enumerate(dyn, n, tau) -> tuple[Equilibria, Float[Array, "d d"]]:
    """`equilibria`'s entries and the layer matrix `Ω` they are read from."""
    Omega = layer_matrix(dyn)
    lam, vecs = jnp.linalg.eigh(Omega)
    lam, vecs = lam[::-1], vecs[:, ::-1].T
    d = lam.shape[0]
    ms = np.arange((n + 1) // 2, n + 1)
    idx = np.repeat(np.arange(d), len(ms))
    mm = np.tile(ms, d)
    points = jax.vmap(lambda v, m: bipartite_point(v, n, m))(vecs[idx], jnp.asarray(mm))
    return _classify(dyn, points, jnp.asarray(idx), lam, jnp.asarray(mm), tau), Omega


def _classify(dyn, points, idx, lam, mm, tau) -> Equilibria:
    step = jax.vmap(lambda x: dyn.layer(0.0, x, tau))
    residual = jnp.max(jnp.abs(step(points) - points), axis=(1, 2))
    radius = jax.vmap(lambda x: spectral_radius(tangent_jacobian(dyn, x, tau)))(points)
    P = dyn.query_key(jnp.zeros((), points.dtype))
    x = points[:, 0]
    Px = einsum("hdf,ef->ehd", P, x, precision=dyn.precision)
    q = dyn.beta * einsum("ed,ehd->eh", x, Px, precision=dyn.precision)
    applies = (P.shape[0] == 1) | jnp.all(P == 0)
    pred, cond = jax.vmap(
        lambda k, m, qe: bipartite_closed_form(lam, k, m, points.shape[1], qe, tau)
    )(idx, mm, q[:, 0])
    return Equilibria(
        points=points, index=idx, eigenvalue=lam[idx], m=mm, residual=residual,
        radius=radius, predicted=jnp.where(applies, pred, jnp.nan),
        theorem3=cond & applies & (residual < fixed_tolerance(residual.dtype)),
    )


def bipartite_closed_form(lam, k, m, n, q, tau):
    """The closed-form tangent spectral radius and Theorem 3's conditions at the
    point (`m` tokens at `e_k`, `n − m` at `−e_k`); see the module docstring.

    **Arguments:**

    - `lam`: the eigenvalues of the symmetric `U` `(d,)`; `k`: the index of `e_k`.
    - `m`, `n`: tokens at `e_k` and in all; `q`: the score `β e_kᵀ P e_k`
      (0 for the Oja system); `tau`: the step.

    **Returns:**

    `(radius, stable)`: the spectral radius of the tangent Jacobian, and whether
    the point is a fixed point satisfying Theorem 3's conditions.
    """
    dim = jnp.shape(lam)[0]
    known = all(map(is_concrete, (m, n, tau)))
    refuse_first([(is_concrete(k) and not (float(k).is_integer() and 0 <= k < dim),
                   f"bipartite_closed_form: `k` indexes the {dim} eigenvalues: it must be a "
                   f"whole number in [0, {dim}), got {k}."),
                  # m > n gave radius 0.43 and "stable"; τ < 0 a silent NaN
                  (known and not 0 <= m <= n, f"bipartite_closed_form: `m` tokens of `n` sit "
                   f"at e_k: it must lie in 0..n, got m = {m}, n = {n}."),
                  (known and not tau > 0, f"bipartite_closed_form: `tau` must be > 0, got "
                   f"{tau!r}.")])
    mu = lam[k]
    eq, emq = jnp.exp(q), jnp.exp(-q)
    mb = n - m
    DA, DB = m * eq + mb * emq, m * emq + mb * eq
    G = jnp.array([[m * eq / DA, mb * emq / DA], [m * emq / DB, mb * eq / DB]])
    cA, cB = G[0, 0] - G[0, 1], G[1, 0] - G[1, 1]
    rA, rB = 1 + tau * mu * cA, 1 - tau * mu * cB
    has_b = mb > 0
    # Class 1: within-group perturbations (present when a group has ≥ 2 tokens).
    within = jnp.maximum(jnp.where(m >= 2, 1 / jnp.abs(rA), 0.0),
                         jnp.where(mb >= 2, 1 / jnp.abs(rB), 0.0))
    # Class 2: the group-constant modes along every other eigenvector.
    others = jnp.arange(lam.shape[0]) != k
    R = jnp.where(has_b, jnp.array([1 / rA, 1 / rB]), jnp.array([1 / rA, 0.0]))
    Gc = jnp.where(has_b, G, jnp.array([[1.0, 0.0], [0.0, 0.0]]))

    def block(lk):
        return R[:, None] * (jnp.eye(2) + tau * lk * Gc)

    Ms = jax.vmap(block)(lam)  # (d, 2, 2)
    ev = jnp.max(jnp.abs(jax.vmap(jnp.linalg.eigvals)(Ms)), axis=-1)
    radius = jnp.maximum(within, jnp.max(jnp.where(others, ev, 0.0)))
    det, tr = jnp.linalg.det(Ms), jnp.trace(Ms, axis1=-2, axis2=-1)
    schur = jnp.where(has_b, (jnp.abs(det) < 1) & (jnp.abs(tr) < 1 + det), jnp.abs(tr) < 1)
    fixed = (rA > 0) & jnp.where(has_b, rB > 0, True)
    groups = (jnp.where(m >= 2, rA > 1, True)) & (jnp.where(mb >= 2, rB > 1, True))
    return radius, fixed & groups & jnp.all(jnp.where(others, schur, True))


def perturbation_growth(
    dyn: SelfAttentionDynamics,
    points: Float[Array, "E n d"],
    key: PRNGKeyArray,
    *,
    eps: float = 1e-6,
    layers: int = 300,
    tau=1.0,
) -> Float[Array, " E"]:
    """Direct simulation: move each point by a random tangent perturbation of size
    `eps > 0`, run `layers ≥ 1` layers, and return the final distance over the initial
    one (`max_i |x_i − x*_i|`). Below 1: the perturbation was absorbed."""
    eps = check_scalar(eps, "eps", positive=True)
    refuse_first([(jnp.ndim(points) != 3, "perturbation_growth takes equilibria (E, n, d), "
                   f"got shape {jnp.shape(points)}: add a leading axis for one (points[None]).")])
    return _growth(dyn, points, key, eps, check_count(layers, "layers", 1), tau)


@kept_jit  # `layers`, a Python int, is static (the scan's length)
def _growth(dyn, points, key, eps, layers: int, tau):
    z = jax.random.normal(key, points.shape, points.dtype)
    z = z - jnp.sum(z * points, -1, keepdims=True) * points
    z = eps * z / jnp.max(jnp.linalg.norm(z, axis=-1), axis=-1)[:, None, None]
    x0 = project(points + z, None)

    def run(x):
        return jax.lax.scan(lambda y, _: (dyn.layer(0.0, y, tau), None), x, None,
                            length=layers)[0]

    def dist(x, p):
        return jnp.max(jnp.linalg.norm(x - p, axis=-1))

    return jax.vmap(dist)(jax.vmap(run)(x0), points) / jax.vmap(dist)(x0, points)
