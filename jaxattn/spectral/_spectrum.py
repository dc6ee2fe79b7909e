"""Layer matrices and their spectra, and how tokens align with their eigenvectors
(paper 004 §2, eqs. 4–7).

Convention: `Ω = Σ_η U_η` is paper 004's (column-token) matrix, acting on token
vectors; its *right* eigenvectors are the directions tokens align with, and a
row-stored batch `x (n, d)` is mapped as `x Ωᵀ` (docs/usage/spectral.md).

Precision: the dynamics' own `precision` where a `SelfAttentionDynamics` is at hand
(its layers, the tangent Jacobian), true float32 elsewhere (alignment, bases)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Complex, Float, Int

from .._dynamics import SelfAttentionDynamics
from .._precision import matmul
from .._programs import kept_jit
from .._validate import (
    check_rows_now,
    check_scalar,
    check_square,
    is_concrete,
    raise_unless,
    refuse_first,
    surface_errors,
)
from ..models import AbstractTransformer, Attention, attention_weights, value_output


def layer_matrix(model_or_dyn, layer: int = 0, *, tau: float = 1.0) -> Float[Array, "d d"]:
    """The layer matrix `Ω_ℓ = Σ_η U_η` of one layer (paper 004 §2).

    **Arguments:**

    - `model_or_dyn`: a model from `ja.models.load`/`init`, its attention module
      (`ja.models.Attention`), or a `ja.SelfAttentionDynamics`.
    - `layer`: the layer `ℓ` (negative counts from the end for models). For a
      `SelfAttentionDynamics` the value matrices are read at `t = ℓ τ`, the time
      at which `ja.run_layers` applies layer `ℓ`.
    - `tau`: the step `τ` of that reading (dynamics only; default 1).

    **Returns:**

    `Ω_ℓ`, `(d, d)`, acting on token vectors: with uniform attention the layer
    maps `x_i ↦ N(x_i + τ Ω x̄)`.
    """
    if isinstance(model_or_dyn, SelfAttentionDynamics):
        t = jnp.asarray(layer * tau, dtype=jnp.result_type(float))
        return jnp.sum(model_or_dyn.U(t), axis=0)
    if isinstance(model_or_dyn, AbstractTransformer):
        model_or_dyn = attention_weights(model_or_dyn, layer)
    if isinstance(model_or_dyn, Attention):
        return jnp.sum(value_output(model_or_dyn), axis=0)
    raise TypeError(
        "layer_matrix needs a model (ja.models.load/init), a ja.models.Attention or a "
        f"ja.SelfAttentionDynamics, got {type(model_or_dyn).__name__}."
    )


class Spectrum(eqx.Module):
    """The eigen-decomposition of a layer matrix, ordered for the power method.

    Eigenvalues are ordered by the `key`: `|λ|` (paper 004, the default) or, when
    `spectrum(Ω, tau=τ)` was asked for, `|1 + τλ|`, the modulus of the eigenvalues
    of the uniform-attention step `I + τΩ` (what the layer actually iterates once
    the skip connection is kept). Conjugate pairs come with `Im λ > 0` first.

    - `eigenvalues`: `(d,)` complex, ordered; `eigenvectors`: `(d, d)` complex,
      column `k` the unit right eigenvector of `eigenvalues[k]`.
    - `key`: `(d,)` the ordering key of each eigenvalue.
    - `gap`: `key₁ − key₂` (`|λ₁| − |λ₂|` by default; 0 when `λ₁` is complex).
    - `pair_gap`: `key₁ − key_k` for the first `k` that is not `λ₁` or its
      conjugate: the dominance margin that decides cases 1 and 2.
    - `case`: paper 004 §2.1: 1 real strictly dominant, 2 complex strictly
      dominant, 3 no strict dominance (relative margin below `rtol`).
    - `principal`: `(d, 2)` orthonormal basis of the real subspace to measure
      alignment with: `[v₁, 0]` for real `λ₁`, `span(Re v₁, Im v₁)` otherwise.
    - `plane`: `(d, 2)` orthonormal basis of `span(v₁, v₂)` for real `λ₁, λ₂`
      (the 2-D subspace of case 3); equal to `principal` for complex `λ₁`; for real
      `λ₁` and complex `λ₂`, `span(v₁, a)` with `a` the major axis of `v₂`'s real orbit
      `Re(e^{iθ} v₂)` (whatever phase the eigensolver gives `v₂`; the invariant
      subspace is then 3-D).
    - `correlation`: `|v₁ᴴ v₂|`, the correlation between `v₁` and `v₂`.
    """

    eigenvalues: Complex[Array, " d"]
    eigenvectors: Complex[Array, "d d"]
    key: Float[Array, " d"]
    gap: Float[Array, ""]
    pair_gap: Float[Array, ""]
    case: Int[Array, ""]
    principal: Float[Array, "d 2"]
    plane: Float[Array, "d 2"]
    correlation: Float[Array, ""]

    @property
    def v1(self) -> Complex[Array, " d"]:
        """The principal right eigenvector `v₁`."""
        return self.eigenvectors[:, 0]

    @property
    def is_real(self) -> Bool[Array, " d"]:
        """Which eigenvalues are real."""
        return jnp.imag(self.eigenvalues) == 0


def _fix_sign(vecs: Complex[Array, "d d"]) -> Complex[Array, "d d"]:
    """Make each eigenvector's largest entry real positive (a deterministic phase)."""
    idx = jnp.argmax(jnp.abs(vecs), axis=0)
    top = jnp.take_along_axis(vecs, idx[None], axis=0)
    return vecs * (jnp.abs(top) / top)


