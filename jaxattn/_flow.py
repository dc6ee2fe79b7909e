"""The continuous model: the attention flow on the ellipsoid (paper 001 eq. 6),
integrated with diffrax and kept on the manifold."""

import functools
from typing import NamedTuple

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx
from jaxtyping import Array, Bool, Float, Int, Real

from ._batch import (
    call_batched,
    check_shard,
    check_token_shape,
    map_batch,
    map_systems,
    prepare_tokens,
)
from ._dynamics import SelfAttentionDynamics
from ._ensemble import batch_last, choose_strategy, chunk_size, from_batch_last, to_batch_last
from ._manifold import project
from ._noise import (
    AbstractNoise,
    brownian_path,
    check_noise,
    layer_normal,
    map_keyed,
    sde_terms,
    system_keys,
)
from ._pallas import kernel_config, key_rows, refuse_devices, run_ensemble
from ._stacked import first_model, map_models, models_last, stack_tokens
from ._validate import (
    NONFINITE,
    as_float_array,
    check_count,
    check_flag,
    check_scalar,
    is_concrete,
    raise_unless,
    surface_errors,
)


class ManifoldSolver(dfx.AbstractWrappedSolver):
    """Wraps any diffrax solver and retracts each step back onto `E_W` with `N_W`.

    Why a projection after each step: the flow (eq. 6) is tangent to `E_W`, but
    its extension off the manifold is not attracting (`d/dt |x|²_W =
    2⟨x, v⟩_W (1 − |x|²_W)` grows the error where `⟨x, v⟩_W < 0`), so an
    unprojected solver's local errors accumulate into a drift from `E_W` over
    long horizons. Normalising `y1` is a retraction: it changes the step by less
    than its own local error, keeps the solver's order, leaves the error
    estimate and step-size control untouched, and works for every solver
    (explicit, implicit, adaptive or not) because it touches only the accepted
    state. FSAL solvers reuse `f(y1)` from before the projection; the mismatch is
    of the size of the drift removed, below the local error.

    With `fused=True` the state is an ensemble `(n, d, B)`, the systems on the
    last axis (the fused path of `solve_flow`), each system retracted alike.
    """

    solver: dfx.AbstractSolver
    W: Float[Array, "d d"] | None
    fused: bool = eqx.field(static=True, default=False)

    @property
    def term_structure(self):
        return self.solver.term_structure

    @property
    def interpolation_cls(self):
        return self.solver.interpolation_cls

    @property
    def root_finder(self):
        """An implicit solver's root finder (`diffrax.Kvaerno5`, …: what stiff runs
        need, as the long horizons of metastable states): `diffeqsolve` sees a wrapped
        implicit solver as implicit and sets this root finder's tolerances from the
        step-size controller, as for the bare solver."""
        return self.solver.root_finder

    @property
    def term_compatible_contr_kwargs(self):
        return self.solver.term_compatible_contr_kwargs

    def order(self, terms):
        return self.solver.order(terms)

    def strong_order(self, terms):
        return self.solver.strong_order(terms)

    def error_order(self, terms):
        return self.solver.error_order(terms)

    def init(self, terms, t0, t1, y0, args):
        return self.solver.init(terms, t0, t1, y0, args)

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        y1, y_error, dense_info, solver_state, result = self.solver.step(
            terms, t0, t1, y0, args, solver_state, made_jump
        )
        y1 = _project_last(y1, self.W) if self.fused else project(y1, self.W)
        return y1, y_error, dense_info, solver_state, result

    def func(self, terms, t0, y0, args):
        return self.solver.func(terms, t0, y0, args)


class FlowResult(NamedTuple):
    """What `solve_flow(..., throw=False)` returns, per sample of the batch.

    - `ys`: tokens at each time, `(..., len(ts), n, d)`. Where a solve failed the
      entries after the failure are not meaningful: check `success` first.
    - `success`: `(...)` bool, whether the solver reached the last time.
    - `num_steps`: `(...)` accepted steps taken.
    """

    ys: Float[Array, "*batch T n d"]
    success: Bool[Array, "*batch"]
    num_steps: Int[Array, "*batch"]


