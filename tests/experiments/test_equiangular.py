"""The equiangular reduction (`ja.theory.equiangular_*`): the reduced field against the
library's own velocity, the reduced ODE against the n-particle flow (to 1e-10 in
float64), the predicted clustering rates against the ODE's late slopes, the tokens."""

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxattn as ja
from jaxattn.experiments.equiangular import measure
from jaxattn.theory import (
    equiangular_asymptotics,
    equiangular_field,
    equiangular_rate,
    equiangular_solution,
    equiangular_tokens,
)

NORMS = ("post", "pre", "peri", "ngpt", "none")
N, D, BETA, RHO0 = 3, 4, 1.5, 0.1


def _dyn(norm, kernel, d=D, beta=BETA):
    eye = jnp.eye(d)[None]
    return ja.SelfAttentionDynamics(eye, eye, beta=beta, norm=norm, kernel=kernel)


@pytest.mark.parametrize("kernel", ["softmax", "exp"])
@pytest.mark.parametrize("norm", NORMS)
def test_field_is_the_velocity_of_equiangular_tokens(norm, kernel):
    """`(dρ/dt, dr/dt)` equals what `dyn.velocity` gives at equiangular tokens of norm
    `r`: `ṙ = ⟨u_i, ẋ_i⟩`, `ρ̇ = (⟨ẋ_i, x_k⟩ + ⟨x_i, ẋ_k⟩)/r² − 2ρ ṙ/r`."""
    dyn = _dyn(norm, kernel, d=5)
    for rho, r in [(-0.3, 1.0), (0.2, 1.0), (0.7, 1.6), (0.95, 0.8)]:
        r = 1.0 if dyn.stays_on_manifold else r
        x = r * equiangular_tokens(rho, 4, 5)
        v = dyn.velocity(jnp.zeros(()), x)
        r_dot = float(jnp.dot(x[0], v[0]) / r)
        rho_dot = float((jnp.dot(v[0], x[1]) + jnp.dot(x[0], v[1])) / r**2 - 2 * rho * r_dot / r)
        want_rho, want_r = equiangular_field(rho, 4, BETA, norm=norm, kernel=kernel, radius=r)
        np.testing.assert_allclose(float(want_rho), rho_dot, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(float(want_r), r_dot, rtol=1e-12, atol=1e-14)


def test_post_softmax_rate_is_the_closed_form():
    rho = jnp.linspace(-0.2, 0.99, 9)  # from −1/(n − 1): the simplex
    n, beta = 6, 2.5
    want = 2 * (1 - rho) * (1 + (n - 1) * rho) / (jnp.exp(beta * (1 - rho)) + n - 1)
    np.testing.assert_allclose(equiangular_rate(rho, n, beta), want, rtol=1e-13)


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
@pytest.mark.parametrize("norm, kernel", [(n, "softmax") for n in NORMS]
                         + [("post", "exp")])
def test_flow_follows_the_reduced_ode(norm, kernel):
    """The n-particle flow from an equiangular start stays equiangular and its ρ(t)
    (and norm) follow the reduced ODE to 1e-10 in float64."""
    ts = jnp.linspace(0.0, 3.0, 7)
    dyn = _dyn(norm, kernel)
    ys = ja.solve_flow(dyn, equiangular_tokens(RHO0, N, D), ts, solver=dfx.Dopri8(),
                       rtol=1e-13, atol=1e-20, on_manifold=dyn.stays_on_manifold)
    got = measure(ys)
    ode = equiangular_solution(RHO0, N, BETA, ts, norm=norm, kernel=kernel)
    assert np.max(np.abs(got["rho"] - np.asarray(ode.rho))) <= 1e-10
    assert np.max(got["spread"]) <= 1e-10
    np.testing.assert_allclose(got["radius"], ode.radius, rtol=1e-10)
    assert ode.rho[-1] > ode.rho[0] or norm == "none"


def _late_slope(ts, gap, kind):
    x = ts if kind == "exponential" else np.log(ts)
    return -np.diff(np.log(gap))[-1] / np.diff(x)[-1]


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
@pytest.mark.parametrize("kernel", ["softmax", "exp"])
@pytest.mark.parametrize("norm", ["post", "ngpt", "pre", "peri"])
def test_predicted_rates_are_the_odes_late_slopes(norm, kernel):
    n, beta = 5, 0.7
    law = equiangular_asymptotics(n, beta, norm=norm, kernel=kernel)
    if law.kind == "exponential":
        ts = jnp.linspace(0.0, 30.0 / law.rate, 61)
    else:
        ts = jnp.geomspace(1e-2, 1e4, 61)
    gap = np.asarray(equiangular_solution(0.0, n, beta, ts, norm=norm, kernel=kernel).gap)
    assert _late_slope(np.asarray(ts), gap, law.kind) == pytest.approx(law.rate, rel=2e-3)


def test_float32_defaults_reach_the_float64_solution():
    """In float32 the default tolerances are ten times the rounding (`1e-14` stalls the
    steps there until `max_steps`, the error the docstring warns of): the solution
    follows float64's to 1e-3 over 17 decades of the gap."""
    ts = np.linspace(0.0, 20.0, 6)
    want = np.asarray(equiangular_solution(0.1, 8, 1.0, ts).gap)
    with jax.enable_x64(False):
        gap = np.asarray(equiangular_solution(0.1, 8, 1.0, ts).gap)
        assert gap.dtype == np.float32
        with pytest.raises(Exception, match="maximum number of solver steps"):
            equiangular_solution(0.1, 8, 1.0, ts, rtol=1e-14, atol=1e-14, max_steps=4096)
    np.testing.assert_allclose(gap, want, rtol=1e-3)
    assert want[-1] < 1e-16 and np.abs(gap / want - 1).max() > 1e-6  # float32's own steps


def test_none_softmax_stops_short_of_one_point():
    """Without normalisation the norms grow, the attention tends to the identity and ρ
    freezes below 1 (`equiangular_asymptotics` kind "none")."""
    ts = jnp.asarray([0.0, 10.0, 20.0])
    rho = np.asarray(equiangular_solution(0.2, 4, 1.0, ts, norm="none").rho)
    assert equiangular_asymptotics(4, 1.0, norm="none").kind == "none"
    assert rho[2] < 0.9 and abs(rho[2] - rho[1]) < 1e-12


@pytest.mark.parametrize("norm", ["post", "ngpt", "pre", "peri", "none"])
def test_the_simplex_is_a_fixed_point_rounding_cannot_cross(norm):
    """From `ρ0 = −1/(n − 1)` (rounded) the reduced ODE never goes below the simplex:
    no `ρ` below it exists (`1 + (n − 1)ρ = |Σ u_i|²/n`); `"ngpt"` once ran off to
    ρ = −6. (It is unstable: rounding may move it up, as it would move the tokens.)"""
    ts = jnp.linspace(0.0, 20.0, 11)
    rho = np.asarray(equiangular_solution(-1 / 3, 4, 1.0, ts, norm=norm).rho)
    assert rho.min() >= -1 / 3 - 1e-12, rho


@pytest.mark.parametrize("rho", [-0.25, 0.0, 0.3, 1.0])
def test_tokens_are_equiangular(rho):
    x = equiangular_tokens(rho, 5, 7)
    want = (1 - rho) * np.eye(5) + rho
    np.testing.assert_allclose(x @ x.T, want, atol=1e-15)


@pytest.mark.parametrize("call, message", [
    (lambda: equiangular_tokens(0.2, 4, 3), "`d` must be an integer ≥ n = 4"),
    (lambda: equiangular_tokens(-0.5, 4, 4), "`rho0` must lie in [−1/(n − 1), 1]"),
    (lambda: equiangular_solution(1.0, 4, 1.0, [0.0, 1.0]), "ρ = 1 is one point"),
    (lambda: equiangular_rate(0.5, 4, 1.0, kernel="sigmoid"), "must be 'softmax' or 'exp'"),
    (lambda: equiangular_rate(0.5, 4, 1.0, norm="mid"), "`norm` must be one of"),
    (lambda: equiangular_rate(0.5, 1, 1.0), "`n` is the number of tokens"),
    # a cosine no equiangular tokens have gave a rate (−43.6 at ρ = 5)
    (lambda: equiangular_rate(5.0, 3, 1.0), "`rho` must lie in [−1/(n − 1), 1]"),
    (lambda: equiangular_field(np.array([0.2, -0.6]), 3, 1.0), "got -0.6"),
])
def test_bad_arguments_are_one_clear_error(call, message):
    with pytest.raises(ValueError) as info:
        call()
    assert message in str(info.value)


def _ode_run(config):
    """A run's data with the reduced ODE standing in for the flow (the flow's
    agreement with it is `test_flow_follows_the_reduced_ode`'s): what the verdict
    judges the rates from."""
    from jaxattn.experiments import equiangular as E

    ts = np.linspace(0.0, config["horizon"], config["saves"] + 1)
    shape = (len(E.KERNELS), len(E.NORMS), len(ts))
    data = {k: np.full(shape, np.nan) for k in
            ("rho_flow", "rho_ode", "gap_flow", "gap_ode", "radius_flow", "radius_ode",
             "spread")}
    for i, kernel in enumerate(E.KERNELS):
        for j, norm in enumerate(E.NORMS):
            if E.skipped(norm, kernel):
                continue
            ode = equiangular_solution(config["rho0"], config["tokens"], config["beta"], ts,
                                       norm=norm, kernel=kernel)
            for k in ("rho", "gap", "radius"):
                data[f"{k}_flow"][i, j] = data[f"{k}_ode"][i, j] = np.asarray(getattr(ode, k))
            data["spread"][i, j] = 0.0
    return {"ts": ts} | data


@pytest.mark.slow
def test_verdict_judges_the_rates_and_fails_a_rate_ten_percent_off(monkeypatch):
    """At the default settings every late rate (against `t`, or `log r` for pre and
    peri) is within `RATE_TOL` of the prediction; with every predicted rate 10 % high
    (or low) the verdict fails, though the flow still follows the ODE."""
    from jaxattn.experiments import equiangular as E

    study = E.Equiangular()
    config = study.defaults()
    data = _ode_run(config)
    verdict = study.verdict(config, data)
    assert verdict.ok, verdict.line
    assert verdict.numbers["max_rate_error"] <= E.RATE_TOL < 0.1 / 2
    assert "late regime" not in verdict.line and "no rate read" not in verdict.line
    few = config | {"saves": 4}  # exp post's 1 − ρ ≍ e^(−5.4 t) is under 1e-20 from t = 10
    sparse = study.verdict(few, _ode_run(few))
    assert not sparse.ok and "; exp post: no rate read" in sparse.line, sparse.line
    assert sparse.undecided == "raise --saves"  # no rate to judge: exit 4, not 3
    near_simplex = config | {"rho0": -0.3333}  # n = 4: −1/3 is the simplex, an equilibrium
    early = study.verdict(near_simplex, _ode_run(near_simplex))
    assert not early.ok and "softmax pre, softmax peri, exp pre, exp peri: not yet in the " \
        "late regime by T = 20" in early.line and early.line.endswith("a longer --horizon")
    assert "a longer --horizon" in early.undecided
    # a window still in the transient (the rate over its last quarter is another):
    # exp post read 2.35 against 5.44 and "against" (exit 3); it is undecided
    transient = config | {"rho0": -0.33, "horizon": 5.0}
    moving = study.verdict(transient, _ode_run(transient))
    assert not moving.ok and "a longer --horizon" in moving.undecided, moving.line
    assert "exp post" in moving.line.split("not yet in the late regime")[0].rsplit(";", 1)[-1]
    for factor in (1.1, 0.9):
        def shifted(*args, **kw):
            law = equiangular_asymptotics(*args, **kw)
            return law._replace(rate=law.rate * factor)

        monkeypatch.setattr(E, "equiangular_asymptotics", shifted)
        wrong = study.verdict(config, data)
        assert not wrong.ok and not wrong.undecided and wrong.numbers["max_rho_error"] == 0.0
        assert "late regime" not in wrong.line  # a wrong law, not an early reading
        assert wrong.numbers["max_rate_error"] > 0.08


def test_every_builtin_pairs_ode_is_one_program(monkeypatch):
    """The reduced ODEs of every built-in placement and kernel share one program,
    traced once (issue 42): the solver loop (`stepped`) is traced for the first pair
    only, and each pair's solution is still its own (distinct gaps)."""
    from jaxattn.theory import _equiangular

    traced, stepped = [], _equiangular.stepped
    monkeypatch.setattr(_equiangular, "stepped", lambda *a: traced.append(1) or stepped(*a))
    ts = jnp.linspace(0.0, 0.7, 6)  # a shape of its own: no program cached yet
    gaps = [np.asarray(equiangular_solution(RHO0, 5, 0.7, ts, norm=norm, kernel=kernel).gap)
            for norm, kernel in _equiangular.PAIRS
            if equiangular_asymptotics(5, 0.7, norm=norm, kernel=kernel).kind != "blow-up"]
    assert len(traced) == 1 and len(gaps) == len(_equiangular.PAIRS) - 1
    assert len({g.tobytes() for g in gaps}) > len(NORMS)  # not one pair's, repeated
