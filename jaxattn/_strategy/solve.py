"""The continuous model's programs: diffrax solves of a batch of systems, one system
at a time (`Vmap`) or a chunk of systems as one state `(n, d, B)` (`BatchLast`), kept
on the manifold by `ManifoldSolver` (paper 001 eq. 6)."""

from typing import NamedTuple

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, Real

from .._batch import prepare_tokens
from .._ensemble import batch_last
from .._manifold import project
from .._noise import brownian_path, map_keyed, sde_terms
from .._programs import kept_jit
from .._stacked import map_batch, map_models, map_systems
from .._validate import NONFINITE, host_values, raise_unless
from .layers import flag_nonfinite
from .stepping import root_tolerances, stepped


class ManifoldSolver(dfx.AbstractWrappedSolver):
    """Wraps any diffrax solver and retracts each step back onto `E_W` with `N_W`.

    The flow (eq. 6) is tangent to `E_W` but its extension off it is not attracting
    (`d/dt |x|²_W = 2⟨x, v⟩_W (1 − |x|²_W)`), so an unprojected solver drifts from
    `E_W` over long horizons. Normalising the accepted `y1` is a retraction: it moves
    the step by less than its local error, keeps the order and the step-size control,
    and works for every solver. FSAL solvers reuse `f(y1)` from before it (a mismatch
    below the local error). With `fused=True` the state is an ensemble `(n, d, B)`.
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
      times it did not reach hold NaN: check `success` first.
    - `success`: `(...)` bool, whether the solver reached the last time.
    - `num_steps`: `(...)` accepted steps taken.
    """

    ys: Float[Array, "*batch T n d"]
    success: Bool[Array, "*batch"]
    num_steps: Int[Array, "*batch"]


