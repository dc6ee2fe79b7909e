"""How a batch of systems executes: the strategies' family (`base.py`), one file per
member, and `choose.py` (the shorthands, `"auto"`)."""

from .base import AbstractStrategy as AbstractStrategy
from .batch_last import BatchLast as BatchLast
from .choose import BUILTIN as BUILTIN
from .choose import FUSED_MAX_FLOPS as FUSED_MAX_FLOPS
from .choose import STRATEGIES as STRATEGIES
from .choose import as_strategy as as_strategy
from .choose import choose_strategy as choose_strategy
from .choose import fused_applies as fused_applies
from .choose import sequence_flops as sequence_flops
from .pallas_kernel import PallasKernel as PallasKernel
from .solve import FlowResult as FlowResult
from .solve import FlowSolution as FlowSolution
from .solve import ManifoldSolver as ManifoldSolver
from .stepping import stepped as stepped
from .vmap import Vmap as Vmap
