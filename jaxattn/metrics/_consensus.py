"""Measures of consensus along the flow and the layers (paper 001 §3–6)."""

import math

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, Real

from .._manifold import project, scale_rows, w_inner
from .._precision import matmul
from .._stacked import map_batch
from .._validate import (
    as_float_array,
    check_count,
    check_metric,
    check_rows_now,
    check_scalar,
    is_concrete,
    refuse_first,
    too_big,
)
from ._pairs import (
    DENSE_COUNT_MAX,
    block_rows,
    component_roots,
    dense_labels,
    exp_score_sum,
)


def misalignment(
    x: Float[Array, "*batch n d"], W: Float[Array, "d d"] | None = None
) -> Float[Array, "*batch"]:
    """The misalignment `E(x) = 1 − (1/n) Σ_i cos(x_1, x_i)` (paper 001 eq. 25).

    Zero exactly when every token points along the first one (consensus); leading
    axes (batch, time) are kept. Measured against token 1, as in the papers, and in
    `[0, 2]` (`pairwise_misalignment` is its symmetric companion); below
    `misalignment_floor` it is rounding alone (docs/usage/model.md, "Reading E").

    Evaluated without cancellation as `(1/n) Σ_i |x̂_i − x̂_1|²_W / 2`, with
    `x̂ = N_W(x)` (each row brought to unit scale by a power of two first, so
    tokens of any finite size, `1e-25` or `2e19` in float32, neither underflow nor
    overflow): `1 − cos(a, b) = |â − b̂|²/2`. So `E ≥ 0`, and it resolves values
    down to ~1e-14 in float32, where `1 − mean cos` stops at the rounding of the
    cosines (~1e-7). The dtype of `x` is kept (float64 in, float64 out, with
    `jax_enable_x64` on).

    **Arguments:**

    - `x`: tokens `(..., n, d)`, any nonzero finite rows (not necessarily
      normalised). A zero row (no direction) or a NaN/inf entry is refused with a
      `ValueError` when `x` is concrete; inside `jit`/`vmap` (traced `x`, e.g. as
      `run_layers`' `observe`) no check runs and such a sequence's `E` is NaN.
    - `W`: a metric `(d, d)` for the `W`-cosine `⟨a, b⟩_W / (|a|_W |b|_W)`;
      `None` (default) is the Euclidean cosine of eq. 25. For tokens `x = Y X₀`
      given by coordinates `Y`, `misalignment(Y, X₀X₀ᵀ)` is `misalignment(x)`.

    **Returns:**

    `E` with the shape of the leading axes.
    """
    x = _tokens(x, "misalignment")
    W = None if W is None else check_metric(W, x.shape[-1])
    unit = project(x, W)
    return jnp.mean(_half_sq_norm(unit - unit[..., :1, :], W), axis=-1)


def pairwise_misalignment(
    x: Float[Array, "*batch n d"], W: Float[Array, "d d"] | None = None
) -> Float[Array, "*batch"]:
    """The symmetric misalignment: the mean of `1 − cos(x_i, x_j)` over all pairs
    `i ≠ j`.

    Unlike `misalignment` (measured against token 1) it does not change when the
    tokens are permuted. Zero exactly at consensus, at most `n / (n − 1)` (`0` for a
    single token). With `E = misalignment(x)`: `pairwise ≤ 4E` (each `1 − cos` is
    half a squared distance, and `|a − b|² ≤ 2|a − c|² + 2|b − c|²`) and
    `E ≤ (n − 1)/2 · pairwise` (equality when token 1 alone is off the others).

    Evaluated without cancellation from the offsets `r_i = x̂_i − x̂_1` of the
    tokens put on unit scale (`x̂ = N_W(x)`): `Σ_{i<j} |x̂_i − x̂_j|² = n Σ_i |r_i − r̄|²`,
    so it resolves the same small values as `misalignment`, in `O(n d)`.

    **Arguments:**

    - `x`: tokens `(..., n, d)`, nonzero finite rows (checked as in `misalignment`).
    - `W`: a metric `(d, d)` for the `W`-cosine; `None` (default) is the Euclidean one.

    **Returns:**

    The mean over pairs, with the shape of the leading axes.
    """
    x = _tokens(x, "pairwise_misalignment")
    W = None if W is None else check_metric(W, x.shape[-1])
    n = x.shape[-2]
    unit = project(x, W)
    r = unit - unit[..., :1, :]
    spread = jnp.sum(_half_sq_norm(r - jnp.mean(r, axis=-2, keepdims=True), W), axis=-1)
    return spread * (2 / max(n - 1, 1))  # Σ_{i<j} / (n(n − 1)/2), with Σ_{i<j} = n·spread


