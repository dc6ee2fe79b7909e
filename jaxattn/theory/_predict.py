"""What paper 001's theorems predict for given initial tokens: the traceable tests of
each theorem (`theorem_test`) and the host-side `predict` over them.

A theorem's prediction has two parts: its *domain* (the starts it speaks about) and
its *outcome* (what the tokens reach). `theorem_test(theorem, dyn)` returns both as
an `AbstractTheoremTest`, written for one sequence `(n, d)` in JAX, so that it
composes with `jit` and `vmap` (a sweep runs it inside its compiled chunk), and
`predict` / `Prediction.check` apply the very same methods to any batch of tokens.
"""

import abc
import dataclasses
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float

from .._batch import check_token_shape, prepare_tokens
from .._dynamics import SelfAttentionDynamics
from .._horizon import CONSENSUS_TOL
from .._manifold import w_inner, w_norm
from .._precision import einsum
from .._programs import kept_jit
from .._stacked import map_batch
from .._validate import check_scalar, check_tokens_now, is_concrete, refuse_first
from ..metrics import hemisphere, misalignment
from ..spectral import top_eigenvector
from ._classify import Classification, classify, top_eigen

# --- the traceable tests, one sequence at a time ---------------------------------


def within_tol(x: Float[Array, "n d"], target: Float[Array, "n d"], W, tol) -> Bool[Array, ""]:
    """Whether every token is within `tol` of its target: `max_i 1 − ⟨x_i, ℓ_i⟩_W < tol`."""
    return jnp.max(1 - w_inner(x, target, W)) < tol


def hemisphere_side(v1: Float[Array, " d"], x0: Float[Array, "n d"]):
    """The side `±1` of `v₁` the first token starts on, and the margin on that side,
    `min_i ±⟨x_i, v₁⟩` (`> 0`: every token starts in that open hemisphere); the
    projections are true float32, like every measure."""
    proj = einsum("id,d->i", x0, v1, precision="float32")
    side = jnp.where(proj[0] >= 0, 1.0, -1.0).astype(proj.dtype)
    return side, jnp.min(side * proj)


def _side_domain(v1, x0) -> tuple[Bool[Array, ""], Float[Array, ""]]:
    _, margin = hemisphere_side(v1, x0)
    return margin > 0, margin


def _everywhere(x0) -> tuple[Bool[Array, ""], Float[Array, ""]]:
    return jnp.asarray(True), jnp.asarray(jnp.inf, x0.dtype)


class AbstractTheoremTest(eqx.Module):
    """The domain and outcome tests of one theorem, for one sequence of tokens `(n, d)`.

    Every method is traceable (`jit`, `vmap`); batch with `jax.vmap`. `host_domain`
    is `True` where `domain` solves a program on the host (`jax.pure_callback`): it
    composes with `jit` and `vmap`, but inside a sharded program the callback would
    gather the batch on one device.
    """

    theorem: eqx.AbstractClassVar[str]
    outcome: eqx.AbstractClassVar[str]
    host_domain: ClassVar[bool] = False

    @abc.abstractmethod
    def domain(self, x0: Float[Array, "n d"]) -> tuple[Bool[Array, ""], Float[Array, ""]]:
        """`(inside, margin)`: whether `x0` lies in the theorem's domain of attraction,
        and how deep (`≤ 0` or below the theorem's threshold outside)."""

    @abc.abstractmethod
    def limit(self, x0: Float[Array, "n d"]) -> Float[Array, "n d"] | None:
        """The predicted limit `(n, d)` of the tokens started at `x0` where the theorem
        names one (5.1, 5.2), else `None`."""

    @abc.abstractmethod
    def reached(self, x0, x, t, tol=CONSENSUS_TOL) -> Bool[Array, ""]:
        """Whether the tokens `x` at time `t` of the run started at `x0` show the
        predicted outcome, to tolerance `tol`."""

    def check(self, x0, x, t, tol=CONSENSUS_TOL) -> Bool[Array, ""]:
        """`reached`, and, where the theorem names a limit, `x0` in its domain (outside
        it there is no limit to reach): `Prediction.check` of one sequence."""
        ok = self.reached(x0, x, t, tol)
        return ok & self.domain(x0)[0] if self.limit(x0) is not None else ok


