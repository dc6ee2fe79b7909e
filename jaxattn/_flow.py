"""The continuous model: the attention flow on the ellipsoid (paper 001 eq. 6),
integrated with diffrax and kept on the manifold. How a batch runs is its strategy's
(`jaxattn._strategy`); here the arguments are checked once and handed over."""

from collections.abc import Callable
from typing import ClassVar

import diffrax as dfx
import equinox as eqx
import jax.numpy as jnp
import lineax as lx
import numpy as np
import optimistix as optx
from jaxtyping import Array, Float, Real

from ._batch import check_run
from ._dynamics import SelfAttentionDynamics
from ._noise import BROWNIAN_TOL, AbstractNoise
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
from ._strategy.stepping import DEFAULT_ROOT_FINDER, FROM_CONTROLLER
from ._validate import (
    INDEX_MAX,
    as_float_array,
    check_count,
    check_flag,
    check_scalar,
    is_concrete,
    refuse_first,
    surface_errors,
    too_big,
)

_rk4_tableau = dfx.ButcherTableau(
    a_lower=(np.array([0.5]), np.array([0.0, 0.5]), np.array([0.0, 0.0, 1.0])),
    b_sol=np.array([1 / 6, 1 / 3, 1 / 3, 1 / 6]),
    # Embedded second-order (midpoint) estimate, so RK4 also runs adaptively.
    b_error=np.array([1 / 6, 1 / 3 - 1, 1 / 3, 1 / 6]),
    c=np.array([0.5, 0.5, 1.0]),
)