def misalignment_floor(dtype, n: int, d: int) -> float:
    """The largest misalignment `E` (eq. 25) that rounding alone gives a collapsed
    configuration of `n` tokens in `R^d` stored in `dtype`: below it `E` is noise.

    **Derivation.** Let `u = eps/2` be the unit roundoff of `dtype`. Collapsed tokens
    are positive multiples of one unit direction `x̂`, each entry stored to within
    `u` of its value. `misalignment` brings each token to unit scale (a power of two:
    exact), sums its `d` squares (relative error ≤ `(⌈log₂ d⌉ + 1) u` for the
    pairwise sums the reductions use), takes the square root (half that, `+ u`) and
    divides (`+ u` per entry). So each normalised token lies within
    `r = (⌈log₂ d⌉ + 7) u / 2` of `x̂`, two tokens within `2r` of each other, and
    `E = (1/n) Σ_{i>1} |x̂_i − x̂_1|² / 2 ≤ (n − 1)/n · 2r²`. In float32 with `d = 3`
    that is ~1e-13, in float64 ~5e-31; `pairwise_misalignment` of a collapsed
    configuration is at most `n/(n − 1)` times it. It is the floor of the Euclidean
    cosine (`W = None`); a metric `W` adds the rounding of `W x`, larger by up to
    `W`'s condition number.

    **Arguments:**

    - `dtype`: the tokens' floating dtype (`jnp.float32`, `"float64"`, …).
    - `n`: the number of tokens, `≥ 1`.
    - `d`: their dimension, `≥ 1`.

    **Returns:**

    The floor, a Python float (`0` for one token).
    """
    try:
        eps = float(jnp.finfo(dtype).eps)
    except (TypeError, ValueError) as e:
        raise TypeError(f"misalignment_floor: `dtype` must be a floating dtype such as "
                        f"jnp.float32, got {dtype!r}.") from e
    n, d = check_count(n, "n", 1), check_count(d, "d", 1)
    r = (math.ceil(math.log2(d)) + 7) * (eps / 2) / 2
    return (n - 1) / n * 2 * r * r


def _half_sq_norm(r: Float[Array, "... d"], W: Float[Array, "d d"] | None) -> Float[Array, "..."]:
    """`|r|²_W / 2`, clipped at 0 (with `W` rounding can go below)."""
    return jnp.maximum(w_inner(r, r, W), 0) / 2


def _tokens(x, where: str | None = None, directions: bool = True) -> Float[Array, "*batch n d"]:
    """`x` as tokens `(..., n, d)`, or a one-line error naming `x` and the fix; with
    `where` (the function's name), also `n, d ≥ 1` and, when concrete, finite rows,
    nonzero unless `directions` is false."""
    x = as_float_array(x, "x")
    empty = x.ndim >= 2 and where is not None and 0 in x.shape[-2:]
    if x.ndim < 2 or empty:
        raise ValueError(f"{where}: `x` {x.shape} is empty (n = {x.shape[-2]} tokens, d = "
                         f"{x.shape[-1]}); pass at least one token of dimension d ≥ 1."
                         if empty else f"{where + ': ' if where else ''}`x` must be "
                         f"tokens of shape (..., n, d), got {x.shape}.")
    if where is not None:
        check_rows_now(x, "x", where, directions)
    return x


