"""`USA`: `exp(β (x_iᵀ P x_j − 1)) / n`."""

from .exponential import AbstractExponentialKernel


class USA(AbstractExponentialKernel):
    """`w_ij = exp(β (x_iᵀ P x_j − 1)) / n`: the unnormalised self-attention of the
    metastability papers, `Exp()`'s dynamics in time rescaled by `e^β`.

    Finite for every `β` while `x_iᵀ P x_j ≤ 1`; its exponent `β(⟨x, y⟩ − 1)` carries an
    absolute rounding of about `β` ulps, so take float64 for `β ≳ 10³`.
    """

    name = "usa"
    description = "exp(s − β)/n, not normalised over j"
    exponent_shift = 1.0

    def offset(self, beta, n, dtype):
        return -beta.astype(dtype)
