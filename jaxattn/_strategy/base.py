"""The execution strategies' family (`strategy=`, as diffrax takes `solver=`): how a
batch of systems is run. Members and their capabilities: `docs/usage/strategies.md`.
"""

import abc
from typing import ClassVar

import equinox as eqx
import jax
from jax._src.interpreters import ad as _ad

from .. import _validate

# The tracers of a value being differentiated (forward mode, and reverse mode's
# linearisation); JAX exports no public test for them.
_DIFFERENTIATING = tuple(getattr(_ad, name) for name in ("JVPTracer", "LinearizeTracer")
                         if hasattr(_ad, name))


def differentiating(operands) -> bool:
    """Whether any leaf of `operands` (e.g. `(dyn, x0)`) is being differentiated."""
    return any(isinstance(leaf, _DIFFERENTIATING) for leaf in jax.tree.leaves(operands))


#: Why a member that is not differentiable refuses a run being differentiated (a
#: differentiated operand, or one the kernel's `observe` or schedule closes over).
NOT_DIFFERENTIABLE = ("is not differentiable (the kernel has no derivative rule): "
                      "differentiate with strategy=ja.Vmap() ('general', which 'auto' takes "
                      "for gradients).")


def refuse_first(name: str, refusals) -> None:
    """The one wording of a member's refusal: a `ValueError` `strategy='name' why` for
    the first `(refused, why)` of `refusals` that is refused."""
    _validate.refuse_first((refused, f"strategy={name!r} {why}") for refused, why in refusals)


class AbstractStrategy(eqx.Module):
    """How `ja.run_layers` and `ja.solve_flow` execute a batch of systems.

    Members declare their capabilities (class variables) and implement `run_layers`
    and `solve_flow`. The string shorthands `"general"`, `"fused"` and `"kernel"` name
    the built-in members (`name`); `"auto"` picks one (`jaxattn._strategy.choose`).
    """

    #: The member's shorthand (`strategy="..."`), used in messages.
    name: ClassVar[str]
    #: Whether it runs a model's key blocks (`block_size`, a scan over keys).
    runs_blocks: ClassVar[bool]
    #: Whether a run through it can be differentiated.
    differentiable: ClassVar[bool]
    #: Whether it runs one system's tokens split over devices (`shard="tokens"`).
    splits_tokens: ClassVar[bool]
    #: Whether it runs on one device only (refusing `devices=` and `shard=`).
    one_device: ClassVar[bool]
    #: Whether it evaluates the one-system program with the systems on the last axis
    #: in XLA (`jaxattn._ensemble.batch_last`): what a caller's own batched work follows.
    fused: ClassVar[bool]

    def refuse(self, dyn, operands=None) -> None:
        """A `ValueError` naming what this member does not run (`dyn` one model)."""
        refuse_first(self.name, (
                (not self.runs_blocks and dyn.block_size,
                 "runs dense attention: a model with `block_size` takes strategy=ja.Vmap() "
                 "('general', or 'auto')."),
                (not self.splits_tokens and dyn.token_mesh is not None,
                 "runs whole systems: tokens split over devices take strategy=ja.Vmap() "
                 "('general')."),
                (not self.differentiable and differentiating(operands),
                 NOT_DIFFERENTIABLE)))

    @abc.abstractmethod
    def run_layers(self, dyn, x0, num_layers, tau, observe, checkpoints, *, devices,
                   shard, noise, keys, checked: bool = True):
        """The layers of a (flattened, stacked) batch: `((ys, finite), checked)` as
        `jaxattn._batch.call_batched` returns them; `checked=False` runs the program
        with no value checks and no sharding (`run_layers_unchecked`)."""

    @abc.abstractmethod
    def solve_flow(self, dyn, x0, options, *, adjoint, throw, on_manifold, event,
                   devices, shard, noise, keys, checked: bool = True, progress: bool = False):
        """The flow of a (flattened, stacked) batch: the tokens at `ts`, a `FlowResult`
        (`throw=False`) or a `FlowSolution` (`event`). `options` are
        `(ts, solver, controller, dt0, max_steps)`, the solver unwrapped; `progress`
        shows a progress bar."""
