"""Gradient-based exploration: initial tokens and weights that slow consensus.

`slow_consensus` maximises a measure of non-consensus at a horizon `T` by
differentiating through the flow or the layers, from several random restarts run as
one vmapped batch. Token iterates stay on `E_W` by reparametrisation (`x0 = N_W(y)`)
and retraction after every step; see docs/usage/explore.md.
"""

import functools
import warnings
from collections.abc import Callable
from typing import NamedTuple

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, Bool, Float, PRNGKeyArray, PyTree
from tqdm.auto import tqdm

from .._batch import as_mesh, shard_batch
from .._dynamics import SelfAttentionDynamics
from .._horizon import Horizon
from .._manifold import project, sample_ellipsoid, w_inner
from .._programs import kept_jit
from .._validate import (
    _token_defects,
    check_count,
    check_flag,
    check_scalar,
    is_concrete,
    is_one_key,
    refuse_first,
    surface_errors,
)
from ..metrics import hemisphere
from ._constraints import (
    Constraints,
    constrain_weights,
    constrained_start,
    retract_tokens,
    sum_gap_defect,
    token_violation,
    trainable_filter,
    weight_refusals,
    weight_violation,
)
from ._objectives import Trajectory, as_objective, make_trajectory, relative_difference

TARGETS = ("tokens", "weights", "both")


# --- the result ---------------------------------------------------------------------


class Exploration(NamedTuple):
    """What `slow_consensus` returns.

    - `x0`: the best initial tokens found `(n, d)`; `dyn`: the model they go with
      (the optimised weights when `target` includes `"weights"`).
    - `value`: the best objective value; `gain = value / mean(baseline)`, and
      `gain_median = value / median(baseline)` (the objective at random starts is
      heavy-tailed: a few starts far from consensus lift the mean). Both count the
      pick of the best start as gain (with `steps=0` they are above 1); `gain_best =
      value / max(baseline)` is what the search adds to the best of the baseline's
      random draws (below 1 where a draw it did not search from did better).
    - `trace`: `(steps + 1, R)` the objective at every iterate of every restart
      (row 0: the random starts).
    - `baseline`: the objective at random starts (the restarts' starts and
      `baseline_samples` more draws).
    - `x0s`, `values`: each restart's best tokens `(R, n, d)` and value `(R,)`;
      `weights`: each restart's best trained arrays (leading axis `R`) or `None`.
    - `violation`: `(steps + 1, R)` the largest constraint violation at every
      iterate (distance from `E_W`, depth outside the cap, asymmetry, relative
      norm excess, eigenvector/gap defect): rounding-level when constraints hold.
    """

    x0: Float[Array, "n d"]
    dyn: SelfAttentionDynamics
    value: float
    gain: float
    trace: np.ndarray
    baseline: np.ndarray
    x0s: Float[Array, "R n d"]
    values: np.ndarray
    weights: PyTree | None
    violation: np.ndarray
    baseline_mean: float = float("nan")
    baseline_median: float = float("nan")
    gain_median: float = float("nan")
    gain_best: float = float("nan")

    def __repr__(self) -> str:
        """Each field by name, arrays as their dtype and shape (`f64[8,3]`), as
        equinox prints a module: `print(result)` is a summary, not the data."""
        return eqx.tree_pformat(self, short_arrays=True)


# --- set-up of the restarts ---------------------------------------------------------


def _is_tokens(init) -> bool:
    return hasattr(init, "dtype") and jnp.issubdtype(init.dtype, jnp.floating)


def _sample(key, n, dyn, z, margin):
    x = sample_ellipsoid(key, n, dyn.dim, dyn.W)
    if z is None:
        return x
    x = x * jnp.where(w_inner(x, z[None], dyn.W) >= 0, 1.0, -1.0)[:, None]
    return retract_tokens(x, z, margin, dyn.W)


