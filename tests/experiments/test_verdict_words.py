"""Verdict lines say what the numbers mean: a fall is not a "rise", an unread
measure is "n/a"."""

import numpy as np

from jaxattn.experiments.verdicts import largest_rise, rise_words, short


def test_a_fall_is_no_rise():
    falling = np.array([3.0, 2.0, 1.998, 0.5])
    assert largest_rise(falling) < 0
    assert rise_words(largest_rise(falling), "V(t)") == "V(t) never rises"
    assert rise_words(largest_rise(falling[::-1]), "V(t)") == "V(t) largest rise 1.5"
    assert short(None) == "n/a"


def test_thm41_verdict_of_a_falling_lyapunov_function():
    from jaxattn.experiments import get_experiment
    from jaxattn.experiments.theorem import Evidence

    exp = get_experiment("thm41-sphere")
    run = {"E": np.array([0.5, 1e-6]), "V": np.array([2.0, 0.2]), "margin": 0.3,
           "in_domain": True}
    evidence = exp.evidence({}, run)
    assert isinstance(evidence, Evidence)

    class Judged:  # the parts of a judgement describe reads
        kind = "agrees"

        class trend:
            describe = staticmethod(lambda what: f"{what} fell to 1e-06")

    line = exp.describe({}, run, evidence, Judged)
    assert "V(t) never rises" in line and "largest rise -" not in line, line
