"""The continuous model: the attention flow on the ellipsoid (paper 001 eq. 6),
integrated with diffrax and kept on the manifold. How a batch runs is its strategy's
(`jaxattn._strategy`); here the arguments are checked once and handed over."""

from collections.abc import Callable
from typing import ClassVar

import diffrax as dfx
import jax.numpy as jnp
import numpy as np
import optimistix as optx
from jaxtyping import Array, Float, Real

from ._batch import check_shard, check_token_shape
from ._dynamics import SelfAttentionDynamics
from ._noise import AbstractNoise, check_noise, system_keys
from ._stacked import first_model, stack_tokens
from ._strategy import (
    AbstractStrategy,
    Vmap,
    as_strategy,
    choose_strategy,
)
from ._strategy.solve import FlowResult as FlowResult
from ._strategy.solve import FlowSolution as FlowSolution
from ._strategy.solve import ManifoldSolver as ManifoldSolver
from ._strategy.solve import UserEvent
from ._validate import (
    as_float_array,
    check_count,
    check_flag,
    check_scalar,
    is_concrete,
    surface_errors,
)

_rk4_tableau = dfx.ButcherTableau(
    a_lower=(np.array([0.5]), np.array([0.0, 0.5]), np.array([0.0, 0.0, 1.0])),
    b_sol=np.array([1 / 6, 1 / 3, 1 / 3, 1 / 6]),
    # Embedded second-order (midpoint) estimate, so RK4 also runs adaptively.
    b_error=np.array([1 / 6, 1 / 3 - 1, 1 / 3, 1 / 6]),
    c=np.array([0.5, 0.5, 1.0]),
)


class RK4(dfx.AbstractERK):
    """The classical fourth-order Runge–Kutta method (4 stages).

    Usually run with constant steps: `solve_flow(..., solver=ja.RK4(), dt0=h,
    stepsize_controller=diffrax.ConstantStepSize())`. Carries an embedded
    second-order (midpoint) error estimate, so adaptive stepping works too,
    though `diffrax.Tsit5` is the better adaptive choice.
    """

    tableau: ClassVar[dfx.ButcherTableau] = _rk4_tableau
    interpolation_cls: ClassVar[Callable[..., dfx.AbstractLocalInterpolation]] = (
        dfx.ThirdOrderHermitePolynomialInterpolation.from_k
    )

    def order(self, terms):
        return 4


def _check_ts(ts) -> Real[Array, " T"]:
    ts = as_float_array(ts, "ts")
    if ts.ndim != 1 or ts.shape[0] < 1:
        raise ValueError(f"`ts` must be a 1-D array of save times, got shape {ts.shape}.")
    if is_concrete(ts):
        tn = np.asarray(ts)
        if not np.all(np.isfinite(tn)):
            raise ValueError("`ts` must be finite.")
        if np.any(np.diff(tn) < 0):
            raise ValueError("`ts` must be nondecreasing (the flow is integrated forwards).")
    return ts


