"""Stepping a flow outside `diffeqsolve`. `stepped`: diffrax's own solver step,
controller and interpolation in a loop, so that a run on concrete inputs holds no host
callback. `kernel_*`: constant steps of an explicit Runge–Kutta solver (diffrax's own
tableau) as `PallasKernel` runs a flow, one step or stage of one system."""

import diffrax as dfx
import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.numpy as jnp
import numpy as np

from .._manifold import project
from .._noise import layer_normal
from .._validate import is_concrete
from .base import refuse_first


def stepped(term, solver, controller, ts, dt0, max_steps, y0, args, event=None,
            full=False):
    """`diffeqsolve(term, solver, ts[0], ts[-1], dt0, y0, args, SaveAt(ts=ts),
    stepsize_controller=controller, max_steps=max_steps, throw=False)`'s loop without
    its in-program checks (why: `docs/usage/strategies.md`, "Flows without host
    callbacks"); a `while_loop` (not reverse-differentiable: for concrete inputs).
    For a solver under `ConstantStepSize` or `PIDController` (they never report a jump),
    an implicit one's root finder given its tolerances as diffeqsolve gives them
    (`root_tolerances`). Returns `(ys, result, stats)` as one solve gives them.

    With `event`, a `diffrax.Event` of one condition `cond_fn(t, y, args)` that returns
    a bool (`boolean_event`), the run stops as diffeqsolve stops it: at the end of the
    step after which the condition holds (before the first step when it holds at
    `ts[0]`), `result` `event_occurred`; `ys` is then `(ts, ys, t1, y1)`: the save times
    and tokens, `inf` where the run did not reach them, and the time and state where it
    ended (diffrax's `y1` with a root finder is the step's interpolation there: the
    same to rounding, up to a `ManifoldSolver`'s retraction). So is it with `full`
    (the full solution without an event): a run that failed ends before `ts[-1]`."""
    solver = root_tolerances(solver, controller)
    t0, t1 = ts[0], ts[-1]
    floor = t1  # diffrax's: a step ending within 100 ULPs of t1 ends on it
    for _ in range(100):
        floor = eqxi.prevbefore(floor)
    # diffeqsolve hands its controller the term wrapped (`WrapTerm`), for which the PID
    # controller's choice of a first step returns 0.01 whatever the term: the same here.
    dt0 = 0.01 if dt0 is None else dt0
    order = solver.error_order(term)
    tnext, cstate = controller.init(term, t0, t1, y0, dt0, args, solver.func, order)
    tnext = jnp.minimum(tnext, t1)
    sstate = solver.init(term, t0, tnext, y0, args)
    ok = lambda r: r == dfx.RESULTS.successful  # noqa: E731

    def stop(result, t, y):  # diffrax's: the event's result replaces any other
        if event is None:
            return result
        return dfx.RESULTS.where(event.cond_fn(t, y, args), dfx.RESULTS.event_occurred, result)

    def save(ys, a, b, dense):  # the save times in the accepted step (a, b]
        inside = (ts > a) & (ts <= b)
        at = jax.vmap(solver.interpolation_cls(t0=a, t1=b, **dense).evaluate)(ts)
        mask = lambda v: inside.reshape(ts.shape + (1,) * (v.ndim - 1))  # noqa: E731
        return jax.tree.map(lambda u, v: jnp.where(mask(v), u, v), at, ys)

    def step(c):
        y, tprev, tnext, sstate, cstate, result, (steps, accepted), saved = c
        y1, error, dense, sstate1, solved = solver.step(term, tprev, tnext, y, args, sstate,
                                                         False)
        error = jax.tree.map(lambda e: jnp.where(jnp.isnan(e), jnp.inf, e), error)
        keep, tp, tn, _, cstate, adapted = controller.adapt_step_size(
            tprev, tnext, y, y1, args, error, order, cstate)
        tp = jnp.minimum(tp, t1)
        tn = jnp.where(tn > floor, jnp.where(keep, t1, tp + 0.5 * (t1 - tp)), tn)
        kept = lambda a, b: jax.tree.map(lambda u, v: jnp.where(keep, u, v), a, b)  # noqa: E731
        result = dfx.RESULTS.where(ok(result) & keep, solved, result)
        result = dfx.RESULTS.where(ok(result), adapted, result)
        saved = kept(save(saved, tprev, tnext, dense), saved)
        y = kept(y1, y)
        return (y, tp, tn, kept(sstate1, sstate), cstate, stop(result, tp, y),
                (steps + 1, accepted + keep), saved)

    zero = jnp.zeros((), jnp.int32)
    ys = jax.tree.map(lambda v: jnp.broadcast_to(v, ts.shape + v.shape), y0)  # ts[0] = t0
    c = jax.lax.while_loop(
        lambda c: (c[1] < t1) & ok(c[5]) & (c[6][0] < max_steps), step,
        (y0, t0, tnext, sstate, cstate, stop(dfx.RESULTS.successful, t0, y0), (zero, zero),
         ys))
    y1, tprev, result, (steps, accepted), ys = c[0], c[1], c[5], c[6], c[7]
    result = dfx.RESULTS.where(ok(result) & (tprev < t1), dfx.RESULTS.max_steps_reached,
                               result)
    stats = dict(num_steps=steps, num_accepted_steps=accepted,
                 num_rejected_steps=steps - accepted)
    # inf where the run did not reach (diffeqsolve's): `ts[0]` is saved unless an
    # event stopped the run before its first step
    reached = (ts <= tprev) & ((accepted > 0) | (event is None))
    unreached = lambda v: jnp.where(reached.reshape(ts.shape + (1,) * (v.ndim - 1)),  # noqa: E731
                                    v, jnp.inf)
    if event is None and not full:
        return jax.tree.map(unreached, ys), result, stats
    if event is None:  # the last save where the run reached `ts[-1]` (as before), else y1
        y1 = jax.tree.map(lambda a, b: jnp.where(tprev < t1, a, b[-1]), y1, ys)
    return (unreached(ts), jax.tree.map(unreached, ys), tprev, y1), result, stats


