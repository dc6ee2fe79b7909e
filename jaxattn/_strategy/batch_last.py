"""`BatchLast`: the systems on the last axis of every array."""

from typing import ClassVar

from .xla import AbstractXlaStrategy


class BatchLast(AbstractXlaStrategy):
    """The batch on the last axis (`jaxattn._ensemble.batch_last`): each layer or step
    a few elementwise XLA kernels that stream over all systems, products unrolled
    into multiply–adds; faster than `Vmap` for many small systems (BENCHMARKS.md).
    A flow's chunk of systems is one diffrax state `(n, d, B)`: constant steps are
    each system's own, an adaptive controller shares one step size per chunk (the
    shared-step mode). Dense attention only; no events that stop one system."""

    name: ClassVar[str] = "fused"
    runs_blocks: ClassVar[bool] = False
    splits_tokens: ClassVar[bool] = False
    fused: ClassVar[bool] = True
