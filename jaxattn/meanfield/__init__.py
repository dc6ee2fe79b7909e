"""`ja.meanfield`: the mean-field equation of noisy self-attention on `S^{d−1}`,
`∂_t μ = (σ²/2) Δμ − K div(μ X[μ])` (`docs/meanfield_equation.md`), for `d = 2`
(`Circle`, Fourier) and `d = 3` (`Sphere`, spherical harmonics): its solver, free
energy and order parameter, the uniform state's linear growth rates, and the
transition couplings `K_#` and `K_c`, and the ordered branch's end `K_f`
(`fold_coupling`); on the circle, the particle system itself with its field summed
in Fourier modes (`circle_particles`, `O(n)` per step)."""

from ._circle import Circle as Circle
from ._etd import ETDRK4 as ETDRK4
from ._grid import AbstractGrid as AbstractGrid
from ._kernels import KERNELS as KERNELS
from ._kernels import coupling_of as coupling_of
from ._measures import cap as cap
from ._measures import density as density
from ._measures import free_energy as free_energy
from ._measures import mode_distance as mode_distance
from ._measures import order_parameter as order_parameter
from ._measures import sample as sample
from ._measures import sampling_distance as sampling_distance
from ._measures import uniform as uniform
from ._particles import circle_modes as circle_modes
from ._particles import circle_particles as circle_particles
from ._particles import circle_velocity as circle_velocity
from ._solve import fluctuation_distance as fluctuation_distance
from ._solve import solve as solve
from ._sphere import Sphere as Sphere
from ._stability import growth_rate as growth_rate
from ._stability import linear_threshold as linear_threshold
from ._transition import fold_coupling as fold_coupling
from ._transition import ordered_state as ordered_state
from ._transition import transition_coupling as transition_coupling
