"""How far a simulation runs: a final time `T`, reached by the flow (eq. 6) on equally
spaced save times or by discrete layers (eq. 4) of step `τ`; and the tolerance at
which jaxattn calls tokens in consensus.

Every experiment, sweep and search converts its horizon with `Horizon`, so that
`T = 10, τ = 0.01` means 1000 layers everywhere, and a long run is cut into the
same equal pieces (one compiled program per piece length) wherever it is cut.
"""

import dataclasses

import numpy as np

#: Consensus is `E < CONSENSUS_TOL` (misalignment, eq. 25); a named limit `ℓ` is
#: reached when every `1 − ⟨x_i, ℓ⟩ < CONSENSUS_TOL`. The experiments' verdicts,
#: the sweeps' `consensus_time` column and their reports all read this value.
CONSENSUS_TOL = 1e-4


@dataclasses.dataclass(frozen=True)
class Horizon:
    """A final time `T > 0`.

    - `num_layers(tau)`: the number of layers of step `τ` that reach `T`,
      `max(1, round(T / τ))`.
    - `layer_times(tau)`: `kτ` for `k = 0 … num_layers`.
    - `save_times(saves)`: `saves + 1` equally spaced times of `[0, T]`.
    - `pieces(total)`: the number of equal pieces a run of `total` steps is cut
      into (the largest divisor of `total` up to `most`), so that every piece
      compiles to the same program.
    """

    T: float

    def __post_init__(self):
        if not (isinstance(self.T, (int, float, np.floating, np.integer)) and self.T > 0
                and np.isfinite(self.T)):
            raise ValueError(f"the horizon T must be a finite number > 0, got {self.T!r}.")

    def num_layers(self, tau: float) -> int:
        if not tau > 0:
            raise ValueError(f"the layer step τ must be > 0, got {tau!r}.")
        return max(1, round(self.T / tau))

    def layer_times(self, tau: float) -> np.ndarray:
        return tau * np.arange(self.num_layers(tau) + 1)

    def save_times(self, saves: int) -> np.ndarray:
        return np.linspace(0.0, self.T, saves + 1)

    @staticmethod
    def pieces(total: int, most: int = 20) -> int:
        return max(k for k in range(1, min(most, total) + 1) if total % k == 0)