def pairwise_lyapunov(
    x: Float[Array, "*batch n d"], W: Float[Array, "d d"] | None = None
) -> Float[Array, "*batch"]:
    """The Lyapunov function of Theorem 4.1: `V(x) = 1 − min_{i,j} ⟨x_i, x_j⟩_W`
    (paper 001 eq. 10).

    On `E_W` it is zero exactly at consensus. Along the flow with every `U_η = I`
    and full attention it does not increase while all `⟨x_i, x_j⟩_W > 0`.
    Evaluated without cancellation as `max_{i,j} |x̂_i − x̂_j|²_W / 2` on the
    tokens put on `E_W` (`x̂ = N_W(x)`, which changes nothing for tokens on it), so
    `V ≥ 0` and it resolves values far below float32's `1e-7`.

    **Arguments:**

    - `x`: tokens `(..., n, d)` on `E_W`.
    - `W`: the metric `(d, d)`; `None` is the identity.

    **Returns:**

    `V` with the shape of the leading axes.
    """
    x = _tokens(x, "pairwise_lyapunov")
    W = None if W is None else check_metric(W, x.shape[-1])
    return map_batch(lambda xi: _largest_half_sq_distance(xi, W), x)


def _largest_half_sq_distance(x: Float[Array, "n d"], W) -> Float[Array, ""]:
    """`max_ij |x̂_i − x̂_j|²_W / 2`. The pairwise distances come from the Gram matrix
    of the offsets `r_i = x̂_i − x̂_1`, formed elementwise: its rounding is relative to
    `max |r_i|²`, which is within a factor 2 of the result, not to `|x̂|² = 1`.
    Metric products are true float32 (a measure, not the model's run)."""
    unit = project(x, W)
    r = unit - unit[:1]
    rW = r if W is None else matmul(r, W, "float32")
    gram = matmul(rW, r.T, "float32")
    sq = jnp.diagonal(gram)
    return jnp.maximum(jnp.max(sq[:, None] + sq[None, :] - 2 * gram), 0) / 2


def potential(
    x: Float[Array, "*batch n d"], P: Float[Array, "d d"], beta: float = 1.0, *,
    block_size: int | None = None,
) -> Float[Array, "*batch"]:
    """The potential of Theorem 3.2: `E_P(x) = ½ Σ_ij exp(β x_iᵀ P x_j)` (paper 001 eq. 8).

    When the flow is a gradient flow (one head, `P` symmetric and time-invariant,
    `W U` a positive multiple of `P`), `E_P` does not decrease along it.

    **Large n.** The sum runs over blocks of rows against all keys: O(block · n)
    memory, never n × n (one block, the dense sum, while `n² ≤ 2²²`); gradients
    recompute each block. Every term is the same as in the dense sum and the sums
    of positive terms differ only in their order, so the two agree to within
    `2 (n² − 1) u` relative (`u` the unit roundoff) plus the rounding of the
    length-`d` scores; measured in float32, d = 3, β = 1, random tokens, the
    blocked sum (64 rows a block) differs from the dense one by 1e-7 relative
    at n = 1024 and at n = 4096.

    **Arguments:**

    - `x`: tokens `(..., n, d)`.
    - `P`: one head's query–key product `(d, d)` (e.g. `dyn.query_key(0.0)[0]`).
    - `beta`: the inverse temperature `β`.
    - `block_size`: rows per block; `None` (default) takes `2²² // n`.

    **Returns:**

    `E_P` with the shape of the leading axes.
    """
    x = _tokens(x, "potential", directions=False)  # NaN tokens gave NaN
    P = as_float_array(P, "P")
    n, d = x.shape[-2:]
    if P.shape != (d, d):
        raise ValueError(
            f"`P` must be one head's ({d}, {d}) matrix, got {P.shape}; "
            "for a model use dyn.query_key(t)[0]."
        )
    beta = check_scalar(beta, "beta")
    block = block_rows(n, block_size)
    return map_batch(lambda xi: 0.5 * exp_score_sum(xi, P, beta, block), x)


