"""The abstract experiment of `jaxattn run NAME`: its parameters, its verdict and
the methods every member provides. An experiment simulates, judges the outcome
(against a theorem, a paper's figure or a peer's study) and draws its figures from the
saved data alone (`jaxattn plot DIR` redraws them).

The family keeps equinox's abstract/final rule, and a member declares its parameters
once, never dropping its base's: ARCHITECTURE.md ("An experiment").
"""

import abc
import dataclasses
import math
import sys
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np


@dataclasses.dataclass(frozen=True)
class Param:
    """One parameter of an experiment, settable as `--name VALUE` (`--name` for flags).

    `minimum` is inclusive for ints and exclusive for floats (`horizon > 0`). An int
    parameter with `names` is a choice: `--norm none` or its code `--norm 5` (the
    position in `names`; the config records the code).
    """

    name: str
    type: type
    default: Any
    help: str
    minimum: float | None = None
    names: tuple[str, ...] = ()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def convert(param: Param, value: Any) -> Any:
    """`value` as the parameter's type (a choice: its code), checked against its
    minimum, or a one-line `ValueError` (no JAX: `jaxattn run NAME` refuses a bad
    override before JAX loads)."""
    if param.names:
        converted = _choice(param.names, value)
        want = "one of " + ", ".join(f"{n} ({i})" for i, n in enumerate(param.names))
    else:
        converted = _typed(param.type, value)
        want = {int: "an integer", float: "a number", bool: "true or false"}[param.type]
    real = param.type is float and converted is not None
    low = param.minimum is not None and converted is not None and (
        converted < param.minimum if param.type is int else converted <= param.minimum)
    bound = "≥" if param.type is int else ">"
    for bad, message in (
        (converted is None, f"must be {want}, got {value!r}"),
        (real and not math.isfinite(converted), f"must be finite, got {value!r}"),
        (real and 0 < abs(converted) < sys.float_info.min,
         f"{value!r} is subnormal, below 2.2e-308, and XLA computes with it as 0: choose a "
         "larger value"),
        (low, f"must be {bound} {param.minimum or 0:g}, got {value!r}"),
    ):
        if bad:
            raise ValueError(f"{param.flag} {message}.")
    return converted


