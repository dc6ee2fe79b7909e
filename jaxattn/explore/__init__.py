"""Gradient-based exploration of the attention dynamics: `import jaxattn as ja;
ja.explore.slow_consensus(...)`.

Searches initial tokens and weights that slow consensus (or that break a
conjectured limit) by differentiating through the flow and the layers; the
bipartite-equilibrium tools of paper 004 measure local stability by the
Jacobian of the layer map on the tangent space.
"""

from ._constraints import Constraints as Constraints
from ._search import OBJECTIVES as OBJECTIVES
from ._search import Exploration as Exploration
from ._search import builtin_objective as builtin_objective
from ._search import compare_adjoints as compare_adjoints
from ._search import consensus_objective as consensus_objective
from ._search import slow_consensus as slow_consensus

__all__ = [
    "OBJECTIVES",
    "Constraints",
    "Exploration",
    "builtin_objective",
    "compare_adjoints",
    "consensus_objective",
    "slow_consensus",
]

from ._bipartite import bipartite_point as bipartite_point  # noqa: E402
from ._bipartite import spectral_radius as spectral_radius  # noqa: E402
from ._bipartite import stabilize_bipartite as stabilize_bipartite  # noqa: E402
from ._bipartite import tangent_jacobian as tangent_jacobian  # noqa: E402

__all__ += ["bipartite_point", "spectral_radius", "stabilize_bipartite", "tangent_jacobian"]