def _hemisphere_directions(dyn, x, constraints: Constraints, weights, rest):
    """Each restart's cap direction `z` `(R, d)` on `E_W`, or `None` ("start":
    `_start_directions`)."""
    hemi = constraints.hemisphere
    if hemi is None:
        return None
    if callable(hemi) and weights is not None:
        z = project(jax.vmap(lambda w: hemi(_combine(w, rest)))(weights), dyn.W)
    else:
        z = jnp.broadcast_to(_fixed_direction(dyn, constraints), (x.shape[0], dyn.dim))
    if not callable(hemi):
        return z
    # Orient each direction towards its start (eigenvectors have no sign).
    side = jnp.sum(w_inner(x, z[:, None, :], dyn.W), axis=-1)
    return z * jnp.where(side >= 0, 1.0, -1.0)[:, None]


def _combine(w, rest):
    return eqx.combine(w, rest) if w is not None else rest


@kept_jit(static_argnames=("restarts",))  # one program (op by op: ~20)
def _perturbed_weights(weights, restarts, noise, key):
    """`R` copies of the trained arrays; restarts after the first get relative noise."""
    leaves, treedef = jax.tree.flatten(weights)
    keys = jax.random.split(key, len(leaves))
    out = []
    for leaf, k in zip(leaves, keys):
        scale = noise * jnp.sqrt(jnp.mean(leaf**2))
        eps = scale * jax.random.normal(k, (restarts,) + leaf.shape, leaf.dtype)
        out.append(leaf[None] + eps.at[0].set(0.0))
    return jax.tree.unflatten(treedef, out)


# --- the optimisation loop ----------------------------------------------------------


class NamedOptimizer(eqx.Module):
    """An optax optimizer by its factory and keywords, built inside the search's
    programs: `NamedOptimizer(optax.adam, learning_rate=0.02)` is `optax.adam(0.02)`,
    but a later process loads the search's compiled programs whole from the cache
    folder (`kept_jit`; an optax optimizer's closures are traced in every process).

    **Arguments:**

    - `factory`: a module-level function of optax (or of another package the cache
      names: equinox, jax, ...) returning an `optax.GradientTransformation`.
    - `**options`: its keyword arguments (numbers, strings: printable values).
    """

    factory: Callable
    options: dict

    def __init__(self, factory: Callable, **options):
        rate = options.get("learning_rate", 1.0)
        refuse_first([(not callable(factory), TypeError, "`factory` must be an optax "
                       f"function such as optax.adam, got {factory!r}."),
                      # the search maximises: a negative rate minimised instead
                      (isinstance(rate, int | float) and not rate > 0, ValueError,
                       f"`learning_rate` must be > 0 (the search ascends), got {rate!r}.")])
        self.factory, self.options = factory, options

    def init(self, params):
        return self.factory(**self.options).init(params)

    def update(self, updates, state, params=None):
        return self.factory(**self.options).update(updates, state, params)


