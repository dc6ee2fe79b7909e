"""`ja.models.loop`'s first call in a process with a warm cache, against its compiled
call (BENCHMARKS.md, "Warm starts"): a 4-block GPT-2 of width 128 (random weights;
`--width` for another), 8 prompts × 32 tokens, 20 passes. Each process enables one
cache folder, calls `loop` three times and prints the wall and CPU seconds of each
call; the first process fills the folder, the others read it. `--tree A --tree B`
alternates processes importing jaxattn from two source trees (e.g. a `git worktree`
of an older commit), each with its own cache folder.

    python benchmarks/loop_warm_start.py [--processes 6] [--width 128] [--tree PATH ...]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[2])
import jax, numpy as np
import jaxattn as ja

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

ja.enable_cache(sys.argv[1])
width = int(sys.argv[3])
cfg = ja.models.TransformerConfig(model_type="gpt2", vocab_size=50257, hidden_size=width,
                                  num_layers=4, num_heads=4, intermediate_size=4 * width,
                                  max_positions=1024, norm_eps=1e-5, activation="gelu_new")
# Weights drawn with NumPy: no program compiled before the timed calls but loop's own.
shape = jax.eval_shape(lambda: ja.models.GPT2.init(cfg, jax.random.PRNGKey(0)))
rng = np.random.default_rng(0)
model = jax.tree.map(lambda s: jax.device_put(0.02 * rng.standard_normal(s.shape, s.dtype)),
                     shape)
ids = rng.integers(0, cfg.vocab_size, (8, 32))
out = {}
for call in ("first", "second", "third"):
    t, c = time.perf_counter(), cpu()
    jax.block_until_ready(ja.models.loop(model, ids, passes=20, progress=False))
    out[call] = (time.perf_counter() - t, cpu() - c)
print("LOOP " + json.dumps(out))
"""


def one(tree: str, cache: str, width: int) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, cache, tree, str(width)],
                          capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": tree})
    line = next((x for x in proc.stdout.splitlines() if x.startswith("LOOP ")), None)
    if line is None:
        raise RuntimeError(f"the child failed:\n{proc.stderr[-2000:]}")
    return json.loads(line.removeprefix("LOOP "))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=6)
    parser.add_argument("--width", type=int, default=128,
                        help="the GPT-2's width, a multiple of its 4 heads (default 128)")
    parser.add_argument("--tree", action="append", help="a source tree holding jaxattn/")
    args = parser.parse_args()
    if args.width < 4 or args.width % 4:
        parser.error(f"--width must be a positive multiple of 4, got {args.width}")
    trees = args.tree or [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
    print("| tree | process | first call s (CPU s) | second call s (CPU s) | CPU ratio |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as root:
        for k in range(args.processes + 1):
            for i, tree in enumerate(trees):
                r = one(tree, os.path.join(root, str(i)), args.width)
                (w1, c1), (w2, c2) = r["first"], r["second"]
                kind = "cold" if k == 0 else "warm"
                print(f"| {tree} | {kind} | {w1:.3f} ({c1:.3f}) | {w2:.3f} ({c2:.3f}) "
                      f"| {c1 / c2:.1f}× |", flush=True)


if __name__ == "__main__":
    main()