def orthonormal_pair(a: Float[Array, " d"], b: Float[Array, " d"]) -> Float[Array, "d 2"]:
    """Gram–Schmidt on `(a, b)`; a zero (or parallel) `b` gives a zero second column."""
    q1 = a / jnp.linalg.norm(a)
    r = b - matmul(q1, b) * q1
    nr = jnp.linalg.norm(r)
    big = nr > 1e-12 * jnp.maximum(jnp.linalg.norm(b), 1e-300)
    q2 = jnp.where(big, r / jnp.where(big, nr, 1.0), 0.0)
    return jnp.stack([q1, q2], axis=-1)


def eigen_bases(spec: Spectrum) -> Float[Array, "d d 2"]:
    """For every eigenvector `v_k` the real subspace its alignment is measured in:
    `[v_k, 0]` when real, an orthonormal basis of `span(Re v_k, Im v_k)` otherwise.

    **Returns:**

    `(K, d, 2)` with `K = d` eigenvectors, in the order of `spec.eigenvalues`.
    """
    refuse_first([(not isinstance(spec, Spectrum), TypeError, "eigen_bases takes a Spectrum "
                   f"(ja.spectral.spectrum(Ω)), got {type(spec).__name__}.")])
    vecs = spec.eigenvectors.T
    return jax.vmap(orthonormal_pair)(jnp.real(vecs), jnp.imag(vecs))


