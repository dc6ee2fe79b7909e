"""The discrete model: a stack of attention layers (paper 001 eq. 4) as a `lax.scan`."""

import math
from collections.abc import Callable
from typing import Any

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PyTree, Real

from ._batch import call_batched, check_shard, check_token_shape, map_systems, prepare_tokens
from ._dynamics import SelfAttentionDynamics
from ._ensemble import (
    BatchLast,
    batch_last,
    choose_strategy,
    chunk_size,
    from_batch_last,
    to_batch_last,
)
from ._noise import AbstractNoise, check_noise, layer_normal, map_keyed, noisy_layer, system_keys
from ._pallas import kernel_config, key_rows, refuse_devices, run_ensemble
from ._stacked import first_model, map_models, models_last, stack_tokens
from ._validate import NONFINITE, check_count, check_scalar, raise_unless, surface_errors


def _identity(x):
    return x


def _layer(x, dyn, t, tau):
    return dyn.layer(t, x, tau)


def _run(
    layer: Callable,
    x0: Float[Array, "n d"],
    num_layers: int,
    tau: Real[Array, ""],
    observe: Callable,
    checkpoints: int | None,
) -> PyTree[Array]:
    """The layers from `x0` with `layer(x, k, tau)` (`k` the layer's index, a float):
    one sequence (general path) or the ensemble with the systems on the last axis
    (fused path)."""
    def step(x, k):
        x_next = layer(x, k, tau)
        return x_next, observe(x_next)

    ks = jnp.arange(num_layers, dtype=x0.dtype)
    if checkpoints is None:
        # Checkpointing the body keeps only each layer's tokens for the backward
        # pass, not its (h, n, n) attention matrices.
        last, ys = jax.lax.scan(jax.checkpoint(step, prevent_cse=False), x0, ks)
    elif checkpoints == "sqrt":
        last, ys = _segmented_scan(step, x0, ks)
    else:
        # Recursive (treeverse) checkpointing: memory O(checkpoints), not O(layers).
        last, ys = eqxi.scan(step, x0, ks, kind="checkpointed", checkpoints=checkpoints)
    first = observe(x0)
    return last, jax.tree.map(lambda a, b: jnp.concatenate([a[None], b]), first, ys)


def _segmented_scan(step, x0, ks):
    """`lax.scan(step, x0, ks)` in segments of `s = ⌈√L⌉` layers, each segment
    checkpointed as a whole: reverse mode stores the tokens at segment boundaries
    and, while it differentiates one segment, that segment's intermediates —
    `O(√L)` memory — and recomputes every layer once, as per-layer checkpointing
    does (the layers inside a segment are not checkpointed again: that would
    recompute each layer twice)."""
    L = ks.shape[0]
    seg = max(1, math.isqrt(L - 1) + 1) if L else 1
    body = L - L % seg

    def segment(x, k_seg):
        return jax.lax.scan(step, x, k_seg)

    # prevent_cse=False: inside a scan CSE cannot merge the recomputation away.
    x, ys = jax.lax.scan(jax.checkpoint(segment, prevent_cse=False), x0,
                         ks[:body].reshape(-1, seg))
    ys = jax.tree.map(lambda a: a.reshape((body,) + a.shape[2:]), ys)
    if body == L:
        return x, ys
    x, tail = jax.lax.scan(jax.checkpoint(step, prevent_cse=False), x, ks[body:])
    return x, jax.tree.map(lambda a, b: jnp.concatenate([a, b]), ys, tail)


@eqx.filter_jit
def _run_batched(dyn, x0, num_layers, tau, observe, checkpoints, checks, fused=False,
                 chunk=None):
    x0 = map_models(lambda d, x: prepare_tokens(d, x, checks=checks), dyn, x0)
    tau = tau.astype(x0.dtype)

    def program(d, x, fused):
        layer, watch = (batch_last(_layer), batch_last(observe)) if fused else (_layer, observe)
        return _run(lambda z, k, tau: layer(z, d, k * tau, tau), x, num_layers, tau, watch,
                    checkpoints)

    last, ys = map_systems(program, dyn, x0, fused=fused, chunk=chunk)
    # NaN propagates through the layers, so the last tokens tell whether any appeared.
    finite = jnp.all(jnp.isfinite(last), axis=(-2, -1))
    if checks:
        ys = eqx.error_if(ys, ~jnp.all(finite), NONFINITE)
    return ys, finite


def _noisy(x, dyn, noise, t, tau, xi):
    return noisy_layer(dyn, noise, t, x, tau, xi)


def _fused_normal(noise, keys, k, n, d, dtype):
    """Layer `k`'s `ξ` of a chunk of systems, `(*noise.shape(n, d), B)`: each system's
    `layer_normal` from its own key, as the general path draws it."""
    xi = jax.vmap(lambda key: layer_normal(noise, key, k, n, d, dtype))(keys)
    return BatchLast(jnp.moveaxis(xi, 0, -1))