class _Loop(eqx.Module):
    """One restart's objective, gradient step and constraint map (vmapped over `R`)."""

    fn: Callable
    traj: Trajectory
    rest: PyTree
    mask: PyTree
    constraints: Constraints
    optimizer: optax.GradientTransformation | NamedOptimizer
    train_x: bool = eqx.field(static=True)
    train_w: bool = eqx.field(static=True)
    log: bool = eqx.field(static=True)

    def value(self, x, w):
        dyn = _combine(w, self.rest)
        ys = self.traj.run(dyn, project(x, dyn.W))
        out = self.fn(self.traj.ts.astype(ys.dtype), ys, dyn)
        refuse_first([(jnp.shape(out) != (), TypeError, "slow_consensus maximises one number; "
                       f"the objective returned shape {jnp.shape(out)}.")])
        return out

    def _loss(self, train, frozen):
        x = train[0] if self.train_x else frozen[0]
        w = train[1] if self.train_w else frozen[1]
        v = self.value(x, w)
        return -(jnp.log(v) if self.log else v), v

    def violation(self, x, w, z):
        dyn = _combine(w, self.rest)
        out = token_violation(x, z, self.constraints.margin, dyn.W)
        return jnp.maximum(out, weight_violation(dyn, self.constraints)) if self.train_w else out

    def project(self, x, w, z):
        """The constraint map: weights into their set, `z` updated, tokens retracted."""
        if self.train_w:
            w = eqx.filter(constrain_weights(_combine(w, self.rest), self.constraints), self.mask)
        hemi = self.constraints.hemisphere
        dyn = _combine(w, self.rest)
        if callable(hemi) and z is not None:
            z_new = project(jnp.asarray(hemi(dyn)), dyn.W)
            z = z_new * jnp.where(w_inner(z_new, z, dyn.W) >= 0, 1.0, -1.0)
        return retract_tokens(x, z, self.constraints.margin, dyn.W), w, z

    def step(self, state):
        """One optimiser step, then the constraint map. A step whose value or
        gradient is not finite is skipped (state and optimiser state kept), and
        with `constraints.sum_gap` a weight step that would break the gap of
        `Σ_η U_η` is rejected (the token step is kept): the iterate stays finite
        and feasible, whatever one restart runs into."""
        x, w, opt, z = state
        train = (x if self.train_x else None, w if self.train_w else None)
        (_, v), g = jax.value_and_grad(self._loss, has_aux=True)(train, (x, w))
        viol = self.violation(x, w, z)
        updates, opt_new = self.optimizer.update(g, opt, train)
        train = optax.apply_updates(train, updates)
        x_upd = train[0] if self.train_x else x
        new = self.project(x_upd, train[1] if self.train_w else w, z)
        if self.train_w and self.constraints.sum_gap is not None:
            ok_w = sum_gap_defect(_combine(new[1], self.rest), self.constraints.sum_gap) <= 0
            kept = (retract_tokens(x_upd, z, self.constraints.margin, self.rest.W), w, z)
            new = _select(ok_w, new, kept)
        finite = jnp.isfinite(v) & _all_finite((g, new))
        x_new, w_new, z_new = _select(finite, new, (x, w, z))
        return (x_new, w_new, _select(finite, opt_new, opt), z_new), (v, viol, ~finite)


def _select(pred, a, b):
    """`a` where `pred` (a scalar), else `b`, leaf by leaf (`None` leaves kept)."""
    return jax.tree.map(lambda p, q: jnp.where(pred, p, q), a, b)