@surface_errors
def spectrum(Omega: Float[Array, "d d"], *, tau=None, rtol: float = 1e-6) -> Spectrum:
    """Eigenvalues, principal eigenpair, gap and principal subspace of `Ω`.

    **Arguments:**

    - `Omega`: a real `(d, d)` layer matrix (`layer_matrix`).
    - `tau`: `None` (default) orders eigenvalues by `|λ|` as paper 004 does; a
      step `τ` orders them by `|1 + τλ|` instead (the power method that a layer
      with its skip connection performs; the two orders differ when an eigenvalue
      of large modulus has a negative real part).
    - `rtol`: relative margin below which dominance counts as not strict (case 3).

    **Returns:**

    A `Spectrum`. Runs on the CPU (`jnp.linalg.eig`). A NaN or inf entry in `Ω`
    raises a `ja.SimulationError` (one line: the message and the fix).
    """
    Omega = check_square(Omega, "Omega", "spectrum")
    refuse_first([(jnp.iscomplexobj(Omega), "spectrum: `Omega` must be a real layer matrix, got "
                   f"{Omega.dtype}."),
                  (Omega.shape[0] == 0, "spectrum: `Omega` is empty (0, 0); pass a layer "
                   "matrix of at least one dimension.")])
    tau = None if tau is None else check_scalar(tau, "tau", positive=True)
    rtol = check_scalar(rtol, "rtol", nonnegative=True)
    # A NaN/inf Ω has no spectrum: without this it would read as "case 3". Checked on
    # the host where Ω is concrete, so that the program holds no callback (issue 42).
    concrete = is_concrete(Omega)
    if concrete:
        raise_unless(np.isfinite(np.asarray(Omega)), _NONFINITE)
    return _spectrum(Omega, tau, rtol, not concrete)


_NONFINITE = "spectrum: `Omega` contains NaN or inf; pass a finite layer matrix."


@kept_jit
def _spectrum(Omega, tau, rtol, check: bool) -> Spectrum:
    if check:
        Omega = eqx.error_if(Omega, ~jnp.all(jnp.isfinite(Omega)), _NONFINITE)
    lam, vecs = jnp.linalg.eig(Omega)
    key = jnp.abs(lam) if tau is None else jnp.abs(1 + tau * lam)
    # By the key; its ties (conjugate pairs are exact ties in LAPACK's output): Im λ > 0 first.
    order = jnp.lexsort((-jnp.imag(lam), -key))
    lam, vecs, key = lam[order], _fix_sign(vecs[:, order]), key[order]
    return _summarise(lam, vecs, key, rtol)


def _summarise(lam, vecs, key, rtol) -> Spectrum:
    d = lam.shape[0]
    complex1 = jnp.imag(lam[0]) != 0
    nxt = jnp.where(complex1, 2, 1)
    key_next = jnp.where(nxt < d, key[jnp.minimum(nxt, d - 1)], 0.0)
    pair_gap = key[0] - key_next
    strict = pair_gap > rtol * key[0]
    case = jnp.where(strict, jnp.where(complex1, 2, 1), 3)
    v1 = vecs[:, 0]
    principal = orthonormal_pair(jnp.real(v1), jnp.imag(v1))
    v2 = vecs[:, 1] if d > 1 else v1
    # a complex λ₂ (real λ₁): Re v₂ depends on the phase eig gives v₂ (planes 90° apart);
    # its major axis, Re(e^{−iθ} v₂) at θ = ½ arg(v₂ᵀv₂), does not
    v2 = v2 * jnp.exp(-0.5j * jnp.angle(jnp.sum(v2 * v2)))
    plane = jnp.where(complex1, principal, orthonormal_pair(jnp.real(v1), jnp.real(v2)))
    return Spectrum(
        eigenvalues=lam, eigenvectors=vecs, key=key,
        gap=key[0] - (key[1] if d > 1 else 0.0), pair_gap=pair_gap, case=case,
        principal=principal, plane=plane,
        correlation=jnp.abs(matmul(jnp.conj(v1), v2)),
    )


# --- alignment (paper 004 eqs. 4–7) ------------------------------------------------


