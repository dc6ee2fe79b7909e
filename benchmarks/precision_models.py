"""The error each precision mode costs on a looped GPT-2, against a float64 run.

Random weights of the GPT-2 small config (HuggingFace's initialisation,
`ja.models.init("gpt2", key)`), `--prompts` × `--tokens` random ids, `--passes`
passes (`ja.models.loop`), pure attention ("attn") and full blocks ("full"). The
reference runs the same model in float64 (x64 on, `dtype=jnp.float64`: every
product, norm and `E` in float64); each mode runs in float32 compute with
`precision=` `"float32"` (true float32), `"tensorfloat32"` (on the CPU its
operand rounding is emulated with `lax.reduce_precision`) and `"bfloat16"`
(bfloat16 operands, float32 sums); the last row is bfloat16 *compute*
(`dtype=jnp.bfloat16`, not a precision mode) for comparison. Printed: the largest
`|E_mode − E_float64|` over prompts and depths, and at the end of the loop.

    .venv/bin/python benchmarks/precision_models.py [--prompts 8 --tokens 64 --passes 2]
"""

import argparse

import jax

jax.config.update("jax_enable_x64", True)  # before any array: the float64 reference

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxattn as ja  # noqa: E402

MODES = (  # (row label, precision, compute dtype)
    ("float32", "float32", jnp.float32),
    ("tensorfloat32", "tensorfloat32", jnp.float32),
    ("bfloat16", "bfloat16", jnp.float32),
    ("(dtype=bfloat16)", "float32", jnp.bfloat16),
)


def errors(model, ids, passes: int) -> dict[tuple[str, str], tuple[float, float]]:
    """`(max |ΔE|, max |ΔE| at the end)` per (mode, variant), and the reference's
    mean final `E` under `("float64", variant)`."""
    out = {}
    for variant, ffn in (("attn", False), ("full", True)):
        ref = np.asarray(ja.models.loop(model, ids, passes=passes, ffn=ffn, dtype=jnp.float64))
        out["float64", variant] = (float(ref[:, -1].mean()), 0.0)
        for label, precision, dtype in MODES:
            E = ja.models.loop(model, ids, passes=passes, ffn=ffn, dtype=dtype,
                               precision=precision)
            gap = np.abs(np.asarray(E, np.float64) - ref)
            out[label, variant] = (float(gap.max()), float(gap[:, -1].max()))
    return out


def table(results, args) -> str:
    head = (f"GPT-2 small config, random weights, {args.prompts} prompts × {args.tokens} "
            f"tokens, {args.passes} passes, {jax.default_backend()} "
            f"({jax.devices()[0].device_kind})")
    lines = [head, "max |E_mode − E_float64| over prompts and depths (at the last block)",
             f"{'mode':>18} | {'attention only':>22} | {'full blocks':>22}"]
    for label in [m[0] for m in MODES]:
        cells = [f"{results[label, v][0]:9.2e} ({results[label, v][1]:8.2e})"
                 for v in ("attn", "full")]
        lines.append(f"{label:>18} | {cells[0]:>22} | {cells[1]:>22}")
    means = [f"{results['float64', v][0]:.4f}" for v in ("attn", "full")]
    lines.append(f"{'mean final E (f64)':>18} | {means[0]:>22} | {means[1]:>22}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    model = ja.models.init("gpt2", jax.random.PRNGKey(args.seed))
    rng = np.random.default_rng(args.seed)
    ids = rng.integers(0, model.config.vocab_size, (args.prompts, args.tokens))
    print(table(errors(model, ids, args.passes), args))


if __name__ == "__main__":
    main()
