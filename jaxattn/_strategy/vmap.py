"""`Vmap`: `jax.vmap` over the systems."""

from typing import ClassVar

from .xla import AbstractXlaStrategy


class Vmap(AbstractXlaStrategy):
    """`jax.vmap` of the model's one-system `layer`/`velocity` over the batch: every
    model runs here (key blocks, tokens split over devices, events that stop each
    system on its own, adaptive steps per system)."""

    name: ClassVar[str] = "general"
    runs_blocks: ClassVar[bool] = True
    splits_tokens: ClassVar[bool] = True
    fused: ClassVar[bool] = False
