"""Paper 004, "Analogies between transformer layers and power method": layer
matrices `Ω = Σ_η U_η`, their spectra, token alignment with their eigenvectors,
shared-weight dynamics, rank-1 steering, and the Oja / single-head equilibria.

```python
Omega = ja.spectral.layer_matrix(model, 3)          # (d, d), acts on token vectors
spec = ja.spectral.spectrum(Omega)                  # ordered by |λ|; tau=1.0: by |1 + λ|
c = ja.spectral.alignment(x, spec.principal)        # mean |cos(x_i, v₁)| (2-D if complex)
stats, eigs, xs = ja.spectral.layerwise(model, x0)  # c_ℓ, Δ_ℓ, p_ℓ and baselines per layer
steered = ja.spectral.steer(model, u, gamma)        # last layer: Ω + γ u uᵀ
eq = ja.spectral.equilibria(ja.spectral.single_head(U, P), n=6)
```

Experiments: `jaxattn run power-shared | power-layers | steer | oja-bipartite`.
"""

from . import _spectral_experiments as _spectral_experiments  # registers the experiments
from ._spectral import LayerAlignment as LayerAlignment
from ._spectral import Spectrum as Spectrum
from ._spectral import alignment as alignment
from ._spectral import cosines as cosines
from ._spectral import eigen_bases as eigen_bases
from ._spectral import increment as increment
from ._spectral import layer_alignment as layer_alignment
from ._spectral import layer_matrix as layer_matrix
from ._spectral import spectrum as spectrum
from ._spectral_oja import Equilibria as Equilibria
from ._spectral_oja import bipartite_closed_form as bipartite_closed_form
from ._spectral_oja import equilibria as equilibria
from ._spectral_oja import oja_system as oja_system
from ._spectral_oja import perturbation_growth as perturbation_growth
from ._spectral_oja import single_head as single_head
from ._spectral_oja import spectral_radius as spectral_radius
from ._spectral_oja import tangent_jacobian as tangent_jacobian
from ._spectral_steer import layer_dynamics as layer_dynamics
from ._spectral_steer import layerwise as layerwise
from ._spectral_steer import random_tokens as random_tokens
from ._spectral_steer import run_model as run_model
from ._spectral_steer import shared_alignment as shared_alignment
from ._spectral_steer import steer as steer