@surface_errors
def solve_flow(
    dyn: SelfAttentionDynamics,
    x0: Float[Array, "*batch n d"],
    ts: Real[Array, " T"],
    *,
    solver: dfx.AbstractSolver | None = None,
    rtol: float = 1e-6,
    atol: float = 1e-8,
    max_steps: int = 16384,
    dt0: float | None = None,
    adjoint: dfx.AbstractAdjoint = dfx.RecursiveCheckpointAdjoint(),
    stepsize_controller: dfx.AbstractStepSizeController | None = None,
    on_manifold: bool = True,
    throw: bool = True,
    devices=None,
    strategy: str | AbstractStrategy = "auto",
    solution: bool = False,
    event=None,
    shard: str = "batch",
    noise: AbstractNoise | None = None,
    key=None,
) -> Float[Array, "*batch T n d"] | FlowResult | FlowSolution:
    """Integrate the continuous attention flow (paper 001 eq. 6) with diffrax.

    `dx_i/dt = v_i(t, x) − ⟨x_i, v_i(t, x)⟩_W x_i` from `t = ts[0]`, saving at
    each time of `ts`. Tokens are kept on `E_W` by `ManifoldSolver` (a retraction
    after every step; see its docstring for why). Leading axes of `x0` are a
    batch, solved as one vmapped program (each sample with its own steps).

    **Arguments:**

    - `dyn`: the model; or a stacked model, one per instance (its array leaves with
      leading batch axes `(*models,)`, as `ja.run_layers` takes it), solving tokens
      `(*models, ..., n, d)`, model `m` from `x0[m]`.
    - `x0`: initial tokens `(..., n, d)`, normalised onto `E_W` first; NaN/inf or
      zero tokens raise an error. A batch with no sequence (a zero-size batch axis)
      gives an empty result.
    - `ts`: nondecreasing save times; integration starts at `ts[0]`.
    - `solver`: any diffrax ODE solver (default `diffrax.Tsit5()`); with `noise`, an
      SDE solver (default the noise's: `diffrax.Heun()` for `TokenNoise`,
      Stratonovich; `diffrax.Euler()` for `ValueNoise`, Itô; see `docs/noise.md`).
    - `rtol`, `atol`: tolerances of the adaptive step-size controller (used when
      the solver gives error estimates).
    - `max_steps`: step budget per sample; reaching it is an error (raise it).
      Reverse-mode gradients size diffrax's checkpoint buffers by it: when the
      number of steps is known (fixed steps), pass it here: the temporaries of a
      gradient shrink by an order of magnitude on the S2 benchmark
      (`benchmarks/flow_gradient.py`;
      see BENCHMARKS.md, Measured claims behind design choices).
    - `dt0`: initial step; required for solvers without error estimates, which
      then take constant steps of `dt0`.
    - `adjoint`: how gradients are taken (default: checkpointed reverse mode,
      `diffrax.RecursiveCheckpointAdjoint`). `BacksolveAdjoint` integrates the
      reversed flow, which is unstable for this contracting system: avoid it.
    - `stepsize_controller`: `None` (default) picks `diffrax.PIDController(rtol,
      atol)` for solvers with error estimates and constant steps of `dt0`
      otherwise; pass e.g. `diffrax.ConstantStepSize()` to force fixed steps.
    - `on_manifold`: retract steps and saved values onto `E_W` (default `True`).
      `False` integrates the ambient ODE as is, to measure the drift.
    - `throw`: raise if any sample fails (default). With `False` nothing is raised
      and a `FlowResult(ys, success, num_steps)` with a per-sample status is
      returned instead of `ys`.
    - `devices`: shard the batch over devices (`None`, an int, a list of devices
      or a `Mesh`; see `docs/multihost.md`): each device integrates its share of
      the batch. Its results are bit for bit those of an unsharded run of that
      share (other batch sizes agree to rounding: XLA compiles each size
      separately); bad tokens raise a `ValueError` before the run, and with
      `throw=True` a failed solve raises the same error as unsharded after it.
    - `shard`: what `devices` split: `"batch"` (default) the systems; `"tokens"`
      each system's tokens (`n` a multiple of the device count), attention then a
      ring over the devices (as in `ja.run_layers`); the adaptive steps are the
      same on every device (the error norm is taken over all tokens).
    - `strategy`: how a batch is executed, a member of `ja.AbstractStrategy` (as
      diffrax takes `solver=`) or its shorthand: `ja.Vmap()` (`"general"`),
      `ja.BatchLast()` (`"fused"`), `ja.PallasKernel(block=…, num_warps=…)`
      (`"kernel"`). `"auto"` (default) takes `BatchLast` for constant steps of an
      explicit solver (`ja.RK4`, `diffrax.Euler`, any explicit Runge–Kutta method)
      over a batch of small systems (`jaxattn._strategy.fused_applies`: at least
      two sequences, each of at most `FUSED_MAX_FLOPS` flops per evaluation), and
      `Vmap` otherwise. The fused path is one diffrax solve of the whole batch stored `(n, d, B)`,
      the systems on the last axis, its vector field `dyn.velocity` run as a few
      elementwise kernels over all systems (`jaxattn._ensemble`): the same steps
      and the same results as the general path to rounding, with per-system
      `success` (faster on S1 of the benchmarks, 200 RK4 steps of 1000 systems:
      see BENCHMARKS.md, Measured claims behind design choices).
      `"fused"` forces it; with an adaptive controller it is a
      **shared-step mode**: one step size for the whole batch, its error the RMS
      over all systems (as torchdiffeq's), so results differ from per-system steps
      within the tolerances and every system reports the same `num_steps`.
      `"general"` vmaps one diffrax solve per system, each with its own steps.
      `"kernel"` runs constant steps of Euler or an explicit Runge–Kutta tableau
      (`ja.RK4`, `diffrax.Heun`; `stepsize_controller=diffrax.ConstantStepSize()`
      for solvers with an error estimate) as one Pallas kernel (`jaxattn._pallas`,
      `docs/kernels.md`): `ts` equally spaced, each gap a whole number of `dt0`;
      one device, not differentiable, no events; never chosen by `"auto"` yet.
      Its steps are the fused path's to rounding; with `noise`, its `ΔW` come
      from each system's key inside the kernel (the same law as diffrax's
      Brownian tree, not the same path).
    - `solution`: return a `FlowSolution` (`ts`, `ys`, `t1`, `y1`, `stats`,
      `result`, `success`, `event`, after diffrax's `Solution`) in place of `ys`
      (default `False`: the array).
    - `event`: stop each sample's run on a condition (needs `solution=True`): a
      function `cond(t, x)` of the time and one sequence's tokens `(n, d)`, e.g.
      `lambda t, x: ja.misalignment(x) - 1e-4` to stop at `E = 10⁻⁴`. A real
      value stops the run where it changes sign, the time located by a Newton root
      find on the solver's dense output; a bool stops it at the end of the first
      step where it is `True`. It must be finite wherever the run goes: NaN or inf
      at the start, or in a stop's root find (explicit solvers), is refused in one
      line naming `event`, inside an outer `jit` too. A `diffrax.Event` is used as
      it is (its `cond_fn`
      gets `(t, x, dyn, **kwargs)`). The stop time and tokens are the solution's
      `t1`, `y1`; save times after the stop are `inf`. Runs on the general path
      (each sample stops on its own).

    - `noise`: `None` (default, the ODE) or `ja.TokenNoise(σ)` / `ja.ValueNoise(σ)`
      (a traced `σ` too: `jax.vmap` over strengths, or over the model's `β`, is one
      compiled program; `docs/noise.md`, "Batching over σ, β and τ"):
      the SDE `dx = velocity dt + σ P_x dB (·)`, one diffrax solve of
      `MultiTerm(ODETerm, ControlTerm)` per system on a `diffrax.VirtualBrownianTree`
      (tolerance `jaxattn._noise.BROWNIAN_TOL`), so that a path depends on the key
      and the interval `[ts[0], ts[-1]]`, not on the step. Constant steps of `dt0`
      (default `NOISY_STEPS` = 1000 steps over `[ts[0], ts[-1]]`) unless a
      `stepsize_controller` is passed (`diffrax.PIDController` works with the tree,
      for solvers with an error estimate such as `Heun`; `dt0` is then its first
      step). Steps
      are retracted onto `E_W` as without noise. Runs on the general path; `devices=`
      splits the systems with their keys.
    - `key`: the JAX key of the noise (required with `noise`): one system uses it as
      is, a batch gives system `b` (in the order of the flattened batch, models
      first) `jax.random.split(key, B)[b]`. One key gives one path, bit for bit.

    **Returns:**

    `ys` of shape `(..., len(ts), n, d)`, or a `FlowResult` when `throw=False`, or
    a `FlowSolution` when `solution=True`.
    """
    throw, on_manifold = check_flag(throw, "throw"), check_flag(on_manifold, "on_manifold")
    if not isinstance(adjoint, dfx.AbstractAdjoint):
        raise TypeError(f"`adjoint` must be a diffrax adjoint (e.g. "
                        f"diffrax.RecursiveCheckpointAdjoint()), got {type(adjoint).__name__}.")
    noise, key = check_noise(noise, key, shard=shard)
    dyn, x0, unflatten = stack_tokens(dyn, as_float_array(x0, "x0"))
    one = first_model(dyn)
    if devices is not None and dyn is not one:
        raise ValueError("`devices=` shards one model's batch: solve a stacked model "
                         "without `devices`, or shard the models yourself.")
    shard = check_shard(shard, dyn, one)
    x0 = check_token_shape(one, x0)
    keys = None
    if noise is not None:
        solver, dt0, stepsize_controller = _noisy_steps(noise, ts, solver, dt0,
                                                        stepsize_controller)
    solver = dfx.Tsit5() if solver is None else solver
    options = _options(one, ts, solver, rtol, atol, max_steps, dt0, stepsize_controller)
    event = _event(event, solution, x0.dtype)
    if noise is not None:
        if x0.size == 0:
            raise ValueError("`noise=` needs at least one sequence in `x0`.")
        keys = system_keys(key, x0.shape[:-2])
    member = _flow_strategy(one, x0.shape, strategy, options, event, noise, shard, (dyn, x0))
    return unflatten(member.solve_flow(
        dyn, x0, options, adjoint=adjoint, throw=throw, on_manifold=on_manifold,
        event=event, devices=devices, shard=shard, noise=noise, keys=keys))