class Theorem32Test(AbstractTheoremTest):
    """Theorem 3.2: every start reaches an equilibrium: the velocity is small against
    the field that makes it, `max |ẋ(t)| ≤ max(tol, 16 d eps)·max |v(t, x)|`, with
    `v = Σ_η Σ_j α^η_ij U_η x_j` the raw update whose tangent part `ẋ` is (so the
    verdict does not change under `U → cU`, and `eps` of the tokens' dtype keeps
    it above rounding)."""

    theorem: ClassVar[str] = "3.2"
    outcome: ClassVar[str] = "equilibrium"
    dyn: SelfAttentionDynamics

    def domain(self, x0):
        return _everywhere(x0)

    def limit(self, x0):
        return None

    def reached(self, x0, x, t, tol=CONSENSUS_TOL):
        floor = 16 * x.shape[-1] * jnp.finfo(x.dtype).eps
        return self.relative_speed(t, x) <= jnp.maximum(tol, floor)

    def relative_speed(self, t, x):
        """`max |ẋ| / max |v|`: what `reached` compares with its tolerance, the quantity
        whose trend a run is judged on."""
        scale = jnp.max(jnp.abs(self.dyn.raw_update(t, x)))
        return jnp.max(jnp.abs(self.dyn.velocity(t, x))) / scale


class Theorem41Test(AbstractTheoremTest):
    """Theorem 4.1: a start in an open hemisphere `{y : ⟨z, y⟩_W > 0}`
    (`ja.metrics.hemisphere`, a convex program on the host) reaches consensus
    (misalignment `E < tol`, eq. 25)."""

    theorem: ClassVar[str] = "4.1"
    outcome: ClassVar[str] = "consensus"
    host_domain: ClassVar[bool] = True
    W: Float[Array, "d d"] | None

    def domain(self, x0):
        h = hemisphere(x0, self.W)
        return h.inside, h.margin

    def limit(self, x0):
        return None

    def reached(self, x0, x, t, tol=CONSENSUS_TOL):
        return misalignment(x) < tol


class Theorem51Test(AbstractTheoremTest):
    """Theorem 5.1: every token converges to `x₁(0)` from almost every start. The
    part of the null set known exactly is `x₂(0) = −x₁(0)` (an equilibrium of
    token 2): the margin is `|x₂ + x₁|_W`, inside when above `tol`."""

    theorem: ClassVar[str] = "5.1"
    outcome: ClassVar[str] = "consensus at x₁(0)"
    W: Float[Array, "d d"] | None
    tol: float = eqx.field(static=True, default=1e-8)

    def domain(self, x0):
        if x0.shape[0] < 2:
            return _everywhere(x0)
        margin = w_norm(x0[1] + x0[0], self.W)
        return margin > self.tol, margin

    def limit(self, x0):
        return jnp.broadcast_to(x0[:1], x0.shape)

    def reached(self, x0, x, t, tol=CONSENSUS_TOL):
        return within_tol(x, self.limit(x0), self.W, tol)


class Theorem52Test(AbstractTheoremTest):
    """Theorem 5.2: tokens starting in the hemisphere `±⟨v₁, x⟩ > 0` converge to
    `±v₁`, the top eigenvector of the symmetric `U`."""

    theorem: ClassVar[str] = "5.2"
    outcome: ClassVar[str] = "consensus at v₁"
    v1: Float[Array, " d"]
    W: Float[Array, "d d"] | None

    def domain(self, x0):
        return _side_domain(self.v1, x0)

    def limit(self, x0):
        side, _ = hemisphere_side(self.v1, x0)
        return jnp.broadcast_to(side * self.v1, x0.shape)

    def reached(self, x0, x, t, tol=CONSENSUS_TOL):
        return within_tol(x, self.limit(x0), self.W, tol)