class FlowSolution(NamedTuple):
    """What `solve_flow(..., solution=True)` returns, per sample of the batch, after
    diffrax's `Solution`.

    - `ts`: the save times `(..., T)`; with an `event` that stopped the run, the
      times after the stop are `inf` (diffrax's convention).
    - `ys`: tokens at those times `(..., T, n, d)` (`inf` after a stop).
    - `t1`: `(...)` the time the solve ended: `ts[-1]`, or the event's time.
    - `y1`: `(..., n, d)` the tokens at `t1`.
    - `stats`: diffrax's counts, each `(...)`: `num_steps`, `num_accepted_steps`,
      `num_rejected_steps`.
    - `result`: diffrax's `RESULTS` per sample (`diffrax.RESULTS.successful`, or
      `event_occurred` where the event stopped the run).
    - `success`: `(...)` bool, the run reached `ts[-1]` or its event, with finite tokens.
    - `event`: `(...)` bool, whether the event stopped the run.
    """

    ts: Real[Array, "*batch T"]
    ys: Float[Array, "*batch T n d"]
    t1: Real[Array, "*batch"]
    y1: Float[Array, "*batch n d"]
    stats: dict
    result: dfx.RESULTS
    success: Bool[Array, "*batch"]
    event: Bool[Array, "*batch"]


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


def _velocity(t, x, dyn):
    return dyn.velocity(t, x)


_project_last = batch_last(project)
_velocity_last = batch_last(lambda x, dyn, t: dyn.velocity(t, x))


def _ensemble_velocity(t, x, dyn):
    """The vector field of a whole ensemble `(n, d, B)` (the fused path)."""
    return _velocity_last(x, dyn, t)


_STATS = ("num_steps", "num_accepted_steps", "num_rejected_steps")


def _solve_one(dyn, x0, ts, solver, controller, dt0, max_steps, adjoint, throw,
               field=_velocity, event=None, noisy=None):
    """One diffrax solve: `(ys, result, accepted steps)`, and with an `event` (or when
    the full solution is asked for) `(ts, ys, t1, y1, stats)` in place of `ys`. With
    `noisy = (noise, key)` the SDE of that noise on the Brownian path of `key`."""
    # The model goes in as `args`, not a closure: BacksolveAdjoint differentiates
    # only through `args`, and a closed-over traced model breaks it.
    if noisy is None:
        term = dfx.ODETerm(field)
    else:
        noise, key = noisy
        path = brownian_path(noise, key, ts[0], ts[-1], *x0.shape, x0.dtype)
        term = sde_terms(noise, path, *x0.shape, x0.dtype, field)
    full = event is not None
    saveat = (dfx.SaveAt(subs=[dfx.SubSaveAt(ts=ts), dfx.SubSaveAt(t1=True)]) if full
              else dfx.SaveAt(ts=ts))
    sol = dfx.diffeqsolve(
        term,
        solver,
        t0=ts[0],
        t1=ts[-1],
        dt0=dt0,
        y0=x0,
        saveat=saveat,
        stepsize_controller=controller,
        max_steps=max_steps,
        adjoint=adjoint,
        throw=throw,
        args=dyn,
        event=None if event is None or event is True else event,
    )
    steps = sol.stats["num_accepted_steps"]
    if not full:
        return sol.ys, sol.result, steps
    (ts_saved, t_end), (ys, y_end) = sol.ts, sol.ys
    stats = {k: sol.stats[k] for k in _STATS}
    return (ts_saved, ys, t_end[0], y_end[0], stats), sol.result, steps


def _with_metric(solver, W):
    """`solver` retracting onto `E_W` of the model it solves (one of a stacked model)."""
    if not isinstance(solver, ManifoldSolver):
        return solver
    return eqx.tree_at(lambda s: s.W, solver, W, is_leaf=lambda v: v is None)


