"""The `jaxattn` command line.

Each command lives in its own module with a `register(subparsers)` function that
adds its parser and sets `func`; `main` lists them in `_COMMAND_MODULES`. A
command returns an exit code; user mistakes raise `CLIError` (or `ValueError`)
and are printed as one line with exit status 2.
"""

import argparse
import importlib
import sys
from pathlib import Path

from ._runs import RunFolderError

# Modules (relative to this package) with a `register(subparsers)` function.
_COMMAND_MODULES = ["._cli", ".models._cli", "._experiments_cli", "._bench_cli", "._sweep_cli"]


class CLIError(Exception):
    """A mistake in the command line: printed as one line, exit status 2."""


def _printable(text: str) -> str:
    """`text` with control characters escaped, so that an error stays one line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


class _OneLineParser(argparse.ArgumentParser):
    """argparse's mistakes (a bad flag, a missing argument) as a one-line `CLIError`
    instead of the usage text; `--help` still prints the full usage."""

    def error(self, message):
        raise CLIError(f"{self.prog}: error: {message} (see `{self.prog} --help`)")


def _demo(args: argparse.Namespace) -> int:
    import jax
    import jax.numpy as jnp

    from . import _paper
    from ._flow import solve_flow
    from ._manifold import manifold_drift
    from ._metrics import misalignment
    from ._plot import save_sphere_figure

    if args.tokens < 1 or not args.horizon > 0:
        raise CLIError("--tokens must be ≥ 1 and --horizon > 0.")
    key_model, key_x = jax.random.split(jax.random.PRNGKey(args.seed))
    dyn = _paper.sphere_dynamics(key_model)
    x0 = _paper.hemisphere_tokens(key_x, args.tokens, 3)
    ts = jnp.linspace(0.0, args.horizon, 401)
    ys = solve_flow(dyn, x0, ts)
    E = misalignment(ys)
    print(f"jaxattn demo: {args.tokens} tokens on S², 2 heads, time-varying P_η(t) "
          f"(paper 001 §6.1.1), seed {args.seed}")
    print(f"{'t':>8}  {'E(t)':>11}")
    for i in range(0, len(ts), 40):
        print(f"{float(ts[i]):8.2f}  {float(E[i]):11.3e}")
    print(f"max drift from the sphere: {float(manifold_drift(ys)):.2e}")
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CLIError(f"cannot write to {out}: {e.strerror or e}") from e
    path = save_sphere_figure(ys, ts, E, out / "demo_sphere.png")
    print(f"wrote {path}")
    return 0


def register(sub) -> None:
    demo = sub.add_parser("demo", help="10 tokens on S² under 2 time-varying heads")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--tokens", type=int, default=10)
    demo.add_argument("--horizon", type=float, default=10.0)
    demo.add_argument("--out", default="runs", help="folder for the figure (default: runs)")
    demo.set_defaults(func=_demo)


def _parser() -> argparse.ArgumentParser:
    p = _OneLineParser(
        prog="jaxattn", description="The consensus dynamics of self-attention, in JAX."
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND",
                           parser_class=_OneLineParser)
    for name in _COMMAND_MODULES:
        importlib.import_module(name, __package__).register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except CLIError as e:
        print(_printable(e), file=sys.stderr)
        return 2
    try:
        return args.func(args)
    except (CLIError, RunFolderError, ValueError, FileNotFoundError) as e:
        print(f"jaxattn {args.command}: error: {_printable(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"jaxattn {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
