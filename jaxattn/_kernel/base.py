"""`AbstractKernel`: how attention turns logits into weights, on both paths (the dense
weights, and its pieces of the key-block sweep of `jaxattn._blocks`). The dynamics, the
blocks and the ring never ask which kernel they hold; adding one is a subclass
(`docs/extending.md`, with a table of the methods below).

The state of a query row in the sweep is `(top, norm, acc)`: a running top score,
a running normaliser and the running sum of weighted values `(…, c)`, all starting
at `(−∞, 0, 0)`. Kernels that need less leave the first two as they are.
"""

import abc
from collections.abc import Callable

import equinox as eqx
from jaxtyping import Array, Bool, Float

from .._validate import check_final

#: `(top, norm, acc)` of every query row of a block: `(…)`, `(…)`, `(…, c)`.
State = tuple[Float[Array, "..."], Float[Array, "..."], Float[Array, "... c"]]


class AbstractKernel(eqx.Module):
    """The attention weights `w_ij` of the logits `s_ij = β x_iᵀ P_η x_j`.

    Subclasses declare `name` (the string spelling, `kernel="softmax"`; `None`-free,
    unique among the built-in ones), `description` (one line, for reports) and the
    capabilities other code asks of a kernel (never its class):

    - `normalised`: whether each row's weights sum to one (softmax, hardmax), rather
      than being a function of each logit alone, rescaled (the pointwise kernels);
    - `flash`: whether the Pallas flash kernel (`jaxattn._pallas.flash`) runs it: the
      online softmax if `normalised`, else its `pointwise` weight;
    - `exponent_shift`: `c` when the weights of unit tokens are
      `e^{β(⟨x_i, x_j⟩ − c)}` (over `n`, or normalised over the row, where `c = 0`),
      `None` when they are not exponential in the logit. The mean-field equation
      (`ja.meanfield`, interaction `e^{β⟨x, y⟩}` scaled by `e^{−βc}`) takes the kernels
      that have one, the equiangular reduction (`ja.theory`) those with `c = 0`;

    and implement every abstract method. Array fields (a bias) are parameters: they
    enter the blocked path only through `offset`.
    """

    name: eqx.AbstractClassVar[str]
    description: eqx.AbstractClassVar[str]
    normalised: eqx.AbstractClassVar[bool]
    flash: eqx.AbstractClassVar[bool]
    exponent_shift: eqx.AbstractClassVar[float | None]

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        check_final(cls, AbstractKernel)  # members implement abstract methods only

    @abc.abstractmethod
    def offset(self, beta: Float[Array, ""], n: int, dtype) -> Float[Array, ""] | None:
        """The scalar added to every (clipped) logit before masking, for `n` tokens;
        `None` for none (the logits as they are)."""

    @abc.abstractmethod
    def weights(self, s: Float[Array, "*rows m"], n: int) -> Float[Array, "*rows m"]:
        """The dense weights from shifted logits, masked logits being `−∞` (their
        weight must be 0); `n` is the number of tokens."""

    @abc.abstractmethod
    def rescale(self, mixed: Float[Array, "*rows c"], n: int) -> Float[Array, "*rows c"]:
        """The blocked path's output from `block_finish`'s (a factor the dense
        `weights` already hold, such as `1/n`)."""

    @abc.abstractmethod
    def block_update(self, state: State, s: Float[Array, "*rows k"], ok: Bool[Array, "*rows k"],
                     mix: Callable[[Array], Array]) -> State:
        """A row's state after one block of keys: `s` its shifted logits, `ok` where
        it may see them, `mix(w)` the sum `Σ_k w_k v_k` over the block."""

    @abc.abstractmethod
    def block_finish(self, state: State) -> tuple[Array, tuple[Array, Array]]:
        """`(out, (a, b))`: the rows' outputs after every key, and the two per-row
        quantities the backward pass reads (`block_grad`'s `a`, `b`)."""

    @abc.abstractmethod
    def block_grad(self, s: Float[Array, "*rows k"], ok: Bool[Array, "*rows k"],
                   a: Float[Array, "*rows"], b: Float[Array, "*rows"],
                   delta: Float[Array, "*rows"], dp: Float[Array, "*rows k"]
                   ) -> tuple[Array, Array]:
        """`(w, ds)` of a block in the backward pass: the weights (recomputed from `s`
        and `block_finish`'s `a`, `b`) and the gradient of the logits, given
        `dp = ∂L/∂w` and `delta = Σ_c dout · out` of each row."""
