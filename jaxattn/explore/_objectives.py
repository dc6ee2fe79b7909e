"""The objectives of the exploration, functions `(ts, ys, dyn) ↦ value ≥ 0` of one
trajectory `ys (T, n, d)`, and the trajectory they are read from: the flow
(`solve_flow`, a diffrax adjoint) or the layers (`run_layers`, a checkpointed scan)."""

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PyTree, Real

from .._batch import call_batched, check_token_shape, prepare_tokens
from .._dynamics import SelfAttentionDynamics
from .._flow import solve_flow_unchecked
from .._horizon import Horizon
from .._layers import run_layers_unchecked
from .._precision import einsum
from .._programs import kept_jit
from .._validate import check_count, check_scalar, checked, refuse_first, surface_errors
from ..metrics import misalignment, pairwise_misalignment

OBJECTIVES = ("pairwise", "final", "integrated", "consensus_time", "lyapunov")
#: The adjoints of the flow by name.
_ADJOINTS = {"checkpoint": dfx.RecursiveCheckpointAdjoint, "backsolve": dfx.BacksolveAdjoint}


# --- objectives ---------------------------------------------------------------------


# Module-level functions (and a module with fields): a search's programs name them, so
# another process loads those programs whole (`kept_jit`); a closure would be traced anew.
def _pairwise(ts, ys, dyn):
    return pairwise_misalignment(ys[-1], dyn.W)


def _final(ts, ys, dyn):
    return misalignment(ys[-1])


def _integrated(ts, ys, dyn):
    return jnp.trapezoid(misalignment(ys), ts)


def _lyapunov_final(ts, ys, dyn):
    x = ys[-1]
    if dyn.W is None:
        gram = einsum("id,jd->ij", x, x, precision=dyn.precision)
    else:
        Wx = einsum("de,je->jd", dyn.W, x, precision=dyn.precision)
        gram = einsum("id,jd->ij", x, Wx, precision=dyn.precision)
    return 1 - jnp.min(gram)


class _SoftTime(eqx.Module):
    """The smooth consensus time of `builtin_objective("consensus_time", eps, width)`."""

    eps: float
    width: float

    def __call__(self, ts, ys, dyn):
        logE = jnp.log(jnp.maximum(misalignment(ys), 1e-300))
        return jnp.trapezoid(jax.nn.sigmoid((logE - jnp.log(self.eps)) / self.width), ts)


_BUILTINS = {"pairwise": _pairwise, "final": _final, "integrated": _integrated,
             "lyapunov": _lyapunov_final}


def builtin_objective(name: str, eps: float = 1e-4, width: float = 1.0) -> Callable:
    """The built-in objectives as functions `(ts, ys, dyn) ↦ value ≥ 0`.

    - `"pairwise"`: the symmetric misalignment at the horizon,
      `pairwise_misalignment(x(T))` (the mean `1 − cos` over all pairs): maximised,
      it seeks states far from consensus whatever the tokens' order.
    - `"final"`: the misalignment at the horizon, `E(x(T))` (paper 001 eq. 25),
      measured against token 1: maximised, the optimiser parks tokens antipodal to
      token 1 (a two-cluster state, not a slow consensus).
    - `"integrated"`: `∫₀ᵀ E(x(t)) dt` (trapezoid on the saved times).
    - `"consensus_time"`: a smooth consensus time, `∫₀ᵀ σ((log E − log eps) / width) dt`
      (`σ` the logistic function): the time spent with `E` above `eps`, smoothed
      over `width` units of `log E`; it saturates at `T` if `E` never gets there.
    - `"lyapunov"`: the pairwise Lyapunov function `V(x(T)) = 1 − min_ij ⟨x_i, x_j⟩_W`.
    """
    if name not in OBJECTIVES:
        raise ValueError(f"unknown objective {name!r}: use one of {OBJECTIVES} or a function "
                         "(ts, ys[, dyn]) ↦ scalar.")
    if name != "consensus_time":
        return _BUILTINS[name]
    return _SoftTime(check_scalar(eps, "eps", positive=True),
                     check_scalar(width, "width", positive=True))


def as_objective(objective) -> tuple[Callable, bool]:
    """The objective as `(ts, ys, dyn) ↦ value`, and whether it is a built-in."""
    if not callable(objective):
        return builtin_objective(objective), True
    try:
        nargs = len(inspect.signature(objective).parameters)
    except (TypeError, ValueError):
        nargs = 3
    refuse_first([(nargs not in (2, 3), TypeError, "an objective is a function "
                   f"(ts, ys) ↦ scalar or (ts, ys, dyn) ↦ scalar; {objective!r} takes {nargs} "
                   "arguments.")])
    return _Objective(objective, nargs == 3), False


