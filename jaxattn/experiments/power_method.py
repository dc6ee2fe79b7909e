"""Paper 004 as `jaxattn run` experiments: `power-shared`, `power-layers`, `steer`
and `oja-bipartite`. Listed in the registry of `jaxattn.experiments`."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from .._layers import run_layers
from ..models import PRESETS, init, load
from ..spectral import (
    LayerAlignment,
    bipartite_closed_form,
    cosines,
    equilibria,
    layer_matrix,
    layerwise,
    oja_system,
    perturbation_growth,
    random_tokens,
    run_model,
    shared_alignment,
    single_head,
    steer,
)
from ..spectral._equilibria import bipartite_point
from . import power_plots as plots
from .base import AbstractExperiment, Param, Verdict, fmt

_TRAINED = {"minilm": "all-MiniLM-L6-v2", "smollm2": "SmolLM2-135M-Instruct"}
_RANDOM = {"bert": "bert-base-uncased", "gpt_neo": "gpt-neo-125M"}

_MODEL_FLAGS = (
    Param("minilm", bool, False, "all-MiniLM-L6-v2, trained weights (pip package)"),
    Param("smollm2", bool, False, "SmolLM2-135M-Instruct, trained weights (gguf)"),
    Param("hidden", int, 384, "width d of the random config (0: the preset's)", 0),
    Param("heads", int, 6, "heads of the random config (0: the preset's)", 0),
    Param("std", float, 0.02, "std of the random weights (HF initializer_range)", 0.0),
)
_TOKENS = (
    Param("prompts", int, 100, "random prompts", 1),
    Param("tokens", int, 10, "tokens per prompt (initial tokens N(0, I))", 1),
    Param("tau", float, 1.0, "step τ of eq. 3", 0.0),
)


def _model(config, default: str):
    """The model a config asks for, and a name for it."""
    trained = [k for k in _TRAINED if config.get(k)]
    chosen = trained + [k for k in _RANDOM if config.get(k)]
    if len(chosen) > 1:
        raise ValueError("choose at most one model flag (" + ", ".join(
            "--" + k.replace("_", "-") for k in chosen) + ").")
    if trained:
        return load(_TRAINED[trained[0]]), _TRAINED[trained[0]] + " (trained)"
    preset = _RANDOM[chosen[0]] if chosen else default
    cfg = dict(PRESETS[preset], initializer_range=config["std"])
    width, heads = _width_keys(cfg)
    if config["hidden"]:
        cfg[width] = config["hidden"]
    if config["heads"]:
        cfg[heads] = config["heads"]
    key = jax.random.PRNGKey(config["seed"] + 1000)
    return init(cfg, key), (f"{preset} config, random N(0, {config['std']:g}²), "
                            f"d={cfg[width]}, h={cfg[heads]}")


def _width_keys(cfg):
    if cfg["model_type"] == "gpt2":
        return "n_embd", "n_head"
    if cfg["model_type"] == "gpt_neo":
        return "hidden_size", "num_heads"
    return "hidden_size", "num_attention_heads"


def _stack_stats(stats: LayerAlignment) -> dict[str, np.ndarray]:
    """A `LayerAlignment` (with a layer axis) as NumPy arrays, for `data.npz`."""
    return {f"stat_{f}": np.asarray(getattr(stats, f)) for f in stats.__dataclass_fields__}


def _tokens(config, d, offset=0):
    key = jax.random.PRNGKey(config["seed"] + offset)
    return random_tokens(key, config["prompts"], config["tokens"], d)


class _Base(AbstractExperiment):
    """A paper 004 experiment: its own parameters only (no flow horizon or saves)."""

    drops = ("discrete", "horizon", "saves")


# --- power-shared ------------------------------------------------------------------


class PowerShared(_Base):
    name = "power-shared"
    theorem = "paper 004 Theorem 1"
    title = ("paper 004 §2.1/§3.1 (Fig. 2a, 6c): a shared-weight model; its case, final "
             "alignment with v₁ and the 2-D subspace, depth prolonged")
    params = _MODEL_FLAGS + _TOKENS + (
        Param("layer", int, 0, "the layer whose weights are shared (ALBERT: its only one)", 0),
        Param("depth", int, 10, "prolong to this many times the native depth", 1),
    )

    def simulate(self, config, progress):
        model, label = _model(config, "albert-base-v2")
        d, L = model.config.hidden_size, model.num_layers
        specs, cos = shared_alignment(model, _tokens(config, d), config["depth"] * L,
                                      layer=config["layer"], tau=config["tau"])
        out = {"native_depth": np.asarray(L), "label": np.asarray(label)}
        for i, (tag, s) in enumerate((("modulus", specs[0]), ("step", specs[1]))):
            out |= {f"cos_{tag}": np.asarray(cos[..., i, :]),
                    f"eig_{tag}": np.asarray(s.eigenvalues), f"case_{tag}": np.asarray(s.case),
                    f"gap_{tag}": np.asarray(s.pair_gap), f"corr_{tag}": np.asarray(s.correlation)}
        return out

    def verdict(self, config, data):
        L = int(data["native_depth"])
        n = {}
        for tag in ("modulus", "step"):
            c = data[f"cos_{tag}"].mean(axis=(0, 2))  # (layers, 2)
            n |= {f"{tag}_case": int(data[f"case_{tag}"]), f"{tag}_start": float(c[0, 0]),
                  f"{tag}_native": float(c[L, 0]), f"{tag}_end": float(c[-1, 0]),
                  f"{tag}_plane_end": float(c[-1, 1])}
        d = data["eig_step"].shape[0]
        n["random_baseline"] = float(np.sqrt(2 / (np.pi * d)))
        ok = n["step_end"] > max(n["step_native"], n["step_start"])
        line = (f"case {n['modulus_case']} by |λ| (paper), {n['step_case']} by |1+τλ|; "
                f"mean alignment with v₁ (|1+τλ| order) {fmt(n['step_start'])} → "
                f"{fmt(n['step_native'])} at depth {L} → {fmt(n['step_end'])} at "
                f"{data['cos_step'].shape[1] - 1}; with the |λ|-ordered v₁ "
                f"{fmt(n['modulus_end'])} (random direction ≈ {fmt(n['random_baseline'])})")
        return Verdict(bool(ok), line, n)

    def draw(self, config, data, folder: Path) -> list[Path]:
        return plots.power_shared(data, Path(folder) / "power_shared")


# --- power-layers ------------------------------------------------------------------

_FAMILY_FLAGS = (
    Param("bert", bool, False, "random BERT config instead of GPT-2"),
    Param("gpt_neo", bool, False, "random GPT-Neo config instead of GPT-2"),
)


class PowerLayers(_Base):
    name = "power-layers"
    theorem = "paper 004 §3.2, no theorem"
    title = ("paper 004 §2.2/§3.2 (Figs. 2b, 6, 7): per layer, alignment c, increment Δ, "
             "probability p vs their all-eigenvector baselines")
    params = _MODEL_FLAGS + _FAMILY_FLAGS + _TOKENS + (
        Param("step_order", bool, False, "order eigenvalues by |1 + τλ| instead of |λ|"),
    )

    def simulate(self, config, progress):
        model, label = _model(config, "gpt2")
        x0 = _tokens(config, model.config.hidden_size)
        order = config["tau"] if config["step_order"] else None
        stats, eigs, _ = layerwise(model, x0, tau=config["tau"], order_tau=order)
        return _stack_stats(stats) | {"eigenvalues": np.asarray(eigs),
                                     "label": np.asarray(label)}

    def verdict(self, config, data):
        above = data["stat_delta"] > data["stat_delta_bar"]
        more = data["stat_p"] > 0.5
        n = {"layers": int(above.size), "delta_above_baseline": int(above.sum()),
             "p_above_half": int(more.sum()), "mean_c": float(data["stat_c"].mean()),
             "mean_c_bar": float(data["stat_c_bar"].mean())}
        ok = above.sum() > above.size / 2 and more.sum() > more.size / 2
        line = (f"Δ_ℓ > Δ̄_ℓ in {n['delta_above_baseline']}/{n['layers']} layers, p_ℓ > 1/2 in "
                f"{n['p_above_half']}/{n['layers']}; mean c_ℓ {fmt(n['mean_c'])} vs c̄_ℓ "
                f"{fmt(n['mean_c_bar'])}")
        return Verdict(bool(ok), line, n)

    def draw(self, config, data, folder):
        return plots.power_layers(data, Path(folder) / "power_layers")


# --- steer -------------------------------------------------------------------------


class Steer(_Base):
    name = "steer"
    theorem = "paper 004 §2.3, no theorem"
    title = ("paper 004 §2.3/§3.3 (Figs. 2, 9): rank-1 edit of the last layer, Ω + γ u wᵀ; "
             "alignment with u at the end, γ sweep")
    params = _MODEL_FLAGS + _FAMILY_FLAGS + _TOKENS + (
        Param("gamma", float, 1e5, "steering strength γ (the sweep ends here)", 0.0),
        Param("calibrate", bool, False,
              "w = the top direction of the last layer's inputs on other prompts (else w = u)"),
    )

    def simulate(self, config, progress):
        model, label = _model(config, "gpt2")
        d = model.config.hidden_size
        x0 = _tokens(config, d)
        u = jax.random.normal(jax.random.PRNGKey(config["seed"] + 7), (d,), x0.dtype)
        u = u / jnp.linalg.norm(u)
        w = _calibrated_w(model, config, d) if config["calibrate"] else u
        scale = float(jnp.linalg.norm(layer_matrix(model, -1).astype(x0.dtype), 2))
        gammas = config["gamma"] * np.logspace(-7, 0, 15)
        xs = run_model(model, x0, tau=config["tau"])
        before = xs[-2]
        ends = [_last_layer(steer(model, u, g, w=w), before, config["tau"], u) for g in gammas]
        steered = steer(model, u, config["gamma"], w=w)
        stats, eigs, xs_s = layerwise(steered, x0, tau=config["tau"])
        d_ = xs.shape[-1]
        c_u = np.asarray([cosines(x.reshape(-1, d_), u).mean() for x in xs_s])
        c_u0 = np.asarray([cosines(x.reshape(-1, d_), u).mean() for x in xs])
        return _stack_stats(stats) | {
            "gammas": gammas, "end_alignment": np.asarray(ends), "c_u": c_u, "c_u_plain": c_u0,
            "eigenvalues": np.asarray(eigs), "norm": np.asarray(scale), "u": np.asarray(u),
            "w": np.asarray(w), "label": np.asarray(label),
        }

    def verdict(self, config, data):
        end = float(data["end_alignment"][-1])
        rising = bool(np.all(np.diff(data["end_alignment"]) > -1e-3))
        ok = end > 0.99 and rising
        line = (f"alignment with u after the steered last layer: {fmt(end)} at γ = "
                f"{config['gamma']:g} = {fmt(config['gamma'] / float(data['norm']))}‖Ω_L‖₂ "
                f"(unsteered {fmt(data['c_u_plain'][-1])}); "
                f"rises with γ: {rising}")
        return Verdict(ok, line, {"end_alignment": end, "unsteered": float(data["c_u_plain"][-1]),
                                  "monotone": rising})

    def draw(self, config, data, folder):
        return plots.steer(data, Path(folder) / "steer")


def _last_layer(model, before, tau, u):
    x = run_model(model, before, layers=[model.num_layers - 1], tau=tau)[-1]
    return float(cosines(x.reshape(-1, x.shape[-1]), u).mean())


def _calibrated_w(model, config, d):
    """The top right singular vector of the tokens entering the last layer, on
    prompts drawn with another seed (not the evaluation prompts)."""
    xs = run_model(model, _tokens(config, d, offset=10_000), tau=config["tau"])
    X = xs[-2].reshape(-1, d)
    return jnp.linalg.svd(X, full_matrices=False)[2][0]


# --- oja-bipartite -----------------------------------------------------------------


class OjaBipartite(_Base):
    name = "oja-bipartite"
    theorem = "paper 004 Theorems 2-3"
    title = ("paper 004 App. D (Theorems 2, 3, Fig. 13): consensus/bipartite equilibria of "
             "the Oja system and the single-head map, jacfwd vs closed form vs simulation")
    params = (
        Param("instances", int, 20, "random symmetric U (and P) per map", 1),
        Param("tokens", int, 6, "tokens n of the random instances", 2),
        Param("dim", int, 3, "dimension d", 2),
        Param("tau", float, 1.0, "step τ", 0.0),
        Param("radius", float, 0.97, "Fig. 13: spectral radius of the stable bipartite point",
              0.0),
    )

    def simulate(self, config, progress):
        key = jax.random.PRNGKey(config["seed"])
        rows = [_instance(k, config) for k in jax.random.split(key, config["instances"])]
        table = {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}
        return table | _fig13(config)

    def verdict(self, config, data):
        fixed = data["residual"] < 1e-9
        decided = fixed & (np.abs(data["radius"] - 1) > 0.02)
        jac = data["radius"] < 1
        agree_cf = np.abs(data["radius"] - data["predicted"]) < 1e-6 * np.maximum(1, data["radius"])
        agree_t3 = data["theorem3"] == jac
        agree_sim = (data["growth"] < 1) == jac
        n = {"equilibria": int(fixed.sum()), "decided": int(decided.sum()),
             "stable": int((jac & fixed).sum()),
             "stable_bipartite": int((jac & fixed & (data["m"] < data["n"])).sum()),
             "closed_form_agrees": int((agree_cf & fixed).sum()),
             "theorem3_agrees": int((agree_t3 & fixed).sum()),
             "simulation_agrees": int((agree_sim & decided).sum()),
             "fig13_small_absorbed": bool(data["fig13_final"][0] < 1e-2 * data["fig13_eps"][0]),
             "fig13_large_escapes": bool(data["fig13_final"][1] > 0.5
                                         and data["fig13_spread"] < 1e-6)}
        ok = (n["closed_form_agrees"] == n["equilibria"] == n["theorem3_agrees"]
              and n["simulation_agrees"] == n["decided"] and n["fig13_small_absorbed"]
              and n["fig13_large_escapes"])
        line = (f"{n['equilibria']} equilibria: jacfwd radius = closed form in "
                f"{n['closed_form_agrees']}, Theorem 3 conditions agree in "
                f"{n['theorem3_agrees']}, simulation agrees in {n['simulation_agrees']}/"
                f"{n['decided']} decided; {n['stable_bipartite']} stable bipartite points; "
                f"Fig. 13: small perturbation absorbed {n['fig13_small_absorbed']}, larger "
                f"one escapes to consensus {n['fig13_large_escapes']}")
        return Verdict(bool(ok), line, n)

    def draw(self, config, data, folder):
        return plots.oja(data, Path(folder) / "oja_bipartite")


def _random_symmetric(key, d, scale):
    A = jax.random.normal(key, (d, d))
    return scale * (A + A.T) / 2


def _instance(key, config):
    """Both maps on one random instance: the Oja system with `U`, and the single-head
    map with the same `U` and a random symmetric `P` of larger scale."""
    d, n, tau = config["dim"], config["tokens"], config["tau"]
    ku, kp, ks = jax.random.split(key, 3)
    U = _random_symmetric(ku, d, 1.0)
    P = _random_symmetric(kp, d, 2.0)
    out = []
    for kind, dyn in (("oja", oja_system(U)), ("head", single_head(U, P))):
        eq = equilibria(dyn, n, tau=tau)
        g = perturbation_growth(dyn, eq.points, ks, eps=1e-6, layers=400, tau=tau)
        E = eq.m.shape[0]
        out.append({"map": np.full(E, kind), "m": np.asarray(eq.m), "n": np.full(E, n),
                    "index": np.asarray(eq.index), "residual": np.asarray(eq.residual),
                    "radius": np.asarray(eq.radius), "predicted": np.asarray(eq.predicted),
                    "theorem3": np.asarray(eq.theorem3), "growth": np.asarray(g)})
    return {k: np.concatenate([o[k] for o in out]) for k in out[0]}


def _fig13(config):
    """Fig. 13: the single-head map on S² with `U = diag(1, 0.5, −0.3)`, `P = q I`, `q`
    chosen (bisection on the closed form) so that 8 tokens at `e₁` and 2 at `−e₁`
    form a stable bipartite point of spectral radius `--radius`; perturbations of
    growing size, the smallest escaping one drawn beside a small absorbed one."""
    n, m, tau = 10, 8, config["tau"]
    lam = jnp.array([1.0, 0.5, -0.3])
    q = _bisect(lambda q: float(bipartite_closed_form(lam, 0, m, n, q, tau)[0]) - config["radius"],
                0.0, 10.0)
    dyn = single_head(jnp.diag(lam), q * jnp.eye(3))
    x = bipartite_point(jnp.eye(3)[0], n, m)
    z = jax.random.normal(jax.random.PRNGKey(config["seed"] + 13), x.shape)
    z = z - jnp.sum(z * x, -1, keepdims=True) * x
    z = z / jnp.max(jnp.linalg.norm(z, axis=-1))
    sizes = np.logspace(-3, 0.3, 34)
    paths = [_path(dyn, x, s * z, tau) for s in sizes]
    final = np.asarray([float(jnp.max(jnp.linalg.norm(p[-1] - x, axis=-1))) for p in paths])
    escaped = np.nonzero(final > 0.5)[0]
    big = int(escaped[0]) if escaped.size else len(sizes) - 1
    small = max(big - 4, 0)
    return {"fig13_q": np.asarray(q), "fig13_sizes": sizes, "fig13_dist": final,
            "fig13_paths": np.stack([paths[small], paths[big]]),
            "fig13_eps": sizes[[small, big]], "fig13_final": final[[small, big]],
            "fig13_spread": np.asarray(_spread(paths[big][-1])), "fig13_point": np.asarray(x)}


def _spread(x):
    """`max_i |x_i − x_0|`: zero at consensus."""
    return float(np.max(np.linalg.norm(x - x[:1], axis=-1)))


def _path(dyn, x, z, tau, layers=400):
    return np.asarray(run_layers(dyn, x + z, layers, tau))


def _bisect(f, lo, hi, iters=60):
    flo = f(lo)
    for _ in range(iters):
        mid = (lo + hi) / 2
        if (f(mid) > 0) == (flo > 0):
            lo, flo = mid, f(mid)
        else:
            hi = mid
    return (lo + hi) / 2

