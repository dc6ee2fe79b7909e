"""The sweepable experiments (the theorem experiments of paper 001) as batched,
per-instance outcomes for sweeps.

An *instance* is one random model and one random start, drawn by the experiment's
own `instance(key, config)` with `key = PRNGKey(seed + instance)`, exactly as
`jaxattn run NAME --seed seed+instance` draws them (docs/usage/sweeps.md), and judged
by its theorem's own tests (`ja.theory.theorem_test`). A chunk's instances run as one
vmapped program; the domain test of Theorem 4.1 (a convex program on the host,
`ja.metrics.hemisphere`) runs after it, so that no host callback sits in the
(possibly sharded) program.
"""

import math
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._batch import as_mesh, map_blocks, shard_batch, unshard
from .._flow import solve_flow_unchecked
from .._horizon import CONSENSUS_TOL, Horizon
from .._layers import run_layers_unchecked
from .._manifold import w_inner
from .._process.distributed import gather
from .._programs import kept_jit
from ..experiments import BETA as BETA  # each sweepable experiment's `--beta`
from ..experiments import Param, get_experiment, paper001
from ..theory import theorem_test

#: How a chunk's instances are simulated (`ja.run_layers`' `strategy`): `"auto"` takes
#: the fused ensemble path for small systems.
STRATEGY = "auto"
#: The instances of a block on a CPU (`_chunk`): a chunk runs block by block, so that an
#: instance's numbers do not depend on the batch or its split over devices (a vectorised
#: loop rounds the lanes of its remainder differently). 64 against 16: 1.09–1.30× the
#: instances a second in each sweepable experiment, flow and layers (BENCHMARKS.md,
#: "Measured claims"; AMD EPYC, 2 cores). A GPU runs a device's whole share as one
#: block (a thread per instance: no remainder lanes; small blocks would leave it idle).
LANES = 64
#: Experiment parameters that a sweep replaces (`--instances`).
EXCLUDED = ("samples",)
#: A chunk's peak memory per instance, as a multiple of the bytes of its outputs (`E`,
#: `ts` and `residual` at every saved time, and `y0`): measured 3.8 in blocks of 16
#: (`jaxattn sweep thm41-sphere --instances` 4,096 and 32,768: 46 kB more peak memory
#: an instance, for 12 kB of outputs; AMD EPYC, float32), 2.8 in blocks of 64 (33 kB).
PEAK_PER_OUTPUT = 4


def theorem_of(name: str) -> str:
    """The theorem that experiment `name` tests (its `theorem`)."""
    return get_experiment(name).theorem


# --- one chunk: every instance of a grid point, one vmapped program ----------------


def _evolve(dyns, y0s, p, s, strategy):
    """Flow (eq. 6) or layers (eq. 4) of every instance, its own model each (`dyns`
    stacked, `y0s` `(B, n, d)`): the save times, states, success, steps.

    One call of the simulator for the whole chunk, so that small systems take its
    fused ensemble path (`strategy="auto"`). `T` and `τ` are traced, so that a sweep
    over them compiles once: the save times are `T · linspace(0, 1, saves + 1)` (the
    number of layers, a static count, comes from `Horizon` in `simulate_chunk`).
    """
    if s["discrete"]:
        ys, ok = run_layers_unchecked(dyns, y0s, s["layers"], p["tau"], strategy=strategy)
        steps = jnp.full(ok.shape, s["layers"])
        return p["tau"] * jnp.arange(s["layers"] + 1), ys, ok, steps
    ts = p["horizon"] * jnp.linspace(0.0, 1.0, s["saves"] + 1)
    result = solve_flow_unchecked(dyns, y0s, ts, strategy=strategy)
    return ts, result.ys, result.success, result.num_steps


def _residual(test, y0, ts, ys, E):
    """The distance to the predicted outcome at every saved time, the quantity whose
    last value `test.reached` compares with the tolerance: `max_i 1 − ⟨x_i, ℓ_i⟩_W`
    for a named limit `ℓ` (5.1, 5.2), the relative speed `max |ẋ| / max |v|` for an
    equilibrium (3.2), else the misalignment `E` (consensus, 4.1). A sweep judges its
    trend."""
    limit = test.limit(y0)
    if limit is not None:
        return jnp.max(1 - w_inner(ys, limit[None], test.W), axis=-1)
    if test.outcome == "equilibrium":
        return jax.vmap(test.relative_speed)(ts, ys)
    return E


@kept_jit
def _chunk(name: str, p: dict[str, Any], s: tuple, keys, block: int, mesh=None,
           strategy: str = "auto"):
    """Every instance of `keys` (a multiple of `block` and of `mesh`'s devices), in
    blocks of `block` (`LANES`), each device running its own blocks one after the
    other (`map_blocks`)."""
    blocks = keys.reshape(-1, block, *keys.shape[1:])
    out = map_blocks(lambda k: _block(name, p, s, k, strategy), blocks, mesh)
    return jax.tree.map(lambda a: a.reshape(-1, *a.shape[2:]), out)


