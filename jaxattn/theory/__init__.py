"""Which theorem of paper 001 covers a model, and what it predicts:
`ja.theory.classify(dyn)`, `ja.theory.predict(dyn, x0)`; both run on the host, with
tolerances relative to each weight's own scale (`classify`, `default_tol`). Each
theorem's domain and outcome tests, traceable under `jit` and `vmap`, are
`ja.theory.theorem_test(theorem, dyn)`.

The closed forms and reductions are host functions of floats: the equiangular
reduction (`equiangular_*`), two tokens under the common value noise (`antipodal_*`)
and the noisy USA transition (`noisy_threshold`, `noisy_beta_star`, `layer_diffusion`,
`fit_threshold`).
"""

from ._antipodal import antipodal_diffusion as antipodal_diffusion
from ._antipodal import antipodal_drift as antipodal_drift
from ._antipodal import antipodal_probability as antipodal_probability
from ._antipodal import antipodal_rate as antipodal_rate
from ._antipodal import antipodal_threshold as antipodal_threshold
from ._classify import THEOREMS as THEOREMS
from ._classify import Check as Check
from ._classify import Classification as Classification
from ._classify import TheoremReport as TheoremReport
from ._classify import classify as classify
from ._classify import default_tol as default_tol
from ._equiangular import Asymptotics as Asymptotics
from ._equiangular import EquiangularSolution as EquiangularSolution
from ._equiangular import equiangular_asymptotics as equiangular_asymptotics
from ._equiangular import equiangular_field as equiangular_field
from ._equiangular import equiangular_rate as equiangular_rate
from ._equiangular import equiangular_solution as equiangular_solution
from ._equiangular import equiangular_tokens as equiangular_tokens
from ._noisy import fit_threshold as fit_threshold
from ._noisy import layer_diffusion as layer_diffusion
from ._noisy import noisy_beta_star as noisy_beta_star
from ._noisy import noisy_threshold as noisy_threshold
from ._predict import AbstractTheoremTest as AbstractTheoremTest
from ._predict import Prediction as Prediction
from ._predict import Theorem32Test as Theorem32Test
from ._predict import Theorem41Test as Theorem41Test
from ._predict import Theorem51Test as Theorem51Test
from ._predict import Theorem52Test as Theorem52Test
from ._predict import Theorem53Test as Theorem53Test
from ._predict import predict as predict
from ._predict import theorem_test as theorem_test

__all__ = [
    "THEOREMS",
    "AbstractTheoremTest",
    "Asymptotics",
    "Check",
    "Classification",
    "EquiangularSolution",
    "Prediction",
    "TheoremReport",
    "Theorem32Test",
    "Theorem41Test",
    "Theorem51Test",
    "Theorem52Test",
    "Theorem53Test",
    "antipodal_diffusion",
    "antipodal_drift",
    "antipodal_probability",
    "antipodal_rate",
    "antipodal_threshold",
    "classify",
    "default_tol",
    "equiangular_asymptotics",
    "equiangular_field",
    "equiangular_rate",
    "equiangular_solution",
    "equiangular_tokens",
    "fit_threshold",
    "layer_diffusion",
    "noisy_beta_star",
    "noisy_threshold",
    "predict",
    "theorem_test",
]
