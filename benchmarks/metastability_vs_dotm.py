"""The energy staircase of Geshkovski, Koubbi, Polyanskiy, Rigollet (2024), their script
against jaxattn, side by side at the script's own setting (n = 5 on the circle,
β = 2000, its initial angles, its step `lr = 10e-6` of rescaled time, its snapping).

Their repository (github.com/HugoKoubbi/2024-transformers-dotm) states no license, so
its `staircase.py` is not copied here: pass its path. The functions the figure's loop
calls (`grad_USA`, `energy_softmax`, `time_rescale_3`, the last definition of that
name) are read from it unmodified, and so are its settings `beta`, `theta0` and `lr`
(their module-level assignments, evaluated as written: the angles are built from its
`beta = 2000`); only the step count is this script's `--steps`. jaxattn runs the
same steps with `jaxattn.experiments.long_time.rescaled_euler` on the `usa` flow's
angular velocity. `--beta` runs both at another β from the same (β = 2000) angles.

Once every angle has merged, the gradient is 0 and both schemes divide 0 by 0: their
energies turn NaN. The comparison is NaN-aware: the steps where each is NaN must be
the same, and the largest difference is taken over the steps where both are finite.
Prints both energies' largest difference, the NaN steps and both times.

    python benchmarks/metastability_vs_dotm.py PATH/TO/staircase.py --steps 20000
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
SETTINGS = ("beta", "theta0", "lr")


def their_script(path: str) -> tuple[dict, dict]:
    """The script's functions of `NAMES` (each its last definition) and its settings
    `SETTINGS` (their last module-level assignments, evaluated in order with numpy),
    run as written."""
    namespace, settings = {"np": np}, {"np": np}
    for node in ast.parse(open(path).read()).body:
        if isinstance(node, ast.FunctionDef) and node.name in NAMES:
            exec(compile(ast.Module([node], []), path, "exec"), namespace)
        elif isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] \
                in ([name] for name in SETTINGS):
            exec(compile(ast.Module([node], []), path, "exec"), settings)
    missing = [name for name in NAMES if name not in namespace] + [
        name for name in SETTINGS if name not in settings]
    if missing:
        raise SystemExit(f"{path} defines no {', '.join(missing)}: not their staircase.py?")
    return namespace, {name: settings[name] for name in SETTINGS}


def compare(ours: np.ndarray, theirs: np.ndarray) -> dict:
    """NaN-aware: whether both energies are NaN at the same steps, the first NaN step
    of each (`None`: none), and the largest difference over the steps where both are
    finite (with their number)."""
    ours, theirs = np.asarray(ours, float), np.asarray(theirs, float)
    nan_ours, nan_theirs = np.isnan(ours), np.isnan(theirs)
    both = ~nan_ours & ~nan_theirs

    def first(mask):
        return int(np.argmax(mask)) if mask.any() else None

    diff = np.abs(ours[both] - theirs[both])
    return {"same_nan": bool(np.array_equal(nan_ours, nan_theirs)),
            "first_nan_ours": first(nan_ours), "first_nan_theirs": first(nan_theirs),
            "finite": int(both.sum()), "max_diff": float(diff.max()) if diff.size else np.nan}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("script", help="the path of their staircase.py")
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--beta", type=float, default=None,
                        help="β of both runs (default: the script's own, 2000); the angles "
                             "stay the script's")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    theirs, setting = their_script(args.script)
    beta = setting["beta"] if args.beta is None else args.beta
    lr, theta0 = setting["lr"], np.asarray(setting["theta0"], float)

    t0 = time.perf_counter()
    _, E_theirs = theirs["time_rescale_3"](theta0.copy(), lr, beta, args.steps)
    their_s = time.perf_counter() - t0

    run = jax.jit(lambda th: rescaled_euler(th, beta, lr, args.steps))
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
    c = compare(np.asarray(E_ours), np.asarray(E_theirs))
    last = np.asarray(E_theirs)[: c["first_nan_theirs"]][-1] if c["finite"] else np.nan
    print(f"n = {len(theta0)}, β = {beta:g} (angles: the script's, from its β = "
          f"{setting['beta']:g}), lr = {lr:g}, {args.steps} steps; energy "
          f"{E_theirs[0]:.6f} → {last:.6f}")
    nan = ("no NaN" if c["first_nan_theirs"] is None and c["first_nan_ours"] is None else
           f"NaN from step {c['first_nan_theirs']} (theirs) and {c['first_nan_ours']} "
           f"(jaxattn): {'the same steps' if c['same_nan'] else 'NOT the same steps'}")
    print(f"max |E_jaxattn − E_theirs| = {c['max_diff']:.3g} over the {c['finite']} steps "
          f"where both are finite; {nan}")
    print(f"their loop: {their_s:.3f} s; jaxattn: {ours_s:.4f} s (best of {args.repeats}, "
          f"compile {compile_s:.2f} s); ratio {their_s / ours_s:.0f}×")
    if not c["same_nan"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
