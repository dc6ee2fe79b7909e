"""Which theorem of paper 001 covers a model, and what it predicts:
`ja.theory.classify(dyn)`, `ja.theory.predict(dyn, x0)`.

Runs on the host (it reads concrete weights); see `classify` for the tolerances.
"""

from ._theory import THEOREMS as THEOREMS
from ._theory import Check as Check
from ._theory import Classification as Classification
from ._theory import Prediction as Prediction
from ._theory import TheoremReport as TheoremReport
from ._theory import classify as classify
from ._theory import predict as predict

__all__ = [
    "THEOREMS",
    "Check",
    "Classification",
    "Prediction",
    "TheoremReport",
    "classify",
    "predict",
]
