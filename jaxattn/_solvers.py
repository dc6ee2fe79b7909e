"""Extra diffrax solvers."""

from collections.abc import Callable
from typing import ClassVar

import diffrax as dfx
import numpy as np

_rk4_tableau = dfx.ButcherTableau(
    a_lower=(np.array([0.5]), np.array([0.0, 0.5]), np.array([0.0, 0.0, 1.0])),
    b_sol=np.array([1 / 6, 1 / 3, 1 / 3, 1 / 6]),
    # Embedded second-order (midpoint) estimate, so RK4 also runs adaptively.
    b_error=np.array([1 / 6, 1 / 3 - 1, 1 / 3, 1 / 6]),
    c=np.array([0.5, 0.5, 1.0]),
)


class RK4(dfx.AbstractERK):
    """The classical fourth-order Runge–Kutta method (4 stages).

    Usually run with constant steps: `solve_flow(..., solver=ja.RK4(), dt0=h,
    stepsize_controller=diffrax.ConstantStepSize())`. Carries an embedded
    second-order (midpoint) error estimate, so adaptive stepping works too,
    though `diffrax.Tsit5` is the better adaptive choice.
    """

    tableau: ClassVar[dfx.ButcherTableau] = _rk4_tableau
    interpolation_cls: ClassVar[Callable[..., dfx.AbstractLocalInterpolation]] = (
        dfx.ThirdOrderHermitePolynomialInterpolation.from_k
    )

    def order(self, terms):
        return 4
