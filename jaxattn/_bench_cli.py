"""`jaxattn bench`: run the benchmark suite, print its table, save it as JSON."""

import argparse
from pathlib import Path

from ._cli import CLIError
from ._runs import write_json


def _bench(args: argparse.Namespace) -> int:
    from . import _bench

    cases = args.cases or list(_bench.ALL_CASES)
    unknown = sorted(set(cases) - set(_bench.ALL_CASES))
    if unknown:
        raise CLIError(f"unknown case(s) {unknown}; choose from {list(_bench.ALL_CASES)}.")
    if args.repeats < 1:
        raise CLIError("--repeats must be ≥ 1.")
    out = Path(args.out)
    if out.parent and not out.parent.exists():
        raise CLIError(f"cannot write {out}: folder {out.parent} does not exist.")
    result = _bench.run_suite(quick=args.quick, repeats=args.repeats, cases=cases,
                              torch=not args.no_torch, progress=lambda m: print(f"· {m}"))
    print(_bench.format_table(result))
    write_json(out, result)
    print(f"wrote {out}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("bench", help="run the benchmark suite (table + JSON)")
    p.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per figure (default 5)")
    p.add_argument("--cases", nargs="+", metavar="CASE",
                   help="subset of: peak S1 S2 S3 G S4 (default: all)")
    p.add_argument("--no-torch", action="store_true", help="skip the PyTorch references")
    p.add_argument("--out", default="bench.json", help="JSON file (default bench.json)")
    p.set_defaults(func=_bench)
