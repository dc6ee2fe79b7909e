"""Running a simulation in pieces under a progress bar: the flow (eq. 6) on equally
spaced save times and the discrete layers (eq. 4), each cut by `Horizon` into up to
20 pieces, and `shift_time`, which restarts a model's clock at a piece's start; and
`keyed_layers`, noisy layers in fixed blocks of systems (the same bits on any number
of devices or processes)."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jaxtyping import Array, Float
from tqdm.auto import tqdm

from .._batch import map_blocks, replicate
from .._dynamics import SelfAttentionDynamics
from .._flow import solve_flow
from .._horizon import Horizon
from .._layers import run_layers
from .._process.distributed import gather, global_mesh
from .._programs import kept_jit
from .._schedule import AbstractSchedule
from .._stacked import first_model
from .._strategy import choose_strategy
from .._validate import NONFINITE, raise_unless


def advance(step: Callable[[int, Any], tuple[Any, Any]], state, num_pieces: int, *,
            desc: str, progress: bool):
    """Run `state, out_k = step(k, state)` for `k < num_pieces` under a progress bar;
    the final state and the list of outputs."""
    outs = []
    with tqdm(total=num_pieces, desc=desc, unit="piece", disable=not progress, leave=False) as bar:
        for k in range(num_pieces):
            state, out = step(k, state)
            jax.block_until_ready(out)
            outs.append(out)
            bar.update()
    return state, outs


def flow_path(dyn, x0, horizon: float, saves: int, *, progress: bool, desc: str, **solve_kw):
    """Solve the flow (eq. 6) on `saves + 1` equally spaced times of `[0, horizon]`, in
    up to 20 equal pieces (`Horizon.pieces`; the adaptive solver restarts at each
    piece's start, a save time) so that a progress bar can follow it; `solve_kw` go to
    `solve_flow`.

    **Returns:**

    `ts (saves + 1,)` and the states `(..., saves + 1, n, d)`, NumPy arrays.
    """
    ts = Horizon(horizon).save_times(saves)

    def piece(k, x, m):
        return solve_flow(dyn, x, jax.device_put(ts[k * m : (k + 1) * m + 1]), **solve_kw)

    return ts, _in_pieces(piece, x0, saves, progress=progress, desc=desc)


def layer_path(dyn, x0, horizon: float, tau: float, *, progress: bool, desc: str):
    """Run `Horizon(horizon).num_layers(τ)` discrete layers (eq. 4) in up to 20 pieces.

    **Returns:**

    `ts = kτ (L + 1,)` and the states (as in `flow_path`).
    """
    def piece(k, x, m):
        return run_layers(shift_time(dyn, k * m * tau), x, m, tau)

    ys = _in_pieces(piece, x0, Horizon(horizon).num_layers(tau), progress=progress, desc=desc)
    return Horizon(horizon).layer_times(tau), ys


def _in_pieces(piece, x0, steps: int, *, progress: bool, desc: str):
    """`steps` steps from `x0` as `Horizon.pieces(steps)` calls `piece(k, x, m)` of `m`
    steps each (its states `(..., m + 1, n, d)`), joined in time on the host (slicing
    and joining device arrays would compile a program each, as can `jnp.asarray` of a
    host array: the next piece's start is moved by `jax.device_put`)."""
    pieces = Horizon.pieces(steps)
    m = steps // pieces

    def step(k, x):
        ys = np.asarray(piece(k, x, m))
        return jax.device_put(ys[..., -1, :, :]), ys if k == 0 else ys[..., 1:, :, :]

    _, outs = advance(step, x0, pieces, desc=desc, progress=progress)
    return np.concatenate(outs, axis=np.ndim(x0) - 2)


# --- a model's clock restarted at a piece's start -------------------------------


class _Shifted(AbstractSchedule):
    """A schedule read `t0` later: `t ↦ inner(t + t0)`."""

    inner: AbstractSchedule
    t0: Float[Array, ""]

    def __call__(self, t):
        return self.inner(t + self.t0)

    def is_constant(self) -> bool:
        return self.inner.is_constant()


def shift_time(dyn: SelfAttentionDynamics, t0) -> SelfAttentionDynamics:
    """The same model with its clock started at `t0` (to run layers `k ≥ k₀` as a
    fresh stack: layer `k` of the result reads the weights at `t0 + kτ`)."""
    t0 = jnp.asarray(t0, jnp.result_type(float))
    for name in ("P", "Q", "K", "U"):
        if getattr(dyn, name) is not None:
            dyn = eqx.tree_at(lambda m, name=name: getattr(m, name), dyn,
                              _Shifted(getattr(dyn, name), t0))
    return dyn


def keyed_layers(dyn, x, keys, num_layers: int, tau, *, noise, block: int,
                 observe=None):
    """`ja.run_layers(dyn_b, x_b, num_layers, tau, noise=noise, key=keys_b)` for every
    system `b` of the stacked model `dyn` (leaves `(B, …)`) and tokens `x` `(B, n, d)`
    (on the sphere already), as NumPy arrays `(B, L + 1, …)` (`observe`'s outputs, if
    given): in blocks of `block` systems (padded by repeating systems), each block one
    program, so that a system's numbers are the same bits whatever the batch, device
    or process count. In a distributed run the blocks are split over every process's
    devices and gathered on each. A non-finite run raises as `run_layers` does."""
    mesh = global_mesh()
    arrays, static = eqx.partition(dyn, eqx.is_array)
    args = (arrays, x, keys)
    out, finite = gather(_keyed_program(*(args if mesh is None else replicate(args, mesh)),
                                        static, num_layers, tau, noise, observe, block,
                                        mesh))
    raise_unless(finite, NONFINITE)
    return jax.tree.map(np.asarray, out)


@kept_jit
def _keyed_program(arrays, x, keys, static, num_layers, tau, noise, observe, block: int,
                   mesh: Mesh | None):
    def run(b):  # one block: what `run_layers` runs, with the systems' own keys
        arrays, x, keys = b
        dyn = eqx.combine(arrays, static)
        member = choose_strategy(first_model(dyn), x.shape, "auto", (dyn, x))
        return member.run_layers(dyn, x, num_layers, jnp.asarray(tau, x.dtype),
                                 observe or _tokens, None, devices=None, shard="batch",
                                 noise=noise, keys=keys, checked=False)[0]

    return map_blocks(run, (arrays, x, keys), mesh, block=block)


def _tokens(x):
    return x