class Theorem53Test(AbstractTheoremTest):
    """Theorem 5.3: tokens starting in the hemisphere `±⟨v₁(0), x⟩ > 0` end in a
    ball around `±v₁(t)`. `v1_t` is `v₁` at the time of the check, followed
    continuously from `v1 = v₁(0)` (`Prediction.reference` does it on the host);
    the ball's size is `tol`."""

    theorem: ClassVar[str] = "5.3"
    outcome: ClassVar[str] = "near v₁(t)"
    v1: Float[Array, " d"]
    v1_t: Float[Array, " d"]
    W: Float[Array, "d d"] | None

    def domain(self, x0):
        return _side_domain(self.v1, x0)

    def limit(self, x0):
        return None

    def reached(self, x0, x, t, tol=CONSENSUS_TOL):
        side, _ = hemisphere_side(self.v1, x0)
        return within_tol(x, jnp.broadcast_to(side * self.v1_t, x.shape), self.W, tol)


def theorem_test(
    theorem: str, dyn: SelfAttentionDynamics, *, v1=None, tol: float = 1e-8
) -> AbstractTheoremTest:
    """The traceable domain and outcome tests of `theorem` for the model `dyn`.

    Works on a traced model too (inside `jit`/`vmap`); it does not check that the
    theorem applies to `dyn` (that is `classify`).

    **Arguments:**

    - `theorem`: `"3.2"`, `"4.1"`, `"5.1"`, `"5.2"` or `"5.3"`.
    - `dyn`: the model (its metric `W`, its velocity for 3.2, its `U(0)` for 5.2/5.3).
    - `v1`: for 5.2 and 5.3, the top eigenvector of `U(0)` (default: computed from
      `dyn`; either sign).
    - `tol`: Theorem 5.1's threshold on `|x₂ + x₁|_W` (`classify`'s tolerance).

    **Returns:**

    An `AbstractTheoremTest`: `.domain(x0)`, `.limit(x0)`, `.reached(x0, x, t, tol)`.
    """
    if v1 is None and theorem in ("5.2", "5.3"):
        v1 = top_eigenvector(dyn.U(0.0)[0])
    elif v1 is not None and is_concrete(v1):  # a traced v1 is the caller's to check
        norm = np.linalg.norm(np.asarray(v1)) if np.shape(v1) == (dyn.dim,) else 0.0
        refuse_first([(not abs(norm - 1) < 1e-6, f"`v1` must be a unit vector of shape "
                       f"({dyn.dim},) (U's top eigenvector), got shape {np.shape(v1)}"
                       + (f" and norm {norm:.3g}." if np.shape(v1) == (dyn.dim,) else "."))])
    tests = {"3.2": lambda: Theorem32Test(dyn), "4.1": lambda: Theorem41Test(dyn.W),
             "5.1": lambda: Theorem51Test(dyn.W, tol), "5.2": lambda: Theorem52Test(v1, dyn.W),
             "5.3": lambda: Theorem53Test(v1, v1, dyn.W)}
    if theorem not in tests:
        raise ValueError(f"no Theorem {theorem!r}; the theorems are {', '.join(tests)}.")
    return tests[theorem]()


# --- predictions on the host, for any batch ------------------------------------------

_PRIORITY = ("5.2", "5.1", "4.1", "5.3", "3.2")


