"""`jaxattn bench`: run the benchmark suite (or, with `--scaling`, the scaling sweeps
of `bench.scaling`) on JAX's device, print its table, save it as JSON; the flags are
described in `register`."""

import argparse
from pathlib import Path

from ..experiments import declared
from ._common import count_checks, file_refusals, refuse_first

# Read from the source: `jaxattn bench --help` and its argument errors answer without
# loading JAX (the suite's modules import it).
#: The suite's cases by name → their short labels (`bench.cases.CASES`); `--cases` takes either.
CASES = declared("jaxattn.bench.cases", "CASES")
ALL_CASES = tuple(CASES.values())
PRESETS = declared("jaxattn.bench.suite", "PRESETS", keys=True)
PRECISIONS = declared("jaxattn._precision", "PRECISIONS")


def _bench(args: argparse.Namespace) -> int:
    cases = args.cases or list(ALL_CASES)
    unknown = sorted(set(cases) - set(ALL_CASES) - set(CASES))
    out = Path(args.out)
    only_scaling = args.scaling and not args.cases  # its sweeps: float32, own sizes, no budget
    refuse_first([
        (unknown, f"unknown case(s) {unknown}; choose from {list(ALL_CASES)} (or their "
                  f"names: {', '.join(CASES)})."),
        (args.budget is not None and not args.budget > 0, "--budget must be > 0 seconds."),
        (args.no_torch and {"S4", "looped_models"} & set(args.cases or ()),
         "S4 times jaxattn against HuggingFace, which needs torch: drop --no-torch or S4."),
        *((only_scaling and given, f"--scaling times run_layers in float32 at its own sizes, "
           f"every call: {flag} applies to the cases; drop it, or add --cases.")
          for flag, given in (("--precision", args.precision is not None),
                              ("--budget", args.budget is not None),
                              (f"--size {args.size}", args.size not in (None, "quick")))),
        (args.quick and args.size not in (None, "quick"),
         f"--quick and --size {args.size} disagree: give one of them."),
        *file_refusals(out, "bench.json"),
        *count_checks(args, {"--repeats": 1}),
    ])
    from .._artifacts.folders import write_json
    from ..bench import suite, table

    if args.cases or not args.scaling:
        result = suite.run_suite(quick=args.quick, size=args.size, repeats=args.repeats,
                                 budget_s=30.0 if args.budget is None else args.budget,
                                 cases=cases, torch=not args.no_torch,
                                 precision=args.precision or "float32",
                                 progress=lambda m: print(f"· {m}", flush=True))
        print(table.format_table(result))
        write_json(out, result)
        print(f"wrote {out}")
    if args.scaling:
        from ..bench import scaling

        result = scaling.run_scaling(quick=args.quick or args.size == "quick",
                                     repeats=args.repeats,
                                     progress=lambda m: print(f"· {m}", flush=True))
        print(scaling.format_summary(result))
        path = write_json(out.parent / "scaling.json", result)
        figures = scaling.write_figure(result, out.parent / "scaling")
        print(f"wrote {path}, " + ", ".join(map(str, figures)))
    return 0


def register(sub) -> None:
    p = sub.add_parser("bench", help="run the benchmark suite (table + JSON)")
    p.add_argument("--quick", action="store_true",
                   help="small sizes, for a smoke test (the same as --size quick)")
    p.add_argument("--size", choices=list(PRESETS), default=None,
                   help="default: the paper-sized cases (MF n = 100,000); large: sizes "
                        "that fill a GPU (S1 batch 100,000, S2 1024, S3 256, MF n = "
                        "1,000,000, S4 GPT-2 XL and GPT-Neo 2.7B)")
    p.add_argument("--precision", choices=list(PRECISIONS), default=None,
                   help="JAX's matrix products (default float32; PyTorch's float32 matmul "
                        "mode is matched on a GPU); recorded in the JSON")
    p.add_argument("--repeats", type=int, default=3, help="timed calls per figure (default 3)")
    p.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                   help="no call that would take a figure past this many seconds "
                        "(default 30; at least one call; the JSON records the count)")
    p.add_argument("--cases", nargs="+", metavar="CASE",
                   help="subset of: peak S1 S1L SN S2 S3 G MF S4, or their names (small_systems, "
                        "small_systems_large_batch, noisy_small_systems, paper_causal, "
                        "gpt2_sized, gradient, meanfield, looped_models; default: all; MF: one "
                        "layer and its gradient at mean-field scale against its floor; SN: "
                        "noisy S1 ensembles against torchsde)")
    p.add_argument("--no-torch", action="store_true", help="skip the PyTorch references")
    p.add_argument("--scaling", action="store_true",
                   help="time run_layers versus n, d, batch and devices instead of the cases "
                        "(after them if --cases is given); writes scaling.json and "
                        "scaling.png/.pdf beside --out")
    p.add_argument("--out", default="bench.json", help="JSON file (default bench.json)")
    p.set_defaults(func=_bench)