def _solve_program(ts, solver, controller, dt0, max_steps, adjoint, throw, event=None):
    """`program(model, x, fused)` for `map_systems`: one diffrax solve of a system, or
    on the fused path of a chunk of systems as the state `(n, d, B)`, its status given
    to each of them. With constant steps every system takes the steps it would take
    alone; adaptive controllers share one step size per chunk (the `"fused"`
    strategy's labelled shared-step mode)."""
    def program(dyn, x, fused, noisy=None):
        field = _ensemble_velocity if fused else _velocity
        ys, result, steps = _solve_one(dyn, x, ts, _with_metric(solver, dyn.W), controller,
                                       dt0, max_steps, adjoint, throw, field, event, noisy)
        if not fused:
            return ys, result, steps
        same = lambda a: jnp.broadcast_to(a, a.shape + x.shape[-1:])  # noqa: E731
        if event is not None:  # the full solution: times and counts shared by the chunk
            saved, ys, t_end, y_end, stats = ys
            ys = (same(saved), ys, same(t_end), y_end, jax.tree.map(same, stats))
        return ys, jax.tree.map(same, result), same(steps)

    return program


@eqx.filter_jit
def _solve_batched(dyn, x0, ts, solver, controller, dt0, max_steps, adjoint, throw, project_out,
                   checks, fused=False, chunk=None, event=None, noise=None, keys=None):
    inner = solver.solver if isinstance(solver, ManifoldSolver) else solver
    if isinstance(inner, dfx.AbstractImplicitSolver):
        dyn = dyn.with_forward_mode()  # Newton steps take Jacobian–vector products
    x0 = map_models(lambda d, x: prepare_tokens(d, x, checks=checks), dyn, x0)
    ts = ts.astype(x0.dtype)
    throw_now = throw and checks  # else the caller raises diffrax's message on the host
    # NaN/inf weights make every step fail, which diffrax reports as "out of steps":
    # name the cause instead, from the vector field at the start (per system). Only
    # an error needs it: with throw=False the per-system success says it already.
    started = jnp.ones(x0.shape[:-2], bool)
    if throw:
        v0 = map_models(lambda d, x: map_batch(lambda y: d.velocity(ts[0], y), x), dyn, x0)
        started = jnp.all(jnp.isfinite(v0), axis=(-2, -1))
    if throw_now:
        x0 = eqx.error_if(x0, ~jnp.all(started), NONFINITE)
    # A user's `event` is read at the start too: NaN there would reach the event's root
    # find as lineax's "non-finite input" (a message that names neither the event nor
    # the fix).
    event_ok = jnp.ones(x0.shape[:-2], bool)
    if isinstance(event, dfx.Event) and isinstance(event.cond_fn, UserEvent):
        cond = event.cond_fn.cond
        e0 = map_models(lambda d, x: map_batch(lambda y: jnp.asarray(cond(ts[0], y)), x),
                        dyn, x0)
        event_ok = jnp.isfinite(e0.reshape(x0.shape[:-2] + (-1,))).all(-1)
        if throw_now:
            x0 = eqx.error_if(x0, ~jnp.all(event_ok), EVENT_START)
    # With a user's event the failures are raised below, after the solve, so that the
    # event's own (a NaN in its root find) is named; the others keep diffrax's message.
    name_event = throw_now and _names_event(event, solver)
    program = _solve_program(ts, solver, controller, dt0, max_steps, adjoint,
                             throw_now and not name_event, event)
    if noise is None:
        out, result, steps = map_systems(program, dyn, x0, fused=fused, chunk=chunk)
    else:
        out, result, steps = map_keyed(lambda d, x, k: program(d, x, False, (noise, k)),
                                       dyn, x0, keys)
    full = out if event is not None else None
    ys = out if full is None else full[1]
    # Saved values between steps come from the solver's dense interpolant, which
    # leaves E_W by up to the local error; retract them like the steps. After an
    # event's stop the saved entries are inf (diffrax's convention): left as they are.
    saved = jnp.ones(ys.shape[:-2], bool) if full is None else jnp.isfinite(full[0])
    if project_out:
        ys = map_models(lambda d, y: project(y, d.W), dyn, ys)
    ys = jnp.where(saved[..., None, None], ys, jnp.inf)
    solved = (result == dfx.RESULTS.successful) | (result == dfx.RESULTS.event_occurred)
    finite = jnp.all(jnp.isfinite(ys) | ~saved[..., None, None],
                     axis=tuple(range(solved.ndim, ys.ndim)))
    if name_event:
        ys = eqx.error_if(ys, jnp.any(result == dfx.RESULTS.nonfinite_input), EVENT_RUN)
        first = jnp.argmin(solved.reshape(-1))
        item = jax.tree.map(lambda a: a.reshape(-1)[first], result)
        ys = item.error_if(ys, ~jnp.all(solved))
    if throw_now:
        ys = eqx.error_if(ys, ~jnp.all(finite), NONFINITE)
    if full is not None:
        y_end = map_models(lambda d, y: project(y, d.W), dyn, full[3]) if project_out \
            else full[3]
        ys = (full[0], ys, full[2], y_end, full[4])
    return ys, solved, finite, steps, result, (started, event_ok)