def _all_finite(tree) -> Bool[Array, ""]:
    leaves = [jnp.all(jnp.isfinite(a)) for a in jax.tree.leaves(tree) if eqx.is_inexact_array(a)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


@kept_jit
def _run_chunk(loop: _Loop, state, best, length: int):
    def body(carry, _):
        state, best = carry
        new_state, (v, viol, skipped) = jax.vmap(loop.step)(state)
        best = _keep_best(best, state, v)
        return (new_state, best), (v, viol, skipped)

    (state, best), (vs, viols, skipped) = jax.lax.scan(body, (state, best), None,
                                                       length=length)
    return state, best, vs, viols, jnp.sum(skipped, axis=0)


def _where_rows(ok, a, b):
    """`a` where `ok` (one bool per restart: the leading axis), else `b`."""
    return jnp.where(ok.reshape((-1,) + (1,) * (a.ndim - 1)), a, b)


def _keep_best(best, state, v):
    best_v, best_x, best_w = best
    v = jnp.where(jnp.isnan(v), -jnp.inf, v)
    better = v > best_v
    pick = functools.partial(_where_rows, better)
    return (jnp.maximum(v, best_v), pick(state[0], best_x),
            None if best_w is None else jax.tree.map(pick, state[1], best_w))


@kept_jit
def _evaluate(loop: _Loop, x, w, z):
    """Objective and constraint violation of a batch of configurations (`w`, `z`:
    `None` or batched)."""
    return jax.vmap(loop.value)(x, w), jax.vmap(loop.violation)(x, w, z)


@kept_jit
def _finish(loop: _Loop, state, best):
    """The last iterate's objective and violation, and the best with it."""
    v, viol = _evaluate(loop, state[0], state[1], state[3])
    return _keep_best(best, state, v), v, viol


def _run_loop(loop, state, steps, progress, desc):
    R = state[0].shape[0]
    best = (np.full((R,), -np.inf, state[0].dtype), state[0], state[1])
    chunk = Horizon.pieces(steps, most=10) if steps else 0  # equal chunks compile once
    vs, viols, skipped = [], [], 0
    with tqdm(total=steps, desc=desc, unit="step", disable=not progress, leave=False) as bar:
        for _ in range(steps // chunk if chunk else 0):
            state, best, v, viol, skips = _run_chunk(loop, state, best, chunk)
            vs.append(np.asarray(v))
            viols.append(np.asarray(viol))
            skipped = skipped + np.asarray(skips)
            bar.update(chunk)
    best, v_last, viol_last = _finish(loop, state, best)
    vs.append(np.asarray(v_last)[None])
    viols.append(np.asarray(viol_last)[None])
    return best, np.concatenate(vs), np.concatenate(viols), skipped


# --- the backsolve check -----------------------------------------------------------------------


def _check_backsolve(loop: _Loop, x, w, rtol: float) -> None:
    """Refuse backsolve where it disagrees with the checkpointed adjoint at the start."""
    def grad_with(adjoint):
        lp = eqx.tree_at(lambda m: m.traj.adjoint, loop, adjoint)
        train = (x if lp.train_x else None, w if lp.train_w else None)
        return eqx.filter_jit(jax.grad(lambda t: lp._loss(t, (x, w))[0]))(train)

    rel = relative_difference(grad_with(dfx.BacksolveAdjoint()),
                              grad_with(dfx.RecursiveCheckpointAdjoint()))
    if not rel <= rtol:
        raise ValueError(
            f"adjoint='backsolve' is unreliable here: at the first start its gradient "
            f"differs from the checkpointed adjoint's by {rel:.3g} (relative; allowed "
            f"{rtol:g}). The reversed flow of a contracting system is unstable; use "
            "adjoint='checkpoint' (the default)."
        )
    warnings.warn(
        f"adjoint='backsolve' agreed with the checkpointed adjoint at the first start "
        f"(relative difference {rel:.2g}), but it is only checked there; the reversed "
        "flow of a contracting system is unstable and can fail later.",
        stacklevel=3,
    )


# --- the entry point ----------------------------------------------------------------


def _refusals(dyn, init, n, target, restarts, constraints, optimizer, baseline_samples):
    """Why `slow_consensus` refuses the request, as `(bad, error, message)`, each read
    once those before it hold."""
    yield (not isinstance(dyn, SelfAttentionDynamics), TypeError,
           f"expected a ja.SelfAttentionDynamics, got {type(dyn).__name__}.")
    yield target not in TARGETS, ValueError, f"`target` must be one of {TARGETS}, got {target!r}."
    shape = np.shape(init) if _is_tokens(init) else None
    yield (shape is None and not is_one_key(init), TypeError,
           "`init` must be a PRNG key (jax.random.key(seed)) or tokens (n, d) as a float "
           f"array, got {type(init).__name__}.")
    yield (shape is None and n is None, ValueError,
           "with a random `init` (a key), give the number of tokens `n`.")
    yield (shape is not None and (len(shape) not in (2, 3) or shape[-1] != dyn.dim
                                  or len(shape) == 3 and shape[0] != restarts), ValueError,
           f"`init` tokens must be (n, d) or (restarts={restarts}, n, d) with d={dyn.dim}, "
           f"got {shape}.")
    if shape is not None:  # (n, d) or (restarts, n, d): checked above
        yield (shape[-2] < 2, ValueError,
               f"`init` tokens must number n ≥ 2 (consensus needs two), got {shape[-2]}.")
    yield (n is not None and shape is not None and n != shape[-2], ValueError,
           f"`n`={n} disagrees with the `init` tokens' {shape and shape[-2]}: drop `n` (it "
           "is for a key as `init`).")
    bad = _token_defects(np.asarray(init), np) if shape and is_concrete(init) else (0, 0)
    yield bad[0], ValueError, "`init` tokens contain NaN or inf; pass finite tokens."
    yield (bad[1], ValueError, "an `init` token is zero, so it has no direction on E_W; "
           "every token needs a nonzero entry.")
    if shape and is_concrete(init) and not any(bad):  # tokens all one direction: nothing
        u = np.asarray(init, float).reshape(-1, *shape[-2:])  # moves, and log E is −inf
        u = u / np.linalg.norm(u, axis=-1, keepdims=True)
        one = np.flatnonzero(np.all(np.abs(u - u[:, :1]) <= 1e-12, axis=(1, 2)))[:1]
        yield (one.size, ValueError, f"the `init` tokens of restart {sum(one)} are a consensus "
               "already (one direction): the dynamics keep them there, so there is nothing to "
               "search; pass tokens apart.")
    yield (baseline_samples and shape is not None, ValueError,
           "`baseline_samples` draws random starts, so it needs a key as `init`; with "
           "tokens the baseline is their own objective.")
    hemi = getattr(constraints, "hemisphere", None)
    yield (isinstance(hemi, str) and shape is None, ValueError,
           "Constraints(hemisphere='start') keeps each restart in its start's hemisphere, so "
           "it needs starts inside one: pass tokens as `init` (random starts from a key may "
           "not be; or give the hemisphere a direction).")
    z = None if hemi is None or callable(hemi) or isinstance(hemi, str) else np.shape(hemi)
    yield (z is not None and z != (dyn.dim,), ValueError,
           f"`Constraints.hemisphere` must be a direction of shape ({dyn.dim},), got {z}.")
    yield (z is not None and is_concrete(hemi)
           and not (np.all(np.isfinite(hemi)) and np.any(np.asarray(hemi) != 0)), ValueError,
           "`Constraints.hemisphere` must be a finite nonzero direction, got "
           f"{np.asarray(hemi).tolist() if z else None}.")
    yield (optimizer is not None
           and not isinstance(optimizer, optax.GradientTransformation | NamedOptimizer),
           TypeError, "`optimizer` must be an optax transformation (e.g. optax.adam(0.02)) or "
           f"a NamedOptimizer, got {type(optimizer).__name__}.")
    yield (constraints is not None and not isinstance(constraints, Constraints), TypeError,
           f"`constraints` must be a ja.explore.Constraints, got {type(constraints).__name__}.")
    if target != "tokens":
        refusals = weight_refusals(dyn, constraints or Constraints())
        yield from ((bad, ValueError, message) for bad, message in refusals)


@surface_errors
def slow_consensus(
    dyn: SelfAttentionDynamics,
    *,
    init: PRNGKeyArray | Float[Array, "*R n d"],
    n: int | None = None,
    target: str = "tokens",
    objective: str | Callable = "pairwise",
    horizon: float = 5.0,
    steps: int = 100,
    optimizer: optax.GradientTransformation | NamedOptimizer | None = None,
    restarts: int = 8,
    constraints: Constraints | None = None,
    model: str = "flow",
    saves: int = 100,
    tau: float = 0.1,
    adjoint: str | dfx.AbstractAdjoint = "checkpoint",
    adjoint_rtol: float = 1e-3,
    log: bool | None = None,
    weight_noise: float = 0.3,
    baseline_samples: int = 0,
    key: PRNGKeyArray | None = None,
    progress: bool = False,
    devices=None,
) -> Exploration:
    """Search initial tokens and/or weights that maximise a measure of
    non-consensus at a horizon, by gradient ascent through the dynamics.

    Restarts run as one vmapped batch; the best iterate over all restarts and steps
    is returned with the baseline (the same objective at random starts).

    **Arguments:**

    - `dyn`: the model (its weights are the start when `target` includes weights).
    - `init`: a PRNG key (random starts: uniform on `E_W`, reflected into the cap
      with a fixed `constraints.hemisphere`) or tokens `(n, d)` / `(restarts, n, d)`,
      `n ≥ 2`.
    - `n`: the number of tokens, with a key as `init`.
    - `target`: `"tokens"` (initial tokens), `"weights"` (the fields
      `constraints.train`, from fixed starts) or `"both"`.
    - `objective`: `"pairwise"` (default: the symmetric misalignment at `T`),
      `"final"` (`E(x(T))`, against token 1), `"integrated"` (`∫₀ᵀ E dt`),
      `"consensus_time"` (smooth), `"lyapunov"` (`V(x(T))`), see
      `builtin_objective`; or a function `(ts, ys) ↦ scalar` or
      `(ts, ys, dyn) ↦ scalar` of one trajectory `ys (T, n, d)`. Maximised.
    - `horizon`: the final time `T`.
    - `steps`: optimiser steps, ≥ 0 (0 evaluates the starts); a step whose value,
      gradient or update is NaN or inf is skipped (the restart stays where it was): a
      `ValueError` when every step of every restart was skipped, a warning when some
      restarts never moved. `optimizer`: an
      optax transformation (default `optax.adam(0.02)`), applied per restart; as a
      `NamedOptimizer` (the default is one), a later process loads the search's
      compiled programs instead of tracing them.
    - `restarts`: the number `R` of starts optimised together.
    - `constraints`: a `Constraints` (tokens always stay on `E_W`).
    - `model`: `"flow"` (`solve_flow`, saved at `saves + 1` times) or `"layers"`
      (`max(1, round(T / tau))` layers of `run_layers`, a checkpointed scan).
    - `adjoint`: `"checkpoint"` (default, `diffrax.RecursiveCheckpointAdjoint`),
      `"backsolve"` (refused with a `ValueError` when its gradient at the first
      start differs from the checkpointed one by more than `adjoint_rtol`, else a
      warning) or any diffrax adjoint.
    - `log`: `True` or `False`, maximise `log(objective)` (same maximiser, better
      scaled as `E` spans decades); default (`None`): yes for the built-in objectives.
    - `weight_noise`: relative noise on the weights of restarts after the first.
    - `baseline_samples`: extra random starts for the baseline (key `init` only).
    - `key`: for the weight noise and the baseline samples.
    - `progress`: show a progress bar.
    - `devices`: shard the restarts over devices (`None`, an int, a list of
      devices or a `Mesh`, as in `ja.run_layers`): each device optimises its share
      of the restarts. Results equal the unsharded run.

    **Returns:**

    An `Exploration` (best `x0`, `dyn`, `value`, `gain`, `trace`, `baseline`, ...).
    """
    restarts = check_count(restarts, "restarts", 1)
    steps = check_count(steps, "steps")
    baseline_samples = check_count(baseline_samples, "baseline_samples")
    if isinstance(init, list | tuple):  # tokens written out
        init = np.asarray(init, jnp.result_type(float))
    if n is not None:
        n = check_count(n, "n", 2)
    refuse_first(_refusals(dyn, init, n, target, restarts, constraints, optimizer,
                           baseline_samples))
    log = None if log is None else check_flag(log, "log")
    weight_noise = check_scalar(weight_noise, "weight_noise", nonnegative=True)
    adjoint_rtol = check_scalar(adjoint_rtol, "adjoint_rtol", nonnegative=True)  # 0: any change
    traj = make_trajectory(horizon, model=model, saves=saves, tau=tau, adjoint=adjoint)
    start, loop = _make_loop(dyn, target=target, objective=objective, traj=traj,
                             optimizer=optimizer, constraints=constraints, log=log)
    x = _start_tokens(start, init, n, restarts, loop.constraints)
    z = _start_directions(start, x) if isinstance(loop.constraints.hemisphere, str) else None
    weights = None
    if loop.train_w:
        key = jax.random.PRNGKey(0) if key is None else key
        weights = _perturbed_weights(eqx.filter(start, loop.mask), restarts, weight_noise, key)
    x, state_w, z, opt_state = _starts(loop, start, x, z, weights)
    if isinstance(traj.adjoint, dfx.BacksolveAdjoint) and traj.model == "flow":
        w0 = None if state_w is None else jax.tree.map(lambda a: a[0], state_w)
        _check_backsolve(loop, x[0], w0, adjoint_rtol)
    state = (x, state_w, opt_state, z)
    mesh = as_mesh(devices)
    if mesh is not None:  # pad the restarts with copies of restart 0, dropped below
        state = jax.tree.map(lambda a: shard_batch(a, mesh, 1)[0], state)
    (best_v, best_x, best_w), trace, violation, skipped = _run_loop(
        loop, state, steps, progress, "slow_consensus")
    R = x.shape[0]  # on the host: indexing device arrays would compile a program per index
    best_v, best_x, best_w = jax.tree.map(lambda a: np.asarray(a)[:R], (best_v, best_x, best_w))
    ran = trace.shape[0] - 1  # the steps taken
    stuck = int(np.sum(np.asarray(skipped)[:R] == ran)) if ran else 0
    refuse_first([(not np.isfinite(best_v).any(), ValueError,
                   "the objective was NaN or inf at every start and step: check that it "
                   "is finite at the starts (e.g. log of a zero E: pass log=False)."),
                  (stuck == R, ValueError,
                   "every step of every restart was skipped (a NaN or inf step or "
                   "gradient), so nothing was searched: check the optimizer (e.g. its "
                   "learning rate) and that the objective's gradient is finite.")])
    if stuck:
        warnings.warn(f"{stuck} of {R} restarts had every step skipped (a NaN or inf step "
                      "or gradient): they stayed at their starts.", stacklevel=2)
    trace, violation = trace[:, :R], violation[:, :R]
    baseline = trace[0]
    if baseline_samples:  # a key as `init` (`_refusals`)
        baseline = np.concatenate([baseline, _baseline(loop, dyn, init, n, baseline_samples,
                                                       state_w, z)])
    r = int(np.argmax(best_v))
    w_best = None if best_w is None else jax.tree.map(lambda a: jnp.asarray(a[r]), best_w)
    # a zero baseline (starts at consensus): gain inf, or NaN where the value is 0 too
    with np.errstate(divide="ignore", invalid="ignore"):
        gains = best_v[r] / np.array([np.mean(baseline), np.median(baseline), np.max(baseline)])
    return Exploration(
        x0=jnp.asarray(best_x[r]), dyn=_combine(w_best, loop.rest), value=float(best_v[r]),
        gain=float(gains[0]), trace=trace, baseline=np.asarray(baseline),
        x0s=jnp.asarray(best_x), values=best_v, weights=jax.tree.map(jnp.asarray, best_w),
        violation=violation,
        baseline_mean=float(np.mean(baseline)), baseline_median=float(np.median(baseline)),
        gain_median=float(gains[1]), gain_best=float(gains[2]),
    )


def _make_loop(dyn, *, target, objective, traj: Trajectory, optimizer, constraints, log):
    """`(dyn, loop)`: the model with its weight constraints applied, and one restart's
    `_Loop` (see `slow_consensus`; it checked the request)."""
    constraints = constraints or Constraints()
    fn, builtin = as_objective(objective)
    train_w = target in ("weights", "both")
    mask = trainable_filter(dyn, constraints)
    if train_w:
        dyn = constrained_start(dyn, constraints)[0]
    rest = eqx.filter(dyn, mask, inverse=True) if train_w else dyn
    optimizer = optimizer or NamedOptimizer(optax.adam, learning_rate=0.02)
    loop = _Loop(fn, traj, rest, mask, constraints, optimizer,
                 target in ("tokens", "both"), train_w, builtin if log is None else bool(log))
    return dyn, loop


@kept_jit
def _start_tokens(dyn, init, n, restarts: int, constraints: Constraints) -> Float[Array, "R n d"]:
    """`R` starting token sets: given (broadcast), or random on `E_W` / in the cap of
    a fixed `constraints.hemisphere`."""
    if _is_tokens(init):
        x = jnp.asarray(init, jnp.result_type(float))
        return project(jnp.broadcast_to(x, (restarts,) + x.shape[-2:]), dyn.W)
    keys = jax.random.split(init, restarts)
    z_fixed = _fixed_direction(dyn, constraints)
    return jax.vmap(lambda k: _sample(k, n, dyn, z_fixed, constraints.margin))(keys)


@kept_jit
def _starts(loop: _Loop, dyn, x, z, weights):
    """Every restart's start, feasible for the constraints, and its optimiser state:
    `(x, weights, z, opt_state)`, tokens `(R, n, d)`, the trained arrays (leading axis
    `R`; `None` unless weights are trained; given perturbed), the cap directions
    `(R, d)` or `None` (`z`: given for `hemisphere="start"`, else `None`)."""
    constraints = loop.constraints
    if loop.train_w:
        weights = jax.vmap(lambda w: loop.project(jnp.zeros((1, dyn.dim)), w, None)[1])(weights)
        weights = _feasible_starts(weights, loop.rest, constraints)
    if z is None:
        z = _hemisphere_directions(dyn, x, constraints, weights, loop.rest)
    if z is not None:
        x = jax.vmap(lambda xi, zi: retract_tokens(xi, zi, constraints.margin, dyn.W))(x, z)
    train = (x if loop.train_x else None, weights if loop.train_w else None)
    return x, weights, z, jax.vmap(loop.optimizer.init)(train)


def _start_directions(dyn, x) -> Float[Array, "R d"]:
    """Each start's own cap direction (`hemisphere="start"`: its certificate, found on
    the host)."""
    h = hemisphere(x, dyn.W)
    if not bool(np.all(np.asarray(h.inside))):
        bad = np.flatnonzero(~np.asarray(h.inside))
        raise ValueError(f"hemisphere='start' needs every start inside an open hemisphere; "
                         f"restart {bad[0]}'s tokens are in none: pass other starts, or give "
                         "the hemisphere a direction.")
    return project(jnp.asarray(h.z, x.dtype), dyn.W)


def _feasible_starts(weights, rest, constraints: Constraints):
    """With `sum_gap` (kept by rejection; the entry checked that the model satisfies
    it): restarts whose perturbed weights break it start from the unperturbed ones."""
    if constraints.sum_gap is None:
        return weights
    defect = jax.vmap(lambda w: sum_gap_defect(_combine(w, rest), constraints.sum_gap))(weights)
    ok = defect <= 0
    return jax.tree.map(lambda a: _where_rows(ok, a, a[:1]), weights)


def _fixed_direction(dyn, constraints):
    hemi = constraints.hemisphere
    if hemi is None or isinstance(hemi, str):
        return None
    z = hemi(dyn) if callable(hemi) else hemi
    return project(jnp.asarray(z, jnp.result_type(float)), dyn.W)


def _baseline(loop, dyn, init, n, samples, weights, z):
    """The objective at `samples` more random starts (with restart 0's weights)."""
    zf = None if z is None else z[0]
    keys = jax.random.split(jax.random.fold_in(init, 1), int(samples))
    xs = jax.vmap(lambda k: _sample(k, n, dyn, zf, loop.constraints.margin))(keys)
    w = None if weights is None else jax.tree.map(
        lambda a: jnp.broadcast_to(a[0], (int(samples),) + a.shape[1:]), weights)
    zs = None if z is None else jnp.broadcast_to(zf, (int(samples), zf.shape[0]))
    v, _ = _evaluate(loop, xs, w, zs)
    return np.asarray(v)
