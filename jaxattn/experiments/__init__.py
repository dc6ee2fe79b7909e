"""The named experiments of `jaxattn list/run/plot/sweep`: the one registry.

`MEMBERS` lists every experiment explicitly (nothing registers itself on import);
`REGISTRY` reads what `jaxattn list` and the sweeps need of a member (name, title,
theorem, sweepable, distributable) from its class body, without importing it (nor JAX). The family's
layout and the recipe for a new member: ARCHITECTURE.md ("An experiment").
"""

import functools
import importlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from .._lazy import lazy_names as _lazy_names
from .._lazy import load as _load
from .source import class_head, class_params

if TYPE_CHECKING:  # what tools see; imported on first use at run time (`lazy_names`)
    from . import paper001 as paper  # noqa: F401  (the short name; in __all__)
    from . import paper001 as paper001
    from .base import BETA as BETA
    from .base import AbstractExperiment as AbstractExperiment
    from .base import Param as Param
    from .base import Verdict as Verdict
    from .base import convert as convert
    from .loop_runner import run_loop as run_loop
    from .loop_runner import run_loop_grid as run_loop_grid
    from .replot import redraw as redraw
    from .replot import redraw_run as redraw_run
    from .runner import command_line as command_line
    from .runner import experiment_config as experiment_config
    from .runner import run_experiment as run_experiment
    from .source import NotDeclared as NotDeclared
    from .source import declared as declared

#: Every experiment of `jaxattn run NAME`, as `module.Class`, in the order `jaxattn
#: list` shows them.
MEMBERS = (
    "thm41_sphere.SphereExperiment",
    "thm51_causal.CausalExperiment",
    "thm52_symmetric.SymmetricExperiment",
    "thm32_gradient.GradientExperiment",
    "adversarial_tokens.AdversarialTokens",
    "adversarial_weights.AdversarialWeights",
    "conjecture_multihead.ConjectureMultihead",
    "conjecture_bipartite.ConjectureBipartite",
    "loop_grid.LoopGridExperiment",
    "power_shared.PowerShared",
    "power_layers.PowerLayers",
    "steer.Steer",
    "oja_bipartite.OjaBipartite",
    "phase_diagram.PhaseDiagram",
    "norm_beta.NormBeta",
    "variants.VariantsExperiment",
    "long_context.LongContext",
    "metastability.Metastability",
    "hardmax.Hardmax",
    "equiangular.Equiangular",
    "noisy_transition.NoisyTransition",
    "antipodal.Antipodal",
    "mean_field_equation.MeanFieldEquation",
)


class Entry(NamedTuple):
    """One experiment as its class declares it, read from its source: where it lives,
    what `jaxattn list` shows, whether `jaxattn sweep` can run it and whether it runs
    across processes."""

    module: str  # the module in `jaxattn.experiments`
    cls: str  # its `AbstractExperiment` subclass
    theorem: str
    title: str
    sweepable: bool = False
    distributable: bool = False


def _declared(member: str) -> tuple[str, Entry]:
    """`(name, Entry)` of `module.Class`, from the literal class variables at the
    head of its class body (`name`, `title`, `theorem`, `sweepable`;
    `source.class_head`): no import, and only the class's head is parsed."""
    module, cls = member.split(".")
    found = class_head(module, cls, ("name", "title", "theorem", "sweepable", "distributable"))
    missing = {"name", "title", "theorem"} - set(found)
    if missing:
        raise ImportError(f"{module}.{cls} (MEMBERS) is no class declaring the literal "
                          f"{', '.join(sorted(missing))}: write them as strings at the head "
                          "of its class body.")
    return found["name"], Entry(module, cls, found["theorem"], found["title"],
                                bool(found.get("sweepable", False)),
                                bool(found.get("distributable", False)))


#: Every experiment of `jaxattn run NAME`, by name, as its class declares it
#: (`MEMBERS`' order).
REGISTRY: dict[str, Entry] = dict(_declared(member) for member in MEMBERS)

#: The experiments `jaxattn sweep NAME` can run (they say so: `sweepable = True`).
SWEEPABLE: tuple[str, ...] = tuple(name for name, e in REGISTRY.items() if e.sweepable)


@functools.cache
def _made(entry: Entry) -> "AbstractExperiment":
    return getattr(importlib.import_module(f"{__name__}.{entry.module}"), entry.cls)()


class _Experiments(Mapping):
    """`REGISTRY` as experiment objects: each imported and made when first asked for."""

    def __getitem__(self, name: str) -> "AbstractExperiment":
        return _made(REGISTRY[name])

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


def declared_params(name: str) -> "tuple[Param, ...] | None":
    """The parameters of the experiment `name` (its `all_params()`), read from its
    source and its bases' without importing them (`source.class_params`); `None`
    when they are not declared plainly (the caller then imports the experiment)."""
    entry = REGISTRY[name]
    return class_params(entry.module, entry.cls)


def get_experiment(name: str) -> "AbstractExperiment":
    """The experiment called `name`, or a `ValueError` listing the names."""
    if name not in REGISTRY:
        raise ValueError(
            f"unknown experiment {name!r}; the experiments are {', '.join(REGISTRY)} "
            "(see `jaxattn list`)."
        )
    return EXPERIMENTS[name]


#: The names re-exported from the modules below (`paper` is the short name of
#: `paper001`), imported on first use (PEP 562): read from the `TYPE_CHECKING` block.
_ATTRIBUTES = _lazy_names(__file__)


def __getattr__(name: str):
    if name in _ATTRIBUTES:
        value = _load(__name__, _ATTRIBUTES[name])
    elif (Path(__file__).parent / f"{name}.py").exists():  # a member, by its module
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = sorted(["EXPERIMENTS", "MEMBERS", "REGISTRY", "SWEEPABLE", "Entry", "declared_params",
                  "get_experiment", *_ATTRIBUTES])
