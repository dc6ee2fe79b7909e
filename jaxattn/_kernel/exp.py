"""`Exp`: `exp(s) / n`."""


from .exponential import AbstractExponentialKernel


class Exp(AbstractExponentialKernel):
    """`w_ij = exp(β x_iᵀ P x_j) / n`, not normalised over `j`: the unnormalised model
    of Geshkovski et al.'s phase diagrams.

    At large `β` its weights overflow once `β x_iᵀ P x_j` passes the dtype's exponent
    range (≈ 88 in float32, 709 in float64); the run then stops with an error naming
    `ja.USA()`, the same dynamics in time rescaled by `e^β`.
    """

    name = "exp"
    description = "exp(s)/n, not normalised over j"
    exponent_shift = 0.0

    def offset(self, beta, n, dtype):
        return None
