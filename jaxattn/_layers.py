"""The discrete model: a stack of attention layers (paper 001 eq. 4). How a batch runs
is its strategy's (`jaxattn._strategy`); here the arguments are checked once and
handed over."""

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
from jaxtyping import Array, Float, PyTree

from ._batch import check_shard, check_token_shape
from ._dynamics import SelfAttentionDynamics
from ._noise import AbstractNoise, check_noise, system_keys
from ._stacked import first_model, stack_tokens
from ._strategy import AbstractStrategy, choose_strategy
from ._validate import NONFINITE, check_count, check_scalar, raise_unless, surface_errors


def _identity(x):
    return x


def run_layers_unchecked(dyn, x0, num_layers: int, tau, *,
                         strategy: str | AbstractStrategy = "auto") -> tuple[Array, Array]:
    """`run_layers` without value checks, for batches that are vmapped or sharded
    by the caller: the tokens after each layer and, per sequence, whether they
    stayed finite. `x0` must be finite and have no zero token, `tau` > 0; `dyn` may
    be a stacked model (as in `run_layers`)."""
    tau = jnp.asarray(tau)
    dyn, x0, unflatten = stack_tokens(dyn, x0)
    member = choose_strategy(first_model(dyn), jnp.shape(x0), strategy, (dyn, x0))
    out, _ = member.run_layers(dyn, x0, check_count(num_layers, "num_layers"), tau,
                               _identity, None, devices=None, shard="batch", noise=None,
                               keys=None, checked=False)
    return unflatten(out)