def _typed(kind: type, value: Any) -> Any:
    """`value` as `kind` (an int only from a whole number, a bool only from a bool), or
    `None`."""
    if isinstance(value, bool) != (kind is bool):
        return None
    try:
        converted = kind(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return None if kind is int and isinstance(value, float) and value != converted else converted


def _choice(names: tuple[str, ...], value: Any) -> int | None:
    """The code of a choice given by name or by code, or `None`."""
    if isinstance(value, str) and value.strip() in names:
        return names.index(value.strip())
    try:
        code = None if isinstance(value, (bool, float)) else int(value)
    except (TypeError, ValueError):
        return None
    return code if code is not None and 0 <= code < len(names) else None


def choices(code: int, names: tuple) -> tuple:
    """The values a choice's `code` selects: all of `names` for 0, else the `code`-th
    (1-based; `check_config` refuses others)."""
    return tuple(names) if code == 0 else (names[code - 1],)


#: The inverse temperature of the attention, a parameter of every sweepable experiment
#: (`jaxattn run NAME --beta 2` runs what `jaxattn sweep NAME --grid beta=…,2` does).
BETA = Param("beta", float, 1.0, "inverse temperature β of the attention", 0.0)

@dataclasses.dataclass(frozen=True)
class Verdict:
    """The outcome judged against the theorem: `ok`, one line to print, the numbers,
    and `extra` entries for `summary.json` beside them (e.g. per-setting statistics).

    `undecided`, when not empty, says why the run can neither agree nor contradict
    (its errors are larger than the tolerance they would be judged by) and what
    would decide it ("raise --seeds"); `ok` is then `False`. `jaxattn run` exits 4
    there, 3 on a contradiction."""

    ok: bool
    line: str
    numbers: dict[str, Any]
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    undecided: str = ""


class Config(Mapping):
    """The settings of one run of an experiment: a frozen dataclass built from the
    experiment's `Param`s (`AbstractExperiment.config_type`), read by attribute
    (`config.tau`). It is also a read-only mapping of its fields, for code that reads
    settings by name (`FOOTPRINT`, the sweep's tables, `config.json`), and
    `config | {"tau": 0.1}` is a new config with those settings changed.

    Its post-init is the experiment's `check_config`, run when the settings are
    concrete: inside a sweep's program the floats are traced scalars, whose point was
    checked before the program.
    """

    _experiment: ClassVar["AbstractExperiment"]

    def __post_init__(self):
        if all(_concrete(v) for v in self.values()):
            self._experiment.check_config(self)

    def __getitem__(self, name: str) -> Any:
        return getattr(self, self.__dataclass_fields__[name].name)  # KeyError: no such field

    def __iter__(self):
        return iter(self.__dataclass_fields__)

    def __len__(self) -> int:
        return len(self.__dataclass_fields__)

    def __or__(self, changes: Mapping[str, Any]) -> "Config":
        unknown = set(changes) - set(self)
        if unknown:
            raise TypeError(f"{self.experiment} has no setting {', '.join(sorted(unknown))}.")
        return self._experiment.config(self, **changes)


def _concrete(value: Any) -> bool:
    """Whether a setting is a Python value (not an array traced in a sweep's program)."""
    return value is None or isinstance(value, (bool, int, float, str, list, tuple, dict))


class AbstractExperiment(abc.ABC):
    """One experiment, run by `jaxattn run NAME`.

    As in equinox, a method is either abstract (a subclass provides it) or final
    (no subclass overrides it): what differs between experiments is declared as
    class variables. `name`, `title` and `theorem` are string literals in the
    member's own class body: `jaxattn list` reads them from the source without
    importing the member (nor JAX), and a test checks the two agree.
    """

    name: ClassVar[str]
    title: ClassVar[str]
    #: What the experiment checks: a theorem number ("4.1"), a paper's section or a
    #: peer's study.
    theorem: ClassVar[str]
    #: The member's own parameters (the `jaxattn run NAME` overrides).
    params: ClassVar[tuple[Param, ...]]
    #: Parameters an intermediate base declares for all its members, listed after
    #: theirs (a member that declares one again gives it its own default and help).
    base_params: ClassVar[tuple[Param, ...]] = ()
    #: Settings a run records beside its parameters that no flag sets, as `(name,
    #: default)`: fields of its `Config` (`loop-grid`'s `model`, given by `jaxattn
    #: loop --grid`).
    recorded: ClassVar[tuple[tuple[str, Any], ...]] = ()
    #: Whether `jaxattn sweep NAME` can run it: a literal at the head of the
    #: member's class body (the registry reads it without importing the member),
    #: true exactly for the members of `AbstractSweepableExperiment`.
    sweepable: ClassVar[bool] = False
    #: Whether `jaxattn run NAME --distributed` can run it: its batches are programs
    #: over every process's devices (`_distributed.global_mesh`), process 0 writes.
    distributable: ClassVar[bool] = False
    #: Flags that set several parameters at once: flag → `{parameter: value}` (`jaxattn
    #: run noisy-transition --full`); a parameter given beside its flag is refused.
    presets: ClassVar[dict[str, dict[str, Any]]] = {}
    #: Whether the verdict judges a claim (a theorem, a paper's claim, a peer's study):
    #: false for a study that describes what it measured, whose `summary.json` then
    #: records `"agrees_with_theory": null` and whose run exits 0.
    judges: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        said = bool(cls.__dict__.get("sweepable"))
        sweepable = (cls.__name__ == "AbstractSweepableExperiment"  # being made: not bound yet
                     or issubclass(cls, AbstractSweepableExperiment))
        for wrong, why in (
            (said and not sweepable, "says sweepable = True but is no "
             "AbstractSweepableExperiment (which declares instance(key, config))"),
            (sweepable and not said and not cls.__name__.startswith("Abstract"),
             "is an AbstractSweepableExperiment: state `sweepable = True` at the head of its "
             "class body"),
            ("drops" in cls.__dict__, "drops parameters of its base: declare them on the base "
             "of the members that take them (base_params)"),
        ):
            if wrong:
                raise TypeError(f"{cls.__name__} {why}.")

    @typing.final
    def __repr__(self) -> str:
        """Its class: an experiment holds no state (a program kept in the cache folder
        is named by it, `_programs.kept_jit`)."""
        return f"{type(self).__module__}.{type(self).__qualname__}()"

    @typing.final
    def all_params(self) -> tuple[Param, ...]:
        """The experiment's parameters, then its base's that it does not declare
        again."""
        own = {p.name for p in self.params}
        return self.params + tuple(p for p in self.base_params if p.name not in own)

    @typing.final
    def config_type(self) -> type["Config"]:
        """The experiment's settings as a type: a frozen dataclass whose fields are
        `experiment`, `seed` and each parameter (`all_params`), with the parameters'
        defaults, and `check_config` as its post-init. Built once per class."""
        cls = type(self)
        if "_config_type" not in cls.__dict__:
            fields = [("experiment", str, dataclasses.field(default=self.name)),
                      ("seed", int, dataclasses.field(default=0))]
            fields += [(p.name, p.type if not p.names else int,
                        dataclasses.field(default=p.default)) for p in self.all_params()]
            fields += [(name, Any, dataclasses.field(default=default))
                       for name, default in self.recorded]
            cls._config_type = dataclasses.make_dataclass(
                f"{cls.__name__}Config", fields, bases=(Config,), frozen=True,
                namespace={"_experiment": self, "__module__": cls.__module__})
        return cls._config_type

    @typing.final
    def config(self, values: Mapping[str, Any] = {}, /, **changes) -> "Config":
        """The experiment's settings: the defaults, then `values` and `changes` (names
        the experiment lacks, such as a run record's `command`, are left out), each
        parameter's value by `convert`, then the whole by `check_config`. (Traced
        values, inside a sweep's program, are taken as they are: their point was
        checked before.)"""
        kind, params = self.config_type(), {p.name: p for p in self.all_params()}
        names = {f.name for f in dataclasses.fields(kind)}
        given = {k: v for k, v in {**values, **changes}.items() if k in names}
        return kind(**{k: convert(params[k], v) if k in params and _concrete(v) else v
                       for k, v in given.items()})

    @typing.final
    def defaults(self) -> "Config":
        """Every parameter's default value (and seed 0), as the experiment's `Config`."""
        return self.config()

    @typing.final
    def stem(self, folder) -> Path:
        """Where its figure goes: `folder/<name, with underscores>` (`.png`, `.pdf`)."""
        return Path(folder) / self.name.replace("-", "_")

    def refusals(self, config: "Config") -> Iterable[tuple[bool, str]]:
        """The settings the experiment cannot run or judge that no `Param` minimum
        catches, as `(refused, one-line message)` pairs in the order they are checked
        (a generator may compute a later pair assuming the earlier ones passed). A hook:
        none by default."""
        return ()

    @typing.final
    def check_config(self, config: "Config") -> None:
        """Refuse, with the one-line `ValueError` of the first of `refusals` that
        applies: the config's post-init, so `runner.experiment_config` refuses before
        any folder is made or any work is done."""
        for refused, message in self.refusals(config):
            if refused:
                raise ValueError(message)

    @abc.abstractmethod
    def simulate(self, config: "Config", progress: bool) -> dict[str, np.ndarray]:
        """Run the experiment; the arrays returned are saved as `data.npz`."""

    @abc.abstractmethod
    def verdict(self, config: "Config", data: dict[str, np.ndarray]) -> Verdict:
        """Judge the outcome (against `ja.theory.predict`, a paper or a peer)."""

    @abc.abstractmethod
    def draw(self, config: "Config", data: dict[str, np.ndarray], folder: Path) -> list[Path]:
        """Write the figures (PNG and PDF) into `folder`; return their paths."""


class AbstractSweepableExperiment(AbstractExperiment):
    """An experiment `jaxattn sweep NAME` can run: one random instance per key, as the
    simulators run it. A concrete member states `sweepable = True` at the head of its
    class body (what the registry reads)."""

    #: What a sweep over a parameter changes beside the parameter itself, by the
    #: parameter's name: printed under `jaxattn sweep`'s table and kept in its
    #: `summary.json` (`notes`) whenever the grid varies that parameter.
    grid_notes: ClassVar[dict[str, str]] = {}

    @abc.abstractmethod
    def instance(self, key, config: "Config") -> tuple[Any, Any, Any]:
        """One sweep instance as the simulators run it: `(dyn, y0, misalign)`, the
        model, its start and `misalign(ys)`, the misalignment of its states
        (`jaxattn run NAME --seed S` draws the same instance from `PRNGKey(S)`)."""


class Section(Mapping):
    """The arrays of one part of a run's `data.npz`, by their plain names: a run
    (`suffix="_layers"`: `section["E"]` is `data["E_layers"]`) or a setting
    (`prefix="h2_"`). A name the part lacks falls back to the shared array (the
    start, the domain test), so a verdict or a panel reads one part alike."""

    def __init__(self, data: Mapping[str, Any], *, prefix: str = "", suffix: str = ""):
        self._data, self._prefix, self._suffix = data, prefix, suffix

    def __getitem__(self, name: str):
        own = f"{self._prefix}{name}{self._suffix}"
        return self._data[own] if own in self._data else self._data[self._prefix + name]

    def __iter__(self):
        start, end = self._prefix, self._suffix
        return (k[len(start):len(k) - len(end)] for k in self._data
                if k.startswith(start) and k.endswith(end))

    def __len__(self) -> int:
        return sum(1 for _ in self)
