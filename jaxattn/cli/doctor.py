"""`jaxattn doctor`: what a user runs on a new machine or GPU to trust the install
(what it checks: its `register`'s description); exit status 1 when float32 is not
faithful there (`faithful_float32`).
"""

import argparse
import importlib.util
import os
from importlib.metadata import PackageNotFoundError, version

from ._common import count_checks, refuse_first
from .cache import describe

#: The optional packages and what jaxattn uses them for.
OPTIONAL = {
    "torch": "the PyTorch references of `jaxattn bench`; the `hf` extra",
    "transformers": "HuggingFace checks of the imported models; the `hf` extra",
    "gguf": "loading .gguf model files; the `models` extra",
    "tokenizers": "`jaxattn loop --text`; the `models` extra",
    "imageio_ffmpeg": "MP4 movies (`jaxattn animate`'s default); the `movies` extra",
}
#: The small model of the float32 check: tokens, dimension, heads, layers, step.
CHECK = {"tokens": 8, "dim": 4, "heads": 2, "layers": 16, "tau": 0.1}
#: Float32 is faithful when its tokens after `CHECK["layers"]` layers are this close
#: to float64's (largest coordinate difference; tokens are unit vectors): sixteen
#: float32 roundings. True float32 products stay well inside it; TF32 products miss
#: it by about 100×, bfloat16 ones by about 1000×.
THRESHOLD = 16 * 2.0**-23


def faithful_float32(seed: int = 0, precision: str = "float32") -> float:
    """The largest difference between the tokens of `CHECK`'s model after its layers
    (`run_layers`), run in float32 and in float64 from the same start.

    **Arguments:**

    - `seed`: of the random weights and tokens.
    - `precision`: of the float32 run's matrix products (`"float32"`: true float32,
      as jaxattn computes; `"tensorfloat32"`, `"bfloat16"` miss `THRESHOLD`).

    **Returns:**

    The difference; `THRESHOLD` is the largest a faithful float32 gives.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np

    from .._dynamics import SelfAttentionDynamics
    from .._layers import run_layers

    rng = np.random.default_rng(seed)
    h, d, n = CHECK["heads"], CHECK["dim"], CHECK["tokens"]
    P, U = rng.standard_normal((2, h, d, d)) / np.sqrt(d)
    x0 = rng.standard_normal((n, d))
    final = {}
    # Each run with x64 as its dtype needs: with x64 on, `run_layers` computes float32
    # tokens in the default float64, and the float32 run would test nothing.
    for dtype, x64 in ((jnp.float64, True), (jnp.float32, False)):
        with jax.enable_x64(x64):
            dyn = SelfAttentionDynamics(
                jnp.asarray(P, dtype), jnp.asarray(U, dtype),
                precision=precision if dtype == jnp.float32 else "float32")
            xs = run_layers(dyn, jnp.asarray(x0, dtype), CHECK["layers"], CHECK["tau"])
            final[dtype] = np.asarray(xs[-1], np.float64)
    return float(np.max(np.abs(final[jnp.float32] - final[jnp.float64])))


def matmul_gflops(size: int, repeats: int = 5) -> dict[str, float | None]:
    """GFLOP/s of a float32 `size`² product on JAX's device at each of jaxattn's
    precisions, measured as `jaxattn bench` measures its peaks
    (`bench.device.jax_matmul_peak`: the best of `repeats` timed calls); `None` for
    `tensorfloat32` off the GPU (a CPU has no TF32 units)."""
    from .._precision import PRECISIONS
    from ..bench.device import jax_matmul_peak, on_gpu

    return {precision: None if precision == "tensorfloat32" and not on_gpu()
            else jax_matmul_peak(size, precision, repeats) for precision in PRECISIONS}


def optional_parts() -> dict[str, str | None]:
    """The version of each `OPTIONAL` package installed, `None` for one that is not
    (found, not imported)."""
    return {name: _installed(name) for name in OPTIONAL}


def _installed(name: str) -> str | None:
    if importlib.util.find_spec(name) is None:
        return None
    try:
        return version(name)
    except PackageNotFoundError:
        return "installed"


def _doctor(args: argparse.Namespace) -> int:
    refuse_first(count_checks(args, {"--size": 1}))
    import jax

    from .._validate import too_big

    refuse_first([too_big(24 * args.size**2,  # ~6 float32 copies of a side²
                          f"--size {args.size}: the timed product's matrices need about",
                          "choose a smaller --size")])

    from .._artifacts.folders import package_versions
    from .._process.determinism import OPT_OUT, is_deterministic
    from ..bench.device import device_label

    v = package_versions()
    print(f"jaxattn {v['jaxattn']}, python {v['python']}, jax {v['jax']}, "
          f"jaxlib {v['jaxlib']}")
    print(f"device: {device_label()}; backend {jax.default_backend()}, "
          f"{jax.device_count()} device(s)")
    state = "on" if is_deterministic() else "off"
    print(f"determinism: XLA's deterministic GPU mode {state} "
          f"(XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}); off with --nondeterministic "
          f"or {OPT_OUT}=1")
    print(describe())
    error = faithful_float32()
    faithful = error <= THRESHOLD
    print(f"float32: {CHECK['layers']} layers of run_layers ({CHECK['tokens']} tokens in "
          f"R^{CHECK['dim']}, {CHECK['heads']} heads) differ from float64 by {error:.1e} "
          f"(threshold {THRESHOLD:.1e}): {'faithful' if faithful else 'NOT faithful'}")
    peaks = matmul_gflops(args.size)
    print(f"matmul {args.size}×{args.size} of float32 operands: " + ", ".join(
        f"{name} {'n/a (no TF32 units)' if gf is None else f'{gf:,.1f} GFLOP/s'}"
        for name, gf in peaks.items()))
    for name, found in optional_parts().items():
        print(f"optional {name}: {found or 'not installed'} ({OPTIONAL[name]})")
    if not faithful:
        print("float32 is not faithful on this device: its results differ from float64 "
              "beyond rounding; run in float64 (jax_enable_x64) or check the install.")
        return 1
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "doctor", help="check the install on this machine: versions, device, float32, speed",
        description="Check the install on this machine: the versions and the device, "
        "whether float32 is faithful here (a small run against float64; exit status 1 "
        "when it is not), the determinism flags in force, the compilation cache (its "
        "folder and size), the matmul speed at jaxattn's precisions (float32, "
        "tensorfloat32 on a GPU, bfloat16; measured as `jaxattn bench` measures its "
        "peaks), and the optional parts installed.")
    p.add_argument("--size", type=int, default=1024,
                   help="side of the timed matrix product (default: %(default)s)")
    p.set_defaults(func=_doctor)

