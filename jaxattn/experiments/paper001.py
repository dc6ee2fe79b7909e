"""The models of paper 001 §6.1, as public constructors: the ones `jaxattn demo`,
the experiments and the sweeps run, for your own studies.

- `sphere_dynamics(key)`: two time-varying heads on S², `U = I` (§6.1.1,
  Theorem 4.1), with `hemisphere_tokens(key, n, d)` as starts.
- `causal_weights(key, d, h)` → `causal_dynamics(weights)`: causal heads with
  oscillating `P_η(t)` on `S^{d−1}` (§6.1.2, Theorem 5.1); `span_dynamics(weights,
  x0)` is the same model, exactly, in the `n`-dimensional coordinates of
  `span(x0)` (`span_misalignment` measures it there).
- `symmetric_dynamics(key, d)`: one causal head with a symmetric `U`
  (§6.1.3, Theorem 5.2); `top_eigenvector(U)` and `hemisphere_of(key, v, n)` give
  its limit `v₁` and starts in `⟨v₁, x⟩ > 0`.
- `gradient_dynamics(key, d)`: a gradient flow of `E_P` on an ellipsoid (§3,
  Theorem 3.2).

```python
import jax, jaxattn as ja
from jaxattn.experiments import paper001 as paper

dyn = paper.sphere_dynamics(jax.random.PRNGKey(0))
x0 = paper.hemisphere_tokens(jax.random.PRNGKey(1), 10, 3)
E = ja.misalignment(ja.solve_flow(dyn, x0, jax.numpy.linspace(0, 10, 101)))
```

Every product here is true float32 (`jaxattn._precision`): they set up or measure
the model, whatever precision its attention later runs at.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray, Real

from .._dynamics import SelfAttentionDynamics
from .._manifold import normalize, sample_ellipsoid
from .._precision import einsum, matmul
from .._programs import kept_jit
from .._schedule import Schedule
from .._validate import check_count
from ..metrics import misalignment

# Frequencies (in units of π) of D_η(t) = 2 diag(cos ω₁πt, sin ω₂πt, cos ω₃πt) for
# the two heads of the sphere experiment (paper 001 §6.1.1).
_SPHERE_OMEGAS = ((10.0, 10.0, 6.0), (6.0, 6.0, 4.0))


def sphere_diagonals(t, omegas=_SPHERE_OMEGAS) -> Float[Array, "h 3"]:
    """The diagonals of `D_η(t)`: `2 (cos ω₁πt, sin ω₂πt, cos ω₃πt)` per head."""
    w = jnp.pi * jnp.asarray(omegas)
    return 2 * jnp.stack([jnp.cos(w[:, 0] * t), jnp.sin(w[:, 1] * t), jnp.cos(w[:, 2] * t)], -1)


#: The heads are summed, each with `U = I`: `h` heads move the tokens about `h` times
#: as fast as one, so a sweep over `heads` changes the time scale with them.
HEADS_NOTE = ("heads: the h heads are summed, each with U = I, so h heads move the tokens "
              "about h times as fast as one; a consensus reached sooner at larger h is this "
              "scale, not the number of heads (compare consensus times multiplied by h)")

@kept_jit  # one program, not one per operation
def sphere_dynamics(key: PRNGKeyArray, num_heads: int = 2) -> SelfAttentionDynamics:
    """The time-varying model on S² (paper 001 §6.1.1, Theorem 4.1), `num_heads ≥ 1`
    heads (2 in the paper): `U_η = I`, `P_η(t) = Q_ηᵀ D_η(t) K_η` with `Q_η, K_η`
    uniform in `[−0.5, 0.5]` (drawn from `key`), `D₁(t) = 2 diag(cos 10πt, sin 10πt,
    cos 6πt)`, `D₂(t) = 2 diag(cos 6πt, sin 6πt, cos 4πt)`, reused cyclically by more
    heads."""
    num_heads = check_count(num_heads, "num_heads", 1)
    d = 3
    kq, kk = jax.random.split(key)
    dtype = jnp.result_type(float)
    Q, K = (jax.random.uniform(k, (num_heads, d, d), dtype, -0.5, 0.5) for k in (kq, kk))
    omegas = jnp.asarray([_SPHERE_OMEGAS[i % 2] for i in range(num_heads)], dtype)
    U = jnp.broadcast_to(jnp.eye(d, dtype=dtype), (num_heads, d, d))
    return SelfAttentionDynamics(Schedule(_cyclic_query_key, (Q, K, omegas)), U)


@kept_jit  # one program, not one per operation
def hemisphere_tokens(key: PRNGKeyArray, n: int, d: int) -> Float[Array, "n d"]:
    """`n` random unit tokens `(n, d)`, all in the open hemisphere of a random
    direction (the domain of Theorem 4.1)."""
    kz, kx = jax.random.split(key)
    z = sample_ellipsoid(kz, 1, d)[0]
    x = sample_ellipsoid(kx, n, d)
    return x * jnp.sign(matmul(x, z, "float32"))[:, None]


@kept_jit  # one program, not one per operation
def sphere_query_key(dyn: SelfAttentionDynamics, ts: Real[Array, " T"]) -> Float[Array, "T h"]:
    """`‖P_η(t)‖_F` per head at each time (paper 001 Fig. 1)."""
    return jax.vmap(lambda t: jnp.linalg.norm(dyn.query_key(t), axis=(-2, -1)))(ts)


# --- §6.1.2: causal attention, 50 tokens on S⁴⁹⁹ (Theorem 5.1) -------------------


class CausalWeights(eqx.Module):
    """`P_η(t) = Q_ηᵀ D_η(t) K_η`, `D_η(t) = diag(a_ηk cos(ω_ηk t))` (paper 001 §6.1.2).

    `Q, K`: `(h, k, d)`; `a, w`: `(h, k)`. Kept factored: the model reads
    `Q_η(t) = D_η(t) Q_η` and `K_η`.
    """

    Q: Float[Array, "h k d"]
    K: Float[Array, "h k d"]
    a: Float[Array, "h k"]
    w: Float[Array, "h k"]


def causal_weights(key: PRNGKeyArray, d: int, num_heads: int, amplitude: float = 2.0,
                   max_freq: float = 2.0) -> CausalWeights:
    """Random weights of the causal experiment (paper 001 §6.1.2; ranges ours).

    `Q_η, K_η ∈ R^{k×d}` with the head dimension `k = d / h` of multi-head
    attention (GPT-2's convention) and entries uniform in `[−0.5, 0.5]` (as in
    §6.1.1); amplitudes `a_ηk ~ U[0, amplitude]` (2, the amplitude of §6.1.1's
    `D_η`) and frequencies `ω_ηk ~ U[0, max_freq·π]` (periods of at least
    `2 / max_freq`).

    Returns the `CausalWeights`, for `causal_dynamics` or `span_dynamics`.
    """
    d = check_count(d, "d", 1)
    num_heads = check_count(num_heads, "num_heads", 1)
    kq, kk, ka, kw = jax.random.split(key, 4)
    dtype = jnp.result_type(float)
    shape = (num_heads, max(1, d // num_heads), d)
    Q, K = (jax.random.uniform(k, shape, dtype, -0.5, 0.5) for k in (kq, kk))
    a = jax.random.uniform(ka, shape[:2], dtype, 0.0, amplitude)
    w = jax.random.uniform(kw, shape[:2], dtype, 0.0, max_freq * jnp.pi)
    return CausalWeights(Q, K, a, w)


def _scaled_query(t, params):
    Q, a, w = params
    return (a * jnp.cos(w * t))[..., None] * Q


def causal_dynamics(weights: CausalWeights) -> SelfAttentionDynamics:
    """The causal model of §6.1.2 (Theorem 5.1) on `S^{d−1}`: `U_η = I`,
    `P_η(t) = Q_ηᵀ D_η(t) K_η` from `causal_weights`."""
    h, _, d = weights.Q.shape
    U = jnp.broadcast_to(jnp.eye(d, dtype=weights.Q.dtype), (h, d, d))
    Q = Schedule(_scaled_query, (weights.Q, weights.a, weights.w))
    return SelfAttentionDynamics.from_factors(Q, weights.K, U, causal=True)


def span_dynamics(weights: CausalWeights,
                  x0: Float[Array, "n d"]) -> tuple[SelfAttentionDynamics, Float[Array, "n n"]]:
    """The model of `causal_dynamics` in the coordinates of `span(x0)`, exactly.

    With every `U_η = I` the velocity of each token is a combination of the
    tokens, so `x(t) = Y(t) X₀` stays in the row space of `X₀ = N(x0)`. In the
    coordinates `Y` (`n × n`, `Y(0) = I`) the flow (eq. 6) and the layers (eq. 4)
    are the same model on the ellipsoid `E_G`, `G = X₀X₀ᵀ`, with
    `P̃_η(t) = X₀ P_η(t) X₀ᵀ`, formed as `(Q_η X₀ᵀ)ᵀ D_η(t) (K_η X₀ᵀ)` and
    `U = I_n`: a step costs `O(k n²)` per head instead of `O(k n d)`. Needs linearly
    independent tokens (`n ≤ d`; almost surely for random ones).

    Returns the reduced model and `G`; `x(t) = Y(t) X₀` recovers the tokens.
    """
    X0 = normalize(x0)
    G = matmul(X0, X0.T, "float32")
    h, n = weights.Q.shape[0], X0.shape[0]
    U = jnp.broadcast_to(jnp.eye(n, dtype=X0.dtype), (h, n, n))
    QX, KX = matmul(weights.Q, X0.T, "float32"), matmul(weights.K, X0.T, "float32")
    P = Schedule(_span_query_key, (QX, KX, weights.a, weights.w))
    return SelfAttentionDynamics(P, U, W=G, causal=True), G


def _span_query_key(t, params):
    QX, KX, a, w = params
    return einsum("hkn,hk,hkm->hnm", QX, a * jnp.cos(w * t), KX, precision="float32")


def span_misalignment(y: Float[Array, "*batch n n"], G: Float[Array, "n n"]):
    """`misalignment` of the tokens `x = Y X₀` computed from `Y` and `G = X₀X₀ᵀ`:
    the `G`-cosines of the rows of `Y` are the cosines of the tokens, so it is
    `ja.misalignment(y, G)` (cancellation-free, ≥ 0)."""
    return misalignment(y, G)


# --- §6.1.3: causal attention, symmetric U (Theorem 5.2) --------------------------


def symmetric_value(key: PRNGKeyArray, d: int) -> Float[Array, "d d"]:
    """A symmetric `U` with spectrum `linspace(1, −0.5, d)` in a random orthonormal
    basis: a simple top eigenvalue `λ₁ = 1` (our choice; the paper's `U` is lost
    from its text)."""
    dtype = jnp.result_type(float)
    basis, _ = jnp.linalg.qr(jax.random.normal(key, (d, d), dtype))
    lam = jnp.linspace(1.0, -0.5, d, dtype=dtype)
    return matmul(basis * lam[None, :], basis.T, "float32")


def symmetric_dynamics(key: PRNGKeyArray, d: int = 3) -> SelfAttentionDynamics:
    """The causal one-head model of §6.1.3 in dimension `d` (3 in the paper):
    `P(t) = Qᵀ D₁(t) K` with §6.1.1's `D₁` (repeated cyclically for `d > 3`), `Q, K`
    uniform in `[−0.5, 0.5]`, and `U = symmetric_value(key, d)`. Its limit is
    `top_eigenvector(dyn.U(0.0)[0])` for starts in `⟨v₁, x⟩ > 0`."""
    d = check_count(d, "d", 1)
    kq, kk, ku = jax.random.split(key, 3)
    dtype = jnp.result_type(float)
    Q, K = (jax.random.uniform(k, (1, d, d), dtype, -0.5, 0.5) for k in (kq, kk))
    P = Schedule(_cyclic_query_key, (Q, K, jnp.asarray(_SPHERE_OMEGAS[:1], dtype)))
    return SelfAttentionDynamics(P, symmetric_value(ku, d)[None], causal=True)


@jax.jit  # one program where a model is read on the host (`classify`); inlined under jit
def _cyclic_query_key(t, params):
    """`Qᵀ D(t) K` per head, `D(t)` the diagonal of `sphere_diagonals` repeated
    cyclically over the dimension (itself for `d = 3`)."""
    Q, K, omegas = params
    d = Q.shape[-1]
    D = sphere_diagonals(t, omegas).astype(Q.dtype)
    D = jnp.tile(D, (1, -(-d // 3)))[:, :d]
    return einsum("hkd,hk,hke->hde", Q, D, K, precision="float32")


def hemisphere_of(key: PRNGKeyArray, v: Float[Array, " d"], n: int) -> Float[Array, "n d"]:
    """`n` uniform unit tokens reflected into the open hemisphere `⟨v, x⟩ > 0`."""
    x = sample_ellipsoid(key, n, v.shape[0])
    return x * jnp.where(matmul(x, v, "float32") >= 0, 1.0, -1.0)[:, None]


# --- §3: the gradient flow (Theorem 3.2) ---------------------------------------


def gradient_dynamics(key: PRNGKeyArray, d: int = 3, *, ellipsoid: bool = True,
                      beta: float = 1.0) -> SelfAttentionDynamics:
    """A one-head model that is a gradient flow of `E_P` (paper 001 §3, Theorem 3.2).

    `P = A Aᵀ / d + I/2` with `A` uniform in `[−1, 1]` (symmetric positive
    definite), the metric `W = B Bᵀ / d + I/2` (random SPD; `I` when not
    `ellipsoid`: the sphere) and `U = W⁻¹ P`, so that `W U = P`; inverse temperature
    `beta`.
    """
    d = check_count(d, "d", 1)
    ka, kb = jax.random.split(key)
    dtype = jnp.result_type(float)
    eye = jnp.eye(d, dtype=dtype)
    A = jax.random.uniform(ka, (d, d), dtype, -1.0, 1.0)
    P = matmul(A, A.T, "float32") / d + eye / 2
    if ellipsoid:
        B = jax.random.uniform(kb, (d, d), dtype, -1.0, 1.0)
        W = matmul(B, B.T, "float32") / d + eye / 2
        U = jnp.linalg.solve(W, P)
    else:
        W, U = None, P
    return SelfAttentionDynamics(P[None], U[None], W=W, beta=beta)


def top_eigenvector(U: Float[Array, "d d"]) -> Float[Array, " d"]:
    """`v₁` of `symmetric_dynamics`: `ja.spectral.top_eigenvector(U)`, imported at the
    call (the spectra and the models they read cost every experiment 50 ms)."""
    from ..spectral import top_eigenvector

    return top_eigenvector(U)


def with_beta(dyn: SelfAttentionDynamics, beta) -> SelfAttentionDynamics:
    """The same model at inverse temperature `β` (a number or a traced scalar: a
    sweep over `β` compiles once, and no check is added inside its program)."""
    return eqx.tree_at(lambda d: d.beta, dyn, jnp.asarray(beta, dyn.beta.dtype))
