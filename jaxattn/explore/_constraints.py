"""Constraints of the exploration: kept exactly at every iterate by a map applied
after each optimiser step (a projection, or a retraction onto the manifold)."""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._manifold import project, w_inner
from .._precision import einsum, matmul
from .._programs import kept_jit
from .._schedule import Constant
from .._validate import refuse_first

_NORMS = (None, "spectral", "frobenius")
_FIELDS = ("P", "Q", "K", "U")


def _names(names) -> tuple[str, ...]:
    """A field's names as a tuple: `"P"` is `("P",)`."""
    return (names,) if isinstance(names, str) else tuple(names)


def _positive(b, zero: bool = False) -> bool:
    """Whether `b` is a real finite number `> 0` (`≥ 0` with `zero`)."""
    return (isinstance(b, int | float | np.number) and not isinstance(b, bool)
            and bool(np.isfinite(b)) and (b >= 0 if zero else b > 0))


class Constraints(eqx.Module):
    """What `slow_consensus` keeps fixed or bounded; every iterate satisfies it.

    **Arguments:**

    - `train`: the weights optimised when `target` includes `"weights"`, among
      `"P"`, `"Q"`, `"K"`, `"U"` (default `("P", "U")`; a field the model lacks is
      skipped). Leave `"U"` out to keep `U` fixed (e.g. `U = I`). Every array with
      two or more axes inside a trained field is optimised — the matrix of a
      `ja.Constant` (time-invariant weights stay time-invariant), the stack of a
      `ja.PiecewiseConstant`, the matrix parameters of a `ja.Schedule` (its 0-D
      and 1-D parameters, e.g. frequencies, stay fixed).
    - `norm`, `bound`: `"spectral"` or `"frobenius"` bound every trained matrix
      (the trailing two axes) by `bound`: an exact Euclidean projection (singular
      values clipped at `bound`, or rescaling). `bound` is a number or a dict
      `{field: number}`; each needs the other.
    - `symmetric`: fields kept symmetric, e.g. `("U",)` (projection `(M + Mᵀ)/2`).
    - `top_eigenvector`, `gap`: keep the given unit vector `v` an eigenvector of
      the (one-head, symmetric) `U` with the largest eigenvalue `λ₁ ≥ gap`, ahead of
      the next by at least `gap` (Theorem 5.2's simple positive `λ₁`): in the basis
      `(v, v^⊥)` the cross terms are dropped, `λ₁` is clipped to `≥ gap` and the
      other eigenvalues to `≤ λ₁ − gap` (with `norm="spectral"`, all to
      `[−bound, bound]` as well). An unconstrained `λ₁` went negative: the search
      slowed consensus by leaving the theorem.
    - `sum_gap`: keep the top eigenvalue `λ₁` of `Σ_η U_η` (time-invariant,
      symmetric `U`, any number of heads) simple and positive, `λ₁ − λ₂ ≥ sum_gap`
      and `λ₁ ≥ sum_gap`. Not a projection: a weight step that would break it is
      rejected (the weights stay where they were, the token step is kept), so it
      holds at every iterate but can stall the weights at the boundary.
    - `hemisphere`, `margin`: keep the tokens in the cap `⟨z, x_i⟩_W ≥ margin` of a
      direction `z` (inside the open hemisphere of `z`): a `(d,)` array, `"start"`
      (each restart's own hemisphere certificate at its start) or a function
      `dyn ↦ z` read at every iterate from the current weights (its sign is
      followed continuously). Out-of-cap tokens are moved to the nearest point of
      the cap's boundary (a geodesic projection in the `W`-geometry).
    """

    train: tuple[str, ...] = eqx.field(static=True, default=("P", "U"), converter=_names)
    norm: str | None = eqx.field(static=True, default=None)
    bound: float | dict | None = eqx.field(static=True, default=None)
    symmetric: tuple[str, ...] = eqx.field(static=True, default=(), converter=_names)
    top_eigenvector: Float[Array, " d"] | None = None
    gap: float = eqx.field(static=True, default=0.0)
    sum_gap: float | None = eqx.field(static=True, default=None)
    hemisphere: Array | str | Callable | None = None
    margin: float = eqx.field(static=True, default=0.05)

    def __check_init__(self):
        bounds = self.bound if isinstance(self.bound, dict) else {"": self.bound}
        unknown = [name for name in self.train + self.symmetric
                   + tuple(k for k in bounds if k) if name not in _FIELDS]
        bad = [b for b in bounds.values() if b is not None and not _positive(b)]
        u_bound = (self.bound_of("U") if self.norm == "spectral" and
                   self.top_eigenvector is not None and not bad else None)
        checks = (
            (unknown,
             f"unknown weight {', '.join(map(repr, unknown))}: use names among {_FIELDS}."),
            (self.norm not in _NORMS, f"`norm` must be one of {_NORMS}, got {self.norm!r}."),
            (self.norm is not None and self.bound is None,
             f"norm={self.norm!r} needs a `bound` (a number or a dict)."),
            (self.norm is None and self.bound is not None,
             "`bound` needs a `norm` ('spectral' or 'frobenius'): without one it bounds "
             "nothing."),
            (bad, f"`bound` must be a finite number > 0 (or a dict of them), got {bad[0]!r}."
             if bad else ""),
            (not _positive(self.gap, zero=True),
             f"`gap` must be a finite number ≥ 0, got {self.gap!r}."),
            (u_bound is not None and _positive(self.gap) and self.gap > u_bound,
             f"`gap` {self.gap} cannot be kept with ‖U‖₂ ≤ {u_bound}: λ₁ ≥ gap must lie in "
             f"[−{u_bound}, {u_bound}]; lower `gap` or raise the bound."),
            (isinstance(self.hemisphere, str) and self.hemisphere != "start",
             f"`hemisphere` must be an array, 'start' or a function, got {self.hemisphere!r}."),
            (self.sum_gap is not None and not _positive(self.sum_gap),
             f"`sum_gap` must be a finite number > 0, got {self.sum_gap!r}."),
            (self.hemisphere is not None
             and not (_positive(self.margin, zero=True) and self.margin < 1),
             f"`margin` must be a number in [0, 1), got {self.margin!r}."),
        )
        refuse_first(checks)

    def bound_of(self, name: str) -> float | None:
        if self.norm is None:
            return None
        if isinstance(self.bound, dict):
            return self.bound.get(name)
        return float(self.bound)


