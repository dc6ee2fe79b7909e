"""The named experiments of `jaxattn list/run/plot`: the one registry.

Every experiment is an `AbstractExperiment` (`base.py`) in a module of its own and
is listed here, explicitly; nothing registers itself on import, and the library
below (`ja.models`, `ja.spectral`, `ja.explore`, …) never imports this package.
`run.py` runs one into a run folder; `paper.py` holds the models of paper 001.
"""

from .adversarial import AdversarialTokens, AdversarialWeights
from .base import AbstractExperiment, Param, Verdict
from .conjectures import ConjectureBipartite, ConjectureMultihead
from .loop_grid import LoopGridExperiment
from .power_method import OjaBipartite, PowerLayers, PowerShared, Steer
from .thm32_gradient import GradientExperiment
from .thm41_sphere import SphereExperiment
from .thm51_causal import CausalExperiment
from .thm52_symmetric import SymmetricExperiment

#: Every experiment of `jaxattn run NAME`, by name, in the order `jaxattn list` shows.
EXPERIMENTS: dict[str, AbstractExperiment] = {
    e.name: e
    for e in (
        SphereExperiment(), CausalExperiment(), SymmetricExperiment(), GradientExperiment(),
        AdversarialTokens(), AdversarialWeights(), ConjectureMultihead(), ConjectureBipartite(),
        LoopGridExperiment(),
        PowerShared(), PowerLayers(), Steer(), OjaBipartite(),
    )
}


def get_experiment(name: str) -> AbstractExperiment:
    """The experiment called `name`, or a `ValueError` listing the names."""
    if name not in EXPERIMENTS:
        raise ValueError(
            f"unknown experiment {name!r}; the experiments are {', '.join(EXPERIMENTS)} "
            "(see `jaxattn list`)."
        )
    return EXPERIMENTS[name]


# run.py reads the registry above.
from .run import command_line as command_line  # noqa: E402
from .run import redraw as redraw  # noqa: E402
from .run import resolve_config as resolve_config  # noqa: E402
from .run import run_experiment as run_experiment  # noqa: E402
from .run import run_loop as run_loop  # noqa: E402
from .run import run_loop_grid as run_loop_grid  # noqa: E402

__all__ = ["EXPERIMENTS", "AbstractExperiment", "Param", "Verdict", "command_line",
           "get_experiment", "redraw", "resolve_config", "run_experiment", "run_loop",
           "run_loop_grid"]
