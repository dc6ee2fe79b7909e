"""The energy staircase of Geshkovski, Koubbi, Polyanskiy, Rigollet (2024), their script
against jaxattn, side by side at the script's own setting (n = 5 on the circle,
β = 2000, its initial angles, its step `lr = 10e-6` of rescaled time, its snapping).

Their repository (github.com/HugoKoubbi/2024-transformers-dotm) states no license, so
its `staircase.py` is not copied here: pass its path. The functions the figure's loop
calls (`grad_USA`, `energy_softmax`, `time_rescale_3`, the last definition of that
name) are read from it unmodified; only the step count is this script's `--steps`.
jaxattn runs the same steps with `jaxattn.experiments.long_time.rescaled_euler` on a
the `usa` flow's angular velocity. Prints both energies' largest difference and both times.

    python benchmarks/metastability_vs_dotm.py PATH/TO/staircase.py --steps 10000
"""

import argparse
import ast
import time

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402

from jaxattn.experiments.long_time import rescaled_euler  # noqa: E402

NAMES = ("grad_USA", "energy_softmax", "time_rescale_3")


def their_functions(path: str) -> dict:
    """The script's functions of `NAMES`, each its last definition, run as written."""
    namespace = {"np": np}
    for node in ast.parse(open(path).read()).body:
        if isinstance(node, ast.FunctionDef) and node.name in NAMES:
            exec(compile(ast.Module([node], []), path, "exec"), namespace)
    return namespace


def their_angles(beta: float) -> np.ndarray:
    """The script's `theta0`."""
    s = np.log(beta) / beta ** (1 / 2)
    return 0.5 * np.array([0, (0.5 * s) % np.pi, (2 * s) % np.pi, (4 * s) % np.pi,
                           (7 * s) % np.pi])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("script", help="the path of their staircase.py")
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--beta", type=float, default=2000.0)
    parser.add_argument("--lr", type=float, default=10e-6)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    theirs = their_functions(args.script)
    theta0 = their_angles(args.beta)

    t0 = time.perf_counter()
    _, E_theirs = theirs["time_rescale_3"](theta0.copy(), args.lr, args.beta, args.steps)
    their_s = time.perf_counter() - t0

    run = jax.jit(lambda th: rescaled_euler(th, args.beta, args.lr, args.steps))
    theta = jnp.asarray(theta0)
    t0 = time.perf_counter()
    jax.block_until_ready(run(theta))
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        E_ours = jax.block_until_ready(run(theta))
        times.append(time.perf_counter() - t0)
    ours_s = min(times)
    diff = np.max(np.abs(np.asarray(E_ours) - np.asarray(E_theirs)))
    print(f"n = 5, β = {args.beta:g}, lr = {args.lr:g}, {args.steps} steps; energy "
          f"{E_theirs[0]:.6f} → {E_theirs[-1]:.6f}")
    print(f"max |E_jaxattn − E_theirs| = {diff:.3g}")
    print(f"their loop: {their_s:.3f} s; jaxattn: {ours_s:.4f} s (best of {args.repeats}, "
          f"compile {compile_s:.2f} s); ratio {their_s / ours_s:.0f}×")


if __name__ == "__main__":
    main()