class RK4(dfx.AbstractERK, dfx.AbstractStratonovichSolver):
    """The classical fourth-order Runge–Kutta method (4 stages).

    Usually run with constant steps: `solve_flow(..., solver=ja.RK4(), dt0=h,
    stepsize_controller=diffrax.ConstantStepSize())`. Carries an embedded
    second-order (midpoint) error estimate, so adaptive stepping works too,
    though `diffrax.Tsit5` is the better adaptive choice. With `noise=` it converges
    to the Stratonovich solution (`Σ b_i = 1`, `Σ b_i c_i = 1/2`), as `diffrax.Heun`.
    """

    tableau: ClassVar[dfx.ButcherTableau] = _rk4_tableau
    interpolation_cls: ClassVar[Callable[..., dfx.AbstractLocalInterpolation]] = (
        dfx.ThirdOrderHermitePolynomialInterpolation.from_k
    )

    def order(self, terms):
        return 4


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
    on_manifold: bool | None = None,
    throw: bool = True,
    devices=None,
    strategy: str | AbstractStrategy = "auto",
    solution: bool = False,
    event=None,
    shard: str = "batch",
    noise: AbstractNoise | None = None,
    key=None,
    progress: bool = False,
) -> Float[Array, "*batch T n d"] | FlowResult | FlowSolution:
    """Integrate the continuous attention flow (paper 001 eq. 6) with diffrax.

    `dx_i/dt = v_i(t, x) − ⟨x_i, v_i(t, x)⟩_W x_i` from `t = ts[0]`, saving at
    each time of `ts`. Tokens are kept on `E_W` by `ManifoldSolver` (a retraction
    after every step; see its docstring for why). Leading axes of `x0` are a
    batch, solved as one vmapped program (each sample with its own steps). Concrete
    inputs are checked on the host, and run without diffeqsolve's in-program checks
    where they can (`docs/usage/strategies.md`, "Flows without host callbacks").

    **Arguments:**

    - `dyn`: the model; or a stacked model, one per instance (as `ja.run_layers`
      takes it), solving tokens `(*models, ..., n, d)`, model `m` from `x0[m]`.
    - `x0`: initial tokens `(..., n, d)`, normalised onto `E_W` first; NaN/inf or
      zero tokens raise an error; a zero-size batch axis gives an empty result.
    - `ts`: nondecreasing save times; integration starts at `ts[0]`.
    - `solver`: any diffrax ODE solver (default `diffrax.Tsit5()`); with `noise`, an
      SDE solver (default the noise's: `diffrax.Heun()` for `TokenNoise`,
      Stratonovich; `diffrax.Euler()` for `ValueNoise`, Itô; see `docs/noise.md`).
    - `rtol`, `atol`: tolerances of the adaptive step-size controller.
    - `max_steps`: step budget per sample; reaching it is an error. Reverse-mode
      gradients size diffrax's checkpoint buffers by it: with fixed steps pass their
      number, and a gradient's temporaries shrink by an order of magnitude
      (`benchmarks/flow_gradient.py`, BENCHMARKS.md).
    - `dt0`: initial step; required for solvers without error estimates, which
      then take constant steps of `dt0`.
    - `adjoint`: how gradients are taken (default: checkpointed reverse mode).
      `BacksolveAdjoint` integrates the reversed flow, unstable for this
      contracting system: avoid it. It and `DirectAdjoint` need `on_manifold=False`.
      Forward mode (`jax.jvp`, `jax.jacfwd`) needs `adjoint=diffrax.ForwardMode()`
      with `on_manifold=False` (the default adjoint is reverse mode only).
    - `stepsize_controller`: `None` (default) picks `diffrax.PIDController(rtol,
      atol)` for solvers with error estimates and constant steps of `dt0`
      otherwise; e.g. `diffrax.ConstantStepSize()` forces fixed steps.
    - `on_manifold`: retract steps and saved values onto `E_W`; `False` integrates
      the ambient ODE as is, to measure the drift. Default: the model's
      `stays_on_manifold` (`True` for `"post"` and `"ngpt"`; `"pre"`, `"peri"`
      and `"none"` leave `E_W`, and retracting them would be another flow).
    - `throw`: raise if any sample fails (default). With `False`, a
      `FlowResult(ys, success, num_steps)` with a per-sample status is returned.
    - `devices`: shard the batch over devices (`None`, an int, a list of devices or a
      `Mesh`; `docs/multihost.md`), bit for bit as an unsharded run of each share.
    - `shard`: what `devices` split: `"batch"` (default) the systems; `"tokens"`
      each system's tokens (`n` a multiple of the device count), attention a ring.
    - `strategy`: how a batch is executed (`docs/usage/strategies.md`): a member of
      `ja.AbstractStrategy` or its shorthand: `ja.Vmap()` (`"general"`),
      `ja.BatchLast()` (`"fused"`; with an adaptive controller one step size for the
      batch, its error the RMS over all systems, the same `num_steps` for each) or
      `ja.PallasKernel(...)` (`"kernel"`, `docs/kernels.md`). `"auto"` (default).
    - `solution`: return a `FlowSolution` (`ts`, `ys`, `t1`, `y1`, `stats`,
      `result`, `success`, `event`, after diffrax's `Solution`) in place of `ys`.
    - `event`: stop each sample's run on a condition (needs `solution=True`): a
      function `cond(t, x)` of one sequence's tokens `(n, d)`, e.g.
      `lambda t, x: ja.misalignment(x) - 1e-4`, stopping where a real value changes
      sign (a Newton root find on the dense output) or a bool turns `True`; or a
      `diffrax.Event` (its `cond_fn` gets `(t, x, dyn, **kwargs)`). The stop is the
      solution's `t1`, `y1`; save times after it are `inf`. Runs on the general path.
    - `noise`: `None` (default, the ODE) or `ja.TokenNoise(σ)` / `ja.ValueNoise(σ)`:
      the SDE on a `diffrax.VirtualBrownianTree`, constant steps of `dt0` (default
      `NOISY_STEPS` over the horizon) unless a `stepsize_controller` is passed;
      general path (`docs/noise.md`). `ja.PallasKernel` runs it with increments drawn
      per step from the key: the same law, another path (`docs/kernels.md`).
    - `key`: the noise's JAX key (required with `noise`): one system uses it as is,
      system `b` of a batch (flattened, models first) `jax.random.split(key, B)[b]`.
    - `progress`: show a progress bar over `[ts[0], ts[-1]]` (`diffrax.TqdmProgressMeter`;
      default `False`). It is a host callback in the program, so JAX's persistent cache
      does not keep that program: a run without the bar compiles its own.

    **Returns:**

    `ys` of shape `(..., len(ts), n, d)`, or a `FlowResult` when `throw=False`, or
    a `FlowSolution` when `solution=True`.
    """
    throw = check_flag(throw, "throw")
    solution, progress = check_flag(solution, "solution"), check_flag(progress, "progress")
    dyn, x0, unflatten, one, shard, noise, keys = check_run(dyn, x0, devices, shard, noise, key)
    on_manifold = one.stays_on_manifold if on_manifold is None else \
        check_flag(on_manifold, "on_manifold")
    member = as_strategy(strategy)
    fused = member is not None and member.fused
    refuse_first([(dt0 is not None and not is_concrete(dt0), TypeError,
                   "`dt0` must be a number known before the run (the steps are laid out "
                   "from it), not traced: pass it outside jit/vmap/grad.")])
    dt0 = None if dt0 is None else check_scalar(dt0, "dt0", positive=True)
    span = _span(ts) if noise is not None and dt0 is None else 0
    saves = np.shape(ts)[0] if np.ndim(ts) == 1 else 0
    refuse_first([too_big(float(x0.size) * saves * x0.dtype.itemsize,
                          f"the tokens at {saves} times (`x0` {x0.shape}) need",
                          "pass fewer times `ts`")])
    refuse_first((
        (solution and x0.size == 0, ValueError,
         "`solution=True` needs at least one sequence in `x0`."),
        (noise is not None and dt0 is None and not span > 0, ValueError,
         "`noise=` takes steps of `dt0`: pass `dt0=...` (the horizon is empty or traced, so "
         "no default step can be drawn from it)."),
        (event is not None and not solution, ValueError,
         "`event=` needs `solution=True`: the stop time and tokens are the solution's `t1` "
         "and `y1`."),
        (event is not None and not callable(event), TypeError,
         f"`event` must be a function cond(t, x) or a diffrax.Event, got "
         f"{type(event).__name__}."),
        (noise is not None and solver is not None and not isinstance(
            solver, dfx.AbstractItoSolver | dfx.AbstractStratonovichSolver), ValueError,
         f"`noise=` needs an SDE solver: diffrax.Euler() (Itô), diffrax.Heun() or ja.RK4() "
         f"(Stratonovich), or another marked so; got {type(solver).__name__}."),
        (fused and noise is not None, ValueError,
         "the noisy flow runs on the general path for now: use strategy=\"auto\" or "
         "\"general\"."),
        (fused and event is not None, ValueError,
         "`event=` stops each sample on its own: use strategy=\"general\" or \"auto\" (the "
         "fused path shares one run over the batch)."),
        (on_manifold and isinstance(adjoint, dfx.BacksolveAdjoint | dfx.DirectAdjoint
                                    | dfx.ForwardMode),
         ValueError, f"adjoint={type(adjoint).__name__}() cannot run through the retraction "
         "onto E_W (it steps an augmented state, or rebuilds the solver): pass "
         "on_manifold=False, or the default RecursiveCheckpointAdjoint()."),
    ))
    if noise is not None:
        solver = noise.default_solver if solver is None else solver
        dt0 = span / NOISY_STEPS if dt0 is None else dt0
        steps = np.ceil(_span(ts) / dt0 - 1e-9) if stepsize_controller is None else 0
        refuse_first([(dt0 < BROWNIAN_TOL, ValueError,
                       f"`dt0` = {float(dt0):.3g} is below the Brownian path's resolution "
                       f"{BROWNIAN_TOL:.3g} (`BROWNIAN_TOL`): its increments there are "
                       "interpolated, not drawn (their variance falls to 0.2 h at 1e-5); take "
                       "dt0 ≥ that (by default 1/1000 of the horizon, which must then be ≥ "
                       f"{1000 * BROWNIAN_TOL:.3g})."),
                      # constant steps: the budget is known now, not after the run
                      (isinstance(max_steps, int) and steps > max_steps, ValueError,
                       f"the noisy flow takes {steps:.0f} steps of dt0 = {dt0:.3g} over "
                       f"the horizon, more than max_steps = {max_steps}: raise `max_steps` "
                       "or `dt0`.")])
        if stepsize_controller is None:
            stepsize_controller = dfx.ConstantStepSize()
    solver = dfx.Tsit5() if solver is None else solver
    options = _options(ts, solver, rtol, atol, max_steps, dt0, stepsize_controller, adjoint,
                       x0.shape[-2:], x0.dtype)
    event = _event(event, solution, x0.dtype)
    if member is None and (noise is not None or event not in (None, True)):
        member = Vmap()
    else:
        member = choose_strategy(one, x0.shape, strategy, (dyn, x0, noise, ts),
                                 solver=options[1], controller=options[2], shard=shard)
    return unflatten(member.solve_flow(
        dyn, x0, options, adjoint=adjoint, throw=throw, on_manifold=on_manifold,
        event=event, devices=devices, shard=shard, noise=noise, keys=keys, progress=progress))


