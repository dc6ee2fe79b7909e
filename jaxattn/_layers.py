"""The discrete model: a stack of attention layers (paper 001 eq. 4) as a `lax.scan`."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Real

from ._batch import map_batch, prepare_tokens
from ._dynamics import SelfAttentionDynamics
from ._validate import as_float_array, check_count, check_scalar


def _run(
    dyn: SelfAttentionDynamics, x0: Float[Array, "n d"], num_layers: int, tau: Real[Array, ""]
) -> Float[Array, "L+1 n d"]:
    # Checkpointing the body keeps only each layer's output for the backward pass,
    # not its (h, n, n) attention matrices: gradient memory is that of the trajectory.
    @jax.checkpoint
    def step(x, k):
        x_next = dyn.layer(k * tau, x, tau)
        return x_next, x_next

    ks = jnp.arange(num_layers, dtype=x0.dtype)
    _, xs = jax.lax.scan(step, x0, ks)
    return jnp.concatenate([x0[None], xs])


def run_layers(
    dyn: SelfAttentionDynamics,
    x0: Float[Array, "*batch n d"],
    num_layers: int,
    tau: float = 1.0,
) -> Float[Array, "*batch L+1 n d"]:
    """Run `num_layers` discrete attention layers (paper 001 eq. 4).

    Layer `k` maps `x(k) ↦ x(k+1) = N_W(x(k) + τ v(kτ, x(k)))`, reading
    time-varying weights at `t = kτ`. Compiled once per shape; leading axes of
    `x0` are a batch, run as one vmapped program.

    **Arguments:**

    - `dyn`: the model, a `ja.SelfAttentionDynamics`.
    - `x0`: initial tokens `(..., n, d)`; rows are normalised onto `E_W` first.
      NaN/inf entries or zero tokens raise an error.
    - `num_layers`: number of layers `L ≥ 0`.
    - `tau`: step size `τ > 0` (default 1).

    **Returns:**

    The tokens after each layer, `(..., L + 1, n, d)`; index 0 is the (normalised)
    input.
    """
    num_layers = check_count(num_layers, "num_layers")
    tau = jnp.asarray(check_scalar(tau, "tau", positive=True))
    return _run_batched(dyn, as_float_array(x0, "x0"), num_layers, tau)


@eqx.filter_jit
def _run_batched(dyn, x0, num_layers: int, tau):
    x0 = prepare_tokens(dyn, x0)
    return map_batch(lambda x: _run(dyn, x, num_layers, tau.astype(x.dtype)), x0)
