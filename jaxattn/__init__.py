"""jaxattn: the consensus dynamics of self-attention, in JAX.

Tokens are particles on a sphere or ellipsoid moved by multi-head attention,
layer by layer (`run_layers`) or in continuous time (`solve_flow`).
"""

from importlib.metadata import PackageNotFoundError, version

from ._dynamics import SelfAttentionDynamics as SelfAttentionDynamics
from ._flow import FlowResult as FlowResult
from ._flow import ManifoldSolver as ManifoldSolver
from ._flow import solve_flow as solve_flow
from ._layers import run_layers as run_layers
from ._manifold import manifold_drift as manifold_drift
from ._manifold import normalize as normalize
from ._manifold import sample_ellipsoid as sample_ellipsoid
from ._manifold import w_norm as w_norm
from ._precision import PRECISIONS as PRECISIONS
from ._runs import deterministic_xla_flags as deterministic_xla_flags
from ._schedule import AbstractSchedule as AbstractSchedule
from ._schedule import Constant as Constant
from ._schedule import PiecewiseConstant as PiecewiseConstant
from ._schedule import Schedule as Schedule
from ._solvers import RK4 as RK4
from .metrics._consensus import misalignment as misalignment

try:
    __version__ = version("jaxattn")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0"

from . import explore as explore  # noqa: E402
from . import metrics as metrics  # noqa: E402
from . import models as models  # noqa: E402
from . import spectral as spectral  # noqa: E402
from . import sweep as sweep  # noqa: E402
from . import theory as theory  # noqa: E402
