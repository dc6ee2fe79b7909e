"""A `strategy=` argument as its member: the shorthands, and what `"auto"` picks."""

import math

import diffrax as dfx

from .._pallas import kernel_config
from .base import AbstractStrategy, differentiating
from .batch_last import BatchLast
from .pallas_kernel import PallasKernel
from .vmap import Vmap

#: The built-in members by shorthand: the family's one list.
BUILTIN = {cls.name: cls for cls in (Vmap, BatchLast, PallasKernel)}
STRATEGIES = ("auto", *BUILTIN)
# "auto" fuses a batch when one sequence's raw update costs at most this many flops
# (`4 h n d² + 4 h n² d`, the benchmark suite's count). Measured on the CPU (see
# BENCHMARKS.md, "The fused ensemble path"): fused is faster up to about this size.
FUSED_MAX_FLOPS = 50_000


def sequence_flops(h: int, n: int, d: int) -> int:
    """The flops of one raw update `v` of one sequence (unfactored weights)."""
    return 4 * h * n * d * d + 4 * h * n * n * d


def fused_applies(dyn, shape: tuple[int, ...]) -> bool:
    """Whether `strategy="auto"` runs tokens of `shape` `(..., n, d)` as `BatchLast`: a
    batch of at least two sequences, each of at most `FUSED_MAX_FLOPS`, dense."""
    if len(shape) < 3 or dyn.block_size:  # key blocks are a scan: Vmap runs them
        return False
    n, d = shape[-2], shape[-1]
    return math.prod(shape[:-2]) >= 2 and sequence_flops(dyn.num_heads, n, d) <= FUSED_MAX_FLOPS


def as_strategy(strategy) -> AbstractStrategy | None:
    """A member as is; a shorthand as its member (`"kernel"` with the layout of
    `jaxattn._pallas.use_kernel_config`); `None` for `"auto"`; else a `ValueError`."""
    if isinstance(strategy, AbstractStrategy):
        return strategy
    if not isinstance(strategy, str) or strategy not in STRATEGIES:
        raise ValueError(f"`strategy` must be one of {', '.join(map(repr, STRATEGIES))} "
                         f"or a ja.AbstractStrategy (ja.Vmap(), ja.BatchLast(), "
                         f"ja.PallasKernel(...)), got {strategy!r}.")
    if strategy == "auto":
        return None
    if strategy == "kernel":
        config = kernel_config()
        return PallasKernel(config.block, config.num_warps, config.backend)
    return BUILTIN[strategy]()


def choose_strategy(dyn, shape: tuple[int, ...], strategy="auto", operands=None, *,
                    solver=None, controller=None, shard: str = "batch") -> AbstractStrategy:
    """The member that runs tokens of `shape` on model `dyn` (one model) for `strategy`
    (a member, a shorthand or `"auto"`), or a `ValueError` for what it does not run.

    `"auto"` takes `BatchLast` for a batch of small dense systems (`fused_applies`) —
    for a flow only with constant steps of an explicit solver (`solver`,
    `controller`) — and `Vmap` otherwise, and for a run being differentiated (a leaf of
    `operands`, e.g. `(dyn, x0)`, is a JVP or linearize tracer; why: BENCHMARKS.md,
    "Gradients stay on the general path"); never `PallasKernel` (docs/kernels.md,
    "auto"). With `shard="tokens"` a member that fuses a batch gives way to `Vmap`;
    `PallasKernel` refuses in its run."""
    member = as_strategy(strategy)
    if member is not None:
        member.refuse(dyn, operands)
        if shard == "tokens" and not (member.splits_tokens or member.one_device):
            return Vmap()  # the ring splits one system: no batch to fuse
        return member
    if shard == "tokens" or differentiating(operands) or not fused_applies(dyn, tuple(shape)):
        return Vmap()
    if solver is not None:
        inner = solver.solver if isinstance(solver, dfx.AbstractWrappedSolver) else solver
        if not (isinstance(controller, dfx.ConstantStepSize)
                and isinstance(inner, (dfx.AbstractERK, dfx.Euler))):
            return Vmap()
    return BatchLast()
