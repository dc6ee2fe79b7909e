"""Each experiment's settings as a typed, frozen `Config` built from its `Param`s."""

import dataclasses
import json

import pytest

from jaxattn.experiments import EXPERIMENTS, experiment_config, get_experiment


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_every_experiment_has_a_frozen_config_of_its_params(name):
    experiment = get_experiment(name)
    config = experiment.defaults()
    fields = [f.name for f in dataclasses.fields(config)]
    assert fields[:2] == ["experiment", "seed"]
    assert fields[2:2 + len(experiment.all_params())] == [p.name for p in experiment.all_params()]
    assert config.experiment == name and config.seed == 0
    for p in experiment.all_params():
        assert getattr(config, p.name) == config[p.name] == p.default
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.seed = 1
    # what config.json records reads back as the same config
    assert experiment.config(json.loads(json.dumps(dict(config)))) == config


def test_a_config_converts_checks_and_copies():
    experiment = get_experiment("thm41-sphere")
    config = experiment.config(tokens=6, horizon="2")
    assert config.tokens == 6 and config.horizon == 2.0 and isinstance(config.horizon, float)
    assert (config | {"tau": 0.5}).tau == 0.5 and config.tau == experiment.defaults().tau
    with pytest.raises(ValueError, match="--tau must be > 0"):
        experiment.config(tau=-1)
    with pytest.raises(ValueError, match="--tau must be > 0"):
        config | {"tau": 0.0}
    with pytest.raises(TypeError, match="no setting bogus"):
        config | {"bogus": 1}
    # names a run record holds beside the settings are left out
    assert experiment.config({**config, "command": "jaxattn run", "dtype": "float64"}) == config


def test_check_config_is_the_post_init():
    """An experiment's own refusal (noisy-transition's grids exist for d = 2, 3 only)
    runs whenever a config is made, not only through `jaxattn run`."""
    experiment = get_experiment("noisy-transition")
    with pytest.raises(ValueError, match="--max-dim must be 2 or 3"):
        experiment.config(max_dim=4)
    with pytest.raises(ValueError, match="--max-dim must be 2 or 3"):
        experiment_config(experiment, {"max_dim": 4}, seed=0)
    with pytest.raises(ValueError, match="choose at most one of --gpt-neo"):
        get_experiment("loop-grid").config(minilm=True, smollm2=True)
