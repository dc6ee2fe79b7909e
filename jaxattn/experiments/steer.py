"""`steer`: a rank-1 edit of a model's last layer, `Ω + γ u wᵀ`, and the tokens'
alignment with `u` at the end over a sweep of `γ` (paper 004 §2.3/§3.3, Figs. 2,
9)."""

import jax
import jax.numpy as jnp
import numpy as np

from .._manifold import normalize
from .._programs import kept_jit
from ..spectral import cosines, layer_matrix, layerwise, run_model, spectrum, steer
from . import power_plots as plots
from .base import Param, Verdict
from .paper004 import (
    FAMILY_FLAGS,
    MODEL_FLAGS,
    TOKENS,
    AbstractPowerExperiment,
    model_from_flags,
    random_prompts,
    stats_arrays,
)
from .verdicts import short

#: Paper 004 §2.3: once the steered layer's gap |λ₁|/|λ₂| is "of at least an order of
#: magnitude", its principal eigenvector is (approximately) `u`.
GAP = 10.0
#: How close to `u` "approximately" is: |⟨v₁, u⟩| at every γ of the sweep past `GAP`.
EIGENVECTOR = 0.99
#: The "near-perfect alignment" of the tokens with `u` at the end of the sweep (§3.3).
ALIGNED = 0.99
#: The largest `--gamma`: `γ·‖V⁺‖·‖V‖·|x|` must stay below float32's largest number,
#: where the edited model computes (the edit `γ u wᵀV⁺` is stored in its weights and
#: meets `V x` there). `V⁺` keeps singular values down to `max(h k, d) · ε · σ_max`
#: (`ja.spectral.steer`'s rank cutoff, `ε` float64's), so `‖V⁺‖‖V‖ ≤ 1/(d ε)`; with
#: tokens `x` of norm at most `d` (the prompts' `N(0, I)` tokens have `≈ √d`, a layer
#: norm's output `√d` times its gain) the product stays below `f32max · ε`, whatever
#: the model: `7.6·10²²`. Measured: at `d = 64` (`‖V⁺‖ = 5.5·10³`) `γ = 10³⁴` ran and
#: `10³⁷` overflowed after the work, past the old limit's check (`f32max` alone).
GAMMA_MAX = float(np.finfo(np.float32).max) * float(np.finfo(np.float64).eps)