@dataclasses.dataclass(frozen=True)
class _Objective:
    """A user's objective as `(ts, ys, dyn) ↦ value`: equal for equal functions, so the
    programs that take it are reused."""

    fn: Callable
    takes_dyn: bool

    def __call__(self, ts, ys, dyn):
        return self.fn(ts, ys, dyn) if self.takes_dyn else self.fn(ts, ys)


def relative_difference(a: PyTree, b: PyTree) -> float:
    """`‖a − b‖ / ‖b‖`, the Euclidean norms over every leaf of two pytrees."""
    def norm(tree):
        return jnp.sqrt(sum(jnp.sum(leaf**2) for leaf in jax.tree.leaves(tree)))

    return float(norm(jax.tree.map(jnp.subtract, a, b)) / jnp.maximum(norm(b), 1e-300))


# --- the trajectory -----------------------------------------------------------------


class Trajectory(eqx.Module):
    """How the trajectory of an objective is computed: the flow to `T` (saved at
    `saves + 1` times) or `Horizon(T).num_layers(tau)` layers; adjoint and solver
    options of the flow."""

    model: str = eqx.field(static=True)
    ts: Real[Array, " T"]
    num_layers: int = eqx.field(static=True)
    tau: float = eqx.field(static=True)
    adjoint: dfx.AbstractAdjoint
    solver: dfx.AbstractSolver
    rtol: float = eqx.field(static=True)
    atol: float = eqx.field(static=True)
    max_steps: int = eqx.field(static=True)

    def run(self, dyn, x0: Float[Array, "n d"]) -> Float[Array, "T n d"]:
        """The tokens at the times `ts` from `x0` (on `E_W`); NaN if the run failed."""
        ys, ok = self.solve(dyn, x0)
        return jnp.where(ok, ys, jnp.nan)

    def solve(self, dyn, x0: Float[Array, "n d"]) -> tuple[Float[Array, "T n d"], Array]:
        """The tokens at the times `ts` from `x0` (on `E_W`), and whether the run
        reached the horizon (the flow within `max_steps`; the layers always do)."""
        # Unchecked runs (the tokens are on E_W by construction): one restart whose
        # run fails (step budget, overflow) must not abort the batch; its value
        # becomes NaN and the search rejects that step. They also leave no host
        # callback in the program, so sharded restarts split across devices.
        if self.model == "layers":
            return run_layers_unchecked(dyn, x0, self.num_layers, self.tau)[0], jnp.array(True)
        # Backsolve integrates an augmented state; the retraction wrapper only
        # knows token arrays, so that adjoint solves the ambient ODE. A placement
        # that leaves E_W is never retracted (`ja.solve_flow`'s default).
        on_manifold = dyn.stays_on_manifold and not isinstance(self.adjoint,
                                                               dfx.BacksolveAdjoint)
        out = solve_flow_unchecked(dyn, x0, self.ts, solver=self.solver, rtol=self.rtol,
                                   atol=self.atol, max_steps=self.max_steps,
                                   adjoint=self.adjoint, on_manifold=on_manifold)
        return out.ys, out.success


def make_trajectory(horizon, *, model="flow", saves=100, tau=0.1, adjoint="checkpoint",
                    solver=None, rtol=1e-6, atol=1e-8, max_steps=16384) -> Trajectory:
    """Check the trajectory options and bundle them.

    **Arguments:**

    - `horizon`: the final time `T > 0`.
    - `model`: `"flow"` or `"layers"`; `saves`: saved intervals of the flow;
      `tau`: the layer step; `adjoint`, `solver`, `rtol`, `atol`, `max_steps`: as in
      `slow_consensus` and `ja.solve_flow`.

    **Returns:**

    A `Trajectory`, or a `ValueError` naming the bad option.
    """
    hz = Horizon(check_scalar(horizon, "horizon", positive=True))  # not a string: "3" ran
    named = not isinstance(adjoint, dfx.AbstractAdjoint)
    refuse_first((
        (model not in ("flow", "layers"), f"`model` must be 'flow' or 'layers', got {model!r}."),
        (named and adjoint not in tuple(_ADJOINTS), "`adjoint` must be 'checkpoint', "
         f"'backsolve' or a diffrax adjoint, got {adjoint!r}."),
        (model == "layers" and adjoint != "checkpoint", f"adjoint={adjoint!r} is for "
         "model='flow': the layers are differentiated through their checkpointed scan; "
         "drop `adjoint`."),
    ))
    saves = check_count(saves, "saves", 1)
    num_layers = hz.num_layers(float(tau))
    ts = jnp.asarray(hz.save_times(saves) if model == "flow" else hz.layer_times(float(tau)),
                     jnp.result_type(float))
    return Trajectory(model, ts, num_layers, float(tau),
                      _ADJOINTS[adjoint]() if named else adjoint, solver or dfx.Tsit5(),
                      float(rtol), float(atol), int(max_steps))


