"""The theorem experiments' shared frame (the base of `thm41-sphere`, `thm51-causal`,
`thm52-symmetric`, `thm32-gradient`), as diffrax's `AbstractERK` is its tableaux'.

The frame runs the flow (eq. 6) and, with `--discrete`, the layers (eq. 4) from the
member's `setup`, saves each run's measures (the layers' with the suffix `_layers`)
and judges the flow: the member states what it observed (`Evidence`); the frame fits
its trend, decides the verdict's kind and writes the line's frame. Theorems 3.2, 4.1,
5.1 and 5.2 are about the flow alone, so the layers are described, never judged.
"""

import abc
import dataclasses
import typing
from typing import Any, ClassVar, NamedTuple

import jax
import numpy as np

from .._artifacts import figures
from .._programs import kept_jit
from ..metrics import misalignment
from ..theory import predict
from .base import AbstractSweepableExperiment, Config, Param, Section, Verdict
from .pieces import flow_path, layer_path
from .verdicts import (
    PLATEAU,
    Trend,
    kind_verdict,
    outcome_words,
    overall_kind,
    short,
    trend_kind,
)

#: The parameters of every theorem member; one may declare one again (`--horizon`).
THEOREM_PARAMS = (
    Param("discrete", bool, False, "run discrete layers (eq. 4) beside the flow (eq. 6)"),
    Param("horizon", float, 10.0, "final time T (depth in units of τ·layers)", 0.0),
    Param("saves", int, 1000, "number of saved time intervals of the flow", 1),
)


@dataclasses.dataclass(frozen=True)
class Evidence:
    """What a member observed in one run, for the frame to judge.

    - `residual`: the quantity the theorem drives to 0 (`E`, a distance to the
      predicted limit, a speed) at the run's times, `(T,)`, or `(B, T)` for `B` starts.
    - `reached`: whether the predicted outcome was reached (per start: `(B,)`).
    - `inside`: whether the start lies inside the theorem's hypotheses (per start).
    - `numbers`: the verdict's numbers (the trend's, or the counts per kind, follow).
    - `against`: a contradiction observed besides the trend (`E_P` falling along a
      gradient flow).
    - `unstable`: whether the final state is near an unstable equilibrium of the
      theorem (per start), where a stall is a plateau, undecided (`run_kind`).
    """

    residual: np.ndarray
    reached: Any
    inside: Any
    numbers: dict[str, Any]
    against: bool = False
    unstable: Any = False


@dataclasses.dataclass(frozen=True)
class Judged:
    """The kind (`VERDICT_KINDS`), the trend (over several starts: the slowest not yet
    arrived, `None` if all have) and, over several starts, each start's kind."""

    kind: str
    trend: Trend | None
    kinds: np.ndarray | None = None

    def count(self, kind: str) -> int:
        return int(np.sum(self.kinds == kind))


class Drawn(NamedTuple):
    """One run as a figure draws it: its arrays, label, colour, line style and width."""

    run: Section
    label: str
    color: str
    ls: Any
    lw: float