class Steer(AbstractPowerExperiment):
    name = "steer"
    theorem = "paper 004 §2.3, no theorem"
    title = ("paper 004 §2.3/§3.3 (Figs. 2, 9): rank-1 edit of the last layer, Ω + γ u wᵀ; "
             "alignment with u at the end, γ sweep")
    params = MODEL_FLAGS + FAMILY_FLAGS + TOKENS + (
        Param("gamma", float, 1e5, "steering strength γ (the sweep ends here)", 0.0),
        Param("calibrate", bool, False,
              "w = the top direction of the last layer's inputs on other prompts (else w = u)"),
    )

    def refusals(self, config):
        yield from super().refusals(config)
        big = float(np.finfo(np.float32).max)
        yield (not config.gamma <= GAMMA_MAX, f"--gamma {config.gamma:g}: the edit γ u wᵀV⁺ "
               f"meets V x in the model's float32, which overflow past {big:.2g} once "
               "γ‖V⁺‖‖V‖|x| does (‖V⁺‖‖V‖ ≤ 1/(d·2.2e-16) by steer's rank cutoff, |x| ≤ d); "
               f"choose --gamma ≤ {GAMMA_MAX:.2g}.")

    def simulate(self, config, progress):
        model, label = model_from_flags(config, "gpt2")
        d = model.config.hidden_size
        x0 = random_prompts(config, d)
        u = normalize(jax.random.normal(jax.random.PRNGKey(config.seed + 7), (d,), x0.dtype))
        w = u
        if config.calibrate:  # the top right singular vector of the tokens entering the
            # last layer, on prompts drawn with another seed (not the evaluation prompts)
            seen = run_model(model, random_prompts(config, d, offset=10_000), tau=config.tau)
            w = jnp.linalg.svd(seen[-2].reshape(-1, d), full_matrices=False)[2][0]
        scale = float(_norm(model, x0.dtype))
        gammas = config.gamma * np.logspace(-7, 0, 15)
        xs = np.asarray(run_model(model, x0, tau=config.tau))  # iterated on the host
        steered = [steer(model, u, g, w=w) for g in gammas]
        ends = [_last_layer(m, xs[-2], config.tau, u) for m in steered]
        spectra = [spectrum(layer_matrix(m, -1).astype(x0.dtype)) for m in steered]
        stats, eigs, xs_s = layerwise(steer(model, u, config.gamma, w=w), x0, tau=config.tau)
        return stats_arrays(stats) | {
            "gammas": gammas, "end_alignment": np.asarray(ends),
            "c_u": np.asarray([_alignment(x, u) for x in np.asarray(xs_s)]),
            "c_u_plain": np.asarray([_alignment(x, u) for x in xs]),
            # the steered layer's |λ₁|/|λ₂| and its v₁'s |cos| with u, per γ
            "gap_ratio": np.asarray([float(s.key[0] / s.key[1]) for s in spectra]),
            "v1_u": np.asarray([float(abs(np.vdot(np.asarray(s.v1), np.asarray(u))))
                                for s in spectra]),
            "eigenvalues": np.asarray(eigs), "norm": np.asarray(scale), "u": np.asarray(u),
            "w": np.asarray(w), "label": np.asarray(label),
        }

    def verdict(self, config, data):
        """Two claims of paper 004 §2.3/§3.3: past a gap of `GAP` the steered layer's
        principal eigenvector is `u` (to `EIGENVECTOR`), and a large enough γ aligns
        the tokens with `u` (`ALIGNED` at the sweep's end, rising with γ). A sweep that
        opens no such gap, or ends below `ALIGNED` while still rising, is undecided."""
        ends, gammas, norm = data["end_alignment"], data["gammas"], float(data["norm"])
        end, plain = float(ends[-1]), float(data["c_u_plain"][-1])
        rising = bool(np.all(np.diff(ends) > -1e-3))
        past = data["gap_ratio"] >= GAP
        numbers = {"end_alignment": end, "unsteered": plain, "monotone": rising,
                   "largest_gap": float(data["gap_ratio"].max())}
        if not past.any():
            return Verdict(False, f"no γ of the sweep opens a gap |λ₁/λ₂| of {GAP:g} in the "
                           f"steered Ω_L (largest {short(numbers['largest_gap'])}); tokens "
                           f"{end:.4f} aligned with u", numbers,
                           undecided="raise --gamma")
        first = int(np.argmax(past))
        v1_u = float(data["v1_u"][past].min())
        numbers |= {"v1_u": v1_u, "gamma_gap": float(gammas[first]),
                    "tokens_at_gap": float(ends[first])}
        # a gap already open at the sweep's first γ opened below it: no threshold read
        opened = (f"past a gap |λ₁/λ₂| ≥ {GAP:g} (γ ≥ {short(gammas[first] / norm)}‖Ω_L‖₂)"
                  if first else f"with a gap |λ₁/λ₂| ≥ {GAP:g} open from the sweep's first γ "
                  f"({short(gammas[0] / norm)}‖Ω_L‖₂: where it opens lies below the sweep)")
        line = (f"{opened} the steered v₁ has |⟨v₁, u⟩| ≥ {v1_u:.4f}, tokens "
                f"{ends[first]:.4f} aligned with u there; at γ = {config.gamma:g} = "
                f"{short(config.gamma / norm)}‖Ω_L‖₂ tokens {end:.4f} (unsteered "
                f"{plain:.4f}); rises with γ: {rising}")
        if v1_u >= EIGENVECTOR and rising and end <= ALIGNED:
            return Verdict(False, line, numbers, undecided="raise --gamma")
        return Verdict(v1_u >= EIGENVECTOR and rising and end > ALIGNED, line, numbers)

    def draw(self, config, data, folder):
        return plots.steer(data, self.stem(folder), gap=GAP)


@kept_jit
def _norm(model, dtype):
    """`‖Ω_L‖₂` of the last layer."""
    return jnp.linalg.norm(layer_matrix(model, -1).astype(dtype), 2)


def _alignment(x, u) -> float:
    """The tokens' `x (..., d)` mean cosine with `u`."""
    return float(cosines(x.reshape(-1, x.shape[-1]), u).mean())


def _last_layer(model, before, tau, u):
    xs = run_model(model, before, layers=[model.num_layers - 1], tau=tau)
    return _alignment(np.asarray(xs)[-1], u)
