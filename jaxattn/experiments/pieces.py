"""Running a simulation in pieces under a progress bar: the flow (eq. 6) on equally
spaced save times and the discrete layers (eq. 4), each cut by `Horizon` into up to
20 pieces, and `shift_time`, which restarts a model's clock at a piece's start."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float
from tqdm.auto import tqdm

from .._dynamics import SelfAttentionDynamics
from .._flow import solve_flow
from .._horizon import Horizon
from .._layers import run_layers
from .._schedule import AbstractSchedule


def advance(
    step: Callable[[int, Any], tuple[Any, Any]],
    state,
    num_pieces: int,
    *,
    desc: str,
    progress: bool,
):
    """Run `state, out_k = step(k, state)` for `k < num_pieces` under a progress bar.

    **Returns:**

    The final state and the list of outputs.
    """
    outs = []
    with tqdm(total=num_pieces, desc=desc, unit="piece", disable=not progress, leave=False) as bar:
        for k in range(num_pieces):
            state, out = step(k, state)
            jax.block_until_ready(out)
            outs.append(out)
            bar.update()
    return state, outs


def flow_path(
    dyn, x0, horizon: float, saves: int, *, progress: bool, desc: str, reduce=None, **solve_kw
):
    """Solve the flow (eq. 6) on `saves + 1` equally spaced times of `[0, horizon]`.

    Integrated in up to 20 equal pieces (`Horizon.pieces`; restarting the adaptive
    solver at each piece's start, which is also a save time) so that a progress bar
    can follow it.
    `reduce(ys)` maps each piece's `(..., m, n, d)` states to what is kept
    (default: the states).

    **Returns:**

    `ts (saves + 1,)` and the kept outputs concatenated along the time axis.
    """
    pieces = Horizon.pieces(saves)
    m = saves // pieces
    ts = Horizon(horizon).save_times(saves)
    reduce = reduce or (lambda ys: ys)

    def step(k, x):
        ys = solve_flow(dyn, x, jnp.asarray(ts[k * m : (k + 1) * m + 1]), **solve_kw)
        kept = ys if k == 0 else ys[..., 1:, :, :]
        return ys[..., -1, :, :], reduce(kept)

    _, outs = advance(step, x0, pieces, desc=desc, progress=progress)
    return ts, jnp.concatenate(outs, axis=_time_axis(x0))


def layer_path(dyn, x0, horizon: float, tau: float, *, progress: bool, desc: str, reduce=None):
    """Run `Horizon(horizon).num_layers(τ)` discrete layers (eq. 4) in up to 20 pieces.

    **Returns:**

    `ts = kτ (L + 1,)` and the kept outputs (as in `flow_path`).
    """
    num_layers = Horizon(horizon).num_layers(tau)
    pieces = Horizon.pieces(num_layers)
    m = num_layers // pieces
    reduce = reduce or (lambda ys: ys)

    def step(k, x):
        ys = run_layers(shift_time(dyn, k * m * tau), x, m, tau)
        kept = ys if k == 0 else ys[..., 1:, :, :]
        return ys[..., -1, :, :], reduce(kept)

    _, outs = advance(step, x0, pieces, desc=desc, progress=progress)
    return Horizon(horizon).layer_times(tau), jnp.concatenate(outs, axis=_time_axis(x0))


def _time_axis(x0) -> int:
    return jnp.ndim(x0) - 2


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