@surface_errors
def consensus_objective(
    dyn: SelfAttentionDynamics,
    x0: Float[Array, "n d"],
    *,
    objective: str | Callable = "final",
    horizon: float = 5.0,
    **horizon_kw,
) -> Float[Array, ""]:
    """The value of an exploration objective for one start: differentiable in
    `x0` and in the model's arrays.

    **Arguments:**

    - `dyn`, `x0`: the model and one sequence of tokens `(n, d)` (normalised first).
    - `objective`, `horizon` and the keywords `model`, `saves`, `tau`, `adjoint`: as in
      `slow_consensus`; `solver`, `rtol`, `atol`, `max_steps`: the flow's solve
      (`make_trajectory`; `slow_consensus` keeps their defaults).

    **Returns:**

    The objective, a scalar. A flow that reaches `max_steps` before the horizon raises
    an error, as `ja.solve_flow` does (checked on the host for concrete inputs, in the
    program for traced ones).
    """
    fn, _ = as_objective(objective)
    return _objective(dyn, x0, fn, make_trajectory(horizon, **horizon_kw))


def _objective(dyn, x0, fn, traj: Trajectory, grad: bool = False):
    """The objective of one start, or with `grad` its gradient in `x0`: concrete tokens
    checked here (the program holds no check), traced ones inside the program."""
    x0 = check_token_shape(dyn, x0)
    refuse_first([(x0.ndim != 2, f"`x0` must be one sequence of tokens (n, d), got shape "
                                 f"{x0.shape}; use jax.vmap for a batch.")])
    out, ok = call_batched(_objective_jit, dyn, x0, None, fn, traj, grad=grad)[0]
    return checked(out, ok, "jaxattn: the flow solver reached `max_steps` before the horizon: "
                   "raise `max_steps` or shorten `horizon`.")


@kept_jit
def _objective_jit(dyn, x0, fn, traj: Trajectory, checks: bool, grad: bool = False):
    """The objective (or its gradient in `x0`) and whether the run reached the horizon."""
    def value(x):
        ys, ok = traj.solve(dyn, prepare_tokens(dyn, x, checks=checks))
        ys = jnp.where(ok, ys, jnp.nan)
        return fn(traj.ts.astype(ys.dtype), ys, dyn), ok

    return jax.grad(value, has_aux=True)(x0) if grad else value(x0)


# --- adjoints -----------------------------------------------------------------------


@surface_errors
def compare_adjoints(
    dyn: SelfAttentionDynamics,
    x0: Float[Array, "n d"],
    *,
    objective: str | Callable = "final",
    horizon: float = 5.0,
    **horizon_kw,
) -> dict[str, Any]:
    """The gradient of an objective w.r.t. `x0` by the checkpointed and the
    backsolve adjoints of the flow, and their relative difference.

    `BacksolveAdjoint` integrates the adjoint equation backwards in time; for a
    contracting flow (consensus) that reversed flow is expanding, so its gradient
    can be wrong by orders of magnitude while the checkpointed (discrete) adjoint
    is exact up to the solver's tolerance.

    **Returns:**

    `{"checkpoint": g, "backsolve": g, "relative_error": ‖g_bs − g_cp‖ / ‖g_cp‖}`.
    """
    horizon_kw = {k: v for k, v in horizon_kw.items() if k != "adjoint"}
    fn, _ = as_objective(objective)

    def grad(adjoint):
        traj = make_trajectory(horizon, adjoint=adjoint, **horizon_kw)
        return _objective(dyn, x0, fn, traj, grad=True)

    g_cp, g_bs = grad("checkpoint"), grad("backsolve")
    rel = relative_difference(g_bs, g_cp)
    return {"checkpoint": g_cp, "backsolve": g_bs, "relative_error": rel}