@dataclasses.dataclass(frozen=True)
class Prediction:
    """What a theorem predicts for given initial tokens (`predict` returns it).

    `outcome` is what the theorem promises for the starts inside its domain of
    attraction; `in_domain` says which starts those are. `outcome="consensus"`
    with `in_domain=False` is no contradiction: the theorem says nothing about that
    start (it may still reach consensus, or not). `str(prediction)` says it in a line.

    - `theorem`: the theorem used (`"5.2"`, …) or `None` when none applies.
    - `outcome`: `"consensus"`, `"consensus at x₁(0)"`, `"consensus at v₁"`,
      `"near v₁(t)"`, `"equilibrium"` or `"none"`: the promise inside the domain.
    - `in_domain`: `(*batch)` bool, whether the start lies in the theorem's
      domain of attraction (where it does not, the theorem says nothing).
    - `margin`: `(*batch)` how deep inside the domain (the hemisphere margin, the
      smallest `⟨x_i, v₁⟩`, or `|x₂ + x₁|` for Theorem 5.1); `≤ 0` outside.
    - `limit`: `(*batch, n, d)` the predicted limit where the theorem names one,
      else `None`.
    - `statement`: the theorem's conclusion in words.
    - `others`: the predictions of the other theorems that apply.
    - `test`: the theorem's traceable tests (`theorem_test`), `None` when none applies.
    """

    theorem: str | None
    outcome: str
    in_domain: np.ndarray
    margin: np.ndarray
    limit: np.ndarray | None
    statement: str
    dyn: SelfAttentionDynamics = dataclasses.field(repr=False)
    classification: Classification = dataclasses.field(repr=False)
    others: tuple["Prediction", ...] = ()
    test: AbstractTheoremTest | None = dataclasses.field(default=None, repr=False)
    _x0: np.ndarray | None = dataclasses.field(default=None, repr=False)

    def __str__(self) -> str:
        """One line: what the theorem promises, and for how many of the starts."""
        if self.theorem is None:
            return "No theorem of paper 001 applies to this model: no prediction."
        inside, total = int(np.sum(self.in_domain)), int(np.size(self.in_domain))
        line = (f"Theorem {self.theorem}: {self.outcome}, for the starts in its domain of "
                f"attraction ({inside} of {total})")
        if inside < total:
            line += ("; about the others it says nothing (they may reach it or not: "
                     "run them to see)")
        return line + "."

    def _followed_v1(self, t: float) -> np.ndarray:
        """`v₁(t)`, the top eigenvector of `U(t)`, followed continuously from `v₁(0)`."""
        base = self.classification["5.3"].data["v1"]
        grid = jnp.linspace(0.0, float(t), max(2, int(abs(t) * 50) + 2))
        U = np.asarray(jax.vmap(self.dyn.U)(grid), np.float64)[:, 0]
        v = base
        for Uk in U:  # follow the eigenvector continuously (eigh's sign is arbitrary)
            vk = top_eigen(Uk)[1][:, 0]
            v = vk if vk @ v >= 0 else -vk
        return v

    def reference(self, t: float) -> np.ndarray:
        """For Theorem 5.3: the top eigenvector `v₁(t)` of `U(t)`, followed
        continuously from `v₁(0)` (with each sample's sign), `(*batch, d)`."""
        if self.theorem != "5.3":
            raise ValueError(f"reference(t) is for Theorem 5.3, this prediction is {self.theorem}.")
        side, _ = map_batch(lambda x0: hemisphere_side(self.test.v1, x0), jnp.asarray(self._x0))
        return np.asarray(side)[..., None] * self._followed_v1(t)

    def check(self, x, t: float | None = None, tol: float = CONSENSUS_TOL) -> np.ndarray:
        """Whether tokens `x` (`(*batch, n, d)`, at time `t`) show the predicted outcome:
        the theorem's own test (`self.test.check`, each `Theorem*Test` says what it
        checks) on each sequence, one program; `False` outside the domain where the
        theorem names a limit, and where it says nothing (`outcome == "none"`). `t` is
        needed for Theorems 3.2 and 5.3.
        """
        x = jnp.asarray(x)
        tol = check_scalar(tol, "tol", positive=True)
        start = np.shape(self._x0)
        try:
            np.broadcast_shapes(x.shape, start)
            fits = x.shape[-2:] == start[-2:]
        except ValueError:
            fits = False
        refuse_first([(not fits, f"Prediction.check: `x` must be tokens of the shape of the "
                       f"starts {start} (or one of its batch), got {x.shape}.")])
        if self.outcome == "none":
            return np.zeros(x.shape[:-2], bool)
        if t is None and self.theorem in ("3.2", "5.3"):
            what = "an equilibrium" if self.theorem == "3.2" else "Theorem 5.3"
            raise ValueError(f"checking {what} needs the time `t` of `x`.")
        test = self.test
        if self.theorem == "5.3":
            test = eqx.tree_at(lambda s: s.v1_t, test, self._followed_v1(t))
        # t and tol traced, weakly typed as Python floats are: one program for every value
        t = None if t is None else jnp.asarray(t)
        return np.asarray(_checked(test, np.asarray(self._x0, x.dtype), x, t, jnp.asarray(tol)))