def _block(name: str, p: dict[str, Any], s: tuple, keys, strategy: str):
    s = dict(s)
    experiment = get_experiment(name)

    def instance(key):
        dyn, y0, misalign = experiment.instance(key, experiment.config(s | p))
        return paper001.with_beta(dyn, p["beta"]), y0, misalign

    # The instances' models stacked (leaves with a leading instance axis): one
    # simulation of the chunk. Each instance is then drawn again (the same values)
    # to be judged with its own misalignment.
    dyns, y0s = eqx.filter_vmap(lambda key: instance(key)[:2])(keys)
    ts, yss, oks, stepss = _evolve(dyns, y0s, p, s, strategy)

    def one(key, ys, ok, steps):
        dyn, y0, misalign = instance(key)
        test = theorem_test(experiment.theorem, dyn)
        E = misalign(ys)
        out = {"E": E, "y0": y0, "success": ok, "num_steps": steps, "ts": ts,
               "residual": _residual(test, y0, ts, ys, E),
               "reached": test.reached(y0, ys[-1], ts[-1], CONSENSUS_TOL)}
        if test.host_domain:
            out["test"] = test  # its domain is decided after the program, on the host
        else:
            out["in_domain"] = test.domain(y0)[0]
        return out

    return jax.vmap(one)(keys, yss, oks, stepss)


def _host_domain(tests, y0) -> np.ndarray:
    """The domain test of each instance, run outside the simulation's program, one
    instance at a time: on concrete tokens it solves its program on the host, so that
    no program holds a host callback (one would be compiled again every run)."""
    tests = jax.tree.map(np.asarray, tests)
    return np.array([bool(jax.tree.map(lambda a: a[i], tests).domain(y)[0])
                     for i, y in enumerate(np.asarray(y0))])


def instance_bytes(name: str, config: dict[str, Any]) -> int:
    """About how much memory one instance of a chunk takes while the chunk runs and is
    saved: `PEAK_PER_OUTPUT` times its outputs' bytes (`run_sweep` sizes its chunks by
    it). Only the shapes are traced; nothing runs."""
    experiment = get_experiment(name)
    cfg = experiment.config(config)
    y0 = jax.eval_shape(lambda: experiment.instance(jax.random.PRNGKey(0), cfg)[1])
    saves = (Horizon(config["horizon"]).num_layers(config["tau"]) if config.get("discrete")
             else config["saves"])
    itemsize = jnp.dtype(jnp.result_type(float)).itemsize
    return PEAK_PER_OUTPUT * itemsize * (3 * (saves + 1) + math.prod(y0.shape))


def simulate_chunk(name: str, config: dict[str, Any], params: tuple[Param, ...], seeds,
                   devices=None) -> dict[str, np.ndarray]:
    """Run the instances with seeds `seeds` of one grid point as one vmapped batch.

    `config` holds every parameter of the point; ints and flags are compiled in,
    floats are passed as arrays (a sweep over β or T compiles once). With
    `devices`, the instances are sharded over them (over other processes' devices
    too: every process then gets every instance's outcome).

    **Arguments:**

    - `name`: the experiment; `config`: the point's parameters; `params`: the
      sweep's parameters (`sweep_params`); `seeds`: one seed per instance.
    - `devices`: as in `run_sweep`.

    **Returns:**

    Per-instance arrays: `E (B, T)`, `ts (B, T)`, `residual (B, T)` (the distance
    to the predicted outcome, `_residual`), `y0` (the start the simulator ran),
    `in_domain`, `reached`, `success`, `num_steps`.
    """
    dtype = jnp.result_type(float)
    static = {q.name: config[q.name] for q in params if q.type is not float}
    if config.get("discrete"):
        static["layers"] = Horizon(config["horizon"]).num_layers(config["tau"])
    dynamic = {q.name: jnp.asarray(config[q.name], dtype) for q in params if q.type is float}
    seeds = np.asarray(seeds, np.int64)
    mesh = as_mesh(devices)
    count = 1 if mesh is None else mesh.devices.size
    block = LANES if jax.default_backend() == "cpu" else -(-len(seeds) // count)
    padded = np.resize(seeds, -(-len(seeds) // (count * block)) * count * block)
    keys = jax.vmap(jax.random.PRNGKey)(jnp.asarray(padded))
    if count > 1:
        keys, _ = shard_batch(keys, mesh, 1)
    out = _chunk(name, dynamic, tuple(sorted(static.items())), keys, block,
                 mesh if count > 1 else None, STRATEGY)
    out = unshard(gather(out), len(seeds), (len(seeds),))  # whole on every process
    tests = out.pop("test", None)
    out = {k: np.asarray(v) for k, v in out.items()}
    if tests is not None:
        out["in_domain"] = _host_domain(tests, out["y0"])
    return out