#: Constant steps of a noisy `solve_flow` over `[ts[0], ts[-1]]` when `dt0` is not given:
#: strong error ~ step^{1/2} (docs/noise.md's measured orders), 3 % of σ at 1000 steps.
NOISY_STEPS = 1000


def _span(ts) -> float:
    """The length of the horizon `[min ts, max ts]`, or 0 when `ts` is traced."""
    return float(np.max(np.asarray(ts)) - np.min(np.asarray(ts))) if is_concrete(ts) else 0


def _event(event, solution, dtype):
    """`None` (the array), `True` (the full solution, no event) or a `diffrax.Event`."""
    if event is None:
        return True if solution else None
    if isinstance(event, dfx.Event):
        return event
    # The root is located on the dense output, smooth in t: Newton converges fast,
    # to a tolerance above the dtype's rounding of t.
    tol = float(jnp.finfo(dtype).eps) ** 0.75
    return dfx.Event(UserEvent(event), optx.Newton(rtol=tol, atol=tol))


def solve_flow_unchecked(dyn, x0, ts, *, solver=dfx.Tsit5(), rtol=1e-6, atol=1e-8,
                         max_steps=16384, dt0=None, adjoint=dfx.RecursiveCheckpointAdjoint(),
                         stepsize_controller=None, on_manifold=None,
                         strategy: str | AbstractStrategy = "auto") -> FlowResult:
    """`solve_flow(..., throw=False)` without value checks, for batches that are
    vmapped or sharded by the caller (no host callback in the program: `CheckedTimes`).
    `x0` must be finite and have no zero token, `ts` nondecreasing (traced is fine);
    `dyn` may be a stacked model (as in `solve_flow`)."""
    dyn, x0, unflatten = stack_tokens(dyn, x0)
    one = first_model(dyn)
    on_manifold = one.stays_on_manifold if on_manifold is None else on_manifold
    options = _options(ts, solver, rtol, atol, max_steps, dt0, stepsize_controller, adjoint,
                       jnp.shape(x0)[-2:], jnp.result_type(x0))
    member = choose_strategy(one, jnp.shape(x0), strategy, (dyn, x0), solver=options[1],
                             controller=options[2])
    return unflatten(member.solve_flow(
        dyn, x0, options, adjoint=CheckedTimes(adjoint, options[0]), throw=False,
        on_manifold=on_manifold, event=None, devices=None, shard="batch", noise=None,
        keys=None, checked=False))


