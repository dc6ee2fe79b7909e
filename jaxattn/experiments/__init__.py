"""The named experiments of `jaxattn list/run/plot`: the one registry.

Every experiment is an `AbstractExperiment` (`base.py`) in a module of its own and
is listed here, explicitly, in `REGISTRY`: its module and class, imported on first
use, and what `jaxattn list` says of it, read without importing it (nor JAX).
Nothing registers itself on import, and the library below (`ja.models`,
`ja.spectral`, `ja.explore`, …) never imports this package. `run.py` runs one
into a run folder; `paper.py` holds the models of paper 001 §6.1.
"""

import importlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # what tools see; imported on first use at run time
    from . import paper as paper
    from .base import AbstractExperiment, Param, Verdict
    from .run import command_line, redraw, resolve_config, run_experiment, run_loop
    from .run import run_loop_grid as run_loop_grid


class Entry(NamedTuple):
    """One experiment of `REGISTRY`: where it lives and how `jaxattn list` shows it
    (`theorem` and `title` equal the class's own; a test compares them)."""

    module: str  # the module in `jaxattn.experiments`
    cls: str  # its `AbstractExperiment` subclass
    theorem: str
    title: str


#: Every experiment of `jaxattn run NAME`, by name, in the order `jaxattn list` shows.
REGISTRY: dict[str, Entry] = {
    "thm41-sphere": Entry("thm41_sphere", "SphereExperiment", "4.1",
                          "10 tokens on S², 2 time-varying heads, U = I: consensus from a "
                          "hemisphere"),
    "thm51-causal": Entry("thm51_causal", "CausalExperiment", "5.1",
                          "causal, 50 tokens on S⁴⁹⁹, 2 heads, U = I, 100 starts: all tokens "
                          "→ x₁(0)"),
    "thm52-symmetric": Entry("thm52_symmetric", "SymmetricExperiment", "5.2",
                             "causal, 1 head, symmetric U with simple λ₁: tokens in ⟨v₁, x⟩ > 0 "
                             "→ v₁"),
    "thm32-gradient": Entry("thm32_gradient", "GradientExperiment", "3.2",
                            "1 head, P SPD, W U = P on an ellipsoid: gradient flow of E_P to an "
                            "equilibrium"),
    "adversarial-tokens": Entry("adversarial", "AdversarialTokens", "4.1, 5.1",
                                "initial tokens that maximise E(T) (thm41-sphere and "
                                "thm51-causal settings)"),
    "adversarial-weights": Entry("adversarial", "AdversarialWeights", "5.2",
                                 "bounded symmetric U and P (causal, one head) that maximise "
                                 "E(T)"),
    "conjecture-multihead": Entry("conjectures", "ConjectureMultihead",
                                  "5.2 (conjectured for h > 1)",
                                  "search for multi-head causal models (symmetric U_η) where "
                                  "tokens miss v₁"),
    "conjecture-bipartite": Entry("conjectures", "ConjectureBipartite",
                                  "paper 004 Theorem 3 (h = 1) and its open multi-head case",
                                  "weights that make a bipartite equilibrium of the layer map "
                                  "locally stable"),
    "loop-grid": Entry("loop_grid", "LoopGridExperiment", "5.1-5.3 (beyond their assumptions)",
                       "looped transformer (paper 001 §6.2, Figs. 7-10): E after every block for "
                       "trained/random/resampled weights, with and without FFN"),
    "power-shared": Entry("power_method", "PowerShared", "paper 004 Theorem 1",
                          "paper 004 §2.1/§3.1 (Fig. 2a, 6c): a shared-weight model; its case, "
                          "final alignment with v₁ and the 2-D subspace, depth prolonged"),
    "power-layers": Entry("power_method", "PowerLayers", "paper 004 §3.2, no theorem",
                          "paper 004 §2.2/§3.2 (Figs. 2b, 6, 7): per layer, alignment c, "
                          "increment Δ, probability p vs their all-eigenvector baselines"),
    "steer": Entry("power_method", "Steer", "paper 004 §2.3, no theorem",
                   "paper 004 §2.3/§3.3 (Figs. 2, 9): rank-1 edit of the last layer, Ω + γ u wᵀ; "
                   "alignment with u at the end, γ sweep"),
    "oja-bipartite": Entry("power_method", "OjaBipartite", "paper 004 Theorems 2-3",
                           "paper 004 App. D (Theorems 2, 3, Fig. 13): consensus/bipartite "
                           "equilibria of the Oja system and the single-head map, jacfwd vs "
                           "closed form vs simulation"),
    "phase-diagram": Entry("phase_diagram", "PhaseDiagram",
                           "Geshkovski et al. 2023, phase diagram (no theorem)",
                           "Geshkovski et al.'s phase diagram: density of clustered pairs over "
                           "(t, β), every β in one program"),
    "norm-beta": Entry("norm_beta", "NormBeta",
                       "Karagodin et al. 2025, normalisation and β (no theorem)",
                       "Karagodin et al.'s normalisation study: clustered pairs over (t, β) for "
                       "each placement of the normalisation"),
    "variants": Entry("variants", "VariantsStudy",
                      "4.1, 5.1 for post + softmax; no theorem for the variants",
                      "which variants escape consensus: norm × mask × kernel × β on random "
                      "weights, at a fixed depth"),
}


class _Experiments(Mapping):
    """`REGISTRY` as experiment objects: each module imported, and its one object
    made, when first asked for."""

    def __init__(self):
        self._made: dict[str, AbstractExperiment] = {}

    def __getitem__(self, name: str) -> "AbstractExperiment":
        if name not in self._made:
            entry = REGISTRY[name]
            module = importlib.import_module(f"{__name__}.{entry.module}")
            self._made[name] = getattr(module, entry.cls)()
        return self._made[name]

    def __contains__(self, name) -> bool:  # without importing the experiment
        return name in REGISTRY

    def __iter__(self) -> Iterator[str]:
        return iter(REGISTRY)

    def __len__(self) -> int:
        return len(REGISTRY)

    def __repr__(self) -> str:
        return f"EXPERIMENTS({', '.join(REGISTRY)})"


#: Every experiment of `jaxattn run NAME` as an object, by name (`REGISTRY`'s order).
EXPERIMENTS: Mapping[str, "AbstractExperiment"] = _Experiments()


def get_experiment(name: str) -> "AbstractExperiment":
    """The experiment called `name`, or a `ValueError` listing the names."""
    if name not in REGISTRY:
        raise ValueError(
            f"unknown experiment {name!r}; the experiments are {', '.join(REGISTRY)} "
            "(see `jaxattn list`)."
        )
    return EXPERIMENTS[name]


#: The names re-exported from `base.py` and `run.py`, imported on first use (PEP 562).
_ATTRIBUTES = {
    "AbstractExperiment": ".base", "Param": ".base", "Verdict": ".base",
    "command_line": ".run", "redraw": ".run", "resolve_config": ".run",
    "run_experiment": ".run", "run_loop": ".run", "run_loop_grid": ".run",
}


def __getattr__(name: str):
    if name in _ATTRIBUTES:
        value = getattr(importlib.import_module(_ATTRIBUTES[name], __name__), name)
    elif name == "paper" or any(e.module == name for e in REGISTRY.values()):
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = ["EXPERIMENTS", "REGISTRY", "AbstractExperiment", "Entry", "Param", "Verdict",
           "command_line", "get_experiment", "paper", "redraw", "resolve_config",
           "run_experiment", "run_loop", "run_loop_grid"]
