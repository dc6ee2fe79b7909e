"""Gradient-based exploration of the attention dynamics: `import jaxattn as ja;
ja.explore.slow_consensus(...)`.

Searches initial tokens and weights that slow consensus (or that break a
conjectured limit) by differentiating through the flow and the layers; the
bipartite-equilibrium tools of paper 004 measure local stability by the
Jacobian of the layer map on the tangent space.
"""

from ._explore import OBJECTIVES as OBJECTIVES
from ._explore import Exploration as Exploration
from ._explore import builtin_objective as builtin_objective
from ._explore import compare_adjoints as compare_adjoints
from ._explore import consensus_objective as consensus_objective
from ._explore import slow_consensus as slow_consensus
from ._explore_constraints import Constraints as Constraints

__all__ = [
    "OBJECTIVES",
    "Constraints",
    "Exploration",
    "builtin_objective",
    "compare_adjoints",
    "consensus_objective",
    "slow_consensus",
]