class CheckedTimes(dfx.AbstractAdjoint):
    """`adjoint`, its loop saving at the times `ts` as its caller checked them.

    `diffeqsolve` checks `SaveAt(ts)` in the program (increasing, inside `[t0, t1]`)
    with `eqx.error_if`, whose predicate is traced whatever `ts` is (the times are
    multiplied by a direction computed in the program): a host callback, which JAX's
    persistent cache refuses. The loop is handed the same times, `ts` times the same
    direction, so the checked copy goes unused and is dropped with its callback; the
    steps, saves and gradients (the adjoint's own loop) are unchanged.
    """

    adjoint: dfx.AbstractAdjoint
    ts: Real[Array, " T"]

    def loop(self, *, saveat, **kwargs):
        ts = self.ts.astype(saveat.subs.ts.dtype)
        ts = ts * jnp.where(ts[0] < ts[-1], 1, -1)  # diffeqsolve's direction
        return self.adjoint.loop(saveat=eqx.tree_at(lambda s: s.subs.ts, saveat, ts),
                                 **kwargs)


#: Bytes of one system's dense Jacobian `(n d)²` above which an implicit solver's
#: default root finder (diffrax's `VeryChord`, which builds and factors it from `n d`
#: Jacobian–vector products) gives way to a matrix-free Newton–GMRES: 4 MiB, n d > 724
#: in float64 (n > 362 tokens in d = 2). At n = 600 the dense one peaked near 8 GB.
JACOBIAN_LIMIT = 2**22


