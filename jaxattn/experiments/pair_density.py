"""The density of clustered pairs over `(t, β)`: the measure of Geshkovski et al.'s
phase diagram ("A mathematical perspective on Transformers", 2023; their script
`phase-diagrams.py`), every β in one batched program. Shared by `phase-diagram`,
`norm-beta` (the same map per normalisation) and `variants` (its random weights).

Their update `x_i ← N(x_i + η Vᵀ Σ_j α_ij x_j)` is the post-norm layer
`ja.SelfAttentionDynamics(P=B, U=Vᵀ, beta=β).layer` with `τ = η` (`kernel="exp"` for
their unnormalised weights); the fraction of ordered pairs `i ≠ j` with
`⟨x_i, x_j⟩ > threshold` is recorded at `times` times of `[0, T]` as their loop records
them (`schedule`, `observe_at`). float64 when `jax_enable_x64` is on. The study, its
steps and its numbers: `docs/usage/experiments.md` (`jaxattn run phase-diagram`).
"""

import functools
import math
from collections.abc import Callable, Iterator

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray, PyTree

from .._artifacts import figures
from .._batch import map_blocks, replicate
from .._dynamics import SelfAttentionDynamics
from .._ensemble import batch_last, chunk_size
from .._manifold import project
from .._precision import matmul
from .._process.distributed import gather, global_mesh
from .._programs import kept_jit
from .._stacked import first_model, map_models, map_systems, stack_tokens
from .._strategy import choose_strategy
from .._validate import surface_errors, too_big
from .base import Config, Param
from .paper001 import with_beta
from .pieces import advance
from .verdicts import short

#: The peers' codes for the key–query draw (`--randomKQ`) and the value draw
#: (`--randomV`), by script: `"rotf"`, Geshkovski et al.'s `phase-diagrams.py`, and
#: `"simuformer"`, Karagodin et al.'s `simuxform.py` (`norm-beta --simuformer-codes`);
#: code 4 (`0.02·G`, GPT-2's initialisation) is simuformer's alone. What each code
#: draws and where the scripts differ: `docs/variants.md` ("Weight codes").
KEY_QUERY = {"rotf": ("identity", "Gaussian", "Wigner", "GOE"),
             "simuformer": ("identity", "Gaussian", "symmetric", "GOE", "GPT-2")}
VALUE = {"rotf": ("identity", "Gaussian", "+KQ", "-KQ"),
         "simuformer": ("identity", "Gaussian G/√d", "+KQ", "-KQ", "GPT-2")}
#: Systems advanced together through all their steps (`lax.map` over blocks): a
#: block's intermediates stay in the CPU's cache, where the whole batch at once
#: streams them through memory at every step. 128 was the fastest block measured
#: for the default map (see BENCHMARKS.md, Measured claims behind design choices).
BLOCK = 128
#: Most pair counts one compiled program keeps (int32, one per system and recorded
#: time): larger runs are cut into chunks of systems.
COUNT_BUDGET = 2**26

def draw_weights(key: PRNGKeyArray, dim: int, heads: int, key_query: int, value: int,
                 codes: str = "rotf") -> tuple[Float[Array, "h d d"], Float[Array, "h d d"]]:
    """One system's `P_η = B_η` and `U_η = V_ηᵀ / h`, drawn as the peers' scripts draw
    them (`KEY_QUERY`, `VALUE`, read as `codes`' script numbers them; heads averaged as
    in Karagodin et al.'s `simuxform`).

    **Returns:**

    `(P, U)`, each `(heads, dim, dim)`.
    """
    draw = functools.partial(_one_head, d=dim, key_query=key_query, value=value, codes=codes)
    P, U = jax.vmap(draw)(jax.random.split(key, heads))
    return P, U / heads


def _one_head(key, d: int, key_query: int, value: int, codes: str):
    k1, k2, k3 = jax.random.split(key, 3)
    g1, g2, g3 = (jax.random.normal(k, (d, d)) for k in (k1, k2, k3))
    eye = jnp.eye(d, dtype=g1.dtype)
    B, scale = _key_query(g1, g2, eye, key_query, codes)
    if value == 1:
        V = matmul(g3, g3.T, "float32") / math.sqrt(d) if codes == "rotf" else g3 / math.sqrt(d)
    elif value == 4:
        V = 0.02 * g3
    else:
        V = (eye, None, B / scale, -B / scale)[value]
    return B, V.T


