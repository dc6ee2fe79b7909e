"""Seconds per pass and peak memory of `ja.models.loop` on SmolLM2-135M at long
context, attention in key blocks or dense: one configuration per process (peak RSS
is the process's), e.g. `python benchmarks/models_long_context.py 8192 blocked 1`."""

import resource
import sys
import time

import jax
import numpy as np

import jaxattn as ja
from jaxattn.models._arch import _nn


def main(n: int, path: str, passes: int) -> None:
    if path == "dense":
        _nn.DENSE_LIMIT = 2**62
    model = ja.models.load("SmolLM2-135M-Instruct")
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, (1, n))
    run = lambda: ja.models.loop(model, ids, passes=passes, progress=False)  # noqa: E731
    jax.block_until_ready(run())  # compile
    t = time.perf_counter()
    jax.block_until_ready(run())
    seconds = (time.perf_counter() - t) / passes
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB → GiB
    print(f"| {n} | {path} | {passes} | {seconds:.2f} | {peak:.1f} | {jax.devices()[0]} |")


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
