"""The circle's particle system two ways: `ja.solve_flow` (the pairwise sum, `O(n²)` per
step) against `ja.meanfield.circle_particles` (the field in Fourier modes, `O(n)`),
one sample of `jaxattn run mean-field`'s initial density flowed to `t = 1` (β = 1,
kernel exp, `rtol = 1e-9`, `atol = 1e-11`, float64). Each is compiled once, then timed
(wall clock and this process's CPU time); where both run, their largest difference.

    .venv/bin/python benchmarks/meanfield_particles.py --both 1000 10000 --fourier 100000 1000000
"""

import argparse
import resource
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402

import jaxattn as ja  # noqa: E402
from jaxattn.experiments.mean_field_equation import ATOL, RTOL, draw  # noqa: E402


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed(fn, x0):
    """`(result, wall, cpu)` of a second call (the first compiles)."""
    jax.block_until_ready(fn(x0))
    wall, used = time.perf_counter(), cpu()
    out = jax.block_until_ready(fn(x0))
    return out, time.perf_counter() - wall, cpu() - used


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--both", type=int, nargs="*", default=[1000, 10000])
    parser.add_argument("--fourier", type=int, nargs="*", default=[100000])
    parser.add_argument("--beta", type=float, default=1.0)
    args = parser.parse_args()
    ts = jnp.array([0.0, 1.0])
    eye = jnp.eye(2)[None]
    dyn = ja.SelfAttentionDynamics(eye, eye, beta=args.beta, kernel="exp")

    def pairwise(x):
        return ja.solve_flow(dyn, x, ts, rtol=RTOL, atol=ATOL)

    def fourier(x):
        return ja.meanfield.circle_particles(x, ts, beta=args.beta, kernel="exp", rtol=RTOL,
                                             atol=ATOL)

    print(f"modes kept at β = {args.beta:g}: {ja.meanfield.circle_modes(args.beta)}")
    print("| n | solve_flow wall (CPU) | circle_particles wall (CPU) | ratio | max difference |")
    print("|---|---|---|---|---|")
    for n in args.both + args.fourier:
        x0 = draw(n, jax.random.PRNGKey(n)[None])[0]
        b, wall_b, cpu_b = timed(fourier, x0)
        if n in args.both:
            a, wall_a, cpu_a = timed(pairwise, x0)
            gap = float(jnp.max(jnp.abs(a - b)))
            print(f"| {n:,} | {wall_a:.2f} s ({cpu_a:.2f} s) | {wall_b:.3f} s ({cpu_b:.3f} s) | "
                  f"{wall_a / wall_b:.0f} | {gap:.1e} |", flush=True)
        else:
            print(f"| {n:,} | — | {wall_b:.2f} s ({cpu_b:.2f} s) | | |", flush=True)


if __name__ == "__main__":
    main()
