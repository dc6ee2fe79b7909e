"""Seconds per pass of the looped-model protocol, jaxattn against HuggingFace.

The HuggingFace PyTorch blocks looped by hand (paper 001 §6.2,
`jaxattn.bench.loop_vs_hf`): one JSON line per model and variant as it is measured,
then a table. Measurements: BENCHMARKS.md.

    .venv/bin/python benchmarks/loop_vs_hf.py                       # 100 × 200, both models
    .venv/bin/python benchmarks/loop_vs_hf.py --prompts 8 --tokens 64 --repeats 1   # quick
"""

import argparse
import json

import jax
import numpy as np
import torch
import transformers as tf

from jaxattn import PRECISIONS
from jaxattn.bench.device import TorchSide, device_label
from jaxattn.bench.loop_vs_hf import CONFIGS, bench_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--prompts", type=int, default=100)
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--passes", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--budget-s", type=float, default=float("inf"),
                   help="no further pair that would take a variant's pairs past 2× this")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="compute dtype of both sides (reduced precisions: float32 "
                        "accumulation in jaxattn)")
    p.add_argument("--variants", nargs="+", default=["attn", "full"], choices=["attn", "full"])
    p.add_argument("--precision", default="float32", choices=list(PRECISIONS),
                   help="jaxattn's matrix products (torch's float32 matmul mode matched on a GPU)")
    p.add_argument("--chunk", type=int, default=None,
                   help="jaxattn prompts per block call (default: jm.loop's; 0: all at once)")
    p.add_argument("--json", help="also write the rows to this file")
    args = p.parse_args()
    side = TorchSide.choose(torch, args.precision)
    print(f"jax {jax.__version__} ({device_label()}), torch {torch.__version__} on "
          f"{side.device} ({torch.get_num_threads()} threads), transformers {tf.__version__}",
          flush=True)
    rng = np.random.default_rng(args.seed)
    log = lambda line: print(line, flush=True)  # noqa: E731
    rows = [r for name in args.models for r in bench_model(name, args, rng, log)]
    print(f"\n{'model':<14}{'variant':<8}{'jaxattn s/pass':>16}{'HF s/pass':>12}{'speed-up':>10}"
          f"{'max rel ΔE':>12}")
    for r in rows:
        print(f"{r['model']:<14}{r['variant']:<8}{r['jax_s_per_pass']['median']:>16.2f}"
              f"{r['hf_s_per_pass']['median']:>12.2f}{r['speedup']:>9.2f}×"
              f"{r['max_rel_diff_E']:>12.1e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)



if __name__ == "__main__":
    main()
