"""Measures of consensus (paper 001 §3–6): `import jaxattn as ja; ja.metrics.…`.

All take tokens with any leading (batch, time) axes and work under `jit`, `vmap`
and `grad`; `hemisphere` solves its convex program on the host through
`jax.pure_callback` and `wendel_probability` is a plain Python function.
"""

from ._hemisphere import Hemisphere as Hemisphere
from ._hemisphere import hemisphere as hemisphere
from ._hemisphere import wendel_probability as wendel_probability
from ._metrics import attention_entropy as attention_entropy
from ._metrics import cluster_count as cluster_count
from ._metrics import consensus_time as consensus_time
from ._metrics import misalignment as misalignment
from ._metrics import pairwise_lyapunov as pairwise_lyapunov
from ._metrics import potential as potential
from ._metrics import rank_collapse_residual as rank_collapse_residual

__all__ = [
    "Hemisphere",
    "attention_entropy",
    "cluster_count",
    "consensus_time",
    "hemisphere",
    "misalignment",
    "pairwise_lyapunov",
    "potential",
    "rank_collapse_residual",
    "wendel_probability",
]