class AbstractTheoremExperiment(AbstractSweepableExperiment):
    """A test of a theorem of paper 001 on random instances, in the flow and
    (`--discrete`) in layers. A member provides `setup`, `evidence` and `describe`;
    the hooks `measures`, `facts`, `prediction`, `evolve` and `instance` have
    defaults it may replace."""

    base_params = THEOREM_PARAMS

    #: How a verdict line names a reached outcome, by kind (`"agrees"`: "consensus, ").
    reached_words: ClassVar[dict[str, str]] = {}
    #: The float settings `measures` and `flow_facts` read as Python numbers (a shape
    #: follows from them); the others enter their program traced, as `setup`'s do, so
    #: that a new `--beta` or `--seed` is no new program.
    measured_static: ClassVar[tuple[str, ...]] = ()

    def refusals(self, config):
        # round(T / τ) layers, at least one: a τ past T ran one layer to t = τ
        return ((config.discrete and config.tau > config.horizon,
                 f"--tau {config.tau:g} is longer than --horizon {config.horizon:g}: the "
                 f"layers would end at t = {config.tau:g}; lower --tau or raise --horizon."),)

    @abc.abstractmethod
    def setup(self, key, config: Config) -> tuple[Any, Any]:
        """One instance drawn from `key`: `(model, x0)`. `jaxattn run NAME --seed S`
        passes `PRNGKey(S)`, a sweep's instance `i` `PRNGKey(seed + i)`; `config`
        holds the parameters (floats such as `beta` may be traced scalars)."""

    @abc.abstractmethod
    def evidence(self, config: Config, run: Section) -> Evidence:
        """What the run judged (`run`: its arrays, the shared ones as fallback) shows."""

    @abc.abstractmethod
    def describe(self, config: Config, run: Section, evidence: Evidence,
                 judged: Judged) -> str:
        """The verdict line after `where: ` (use `words(kind)` for the outcome)."""

    def measures(self, config, dyn, test, x0, ts, ys) -> dict[str, Any]:
        """What a run of `evolve` keeps besides `ts` and `ys`, from its states
        `ys (T, n, d)`, traced: the frame runs it as one program (`config` static,
        `test`: the prediction's traceable `AbstractTheoremTest`, for its `check`;
        `None` where no theorem applies). A member that measures inside its own
        `evolve` has none."""
        return {}

    def facts(self, config, model, x0, pred, flow: dict[str, Any]) -> dict[str, Any]:
        """Arrays saved once, not per run, on the host: by default the prediction's
        domain test and the theorem it applies (`"none"`)."""
        return {"in_domain": pred.in_domain, "theorem": np.asarray(pred.theorem or "none")}

    def flow_facts(self, config, dyn, x0, ys) -> dict[str, Any]:
        """Arrays saved once, traced: measured in the flow's `measures` program."""
        return {}

    def prediction(self, config, model, x0):
        """What `ja.theory.predict` says of the instance."""
        return predict(model, x0)

    def instance(self, key, config: Config):
        dyn, x0 = self.setup(key, config)
        return dyn, x0, misalignment

    def evolve(self, config, model, x0, pred, *, discrete: bool, progress: bool):
        """One run, the flow or the layers: `ts`, `ys` and the `measures`."""
        desc = f"{self.name}: {'layers' if discrete else 'flow'}"
        if discrete:
            ts, ys = layer_path(model, x0, config.horizon, config.tau,
                                progress=progress, desc=desc)
        else:
            ts, ys = flow_path(model, x0, config.horizon, config.saves,
                               progress=progress, desc=desc)
        floats, static = _parts(self, config, self.measured_static)
        return {"ts": ts, "ys": ys} | _measured(self, static, floats, model, pred.test, x0,
                                                 np.asarray(ts), ys, flow=not discrete)

    @typing.final
    def simulate(self, config, progress):
        model, x0 = _setup(self, np.asarray(config.seed), *_parts(self, config))
        pred = self.prediction(config, model, x0)
        flow = self.evolve(config, model, x0, pred, discrete=False, progress=progress)
        data = flow | self.facts(config, model, x0, pred, flow)
        if config.discrete:
            layers = self.evolve(config, model, x0, pred, discrete=True, progress=progress)
            data |= {f"{k}_layers": v for k, v in layers.items()}
        return {k: np.asarray(v) for k, v in data.items()}

    @typing.final
    def verdict(self, config, data) -> Verdict:
        """Judges the flow (the theorems' eq. 6); with `--discrete` the line adds what
        the layers did, which decides nothing: no theorem here speaks of layers."""
        run = Section(data)
        evidence = self.evidence(config, run)
        judged, numbers = _judge(run["ts"], evidence)
        line = f"flow: {self.describe(config, run, evidence, judged)}"
        if judged.kind == "not_converged" and judged.trend is not None \
                and judged.trend.state == "stalled":
            line += f" (stalled on {PLATEAU})"
        extra = {}
        if config.discrete:
            layers = Section(data, suffix="_layers")
            outcome = self.layers_outcome(layers, self.evidence(config, layers))
            line += (f"; the layers ({len(layers['ts']) - 1}, τ = {config.tau:g}): {outcome}; "
                     f"Theorem {self.theorem} covers the flow only")
            extra = {"layers_outcome": outcome}
        return kind_verdict(judged.kind, line, evidence.numbers | numbers, extra)

    @typing.final
    def layers_outcome(self, run, evidence: Evidence) -> str:
        """What the layers did, in words that judge nothing: whether they reached the
        outcome the theorem predicts for the flow (per start over several)."""
        reached = self.reached_words.get("agrees", "the predicted outcome, ").removesuffix(", ")
        hit, inside = np.asarray(evidence.reached), np.asarray(evidence.inside)
        if not inside.any():
            return "outside the theorem's hypotheses"
        if hit.ndim:
            return f"{int(np.sum(hit & inside))}/{int(inside.sum())} starts reached {reached}"
        final = np.asarray(evidence.residual)[-1]
        return reached if hit else (f"{reached} not reached by t = {short(run['ts'][-1])} "
                                    f"(residual {short(final)})")

    @typing.final
    def words(self, kind: str) -> str:
        """The outcome of kind `kind` in words: `consensus, as Theorem 4.1 predicts`."""
        return self.reached_words.get(kind, "") + outcome_words(kind, self.theorem)

    @typing.final
    def drawn_runs(self, config, data) -> list[Drawn]:
        """The flow and, with `--discrete`, the layers after it, black, dashed and
        thinner: where the two curves coincide, the flow's shows on both sides."""
        runs = [Drawn(Section(data), "flow", "tab:blue", "-", 2.4)]
        if config.discrete:
            runs.append(Drawn(Section(data, suffix="_layers"),
                              rf"layers, $\tau$ = {config.tau:g}", "k", (0, (4, 2)), 1.1))
        return runs

    @typing.final
    def token_figure(self, config, data, title: str, *, toward=None, W=None, **marks):
        """A figure and its last two panels, after a 3-D panel of the run's token paths
        (`figures.draw_ellipsoid_trajectories` on `E_W`, `marks` as it takes them) titled
        `title` when the tokens live in R³, seen from `toward` (default: the final
        tokens' mean) tilted towards the start."""
        ys = data["ys_layers" if config.discrete else "ys"]
        cols = 3 if ys.shape[-1] == 3 else 2
        fig = figures.pyplot().figure(figsize=(13 if cols == 3 else 9, 4.2))
        if cols == 3:
            ax3 = fig.add_subplot(1, cols, 1, projection="3d")
            figures.draw_ellipsoid_trajectories(ax3, ys, W, **marks)
            look = ys[-1].mean(0) if toward is None else toward
            figures.view_towards(ax3, look + 0.6 * ys[0].mean(0))
            figures.title_3d(ax3, title)
        return fig, fig.add_subplot(1, cols, cols - 1), fig.add_subplot(1, cols, cols)


