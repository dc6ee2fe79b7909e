"""jaxattn: the consensus dynamics of self-attention, in JAX.

Tokens are particles on a sphere or ellipsoid moved by multi-head attention,
layer by layer (`run_layers`) or in continuous time (`solve_flow`).

A run that stops on its values (tokens that became NaN, a solver out of steps)
raises a one-line `SimulationError` naming the cause and the fix.
"""

# The names below are imported on first use (PEP 562, `jaxattn._lazy`), so that
# `import jaxattn` and `jaxattn --help` start without loading JAX.

from typing import TYPE_CHECKING

from ._lazy import lazy_names as _lazy_names
from ._lazy import load as _load

if TYPE_CHECKING:  # what tools (type checkers, IDEs) see; the same objects at run time
    from . import explore as explore
    from . import meanfield as meanfield
    from . import metrics as metrics
    from . import models as models
    from . import spectral as spectral
    from . import theory as theory
    from ._artifacts.animate import animate as animate  # a movie (above the library: matplotlib)
    from ._dynamics import SelfAttentionDynamics as SelfAttentionDynamics
    from ._dynamics import random_dynamics as random_dynamics
    from ._dynamics import random_mask as random_mask
    from ._flow import RK4 as RK4
    from ._flow import FlowResult as FlowResult
    from ._flow import FlowSolution as FlowSolution
    from ._flow import ManifoldSolver as ManifoldSolver
    from ._flow import solve_flow as solve_flow
    from ._kernel import USA as USA
    from ._kernel import AbstractKernel as AbstractKernel
    from ._kernel import AbstractPointwiseKernel as AbstractPointwiseKernel
    from ._kernel import Exp as Exp
    from ._kernel import Hardmax as Hardmax
    from ._kernel import Sigmoid as Sigmoid
    from ._kernel import Softmax as Softmax
    from ._layers import run_layers as run_layers
    from ._manifold import manifold_drift as manifold_drift
    from ._manifold import normalize as normalize
    from ._manifold import sample_ellipsoid as sample_ellipsoid
    from ._manifold import w_norm as w_norm
    from ._noise import TokenNoise as TokenNoise
    from ._noise import ValueNoise as ValueNoise
    from ._norm import NGPT as NGPT
    from ._norm import AbstractNorm as AbstractNorm
    from ._norm import NoNorm as NoNorm
    from ._norm import PeriNorm as PeriNorm
    from ._norm import PostNorm as PostNorm
    from ._norm import PreNorm as PreNorm
    from ._precision import PRECISIONS as PRECISIONS
    from ._process.cache import enable_cache as enable_cache
    from ._process.determinism import deterministic_xla_flags as deterministic_xla_flags
    from ._schedule import AbstractSchedule as AbstractSchedule
    from ._schedule import Constant as Constant
    from ._schedule import PiecewiseConstant as PiecewiseConstant
    from ._schedule import Schedule as Schedule
    from ._strategy import AbstractStrategy as AbstractStrategy
    from ._strategy import BatchLast as BatchLast
    from ._strategy import PallasKernel as PallasKernel
    from ._strategy import Vmap as Vmap
    from ._validate import SimulationError as SimulationError
    from .metrics import misalignment as misalignment

#: The applications above the library, reachable as `ja.experiments`, `ja.sweep`
#: and the two commands' packages (`jaxattn bench`, the CLI): imported on first use
#: like the rest, but named here, not imported above, since they import the
#: library and no import of this face runs up to them.
_APPLICATIONS = ("experiments", "sweep", "bench", "cli")
#: Each public name → `(module, attribute)` where it is defined (`attribute` `None`:
#: a namespace `ja.X`): the block above, read from the source, and the applications.
_ATTRIBUTES = _lazy_names(__file__) | {name: (f".{name}", None) for name in _APPLICATIONS}
__all__ = sorted(_ATTRIBUTES) + ["__version__"]


def __getattr__(name: str):
    if name in _ATTRIBUTES:
        value = _load(__name__, _ATTRIBUTES[name])
    elif name == "__version__":
        value = _version()
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def _version() -> str:
    # Imported here: importlib.metadata is half the start-up of `jaxattn --help` (15 ms).
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("jaxattn")
    except PackageNotFoundError:  # running from a source tree without installing
        return "0.0.0"