def consensus_time(
    ts: Float[Array, " T"], E: Float[Array, "*batch T"], eps: float
) -> Float[Array, "*batch"]:
    """The first time at which `E(t) < eps`, interpolated between the saved times.

    Between the last sample at or above `eps` and the first one below it, `log E`
    is interpolated linearly (exact for exponential decay); if the later sample is
    `≤ 0` the interpolation is linear in `E`. `ts[0]` if `E(ts[0]) < eps` already.

    **Arguments:**

    - `ts`: increasing times `(T,)`.
    - `E`: a consensus measure at those times `(..., T)`, e.g. `misalignment(ys)`.
    - `eps`: the threshold, `> 0`.

    **Returns:**

    The crossing time per leading index; `inf` where `E` never drops below `eps`.
    """
    ts = as_float_array(ts, "ts")
    E = as_float_array(E, "E")
    if ts.ndim != 1 or E.ndim < 1 or E.shape[-1] != ts.shape[0] or ts.shape[0] == 0:
        raise ValueError(f"`E` must be (..., T) with T = len(ts) ≥ 1; got E {E.shape}, ts "
                         f"{ts.shape}.")
    host = np.asarray(ts) if is_concrete(ts) else None  # checked on the host: no callback
    # (`inf` is a save time after a stopped run's end, as in a FlowSolution)
    refuse_first([(host is not None and not (np.all(host[1:] >= host[:-1])
                                             and not np.any(np.isnan(host))),
                   "consensus_time: `ts` must be nondecreasing and not NaN (the saved times "
                   "in order).")])
    eps = check_scalar(eps, "eps", positive=True)
    return jnp.vectorize(lambda e: _crossing(ts, e, eps), signature="(t)->()")(E)


def _crossing(ts, e, eps):
    below = e < eps
    i1 = jnp.argmax(below)
    i0 = jnp.maximum(i1 - 1, 0)
    e0, e1 = e[i0], e[i1]
    positive = (e1 > 0) & (e0 > 0)
    safe0, safe1 = jnp.where(positive, e0, 2.0), jnp.where(positive, e1, 1.0)
    frac_log = (jnp.log(safe0) - jnp.log(eps)) / (jnp.log(safe0) - jnp.log(safe1))
    frac_lin = (e0 - eps) / jnp.where(e0 > e1, e0 - e1, 1.0)
    frac = jnp.clip(jnp.where(positive, frac_log, frac_lin), 0.0, 1.0)
    t = jnp.where(i1 == 0, ts[0], ts[i0] + frac * (ts[i1] - ts[i0]))
    return jnp.where(jnp.any(below), t, jnp.inf)


def cluster_labels(
    x: Float[Array, "*batch n d"], eps: float, *, block_size: int | None = None
) -> Int[Array, "*batch n"]:
    """Each token's cluster, named by its smallest token index: tokens joined by
    chains of steps shorter than `eps` share a label (single linkage).

    Two tokens share a cluster when a chain of tokens links them, each within
    Euclidean distance `eps` of the next (the distance computed from the
    difference itself, no Gram-matrix cancellation). Consensus is one cluster.

    **Large n.** Up to 64 tokens the labels come from the n × n reachability
    matrix; above, from parent pointers merged by sweeps over blocks of rows
    (Shiloach–Vishkin; O(block · n) memory). Both give the same labels exactly.

    **Arguments:**

    - `x`: tokens `(..., n, d)`.
    - `eps`: the linking distance, `> 0`.
    - `block_size`: rows per block; given, the blocked sweeps run at any `n`;
      `None` (default) takes the dense matrix up to n = 64, else `2²² // n` rows;
      `0` the dense matrix at any `n` (as a model's `block_size=0`).

    **Returns:**

    The labels `(..., n)`, ints in `[0, n)`: token `i` starts a cluster exactly
    when its label is `i`.
    """
    x = _tokens(x, "cluster_labels", directions=False)
    eps = check_scalar(eps, "eps", positive=True)
    n = x.shape[-2]
    dense = block_size == 0 and not isinstance(block_size, bool)
    refuse_first([too_big(3.0 * n * n * x.dtype.itemsize, f"the dense clustering of {n} "
                          "tokens (block_size=0) needs", "leave block_size to the default")
                  if dense else (False, "")])
    if dense or (block_size is None and n <= DENSE_COUNT_MAX):
        return map_batch(lambda xi: dense_labels(xi, eps), x)
    block = block_rows(n, block_size)
    return map_batch(lambda xi: component_roots(xi, eps, block)[0], x)