def _key_query(g1, g2, eye, code: int, codes: str):
    """`(B, c)`: the key–query of `code` and the scale that `V = ±B/c` divides by."""
    d = eye.shape[0]
    if code == 0:
        return eye, 1.0
    if code == 1:
        return matmul(g1, g2, "float32") / math.sqrt(d), math.sqrt(d)
    if code == 2 and codes == "rotf":  # their divisor: 2 on the diagonal, √2 off it
        return (g1 + g1.T) / (eye * (2 - math.sqrt(2)) + math.sqrt(2)), math.sqrt(d)
    if code == 4:
        return 0.02 * g1, 1.0
    return (g1 + g1.T) / math.sqrt(2), math.sqrt(d if code == 2 else d + 1)


def step_size(beta: float, step: float, exp_kernel: bool, raw_step: bool) -> float:
    """Their step `η`: `step`, or `step / max(√β e^{β−1/2}, 1)` for the unnormalised
    kernel (so that no move exceeds about `step` radians) unless `raw_step`."""
    if not exp_kernel or raw_step:
        return step
    return step / max(math.sqrt(beta) * math.exp(beta - 0.5), 1.0)


def schedule(eta: float, times: np.ndarray) -> tuple[int, np.ndarray]:
    """The steps their loop takes with step `eta` and records at `times` (float64).

    **Returns:**

    `(num_steps, at)`: the run stops after the first step `m` whose summed time
    `η + … + η` reaches `times[-1]`, and `at[k] ≥ 1` is the first step whose summed time
    reaches `times[k]`.
    """
    count = math.ceil(times[-1] / eta) + 2
    clock = np.add.accumulate(np.full(count, eta, dtype=np.float64))  # sequential sums
    at = np.searchsorted(clock, times, side="left") + 1
    return int(at[-1]), at


def step_groups(steps: np.ndarray) -> list[np.ndarray]:
    """Indices of `steps` in groups run as one program: sorted by step count, a new
    group whenever the count passes twice the group's first (at most half wasted)."""
    order = np.argsort(steps, kind="stable")
    groups, first = [[order[0]]], steps[order[0]]
    for i in order[1:]:
        if steps[i] > 2 * first:
            groups.append([])
            first = steps[i]
        groups[-1].append(i)
    return [np.asarray(g) for g in groups]


def clustered_pairs(x: Float[Array, "n d"], threshold: float, *,
                    unit: bool = True) -> Int[Array, ""]:
    """The number of ordered pairs `i ≠ j` with `⟨x_i, x_j⟩ > threshold` (the tokens'
    directions when `unit=False`)."""
    x = x if unit else project(x, None)
    gram = matmul(x, x.T, "float32")
    off = ~jnp.eye(x.shape[0], dtype=bool)
    return jnp.sum((gram > threshold) & off, dtype=jnp.int32)


@surface_errors
def pair_counts(P, U, betas, taus, x, at, kernel: str, norm: str, causal: bool,
                threshold: float, mesh: Mesh | None = None) -> Int[Array, "B K"]:
    """Clustered ordered pairs after the layers `at`, summed over systems.

    **Arguments:**

    - `P`, `U`: `(B, G, h, d, d)`, one model per β and group of systems.
    - `betas`, `taus`: `(B,)`. `x`: the tokens `(B, G, s, n, d)`, `s` systems per group.
    - `at`: `(B, K)` int, nondecreasing per β: the layers after which to count (0: the
      start).
    - `kernel`, `norm`, `causal`: of `ja.SelfAttentionDynamics`; `threshold`: as in
      `clustered_pairs`.
    - `mesh`: the devices the blocks are split over (`None`: one device); the counts
      do not depend on it.

    **Returns:**

    `(B, K)` int32 counts, and `(B,)` whether every system of that β stayed finite
    (where one overflowed, its counts hold only what stayed finite: `density_map`
    drops the row).
    """
    return _pair_counts(P, U, betas, taus, x, at, kernel, norm, causal, threshold, mesh)


