"""The discrete model's programs: a stack of layers as a `lax.scan`, one system at a
time (`Vmap`) or a chunk of systems on the last axis (`BatchLast`), with or without
noise (paper 001 eq. 4; `jaxattn._noise.noisy_layer`)."""

import math
from collections.abc import Callable

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PyTree, Real

from .._batch import prepare_tokens
from .._ensemble import LastAxis, batch_last
from .._noise import layer_normal, map_keyed, noisy_layer
from .._programs import kept_jit
from .._stacked import map_models, map_systems
from .._validate import NONFINITE


def scan_layers(
    layer: Callable,
    x0: Float[Array, "n d"],
    num_layers: int,
    tau: Real[Array, ""],
    observe: Callable,
    checkpoints: int | str | None,
) -> tuple[Array, PyTree[Array]]:
    """The layers from `x0` with `layer(x, k, tau)` (`k` the layer's index, a float):
    one sequence, or the ensemble with the systems on the last axis. **Returns:** the
    last tokens and `observe` of every layer's, the input's first."""
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


def _layer(x, dyn, t, tau):
    return dyn.layer(t, x, tau)


def _noisy(x, dyn, noise, t, tau, xi):
    return noisy_layer(dyn, noise, t, x, tau, xi)


def _fused_normal(noise, keys, k, n, d, dtype):
    """Layer `k`'s `ξ` of a chunk of systems, `(*noise.shape(n, d), B)`: each system's
    `layer_normal` from its own key, as one system draws it."""
    xi = jax.vmap(lambda key: layer_normal(noise, key, k, n, d, dtype))(keys)
    return LastAxis(jnp.moveaxis(xi, 0, -1))


def layer_of(d, noise, key, fused: bool) -> Callable:
    """`layer(z, k, tau)` of one model `d` (a chunk's, on the last axis, when `fused`):
    `dyn.layer`, or with `noise` the noisy layer drawing `ξ` from the system's key."""
    if noise is None:
        step = batch_last(_layer) if fused else _layer
        return lambda z, k, tau: step(z, d, k * tau, tau)
    step, normal = (batch_last(_noisy), _fused_normal) if fused else (_noisy, layer_normal)

    def layer(z, k, tau):
        xi = normal(noise, key, k, *z.shape[:2], z.dtype)
        return step(z, d, noise, k * tau, tau, xi)
    return layer


@kept_jit
def layers_program(dyn, x0, num_layers, tau, observe, checkpoints, checks, fused=False,
                   chunk=None, noise=None, keys=None):
    """Every layer of a batch, on the general (`vmap`) or the fused path: `(ys,
    finite)`, `finite` per system. With `noise` each system has its own key
    (`system_keys`), layer `k` drawing its `ξ` from `fold_in(key, k)`, on either path."""
    x0 = map_models(lambda d, x: prepare_tokens(d, x, checks=checks), dyn, x0)
    tau = tau.astype(x0.dtype)
    watch = batch_last(observe) if fused else observe

    def program(d, x, key=None):
        return scan_layers(layer_of(d, noise, key, fused), x, num_layers, tau, watch,
                           checkpoints)

    if noise is None:
        last, ys = map_systems(lambda d, x, _: program(d, x), dyn, x0, fused=fused,
                               chunk=chunk)
    else:
        last, ys = map_keyed(program, dyn, x0, keys, fused=fused, chunk=chunk)
    # NaN propagates through the layers, so the last tokens tell whether any appeared.
    finite = jnp.all(jnp.isfinite(last), axis=(-2, -1))
    return flag_nonfinite(ys, finite, checks), finite


def flag_nonfinite(ys, finite, checks: bool):
    """`ys`, with `checks` an in-program error unless every system is `finite`."""
    return eqx.error_if(ys, ~jnp.all(finite), NONFINITE) if checks else ys
