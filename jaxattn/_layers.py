"""The discrete model: a stack of attention layers (paper 001 eq. 4). How a batch runs
is its strategy's (`jaxattn._strategy`); here the arguments are checked once and
handed over."""

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PyTree

from ._batch import check_run
from ._dynamics import SelfAttentionDynamics
from ._noise import AbstractNoise
from ._stacked import first_model, stack_tokens
from ._strategy import AbstractStrategy, choose_strategy
from ._validate import (
    NONFINITE,
    check_count,
    check_scalar,
    raise_unless,
    refuse_first,
    surface_errors,
    too_big,
)


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
    model's `norm` (`dyn.layer`; `N(0) = 0`):

    | `norm`           | `x_i(k+1) =`                   |
    |------------------|--------------------------------|
    | `"post"` (eq. 4) | `N(x_i + τ v_i(x))`            |
    | `"pre"`          | `x_i + τ v_i(N(x))`            |
    | `"peri"`         | `x_i + τ N(v_i(N(x)))`         |
    | `"ngpt"`         | `N(x_i + τ (N(v_i(x)) − x_i))` |
    | `"none"`         | `x_i + τ v_i(x)`               |

    Compiled once per shape; leading axes of `x0` are a batch, run as one vmapped
    program.

    **Arguments:**

    - `dyn`: the model, a `ja.SelfAttentionDynamics`; or a stacked model, one per
      instance (`eqx.filter_vmap(make_model)(keys)`, array leaves with leading batch
      axes `(*models,)`), running tokens `(*models, ..., n, d)`, model `m` on `x0[m]`.
    - `x0`: initial tokens `(..., n, d)`; rows are normalised onto `E_W` first.
      NaN/inf entries or zero tokens raise an error; a zero-size batch axis gives
      an empty result.
    - `num_layers`: number of layers `L ≥ 0`.
    - `tau`: step size `τ > 0` (default 1); a traced scalar too: `jax.vmap` over
      `τ`s is one compiled program.
    - `observe`: optional function of one sequence's tokens `(n, d)` (e.g.
      `ja.misalignment`), evaluated after every layer in the same program; its
      outputs are returned instead of the tokens (pass one function object: it
      keys the compiled program).
    - `checkpoints`: `None` (default) checkpoints every layer: reverse mode stores
      each layer's tokens, not its attention matrices. An int `c`: recursive
      checkpointing with `c` stored states, gradient memory independent of `L` at
      the price of recomputation (no forward mode then). `"sqrt"`: segments of
      `⌈√L⌉` layers, memory `O(√L)`, each layer recomputed once as with `None`.
    - `devices`: shard the batch over devices (`None`, an int, a list of devices or a
      `Mesh`; `docs/multihost.md`), bit for bit as an unsharded run of each share.
    - `strategy`: how a batch is executed (`docs/usage/strategies.md`): a member of
      `ja.AbstractStrategy` or its shorthand, `ja.Vmap()` (`"general"`),
      `ja.BatchLast()` (`"fused"`) or `ja.PallasKernel(...)` (`"kernel"`,
      `docs/kernels.md`); `"auto"` (default). All agree to rounding.
    - `shard`: what `devices` split: `"batch"` (default) the systems; `"tokens"`
      each system's tokens (`n` a multiple of the device count), attention a ring.
    - `noise`: `None` (default) or `ja.TokenNoise(σ)` / `ja.ValueNoise(σ)`: each layer
      adds `σ √τ` times a Gaussian kick where the update enters (`docs/noise.md`).
    - `key`: the noise's JAX key (required with `noise`): one system uses it as is,
      system `b` of a batch `jax.random.split(key, B)[b]`; layer `k` draws from
      `fold_in(key_b, k)`.

    **Returns:**

    The tokens after each layer, `(..., L + 1, n, d)`; index 0 is the (normalised)
    input. With `observe`, its outputs stacked the same way.
    """
    num_layers = check_count(num_layers, "num_layers")
    count = isinstance(checkpoints, int | np.integer) and not isinstance(checkpoints, bool)
    refuse_first((
        (not (checkpoints is None or checkpoints == "sqrt" or count and checkpoints >= 1),
         ValueError, f"`checkpoints` must be None, a positive int or \"sqrt\", got "
                     f"{checkpoints!r}."),
        (not callable(observe) and observe is not None, TypeError,
         f"`observe` must be a function of (n, d) tokens, got {observe!r}."),
    ))
    checkpoints = int(checkpoints) if count else checkpoints
    dtype = jnp.result_type(float)  # τ = 1e40 is inf in float32, 1e-50 is 0
    if observe is None:  # the tokens after every layer come back: refused past the memory
        refuse_first([too_big(
            float(np.prod(np.shape(x0), dtype=float)) * (num_layers + 1) * dtype.itemsize,
            f"the tokens after each of {num_layers} layers (`x0` {np.shape(x0)}) need",
            "pass fewer layers, or `observe=` a measure of them (e.g. ja.misalignment)")])
    else:  # one number a system and layer at least
        refuse_first([too_big(
            float(np.prod(np.shape(x0)[:-2], dtype=float)) * (num_layers + 1) * dtype.itemsize,
            f"a measure after each of {num_layers} layers of the systems {np.shape(x0)[:-2]} "
            "needs at least", "pass fewer layers")])
    observe = _identity if observe is None else observe
    tau = jnp.asarray(check_scalar(tau, "tau", positive=True, dtype=dtype), dtype)
    dyn, x0, unflatten, one, shard, noise, keys = check_run(dyn, x0, devices, shard, noise, key)
    member = choose_strategy(one, jnp.shape(x0), strategy, (dyn, x0, noise, tau), shard=shard)
    (ys, finite), checked = member.run_layers(
        dyn, x0, num_layers, tau, observe, checkpoints, devices=devices, shard=shard,
        noise=noise, keys=keys)
    if not checked:
        raise_unless(finite, NONFINITE)
    return unflatten(ys)
