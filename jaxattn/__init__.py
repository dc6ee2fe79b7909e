"""jaxattn: the consensus dynamics of self-attention, in JAX.

Tokens are particles on a sphere or ellipsoid moved by multi-head attention,
layer by layer (`run_layers`) or in continuous time (`solve_flow`).

A run that stops on its values (tokens that became NaN, a solver out of steps)
raises a one-line `SimulationError` naming the cause and the fix.
"""

# The names below are imported on first use (PEP 562), so that `import jaxattn`
# and the `jaxattn` command's help start without loading JAX.

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what tools (type checkers, IDEs) see; the same objects at run time
    from . import bench as bench
    from . import cli as cli
    from . import experiments as experiments
    from . import explore as explore
    from . import metrics as metrics
    from . import models as models
    from . import spectral as spectral
    from . import sweep as sweep
    from . import theory as theory
    from ._determinism import deterministic_xla_flags as deterministic_xla_flags
    from ._dynamics import SelfAttentionDynamics as SelfAttentionDynamics
    from ._dynamics import random_dynamics as random_dynamics
    from ._dynamics import random_mask as random_mask
    from ._flow import FlowResult as FlowResult
    from ._flow import FlowSolution as FlowSolution
    from ._flow import ManifoldSolver as ManifoldSolver
    from ._flow import solve_flow as solve_flow
    from ._layers import run_layers as run_layers
    from ._manifold import manifold_drift as manifold_drift
    from ._manifold import normalize as normalize
    from ._manifold import sample_ellipsoid as sample_ellipsoid
    from ._manifold import w_norm as w_norm
    from ._noise import TokenNoise as TokenNoise
    from ._noise import ValueNoise as ValueNoise
    from ._precision import PRECISIONS as PRECISIONS
    from ._schedule import AbstractSchedule as AbstractSchedule
    from ._schedule import Constant as Constant
    from ._schedule import PiecewiseConstant as PiecewiseConstant
    from ._schedule import Schedule as Schedule
    from ._solvers import RK4 as RK4
    from ._validate import SimulationError as SimulationError
    from .metrics._consensus import misalignment as misalignment
    from ._app.animate import animate as animate

#: Each public name → the module that defines it.
_ATTRIBUTES = {
    "SelfAttentionDynamics": "._dynamics",
    "random_dynamics": "._dynamics",
    "random_mask": "._dynamics",
    "FlowResult": "._flow",
    "FlowSolution": "._flow",
    "ManifoldSolver": "._flow",
    "solve_flow": "._flow",
    "run_layers": "._layers",
    "manifold_drift": "._manifold",
    "normalize": "._manifold",
    "sample_ellipsoid": "._manifold",
    "w_norm": "._manifold",
    "TokenNoise": "._noise",
    "ValueNoise": "._noise",
    "PRECISIONS": "._precision",
    "deterministic_xla_flags": "._determinism",
    "AbstractSchedule": "._schedule",
    "Constant": "._schedule",
    "PiecewiseConstant": "._schedule",
    "Schedule": "._schedule",
    "RK4": "._solvers",
    "SimulationError": "._validate",
    "misalignment": ".metrics._consensus",
    "animate": "._app.animate",  # a movie of a trajectory (above the library: matplotlib)
}
#: The public namespaces `ja.X`, and the two commands' packages (`jaxattn bench`, the CLI).
_SUBMODULES = ("experiments", "explore", "metrics", "models", "spectral", "sweep", "theory",
               "bench", "cli")
__all__ = sorted(_ATTRIBUTES) + ["__version__"] + list(_SUBMODULES)


def __getattr__(name: str):
    if name in _SUBMODULES:
        value = importlib.import_module(f"{__name__}.{name}")
    elif name in _ATTRIBUTES:
        value = getattr(importlib.import_module(_ATTRIBUTES[name], __name__), name)
    elif name == "__version__":
        value = _version()
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("jaxattn")
    except PackageNotFoundError:  # running from a source tree without installing
        return "0.0.0"
