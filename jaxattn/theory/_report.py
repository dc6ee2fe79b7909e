"""What `classify` returns: one `TheoremReport` per theorem of paper 001 (Table 1),
each a list of `Check`s, gathered in a `Classification`."""

import dataclasses
from typing import Any

import numpy as np

THEOREMS = ("3.2", "4.1", "5.1", "5.2", "5.3")


@dataclasses.dataclass(frozen=True)
class Check:
    """One hypothesis, whether it holds, and the numbers behind the answer."""

    name: str
    holds: bool
    detail: str

    def __str__(self) -> str:
        return f"[{'x' if self.holds else ' '}] {self.name}: {self.detail}"


@dataclasses.dataclass(frozen=True)
class TheoremReport:
    """One theorem of paper 001 against one model.

    - `theorem`: `"3.2"`, `"4.1"`, `"5.1"`, `"5.2"` or `"5.3"`.
    - `applies`: whether every hypothesis holds.
    - `checks`: the hypotheses, each a `Check`.
    - `statement`: the theorem's conclusion in words, with the model's numbers.
    - `domain`: its domain of attraction in words.
    - `data`: numbers the prediction needs (e.g. `v1`, `eigenvalues`).
    """

    theorem: str
    applies: bool
    checks: tuple[Check, ...]
    statement: str
    domain: str
    data: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False)

    @property
    def failed(self) -> tuple[str, ...]:
        """The names of the hypotheses that do not hold."""
        return tuple(c.name for c in self.checks if not c.holds)

    def __str__(self) -> str:
        head = f"Theorem {self.theorem}: {'applies' if self.applies else 'does not apply'}"
        lines = [head] + [f"    {c}" for c in self.checks]
        if self.applies:
            lines += [f"    → {self.statement}", f"    domain: {self.domain}"]
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Classification:
    """What `classify` returns: one `TheoremReport` per theorem of Table 1."""

    reports: tuple[TheoremReport, ...]
    tol: float
    times: np.ndarray = dataclasses.field(repr=False)

    @property
    def applicable(self) -> tuple[TheoremReport, ...]:
        """The reports of the theorems whose hypotheses all hold."""
        return tuple(r for r in self.reports if r.applies)

    @property
    def theorems(self) -> tuple[str, ...]:
        """The numbers of the applicable theorems, e.g. `("4.1",)`."""
        return tuple(r.theorem for r in self.applicable)

    def __getitem__(self, theorem: str) -> TheoremReport:
        for r in self.reports:
            if r.theorem == theorem:
                return r
        raise KeyError(f"no Theorem {theorem!r}; the theorems are {', '.join(THEOREMS)}.")

    def summary(self) -> str:
        """One line: the theorems that apply and what they predict, or that none does
        and, for each theorem, the hypotheses the model fails."""
        if not self.applicable:
            why = "; ".join(f"Theorem {r.theorem} needs {', '.join(r.failed)}"
                            for r in self.reports)
            return f"no theorem of paper 001 applies to this model: {why}"
        return "; ".join(f"Theorem {r.theorem}: {r.statement}" for r in self.applicable)

    def __str__(self) -> str:
        return "\n".join([self.summary(), ""] + [str(r) for r in self.reports])
