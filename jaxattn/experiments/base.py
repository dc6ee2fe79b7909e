"""What every experiment of paper 001 §6.1 provides, and how one is run and saved.

An experiment declares its parameters (the `jaxattn run` overrides), simulates
(continuous flow or discrete layers), judges the outcome against
`ja.theory.predict`, and draws its figures from the saved data alone, so that
`jaxattn plot DIR` redraws them without recomputing.
"""

import abc
import dataclasses
import math
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from .._flow import solve_flow
from .._horizon import Horizon
from .._layers import run_layers
from .paper import shift_time


@dataclasses.dataclass(frozen=True)
class Param:
    """One parameter of an experiment, settable as `--name VALUE` (`--name` for flags).

    `minimum` is inclusive for ints and exclusive for floats (`horizon > 0`).
    """

    name: str
    type: type
    default: Any
    help: str
    minimum: float | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


#: Parameters every experiment has (besides `--seed` and `--out` of `jaxattn run`).
COMMON = (
    Param("discrete", bool, False, "run discrete layers (eq. 4) beside the flow (eq. 6)"),
    Param("horizon", float, 10.0, "final time T (depth in units of τ·layers)", 0.0),
    Param("saves", int, 1000, "number of saved time intervals of the flow", 1),
)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The outcome judged against the theorem: `ok`, one line to print, the numbers,
    and `extra` entries for `summary.json` beside them (e.g. per-setting statistics)."""

    ok: bool
    line: str
    numbers: dict[str, Any]
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


class AbstractExperiment(abc.ABC):
    """One simulation of paper 001 §6.1, run by `jaxattn run NAME`.

    As in equinox, a method is either abstract (a subclass provides it) or final
    (no subclass overrides it): what differs between experiments is declared as
    class variables, `params` and `drops`.
    """

    name: ClassVar[str]
    title: ClassVar[str]
    theorem: ClassVar[str]
    params: ClassVar[tuple[Param, ...]]
    #: The parameters of `COMMON` this experiment does not take (`jaxattn run NAME
    #: --discrete` is then refused in one line instead of being silently ignored).
    drops: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        unknown = set(cls.drops) - {p.name for p in COMMON}
        if unknown:
            raise TypeError(f"{cls.__name__}.drops names {sorted(unknown)}, which are not "
                            f"common parameters ({', '.join(p.name for p in COMMON)}).")

    @typing.final
    def all_params(self) -> tuple[Param, ...]:
        """The experiment's parameters, then the common ones it neither overrides
        nor drops."""
        own = {p.name for p in self.params}
        return self.params + tuple(
            p for p in COMMON if p.name not in own and p.name not in self.drops
        )

    @typing.final
    def defaults(self) -> dict[str, Any]:
        """Every parameter's default value, by name."""
        return {p.name: p.default for p in self.all_params()}

    @abc.abstractmethod
    def simulate(self, config: dict[str, Any], progress: bool) -> dict[str, np.ndarray]:
        """Run the experiment; the arrays returned are saved as `data.npz`."""

    @abc.abstractmethod
    def verdict(self, config: dict[str, Any], data: dict[str, np.ndarray]) -> Verdict:
        """Compare the outcome with `ja.theory.predict`."""

    @abc.abstractmethod
    def draw(self, config: dict[str, Any], data: dict[str, np.ndarray], folder: Path) -> list[Path]:
        """Write the figures (PNG and PDF) into `folder`; return their paths."""


# --- integration in pieces, with a progress bar -----------------------------------


def advance(
    step: Callable[[int, Any], tuple[Any, Any]],
    state,
    num_pieces: int,
    *,
    desc: str,
    progress: bool,
):
    """Run `state, out_k = step(k, state)` for `k < num_pieces` under a progress bar.

    **Returns:**

    The final state and the list of outputs.
    """
    outs = []
    with tqdm(total=num_pieces, desc=desc, unit="piece", disable=not progress, leave=False) as bar:
        for k in range(num_pieces):
            state, out = step(k, state)
            jax.block_until_ready(out)
            outs.append(out)
            bar.update()
    return state, outs


def flow_path(
    dyn, x0, horizon: float, saves: int, *, progress: bool, desc: str, reduce=None, **solve_kw
):
    """Solve the flow (eq. 6) on `saves + 1` equally spaced times of `[0, horizon]`.

    Integrated in up to 20 equal pieces (`Horizon.pieces`; restarting the adaptive
    solver at each piece's start, which is also a save time) so that a progress bar
    can follow it.
    `reduce(ys)` maps each piece's `(..., m, n, d)` states to what is kept
    (default: the states).

    **Returns:**

    `ts (saves + 1,)` and the kept outputs concatenated along the time axis.
    """
    pieces = Horizon.pieces(saves)
    m = saves // pieces
    ts = Horizon(horizon).save_times(saves)
    reduce = reduce or (lambda ys: ys)

    def step(k, x):
        ys = solve_flow(dyn, x, jnp.asarray(ts[k * m : (k + 1) * m + 1]), **solve_kw)
        kept = ys if k == 0 else ys[..., 1:, :, :]
        return ys[..., -1, :, :], reduce(kept)

    _, outs = advance(step, x0, pieces, desc=desc, progress=progress)
    return ts, jnp.concatenate(outs, axis=_time_axis(x0))


def layer_path(dyn, x0, horizon: float, tau: float, *, progress: bool, desc: str, reduce=None):
    """Run `Horizon(horizon).num_layers(τ)` discrete layers (eq. 4) in up to 20 pieces.

    **Returns:**

    `ts = kτ (L + 1,)` and the kept outputs (as in `flow_path`).
    """
    num_layers = Horizon(horizon).num_layers(tau)
    pieces = Horizon.pieces(num_layers)
    m = num_layers // pieces
    reduce = reduce or (lambda ys: ys)

    def step(k, x):
        ys = run_layers(shift_time(dyn, k * m * tau), x, m, tau)
        kept = ys if k == 0 else ys[..., 1:, :, :]
        return ys[..., -1, :, :], reduce(kept)

    _, outs = advance(step, x0, pieces, desc=desc, progress=progress)
    return Horizon(horizon).layer_times(tau), jnp.concatenate(outs, axis=_time_axis(x0))


def _time_axis(x0) -> int:
    return jnp.ndim(x0) - 2


# --- verdict helpers ---------------------------------------------------------------


def fmt(x: float) -> str:
    """A number for a verdict line: `3.0e-07`, `0.25`, `inf`; `0` below 1e-15."""
    x = float(x)
    if not math.isfinite(x):
        return str(x)
    if abs(x) < 1e-15:  # rounding level of float64: a computed 0 may come out as ±2e-16
        return "0"
    return f"{x:.1e}" if abs(x) < 1e-2 or abs(x) >= 1e4 else f"{x:.3g}"


def largest_rise(values: np.ndarray) -> float:
    """The largest increase between consecutive samples along the last axis (≤ 0: none)."""
    values = np.asarray(values)
    return float(np.max(np.diff(values, axis=-1))) if values.shape[-1] > 1 else 0.0