#: The messages of a user's `event` (`solve_flow(event=cond)`) that returned NaN or inf.
EVENT_START = (
    "jaxattn: the `event` function returned NaN or inf at the start (t = ts[0], the "
    "initial tokens): it must return a finite real (or a bool) wherever the run goes."
)
EVENT_RUN = (
    "jaxattn: the `event` function returned NaN or inf during the run (its root find "
    "met a non-finite value): it must return a finite real (or a bool) wherever the run goes."
)


class UserEvent(eqx.Module):
    """A user's `cond(t, x)` as diffrax's `cond_fn(t, y, args, **kwargs)`."""

    cond: object = eqx.field(static=True)

    def __call__(self, t, y, args, **kwargs):
        return self.cond(t, y)


def _raise_failure(solved, finite, result, started, event_nonfinite=False) -> None:
    """On the host, after a run of concrete inputs: the error `throw=True` raises
    inside `jit`, in the same order (the start's vector field and event, then the
    solve). With `event_nonfinite`, a non-finite input to a linear solve is the
    event's root find (explicit solvers solve nothing else)."""
    field_ok, event_ok = started
    raise_unless(field_ok, NONFINITE)
    raise_unless(event_ok, EVENT_START)
    if not bool(jnp.all(solved)):
        first = jnp.argmin(solved.reshape(-1))
        item = jax.tree.map(lambda a: a.reshape(-1)[first], result)
        if event_nonfinite and item == dfx.RESULTS.nonfinite_input:
            raise_unless(False, EVENT_RUN)
        raise eqx.EquinoxRuntimeError(dfx.RESULTS[item])
    raise_unless(finite, NONFINITE)


