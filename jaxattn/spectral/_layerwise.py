"""Paper 004 on whole models: the layer-by-layer power-method statistics (§2.2,
§3.2), shared-weight depth prolongation (§2.1, §3.1) and rank-1 steering of the
last layer (§2.3, §3.3).

The dynamics is the core simulator's discrete layer with `W = I` (paper 004
eq. 3): layer `ℓ` of a model is `ja.models.attention_dynamics(model, ℓ)` (no
biases, norms replaced by the Euclidean normalisation, feed-forward blocks
dropped), run with `ja.run_layers`.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._dynamics import SelfAttentionDynamics
from .._layers import run_layers
from .._precision import matmul
from .._programs import kept_jit
from .._schedule import Constant, PiecewiseConstant
from .._validate import check_count, check_scalar, is_concrete, is_one_key, refuse_first
from ..models import (
    AbstractTransformer,
    attention_dynamics,
    attention_weights,
    replace_attention,
)
from ._spectrum import cosines, layer_alignment, layer_matrix, spectrum


def _f64(tree):
    dtype = jnp.result_type(float)
    return jax.tree.map(lambda a: a.astype(dtype) if eqx.is_inexact_array(a) else a, tree)


def layer_dynamics(model_or_dyn, layer: int) -> SelfAttentionDynamics:
    """Layer `ℓ` as a time-invariant `ja.SelfAttentionDynamics`: the one place a
    model or a dynamics is turned into the map of one layer.

    **Arguments:**

    - `model_or_dyn`: a model (its layer via `ja.models.attention_dynamics`, in
      the default float precision) or a `ja.SelfAttentionDynamics` (frozen at
      `t = ℓ`).
    - `layer`: the layer `ℓ`.

    **Returns:**

    The layer's dynamics.
    """
    if isinstance(model_or_dyn, AbstractTransformer):
        return _f64(attention_dynamics(model_or_dyn, layer))
    if isinstance(model_or_dyn, SelfAttentionDynamics):
        t = jnp.asarray(float(layer), jnp.result_type(float))
        P = model_or_dyn.query_key(t)
        d = model_or_dyn  # every option but the weights' time dependence is kept
        return SelfAttentionDynamics(P, d.U(t), d.W, d.beta, d.causal, d.norm, d.window,
                                     d.mask, d.kernel, precision=d.precision)
    raise TypeError(f"expected a model or a ja.SelfAttentionDynamics, got {model_or_dyn!r}.")


@kept_jit
def _layer_maps(model_or_dyn, layers: tuple) -> tuple[list, list]:
    """The dynamics of `layers` (at least one) and their layer matrices, in one program."""
    dyns = [layer_dynamics(model_or_dyn, ell) for ell in layers]
    return dyns, [layer_matrix(dyn) for dyn in dyns]


def _propagate(model_or_dyn, layers, x0, tau):
    """The requested layers (default: all of a model's), each converted once, their
    layer matrices, and the normalised input then the tokens after each layer in turn
    `(L + 1, B, n, d)`: one compiled program, reused (same shapes at every layer); the
    tokens on the host (NumPy: no program per slice)."""
    refuse_first([
        (layers is None and not isinstance(model_or_dyn, AbstractTransformer), TypeError,
         "a ja.SelfAttentionDynamics has no depth of its own: pass `layers`, the layers to "
         "run."),
        (np.ndim(x0) != 3, f"`x0` must be a batch of sequences (B, n, d), got shape "
                           f"{np.shape(x0)}; x0[None] for one sequence."),
    ])
    if layers is None:
        layers = range(model_or_dyn.num_layers)
    layers = tuple(layers)
    dyns, Omegas = _layer_maps(model_or_dyn, layers or (0,))  # dyns[0] normalises
    xs = [np.asarray(run_layers(dyns[0], x0, 0))[:, 0]]
    for dyn in dyns[:len(layers)]:
        xs.append(np.asarray(run_layers(dyn, xs[-1], 1, tau))[:, 1])
    return dyns[:len(layers)], Omegas[:len(layers)], np.stack(xs)


def run_model(model, x0: Float[Array, "B n d"], *, layers=None, tau: float = 1.0):
    """Tokens after every layer of `model` under paper 004 eq. 3.

    **Arguments:**

    - `model`: a model or a `ja.SelfAttentionDynamics` (read at `t = ℓ`).
    - `x0`: initial tokens, `(B, n, d)` (normalised first).
    - `layers`: which layers, in order (default: all of the model's).
    - `tau`: the step `τ` (paper 004 uses 1).

    **Returns:**

    `(len(layers) + 1, B, n, d)`; index 0 the normalised input.
    """
    return jax.device_put(_propagate(model, layers, x0, tau)[2])


def layerwise(model, x0: Float[Array, "B n d"], *, tau: float = 1.0, order_tau=None,
              top: int = 5, layers=None, per_prompt: bool = False):
    """Paper 004 §3.2 for every layer: `c_ℓ`, `Δ_ℓ`, `p_ℓ`, their all-eigenvector
    baselines and the first eigenvalues of `Ω_ℓ` (Figs. 2b, 6, 7).

    **Arguments:**

    - `model`, `x0`, `tau`, `layers`: as `run_model`.
    - `order_tau`: passed to `spectrum` as `tau` (None: order by `|λ|`).
    - `top`: how many leading eigenvalues to return per layer.
    - `per_prompt`: the statistics of each prompt's tokens apart, with an axis
      `(L, B)`: the prompt, not the token, is the unit of independent sampling (a
      prompt's tokens attend to each other).

    **Returns:**

    `(stats, eigenvalues, xs)`: a `LayerAlignment` with a leading layer axis, the
    `(L, top)` leading eigenvalues, and the tokens `(L + 1, B, n, d)`.
    """
    top = check_count(top, "top", 1)
    refuse_first([(layers is not None and len(tuple(layers)) == 0,
                   "layerwise: `layers` is empty; name at least one layer (default: all).")])
    _, Omegas, xs = _propagate(model, layers, x0, tau)
    d = xs.shape[-1]
    stats, eigs = [], []
    for i, Omega in enumerate(Omegas):  # op by op: the same bits as before (issue 42)
        spec = spectrum(_f64(Omega), tau=order_tau)
        stats.append(jax.vmap(lambda a, b: layer_alignment(a, b, spec))(xs[i], xs[i + 1])
                     if per_prompt else
                     layer_alignment(xs[i].reshape(-1, d), xs[i + 1].reshape(-1, d), spec))
        eigs.append(np.asarray(spec.eigenvalues)[:top])
    # `device_put`, not `jnp.asarray` (a program per shape): arrays of the host's values
    stats = jax.tree.map(lambda *a: jax.device_put(np.stack(a)), *stats)
    return stats, jax.device_put(np.stack(eigs)), jax.device_put(xs)


def shared_alignment(model_or_dyn, x0: Float[Array, "B n d"], num_layers: int, *,
                     layer: int = 0, tau: float = 1.0):
    """Shared weights (paper 004 §2.1): repeat layer `ℓ` `num_layers` times and
    follow each token's alignment with the principal subspaces of `Ω_ℓ`.

    **Returns:**

    `(specs, cos)`: the `Spectrum` of `Ω_ℓ` ordered by `|λ|` (paper 004) and by
    `|1 + τλ|`, and `cos (B, L + 1, n, 2, 2)`: per layer and token, for each of the
    two orders, the alignment with `v₁` (`spec.principal`: the projection on
    `span(Re v₁, Im v₁)` for complex `λ₁`) and with `spec.plane`.
    """
    (dyn,), (Omega,) = _layer_maps(model_or_dyn, (layer,))
    specs = (spectrum(Omega), spectrum(Omega, tau=tau))
    observe = _Alignments(tuple(b for s in specs for b in (s.principal, s.plane)))
    # "general": on the fused path XLA's CPU compiler (JAX 0.10.2) computed this observe
    # from other tokens than the layer returned (cosines up to 2.1; `docs/limits.md`)
    return specs, run_layers(dyn, x0, num_layers, tau, observe=observe, strategy="general")


class _Alignments(eqx.Module):
    """`shared_alignment`'s observation: a module, not a closure, so that its program
    is named by its arguments and kept (`_programs.kept_jit`)."""

    bases: tuple[Float[Array, "d 2"], ...]

    def __call__(self, x):
        c = jnp.stack([cosines(x, b) for b in self.bases], axis=-1)
        return c.reshape(c.shape[:-1] + (2, 2))


# --- rank-1 steering (paper 004 §2.3) ----------------------------------------------


def steer(model_or_dyn, u: Float[Array, " d"], gamma: float, *, w=None, layer: int = -1):
    """Rank-1 steering: edit one layer so that its layer matrix becomes
    `Ω + γ u wᵀ` (paper 004 §2.3).

    For a model the output projection becomes `W_O + γ u wᵀ V⁺` (`V` the stacked
    value projections `(h k, d)`), so that the layer matrix becomes
    `Ω + γ u (Π w)ᵀ`, `Π = V⁺V` the projection on the row space of `V`: `Ω + γ u wᵀ`
    when `V` has full column rank. `V⁺` keeps only the singular values above
    `max(h k, d) · eps · σ_max` (NumPy's `matrix_rank` cutoff): grouped key–value
    heads repeat rows of `V` and leave it rank-deficient, and a rounding-level
    singular value inverted would make the edit enormous (docs/usage/spectral.md). For a
    `ja.SelfAttentionDynamics` (constant or piecewise-constant `U`), `γ u wᵀ / h`
    is added to every head's `U_η` of that layer.

    **Arguments:**

    - `model_or_dyn`: a model or a `ja.SelfAttentionDynamics`.
    - `u`: the target direction `(d,)` (normalised here).
    - `gamma`: the strength `γ` (a finite real number).
    - `w`: a nonzero `(d,)`; default `u` (normalised).
    - `layer`: which layer (default the last; for a dynamics, the index of the
      `PiecewiseConstant` stack, ignored for `Constant`).

    **Returns:**

    The edited model or dynamics.
    """
    dyn = model_or_dyn if isinstance(model_or_dyn, SelfAttentionDynamics) else None
    d = dyn.dim if dyn else model_or_dyn.config.hidden_size
    stack = dyn.U.values.shape[0] if dyn and isinstance(dyn.U, PiecewiseConstant) else None
    refuse_first([
        *((v is not None and np.shape(v) != (d,),
           f"steer: `{name}` must be a direction (d,) = ({d},), got shape {np.shape(v)}.")
          for name, v in (("u", u), ("w", w))),
        (stack is not None and not -stack <= layer < stack,
         f"steer: `layer` {layer} is not one of the {stack} layers of the dynamics' "
         f"PiecewiseConstant stack (−{stack} ≤ layer < {stack})."),
    ])
    refuse_first([(v is not None and is_concrete(v)  # normalised: all NaN otherwise
                   and not (np.isfinite(v).all() and np.any(np.asarray(v) != 0)),
                   f"steer: `{name}` must be a finite nonzero direction.")
                  for name, v in (("u", u), ("w", w))])
    gamma = check_scalar(gamma, "gamma")
    row = None
    if dyn is None and all(map(is_concrete, jax.tree.leaves((u, w, model_or_dyn)))):
        # `wᵀ V⁺` in float64 on the host: `V` may be ill-conditioned (MiniLM's last
        # layer: 3e3), and a float32 pseudo-inverse then misses `Ω + γ u wᵀ` by 3 % of γ.
        V = np.asarray(_stacked_value(attention_weights(model_or_dyn, layer)), np.float64)
        w64 = np.asarray(u if w is None else w, np.float64)
        rank_cutoff = max(V.shape) * np.finfo(V.dtype).eps  # NumPy's `matrix_rank`
        row = (w64 / np.linalg.norm(w64)) @ np.linalg.pinv(V, rcond=rank_cutoff)
    return _steer(model_or_dyn, u, jax.device_put(gamma), w, layer, row)  # γ traced


def _stacked_value(attn):
    """The value projections of a layer's heads stacked `(h k, d)` (shared key–value
    heads repeated)."""
    h, k = attn.num_heads, attn.query.shape[-2]
    return jnp.repeat(attn.value, h // attn.num_kv_heads, axis=0).reshape(h * k, -1)


@kept_jit  # one program for every `γ` (op by op, a program per operation)
def _steer(model_or_dyn, u, gamma, w, layer, row):
    u = jnp.asarray(u) / jnp.linalg.norm(u)
    w = u if w is None else jnp.asarray(w) / jnp.linalg.norm(w)
    if isinstance(model_or_dyn, SelfAttentionDynamics):
        return _steer_dynamics(model_or_dyn, u, gamma, w, layer)
    attn = attention_weights(model_or_dyn, layer)
    h, k = attn.num_heads, attn.query.shape[-2]
    if row is None:  # traced weights: the pseudo-inverse in this program's precision
        V = _stacked_value(attn)
        row = matmul(w, jnp.linalg.pinv(V.astype(jnp.float64) if jax.config.jax_enable_x64
                                        else V))
    delta = gamma * jnp.outer(u, row)  # (d, h k)
    out = (attn.output.reshape(-1, h * k) + delta).reshape(attn.output.shape)
    return replace_attention(model_or_dyn, layer, eqx.tree_at(
        lambda a: a.output, attn, out.astype(attn.output.dtype)))


def _steer_dynamics(dyn, u, gamma, w, layer):
    U, add = dyn.U, gamma * jnp.outer(u, w) / dyn.num_heads
    if isinstance(U, Constant):
        new = Constant(U.value + add[None])
    elif isinstance(U, PiecewiseConstant):
        new = eqx.tree_at(lambda s: s.values, U, U.values.at[layer].add(add[None]))
    else:
        raise TypeError("steer edits constant or piecewise-constant value matrices only; "
                        f"got a {type(U).__name__} schedule.")
    return eqx.tree_at(lambda d: d.U, dyn, new)


def random_tokens(key, prompts: int, tokens: int, d: int) -> Float[Array, "B n d"]:
    """Initial tokens `N(0, I)` (paper 004 App. B), `(prompts, tokens, d)`."""
    counts = [check_count(c, name, 1) for c, name in
              ((prompts, "prompts"), (tokens, "tokens"), (d, "d"))]
    refuse_first([(not is_one_key(key), TypeError,
                   "random_tokens: `key` must be a PRNG key (jax.random.key(seed)), got "
                   f"{type(key).__name__}.")])
    return _random_tokens(key, *counts)


@kept_jit(static_argnames=("prompts", "tokens", "d"))  # one program, not three
def _random_tokens(key, prompts: int, tokens: int, d: int) -> Float[Array, "B n d"]:
    return jax.random.normal(key, (prompts, tokens, d), jnp.result_type(float))
