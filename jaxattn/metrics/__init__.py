"""Measures of consensus (paper 001 §3–6): `import jaxattn as ja; ja.metrics.…`.

All take tokens with any leading (batch, time) axes and work under `jit`, `vmap`
and `grad`; `hemisphere` solves its convex program on the host through
`jax.pure_callback` and `wendel_probability` is a plain Python function.
`cluster_labels` (single linkage; `cluster_count` counts its clusters) and
`potential` work in blocks of rows above small n (no n × n array at 10⁵–10⁶
tokens); `order_parameter` and `sphere_density` see the tokens as a measure (its
mean, its density on S²). `interaction_energy`, `saddle_index` and `plateaus` read
the metastable staircase of the unnormalised flow.
`CONSENSUS_TOL` is the tolerance at which jaxattn calls tokens in consensus
(`E < CONSENSUS_TOL`), used by the experiments, the sweeps and `ja.theory`.
"""

from .._horizon import CONSENSUS_TOL as CONSENSUS_TOL
from ._consensus import attention_entropy as attention_entropy
from ._consensus import cluster_count as cluster_count
from ._consensus import cluster_labels as cluster_labels
from ._consensus import consensus_time as consensus_time
from ._consensus import misalignment as misalignment
from ._consensus import misalignment_floor as misalignment_floor
from ._consensus import pairwise_lyapunov as pairwise_lyapunov
from ._consensus import pairwise_misalignment as pairwise_misalignment
from ._consensus import potential as potential
from ._consensus import rank_collapse_residual as rank_collapse_residual
from ._energy import interaction_energy as interaction_energy
from ._energy import saddle_index as saddle_index
from ._energy import tangent_hessian as tangent_hessian
from ._hemisphere import Hemisphere as Hemisphere
from ._hemisphere import hemisphere as hemisphere
from ._hemisphere import wendel_probability as wendel_probability
from ._measure import SphereDensity as SphereDensity
from ._measure import order_parameter as order_parameter
from ._measure import sphere_density as sphere_density
from ._staircase import Staircase as Staircase
from ._staircase import plateaus as plateaus

__all__ = [
    "CONSENSUS_TOL",
    "Hemisphere",
    "SphereDensity",
    "Staircase",
    "attention_entropy",
    "cluster_count",
    "cluster_labels",
    "consensus_time",
    "hemisphere",
    "interaction_energy",
    "misalignment",
    "misalignment_floor",
    "order_parameter",
    "pairwise_lyapunov",
    "pairwise_misalignment",
    "plateaus",
    "potential",
    "rank_collapse_residual",
    "saddle_index",
    "sphere_density",
    "tangent_hessian",
    "wendel_probability",
]