def _names_event(event, solver) -> bool:
    """Whether a solve's non-finite linear input can only be `event`'s root find: a
    user's event (`UserEvent`) and an explicit solver (an implicit one solves too)."""
    inner = solver.solver if isinstance(solver, ManifoldSolver) else solver
    return (isinstance(event, dfx.Event) and isinstance(event.cond_fn, UserEvent)
            and not isinstance(inner, dfx.AbstractImplicitSolver))


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
    strategy: str = "auto",
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
    - `strategy`: how a batch is executed. `"auto"` (default) takes the fused
      ensemble path for constant steps of an explicit solver (`ja.RK4`,
      `diffrax.Euler`, any explicit Runge–Kutta method) over a batch of small
      systems (`jaxattn._ensemble.fused_applies`: at least two sequences, each of
      at most `FUSED_MAX_FLOPS` flops per evaluation), and `"general"` otherwise.
      The fused path is one diffrax solve of the whole batch stored `(n, d, B)`,
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
    noise, key = check_noise(noise, key, shard=shard, strategy=strategy)
    dyn, x0, unflatten = stack_tokens(dyn, as_float_array(x0, "x0"))
    one = first_model(dyn)
    if devices is not None and dyn is not one:
        raise ValueError("`devices=` shards one model's batch: solve a stacked model "
                         "without `devices`, or shard the models yourself.")
    shard = check_shard(shard, dyn, one)
    x0 = check_token_shape(one, x0)
    if noise is not None:
        return unflatten(_solve_noisy(dyn, one, x0, ts, solver, rtol, atol, max_steps, dt0,
                                      adjoint, stepsize_controller, on_manifold, throw,
                                      solution, event, noise, key, devices,
                                      kernel=strategy == "kernel"))
    solver = dfx.Tsit5() if solver is None else solver
    options = _options(one, ts, solver, rtol, atol, max_steps, dt0, stepsize_controller,
                       on_manifold)
    event = _event(event, solution, x0.dtype)
    if strategy == "kernel":
        return unflatten(_solve_kernel(dyn, one, x0, options, throw, on_manifold, event,
                                       devices, shard))
    if event is not None and event is not True and strategy == "fused":
        raise ValueError("`event=` stops each sample on its own: use strategy=\"general\" "
                         "or \"auto\" (the fused path shares one run over the batch).")
    fused = shard == "batch" and (event is None or event is True) and _fused(
        one, x0.shape, strategy, options, (dyn, x0))
    if fused:
        options = _options(one, ts, solver, rtol, atol, max_steps, dt0, stepsize_controller,
                           on_manifold, fused=True)
    if x0.size == 0:  # an empty batch: diffrax cannot vmap over it
        if event is not None:
            raise ValueError("`solution=True` needs at least one sequence in `x0`.")
        return unflatten(_empty(x0, options[0], throw))
    (ys, solved, finite, steps, result, started), checked = call_batched(
        _solve_batched, dyn, x0, devices, *options, adjoint, bool(throw), bool(on_manifold),
        fused=fused, chunk=chunk_size(devices), event=event, shard=shard
    )
    if throw and not checked:
        _raise_failure(solved, finite, result, started, _names_event(event, options[1]))
    if event is not None:
        saved, ys, t_end, y_end, stats = ys
        stopped = result == dfx.RESULTS.event_occurred
        return unflatten(FlowSolution(saved, ys, t_end, y_end, stats, result, solved & finite,
                                      stopped))
    return unflatten(ys if throw else FlowResult(ys, solved & finite, steps))


#: Constant steps of a noisy `solve_flow` over `[ts[0], ts[-1]]` when `dt0` is not given:
#: strong error ~ step^{1/2} (docs/noise.md's measured orders), 3 % of σ at 1000 steps.
NOISY_STEPS = 1000


def _solve_noisy(dyn, one, x0, ts, solver, rtol, atol, max_steps, dt0, adjoint,
                 stepsize_controller, on_manifold, throw, solution, event, noise, key,
                 devices=None, kernel=False):
    """`solve_flow` with noise: one SDE solve per system, each with its own key (with
    `kernel`, constant steps in one Pallas kernel, `ΔW` drawn from the system's key)."""
    solver = noise.default_solver if solver is None else solver
    if dt0 is None:  # constant steps by default: NOISY_STEPS over the horizon
        span = float(np.max(np.asarray(ts)) - np.min(np.asarray(ts))) if is_concrete(ts) else 0
        if not span > 0:
            raise ValueError("`noise=` takes steps of `dt0`: pass `dt0=...` (the horizon "
                             "is empty or traced, so no default step can be drawn from it).")
        dt0 = span / NOISY_STEPS
    controller = dfx.ConstantStepSize() if stepsize_controller is None else stepsize_controller
    options = _options(one, ts, solver, rtol, atol, max_steps, dt0, controller, on_manifold)
    event = _event(event, solution, x0.dtype)
    if x0.size == 0:
        raise ValueError("`noise=` needs at least one sequence in `x0`.")
    keys = system_keys(key, x0.shape[:-2])
    if kernel:
        return _solve_kernel(dyn, one, x0, options, throw, on_manifold, event, devices,
                             "batch", noise=noise, keys=keys)
    (ys, solved, finite, steps, result, started), checked = call_batched(
        _solve_batched, dyn, x0, devices, *options, adjoint, bool(throw), bool(on_manifold),
        event=event, noise=noise, keys=keys)
    if throw and not checked:
        _raise_failure(solved, finite, result, started, _names_event(event, options[1]))
    if event is not None:
        saved, ys, t_end, y_end, stats = ys
        stopped = result == dfx.RESULTS.event_occurred
        return FlowSolution(saved, ys, t_end, y_end, stats, result, solved & finite, stopped)
    return ys if throw else FlowResult(ys, solved & finite, steps)


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


