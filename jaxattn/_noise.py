"""Stochastic self-attention dynamics: noise on the tokens (`TokenNoise`) or on the
value matrices (`ValueNoise`), for `ja.solve_flow` and `ja.run_layers` (`docs/noise.md`).

Both enter as `σ P_x (dB_t · …)`, `P_x = I − x xᵀ W` the `W`-orthogonal projection
onto the tangent space of `E_W` at `x` (`jaxattn._manifold.tangent`): the noise moves
the tokens along the ellipsoid, and the normalisation keeps them there.
"""

import abc
import functools
import math

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
from jaxtyping import Array, Float, PRNGKeyArray, Real

from ._dynamics import SelfAttentionDynamics
from ._manifold import project, tangent
from ._precision import einsum
from ._schedule import AbstractSchedule
from ._stacked import map_systems
from ._validate import check_final, check_scalar, is_one_key, refuse_first

#: The Brownian tree's tolerance: its path is exact at every time on a grid this
#: fine, whatever step the solver takes (keep `dt0` well above it).
BROWNIAN_TOL = 2.0**-14


class AbstractNoise(eqx.Module):
    """Noise added to the attention dynamics, of strength `sigma ≥ 0`.

    `sigma` is an array leaf: built from a traced `σ`, a noise batches under `jax.vmap`,
    so a scan over strengths is one compiled program
    (`jax.vmap(lambda s: ja.run_layers(dyn, x0, L, tau, noise=ja.TokenNoise(s),
    key=key))(sigmas)`; `docs/noise.md`, "Batching over σ, β and τ"); a traced `σ` is
    checked (finite, `≥ 0`) inside the program.
    """

    sigma: Real[Array, ""]

    def __init__(self, sigma):
        # stored in the default float dtype, where it must stay finite (1e200 is inf in
        # float32)
        self.sigma = jnp.asarray(check_scalar(sigma, "sigma", nonnegative=True,
                                              dtype=jnp.result_type(float)))

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        check_final(cls, AbstractNoise)  # members implement abstract methods only

    @abc.abstractmethod
    def shape(self, n: int, d: int) -> tuple[int, ...]:
        """The shape of one system's Brownian motion, for `n` tokens in `R^d`."""

    @abc.abstractmethod
    def kick(self, dyn: SelfAttentionDynamics, t, x: Float[Array, "n d"], dB) -> Array:
        """The tokens' increment `(n, d)` for a Brownian increment `dB` at `(t, x)`."""

    @property
    @abc.abstractmethod
    def default_solver(self) -> dfx.AbstractSolver:
        """The SDE solver `ja.solve_flow` takes for this noise when none is given."""


class TokenNoise(AbstractNoise):
    """Independent noise on every token: `dx_i = v_i dt + σ P_{x_i} ∘ dB^i_t`
    (Stratonovich; `ja.solve_flow` takes `diffrax.Heun()` by default); a layer of
    `ja.run_layers` adds `σ √τ P_x ξ`. The Itô form and the orders: `docs/noise.md`.

    **Arguments:**

    - `sigma`: the strength `σ ≥ 0`.
    """

    def shape(self, n, d):
        return (n, d)

    def kick(self, dyn, t, x, dB):
        return self.sigma * tangent(project(x, dyn.W), dB, dyn.W)

    @property
    def default_solver(self):
        return dfx.Heun()


class _Identity(AbstractSchedule):
    """`I / h` for every head: the attention's mean token in place of its update."""

    value: Float[Array, "h d d"]

    def __call__(self, t):
        return self.value