#: Constant steps of a noisy `solve_flow` over `[ts[0], ts[-1]]` when `dt0` is not given:
#: strong error ~ step^{1/2} (docs/noise.md's measured orders), 3 % of σ at 1000 steps.
NOISY_STEPS = 1000


def _noisy_steps(noise, ts, solver, dt0, controller):
    """The noisy flow's defaults: the noise's solver, constant steps, `NOISY_STEPS`
    of them over the horizon."""
    solver = noise.default_solver if solver is None else solver
    if dt0 is None:  # constant steps by default: NOISY_STEPS over the horizon
        span = float(np.max(np.asarray(ts)) - np.min(np.asarray(ts))) if is_concrete(ts) else 0
        if not span > 0:
            raise ValueError("`noise=` takes steps of `dt0`: pass `dt0=...` (the horizon "
                             "is empty or traced, so no default step can be drawn from it).")
        dt0 = span / NOISY_STEPS
    return solver, dt0, dfx.ConstantStepSize() if controller is None else controller


def _flow_strategy(one, shape, strategy, options, event, noise, shard, operands
                   ) -> AbstractStrategy:
    """The member that solves this flow: what `"auto"` picks, and the refusals of a
    member that shares one run over a chunk (noise, events that stop one system)."""
    member = as_strategy(strategy)
    stops_each = event is not None and event is not True
    if member is not None and member.fused:
        if noise is not None:
            raise ValueError("the noisy flow runs on the general path for now: use "
                             "strategy=\"auto\" or \"general\".")
        if stops_each:
            raise ValueError("`event=` stops each sample on its own: use strategy=\"general\" "
                             "or \"auto\" (the fused path shares one run over the batch).")
    if member is None and (noise is not None or stops_each):
        return Vmap()
    return choose_strategy(one, shape, strategy, operands, solver=options[1],
                           controller=options[2], shard=shard)