# --- weights ------------------------------------------------------------------------


def _is_matrix(a) -> bool:
    """Whether `a` is a trainable matrix (an inexact array of two or more axes)."""
    return eqx.is_inexact_array(a) and a.ndim >= 2


def _trained(dyn, constraints: Constraints):
    """`(name, field)` of each trained field the model has."""
    return [(name, getattr(dyn, name)) for name in constraints.train
            if getattr(dyn, name, None) is not None]


def trainable_filter(dyn, constraints: Constraints):
    """A pytree of bools over `dyn`: the arrays optimised (see `Constraints.train`)."""
    mask = jax.tree.map(lambda _: False, dyn)
    for name, field in _trained(dyn, constraints):
        sub = jax.tree.map(_is_matrix, field)
        mask = eqx.tree_at(lambda m, name=name: getattr(m, name), mask, sub)
    return mask


def _symmetrize(M):
    return (M + jnp.swapaxes(M, -1, -2)) / 2


def _clip_spectral(M, b, symmetric: bool):
    if symmetric:
        lam, V = jnp.linalg.eigh(M)
        return _symmetrize(matmul(V * jnp.clip(lam, -b, b)[..., None, :],
                                  jnp.swapaxes(V, -1, -2)))
    U, s, Vt = jnp.linalg.svd(M, full_matrices=False)
    return matmul(U * jnp.minimum(s, b)[..., None, :], Vt)