@kept_jit
def _pair_counts(P, U, betas, taus, x, at, kernel, norm, causal, threshold, mesh):
    """`pair_counts` and whether every token stayed finite, one program."""
    B, G, s = x.shape[:3]
    # Blocks of `k` groups (models) of one β, at most `BLOCK` systems in all.
    k = max(k for k in range(1, min(G, max(1, BLOCK // s)) + 1) if G % k == 0)

    def block(args):
        P, U, beta, tau, x, at = args  # k models (h, d, d) of one β, k × s systems (n, d)
        dyn = eqx.filter_vmap(lambda P, U: with_beta(SelfAttentionDynamics(
            P, U, causal=causal, norm=norm, kernel=kernel), beta[0]))(P, U)
        observe = functools.partial(clustered_pairs, threshold=threshold,
                                    unit=dyn.stays_on_manifold)
        counts, finite = observe_at(dyn, x, at[0], tau[0], observe)
        return counts.sum(1), jnp.all(finite, 1)  # per model

    def models(a):
        return a.reshape(B * G, *a.shape[2:])

    args = (models(P), models(U), jnp.repeat(betas, G), jnp.repeat(taus, G), models(x),
            jnp.repeat(at, G, axis=0))
    # Block by block, all steps of a block at once: its intermediates stay in cache.
    counts, finite = map_blocks(block, args, mesh, block=k)
    return counts.reshape(B, G, -1).sum(1), finite.reshape(B, G).all(1)


def observe_at(dyn, x0: Float[Array, "*batch n d"], at: Int[Array, " K"], tau,
               observe: Callable) -> tuple[PyTree[Array], Bool[Array, "*batch"]]:
    """`observe` of the tokens after the layers `at` only, as `ja.run_layers(dyn, x0,
    at[-1], tau, observe=observe)[..., at]` gives them without observing the others.

    The same layers on the same path as `run_layers` (the fused ensemble for a batch
    of small systems; `dyn` may be a stacked model), run from one recorded layer to the
    next by a loop of traced length, so one program serves every `at`. Tokens are not
    checked (the caller's draws are finite).

    **Returns:**

    `(observed, finite)`: `observe`'s outputs, each leaf `(*batch, K, ...)`, and, per
    sequence, whether its tokens stayed finite.
    """
    dyn, x0, unflatten = stack_tokens(dyn, x0)
    x0 = map_models(lambda d, x: project(x, d.W), dyn, x0)
    fused = choose_strategy(first_model(dyn), x0.shape, "auto", (dyn, x0)).fused

    def program(d, x, fused):
        layer, watch, ok = (batch_last(f) if fused else f for f in (_layer, observe, _finite))

        def record(carry, stop):
            x, done = carry
            x = jax.lax.fori_loop(done, stop, lambda i, z: layer(
                z, d, i.astype(z.dtype) * tau, tau), x)
            return (x, stop), watch(x)

        (x, _), ys = jax.lax.scan(record, (x, jnp.zeros((), at.dtype)), at)
        return ys, ok(x)

    return unflatten(map_systems(program, dyn, x0, fused=fused, chunk=chunk_size()))


def _layer(x, dyn, t, tau):
    return dyn.layer(t, x, tau)


def _finite(x):
    return jnp.all(jnp.isfinite(x))


def density_map(key: PRNGKeyArray, cfg: Config, *, heads: int = 1, norm: str = "post",
                causal: bool = False, progress: bool = False,
                desc: str = "phase diagram") -> dict[str, np.ndarray]:
    """The clustered-pair density over `(β, t)`: the whole study for one model.

    **Arguments:**

    - `key`: draws the tokens and the weights.
    - `cfg`: `betas`, `beta_min`, `beta_max`, `systems`, `tokens`, `dim`, `key_query`,
      `value`, `exp_kernel`, `horizon` (0: 30 with softmax, 1 with the exp kernel),
      `step`, `raw_step`, `times`, `threshold` (the experiment's `Config`, checked), and
      optionally `simuformer_codes` (read `key_query` and `value` as simuformer's codes,
      not rotf's: `codes_of`).
    - `heads`, `norm`, `causal`: of the model.

    **Returns:**

    `betas (B,)`, `ts (K,)`, `density (B, K)`, `steps (B,)` (steps per β), `tau (B,)`.
    A β whose tokens left float64 in some system (the exp kernel's weights
    `exp(β⟨x_i, B x_j⟩)` at a large `β‖B‖`, or tokens growing without a normalisation)
    has a row of NaN: `describe_map` names it, `draw_map` leaves it blank.
    """
    B, S, n = cfg.betas, cfg.systems, cfg.tokens
    betas = np.linspace(cfg.beta_min, cfg.beta_max, B)
    ts = np.linspace(0.0, horizon_of(cfg), cfg.times)
    taus = np.array([step_size(b, cfg.step, cfg.exp_kernel, cfg.raw_step)
                     for b in betas])
    plans = [schedule(eta, ts) for eta in taus]
    steps = np.array([p[0] for p in plans])
    # on the host: each piece's slices are numpy's, not one small program per slice
    x0, P, U = (np.asarray(a) for a in draw_systems(key, cfg, heads))
    G, s = x0.shape[1:3]
    mesh = global_mesh()  # a distributed run: its blocks over every process's devices
    at = np.stack([p[1] for p in plans]).astype(np.int32)
    pieces = [(g, c) for g in step_groups(steps) for c in _chunks(G, s * len(g) * len(ts))]

    def piece(k, state):
        (counts, finite), (g, (lo, hi)) = state, pieces[k]
        args = P[g, lo:hi], U[g, lo:hi], betas[g], taus[g], x0[g, lo:hi], at[g]
        args = args if mesh is None else replicate(args, mesh)
        more, ok = gather(pair_counts(
            *args, kernel="exp" if cfg.exp_kernel else "softmax", norm=norm, causal=causal,
            threshold=cfg.threshold, mesh=mesh))
        counts[g] += np.asarray(more)
        finite[g] &= np.asarray(ok)
        return (counts, finite), None

    (counts, finite), _ = advance(piece, (np.zeros((B, len(ts)), np.int64), np.ones(B, bool)),
                                  len(pieces), desc=desc, progress=progress)
    density = np.where(finite[:, None], counts / (S * n * (n - 1)), np.nan)
    return {"betas": betas, "ts": ts, "density": density, "steps": steps, "tau": taus}


def draw_systems(key: PRNGKeyArray, cfg: Config, heads: int = 1):
    """The study's random start: tokens and weights for every β and system.

    **Returns:**

    `x0 (B, G, s, n, d)` (not yet normalised, as their `randn`), `G` groups of `s`
    systems sharing one model, and `P`, `U` `(B, G, h, d, d)`. A model is drawn per
    system (`s = 1`) unless the key–query and value are both the identity (nothing to
    draw): then the `S` systems of a β share it, in groups of `s ≤ BLOCK` (a divisor
    of `S`) run together on the fused ensemble path.
    """
    s = group_size(cfg)
    return _draw_systems(key, (cfg.betas, cfg.systems // s, s, cfg.tokens, cfg.dim), s > 1,
                         heads, cfg.key_query, cfg.value, codes_of(cfg))


def group_size(cfg: Config) -> int:
    """How many systems of a β share one model (`draw_systems`): 1 unless the key–query
    and value are both the identity."""
    S = cfg.systems
    if cfg.key_query == 0 and cfg.value == 0:
        return max(k for k in range(1, min(S, BLOCK) + 1) if S % k == 0)
    return 1


@kept_jit
def _draw_systems(key, shape, shared, heads, key_query, value, codes):
    """`draw_systems` as one program (`shape`: `(B, G, s, n, d)`)."""
    B, G, s, n, d = shape
    k_x, k_w = jax.random.split(key)
    x0 = jax.random.normal(k_x, (B, G * s, n, d))
    keys = jax.random.split(k_w, B * (1 if shared else G)).reshape(B, 1 if shared else G, -1)
    draw = functools.partial(draw_weights, dim=d, heads=heads, key_query=key_query,
                             value=value, codes=codes)
    P, U = jax.vmap(jax.vmap(draw))(keys)
    P, U = (jnp.broadcast_to(w, (B, G) + w.shape[2:]) for w in (P, U))
    return x0.reshape(shape), P, U


def _chunks(groups: int, per_group: int) -> list[tuple[int, int]]:
    """Equal runs of groups whose counts stay within `COUNT_BUDGET`."""
    parts = max(1, math.ceil(groups * per_group / COUNT_BUDGET))
    size = math.ceil(groups / parts)
    return [(lo, min(lo + size, groups)) for lo in range(0, groups, size)]


#: The largest β whose weights `exp(β⟨x_i, x_j⟩)` of unit tokens stay finite in float64.
EXP_BETA_MAX = math.log(np.finfo(np.float64).max)


def codes_of(cfg: Config) -> str:
    """Whose numbering `cfg`'s `key_query` and `value` follow (`KEY_QUERY`): `"rotf"`,
    unless `simuformer_codes` is set (`norm-beta`; a run without it is rotf's)."""
    return "simuformer" if cfg.get("simuformer_codes", False) else "rotf"


def horizon_of(cfg: Config) -> float:
    """`T`: `horizon`, or their default for 0 (30 with softmax, 1 with the exp kernel)."""
    return cfg.horizon or (1.0 if cfg.exp_kernel else 30.0)


def refusals(cfg: Config, *extra: tuple[bool, str]) -> Iterator[tuple[bool, str]]:
    """The study's refusals (`AbstractExperiment.refusals`) of settings no `Param`
    minimum catches, then the caller's `extra` ones (`norm-beta`'s), then the step
    count."""
    source = codes_of(cfg)
    codes = [(name, table, ", ".join(f"{i} {w}" for i, w in enumerate(table)))
             for name, table in (("key_query", KEY_QUERY[source]), ("value", VALUE[source]))]
    yield from (
        (not 0 <= cfg.beta_min <= cfg.beta_max, f"need 0 ≤ --beta-min ≤ --beta-max, got "
         f"{cfg.beta_min!r} and {cfg.beta_max!r}."),
        (cfg.horizon < 0, f"--horizon must be ≥ 0 (0: the peers' default), got "
         f"{cfg.horizon!r}."),
        *((not 0 <= cfg[name] < len(table), f"--{name.replace('_', '-')} must be one of "
           f"{listed} ({source}'s codes); got {cfg[name]!r}.") for name, table, listed in codes),
        (not 0 < cfg.threshold < 1, f"--threshold must be in (0, 1), got {cfg.threshold!r}."),
        (cfg.raw_step and not cfg.exp_kernel, "--raw-step leaves --exp-kernel's step "
         "uncorrected; softmax's step is --step as given: drop --raw-step or add --exp-kernel."),
        *extra)
    yield (cfg.exp_kernel and cfg.beta_max > EXP_BETA_MAX, f"--beta-max {cfg.beta_max:g}: "
           f"with --exp-kernel the weights exp(β⟨x_i, x_j⟩) overflow float64 past β = "
           f"{EXP_BETA_MAX:.0f}; lower --beta-max.")  # before the steps, which overflow too
    # their loop counts in int32; the smallest step is the largest β's
    eta, end = step_size(cfg.beta_max, cfg.step, cfg.exp_kernel, cfg.raw_step), horizon_of(cfg)
    first = step_size(cfg.beta_min, cfg.step, cfg.exp_kernel, cfg.raw_step)  # the longest
    yield (end < first, f"--horizon {end:g} is shorter than one step ({first:g} at β = "
           f"{cfg.beta_min:g}): every recorded time would show the state after that step; "
           "lengthen --horizon or lower --step.")
    yield (not end / eta < 2**31 - 2, f"a step of {eta:g} takes {end / eta:g} steps to reach "
           f"t = {end:g}, more than 2³¹: raise --step or shorten --horizon.")
    most = math.ceil(end / eta) + 1  # the states the longest run records, the start's too
    yield (cfg.times > most, f"--times {cfg.times} records more times than the longest run "
           f"has states ({most}: steps of {eta:g} to t = {end:g}); lower --times to {most} or "
           "less.")
    if cfg.betas == 1:  # linspace(β_min, β_max, 1) is β_min alone
        yield (cfg.beta_max != cfg.beta_min, f"--betas 1 runs β = --beta-min "
               f"({cfg.beta_min:g}) alone: give --beta-max {cfg.beta_min:g} too, or raise "
               "--betas.")
    # the weights of every β and group (`draw_systems`), and one system's attention
    h, n, d = cfg.get("heads", 1), cfg.tokens, cfg.dim
    models = cfg.betas * cfg.systems // group_size(cfg)
    yield too_big(16.0 * models * h * d * d, f"--betas {cfg.betas}, --systems {cfg.systems}, "
                  f"--dim {d}: the weights need at least", "choose smaller values")
    yield too_big(24.0 * h * n * n, f"--tokens {n}: one system's attention needs at least",
                  "choose fewer --tokens")


#: The parameters of the study, shared by `norm-beta`.
STUDY = (
    Param("betas", int, 90, "number of β values", 1),
    Param("beta_min", float, 0.1, "smallest β (≥ 0)"),
    Param("beta_max", float, 9.0, "largest β"),
    Param("systems", int, 2048, "independent systems per β", 1),
    Param("tokens", int, 32, "tokens n per system", 2),
    Param("dim", int, 2, "dimension d (tokens on S^{d−1})", 1),
    Param("key_query", int, 0, "key–query B, the codes of rotf's randomKQ option: 0 identity, "
          "1 Gaussian G₁G₂/√d, 2 Wigner, 3 GOE"),
    Param("value", int, 0, "value V, the codes of rotf's randomV option: 0 identity, "
          "1 Gaussian GGᵀ/√d, 2 +KQ, 3 −KQ"),
    Param("exp_kernel", bool, False, "unnormalised weights exp(β⟨x_i, B x_j⟩)/n (their default) "
          "with the step step/max(√β e^{β−1/2}, 1), to T = 1, instead of softmax to T = 30"),
    Param("horizon", float, 0.0, "final time T (0: 30 with softmax, 1 with --exp-kernel)"),
    Param("step", float, 0.1, "step η (the exp kernel's is corrected, see --raw-step)", 0.0),
    Param("raw_step", bool, False, "do not correct the exp kernel's step (their --rawstep)"),
    Param("times", int, 200, "recorded times, linspace(0, T, times)", 2),
    Param("threshold", float, 0.999, "a pair is clustered when ⟨x_i, x_j⟩ > threshold"),
)


def describe_map(betas, ts, density) -> tuple[str, dict]:
    """What a density map shows, in words and numbers: the time to reach density ½ as β
    grows and where it is not reached by `T`; the β whose tokens overflowed (rows of
    NaN) apart."""
    lost = np.isnan(density).any(-1)
    if lost.all():
        return (f"the tokens overflowed float64 for every β ({_ranges(betas, lost)}): no "
                "density to show",
                {"final_density_min": math.nan, "final_density_max": math.nan,
                 "beta_not_reaching_half": math.nan, "beta_overflowed": float(betas.min())})
    overflow = ([f"the tokens overflowed float64 for {_ranges(betas, lost)} (rows left "
                 "blank)"] if lost.any() else [])
    betas_all, betas, density = betas, betas[~lost], density[~lost]
    hit = density >= 0.5  # t½ per β: the first recorded time at density ½ (inf: never)
    t_half, final = np.where(hit.any(-1), ts[np.argmax(hit, -1)], np.inf), density[:, -1]
    reached = np.isfinite(t_half)
    never = betas[~reached]
    parts = [f"density at T = {short(ts[-1])}: {short(final.min())} to {short(final.max())}"]
    if reached.any():
        (i, j), k = np.flatnonzero(reached)[[0, -1]], np.argmin(t_half)
        parts.append(f"t½ (density ≥ 0.5) from {short(t_half[i])} at β = {short(betas[i])} to "
                     f"{short(t_half[j])} at β = {short(betas[j])}")
        parts.append(f"fastest t½ = {short(t_half[k])} at β = {short(betas[k])}")
    parts.append(f"density ½ not reached by T for {_ranges(betas, ~reached)}" if never.size
                 else "density ½ reached for every β")
    numbers = {"final_density_min": float(final.min()), "final_density_max": float(final.max()),
               "beta_not_reaching_half": float(never.min()) if never.size else math.inf}
    if lost.any():
        numbers["beta_overflowed"] = float(betas_all[lost].min())
    return "; ".join(parts + overflow), numbers


def _ranges(values, mask) -> str:
    """The runs of the β `values` where `mask` holds, in words: "β in [0.1, 3.07] and
    β = 9"."""
    runs, start = [], None
    for i, inside in enumerate([*mask, False]):
        if inside and start is None:
            start = i
        elif not inside and start is not None:
            lo, hi = values[start], values[i - 1]
            runs.append(f"β = {short(lo)}" if start == i - 1 else
                        f"β in [{short(lo)}, {short(hi)}]")
            start = None
    return " and ".join(runs)


def _edges(centres) -> np.ndarray:
    """Cell edges halfway between the centres, the outer ones at the first and last
    centre (no cell reaches past the values measured, e.g. β below `--beta-min`)."""
    c = np.asarray(centres, float)
    if c.size < 2:
        return np.array([c[0] - 0.5, c[0] + 0.5]) if c.size else c
    return np.concatenate([c[:1], (c[1:] + c[:-1]) / 2, c[-1:]])


def draw_map(ax, fig, betas, ts, density, *, log: bool, title: str,
             full_scale: bool = False, colorbar: bool = True):
    """One heat map of the density over `(t, β)`, as their `plot_pickle` draws it
    (`full_scale`: the linear colours span 0 to 1, to compare maps; `colorbar=False`:
    none beside it, for maps that share one). Returns the mesh."""
    density = np.ma.masked_invalid(density)  # a β whose tokens overflowed: left blank
    none = not np.any(density > 0)  # no pair clustered: nothing for a log scale
    if density.mask.all():
        title = f"{title}: the tokens overflowed float64 for every β"
    elif none and log:
        title = "no pair clustered: nothing on a log scale (linear here)"
    log = log and not none
    shown = np.ma.masked_less_equal(density, 0) if log else density  # log: 0 left blank
    span = {"vmin": 0.0, "vmax": 1.0} if (full_scale or none) and not log else {}
    # a sequential map (a density runs from 0 to 1: nothing diverges from a middle),
    # each cell centred on its (t, β) but none past the first or last one measured
    mesh = ax.pcolormesh(_edges(ts), _edges(betas), shown, norm="log" if log else "linear",
                         cmap="viridis", shading="flat", rasterized=True, **span)
    ax.grid(False)
    lost, edges = np.ma.getmaskarray(density).all(axis=1), _edges(betas)
    # each run of β that overflowed hatched and named, not left white: no reader
    # takes it for a density of 0
    starts = np.flatnonzero(lost & ~np.r_[False, lost[:-1]])
    ends = np.flatnonzero(lost & ~np.r_[lost[1:], False]) + 1
    for lo, hi in zip(edges[starts], edges[ends]):
        ax.axhspan(lo, hi, facecolor="0.93", edgecolor="0.55", hatch="//", lw=0)
        ax.text(np.mean(ax.get_xlim()), (lo + hi) / 2, "overflowed float64", ha="center",
                va="center", fontsize=8, color="0.3")
    half = not log and len(ts) > 1 and len(betas) > 1 and np.nanmax(density) >= 0.5
    if half:  # the density ½ whose first time is the verdict's t½, dashed over the map
        ax.contour(ts, betas, density, levels=[0.5], colors="white", linestyles="--",
                   linewidths=1.2)
    if colorbar:
        bar = fig.colorbar(mesh, ax=ax, label="clustered-pair density" + (" (log)" if log else "")
                           + ("\n(dashed: ½, reached at t½)" if half else ""))
        if log:  # 0.04, not 4×10⁻², over two decades or less
            figures.plain_log_labels(bar.ax.yaxis)
    ax.set_xlabel("t", fontstyle="italic")
    ax.set_ylabel("β", fontstyle="italic")
    ax.set_title(title, fontsize=10)
    return mesh


def setup_line(cfg: Config) -> str:
    """The model in words, for titles."""
    kernel = "exp/n" if cfg.exp_kernel else "softmax"
    codes = codes_of(cfg)
    return (f"d = {cfg.dim}, n = {cfg.tokens}, {cfg.systems} systems, {kernel}, "
            f"KQ = {KEY_QUERY[codes][cfg['key_query']]}, V = {VALUE[codes][cfg['value']]}")