@kept_jit
def _setup(experiment, seed, floats, static):
    """`experiment.setup(PRNGKey(seed), config)` as one program, the seed and the float
    settings traced (the same program for every seed, β, T, τ)."""
    return experiment.setup(jax.random.PRNGKey(seed), experiment.config(static | floats))


def _parts(experiment, config, static: tuple[str, ...] = ()) -> tuple[dict, dict]:
    """`config` as `(floats, rest)`: its float settings but `static` as arrays (traced
    by a kept program: one program for every value), and the other settings, the seed
    left out (its default in the program: only `setup` reads it, from its key)."""
    floats = {p.name for p in experiment.all_params() if p.type is float} - set(static)
    return ({k: np.asarray(config[k]) for k in floats},
            {k: v for k, v in config.items() if k not in floats | {"seed"}})


@kept_jit
def _measured(experiment, static, floats, dyn, test, x0, ts, ys, *, flow: bool):
    """A run's `measures` (and the flow's `flow_facts`), one program, the float
    settings traced but the member's `measured_static` (`_parts`)."""
    config = experiment.config(static | floats)
    facts = experiment.flow_facts(config, dyn, x0, ys) if flow else {}
    return experiment.measures(config, dyn, test, x0, ts, ys) | facts


def _judge(ts, evidence: Evidence) -> tuple[Judged, dict[str, Any]]:
    """Trend → kind for one start, or per start and overall for several; the numbers
    the judgement adds (the trend's, or the counts of the kinds)."""
    residual = np.asarray(evidence.residual)
    if residual.ndim == 1:
        trend, kind = trend_kind(ts, residual, evidence.reached, evidence.inside,
                                 evidence.unstable)
        kind = "contradicts" if evidence.against and evidence.inside else kind
        return Judged(kind, trend), trend.numbers()
    kinds = np.full(len(residual), "not_applicable", dtype=object)
    slowest = None
    reached, inside = np.asarray(evidence.reached), np.asarray(evidence.inside)
    unstable = np.broadcast_to(np.asarray(evidence.unstable), inside.shape)
    for b in np.flatnonzero(inside):
        trend, kinds[b] = trend_kind(ts, residual[b], reached[b], True, unstable[b])
        if not reached[b] and (slowest is None or trend.reach > slowest.reach):
            slowest = trend
    judged = Judged(overall_kind(kinds), slowest, kinds)
    return judged, {k: judged.count(k) for k in ("not_converged", "contradicts")}