def _top_eigen_projection(U, v, gap, b):
    """`U` (1, d, d) symmetric with `v` its top eigenvector, ahead by `gap`."""
    # (d, d-1), orthonormal, ⟂ v: the eigenvectors of I − v vᵀ after its eigenvalue 0 (v)
    basis = jnp.linalg.eigh(jnp.eye(v.shape[0], dtype=v.dtype) - jnp.outer(v, v))[1][:, 1:]
    M = U[0]
    lam = einsum("d,de,e->", v, M, v)
    hi = jnp.inf if b is None else b
    lam = jnp.clip(lam, gap, hi)  # λ₁ ≥ gap: positive, as Theorem 5.2 asks
    C = _symmetrize(einsum("dp,de,eq->pq", basis, M, basis))
    mu, E = jnp.linalg.eigh(C)
    mu = jnp.clip(mu, -hi, lam - gap)
    rest = einsum("dp,pk,qk,eq->de", basis, E * mu[None, :], E, basis)
    out = lam * jnp.outer(v, v) + rest
    return _symmetrize(out)[None]


def _constrain_field(name, field, constraints: Constraints):
    symmetric = name in constraints.symmetric
    b = constraints.bound_of(name)

    def one(a):
        if not _is_matrix(a):
            return a
        if symmetric:
            a = _symmetrize(a)
        if constraints.norm == "spectral" and b is not None:
            a = _clip_spectral(a, b, symmetric)
        elif constraints.norm == "frobenius" and b is not None:
            norm = jnp.linalg.norm(a, axis=(-2, -1), keepdims=True)
            a = a * jnp.minimum(1.0, b / jnp.maximum(norm, 1e-300))
        return a

    field = jax.tree.map(one, field)
    if name == "U" and constraints.top_eigenvector is not None:
        v = jnp.asarray(constraints.top_eigenvector)
        spectral = b if constraints.norm == "spectral" else None
        field = eqx.tree_at(lambda f: f.value, field,
                            _top_eigen_projection(field.value, v, constraints.gap, spectral))
    return field


def constrain_weights(dyn, constraints: Constraints):
    """`dyn` with its trained weights mapped into the constraint set."""
    for name, field in _trained(dyn, constraints):
        new = _constrain_field(name, field, constraints)
        dyn = eqx.tree_at(lambda m, name=name: getattr(m, name), dyn, new)
    return dyn


@kept_jit  # one program at the entry (op by op: ~25)
def constrained_start(dyn, constraints: Constraints):
    """`(constrain_weights(dyn, constraints), its sum_gap_defect)` (`None` without
    `sum_gap`): the search's start."""
    dyn = constrain_weights(dyn, constraints)
    gap = constraints.sum_gap
    return dyn, None if gap is None else sum_gap_defect(dyn, gap)


def weight_refusals(dyn, constraints: Constraints):
    """Why the model cannot honour the constraint requests (or has none of the weights
    to train), as `(bad, message)`, each read once those before it hold; the last:
    the start must satisfy `sum_gap`, which is kept by rejection."""
    v = constraints.top_eigenvector
    fixed_u = isinstance(dyn.U, Constant)
    symmetric_u = "U" in constraints.symmetric
    yield (v is not None and not (fixed_u and dyn.U.value.shape[0] == 1),
           "`top_eigenvector` needs a one-head time-invariant `U` (a ja.Constant of shape "
           "(1, d, d)).")
    yield v is not None and not symmetric_u, "`top_eigenvector` needs `symmetric=('U', ...)`."
    yield (v is not None and (np.shape(v) != (dyn.dim,)
                              or not np.isclose(np.linalg.norm(np.asarray(v)), 1.0)),
           f"`top_eigenvector` must be a unit vector of shape ({dyn.dim},).")
    yield (constraints.sum_gap is not None and not (fixed_u and symmetric_u),
           "`sum_gap` needs a time-invariant `U` (a ja.Constant) kept symmetric "
           "(`symmetric=('U', ...)`).")
    for name in [n for n in constraints.symmetric if n in constraints.train]:
        leaves = [a for a in jax.tree.leaves(getattr(dyn, name, None)) if _is_matrix(a)]
        yield (any(a.shape[-1] != a.shape[-2] for a in leaves),
               f"`{name}` cannot be kept symmetric: its matrices are not square.")
    yield (not jax.tree.leaves(eqx.filter(dyn, trainable_filter(dyn, constraints))),
           f"no weights to train: the model has none of {constraints.train}.")
    if constraints.sum_gap is not None:
        defect = constrained_start(dyn, constraints)[1]
        yield (not float(defect) <= 0,
               f"the model breaks `sum_gap={constraints.sum_gap:g}`: the top eigenvalue of "
               "Σ_η U_η must be simple and positive, ahead by sum_gap; start from such U.")