def cluster_count(
    x: Float[Array, "*batch n d"], eps: float, *, block_size: int | None = None
) -> Int[Array, "*batch"]:
    """The number of clusters of `cluster_labels` (single linkage at `eps`; consensus
    is one cluster).

    **Arguments:**

    - `x`: tokens `(..., n, d)`.
    - `eps`: the linking distance, `> 0`.
    - `block_size`: as `cluster_labels`.

    **Returns:**

    The number of clusters (an int array) per leading index.
    """
    labels = cluster_labels(_tokens(x, "cluster_count", directions=False), eps,
                            block_size=block_size)  # refusals named for this function
    own = jnp.arange(labels.shape[-1]).reshape((1,) * (labels.ndim - 1) + (-1,))
    return jnp.sum(labels == own, axis=-1)


def rank_collapse_residual(x: Float[Array, "*batch n d"]) -> Float[Array, "*batch"]:
    """The relative distance to rank one, `‖X − 1 x̄ᵀ‖_F / ‖X‖_F`, with `x̄` the mean token.

    Zero exactly when all tokens are equal (the rank collapse of Dong et al.).

    **Arguments:**

    - `x`: tokens `(..., n, d)`; all zero, they are equal and the residual is 0. NaN or
      inf is refused with a `ValueError` when `x` is concrete; traced, such a matrix's
      residual is NaN.

    **Returns:**

    The residual per leading index, in `[0, 1]`.
    """
    x = _tokens(x, "rank_collapse_residual", directions=False)

    def one(xi):
        # One power-of-two scale for the whole matrix (the ratio is scale-invariant),
        # so the norms neither overflow nor underflow.
        xi = scale_rows(xi.reshape(1, -1)).reshape(xi.shape)
        whole = jnp.linalg.norm(xi)
        residual = jnp.linalg.norm(xi - jnp.mean(xi, axis=0, keepdims=True))
        return jnp.where(whole == 0, 0, residual / jnp.where(whole == 0, 1, whole))  # 0/0: 0

    return map_batch(one, x)


def attention_entropy(dyn, t: Real[Array, ""], x: Float[Array, "*batch n d"]):
    """The mean entropy (nats) of the attention rows of each head at time `t`.

    `H_η = −(1/n) Σ_i Σ_j α^η_ij log α^η_ij`: `log n` for uniform full attention,
    `0` when every token attends to one token only.

    **Arguments:**

    - `dyn`: the model, a `ja.SelfAttentionDynamics`.
    - `t`: the time at which the weights are read.
    - `x`: tokens `(..., n, d)`.

    **Returns:**

    `(..., h)`: one entropy per head.
    """
    x = _tokens(x)

    def one(xi):
        A = dyn.attention(t, xi)
        log_A = jnp.log(jnp.where(A > 0, A, 1.0))  # 0 log 0 = 0 (masked causal entries)
        return -jnp.mean(jnp.sum(A * log_A, axis=-1), axis=-1)

    return map_batch(one, x)