def _empty(x0, ts, throw: bool):
    """What `solve_flow` returns for a batch with no sequence in it."""
    batch = x0.shape[:-2]
    ys = jnp.zeros(batch + (ts.shape[0],) + x0.shape[-2:], x0.dtype)
    if throw:
        return ys
    return FlowResult(ys, jnp.zeros(batch, bool), jnp.zeros(batch, jnp.int32))


def solve_flow_unchecked(dyn, x0, ts, *, solver=dfx.Tsit5(), rtol=1e-6, atol=1e-8,
                         max_steps=16384, dt0=None, adjoint=dfx.RecursiveCheckpointAdjoint(),
                         stepsize_controller=None, on_manifold=True,
                         strategy: str = "auto") -> FlowResult:
    """`solve_flow(..., throw=False)` without value checks, for batches that are
    vmapped or sharded by the caller (no host callback in the program). `x0` must
    be finite and have no zero token; `dyn` may be a stacked model (as in `solve_flow`)."""
    dyn, x0, unflatten = stack_tokens(dyn, x0)
    one = first_model(dyn)
    options = _options(one, ts, solver, rtol, atol, max_steps, dt0, stepsize_controller,
                       on_manifold)
    fused = _fused(one, jnp.shape(x0), strategy, options, (dyn, x0))
    if fused:
        options = _options(one, ts, solver, rtol, atol, max_steps, dt0, stepsize_controller,
                           on_manifold, fused=True)
    ys, solved, finite, steps, *_ = _solve_batched(
        dyn, x0, *options, adjoint, False, bool(on_manifold), False, fused, chunk_size()
    )
    return unflatten(FlowResult(ys, solved & finite, steps))


def _fused(dyn, shape, strategy: str, options, operands) -> bool:
    """Whether the batch runs on the fused path (see `solve_flow`'s `strategy`):
    `"auto"` fuses constant steps of explicit solvers only, whose steps do not
    depend on the rest of the batch."""
    chosen = choose_strategy(dyn, shape, strategy, operands)
    if chosen == "kernel":
        raise ValueError("strategy='kernel' solves with ja.solve_flow (checked inputs): "
                         "take strategy='fused' here.")
    if strategy != "auto" or chosen == "general":
        return chosen == "fused"
    _, solver, controller, _, _ = options
    inner = solver.solver if isinstance(solver, ManifoldSolver) else solver
    return (isinstance(controller, dfx.ConstantStepSize)
            and isinstance(inner, (dfx.AbstractERK, dfx.Euler)))


def _options(dyn, ts, solver, rtol, atol, max_steps, dt0, stepsize_controller, on_manifold,
             fused=False):
    """Checked `(ts, solver, controller, dt0, max_steps)` for `_solve_batched`."""
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
    if on_manifold:
        solver = ManifoldSolver(solver, dyn.W, fused=fused)
    return ts, solver, controller, dt0, max_steps



