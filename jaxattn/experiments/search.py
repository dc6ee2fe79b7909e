"""The gradient searches' shared frame (the base of `adversarial-tokens`,
`adversarial-weights`, `conjecture-multihead`, `conjecture-bipartite`): searches with
`ja.explore` that try to slow consensus or to stabilise what the theory says is
unstable. A member runs one search per *setting* (the sphere and the causal model; two
or three heads), saved under the setting's prefix (`h2_value`); the frame runs the
settings and joins their verdict parts.
"""

import abc
import dataclasses
import re
import typing
from typing import Any, ClassVar

import equinox as eqx
import jax
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
        """The verdict's numbers (a hook; default: every scalar saved, as what it is: a
        theorem's label `"4.1"` a string, a flag a bool, a count an int)."""
        return {k: np.asarray(v).ravel()[0].item() for k, v in data.items()
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
        kind = overall_kind(kinds)
        verdict = kind_verdict(kind, line, numbers)
        undecided = "" if kind == "contradicts" else self.undecided(config, data, kind)
        return dataclasses.replace(verdict, ok=False, undecided=undecided) if undecided \
            else verdict

    def undecided(self, config: Config, data: dict[str, np.ndarray], kind: str) -> str:
        """What would decide a run that neither agrees nor contradicts (`""`: it is
        decided; `jaxattn run` exits 4 otherwise). A hook: by default, a long check
        (`long_run`) that stopped at the flow solver's step budget."""
        stopped = any("long_complete" in s and not bool(s["long_complete"])
                      for s, _ in self.sections(data))
        return ("a smaller --long: the long check stopped at the flow solver's step budget"
                if stopped else "a larger --long" if kind == "not_converged" else "")

    @typing.final
    def sections(self, data) -> list[tuple[Section, Any]]:
        """Each setting's arrays, for the panels."""
        return [(Section(data, prefix=p), s) for p, s in self.settings.items()]


def searched(res) -> dict[str, Any]:
    """What every search of `ja.explore.slow_consensus` saves of its result: the trace,
    the random starts' values, the best value and the largest constraint violation."""
    return {"trace": res.trace, "baseline": res.baseline, "value": res.value,
            "violation": np.max(res.violation)}


def model_arrays(dyn) -> dict[str, np.ndarray]:
    """The model's arrays by their place in it (`model_U_value`, `model_P_params_0` for
    the first parameter of a schedule `P`), for `data.npz`: with the experiment's
    schedule functions they rebuild the model the run searched with."""
    leaves = jax.tree_util.tree_flatten_with_path(dyn)[0]
    return {"model" + re.sub(r"[^A-Za-z0-9]+", "_", jax.tree_util.keystr(path)).rstrip("_"):
            np.asarray(leaf) for path, leaf in leaves if eqx.is_array(leaf)}


def long_run(dyn, x0, T, saves=400):
    """The flow from `x0` on `saves + 1` equally spaced times of `[0, T]`: the times
    (NumPy), the tokens `(..., times, n, d)` and whether every run reached `T`. A run
    that reaches the step budget first is cut at the last time every run reached (the
    search before it is kept; `AbstractSearch.undecided` says to lower `--long`)."""
    ts = np.linspace(0.0, T, saves + 1)
    out = solve_flow(dyn, x0, jnp.asarray(ts), max_steps=200000, throw=False)
    ys = np.asarray(out.ys)
    reached = np.all(np.isfinite(ys.reshape(-1, *ys.shape[-3:])), axis=(0, 2, 3))
    end = len(ts) if reached.all() else max(int(np.argmin(reached)), 1)
    return ts[:end], ys[..., :end, :, :], bool(np.all(out.success))


def draw_trace(ax, trace, baseline, label, baseline_label="random starts (mean)"):
    """Every restart's value at each optimiser step (a search can lose ground: the
    constraint map after a step is not part of its gradient) and the best so far over
    all restarts, beside the mean of the baseline (the random starts, or what
    `baseline_label` says)."""
    trace = np.asarray(trace)
    # the best so far first, wide and light: the restart that holds it stays visible on it
    best = np.maximum.accumulate(np.max(np.where(np.isnan(trace), -np.inf, trace), axis=1))
    ax.semilogy(np.where(best > 0, best, np.nan), color="0.7", lw=4,
                label="best so far (all restarts)")
    shown = np.any(trace > 0, axis=0)  # a restart at 0 throughout has no place on a log axis
    lines = ax.semilogy(np.where(trace > 0, trace, np.nan)[:, shown], color="tab:blue",
                        lw=0.8, alpha=0.8)
    hidden = int((~shown).sum())
    note = f" ({hidden} at 0 throughout: not drawn)" if hidden else ""
    figures.label_first(lines, "each restart, per step" + note)
    ax.axhline(np.mean(baseline), color="k", ls="--", lw=1, label=baseline_label)
    ax.set_xlabel("optimiser step")
    figures.integer_ticks(ax.xaxis)
    ax.set_ylabel(label)
    figures.opaque(figures.legend_below(ax, ncol=2))  # the traces fill the panel
