"""Self-attention dynamics on the ellipsoid: the model of paper 001 §2.2–2.3, and its
variants (normalisation placements, masks, kernels, shared keys)."""

import copy
import dataclasses
import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, PRNGKeyArray, Real

from ._blocks import DEFAULT_BLOCK, block_spec, blocked_attention, blocks_needed, ring_attention
from ._kernel import KERNELS, AbstractKernel, as_kernel, bias_of, check_kernel
from ._manifold import unit_rows
from ._norm import NORMS, AbstractNorm, as_norm
from ._precision import Precision, check_precision, einsum
from ._schedule import AbstractSchedule, as_schedule, schedule_shape
from ._validate import (
    INDEX_MAX,
    as_float_array,
    check_count,
    check_flag,
    check_metric,
    check_scalar,
    is_concrete,
    refuse_first,
)

_Weights = Float[Array, "h a b"] | AbstractSchedule
__all__ = ["KERNELS", "NORMS", "SelfAttentionDynamics", "random_dynamics", "random_mask",
           "unit_rows"]

#: Bytes of one `(h, n, n)` weight array above which `block_size=None` takes key
#: blocks: 1 MiB, n > 512 for one float32 head (why: `docs/mean_field.md`).
DENSE_LIMIT = 2**20


class SelfAttentionDynamics(eqx.Module):
    """Tokens as particles moved by multi-head self-attention (on `E_W` for `"post"`).

    With tokens `x ∈ R^{n×d}` (one per row), head `η` attends with
    `α^η_ij = softmax_j(β x_iᵀ P_η(t) x_j)` over `j ∈ M(i)` (all tokens, or
    `j ≤ i` when `causal`), and the raw update is
    `v_i(t, x) = Σ_η Σ_j α^η_ij U_η(t) x_j`. With `N = N_W` (`ja.normalize`):

    - The discrete layer (paper 001 eq. 4) is `x_i ← N(x_i + τ v_i(t, x))`.
    - The continuous flow (eq. 6) is `dx_i/dt = v_i − ⟨x_i, v_i⟩_W x_i`.

    That is `norm=ja.PostNorm()` (`"post"`), the papers' model. The other placements
    (`ja.AbstractNorm`'s members, `N(0)` taken as `0`): their layers and velocities are
    tabled and derived in `docs/variants.md`. `"post"` and `"ngpt"` keep tokens on
    `E_W` (`stays_on_manifold`); `"pre"`, `"peri"` and `"none"` move them off it, and
    `ja.solve_flow` integrates their flow without retraction (its default). The simulators
    normalise `x0` onto `E_W` first, for every placement.

    **Arguments:**

    - `P`: query–key products `P_η`, `(h, d, d)`: an array, a schedule
      (`ja.Constant`, `ja.PiecewiseConstant`, `ja.Schedule`) or a callable
      `t ↦ (h, d, d)`. Use `SelfAttentionDynamics.from_factors` to give
      `P_η = Q_ηᵀ K_η` in factored form instead (with shared keys, if wanted).
    - `U`: value matrices `U_η`, `(h, d, d)`, in the same forms as `P`.
    - `W`: the metric, symmetric positive definite `(d, d)`; `None` (default) is
      the identity, i.e. the unit sphere.
    - `beta`: inverse temperature `β` (default 1), a finite real; an array leaf, so
      a `jax.vmap` over `β`s is a batch of models in one compiled program.
      `dataclasses.replace(dyn, beta=2.0)` checks a new value as the constructor does;
      `eqx.tree_at` sets a leaf unchecked (`lambda m: m.beta`; the weights are
      schedules: `lambda m: m.P.value` for a constant `P`).
    - `causal`: causal attention, `M(i) = {j ≤ i}` (default: full attention).
    - `norm`: where the normalisation sits: a member of `ja.AbstractNorm` —
      `ja.PostNorm()` (default), `ja.PreNorm()`, `ja.PeriNorm()`, `ja.NGPT()`,
      `ja.NoNorm()`, or a user's own — or its name `"post"`, `"pre"`, `"peri"`,
      `"ngpt"`, `"none"` (table above).
    - `window`: a sliding window of width `w ≥ 1` (GPT-Neo's local layers): token
      `i` attends to `j` only when `|i − j| < w` (and `j ≤ i` when `causal`), at
      most `2³¹ − 1`. `None` (default): no window.
    - `mask`: a boolean `(n, n)` array, `True` where `i` attends to `j`; combined
      with `causal` and `window` by logical and (`ja.random_mask` draws one). The
      diagonal is always on (a fully masked row gives `α_ii = 1`, never `0/0`).
    - `kernel`: the attention weights from the logits `s_ij = β x_iᵀ P_η x_j`: a
      member of `ja.AbstractKernel` (`ja.Softmax()` default, `ja.Sigmoid(bias=…)`,
      `ja.Exp()`, `ja.USA()`, `ja.Hardmax()`, or a user's own; each member's
      docstring gives its weights) or its name (`KERNELS`). Masked weights are 0;
      `n` counts all tokens.
    - `precision`: of the attention's matrix products: `"float32"` (default), or the
      opt-in `"tensorfloat32"` / `"bfloat16"` (`docs/precision.md`).
    - `bias`: the sigmoid's bias `b` (only with `kernel="sigmoid"`: the same as
      `kernel=ja.Sigmoid(bias=b)`); `None` (default) is `−log n`.
    - `block_size`: `None` (default): the dense `(h, n, n)` weights up to
      `DENSE_LIMIT` bytes, key blocks of `DEFAULT_BLOCK` above (`jaxattn._blocks`,
      memory `O(n)`); an integer `b ≥ 1` forces blocks of `b` keys, `0` the dense
      weights. Both agree to rounding; the blocked path is reverse-mode only unless
      the model is `dyn.with_forward_mode()`.
    """

    # Converters turn strings and arrays into members and schedules, `__post_init__`
    # puts the sigmoid's `bias` into the kernel, `__check_init__` checks the fields
    # together: the dataclass `__init__` stays (`dataclasses.replace` checks again;
    # `eqx.tree_at` sets a leaf as it is).
    P: AbstractSchedule | None = eqx.field(converter=lambda P: _schedule(P, "P"))
    U: AbstractSchedule = eqx.field(converter=lambda U: as_schedule(U, "U"))
    W: Float[Array, "d d"] | None = eqx.field(
        default=None, converter=lambda W: None if W is None else as_float_array(W, "W"))
    beta: Float[Array, ""] = eqx.field(default=1.0, converter=lambda b: _beta(b))
    causal: bool = eqx.field(default=False, static=True,
                             converter=lambda c: check_flag(c, "causal"))
    norm: AbstractNorm = eqx.field(default="post", converter=as_norm)
    window: int | None = eqx.field(
        default=None, static=True,
        # Compared with token distances inside the program (int32): a wider window is
        # no window (pass None).
        converter=lambda w: None if w is None else check_count(w, "window", 1, INDEX_MAX))
    mask: Bool[Array, "n n"] | None = eqx.field(
        default=None, converter=lambda m: None if m is None else _as_mask(m))
    kernel: AbstractKernel = "softmax"  # a member after `__post_init__`
    Q: AbstractSchedule | None = eqx.field(default=None, kw_only=True,
                                           converter=lambda Q: _schedule(Q, "Q"))
    K: AbstractSchedule | None = eqx.field(default=None, kw_only=True,
                                           converter=lambda K: _schedule(K, "K"))
    precision: str = eqx.field(default="float32", kw_only=True, static=True,
                               converter=check_precision)
    bias: dataclasses.InitVar[float | None] = dataclasses.field(default=None, kw_only=True)
    block_size: int | None = eqx.field(
        default=None, kw_only=True, static=True,
        converter=lambda b: None if b is None else check_count(b, "block_size", 0))
    token_mesh: object = eqx.field(default=None, kw_only=True, static=True)  # a Mesh:
    # tokens split (`on_tokens`)
    forward_mode: bool = eqx.field(default=False, kw_only=True, static=True)  # blocks
    # without the custom VJP

    def __post_init__(self, bias):
        if bias is not None and bias is bias_of(self.kernel):
            # `dataclasses.replace` passes back `dyn.bias`, the kernel's own (so a new
            # kernel in place of a biased sigmoid takes `replace(..., bias=None)`)
            bias = None
        self.kernel = as_kernel(self.kernel, bias)
        check_kernel(self.kernel)  # once, on a tiny input: shapes and NaN by name

    def __check_init__(self):
        u_shape = schedule_shape(self.U, "U")
        h, d = u_shape[:2] if len(u_shape) >= 2 else (0, 0)
        if (self.P is None) == (self.Q is None or self.K is None) or (
                self.P is not None and (self.Q is not None or self.K is not None)):
            problem = ("SelfAttentionDynamics needs either `P` (h, d, d) or both factors `Q` "
                       "and `K` (h, k, d) — use SelfAttentionDynamics.from_factors(Q, K, U).")
        elif len(u_shape) != 3 or u_shape[1] != u_shape[2] or min(u_shape) < 1:
            problem = (f"`U` must be (h, d, d) (one d×d value matrix per head, at least one "
                       f"head and d ≥ 1), got {u_shape}.")
        elif self.P is not None:
            p_shape = schedule_shape(self.P, "P")
            problem = None if p_shape == (h, d, d) else (
                f"`P` must be (h, d, d) = {(h, d, d)} to match `U` {u_shape}, got {p_shape}.")
        else:
            problem = _factor_problem(schedule_shape(self.Q, "Q"), schedule_shape(self.K, "K"),
                                      h, d)
        mask = self.mask
        refuse_first((
            (problem is not None, ValueError, problem),
            (mask is not None and mask.dtype != bool, TypeError, "`mask` must be a boolean (n, n) "
             f"array (True = attends), got dtype {getattr(mask, 'dtype', None)}; pass "
             "mask.astype(bool)."),
            (mask is not None and (mask.ndim != 2 or mask.shape[:1] != mask.shape[1:]), ValueError,
             f"`mask` must be a boolean (n, n) array, got shape {getattr(mask, 'shape', None)}."),
        ))
        if self.W is not None:
            check_metric(self.W, d)

    @classmethod
    def from_factors(cls, Q: _Weights, K: _Weights, U: _Weights, W=None, beta=1.0, causal=False,
                     norm="post", window=None, mask=None, kernel="softmax",
                     *, precision: Precision = "float32", bias=None, block_size=None):
        """Build the dynamics from per-head factors `P_η = Q_ηᵀ K_η`, kept factored.

        `Q` is `(h, k, d)` (as in real models, where `k = d / h`): scores are
        computed as `(Q x_i)·(K x_j)` at cost `O(h n k d + h n² k)`, never forming
        the `d×d` product. `K` is `(h, k, d)`, or `(g, k, d)` with `h` a multiple of
        `g` for shared keys (multi-query `g = 1`, grouped-query `1 < g < h`, as
        Llama's `num_key_value_heads`): head `η` uses key group `η // (h / g)`.
        The values stay per head, `U` `(h, d, d)`: with shared value projections
        `V_g` a head's `U_η = W_O,η V_{g(η)}` still differs per head (form it so).
        The other arguments are those of `SelfAttentionDynamics`.
        """
        return cls(None, U, W, beta, causal, norm, window, mask, kernel, Q=Q, K=K,
                   precision=precision, bias=bias, block_size=block_size)

    def on_tokens(self, mesh) -> "SelfAttentionDynamics":
        """This model with each sequence's tokens split over `mesh`'s devices (its
        first axis): attention as a ring over them (`jaxattn._blocks.ring_attention`),
        every other step token by token where the tokens are. `run_layers` and
        `solve_flow` call it for `shard="tokens"`; the token count must be a multiple
        of the device count."""
        return dataclasses.replace(self, token_mesh=mesh)

    def with_forward_mode(self) -> "SelfAttentionDynamics":
        """This model with its key blocks differentiable in forward mode (`jax.jvp`,
        `jax.jacfwd`): the blocks' sweep without its custom VJP, so JAX differentiates
        it in both modes (reverse mode then stores each block's weights).
        `ja.solve_flow` takes it for implicit solvers, whose Newton steps take
        Jacobian–vector products; the values are the same."""
        # A copy, not `dataclasses.replace`: the fields are checked already, and the
        # converters would check them again (a traced `β` inside a solve's program: a
        # host callback; a stacked model's β: refused as not a scalar).
        model = copy.copy(self)
        object.__setattr__(model, "forward_mode", True)
        return model

    @property
    def num_heads(self) -> int:
        return schedule_shape(self.U, "U")[0]

    @property
    def num_key_value_heads(self) -> int:
        """The number of key groups `g` (`h` unless keys are shared)."""
        return self.num_heads if self.K is None else schedule_shape(self.K, "K")[0]

    @property
    def dim(self) -> int:
        return schedule_shape(self.U, "U")[1]

    @property
    def stays_on_manifold(self) -> bool:
        """Whether the layer and the flow keep tokens on `E_W` (`ja.PostNorm()`,
        `ja.NGPT()`): the norm placement's own `stays_on_manifold`."""
        return self.norm.stays_on_manifold

    def _keys(self, K: Float[Array, "g k d"]) -> Float[Array, "h k d"]:
        """The key factor of every head (a shared group repeated, as Llama's repeat_kv)."""
        groups = K.shape[0]
        return K if groups == self.num_heads else jnp.repeat(K, self.num_heads // groups, 0)

    def query_key(self, t: Real[Array, ""]) -> Float[Array, "h d d"]:
        """The query–key products `P_η(t)` (formed from the factors if factored)."""
        if self.P is not None:
            return self.P(t)
        return einsum("hkd,hke->hde", self.Q(t), self._keys(self.K(t)),
                      precision=self.precision)

    def _check_x(self, x: Float[Array, "n d"]) -> None:
        n = x.shape[0] if x.ndim else 0
        if x.ndim != 2 or x.shape[1] != self.dim:
            hint = " For a batch, map over it with jax.vmap." if x.ndim > 2 else ""
            problem = (f"tokens must be one sequence of shape (n, d) with d={self.dim}, "
                       f"got {x.shape}.{hint}")
        elif self.mask is not None and self.mask.shape != (n, n):
            problem = (f"`mask` has shape {self.mask.shape} but there are n={n} tokens: pass "
                       f"a ({n}, {n}) boolean mask.")
        else:
            return
        raise ValueError(problem)

    def scores(self, t: Real[Array, ""], x: Float[Array, "n d"]) -> Float[Array, "h n n"]:
        """The attention logits `β x_iᵀ P_η x_j`."""
        if self.P is not None:
            P = _nan_unless_finite(self.P(t))
            keys = einsum("hde,je->hjd", P, x, precision=self.precision)  # (P x_j)
            s = einsum("id,hjd->hij", x, keys, precision=self.precision)
        else:
            Q, K = _nan_unless_finite(self.Q(t)), _nan_unless_finite(self.K(t))
            q = einsum("hkd,id->hik", Q, x, precision=self.precision)
            k = self._keys(einsum("hkd,jd->hjk", K, x, precision=self.precision))
            s = einsum("hik,hjk->hij", q, k, precision=self.precision)
        return jnp.asarray(self.beta, s.dtype) * s

    def allowed(self, n: int) -> Bool[Array, "n n"] | None:
        """Where token `i` may attend to `j`: `causal` and `window` and `mask` (with
        the diagonal forced on); `None` when every pair may."""
        parts = []
        if self.causal:
            parts.append(jnp.tril(jnp.ones((n, n), dtype=bool)))
        if self.window is not None:
            i = jnp.arange(n)
            parts.append(jnp.abs(i[:, None] - i[None, :]) < self.window)
        if self.mask is not None:
            parts.append(self.mask | jnp.eye(n, dtype=bool))
        return functools.reduce(jnp.logical_and, parts) if parts else None

    def attention(self, t: Real[Array, ""], x: Float[Array, "n d"]) -> Float[Array, "h n n"]:
        """The attention weights `α^η_ij` (`kernel`): for softmax, rows summing to one
        (max-shifted, stable for large `β|P|`)."""
        self._check_x(x)
        # Logits beyond the float range (β|P| ≳ 1e38 in float32) are clipped to it, so
        # the max-shift never computes inf − inf; NaN logits stay NaN and are caught.
        s = self.scores(t, x)
        big = jnp.finfo(s.dtype).max
        n = x.shape[0]
        s = jnp.clip(s, -big, big)
        offset = self.kernel.offset(self.beta, n, s.dtype)
        if offset is not None:
            s = s + offset
        mask = self.allowed(n)
        if mask is not None:
            # −∞ (not a large negative number): exactly 0 weight, and a zero gradient.
            s = jnp.where(mask, s, -jnp.inf)
        return self.kernel.weights(s, n)

    def blocked(self, n: int, dtype=None) -> bool:
        """Whether `n` tokens take the blocked path (`block_size`)."""
        if self.token_mesh is not None:
            return True
        if self.block_size is not None:
            return self.block_size > 0
        itemsize = jnp.dtype(jnp.result_type(float) if dtype is None else dtype).itemsize
        return blocks_needed(self.num_heads, n, itemsize, DENSE_LIMIT)

    def raw_update(self, t: Real[Array, ""], x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        """`v_i(t, x) = Σ_η Σ_j α^η_ij U_η(t) x_j` (at `x` as given, for every `norm`)."""
        if self.blocked(x.shape[0], x.dtype):
            mixed = self._blocked_mix(t, x)
        else:
            A = self.attention(t, x)
            mixed = einsum("hij,jd->hid", A, x, precision=self.precision)
        return einsum("hid,hed->ie", mixed, self.U(t), precision=self.precision)

    def _blocked_mix(self, t: Real[Array, ""], x: Float[Array, "n d"]) -> Float[Array, "h n d"]:
        """`Σ_j α^η_ij x_j` in key blocks (`jaxattn._blocks`): the scores
        `(β P_ηᵀ x_i)·x_j`, or `(β Q_η x_i)·(K_g x_j)`, never all at once."""
        self._check_x(x)
        n = x.shape[0]
        beta = jnp.asarray(self.beta, x.dtype)
        if self.P is not None:
            P = _nan_unless_finite(self.P(t))
            q = beta * einsum("hde,id->hie", P, x, precision=self.precision)
            k = x[None]
        else:
            Q, K = _nan_unless_finite(self.Q(t)), _nan_unless_finite(self.K(t))
            q = beta * einsum("hkd,id->hik", Q, x, precision=self.precision)
            k = einsum("gkd,jd->gjk", K, x, precision=self.precision)
        v = jnp.broadcast_to(x[None], (k.shape[0],) + x.shape)
        offset = self.kernel.offset(self.beta, n, x.dtype)
        offset = jnp.zeros((), x.dtype) if offset is None else offset
        devices = 1 if self.token_mesh is None else self.token_mesh.devices.size
        share = n // devices
        spec = block_spec(self.kernel, share, share, self.num_heads,
                          self.block_size or DEFAULT_BLOCK, causal=self.causal,
                          window=self.window, has_mask=self.mask is not None,
                          precision=self.precision, forward_mode=self.forward_mode)
        if self.token_mesh is None:
            mixed = blocked_attention(q, k, v, offset, self.mask, spec)
        else:
            mixed = ring_attention(q, k, v, offset, self.mask, spec, self.token_mesh)
        return self.kernel.rescale(mixed, n)

    def velocity(self, t: Real[Array, ""], x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        """The continuous-time vector field, the `τ → 0` limit of `layer`: the norm
        placement's `velocity` of the raw update at time `t`.

        `ja.PostNorm()` (paper 001 eq. 6): `dx_i/dt = v_i − ⟨x_i, v_i⟩_W x_i`, tangent to
        `E_W` at points of `E_W`; the other placements: `docs/variants.md`.
        """
        return self.norm.velocity(functools.partial(self.raw_update, t), jnp.asarray(x), self.W)

    def layer(
        self, t: Real[Array, ""], x: Float[Array, "n d"], tau: Real[Array, ""]
    ) -> Float[Array, "n d"]:
        """One discrete layer, with the weights read at time `t` (layer `k` uses
        `t = kτ`): `ja.PostNorm()` (paper 001 eq. 4) `x_i ← N_W(x_i + τ v_i(t, x))`; the
        other placements by their `step` (`docs/variants.md`)."""
        return self.norm.step(functools.partial(self.raw_update, t), jnp.asarray(x), tau,
                              self.W)


def random_mask(key: PRNGKeyArray, n: int, p: float) -> Bool[Array, "n n"]:
    """A random sparse attention mask: each pair `(i, j)` kept with probability `p`,
    independently, and every token keeping itself (`mask[i, i] = True`).

    **Arguments:**

    - `key`: a JAX PRNG key.
    - `n`: the number of tokens.
    - `p`: the keep-probability, in `[0, 1]` (may be traced, e.g. under `vmap`).

    **Returns:**

    A boolean `(n, n)` array for `SelfAttentionDynamics(..., mask=)`.
    """
    n = check_count(n, "n", 1)
    if is_concrete(p):
        p = check_scalar(p, "p")
        if not 0 <= p <= 1:
            raise ValueError(f"`p` is a keep-probability: it must lie in [0, 1], got {p}.")
    return jax.random.bernoulli(key, p, (n, n)) | jnp.eye(n, dtype=bool)


def random_dynamics(key: PRNGKeyArray, heads: int, d: int, *, scale: float = 1.0,
                    beta: float = 1.0, dtype=None, **options) -> SelfAttentionDynamics:
    """A random model: every entry of each `P_η` and `U_η` drawn independently from
    `N(0, scale² / d)`.

    With that variance a weight maps a unit token to a vector of expected squared
    length `scale²` (`E|P x|² = scale²` for `|x| = 1`), so logits `β xᵀ P x` and
    updates stay of order `scale` in every dimension. `P` and `U` use independent
    keys (`jax.random.split(key)`).

    **Arguments:**

    - `key`: a JAX PRNG key.
    - `heads`: the number of heads `h ≥ 1`.
    - `d`: the dimension `d ≥ 1`.
    - `scale`: the standard deviation times `√d` (default 1), `> 0`.
    - `beta`: the inverse temperature `β` (default 1).
    - `dtype`: the weights' dtype (default: JAX's default float).
    - `**options`: any other `SelfAttentionDynamics` argument (`W`, `causal`,
      `norm`, `window`, `mask`, `kernel`, `precision`, `bias`).

    **Returns:**

    A `SelfAttentionDynamics` with constant `(h, d, d)` weights.
    """
    heads, d = check_count(heads, "heads", 1), check_count(d, "d", 1)
    scale = check_scalar(scale, "scale", positive=True)
    dtype = jnp.result_type(float) if dtype is None else dtype
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"random_dynamics: `dtype` must be a floating dtype, got {dtype!r}.")
    std = float(scale / np.sqrt(d))  # a Python float: the draw keeps `dtype`
    kP, kU = jax.random.split(key)
    P, U = (std * jax.random.normal(k, (heads, d, d), dtype) for k in (kP, kU))
    return SelfAttentionDynamics(P, U, beta=beta, **options)


# Set after the class: in its body the name is the init-only `bias=` (default `None`).
SelfAttentionDynamics.bias = property(
    lambda dyn: bias_of(dyn.kernel),
    doc="The sigmoid's bias `b` (`ja.Sigmoid(bias=…)`), `None` for other kernels.")


def _schedule(value, name: str) -> AbstractSchedule | None:
    return None if value is None else as_schedule(value, name)


def _beta(beta) -> Float[Array, ""]:
    """`β`, checked, in the model's float dtype."""
    dtype = jnp.result_type(float)
    return as_float_array(check_scalar(beta, "beta", dtype=dtype), "beta", dtype)


def _factor_problem(q_shape, k_shape, h: int, d: int) -> str | None:
    """What is wrong with `Q` `(h, k, d)` and `K` `(g, k, d)` (`g` dividing `h`), or `None`."""
    if len(q_shape) != 3 or len(k_shape) != 3 or q_shape[0] != h or q_shape[2] != d \
            or k_shape[1:] != q_shape[1:] or k_shape[0] < 1:
        return (f"`Q` must be (h, k, d) and `K` (h, k, d) or (g, k, d) with h={h}, d={d} "
                f"from `U`; got Q {q_shape} and K {k_shape}.")
    if h % k_shape[0]:
        return (f"shared keys: `K` has g={k_shape[0]} groups, which must divide the h={h} "
                f"heads of `Q` and `U`; pass g among the divisors of {h}.")
    return None


def _as_mask(mask) -> Bool[Array, "n n"]:
    """A boolean mask as a JAX array; anything else as it is, for `__check_init__` to
    refuse by name."""
    mask = mask if hasattr(mask, "dtype") else np.asarray(mask)
    return jnp.asarray(mask) if mask.dtype == bool else mask


def _nan_unless_finite(w: Float[Array, "h a b"]) -> Float[Array, "h a b"]:
    """`w`, or all NaN if any entry is NaN or inf.

    `attention` clips logits to the float range (so that a finite but huge `β|P|`
    does not give `inf − inf`), which would silently turn an `inf` weight into a
    finite answer. Concrete weights are refused when the model is built; traced
    ones (inside `jit`, or a user `Schedule`) become NaN here, so the run raises
    `NONFINITE` (or reports the sample failed) without a host callback.
    """
    return jnp.where(jnp.all(jnp.isfinite(w)), w, jnp.nan)