@surface_errors
def run_layers(
    dyn: SelfAttentionDynamics,
    x0: Float[Array, "*batch n d"],
    num_layers: int,
    tau: float = 1.0,
    *,
    observe: Callable[[Float[Array, "n d"]], PyTree[Any]] | None = None,
    checkpoints: int | str | None = None,
    devices=None,
    strategy: str | AbstractStrategy = "auto",
    shard: str = "batch",
    noise: AbstractNoise | None = None,
    key=None,
) -> Float[Array, "*batch L+1 n d"] | PyTree[Array]:
    """Run `num_layers` discrete attention layers (paper 001 eq. 4).

    Layer `k` maps `x(k) ↦ x(k+1)`, reading time-varying weights at `t = kτ`, with
    `v_i = Σ_η Σ_j α^η_ij U_η x_j` (`dyn.raw_update`) and `N = N_W`, by the
    model's `norm` (`dyn.layer`):

    | `norm`           | `x_i(k+1) =`                                   |
    |------------------|------------------------------------------------|
    | `"post"` (eq. 4) | `N(x_i + τ v_i(x))`                            |
    | `"pre"`          | `x_i + τ v_i(N(x))`                            |
    | `"peri"`         | `x_i + τ N(v_i(N(x)))`                         |
    | `"ngpt"`         | `N(x_i + τ (N(v_i(x)) − x_i))`                 |
    | `"none"`         | `x_i + τ v_i(x)`                               |

    (`N(0) = 0`: a zero update stays zero.) `"post"` and `"ngpt"` keep the tokens
    on `E_W`; the others let them leave it. Compiled once per shape; leading axes
    of `x0` are a batch, run as one vmapped program.

    **Arguments:**

    - `dyn`: the model, a `ja.SelfAttentionDynamics`; or a stacked model, one per
      instance (`eqx.filter_vmap(make_model)(keys)`: its array leaves carry leading
      batch axes `(*models,)`; see `jaxattn._stacked`), which runs tokens
      `(*models, ..., n, d)`, model `m` on `x0[m]`, on the same paths.
    - `x0`: initial tokens `(..., n, d)`; rows are normalised onto `E_W` first.
      NaN/inf entries or zero tokens raise an error; a zero-size batch axis gives
      an empty result.
    - `num_layers`: number of layers `L ≥ 0`.
    - `tau`: step size `τ > 0` (default 1); a traced scalar too, so `jax.vmap` over a
      vector of `τ`s runs them all in one compiled program
      (`jax.vmap(lambda t: ja.run_layers(dyn, x0, L, t))(taus)`; `docs/noise.md`,
      "Batching over σ, β and τ").
    - `observe`: optional function of one sequence's tokens `(n, d)` (e.g.
      `ja.misalignment`), evaluated after every layer inside the same compiled
      program; its outputs are returned instead of the tokens, so a long run
      keeps only what is observed. Pass one function object (it is part of the
      compiled program's identity).
    - `checkpoints`: `None` (default) checkpoints every layer: reverse mode stores
      each layer's tokens but not its attention matrices. An int `c` uses
      recursive checkpointing with `c` stored states: gradient memory independent
      of `L`, at the price of recomputation (no forward-mode autodiff then).
      `"sqrt"` checkpoints segments of `⌈√L⌉` layers: memory `O(√L)` (the segment
      boundaries, and one segment's attention matrices at a time) and each layer
      recomputed once, as with `None`: the same gradient cost with memory
      sub-linear in `L`.
    - `devices`: shard the batch over devices (`None`, an int, a list of devices
      or a `Mesh`; see `docs/multihost.md`): each device runs the layers of its
      share of the batch. Its results are bit for bit those of an unsharded run
      of that share (other batch sizes agree to rounding: XLA compiles each size
      separately); bad tokens raise a `ValueError` before the run and non-finite
      results an error after it.
    - `strategy`: how a batch is executed, a member of `ja.AbstractStrategy` (as
      diffrax takes `solver=`) or its shorthand: `ja.Vmap()` (`"general"`),
      `ja.BatchLast()` (`"fused"`), `ja.PallasKernel(block=…, num_warps=…)`
      (`"kernel"`; `docs/usage/strategies.md`). `"auto"` (default) takes the fused
      ensemble path for a batch of small systems (`jaxattn._strategy.fused_applies`:
      at least two sequences, each of at most `FUSED_MAX_FLOPS` flops per layer), else
      `"general"`. `"fused"` puts the batch on the last axis and runs each layer
      as a few elementwise kernels over all systems (`jaxattn._ensemble`; S1 of
      the benchmarks, 1000 systems of 10 tokens in R³, runs faster than the
      general path: see BENCHMARKS.md, Measured claims behind design choices);
      `"general"` vmaps `dyn.layer` over the batch. `"kernel"` runs the whole run of
      a block of systems as one Pallas kernel (`jaxattn._pallas`, `docs/kernels.md`:
      compiled on CUDA, interpreted elsewhere; one device, not differentiable;
      never chosen by `"auto"` yet). All compute the same formulas (`dyn.layer`,
      `observe`) at the same precision and agree to rounding; with noise, the same
      `ξ` on every path.
    - `shard`: what `devices` split. `"batch"` (default): the systems, as above.
      `"tokens"`: each system's tokens (`n` a multiple of the device count), for
      one system too large for one device: attention runs as a ring over the
      devices (`jaxattn._blocks.ring_attention`: each keeps `n / D` tokens and passes
      its keys on, `D` hops per layer), every other step where the tokens are.
      Equal to the one-device blocked run to rounding; on several hosts, as for
      the batch (`docs/multihost.md`).
    - `noise`: `None` (default, the deterministic layers) or `ja.TokenNoise(σ)` /
      `ja.ValueNoise(σ)`: each layer adds `σ √τ P_x ξ` (`ξ` standard normal per
      token, or one `d × d` Gaussian matrix per system applied to the attention's
      mean token) where the update enters, before the normalisation
      (`jaxattn._noise.noisy_layer`; `docs/noise.md`). `devices=` splits the
      systems with their keys (not `shard="tokens"`); `strategy` as
      for the deterministic layers, both paths drawing the same `ξ`.
    - `key`: the JAX key of the noise (required with `noise`). One system uses it
      as is; a batch gives system `b` (in the order of the flattened batch)
      `jax.random.split(key, B)[b]`; layer `k` draws from `fold_in(key_b, k)`. One
      key gives one path, bit for bit, on every call.

    **Returns:**

    The tokens after each layer, `(..., L + 1, n, d)`; index 0 is the (normalised)
    input. With `observe`, its outputs stacked the same way.
    """
    num_layers = check_count(num_layers, "num_layers")
    if isinstance(checkpoints, str):
        if checkpoints != "sqrt":
            raise ValueError(
                f"`checkpoints` must be None, a positive int or \"sqrt\", got {checkpoints!r}."
            )
    elif checkpoints is not None:
        checkpoints = check_count(checkpoints, "checkpoints")
        if checkpoints < 1:
            raise ValueError("`checkpoints` must be ≥ 1 (or None).")
    dtype = jnp.result_type(float)  # τ = 1e40 is inf in float32, 1e-50 is 0
    tau = jnp.asarray(check_scalar(tau, "tau", positive=True, dtype=dtype), dtype)
    observe = _identity if observe is None else observe
    if not callable(observe):
        raise TypeError(f"`observe` must be a function of (n, d) tokens, got {observe!r}.")
    noise, key = check_noise(noise, key, shard=shard)
    dyn, x0, unflatten = stack_tokens(dyn, x0)
    one = first_model(dyn)
    if devices is not None and dyn is not one:
        raise ValueError("`devices=` shards one model's batch: run a stacked model "
                         "without `devices`, or shard the models yourself.")
    keys = None
    if noise is not None:
        x0 = check_token_shape(one, x0)
        keys = system_keys(key, x0.shape[:-2])
    else:
        shard = check_shard(shard, dyn, one)
    member = choose_strategy(one, jnp.shape(x0), strategy, (dyn, x0), shard=shard)
    (ys, finite), checked = member.run_layers(
        dyn, x0, num_layers, tau, observe, checkpoints, devices=devices, shard=shard,
        noise=noise, keys=keys)
    if not checked:
        raise_unless(finite, NONFINITE)
    return unflatten(ys)