def cosines(x: Float[Array, "n d"], basis: Float[Array, "d k"] | Float[Array, " d"]):
    """Per-token alignment with a direction or a subspace.

    **Arguments:**

    - `x`: tokens `(n, d)` (need not be normalised).
    - `basis`: a direction `(d,)`, or an orthonormal basis `(d, k)` of a subspace
      (zero columns allowed, e.g. `Spectrum.principal` for a real `λ₁`). A concrete
      basis whose columns are not orthonormal (`BᵀB` off a 0/1 diagonal by more than
      `√eps` of its dtype) is refused: its "projection" could exceed 1.

    **Returns:**

    `(n,)`: `|cos(x_i, v)|` for a direction; for a subspace the norm of the
    projection of `x_i / |x_i|` on it (paper 004 §2.1.2).
    """
    x, basis = jnp.asarray(x), jnp.asarray(basis)
    refuse_first([(jnp.iscomplexobj(x) or jnp.iscomplexobj(basis),
                   "cosines takes real tokens and a real basis: for a complex v₁ use "
                   "Spectrum.principal (the plane span(Re v₁, Im v₁))."),
                  (basis.ndim not in (1, 2) or basis.shape[0] != x.shape[-1],
                   f"cosines: `basis` must be (d,) or (d, k) with d = {x.shape[-1]} (the "
                   f"tokens' dimension), got shape {basis.shape}.")])
    check_rows_now(x, "x", "cosines")  # concrete: NaN or a zero token (no direction)
    if basis.ndim == 1:
        check_rows_now(basis[None], "basis", "cosines")
    elif is_concrete(basis):
        B = np.asarray(basis, jnp.result_type(basis.dtype, float))
        G = B.T @ B  # on the host: no program for a check
        ideal = np.diag(np.round(np.diag(G)).clip(0, 1))  # unit columns, or zero ones
        refuse_first([(not np.all(np.abs(G - ideal) <= np.sqrt(np.finfo(B.dtype).eps)),
                       "cosines: the columns of `basis` must be orthonormal (or zero); "
                       "orthonormalise them first (numpy.linalg.qr).")])
    xn = x / jnp.linalg.norm(x, axis=-1, keepdims=True)
    if basis.ndim == 1:
        return jnp.abs(matmul(xn, basis / jnp.linalg.norm(basis)))
    return jnp.linalg.norm(matmul(xn, basis), axis=-1)


def alignment(x: Float[Array, "n d"], basis) -> Float[Array, ""]:
    """`c(v) = mean_i |cos(x_i, v)|` (paper 004 eq. 6), or with a subspace basis the
    mean norm of the projections (see `cosines`)."""
    return jnp.mean(cosines(x, basis))


def increment(
    x_before: Float[Array, "n d"], x_after: Float[Array, "n d"], basis
) -> tuple[Float[Array, ""], Float[Array, ""]]:
    """The increment `Δ = mean_i (c_i(after) − c_i(before))` and its probability
    `p = mean_i 1[c_i(after) > c_i(before)]` through one layer (paper 004 eqs. 4–5).

    **Returns:**

    `(Δ, p)`.
    """
    _same_tokens("increment", x_before, x_after)
    diff = cosines(x_after, basis) - cosines(x_before, basis)
    return jnp.mean(diff), jnp.mean((diff > 0).astype(diff.dtype))


def _same_tokens(where: str, x_before, x_after) -> None:
    refuse_first([(np.shape(x_before) != np.shape(x_after), f"{where}: `x_before` and "
                   f"`x_after` must be the same tokens before and after a layer, of one shape; "
                   f"got {np.shape(x_before)} and {np.shape(x_after)}.")])


class LayerAlignment(eqx.Module):
    """Alignment statistics of one layer `ℓ` over many tokens (paper 004 §2.2, §3.2).

    With `v₁ = v₁^ℓ` (or its 2-D subspace for complex `λ₁`), tokens `x^ℓ` entering
    and `x^{ℓ+1}` leaving layer `ℓ`:

    - `c`: `mean_i |cos(x_i^{ℓ+1}, v₁)|` (alignment after the layer), `c_std` its
      standard deviation over tokens; `c_in`: the same before the layer.
    - `delta`, `delta_std`: `Δ_ℓ` and the standard deviation of the per-token
      increments; `p`: the probability of a positive increment.
    - `c_bar`, `delta_bar`, `p_bar`: the same averaged over all `d` eigenvectors of
      `Ω_ℓ` (baselines `c̄_ℓ`, `Δ̄_ℓ`, `p̄_ℓ`); `delta_bar_std` the standard
      deviation over tokens of the eigenvector-averaged increment.
    """

    c: Float[Array, ""]
    c_std: Float[Array, ""]
    c_in: Float[Array, ""]
    delta: Float[Array, ""]
    delta_std: Float[Array, ""]
    p: Float[Array, ""]
    c_bar: Float[Array, ""]
    delta_bar: Float[Array, ""]
    delta_bar_std: Float[Array, ""]
    p_bar: Float[Array, ""]