class FlowSolution(NamedTuple):
    """What `solve_flow(..., solution=True)` returns, per sample of the batch, after
    diffrax's `Solution`.

    - `ts`: the save times `(..., T)`; with an `event` that stopped the run, or
      after a failure (`throw=False`), the times after the stop are `inf`
      (diffrax's convention).
    - `ys`: tokens at those times `(..., T, n, d)` (`inf` after a stop).
    - `t1`: `(...)` the time the solve ended: `ts[-1]`, the event's time, or where
      a failed run stopped.
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


class _ItoManifoldSolver(ManifoldSolver, dfx.AbstractItoSolver):
    """`ManifoldSolver` around an Itô solver (`diffrax.Euler`), marked as it is."""


class _StratonovichManifoldSolver(ManifoldSolver, dfx.AbstractStratonovichSolver):
    """`ManifoldSolver` around a Stratonovich solver (`diffrax.Heun`, `ja.RK4`)."""


def manifold_solver(solver, W, fused: bool = False) -> ManifoldSolver:
    """`ManifoldSolver(solver, W, fused)`, marked for SDEs as `solver` is (diffrax warns
    of a noisy solve by a solver marked neither Itô nor Stratonovich)."""
    for mark, cls in ((dfx.AbstractItoSolver, _ItoManifoldSolver),
                      (dfx.AbstractStratonovichSolver, _StratonovichManifoldSolver)):
        if isinstance(solver, mark):
            return cls(solver, W, fused)
    return ManifoldSolver(solver, W, fused)


def _velocity(t, x, dyn):
    return dyn.velocity(t, x)


_project_last = batch_last(project)
_velocity_last = batch_last(lambda x, dyn, t: dyn.velocity(t, x))


def _ensemble_velocity(t, x, dyn):
    """The vector field of a whole ensemble `(n, d, B)` (the fused path)."""
    return _velocity_last(x, dyn, t)


_STATS = ("num_steps", "num_accepted_steps", "num_rejected_steps")


def _with_metric(solver, W):
    """`solver` retracting onto `E_W` of the model it solves (one of a stacked model)."""
    if not isinstance(solver, ManifoldSolver):
        return solver
    return eqx.tree_at(lambda s: s.W, solver, W, is_leaf=lambda v: v is None)


def _on_host(controller, event, noise, progress, x) -> bool:
    """Whether a solve of concrete inputs (checked on the host) runs as
    `stepping.stepped`, without diffrax's in-program checks: constant steps or diffrax's
    PID controller (others, e.g. with `jump_ts`, check their times in the program); no
    event but a user's boolean one (`boolean_event`, of one system `x`), no noise or
    progress bar (they keep diffrax's solve)."""
    return (type(controller) in (dfx.ConstantStepSize, dfx.PIDController)
            and (event in (None, True) or boolean_event(event, x)) and noise is None
            and not progress)


def boolean_event(event, x) -> bool:
    """Whether `event` is a user's `cond(t, x)` (`UserEvent`) that returns a bool on the
    tokens `x` `(..., n, d)` of one system: diffrax stops at the end of the step after
    which it holds (a real one's crossing is located by a root find: diffrax's)."""
    if not (isinstance(event, dfx.Event) and isinstance(event.cond_fn, UserEvent)):
        return False
    one = jax.ShapeDtypeStruct(x.shape[-2:], x.dtype)
    return jax.eval_shape(event.cond_fn.cond, 0.0, one).dtype == jnp.bool_


def _solve_program(ts, solver, controller, dt0, max_steps, adjoint, throw, event=None,
                   progress=False, host=False):
    """`program(model, x, fused, noisy=None)` for `map_systems`: one diffrax solve of a
    system, or on the fused path of a chunk of systems as the state `(n, d, B)`, its
    status given to each of them: `(ys, result, accepted steps)`, and with an `event`
    (or when the full solution is asked for) `(ts, ys, t1, y1, stats)` in place of `ys`.
    With `noisy = (noise, key)` the SDE of that noise on the Brownian path of `key`.
    Fused, adaptive steps are shared per chunk (`BatchLast`). With `progress`,
    diffrax's progress bar (a host callback). With `host` (concrete inputs, checked on
    the host: `_on_host`), a program with no host callback: `stepping.stepped`."""
    full, stop = event is not None, None if event is True else event
    meter = dfx.TqdmProgressMeter() if progress else dfx.NoProgressMeter()
    saveat = (dfx.SaveAt(subs=[dfx.SubSaveAt(ts=ts), dfx.SubSaveAt(t1=True)]) if full
              else dfx.SaveAt(ts=ts))

    def program(dyn, x, fused, noisy=None):
        field = _ensemble_velocity if fused else _velocity
        if noisy is None:
            term = dfx.ODETerm(field)
        else:
            noise, key = noisy
            path = brownian_path(noise, key, ts[0], ts[-1], *x.shape, x.dtype)
            term = sde_terms(noise, path, *x.shape, x.dtype, field)
        # The model goes in as `args`, not a closure: BacksolveAdjoint differentiates
        # only through `args`, and a closed-over traced model breaks it.
        if host:
            ys, result, stats = stepped(term, _with_metric(solver, dyn.W), controller, ts,
                                        dt0, max_steps, x, dyn, stop, full)
        else:
            sol = dfx.diffeqsolve(
                term, _with_metric(solver, dyn.W), t0=ts[0], t1=ts[-1], dt0=dt0, y0=x,
                saveat=saveat, stepsize_controller=controller, max_steps=max_steps,
                adjoint=adjoint, throw=throw, args=dyn, progress_meter=meter, event=stop)
            ys, result, stats = sol.ys, sol.result, sol.stats
            if full:
                (ts_saved, t_end), (ys, y_end) = sol.ts, sol.ys
                ys = (ts_saved, ys, t_end[0], y_end[0])
        steps = stats["num_accepted_steps"]
        if full:
            ys = (*ys, {k: stats[k] for k in _STATS})
        if not fused:
            return ys, result, steps
        same = lambda a: jnp.broadcast_to(a[..., None], a.shape + x.shape[-1:])  # noqa: E731
        if full:  # the full solution: times and counts shared by the chunk
            saved, ys, t_end, y_end, stats = ys
            ys = (same(saved), ys, same(t_end), y_end, jax.tree.map(same, stats))
        return ys, jax.tree.map(same, result), same(steps)

    return program


@kept_jit
def solve_batched(dyn, x0, ts, solver, controller, dt0, max_steps, adjoint, throw, project_out,
                   checks, fused=False, chunk=None, event=None, noise=None, keys=None,
                   progress=False, host=False):
    inner = solver.solver if isinstance(solver, ManifoldSolver) else solver
    if isinstance(inner, dfx.AbstractImplicitSolver):
        # Newton steps take Jacobian–vector products.
        dyn = dyn.with_forward_mode()
        solver = root_tolerances(solver, controller)  # diffeqsolve's, refused in one line
    x0 = map_models(lambda d, x: prepare_tokens(d, x, checks=checks), dyn, x0)
    ts = ts.astype(x0.dtype)
    throw_now = throw and checks  # else the caller raises diffrax's message on the host
    def at_start(fn):  # fn(model, y) of every system at ts[0], finite per system
        out = map_models(lambda d, x: map_batch(lambda y: jnp.asarray(fn(d, y)), x), dyn, x0)
        return jnp.isfinite(out.reshape(x0.shape[:-2] + (-1,))).all(-1)

    # NaN/inf weights make every step fail, which diffrax reports as "out of steps":
    # name the cause instead, from the vector field at the start (per system). Only
    # an error needs it: with throw=False the per-system success says it already.
    started = jnp.ones(x0.shape[:-2], bool)
    if throw:
        started = at_start(lambda d, y: d.velocity(ts[0], y))
    if throw_now:
        x0 = eqx.error_if(x0, ~jnp.all(started), NONFINITE)
    # A user's `event` is read at the start too: NaN there would reach the event's root
    # find as lineax's "non-finite input" (a message that names neither the event nor
    # the fix).
    event_ok = jnp.ones(x0.shape[:-2], bool)
    if isinstance(event, dfx.Event) and isinstance(event.cond_fn, UserEvent):
        event_ok = at_start(lambda d, y: event.cond_fn.cond(ts[0], y))
        if throw_now:
            x0 = eqx.error_if(x0, ~jnp.all(event_ok), EVENT_START)
    # With a user's event the failures are raised below, after the solve, so that the
    # event's own (a NaN in its root find) is named; the others keep diffrax's message.
    name_event = throw_now and names_event(event, solver)
    host = host and not checks and _on_host(controller, event, noise, progress, x0)
    program = _solve_program(ts, solver, controller, dt0, max_steps, adjoint,
                             throw_now and not name_event, event, progress, host)
    if noise is None:
        out, result, steps = map_systems(program, dyn, x0, fused=fused, chunk=chunk)
    else:
        out, result, steps = map_keyed(lambda d, x, k: program(d, x, False, (noise, k)),
                                       dyn, x0, keys)
    if event is None:
        ys, saved = out, jnp.ones(out.shape[:-2], bool)
    else:
        ts_saved, ys, t_end, y_end, stats = out
        saved = jnp.isfinite(ts_saved)
    # Saved values between steps come from the solver's dense interpolant, which
    # leaves E_W by up to the local error; retract them like the steps. After an
    # event's stop the saved entries are inf (diffrax's convention): left as they are.
    def retract(y):
        return map_models(lambda d, z: project(z, d.W), dyn, y) if project_out else y

    ys = retract(ys)
    ys = jnp.where(saved[..., None, None], ys, jnp.inf)
    solved = (result == dfx.RESULTS.successful) | (result == dfx.RESULTS.event_occurred)
    finite = jnp.all(jnp.isfinite(ys) | ~saved[..., None, None],
                     axis=tuple(range(solved.ndim, ys.ndim)))
    if name_event:
        ys = eqx.error_if(ys, jnp.any(result == dfx.RESULTS.nonfinite_input), EVENT_RUN)
        ys = _first_failure(solved, result).error_if(ys, ~jnp.all(solved))
    ys = flag_nonfinite(ys, finite, throw_now)
    if event is not None:
        ys = (ts_saved, ys, t_end, retract(y_end), stats)
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


def raise_failure(solved, finite, result, started, event_nonfinite=False) -> None:
    """On the host, after a run of concrete inputs: the error `throw=True` raises
    inside `jit`, in the same order (the start's vector field and event, then the
    solve). With `event_nonfinite`, a non-finite input to a linear solve is the
    event's root find (explicit solvers solve nothing else)."""
    field_ok, event_ok = started
    raise_unless(field_ok, NONFINITE)
    raise_unless(event_ok, EVENT_START)
    if not np.all(host_values(solved)):  # on the host: no program for a check
        item = _first_failure(solved, result)
        if event_nonfinite and item == dfx.RESULTS.nonfinite_input:
            raise_unless(False, EVENT_RUN)
        raise eqx.EquinoxRuntimeError(dfx.RESULTS[item])
    raise_unless(finite, NONFINITE)


def _first_failure(solved, result):
    """The `RESULTS` of the first system that did not solve."""
    first = jnp.argmin(solved.reshape(-1))
    return jax.tree.map(lambda a: a.reshape(-1)[first], result)


def names_event(event, solver) -> bool:
    """Whether a solve's non-finite linear input can only be `event`'s root find: a
    user's event (`UserEvent`) and an explicit solver (an implicit one solves too)."""
    inner = solver.solver if isinstance(solver, ManifoldSolver) else solver
    return (isinstance(event, dfx.Event) and isinstance(event.cond_fn, UserEvent)
            and not isinstance(inner, dfx.AbstractImplicitSolver))


