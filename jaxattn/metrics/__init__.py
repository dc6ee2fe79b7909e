"""Measures of consensus (paper 001 §3–6): `import jaxattn as ja; ja.metrics.…`.

The token measures take any leading (batch, time) axes and work under `jit`, `vmap`
and `grad` (`hemisphere` solves its convex program on the host through
`jax.pure_callback`); `cluster_labels` and `potential` work in blocks of rows, never an
n × n array at 10⁵–10⁶ tokens. The statistics the verdicts rest on (`level_crossing`,
`fit_slope`, `fit_intercept`, `fit_crossing`, `window_statistics`, …) are host functions of NumPy
arrays; `rescaled_flow` and `rescaled_euler` integrate the flow to horizons of `10³⁰⁰`.
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
from ._energy import tangent_basis as tangent_basis
from ._energy import tangent_hessian as tangent_hessian
from ._hemisphere import Hemisphere as Hemisphere
from ._hemisphere import hemisphere as hemisphere
from ._hemisphere import wendel_probability as wendel_probability
from ._long_time import RESCALED_SNAP as RESCALED_SNAP
from ._long_time import rescaled_euler as rescaled_euler
from ._long_time import rescaled_flow as rescaled_flow
from ._measure import SphereDensity as SphereDensity
from ._measure import order_parameter as order_parameter
from ._measure import sphere_density as sphere_density
from ._staircase import Staircase as Staircase
from ._staircase import plateaus as plateaus
from ._statistics import WindowStatistics as WindowStatistics
from ._statistics import autocorrelation_time as autocorrelation_time
from ._statistics import binomial_error as binomial_error
from ._statistics import block_means as block_means
from ._statistics import fit_crossing as fit_crossing
from ._statistics import fit_intercept as fit_intercept
from ._statistics import fit_slope as fit_slope
from ._statistics import half_gap as half_gap
from ._statistics import level_crossing as level_crossing
from ._statistics import mean_error as mean_error
from ._statistics import window_statistics as window_statistics

__all__ = [
    "CONSENSUS_TOL",
    "RESCALED_SNAP",
    "Hemisphere",
    "SphereDensity",
    "Staircase",
    "WindowStatistics",
    "attention_entropy",
    "autocorrelation_time",
    "binomial_error",
    "block_means",
    "cluster_count",
    "cluster_labels",
    "consensus_time",
    "fit_crossing",
    "fit_intercept",
    "fit_slope",
    "half_gap",
    "hemisphere",
    "interaction_energy",
    "level_crossing",
    "mean_error",
    "misalignment",
    "misalignment_floor",
    "order_parameter",
    "pairwise_lyapunov",
    "pairwise_misalignment",
    "plateaus",
    "potential",
    "rank_collapse_residual",
    "rescaled_euler",
    "rescaled_flow",
    "saddle_index",
    "sphere_density",
    "tangent_basis",
    "tangent_hessian",
    "wendel_probability",
    "window_statistics",
]