@eqx.filter_jit
def _run_noisy(dyn, x0, num_layers, tau, observe, checkpoints, checks, fused=False,
               chunk=None, noise=None, keys=None):
    """`_run_batched` with noise: each system its own key (`system_keys`), layer `k`
    drawing its `ξ` from `fold_in(key, k)`, on either path."""
    x0 = map_models(lambda d, x: prepare_tokens(d, x, checks=checks), dyn, x0)
    tau = tau.astype(x0.dtype)

    def program(d, x, key):
        if fused:
            n, dim = x.shape[:2]
            fused_layer, watch = batch_last(_noisy), batch_last(observe)

            def layer(z, k, tau):
                xi = _fused_normal(noise, key, k, n, dim, z.dtype)
                return fused_layer(z, d, noise, k * tau, tau, xi)
            return _run(layer, x, num_layers, tau, watch, checkpoints)

        def layer(z, k, tau):
            xi = layer_normal(noise, key, k, *z.shape, z.dtype)
            return noisy_layer(d, noise, k * tau, z, tau, xi)
        return _run(layer, x, num_layers, tau, observe, checkpoints)

    last, ys = map_keyed(program, dyn, x0, keys, fused=fused, chunk=chunk)
    finite = jnp.all(jnp.isfinite(last), axis=(-2, -1))
    if checks:
        ys = eqx.error_if(ys, ~jnp.all(finite), NONFINITE)
    return ys, finite


def _kernel_layer(x, k, params):
    dyn, tau = params
    return dyn.layer(k * tau, x, tau)


def _kernel_noisy_layer(x, k, params):
    """A noisy layer as the other paths run it, `ξ` drawn from the system's key."""
    dyn, noise, tau, key = params
    xi = layer_normal(noise, key, k, *x.shape, x.dtype)
    return noisy_layer(dyn, noise, k * tau, x, tau, xi)


@eqx.filter_jit
def _run_kernel(dyn, x0, num_layers, tau, observe, config, checks, noise=None, keys=None):
    """`_run_batched` as one Pallas kernel (`strategy="kernel"`, `jaxattn._pallas`):
    the same layer (`dyn.layer`, or `noisy_layer` with each system's `ξ` drawn in the
    kernel from its key as the other paths draw it) and `observe`."""
    x0 = map_models(lambda d, x: prepare_tokens(d, x, checks=checks), dyn, x0)
    tau = tau.astype(x0.dtype)
    batch = x0.shape[:-2]
    model = models_last(dyn, batch)
    if noise is None:
        step, params = _kernel_layer, (model, tau)
    else:
        step, params = _kernel_noisy_layer, (model, noise, tau, key_rows(keys, batch))
    ys, last = run_ensemble(step, lambda x, _: observe(x), to_batch_last(x0), params,
                            num_saves=num_layers, steps_per_save=1, config=config)
    ys, last = from_batch_last(ys, batch), from_batch_last(last, batch)
    finite = jnp.all(jnp.isfinite(last), axis=(-2, -1))
    if checks:
        ys = eqx.error_if(ys, ~jnp.all(finite), NONFINITE)
    return ys, finite


def run_layers_unchecked(dyn, x0, num_layers: int, tau, *, strategy: str = "auto"
                         ) -> tuple[Array, Array]:
    """`run_layers` without value checks, for batches that are vmapped or sharded
    by the caller: the tokens after each layer and, per sequence, whether they
    stayed finite. `x0` must be finite and have no zero token, `tau` > 0; `dyn` may
    be a stacked model (as in `run_layers`)."""
    tau = jnp.asarray(tau)
    dyn, x0, unflatten = stack_tokens(dyn, x0)
    chosen = choose_strategy(first_model(dyn), jnp.shape(x0), strategy, (dyn, x0))
    if chosen == "kernel":
        return unflatten(_run_kernel(dyn, x0, check_count(num_layers, "num_layers"), tau,
                                     _identity, kernel_config(), False))
    fused = chosen == "fused"
    return unflatten(_run_batched(dyn, x0, check_count(num_layers, "num_layers"), tau,
                                  _identity, None, False, fused, chunk_size()))


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
    strategy: str = "auto",
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
    - `strategy`: how a batch is executed. `"auto"` (default) takes the fused
      ensemble path for a batch of small systems (`jaxattn._ensemble.fused_applies`:
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
    if devices is not None and dyn is not first_model(dyn):
        raise ValueError("`devices=` shards one model's batch: run a stacked model "
                         "without `devices`, or shard the models yourself.")
    if noise is not None:
        x0 = check_token_shape(first_model(dyn), x0)
        keys = system_keys(key, x0.shape[:-2])
        chosen = choose_strategy(first_model(dyn), x0.shape, strategy, (dyn, x0))
        if chosen == "kernel":
            refuse_devices(devices)
            (ys, finite), checked = call_batched(_run_kernel, dyn, x0, None, num_layers, tau,
                                                 observe, kernel_config(), noise=noise,
                                                 keys=keys)
            if not checked:
                raise_unless(finite, NONFINITE)
            return unflatten(ys)
        fused = chosen == "fused"
        (ys, finite), checked = call_batched(
            _run_noisy, dyn, x0, devices, num_layers, tau, observe, checkpoints, fused=fused,
            chunk=chunk_size(devices) if fused else None, noise=noise, keys=keys)
        if not checked:
            raise_unless(finite, NONFINITE)
        return unflatten(ys)
    shard = check_shard(shard, dyn, first_model(dyn))
    chosen = choose_strategy(first_model(dyn), jnp.shape(x0), strategy, (dyn, x0))
    if chosen == "kernel":
        refuse_devices(devices, shard)
        (ys, finite), checked = call_batched(_run_kernel, dyn, x0, None, num_layers, tau,
                                             observe, kernel_config())
        if not checked:
            raise_unless(finite, NONFINITE)
        return unflatten(ys)
    fused = shard == "batch" and chosen == "fused"
    (ys, finite), checked = call_batched(_run_batched, dyn, x0, devices, num_layers, tau,
                                         observe, checkpoints, fused=fused,
                                         chunk=chunk_size(devices), shard=shard)
    if not checked:
        raise_unless(finite, NONFINITE)
    return unflatten(ys)
