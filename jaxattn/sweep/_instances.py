"""The experiments of paper 001 §6.1 as batched, per-instance outcomes for sweeps.

An *instance* is one random model and one random start, drawn exactly as
`jaxattn run NAME --seed S` draws them (`S = seed + instance`; for
`thm51-causal` with `--samples 1`), so any row of a sweep table can be re-run
alone. Each set-up is written for one instance and vmapped over the keys of a
chunk; it returns the final misalignment `E`, the path of `E` on the saved
times (for the consensus time), whether the theorem's outcome was reached, the
solver status and, where the domain test runs in the compiled program, whether
the start lies in the theorem's domain.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._flow import solve_flow_unchecked
from .._layers import run_layers_unchecked
from .._manifold import normalize, sample_ellipsoid
from ..experiments import paper
from ..experiments.base import Param
from ..metrics._consensus import misalignment

TOL = 1e-4  # the experiments' tolerance: consensus is E < TOL, a limit is 1 − ⟨x, ℓ⟩ < TOL

#: Parameters a sweep adds to every experiment (the model's inverse temperature).
BETA = Param("beta", float, 1.0, "inverse temperature β of the attention", 0.0)
#: Experiment parameters that a sweep replaces (`--instances`).
EXCLUDED = ("samples",)


@dataclasses.dataclass(frozen=True)
class SweepModel:
    """How one experiment is drawn and judged, one instance at a time.

    `build(key, p, s)` returns `(dyn, x0, extra)` for one instance (`p`: the float
    parameters as arrays, `s`: the static ones as a dict); `judge(dyn, x0, xT, T,
    extra)` returns `(in_domain, reached)` (`in_domain` may be `None`: decided on
    the host by `host_domain(x0)`). `misalign(ys, extra)` measures `E` on states.
    """

    theorem: str
    build: Callable
    judge: Callable
    misalign: Callable = lambda ys, extra: misalignment(ys)
    host_domain: Callable | None = None
    start: Callable = lambda x0, extra: x0  # the state the simulators are started at


def _with_beta(dyn, beta):
    return eqx.tree_at(lambda d: d.beta, dyn, jnp.asarray(beta, dyn.beta.dtype))


# --- thm41-sphere: consensus from a hemisphere -------------------------------------


def _sphere_build(key, p, s):
    k_model, k_x = jax.random.split(key)
    dyn = _with_beta(paper.sphere_dynamics(k_model, s["heads"]), p["beta"])
    return dyn, paper.hemisphere_tokens(k_x, s["tokens"], 3), None


def _sphere_judge(dyn, x0, xT, T, extra):
    return None, misalignment(xT) < TOL


def _sphere_domain(x0):
    from ..metrics._hemisphere import hemisphere

    return np.asarray(hemisphere(jnp.asarray(x0)).inside)


# --- thm51-causal: every token → x₁(0), in span coordinates ------------------------


def _causal_build(key, p, s):
    k_w, k_x = jax.random.split(key)
    weights = paper.causal_weights(k_w, s["dim"], s["heads"], p["amplitude"], p["max_freq"])
    x0 = jax.random.uniform(k_x, (1, s["tokens"], s["dim"]), jnp.result_type(float), -1.0, 1.0)
    x0 = normalize(x0)[0]
    dyn, G = paper.span_dynamics(weights, x0)
    return _with_beta(dyn, p["beta"]), x0, G


def _causal_judge(dyn, x0, yT, T, G):
    n = x0.shape[0]
    in_domain = jnp.linalg.norm(x0[1] + x0[0]) > 1e-8 if n > 1 else jnp.asarray(True)
    to_first = (yT @ G)[:, 0]  # ⟨x_i(T), x₁(0)⟩: x₁(0) = e₁ in span coordinates
    return in_domain, jnp.max(1 - to_first) < TOL


def _causal_start(x0, G):
    return jnp.eye(x0.shape[0], dtype=x0.dtype)


# --- thm52-symmetric: causal, symmetric U, tokens → v₁ ----------------------------


def _symmetric_build(key, p, s):
    k_model, k_x = jax.random.split(key)
    dyn = _with_beta(paper.symmetric_dynamics(k_model, s["dim"]), p["beta"])
    v1 = paper.top_eigenvector(dyn.U(0.0)[0])
    return dyn, paper.hemisphere_of(k_x, v1, s["tokens"]), v1


def _symmetric_judge(dyn, x0, xT, T, v1):
    side = jnp.where(x0[0] @ v1 >= 0, 1.0, -1.0)
    in_domain = jnp.min(side * (x0 @ v1)) > 0
    return in_domain, jnp.max(1 - side * (xT @ v1)) < TOL


# --- thm32-gradient: a gradient flow of E_P reaches an equilibrium ------------------


def _gradient_build(key, p, s):
    k_model, k_x = jax.random.split(key)
    dyn = paper.gradient_dynamics(k_model, s["dim"], ellipsoid=not s["sphere"])
    dyn = _with_beta(dyn, p["beta"])
    return dyn, sample_ellipsoid(k_x, s["tokens"], s["dim"], dyn.W), None


def _gradient_judge(dyn, x0, xT, T, extra):
    speed = jnp.max(jnp.abs(dyn.velocity(T, xT)))
    return jnp.asarray(True), speed < TOL


MODELS: dict[str, SweepModel] = {
    "thm41-sphere": SweepModel("4.1", _sphere_build, _sphere_judge, host_domain=_sphere_domain),
    "thm51-causal": SweepModel(
        "5.1", _causal_build, _causal_judge,
        misalign=lambda ys, G: paper.span_misalignment(ys, G), start=_causal_start,
    ),
    "thm52-symmetric": SweepModel("5.2", _symmetric_build, _symmetric_judge),
    "thm32-gradient": SweepModel("3.2", _gradient_build, _gradient_judge),
}


# --- one chunk: every instance of a grid point, one vmapped program ----------------


def _evolve(dyn, y0, p, s):
    """Flow (eq. 6) or layers (eq. 4): states on the save times, success, steps."""
    if s["discrete"]:
        ys, ok = run_layers_unchecked(dyn, y0, s["layers"], p["tau"])
        return p["tau"] * jnp.arange(s["layers"] + 1), ys, ok, jnp.asarray(s["layers"])
    ts = p["horizon"] * jnp.linspace(0.0, 1.0, s["saves"] + 1)
    result = solve_flow_unchecked(dyn, y0, ts)
    return ts, result.ys, result.success, result.num_steps


@eqx.filter_jit
def _chunk(name: str, p: dict[str, Any], s: tuple, keys):
    model, s = MODELS[name], dict(s)

    def one(key):
        dyn, x0, extra = model.build(key, p, s)
        ts, ys, ok, steps = _evolve(dyn, model.start(x0, extra), p, s)
        E = model.misalign(ys, extra)
        in_domain, reached = model.judge(dyn, x0, ys[-1], ts[-1], extra)
        in_domain = jnp.asarray(True) if in_domain is None else in_domain
        return {"E": E, "x0": x0, "in_domain": in_domain, "reached": reached,
                "success": ok, "num_steps": steps, "ts": ts}

    return jax.vmap(one)(keys)


def simulate_chunk(name: str, config: dict[str, Any], params: tuple[Param, ...], seeds,
                   devices=None) -> dict[str, np.ndarray]:
    """Run the instances with seeds `seeds` of one grid point as one vmapped batch.

    `config` holds every parameter of the point; ints and flags are compiled in,
    floats are passed as arrays (a sweep over β or T compiles once). With
    `devices`, the instances are sharded over them.

    **Returns:**

    Per-instance arrays: `E (B, T)`, `ts (B, T)`, `x0`, `in_domain`, `reached`,
    `success`, `num_steps`.
    """
    from .._sharding import as_mesh, shard_batch, unshard

    dtype = jnp.result_type(float)
    static = {q.name: config[q.name] for q in params if q.type is not float}
    if config.get("discrete"):
        static["layers"] = max(1, round(config["horizon"] / config["tau"]))
    dynamic = {q.name: jnp.asarray(config[q.name], dtype) for q in params if q.type is float}
    seeds = np.asarray(seeds, np.int64)
    keys = jax.vmap(jax.random.PRNGKey)(jnp.asarray(seeds))
    mesh = as_mesh(devices)
    if mesh is not None and mesh.devices.size > 1:
        keys, size = shard_batch(keys, mesh, 1)
        out = unshard(_chunk(name, dynamic, tuple(sorted(static.items())), keys), size,
                      (len(seeds),))
    else:
        out = _chunk(name, dynamic, tuple(sorted(static.items())), keys)
    out = {k: np.asarray(v) for k, v in out.items()}
    model = MODELS[name]
    if model.host_domain is not None:
        out["in_domain"] = model.host_domain(out["x0"])
    return out
