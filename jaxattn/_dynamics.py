"""Self-attention dynamics on the ellipsoid: the model of paper 001 §2.2–2.3."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Real

from ._manifold import project, tangent
from ._precision import Precision, check_precision, einsum
from ._schedule import AbstractSchedule, as_schedule, schedule_shape
from ._validate import check_metric, check_scalar

_Weights = Float[Array, "h a b"] | AbstractSchedule


class SelfAttentionDynamics(eqx.Module):
    """Tokens as particles on `E_W` moved by multi-head self-attention.

    With tokens `x ∈ R^{n×d}` (one per row), head `η` attends with
    `α^η_ij = softmax_j(β x_iᵀ P_η(t) x_j)` over `j ∈ M(i)` (all tokens, or
    `j ≤ i` when `causal`), and the raw update is
    `v_i(t, x) = Σ_η Σ_j α^η_ij U_η(t) x_j`.

    - The discrete layer (paper 001 eq. 4) is `x_i ← N_W(x_i + τ v_i(t, x))`.
    - The continuous flow (eq. 6) is `dx_i/dt = v_i − ⟨x_i, v_i⟩_W x_i`.

    **Arguments:**

    - `P`: query–key products `P_η`, `(h, d, d)`: an array, a schedule
      (`ja.Constant`, `ja.PiecewiseConstant`, `ja.Schedule`) or a callable
      `t ↦ (h, d, d)`. Use `SelfAttentionDynamics.from_factors` to give
      `P_η = Q_ηᵀ K_η` in factored form instead.
    - `U`: value matrices `U_η`, `(h, d, d)`, in the same forms as `P`.
    - `W`: the metric, symmetric positive definite `(d, d)`; `None` (default) is
      the identity, i.e. the unit sphere.
    - `beta`: inverse temperature `β` (default 1), a finite real.
    - `causal`: causal attention, `M(i) = {j ≤ i}` (default: full attention).
    - `precision`: of the attention's matrix products: `"float32"` (default, true
      float32 on every backend), or the opt-in `"tensorfloat32"` / `"bfloat16"`
      (reduced operands, float32 accumulation); see `jaxattn._precision`.
    """

    P: AbstractSchedule | None
    Q: AbstractSchedule | None
    K: AbstractSchedule | None
    U: AbstractSchedule
    W: Float[Array, "d d"] | None
    beta: Float[Array, ""]
    causal: bool = eqx.field(static=True)
    precision: str = eqx.field(static=True)

    def __init__(
        self,
        P: _Weights | None,
        U: _Weights,
        W: Float[Array, "d d"] | None = None,
        beta: float = 1.0,
        causal: bool = False,
        *,
        Q: _Weights | None = None,
        K: _Weights | None = None,
        precision: Precision = "float32",
    ):
        if (P is None) == (Q is None or K is None):
            raise ValueError(
                "SelfAttentionDynamics needs either `P` (h, d, d) or both factors "
                "`Q` and `K` (h, k, d) — use SelfAttentionDynamics.from_factors(Q, K, U)."
            )
        self.U = as_schedule(U, "U")
        u_shape = schedule_shape(self.U, "U")
        if len(u_shape) != 3 or u_shape[1] != u_shape[2]:
            raise ValueError(
                f"`U` must be (h, d, d) (one d×d value matrix per head), got {u_shape}."
            )
        h, d = u_shape[0], u_shape[1]
        if h < 1 or d < 1:
            raise ValueError(f"`U` {u_shape} must have at least one head and d ≥ 1.")
        if P is not None:
            self.P, self.Q, self.K = as_schedule(P, "P"), None, None
            p_shape = schedule_shape(self.P, "P")
            if p_shape != (h, d, d):
                raise ValueError(
                    f"`P` must be (h, d, d) = {(h, d, d)} to match `U` {u_shape}, got {p_shape}."
                )
        else:
            self.P, self.Q, self.K = None, as_schedule(Q, "Q"), as_schedule(K, "K")
            q_shape, k_shape = schedule_shape(self.Q, "Q"), schedule_shape(self.K, "K")
            if len(q_shape) != 3 or q_shape != k_shape or q_shape[0] != h or q_shape[2] != d:
                raise ValueError(
                    f"`Q` and `K` must both be (h, k, d) with h={h}, d={d} from `U` "
                    f"{u_shape}; got Q {q_shape} and K {k_shape}."
                )
        self.W = None if W is None else check_metric(W, d)
        dtype = jnp.result_type(float)  # β is stored in the model's float dtype
        self.beta = jnp.asarray(check_scalar(beta, "beta", dtype=dtype), dtype=dtype)
        if not isinstance(causal, bool):
            raise TypeError(f"`causal` must be True or False, got {causal!r}.")
        self.causal = causal
        self.precision = check_precision(precision)

    @classmethod
    def from_factors(cls, Q: _Weights, K: _Weights, U: _Weights, W=None, beta=1.0, causal=False,
                     *, precision: Precision = "float32"):
        """Build the dynamics from per-head factors `P_η = Q_ηᵀ K_η`, kept factored.

        `Q`, `K` are `(h, k, d)` (as in real models, where `k = d / h`): scores are
        computed as `(Q x_i)·(K x_j)` at cost `O(h n k d + h n² k)`, never forming
        the `d×d` product.
        """
        return cls(None, U, W, beta, causal, Q=Q, K=K, precision=precision)

    @property
    def num_heads(self) -> int:
        return schedule_shape(self.U, "U")[0]

    @property
    def dim(self) -> int:
        return schedule_shape(self.U, "U")[1]

    def query_key(self, t: Real[Array, ""]) -> Float[Array, "h d d"]:
        """The query–key products `P_η(t)` (formed from the factors if factored)."""
        if self.P is not None:
            return self.P(t)
        return einsum("hkd,hke->hde", self.Q(t), self.K(t), precision=self.precision)

    def _check_x(self, x: Float[Array, "n d"]) -> None:
        if x.ndim != 2 or x.shape[1] != self.dim:
            hint = " For a batch, map over it with jax.vmap." if x.ndim > 2 else ""
            raise ValueError(
                f"tokens must be one sequence of shape (n, d) with d={self.dim}, "
                f"got {x.shape}.{hint}"
            )

    def scores(self, t: Real[Array, ""], x: Float[Array, "n d"]) -> Float[Array, "h n n"]:
        """The attention logits `β x_iᵀ P_η x_j`."""
        if self.P is not None:
            P = _nan_unless_finite(self.P(t))
            keys = einsum("hde,je->hjd", P, x, precision=self.precision)  # (P x_j)
            s = einsum("id,hjd->hij", x, keys, precision=self.precision)
        else:
            Q, K = _nan_unless_finite(self.Q(t)), _nan_unless_finite(self.K(t))
            q = einsum("hkd,id->hik", Q, x, precision=self.precision)
            k = einsum("hkd,jd->hjk", K, x, precision=self.precision)
            s = einsum("hik,hjk->hij", q, k, precision=self.precision)
        return self.beta.astype(s.dtype) * s

    def attention(self, t: Real[Array, ""], x: Float[Array, "n d"]) -> Float[Array, "h n n"]:
        """The attention matrices `α^η_ij`, rows summing to one (max-shifted softmax,
        stable for large `β|P|`)."""
        self._check_x(x)
        # Logits beyond the float range (β|P| ≳ 1e38 in float32) are clipped to it, so
        # the max-shift never computes inf − inf; NaN logits stay NaN and are caught.
        s = self.scores(t, x)
        big = jnp.finfo(s.dtype).max
        s = jnp.clip(s, -big, big)
        if self.causal:
            n = x.shape[0]
            mask = jnp.tril(jnp.ones((n, n), dtype=bool))
            s = jnp.where(mask, s, -jnp.inf)
        return jax.nn.softmax(s, axis=-1)

    def raw_update(self, t: Real[Array, ""], x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        """`v_i(t, x) = Σ_η Σ_j α^η_ij U_η(t) x_j`."""
        A = self.attention(t, x)
        mixed = einsum("hij,jd->hid", A, x, precision=self.precision)
        return einsum("hid,hed->ie", mixed, self.U(t), precision=self.precision)

    def velocity(self, t: Real[Array, ""], x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        """The continuous-time vector field (paper 001 eq. 6):
        `dx_i/dt = v_i − ⟨x_i, v_i⟩_W x_i`, tangent to `E_W` at points of `E_W`."""
        x = jnp.asarray(x)
        return tangent(x, self.raw_update(t, x), self.W)

    def layer(
        self, t: Real[Array, ""], x: Float[Array, "n d"], tau: Real[Array, ""]
    ) -> Float[Array, "n d"]:
        """One discrete layer (paper 001 eq. 4): `x_i ← N_W(x_i + τ v_i(t, x))`,
        with the weights read at time `t` (layer `k` uses `t = kτ`)."""
        x = jnp.asarray(x)
        return project(x + tau * self.raw_update(t, x), self.W)


def _nan_unless_finite(w: Float[Array, "h a b"]) -> Float[Array, "h a b"]:
    """`w`, or all NaN if any entry is NaN or inf.

    `attention` clips logits to the float range (so that a finite but huge `β|P|`
    does not give `inf − inf`), which would silently turn an `inf` weight into a
    finite answer. Concrete weights are refused when the model is built; traced
    ones (inside `jit`, or a user `Schedule`) become NaN here, so the run raises
    `NONFINITE` (or reports the sample failed) without a host callback.
    """
    return jnp.where(jnp.all(jnp.isfinite(w)), w, jnp.nan)
