"""The error each precision mode costs on S2 and S3 of the benchmark suite, against a
float64 run of the same problem.

S2 is paper-size causal attention (50 tokens in R⁵⁰⁰, 2 heads, 100 layers, τ = 0.1),
S3 GPT-2-small-sized dynamics (200 tokens in R⁷⁶⁸, 12 factored heads with k = 64,
12 layers, τ = 1): the problems, weights and starts of `jaxattn bench`
(`jaxattn.bench.suite.SIZES`), by default at the suite's batch (a smaller one
keeps the first sequences of it). The reference runs them in float64; each mode in float32 with
`SelfAttentionDynamics(precision=...)`: `"float32"` (true float32),
`"tensorfloat32"` (off the GPU its operand rounding is emulated with
`lax.reduce_precision`) and `"bfloat16"` (bfloat16 operands, float32 sums).
Printed: the largest `|E_mode − E_float64|` over the misalignment curve (every
layer, every sequence) and at the last layer.

    .venv/bin/python benchmarks/precision_error.py [--batch-s2 16 --batch-s3 8]

About two minutes on a 2-core CPU.
"""

import argparse
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

import jaxattn as ja
from jaxattn.bench.suite import SIZES, case_names

CASES = {"S2": (100, 0.1), "S3": (12, 1.0)}  # (layers, τ), as `jaxattn bench` runs them


def dynamics(prob, arrays, dtype, precision) -> ja.SelfAttentionDynamics:
    """The suite's model for `prob` in `dtype`, its attention at `precision`."""
    a = {k: jnp.asarray(v, dtype) for k, v in arrays.items() if k != "x0"}
    if prob.k is None:
        return ja.SelfAttentionDynamics(a["P"], a["U"], causal=prob.causal, precision=precision)
    return ja.SelfAttentionDynamics.from_factors(a["Q"], a["K"], a["U"], causal=prob.causal,
                                                 precision=precision)


def curve(name, prob, arrays, dtype, precision="float32") -> np.ndarray:
    """The misalignment after every layer, `(batch, layers + 1)`, computed in `dtype`
    (float64 turns x64 on for the run; float32 runs with it off, so that nothing is
    promoted)."""
    layers, tau = CASES[name]
    with jax.enable_x64(dtype == jnp.float64):
        dyn = dynamics(prob, arrays, dtype, precision)
        x0 = jnp.asarray(arrays["x0"], dtype)
        E = ja.run_layers(dyn, x0, layers, tau, observe=ja.misalignment)
        assert E.dtype == dtype, E.dtype
        return np.asarray(E, np.float64)


def errors(name, prob) -> dict[str, tuple[float, float]]:
    """`(max |ΔE| over the curve, max |ΔE| at the last layer)` per mode, and the
    reference's mean final `E` under `"float64"`."""
    arrays = prob.arrays()
    ref = curve(name, prob, arrays, jnp.float64)
    out = {"float64": (float(ref[:, -1].mean()), float("nan"))}
    for mode in ja.PRECISIONS:
        gap = np.abs(curve(name, prob, arrays, jnp.float32, mode) - ref)
        out[mode] = (float(gap.max()), float(gap[:, -1].max()))
    return out


def table(results: dict[str, dict], cases: dict) -> str:
    device = f"{jax.default_backend()} ({jax.devices()[0].device_kind})"
    tf32 = "TF32 dot algorithm" if jax.default_backend() == "gpu" else "emulated"
    lines = [f"max |E_mode − E_float64| over the misalignment curve (at the last layer); {device}",
             "| mode | " + " | ".join(
                 f"{name}: n={c.n}, d={c.d}, h={c.h}{'' if c.k is None else f', k={c.k}'}, "
                 f"batch {c.batch}, {CASES[name][0]} layers" for name, c in cases.items()) + " |",
             "|---|" + "---|" * len(cases)]
    for mode in ja.PRECISIONS:
        label = f"{mode} ({tf32})" if mode == "tensorfloat32" else mode
        cells = [f"{results[name][mode][0]:.1e} ({results[name][mode][1]:.1e})"
                 for name in cases]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("| mean final E (float64) | " + " | ".join(
        f"{results[name]['float64'][0]:.2e}" for name in cases) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    s2, s3 = (SIZES[name] for name in case_names(["S2", "S3"]))
    parser.add_argument("--batch-s2", type=int, default=s2.batch, help="sequences of S2")
    parser.add_argument("--batch-s3", type=int, default=s3.batch, help="sequences of S3")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    args = parser.parse_args()
    batch = {"S2": args.batch_s2, "S3": args.batch_s3}
    cases = {label: dataclasses.replace(SIZES[name], batch=batch[label])
             for label, name in zip(args.cases, case_names(args.cases))}
    results = {}
    for name, prob in cases.items():
        results[name] = errors(name, prob)
        print(f"{name} done", flush=True)
    print(table(results, cases))


if __name__ == "__main__":
    main()
