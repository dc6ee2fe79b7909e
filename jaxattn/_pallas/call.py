"""One `pallas_call` of the core's kernels: Triton on CUDA, interpret mode elsewhere,
chosen when the program is lowered (`docs/kernels.md`, "Where it runs")."""

import functools

import numpy as np
from jax import lax


def pallas_run(kernel, args, *, grid, in_specs, out_specs, out_shape, num_warps: int,
               name: str):
    """`kernel` over `grid` applied to `args`, as `pl.pallas_call` takes the rest."""
    # Pallas is imported here, on a kernel's first use: importing it costs every
    # `run_layers` user about 0.3 s (JAX 0.10).
    from jax.experimental import pallas as pl

    def run(interpret, *xs):
        params = None
        if not interpret:
            from jax.experimental.pallas import triton as pltriton
            params = pltriton.CompilerParams(num_warps=num_warps, num_stages=1)
        return pl.pallas_call(kernel, grid=grid, in_specs=in_specs, out_specs=out_specs,
                              out_shape=out_shape, interpret=interpret,
                              compiler_params=params, name=name)(*xs)

    return lax.platform_dependent(*args, cuda=functools.partial(run, False),
                                  default=functools.partial(run, True))


def power_of_two(b) -> bool:
    """Whether a layout size (`block`, `block_q`, …) is a power of two (an int or a NumPy
    integer; a bool is no size)."""
    return (isinstance(b, int | np.integer) and not isinstance(b, bool)
            and b >= 1 and b & (b - 1) == 0)


def as_size(b):
    """A layout size as stored: a NumPy integer as an `int` (anything else as is, for
    `power_of_two` to refuse)."""
    return int(b) if isinstance(b, np.integer) else b


#: The most warps a program may have: CUDA runs at most 1024 threads in a block.
MAX_WARPS = 32


def warps_refusal(num_warps) -> tuple[bool, str]:
    """`refuse_first`'s row for a kernel's `num_warps`: a power of two up to `MAX_WARPS`."""
    return (not (power_of_two(num_warps) and num_warps <= MAX_WARPS),
            f"`num_warps` must be a power of two (Triton's) up to {MAX_WARPS} (CUDA's 1024 "
            f"threads a block), got {num_warps!r}.")
