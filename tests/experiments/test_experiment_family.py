"""The experiments keep the family's rule (`experiments/base.py`): final methods are
never overridden, sweepability is a base (`AbstractSweepableExperiment`, whose
`instance` is abstract) and not a probe, and no member removes a parameter its base
declares."""

import inspect

import pytest

from jaxattn.experiments import EXPERIMENTS, SWEEPABLE
from jaxattn.experiments.base import (
    AbstractExperiment,
    AbstractSweepableExperiment,
    Param,
    Verdict,
)
from jaxattn.experiments.theorem import THEOREM_PARAMS, AbstractTheoremExperiment


def _finals(cls) -> set[str]:
    return {name for klass in cls.__mro__ for name, value in vars(klass).items()
            if getattr(value, "__final__", False)}


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_no_member_overrides_a_final_method(name):
    cls = type(EXPERIMENTS[name])
    for klass in cls.__mro__:
        if klass is object:
            continue
        finals_above = {n for base in klass.__mro__[1:] for n, v in vars(base).items()
                        if getattr(v, "__final__", False)}
        assert not finals_above & set(vars(klass)), (klass.__name__, finals_above & set(
            vars(klass)))
    assert {"all_params", "defaults", "stem"} <= _finals(cls)


def test_sweepable_is_the_sweepable_base():
    sweepable = {name for name in EXPERIMENTS
                 if isinstance(EXPERIMENTS[name], AbstractSweepableExperiment)}
    assert sweepable == set(SWEEPABLE) and sweepable
    assert "instance" in AbstractSweepableExperiment.__abstractmethods__


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_parameters_are_the_members_and_their_bases(name):
    """Every parameter is the member's own or its base's; none twice; the theorem
    members take all of `THEOREM_PARAMS`."""
    experiment = EXPERIMENTS[name]
    names = [p.name for p in experiment.all_params()]
    assert len(names) == len(set(names))
    assert set(names) == {p.name for p in experiment.params} | {
        p.name for p in experiment.base_params}
    if isinstance(experiment, AbstractTheoremExperiment):
        assert {p.name for p in THEOREM_PARAMS} <= set(names)
    else:
        assert experiment.base_params == ()


def test_the_rule_is_enforced_when_a_class_is_written():
    class Plain(AbstractExperiment):
        name, title, theorem = "plain", "plain", "none"
        params = (Param("steps", int, 3, "steps", 1),)

        def simulate(self, config, progress):
            return {}

        def verdict(self, config, data):
            return Verdict(True, "", {})

        def draw(self, config, data, folder):
            return []

    assert [p.name for p in Plain().all_params()] == ["steps"]
    with pytest.raises(TypeError, match="no AbstractSweepableExperiment"):
        type("Swept", (Plain,), {"sweepable": True})
    with pytest.raises(TypeError, match="state `sweepable = True`"):
        type("Unsaid", (AbstractSweepableExperiment, Plain), {})
    with pytest.raises(TypeError, match="drops parameters"):
        type("Dropping", (Plain,), {"drops": ("steps",)})
    missing = type("Missing", (AbstractSweepableExperiment, Plain), {"sweepable": True})
    assert inspect.isabstract(missing)
    with pytest.raises(TypeError, match="instance"):
        missing()