def matrix_free_root_finder(rtol: float, atol: float) -> optx.AbstractRootFinder:
    """Newton's method with GMRES for its linear solves (`docs/limits.md`): the tolerances
    of Newton from the step-size controller (as diffrax's default), GMRES a tenth of the
    controller's and a small `restart` (lineax builds the whole Krylov basis before it
    checks convergence; an implicit step's `I − γhJ` is near the identity)."""
    tol = FROM_CONTROLLER
    return optx.Newton(rtol=tol, atol=tol, norm=tol, linear_solver=lx.GMRES(
        rtol=rtol / 10, atol=atol / 10, restart=4, stagnation_iters=30))


def choose_root_finder(solver: dfx.AbstractSolver, controller: dfx.AbstractStepSizeController,
                       nd: tuple[int, int], dtype) -> dfx.AbstractSolver:
    """`solver`, or, for an implicit one left with diffrax's default (dense) root finder
    under an adaptive controller, the same solver with `matrix_free_root_finder` when one
    system's dense Jacobian `(n d)²` would pass `JACOBIAN_LIMIT` bytes. A root finder the
    user gave is kept, and so is a small system's default."""
    n, d = nd
    dense = (n * d) ** 2 * np.dtype(dtype).itemsize
    if (not isinstance(solver, dfx.AbstractImplicitSolver) or dense <= JACOBIAN_LIMIT
            or not isinstance(controller, dfx.PIDController)
            or not eqx.tree_equal(solver.root_finder, DEFAULT_ROOT_FINDER)):
        return solver
    return eqx.tree_at(lambda s: s.root_finder, solver,
                       matrix_free_root_finder(controller.rtol, controller.atol))


def _options(ts, solver, rtol, atol, max_steps, dt0, stepsize_controller, adjoint, nd, dtype):
    """Checked `(ts, solver, controller, dt0, max_steps)` for a strategy's `solve_flow`, the
    solver through `choose_root_finder` for systems `nd = (n, d)` of `dtype`."""
    # Constant steps: asked for, or the default for a solver without error estimates.
    constant = isinstance(stepsize_controller, dfx.ConstantStepSize) or (
        stepsize_controller is None and not isinstance(solver, dfx.AbstractAdaptiveSolver))
    ts = as_float_array(ts, "ts")
    tn = np.asarray(ts).ravel() if is_concrete(ts) else None
    refuse_first((
        (not isinstance(solver, dfx.AbstractSolver), TypeError,
         f"`solver` must be a diffrax solver, got {type(solver).__name__}."),
        (not isinstance(stepsize_controller, dfx.AbstractStepSizeController | None), TypeError,
         "`stepsize_controller` must be a diffrax step-size controller (e.g. "
         f"diffrax.PIDController(rtol, atol)), got {type(stepsize_controller).__name__}."),
        (not isinstance(adjoint, dfx.AbstractAdjoint), TypeError,
         "`adjoint` must be a diffrax adjoint (e.g. diffrax.RecursiveCheckpointAdjoint()), "
         f"got {type(adjoint).__name__}."),
        (constant and dt0 is None, ValueError,
         f"constant steps ({type(solver).__name__} gives no error estimate, or a "
         "ConstantStepSize controller was passed) need a step: pass `dt0=...`."),
        (ts.ndim != 1 or ts.shape[0] < 1, ValueError,
         f"`ts` must be a 1-D array of save times, got shape {ts.shape}."),
        (tn is not None and not np.all(np.isfinite(tn)), ValueError, "`ts` must be finite."),
        (tn is not None and np.any(np.diff(tn) < 0), ValueError,
         "`ts` must be nondecreasing (the flow is integrated forwards)."),
    ))
    max_steps = check_count(max_steps, "max_steps", minimum=1, maximum=INDEX_MAX)
    if stepsize_controller is not None:
        controller = stepsize_controller
    elif isinstance(solver, dfx.AbstractAdaptiveSolver):
        controller = dfx.PIDController(
            rtol=check_scalar(rtol, "rtol", positive=True),
            atol=check_scalar(atol, "atol", positive=True),
        )
    else:
        controller = dfx.ConstantStepSize()
    if dt0 is not None:
        dt0 = float(check_scalar(dt0, "dt0", positive=True))
    return ts, choose_root_finder(solver, controller, nd, dtype), controller, dt0, max_steps