#: diffrax's default root finder of its implicit solvers, and its tolerances: "taken
#: from the step-size controller" (`use_stepsize_tol`).
DEFAULT_ROOT_FINDER = dfx.Kvaerno3().root_finder
FROM_CONTROLLER = DEFAULT_ROOT_FINDER.rtol
_TOLERANCES = ("rtol", "atol", "norm")


def root_tolerances(solver, controller):
    """`solver` with the tolerances its root finder takes from the step-size controller
    filled from `controller`, as diffeqsolve fills them; an implicit solver left without
    them under constant steps is refused in one line (diffeqsolve: a paragraph)."""
    if not isinstance(solver, dfx.AbstractImplicitSolver):
        return solver
    unset = [a for a in _TOLERANCES if getattr(solver.root_finder, a) is FROM_CONTROLLER]
    if not unset:
        return solver
    if not isinstance(controller, dfx.AbstractAdaptiveStepSizeController):
        raise ValueError(
            "An implicit solver under constant steps needs its root finder's tolerances: "
            "pass an adaptive stepsize_controller (diffrax.PIDController(rtol, atol)), or a "
            "root finder with rtol, atol and norm set (diffrax.VeryChord(rtol, atol, norm)).")
    return eqx.tree_at(lambda s: [getattr(s.root_finder, a) for a in unset], solver,
                       [getattr(controller, a) for a in unset])


def kernel_plan(ts, solver, controller, dt0, max_steps) -> tuple:
    """`(t0, h, saves, steps per save, (c, a, b))` of a constant-step run whose steps land
    on the save times, for `strategy="kernel"`; anything else refused in one line."""
    inner = solver.solver if isinstance(solver, dfx.AbstractWrappedSolver) else solver
    explicit = isinstance(inner, dfx.Euler) or (isinstance(inner, dfx.AbstractERK) and (
        inner.tableau.a_diagonal is None and not inner.tableau.implicit))
    constant = isinstance(controller, dfx.ConstantStepSize)
    tn = np.asarray(ts, np.float64) if is_concrete(ts) else None
    on_grid, steps, gap, per_save = True, 0, 0.0, 1
    if explicit and constant and tn is not None and tn.size > 1:
        gap = (tn[-1] - tn[0]) / (tn.size - 1)
        per_save = max(1, round(gap / dt0))
        tol = 1e-6 * max(gap, np.finfo(np.float32).tiny)
        on_grid = not (np.any(np.abs(np.diff(tn) - gap) > tol)
                       or abs(per_save * dt0 - gap) > 1e-6 * gap)
        steps = per_save * (tn.size - 1)
    refuse_first("kernel", (
            (not explicit, "runs Euler and explicit Runge–Kutta solvers (ja.RK4, Heun, …), "
                           f"got {type(inner).__name__}."),
            (not constant, "takes constant steps: pass `dt0=` and, for a solver with "
                           "an error estimate (ja.RK4, Heun, …), "
                           "`stepsize_controller=diffrax.ConstantStepSize()`."),
            (tn is None, "plans its steps from concrete `ts`: call it outside jit, or take "
                         "strategy=ja.BatchLast() ('fused')."),
            (not on_grid, "saves on its step grid: `ts` equally spaced, each gap a whole "
                          "number of steps `dt0`."),
            (steps > max_steps, f"{steps} steps exceed max_steps={max_steps}.")))
    if isinstance(inner, dfx.Euler):
        coeffs = ((), (), (1.0,))
    else:
        tab = inner.tableau
        coeffs = (tuple(map(float, tab.c)), tuple(tuple(map(float, a)) for a in tab.a_lower),
                  tuple(map(float, tab.b_sol)))
    h = gap / per_save if tn.size > 1 else dt0
    return float(tn[0]), float(h), tn.size - 1, per_save, coeffs


def kernel_step(x, k, params, *, coeffs, on_manifold, noisy=False):
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

    def combined(weights, ks):  # x + Σ_j w_j k_j, zero weights skipped
        y = x
        for w, kj in zip(weights, ks):
            if w:
                y = y + w * kj
        return y

    ks = [increment(t, x)]
    for ci, row in zip(c, a):
        ks.append(increment(t + ci * h, combined(row, ks)))
    y1 = combined(b, ks)
    return project(y1, dyn.W) if on_manifold else y1


def kernel_saved(x, params, *, on_manifold):
    return project(x, params[0].W) if on_manifold else x


def chained(coeffs) -> bool:
    """Whether each stage reads only the one before it (`ja.RK4`, Heun, midpoint): the
    stages then run as iterations of the kernel's loop (`kernel_stage`), so its body
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


def kernel_stage(z, k, params, *, coeffs, on_manifold):
    """One stage of a chained explicit Runge–Kutta step (`chained`), `k` the stage's
    index over the run: `z = (x, y, acc)`, the step's start, this stage's input and
    `x + Σ b_j k_j` so far (summed in `kernel_step`'s order, so the two agree to the
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


def kernel_stage_saved(z, params, *, on_manifold):
    return kernel_saved(z[0], params, on_manifold=on_manifold)

