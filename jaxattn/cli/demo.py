"""`jaxattn demo`: 10 tokens on S² under two time-varying heads (paper 001 §6.1.1)."""

import argparse
import math
from pathlib import Path

from ._common import cannot_write_in, count_checks, refuse_first

#: The most tokens the demo takes: its flow and figure, 4 s at 1,000 tokens and 15 s at
#: 5,000 (2 cores, AMD EPYC), grow as n².
MAX_TOKENS = 10_000
#: The demo's figure, in its `--out` folder.
FIGURE = "demo_sphere.png"


def _demo(args: argparse.Namespace) -> int:
    out = Path(args.out)
    place = next(p for p in (out, *out.parents) if p.exists())  # what is there of it
    refuse_first([  # one token is consensus already: its E is 0 from the start
        (not args.out.strip(), "--out is empty; name the folder for the figure (e.g. "
                               "--out runs)."),  # not the current folder, as `run`'s
        *count_checks(args, {"--tokens": 2}),
        (args.tokens > MAX_TOKENS, f"--tokens {args.tokens}: the demo draws every token and "
         f"its time grows as n² (5,000 take 15 s); at most {MAX_TOKENS}. For more tokens: "
         "`jaxattn run thm41-sphere --tokens N`."),
        (not 0 < args.horizon < math.inf, f"--horizon must be finite and > 0, got "
                                           f"{args.horizon}."),
        (not place.is_dir(), f"--out {out}: {place} is a file, not a folder; choose "
                             "another --out."),
        (place.is_dir() and cannot_write_in(place), f"--out {out}: {place} is not "
         "writable; choose another --out."),
        ((out / FIGURE).is_dir(), f"--out {out}: {out / FIGURE} is a folder, where the demo "
         "writes its figure; choose another --out."),  # it failed after the work
    ])
    from .._artifacts.folders import RunFolderError, check_not_held, results_around

    check_not_held(place, writing=True)  # not into a folder a running command writes
    if (results := results_around(out)) is not None:  # as `run` and `sweep` refuse it
        inside = "" if results == out.absolute() else "inside "
        raise RunFolderError(f"--out {out} is {inside}the folder of another command's "
                             f"results ({results}), which the demo does not write into; "
                             "choose another --out.")
    import jax
    import jax.numpy as jnp

    from .._artifacts.figures import resolution, save_sphere_figure
    from .._flow import solve_flow
    from .._manifold import manifold_drift
    from .._validate import check_seed
    from ..bench.device import device_label
    from ..experiments import paper001 as paper
    from ..metrics import misalignment

    key_model, key_x = jax.random.split(jax.random.PRNGKey(check_seed(args.seed)))
    dyn = paper.sphere_dynamics(key_model)
    x0 = paper.hemisphere_tokens(key_x, args.tokens, 3)
    ts = jnp.linspace(0.0, args.horizon, 401)
    ys = solve_flow(dyn, x0, ts)
    E = misalignment(ys)
    out.mkdir(parents=True, exist_ok=True)  # the figure first: `| head` may close stdout
    path = save_sphere_figure(ys, ts, E, out / FIGURE)
    print(f"jaxattn demo: {args.tokens} tokens on S², 2 heads, time-varying P_η(t) "
          f"(paper 001 §6.1.1), seed {args.seed}")
    print(f"device: {device_label()}")
    floor = resolution(E.dtype)  # below it E is rounding noise of the tokens
    print(f"{'t':>8}  {'E(t)':>11}")
    for i in range(0, len(ts), 40):
        noise = " *" if float(E[i]) <= floor else ""
        print(f"{float(ts[i]):8.2f}  {float(E[i]):11.3e}{noise}")
    if bool(jnp.any(E[::40] <= floor)):
        print(f"* below the {E.dtype} resolution of E ({floor:.1e}): rounding noise, not data")
    print(f"max drift from the sphere: {float(manifold_drift(ys)):.2e}")
    print(f"wrote {path}")
    return 0


def register(sub) -> None:
    demo = sub.add_parser("demo", help="10 tokens on S² under 2 time-varying heads")
    demo.add_argument("--seed", type=int, default=0,
                      help="random seed of the tokens and the heads (default: 0)")
    demo.add_argument("--tokens", type=int, default=10,
                      help="number of tokens on the sphere (default: 10)")
    demo.add_argument("--horizon", type=float, default=10.0,
                      help="final time T of the flow (default: 10.0)")
    demo.add_argument("--out", default="runs", help="folder for the figure (default: runs)")
    demo.set_defaults(func=_demo)
