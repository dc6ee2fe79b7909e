"""Measures of consensus (paper 001 §3–6): `import jaxattn as ja; ja.metrics.…`.

All take tokens with any leading (batch, time) axes and work under `jit`, `vmap`
and `grad`; `hemisphere` solves its convex program on the host through
`jax.pure_callback` and `wendel_probability` is a plain Python function.
`cluster_count` and `potential` work in blocks of rows above small n (no n × n
array at 10⁵–10⁶ tokens); `order_parameter` and `sphere_density` see the tokens as
a measure (its mean, its density on S²).
`CONSENSUS_TOL` is the tolerance at which jaxattn calls tokens in consensus
(`E < CONSENSUS_TOL`), used by the experiments, the sweeps and `ja.theory`.
"""

from .._horizon import CONSENSUS_TOL as CONSENSUS_TOL
from ._consensus import attention_entropy as attention_entropy
from ._consensus import cluster_count as cluster_count
from ._consensus import consensus_time as consensus_time
from ._consensus import misalignment as misalignment
from ._consensus import misalignment_floor as misalignment_floor
from ._consensus import pairwise_lyapunov as pairwise_lyapunov
from ._consensus import pairwise_misalignment as pairwise_misalignment
from ._consensus import potential as potential
from ._consensus import rank_collapse_residual as rank_collapse_residual
from ._hemisphere import Hemisphere as Hemisphere
from ._hemisphere import hemisphere as hemisphere
from ._hemisphere import wendel_probability as wendel_probability
from ._measure import SphereDensity as SphereDensity
from ._measure import order_parameter as order_parameter
from ._measure import sphere_density as sphere_density

__all__ = [
    "CONSENSUS_TOL",
    "Hemisphere",
    "SphereDensity",
    "attention_entropy",
    "cluster_count",
    "consensus_time",
    "hemisphere",
    "misalignment",
    "misalignment_floor",
    "order_parameter",
    "pairwise_lyapunov",
    "pairwise_misalignment",
    "potential",
    "rank_collapse_residual",
    "sphere_density",
    "wendel_probability",
]
