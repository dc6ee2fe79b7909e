"""Physical floors: how fast a device evaluates exponentials when memory is not involved.

The register rate runs `x ← exp(−x)` many times in one Pallas kernel (Triton on
CUDA); off a GPU the in-cache rate of `jnp.exp` (`jaxattn.bench.device.exp_rate`)
stands for it. See docs/kernels.md ("Floors").
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from .device import best_seconds, exp_rate

#: Programs, lanes per program and sweeps of the register kernel on a GPU: 16,384
#: programs of 256 lanes (4M values, enough to fill every SM) × 4096 exps each.
REGISTER_EXP = (16_384, 256, 4096)
#: The in-cache exp rate's array (64 KiB of float32) and sweeps per call.
EXP_CACHED = (2**14, 4096)


def _exp_kernel(x_ref, o_ref, *, sweeps: int):
    x = x_ref[...]
    o_ref[...] = lax.fori_loop(0, sweeps, lambda _, y: jnp.exp(-y), x)


def register_exp_call(programs: int, block: int, sweeps: int, *, interpret: bool):
    """The register kernel: `(programs · block,)` float32 values, each `x ← exp(−x)`
    `sweeps` times in registers; compiled with Triton unless `interpret`."""
    params = None
    if not interpret:
        from jax.experimental.pallas import triton as pltriton
        params = pltriton.CompilerParams(num_warps=max(1, block // 32), num_stages=1)
    return pl.pallas_call(
        functools.partial(_exp_kernel, sweeps=sweeps),
        grid=(programs,),
        in_specs=[pl.BlockSpec((block,), lambda i: (i,))],
        out_specs=pl.BlockSpec((block,), lambda i: (i,)),
        out_shape=jax.ShapeDtypeStruct((programs * block,), jnp.float32),
        interpret=interpret, compiler_params=params, name="register_exp")


def register_exp_rate(repeats: int, sizes: tuple[int, int, int] = REGISTER_EXP,
                      cached: float | None = None) -> dict:
    """Exponentials per second with the values in registers: the Pallas kernel on a
    GPU; elsewhere the in-cache rate of `jnp.exp` (what the CPU's units sustain;
    `cached`, when already measured). **Returns:** `{"exp_register_per_s",
    "exp_register_method"}`."""
    if jax.default_backend() != "gpu":
        rate = exp_rate(EXP_CACHED[0], repeats, EXP_CACHED[1]) if cached is None else cached
        return {"exp_register_per_s": rate,
                "exp_register_method": "jnp.exp in cache (no Pallas compiler here)"}
    programs, block, sweeps = sizes
    best = best_seconds(register_exp_call(programs, block, sweeps, interpret=False),
                        jnp.linspace(0.0, 1.0, programs * block, dtype=jnp.float32),
                        repeats=repeats)
    return {"exp_register_per_s": programs * block * sweeps / best,
            "exp_register_method": f"Pallas (Triton) kernel, {programs}×{block} lanes × "
                                   f"{sweeps} exps in registers"}
