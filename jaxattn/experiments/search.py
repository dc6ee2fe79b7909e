"""The gradient searches' shared frame (the base of `adversarial-tokens`,
`adversarial-weights`, `conjecture-multihead`, `conjecture-bipartite`): searches with
`ja.explore` that try to slow consensus or to stabilise what the theory says is
unstable. A member runs one search per *setting* (the sphere and the causal model; two
or three heads), saved under the setting's prefix (`h2_value`); the frame runs the
settings and joins their verdict parts.
"""

import abc
import typing
from typing import Any, ClassVar

import jax.numpy as jnp
import numpy as np
import optax

from .._artifacts import figures
from .._flow import solve_flow
from ..explore import NamedOptimizer
from .base import AbstractExperiment, Config, Param, Section, Verdict
from .verdicts import kind_verdict, overall_kind

#: The optimiser's parameters, shared by every search (`steps`, `restarts`, `lr`).
SEARCH_PARAMS = (
    Param("steps", int, 150, "optimiser steps", 1),
    Param("restarts", int, 16, "restarts, optimised as one vmapped batch", 1),
    Param("lr", float, 0.02, "Adam learning rate", 0.0),
)


def adam(config) -> NamedOptimizer:
    """The searches' optimiser, Adam at the rate `lr`, by name: a warm process loads
    the search's compiled programs."""
    return NamedOptimizer(optax.adam, learning_rate=config.lr)


class AbstractSearch(AbstractExperiment):
    """A gradient search: the flow only (no `--discrete`); each member declares its
    own horizon and saves, as its search needs them."""

    #: The settings searched, by the prefix of their arrays (`""`: one setting).
    settings: ClassVar[dict[str, Any]] = {"": None}

    @abc.abstractmethod
    def explore(self, config: Config, setting, progress: bool) -> dict[str, Any]:
        """The search of one setting and its check: the arrays to save."""

    @abc.abstractmethod
    def judge_setting(self, config: Config, found: Section,
                      setting) -> tuple[str | None, str]:
        """One setting's verdict: its kind (`VERDICT_KINDS`; `None` for a search that
        judges no theorem) and its part of the verdict line."""

    def numbers(self, config: Config, data: dict[str, np.ndarray]) -> dict[str, Any]:
        """The verdict's numbers (a hook; default: every scalar saved)."""
        return {k: float(np.asarray(v).ravel()[0]) for k, v in data.items()
                if np.asarray(v).size == 1}

    @typing.final
    def simulate(self, config, progress):
        data = {}
        for prefix, setting in self.settings.items():
            found = self.explore(config, setting, progress)
            data |= {f"{prefix}{k}": np.asarray(v) for k, v in found.items()}
        return data

    @typing.final
    def verdict(self, config, data) -> Verdict:
        kinds, parts = zip(*(self.judge_setting(config, found, setting)
                             for found, setting in self.sections(data)))
        line = "; ".join(parts)
        numbers = self.numbers(config, data)
        if all(kind is None for kind in kinds):  # a search with no theorem to judge
            return Verdict(True, line, numbers)
        return kind_verdict(overall_kind(kinds), line, numbers)

    @typing.final
    def sections(self, data) -> list[tuple[Section, Any]]:
        """Each setting's arrays, for the panels."""
        return [(Section(data, prefix=p), s) for p, s in self.settings.items()]


def searched(res) -> dict[str, Any]:
    """What every search of `ja.explore.slow_consensus` saves of its result: the trace,
    the random starts' values, the best value and the largest constraint violation."""
    return {"trace": res.trace, "baseline": res.baseline, "value": res.value,
            "violation": np.max(res.violation)}


def long_run(dyn, x0, T, saves=400):
    """The flow from `x0` on `saves + 1` equally spaced times of `[0, T]`: the times
    (NumPy) and the tokens `(..., saves + 1, n, d)`."""
    ts = jnp.linspace(0.0, T, saves + 1)
    return np.asarray(ts), solve_flow(dyn, x0, ts, max_steps=200000)


def draw_trace(ax, trace, baseline, label, baseline_label="random starts (mean)"):
    """The best value so far of every restart over the optimiser steps, beside the
    mean of the baseline (the random starts, or what `baseline_label` says)."""
    best = np.maximum.accumulate(np.asarray(trace), axis=0)
    shown = np.any(best > 0, axis=0)  # a restart at 0 throughout has no place on a log axis
    lines = ax.semilogy(np.where(best > 0, best, np.nan)[:, shown], color="tab:blue", lw=0.8,
                        alpha=0.6)
    hidden = int((~shown).sum())
    note = f" ({hidden} at 0 throughout: not drawn)" if hidden else ""
    figures.label_first(lines, "best so far, per restart" + note)
    ax.axhline(np.mean(baseline), color="k", ls="--", lw=1, label=baseline_label)
    ax.set_xlabel("optimiser step")
    figures.integer_ticks(ax.xaxis)
    ax.set_ylabel(label)
    figures.opaque(figures.legend_below(ax, ncol=2))  # the traces fill the panel