def _kernel_plan(ts, solver, controller, dt0, max_steps) -> tuple:
    """`(t0, h, saves, steps per save, (c, a, b))` of a constant-step run whose steps land
    on the save times, for `strategy="kernel"`; anything else refused in one line."""
    inner = solver.solver if isinstance(solver, ManifoldSolver) else solver
    if isinstance(inner, dfx.Euler):
        coeffs = ((), (), (1.0,))
    elif isinstance(inner, dfx.AbstractERK) and inner.tableau.a_diagonal is None \
            and not inner.tableau.implicit:
        tab = inner.tableau
        coeffs = (tuple(map(float, tab.c)), tuple(tuple(map(float, a)) for a in tab.a_lower),
                  tuple(map(float, tab.b_sol)))
    else:
        raise ValueError(f"strategy='kernel' runs Euler and explicit Runge–Kutta solvers "
                         f"(ja.RK4, Heun, …), got {type(inner).__name__}.")
    if not isinstance(controller, dfx.ConstantStepSize):
        raise ValueError("strategy='kernel' takes constant steps: pass `dt0=` and no "
                         "adaptive `stepsize_controller`.")
    if not is_concrete(ts):
        raise ValueError("strategy='kernel' plans its steps from concrete `ts`: call it "
                         "outside jit, or take strategy='fused'.")
    tn = np.asarray(ts, np.float64)
    if tn.size == 1:
        return float(tn[0]), float(dt0), 0, 1, coeffs
    gap = (tn[-1] - tn[0]) / (tn.size - 1)
    per_save = max(1, round(gap / dt0))
    tol = 1e-6 * max(gap, np.finfo(np.float32).tiny)
    if np.any(np.abs(np.diff(tn) - gap) > tol) or abs(per_save * dt0 - gap) > 1e-6 * gap:
        raise ValueError("strategy='kernel' saves on its step grid: `ts` equally spaced, "
                         "each gap a whole number of steps `dt0`.")
    if per_save * (tn.size - 1) > max_steps:
        raise ValueError(f"strategy='kernel': {per_save * (tn.size - 1)} steps exceed "
                         f"max_steps={max_steps}.")
    return float(tn[0]), float(gap / per_save), tn.size - 1, per_save, coeffs


def _kernel_step(x, k, params, *, coeffs, on_manifold, noisy=False):
    """One explicit Runge–Kutta step (`coeffs = (c, a, b)`, the solver's tableau) of
    `dyn.velocity`, retracted onto `E_W` as `ManifoldSolver` retracts. With `noise`,
    every stage's increment is diffrax's for `MultiTerm(ODETerm, ControlTerm)`:
    `h v + kick(ΔW)`, with `ΔW = √h ξ` drawn from the system's key for step `k`
    (Euler: Itô Euler–Maruyama; Heun: its Stratonovich form)."""
    noise = None
    if not noisy:
        dyn, t0, h = params
    else:
        dyn, t0, h, noise, key = params
        dW = jnp.sqrt(h) * layer_normal(noise, key, k, *x.shape, x.dtype)
    c, a, b = coeffs
    t = t0 + k * h

    def increment(s, y):
        inc = h * dyn.velocity(s, y)
        return inc if noise is None else inc + noise.kick(dyn, s, y, dW)

    ks = [increment(t, x)]
    for ci, row in zip(c, a):
        y = x
        for aij, kj in zip(row, ks):
            if aij:
                y = y + aij * kj
        ks.append(increment(t + ci * h, y))
    y1 = x
    for bj, kj in zip(b, ks):
        if bj:
            y1 = y1 + bj * kj
    return project(y1, dyn.W) if on_manifold else y1


def _kernel_saved(x, params, *, on_manifold):
    return project(x, params[0].W) if on_manifold else x


def _chained(coeffs) -> bool:
    """Whether each stage reads only the one before it (`ja.RK4`, Heun, midpoint): the
    stages then run as iterations of the kernel's loop (`_kernel_stage`), so its body
    holds one velocity instead of every stage's (RK4 at S1's shape: 7.0k jaxpr equations
    against 20.8k unrolled; Triton's compile time grows with it)."""
    _, a, _ = coeffs
    return len(a) >= 1 and all(not any(row[:-1]) for row in a)


def _pick(table, s, dtype):
    """`table[s]` for a stage index `s` held as a float: a chain of selects."""
    out = jnp.zeros((), dtype)
    for j, value in enumerate(table):
        out = jnp.where(s == j, jnp.asarray(value, dtype), out)
    return out