def weight_violation(dyn, constraints: Constraints) -> Float[Array, ""]:
    """The largest violation of the weight constraints (0 when all hold)."""
    out = jnp.zeros((), jnp.result_type(float))
    for name, field in _trained(dyn, constraints):
        b = constraints.bound_of(name)
        for a in filter(_is_matrix, jax.tree.leaves(field)):
            if name in constraints.symmetric:
                out = jnp.maximum(out, jnp.max(jnp.abs(a - jnp.swapaxes(a, -1, -2))))
            if b is not None:
                ord_ = 2 if constraints.norm == "spectral" else None
                n = jnp.linalg.norm(a, ord=ord_, axis=(-2, -1))
                out = jnp.maximum(out, jnp.max(n - b) / b)
    if constraints.top_eigenvector is not None and "U" in constraints.train:
        v = jnp.asarray(constraints.top_eigenvector)
        M = dyn.U.value[0]
        lam = jnp.linalg.eigvalsh(_symmetrize(M))
        vMv = einsum("d,de,e->", v, M, v)
        out = jnp.maximum(out, jnp.linalg.norm(matmul(M, v) - vMv * v))
        out = jnp.maximum(out, jnp.maximum(lam[-2] + constraints.gap - vMv, 0.0))
    if constraints.sum_gap is not None:
        out = jnp.maximum(out, sum_gap_defect(dyn, constraints.sum_gap))
    return out


def sum_gap_defect(dyn, gap: float) -> Float[Array, ""]:
    """`max(gap − (λ₁ − λ₂), gap − λ₁)` for the eigenvalues of `Σ_η U_η`: ≤ 0
    exactly when its top eigenvalue is simple (by `gap`) and positive."""
    lam = jnp.linalg.eigvalsh(_symmetrize(jnp.sum(dyn.U.value, axis=0)))
    return jnp.maximum(gap - (lam[-1] - lam[-2]), gap - lam[-1])


# --- tokens -----------------------------------------------------------------------


def cap_projection(x: Float[Array, "n d"], z: Float[Array, " d"], margin, W):
    """Tokens on `E_W` moved into the cap `⟨z, x⟩_W ≥ margin` (`z ∈ E_W`): those
    outside go to the nearest point of the cap's boundary along their geodesic
    through `z`."""
    a = w_inner(x, z[None, :], W)
    rest = x - a[:, None] * z[None, :]
    rest_norm = jnp.sqrt(jnp.maximum(w_inner(rest, rest, W), 1e-300))
    # A token exactly at −z has no nearest boundary point; any will do.
    fallback = _any_orthogonal(z, W)
    direction = jnp.where(rest_norm[:, None] > 1e-12, rest / rest_norm[:, None], fallback)
    moved = margin * z[None, :] + jnp.sqrt(1 - margin**2) * direction
    return jnp.where((a < margin)[:, None], moved, x)


def _any_orthogonal(z, W):
    d = z.shape[0]
    e = jnp.eye(d, dtype=z.dtype)[jnp.argmin(jnp.abs(z))]
    r = e - w_inner(e, z, W) * z
    return r / jnp.sqrt(w_inner(r, r, W))


def retract_tokens(x, z, margin, W):
    """The token iterate put back on `E_W` (and into the cap of `z` if given)."""
    x = project(x, W)
    if z is not None:
        x = cap_projection(x, z, margin, W)
    return x


def token_violation(x, z, margin, W) -> Float[Array, ""]:
    """`max_i | |x_i|_W − 1 |`, and the depth outside the cap `⟨z, x⟩_W ≥ margin`."""
    drift = jnp.max(jnp.abs(jnp.sqrt(w_inner(x, x, W)) - 1))
    if z is None:
        return drift
    return jnp.maximum(drift, jnp.max(jnp.maximum(margin - w_inner(x, z[None], W), 0.0)))