def layer_alignment(
    x_before: Float[Array, "N d"], x_after: Float[Array, "N d"], spec: Spectrum
) -> LayerAlignment:
    """`c_ℓ`, `Δ_ℓ`, `p_ℓ` and their all-eigenvector baselines for one layer.

    **Arguments:**

    - `x_before`, `x_after`: the tokens entering and leaving layer `ℓ`, all
      sequences stacked, `(N, d)` (paper 004 uses `N ≥ 1000`).
    - `spec`: `spectrum(layer_matrix(model, ℓ))`.

    **Returns:**

    A `LayerAlignment`.
    """
    refuse_first([(not isinstance(spec, Spectrum), TypeError, "layer_alignment takes the "
                   f"layer's ja.spectral.spectrum(Ω), got {type(spec).__name__}.")])
    _same_tokens("layer_alignment", x_before, x_after)
    before = cosines(x_before, spec.principal)
    after = cosines(x_after, spec.principal)
    diff = after - before
    bases = eigen_bases(spec)  # (K, d, 2)
    all_after = jax.vmap(cosines, (None, 0))(x_after, bases)  # (K, N)
    all_diff = all_after - jax.vmap(cosines, (None, 0))(x_before, bases)
    return LayerAlignment(
        c=jnp.mean(after), c_std=jnp.std(after), c_in=jnp.mean(before),
        delta=jnp.mean(diff), delta_std=jnp.std(diff),
        p=jnp.mean((diff > 0).astype(diff.dtype)),
        c_bar=jnp.mean(all_after), delta_bar=jnp.mean(all_diff),
        delta_bar_std=jnp.std(jnp.mean(all_diff, axis=0)),
        p_bar=jnp.mean((all_diff > 0).astype(diff.dtype)),
    )


def top_eigenvector(M: Float[Array, "d d"]) -> Float[Array, " d"]:
    """The unit eigenvector of the largest eigenvalue of a symmetric matrix.

    `M` is read through its symmetric part `(M + Mᵀ)/2` (`jnp.linalg.eigh`'s
    `symmetrize_input`): a matrix that is symmetric only to rounding needs no
    symmetrising first, and symmetrising an exactly symmetric one changes no bit.
    Traceable and differentiable (where the top eigenvalue is simple).

    **Arguments:**

    - `M`: a real symmetric matrix `(d, d)`, e.g. `U` of paper 001 (Theorems 5.2,
      5.3) or a layer matrix `Ω = Σ_η U_η` of paper 004 with symmetric heads.
      A concrete `M` that is not symmetric (beyond `1e-4` of its norm) is refused:
      its symmetric part's eigenvector is not one of `M`'s.

    **Returns:**

    The eigenvector `(d,)` of unit Euclidean norm; its sign is arbitrary.
    """
    M = check_square(M, "M", "top_eigenvector")
    if is_concrete(M):
        A = np.asarray(M, float)
        skew = np.linalg.norm(A - A.T) / max(np.linalg.norm(A), 1e-300)
        refuse_first([(not np.isfinite(A).all(), "top_eigenvector: `M` contains NaN or inf."),
                      (not skew <= 1e-4, "top_eigenvector reads a symmetric matrix; `M` is "
                       f"not one (‖M − Mᵀ‖/‖M‖ = {skew:.2g}): for a general matrix use "
                       "numpy.linalg.eig.")])
    return jnp.linalg.eigh(M, symmetrize_input=True)[1][:, -1]
