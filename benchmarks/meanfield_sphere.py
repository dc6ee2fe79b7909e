"""One solve of the mean-field equation on S² (`ja.meanfield.Sphere`) to `t = T`:
compile once, then time repeated solves (wall clock and this process's CPU time).

    .venv/bin/python benchmarks/meanfield_sphere.py --degree 64 --horizon 10
"""

import argparse
import resource
import time

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

import jaxattn as ja  # noqa: E402
from jaxattn.theory import noisy_threshold  # noqa: E402


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--degree", type=int, default=64)
    parser.add_argument("--horizon", type=float, default=10.0)
    parser.add_argument("--beta", type=float, default=2.0)
    parser.add_argument("--ratio", type=float, default=1.2, help="K / K_#")
    parser.add_argument("--dt0", type=float, default=None)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    mf = ja.meanfield
    grid = mf.Sphere(args.degree)
    mu0 = mf.uniform(grid) * (1 + 0.5 * grid.points[..., 0])
    ts = np.linspace(0.0, args.horizon, 11)
    options = {} if args.dt0 is None else {"dt0": args.dt0}
    k = args.ratio * noisy_threshold(args.beta, 3)

    def run():
        return mf.solve(grid, mu0, ts, beta=args.beta, coupling=k, **options).block_until_ready()

    w, c = time.perf_counter(), cpu()
    mus = run()
    print(f"first call (compile + run): wall {time.perf_counter() - w:.1f} s, "
          f"cpu {cpu() - c:.1f} s")
    for _ in range(args.repeats):
        w, c = time.perf_counter(), cpu()
        mus = run()
        print(f"solve: wall {time.perf_counter() - w:.2f} s, cpu {cpu() - c:.2f} s")
    print(f"grid {grid.shape}, r(T) = {float(mf.order_parameter(grid, mus[-1])):.6f}, "
          f"min density {float(mus.min()):.3g}")


if __name__ == "__main__":
    main()