def _kernel_stage(z, k, params, *, coeffs, on_manifold):
    """One stage of a chained explicit Runge–Kutta step (`_chained`), `k` the stage's
    index over the run: `z = (x, y, acc)`, the step's start, this stage's input and
    `x + Σ b_j k_j` so far (summed in `_kernel_step`'s order, so the two agree to the
    last bit). The last stage of a step writes the new tokens into all three."""
    dyn, t0, h = params
    c, a, b = coeffs
    stages = len(b)
    x, y, acc = z[0], z[1], z[2]
    step = jnp.floor(k / stages)
    s = k - stages * step
    t = t0 + step * h
    inc = h * dyn.velocity(t + _pick((0.0,) + tuple(c), s, x.dtype) * h, y)
    acc = acc + _pick(b, s, x.dtype) * inc
    nxt = x + _pick(tuple(row[-1] for row in a), s, x.dtype) * inc
    new = project(acc, dyn.W) if on_manifold else acc
    last = s == stages - 1
    parts = (jnp.where(last, new, x), jnp.where(last, new, nxt), jnp.where(last, new, acc))
    return jax.lax.concatenate([p[None] for p in parts], 0)


def _kernel_stage_saved(z, params, *, on_manifold):
    return _kernel_saved(z[0], params, on_manifold=on_manifold)


@eqx.filter_jit
def _flow_kernel(dyn, x0, t0, h, saves, per_save, coeffs, on_manifold, config, checks,
                 noise=None, keys=None):
    x0 = map_models(lambda d, x: prepare_tokens(d, x, checks=checks), dyn, x0)
    batch = x0.shape[:-2]
    params = (models_last(dyn, batch), jnp.asarray(t0, x0.dtype), jnp.asarray(h, x0.dtype))
    if noise is not None:
        params = params + (noise, key_rows(keys, batch))
    xb = to_batch_last(x0)
    if noise is None and _chained(coeffs):
        step = functools.partial(_kernel_stage, coeffs=coeffs, on_manifold=on_manifold)
        saved = functools.partial(_kernel_stage_saved, on_manifold=on_manifold)
        xb, per_save = jnp.stack([xb, xb, xb]), per_save * len(coeffs[2])
    else:
        step = functools.partial(_kernel_step, coeffs=coeffs, on_manifold=on_manifold,
                                 noisy=noise is not None)
        saved = functools.partial(_kernel_saved, on_manifold=on_manifold)
    ys, last = run_ensemble(step, saved, xb, params, num_saves=saves,
                            steps_per_save=per_save, config=config)
    ys = from_batch_last(ys, batch)
    finite = jnp.all(jnp.isfinite(ys), axis=tuple(range(len(batch), ys.ndim)))
    if checks:
        ys = eqx.error_if(ys, ~jnp.all(finite), NONFINITE)
    return ys, finite


def _solve_kernel(dyn, one, x0, options, throw, on_manifold, event, devices, shard,
                  noise=None, keys=None):
    """`solve_flow(..., strategy="kernel")`: constant steps of an explicit solver in
    one Pallas kernel (`jaxattn._pallas`), saved at `ts` on the step grid; with
    `noise`, each system's `ΔW` drawn in the kernel from its key (`keys`)."""
    if event is not None:
        raise ValueError("strategy='kernel' saves at `ts`: drop `solution=`/`event=`, or "
                         "take strategy='general'.")
    refuse_devices(devices, shard)
    choose_strategy(one, x0.shape, "kernel", (dyn, x0))
    ts, solver, controller, dt0, max_steps = options
    t0, h, saves, per_save, coeffs = _kernel_plan(ts, solver, controller, dt0, max_steps)
    (ys, finite), checked = call_batched(
        _flow_kernel, dyn, x0, None, t0, h, saves, per_save, coeffs, bool(on_manifold),
        kernel_config(), noise=noise, keys=keys)
    if throw:
        if not checked:
            raise_unless(finite, NONFINITE)
        return ys
    steps = jnp.full(finite.shape, saves * per_save, jnp.int32)
    return FlowResult(ys, finite, steps)
