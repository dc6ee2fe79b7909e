"""Paper 004, "Analogies between transformer layers and power method": layer
matrices `Ω = Σ_η U_η`, their spectra, token alignment with their eigenvectors,
shared-weight dynamics, rank-1 steering, and the Oja / single-head equilibria.

The objects and their use: `docs/usage/spectral.md`.

On a single-head map (`d = 3`):

>>> import jax.numpy as jnp, jaxattn as ja
>>> dyn = ja.spectral.single_head(jnp.diag(jnp.array([2.0, 1.0, 0.5])), jnp.eye(3))
>>> ja.spectral.layer_matrix(dyn).shape
(3, 3)
>>> [float(abs(c)) for c in ja.spectral.top_eigenvector(ja.spectral.layer_matrix(dyn))]
[1.0, 0.0, 0.0]

Experiments: `jaxattn run power-shared | power-layers | steer | oja-bipartite`.
"""

from ._equilibria import Equilibria as Equilibria
from ._equilibria import bipartite_closed_form as bipartite_closed_form
from ._equilibria import bipartite_point as bipartite_point
from ._equilibria import equilibria as equilibria
from ._equilibria import fixed_tolerance as fixed_tolerance
from ._equilibria import oja_system as oja_system
from ._equilibria import perturbation_growth as perturbation_growth
from ._equilibria import single_head as single_head
from ._equilibria import spectral_radius as spectral_radius
from ._equilibria import tangent_jacobian as tangent_jacobian
from ._layerwise import layer_dynamics as layer_dynamics
from ._layerwise import layerwise as layerwise
from ._layerwise import random_tokens as random_tokens
from ._layerwise import run_model as run_model
from ._layerwise import shared_alignment as shared_alignment
from ._layerwise import steer as steer
from ._spectrum import LayerAlignment as LayerAlignment
from ._spectrum import Spectrum as Spectrum
from ._spectrum import alignment as alignment
from ._spectrum import cosines as cosines
from ._spectrum import eigen_bases as eigen_bases
from ._spectrum import increment as increment
from ._spectrum import layer_alignment as layer_alignment
from ._spectrum import layer_matrix as layer_matrix
from ._spectrum import spectrum as spectrum
from ._spectrum import top_eigenvector as top_eigenvector
