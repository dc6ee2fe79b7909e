"""Gradient-based exploration of the attention dynamics: `import jaxattn as ja;
ja.explore.slow_consensus(...)`.

Searches initial tokens and weights that slow consensus (or that break a
conjectured limit) by differentiating through the flow and the layers; the
bipartite-equilibrium tools of paper 004 measure local stability by the
Jacobian of the layer map on the tangent space (`tangent_jacobian`,
`spectral_radius` and `bipartite_point` are `ja.spectral`'s, the same functions).

>>> import jax.numpy as jnp, jaxattn as ja
>>> ja.explore.bipartite_point(jnp.array([1.0, 0.0, 0.0]), 6, 4).shape  # 4 at v, 2 at −v
(6, 3)
>>> sorted(ja.explore.OBJECTIVES)[:2]
['consensus_time', 'final']
"""

from ..spectral import bipartite_point as bipartite_point
from ..spectral import spectral_radius as spectral_radius
from ..spectral import tangent_jacobian as tangent_jacobian
from ._bipartite import BipartiteWeights as BipartiteWeights
from ._bipartite import stabilize_bipartite as stabilize_bipartite
from ._constraints import Constraints as Constraints
from ._objectives import OBJECTIVES as OBJECTIVES
from ._objectives import builtin_objective as builtin_objective
from ._objectives import compare_adjoints as compare_adjoints
from ._objectives import consensus_objective as consensus_objective
from ._search import Exploration as Exploration
from ._search import NamedOptimizer as NamedOptimizer
from ._search import slow_consensus as slow_consensus

__all__ = [
    "OBJECTIVES",
    "BipartiteWeights",
    "Constraints",
    "Exploration",
    "NamedOptimizer",
    "builtin_objective",
    "compare_adjoints",
    "consensus_objective",
    "slow_consensus",
    "bipartite_point",
    "spectral_radius",
    "stabilize_bipartite",
    "tangent_jacobian",
]