def attention_mean(dyn: SelfAttentionDynamics, t, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
    """`m_i = (1/h) Σ_η Σ_j α^η_ij x_j`, the heads' mean attention-weighted token (the
    raw update with every value matrix `I`), at `x` for `"post"`/`"ngpt"` and at `N(x)`
    for the other placements (where their attention reads the tokens)."""
    h, d = dyn.num_heads, dyn.dim
    eye = jnp.broadcast_to(jnp.eye(d, dtype=x.dtype) / h, (h, d, d))
    model = eqx.tree_at(lambda m: m.U, dyn, _Identity(eye))
    return model.raw_update(t, dyn.norm.reads(x, dyn.W))


class ValueNoise(AbstractNoise):
    """Common noise through the value matrix: one matrix Brownian motion `B_t ∈ R^{d×d}`
    per system, shared by its tokens: `dx_i = v_i dt + σ P_{x_i} dB_t m_i` (Itô), with
    `m_i` the heads' mean attention-weighted token (`attention_mean`). A layer of
    `ja.run_layers` adds `σ √τ P_{x_i} G_ℓ m_i` (`G_ℓ` Gaussian, drawn per layer);
    `ja.solve_flow` takes Euler–Maruyama (`diffrax.Euler()`) by default, the layers'
    Itô limit. Derivation and references: `docs/noise.md`.

    **Arguments:**

    - `sigma`: the strength `σ ≥ 0`.
    """

    def shape(self, n, d):
        return (d, d)

    def kick(self, dyn, t, x, dB):
        m = attention_mean(dyn, t, x)
        moved = einsum("ab,nb->na", dB, m, precision="float32")
        return self.sigma * tangent(project(x, dyn.W), moved, dyn.W)

    @property
    def default_solver(self):
        return dfx.Euler()


def check_noise(noise, key, *, shard="batch"):
    """`(noise, key)` checked, or `(None, None)` for the deterministic dynamics."""
    if noise is None and key is None:
        return None, None
    try:
        key = key if key is None or isinstance(key, jax.Array) else jnp.asarray(key)
    except (TypeError, ValueError):
        pass
    array, one_key = hasattr(key, "dtype"), is_one_key(key)
    refuse_first((
        (noise is None, ValueError, "`key=` draws the noise: pass `noise=ja.TokenNoise(sigma)` "
         "or `ja.ValueNoise(sigma)`, or drop `key`."),
        (not isinstance(noise, AbstractNoise), TypeError, "`noise` must be ja.TokenNoise(sigma) "
         f"or ja.ValueNoise(sigma), got {type(noise).__name__}."),
        (key is None, ValueError, "`noise=` needs a random key: pass `key=jax.random.key(seed)`."),
        (not one_key, TypeError, "`key` must be one JAX key (jax.random.key(seed) or "
         "PRNGKey(seed)), got " + (f"dtype {key.dtype} and shape {key.shape}." if array
                                   else f"{type(key).__name__}.")),
        (shard != "batch", ValueError, "noise splits systems over devices (shard=\"batch\"), not "
         "one system's tokens: drop shard=\"tokens\"."),
    ))
    return noise, key


def system_keys(key: PRNGKeyArray, batch: tuple[int, ...]) -> PRNGKeyArray:
    """One key per system: `key` itself for one system, else `jax.random.split(key, B)`
    in the order of the flattened batch, shaped `batch`."""
    if not batch:
        return key
    keys = jax.random.split(key, math.prod(batch))
    return keys.reshape(tuple(batch) + keys.shape[1:])


def map_keyed(fn, dyn, x0: Float[Array, "*batch n d"], keys, *, fused: bool = False,
              chunk: int | None = None):
    """`fn(model, x, key)` for every system `x` `(n, d)` of `x0` with its key, one
    vmapped program; outputs get the batch axes of `x0` in front.

    With `fused=True`, as `jaxattn._stacked.map_systems` runs its fused path: `fn` gets
    a chunk of systems `(n, d, B)`, the model with its batched leaves as `LastAxis`
    values, and the chunk's `B` keys (a key array `(B,)`, or `(B, 2)` raw keys), and
    returns leaves with the systems last."""
    typed = jnp.issubdtype(keys.dtype, jax.dtypes.prng_key)
    impl = jax.random.key_impl(keys) if typed else None

    def program(model, x, key, fused):
        if fused:  # the key data of the chunk, systems last: back to `B` keys
            key = jnp.moveaxis(key, -1, 0)
            key = jax.random.wrap_key_data(key, impl=impl) if typed else key
        return fn(model, x, key)

    data = jax.random.key_data(keys) if typed and fused else keys
    return map_systems(program, dyn, x0, data, fused=fused, chunk=chunk)


def brownian_path(noise: AbstractNoise, key, t0, t1, n: int, d: int, dtype
                  ) -> dfx.VirtualBrownianTree:
    """The Brownian motion of one system on `[t0, t1]`: a function of `key` (and the
    interval) only, the same path whatever step reads it (to `BROWNIAN_TOL`)."""
    shape = jax.ShapeDtypeStruct(noise.shape(n, d), dtype)
    return dfx.VirtualBrownianTree(t0, jnp.maximum(t1, t0 + BROWNIAN_TOL), BROWNIAN_TOL,
                                   shape, key)


def sde_terms(noise: AbstractNoise, path: dfx.VirtualBrownianTree, n: int, d: int, dtype,
              field) -> dfx.MultiTerm:
    """`MultiTerm(ODETerm(drift), ControlTerm(σ P_x (·), B))`; `args` is the model."""
    structure = jax.ShapeDtypeStruct(noise.shape(n, d), dtype)

    def diffusion(t, x, dyn):
        return lx.FunctionLinearOperator(lambda dB: noise.kick(dyn, t, x, dB), structure)

    return dfx.MultiTerm(dfx.ODETerm(field), dfx.ControlTerm(diffusion, path))


def noisy_layer(dyn: SelfAttentionDynamics, noise: AbstractNoise, t, x: Float[Array, "n d"],
                tau, xi) -> Float[Array, "n d"]:
    """One layer with noise: the increment `σ √τ P_x ξ (·)` (`noise.kick` of `√τ ξ`,
    `ξ` standard normal) added where the update enters, before the normalisation (the
    norm placement's `step` with a `kick`; per placement: `docs/noise.md`, "Discrete
    layers")."""
    kick = noise.kick(dyn, t, x, jnp.sqrt(tau) * xi)
    return dyn.norm.step(functools.partial(dyn.raw_update, t), x, tau, dyn.W, kick)


def layer_normal(noise: AbstractNoise, key, k, n: int, d: int, dtype):
    """`ξ` of layer `k` (a float holding an integer): standard normal from
    `fold_in(key, k)`."""
    return jax.random.normal(jax.random.fold_in(key, k.astype(jnp.int32)),
                             noise.shape(n, d), dtype)