def _event(event, solution, dtype):
    """`None` (the array), `True` (the full solution, no event) or a `diffrax.Event`."""
    if not isinstance(solution, bool):
        raise TypeError(f"`solution` must be True or False, got {solution!r}.")
    if event is None:
        return True if solution else None
    if not solution:
        raise ValueError("`event=` needs `solution=True`: the stop time and tokens are "
                         "the solution's `t1` and `y1`.")
    if isinstance(event, dfx.Event):
        return event
    if not callable(event):
        raise TypeError(f"`event` must be a function cond(t, x) or a diffrax.Event, got "
                        f"{type(event).__name__}.")
    # The root is located on the dense output, smooth in t: Newton converges fast,
    # to a tolerance above the dtype's rounding of t.
    tol = float(jnp.finfo(dtype).eps) ** 0.75
    return dfx.Event(UserEvent(event), optx.Newton(rtol=tol, atol=tol))


def solve_flow_unchecked(dyn, x0, ts, *, solver=dfx.Tsit5(), rtol=1e-6, atol=1e-8,
                         max_steps=16384, dt0=None, adjoint=dfx.RecursiveCheckpointAdjoint(),
                         stepsize_controller=None, on_manifold=True,
                         strategy: str | AbstractStrategy = "auto") -> FlowResult:
    """`solve_flow(..., throw=False)` without value checks, for batches that are
    vmapped or sharded by the caller (no host callback in the program). `x0` must
    be finite and have no zero token; `dyn` may be a stacked model (as in `solve_flow`)."""
    dyn, x0, unflatten = stack_tokens(dyn, x0)
    one = first_model(dyn)
    options = _options(one, ts, solver, rtol, atol, max_steps, dt0, stepsize_controller)
    member = choose_strategy(one, jnp.shape(x0), strategy, (dyn, x0), solver=options[1],
                             controller=options[2])
    return unflatten(member.solve_flow(
        dyn, x0, options, adjoint=adjoint, throw=False, on_manifold=on_manifold, event=None,
        devices=None, shard="batch", noise=None, keys=None, checked=False))


def _options(dyn, ts, solver, rtol, atol, max_steps, dt0, stepsize_controller):
    """Checked `(ts, solver, controller, dt0, max_steps)` for a strategy's `solve_flow`."""
    if not isinstance(dyn, SelfAttentionDynamics):
        raise TypeError(f"`dyn` must be a ja.SelfAttentionDynamics, got {type(dyn).__name__}.")
    if not isinstance(solver, dfx.AbstractSolver):
        raise TypeError(f"`solver` must be a diffrax solver, got {type(solver).__name__}.")
    if not isinstance(stepsize_controller, dfx.AbstractStepSizeController | None):
        raise TypeError(f"`stepsize_controller` must be a diffrax step-size controller (e.g. "
                        f"diffrax.PIDController(rtol, atol)), got "
                        f"{type(stepsize_controller).__name__}.")
    ts = _check_ts(ts)
    max_steps = check_count(max_steps, "max_steps", minimum=1)
    if stepsize_controller is not None:
        controller = stepsize_controller
    elif isinstance(solver, dfx.AbstractAdaptiveSolver):
        controller = dfx.PIDController(
            rtol=check_scalar(rtol, "rtol", positive=True),
            atol=check_scalar(atol, "atol", positive=True),
        )
    else:
        controller = dfx.ConstantStepSize()
    if isinstance(controller, dfx.ConstantStepSize) and dt0 is None:
        raise ValueError(
            f"constant steps ({type(solver).__name__} gives no error estimate, or a "
            "ConstantStepSize controller was passed) need a step: pass `dt0=...`."
        )
    if dt0 is not None:
        dt0 = float(check_scalar(dt0, "dt0", positive=True))
    return ts, solver, controller, dt0, max_steps
