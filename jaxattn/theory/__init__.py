"""Which theorem of paper 001 covers a model, and what it predicts:
`ja.theory.classify(dyn)`, `ja.theory.predict(dyn, x0)`.

Runs on the host (it reads concrete weights); see `classify` for the tolerances.
"""

from ._classify import THEOREMS as THEOREMS
from ._classify import Check as Check
from ._classify import Classification as Classification
from ._classify import Prediction as Prediction
from ._classify import TheoremReport as TheoremReport
from ._classify import classify as classify
from ._classify import predict as predict

__all__ = [
    "THEOREMS",
    "Check",
    "Classification",
    "Prediction",
    "TheoremReport",
    "classify",
    "predict",
]
