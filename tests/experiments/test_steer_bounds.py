"""`steer`'s bound on `--gamma`: the edit `γ u wᵀV⁺` meets `V x` in float32, so the
refusal bounds `γ‖V⁺‖‖V‖|x|`, not `γ` alone, by float32's largest number."""

import numpy as np
import pytest

from jaxattn.experiments import EXPERIMENTS
from jaxattn.experiments import steer as S

SMALL = {"prompts": 8, "tokens": 6, "hidden": 64, "heads": 4}


def test_a_gamma_that_overflows_the_edited_layer_is_refused_in_one_line():
    """`--gamma 1e37` at d = 64 passed the old check (float32's max, 3.4e38) and
    overflowed after ~80 s of work. `‖V⁺‖‖V‖ ≤ 1/(d ε)` (steer's rank cutoff) and
    `|x| ≤ d` bound the product by `γ/ε`: refused past `f32max · ε`, before any work."""
    assert S.GAMMA_MAX == pytest.approx(np.finfo(np.float32).max * np.finfo(np.float64).eps)
    assert 1e22 < S.GAMMA_MAX < 1e23
    for gamma in (1e37, 1e23):
        with pytest.raises(ValueError, match=r"choose --gamma ≤ 7\.6e\+22\.$") as info:
            EXPERIMENTS["steer"].config(gamma=gamma, **SMALL)
        assert "\n" not in str(info.value)
    assert EXPERIMENTS["steer"].config(gamma=1e22, **SMALL).gamma == 1e22