@kept_jit
def _checked(test, x0, x, t, tol):
    x0 = jnp.broadcast_to(x0, x.shape)
    return map_batch(lambda b, a: test.check(a, b, t, tol), x, x0)


def _domain(test, x):
    inside, margin = map_batch(test.domain, x)
    return inside, margin, map_batch(test.limit, x)


@kept_jit
def _placed(dyn, x0, tests):
    """The tokens put on `E_W` (checked already) and the domain and limit of each of
    `tests`, in the default float dtype: one program. A test with a host domain is
    left out (the persistent cache refuses a program holding a callback)."""
    x = prepare_tokens(dyn, x0, checks=False)
    return x, [_domain(test, x.astype(jnp.result_type(float))) for test in tests]


def _prediction(theorem, test, domain, dyn, x, cls) -> Prediction:
    inside, margin, limit = domain
    inside, margin = np.asarray(inside, bool), np.asarray(margin, np.float64)
    if limit is not None:
        limit = np.array(limit, np.float64)
        limit[~inside] = np.nan
    return Prediction(theorem, test.outcome, inside, margin, limit, cls[theorem].statement,
                      dyn, cls, (), test, x)


def predict(dyn: SelfAttentionDynamics, x0, *, times=None, tol: float | None = None
            ) -> Prediction:
    """What paper 001 predicts for the model `dyn` started at `x0`.

    Classifies the model (`classify`), then places the initial tokens in the
    domain of attraction of each applicable theorem with its `theorem_test`: the
    hemisphere test for Theorem 4.1 (`ja.metrics.hemisphere`), the side of `v₁`
    for 5.2 and 5.3, the exceptional start `x₂ = −x₁` for 5.1 (the only part of
    its null set that is known in closed form), everywhere for 3.2. The most
    specific applicable theorem is the main prediction (5.2, then 5.1, 4.1, 5.3,
    3.2); the others are in `.others`.

    **Arguments:**

    - `dyn`: the model.
    - `x0`: initial tokens `(..., n, d)` (normalised onto `E_W` first).
    - `times`, `tol`: as in `classify`.

    **Returns:**

    A `Prediction`: `.outcome`, `.in_domain` and `.margin` per sample, `.limit`
    where the theorem names the limit, `.check(x_T, t, tol)` to test an outcome.
    """
    cls = classify(dyn, times=times, tol=tol)
    x0 = check_token_shape(dyn, x0, "x0")
    check_tokens_now(x0)  # on the host: `prepare_tokens` need not check in a program
    found = [t for t in _PRIORITY if t in cls.theorems]
    tests = [theorem_test(t, dyn, v1=cls[t].data.get("v1"), tol=cls.tol) for t in found]
    x, domains = _placed(dyn, x0, [test for test in tests if not test.host_domain])
    x, domains = np.asarray(x, np.float64), iter(domains)
    if not found:
        batch = x.shape[:-2]
        return Prediction(
            None, "none", np.zeros(batch, bool), np.full(batch, -np.inf), None,
            cls.summary(), dyn, cls, (), None, x,
        )
    preds = [_prediction(t, test, _domain(test, jax.device_put(x))
                         if test.host_domain else next(domains), dyn, x, cls)
             for t, test in zip(found, tests)]
    return dataclasses.replace(preds[0], others=tuple(preds[1:]))
