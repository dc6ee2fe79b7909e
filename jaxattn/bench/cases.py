"""The benchmark suite's cases: each problem (weights and initial tokens, float32), the
cases named by what they measure with their short labels, and their sizes."""

import dataclasses

import jax.numpy as jnp
import numpy as np

from .._dynamics import SelfAttentionDynamics
from .device import TorchSide


def flops_raw_update(n: int, d: int, h: int, k: int | None = None) -> float:
    """Floating-point operations of one evaluation of `v` for one sequence."""
    if k is None:
        return 4 * h * n * d * d + 4 * h * n * n * d
    return 4 * h * n * k * d + 2 * h * n * n * k + 2 * h * n * n * d + 2 * h * n * d * d


@dataclasses.dataclass
class Problem:
    """One benchmark problem: weights and a batch of initial tokens, in float32."""

    n: int
    d: int
    h: int
    batch: int
    causal: bool
    k: int | None = None
    seed: int = 0

    def arrays(self) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(self.seed)
        f32 = np.float32
        out = {"U": (rng.standard_normal((self.h, self.d, self.d)) / np.sqrt(self.d)).astype(f32)}
        if self.k is None:
            out["P"] = (rng.standard_normal((self.h, self.d, self.d)) / self.d).astype(f32)
        else:
            scale = 1 / np.sqrt(self.d)
            out["Q"] = (scale * rng.standard_normal((self.h, self.k, self.d))).astype(f32)
            out["K"] = (scale * rng.standard_normal((self.h, self.k, self.d))).astype(f32)
        x0 = rng.standard_normal((self.batch, self.n, self.d)).astype(f32)
        out["x0"] = x0 / np.linalg.norm(x0, axis=-1, keepdims=True)
        return out

    def dynamics(self, arrays, precision: str = "float32") -> SelfAttentionDynamics:
        U = jnp.asarray(arrays["U"])
        if self.k is None:
            return SelfAttentionDynamics(jnp.asarray(arrays["P"]), U, causal=self.causal,
                                         precision=precision)
        Q, K = jnp.asarray(arrays["Q"]), jnp.asarray(arrays["K"])
        return SelfAttentionDynamics.from_factors(Q, K, U, causal=self.causal,
                                                  precision=precision)

    def torch_args(self, arrays, side: TorchSide):
        """`(x0, Q, K or P, U)` as tensors on the PyTorch side's device."""
        t = {k: side.tensor(v) for k, v in arrays.items()}
        return t["x0"], t.get("Q"), t["K"] if self.k is not None else t["P"], t["U"]

    def flops(self) -> float:
        return self.batch * flops_raw_update(self.n, self.d, self.h, self.k)


#: The suite's cases in the order they run, each named by what it measures, with the
#: short label its rows carry (`case` in the JSON and the table, BENCHMARKS.md's
#: names); `run_suite(cases=)` and `jaxattn bench --cases` take either.
CASES = {
    "peak": "peak",
    "small_systems": "S1",
    "small_systems_large_batch": "S1L",
    "noisy_small_systems": "SN",
    "paper_causal": "S2",
    "gpt2_sized": "S3",
    "gradient": "G",
    "meanfield": "MF",
    "looped_models": "S4",
}
#: The cases' short labels (`CASES`' values), in the order they run.
ALL_CASES = tuple(CASES.values())

SIZES = {
    # the default sizes, as in the benchmark issue; QUICK shrinks, LARGE fills a GPU.
    "small_systems": Problem(n=10, d=3, h=2, batch=1000, causal=False),
    "small_systems_large_batch": Problem(n=10, d=3, h=2, batch=100_000, causal=False),
    "noisy_small_systems": Problem(n=10, d=3, h=2, batch=1000, causal=False),
    "paper_causal": Problem(n=50, d=500, h=2, batch=16, causal=True),
    "gpt2_sized": Problem(n=200, d=768, h=12, batch=8, causal=False, k=64),
    "meanfield": Problem(n=100_000, d=3, h=1, batch=1, causal=False),
}
QUICK = {
    "small_systems": Problem(n=10, d=3, h=2, batch=64, causal=False),
    "small_systems_large_batch": Problem(n=10, d=3, h=2, batch=2000, causal=False),
    "noisy_small_systems": Problem(n=10, d=3, h=2, batch=64, causal=False),
    "paper_causal": Problem(n=20, d=64, h=2, batch=4, causal=True),
    "gpt2_sized": Problem(n=32, d=96, h=4, batch=2, causal=False, k=24),
    "meanfield": Problem(n=10_000, d=3, h=1, batch=1, causal=False),
}
LARGE = {
    "small_systems": dataclasses.replace(SIZES["small_systems"], batch=100_000),
    "small_systems_large_batch": dataclasses.replace(SIZES["small_systems"], batch=1_000_000),
    "noisy_small_systems": SIZES["noisy_small_systems"],
    "paper_causal": dataclasses.replace(SIZES["paper_causal"], batch=1024),
    "gpt2_sized": dataclasses.replace(SIZES["gpt2_sized"], batch=256),
    "meanfield": dataclasses.replace(SIZES["meanfield"], n=1_000_000),
}


def case_names(cases) -> tuple[str, ...]:
    """`cases`, each a name or a short label of `CASES`, as names; a `ValueError`
    for any other."""
    names = {label: name for name, label in CASES.items()} | {name: name for name in CASES}
    unknown = [c for c in cases if c not in names]
    if unknown:
        raise ValueError(f"unknown case(s) {unknown}; choose from {list(ALL_CASES)} "
                         f"(or their names {list(CASES)}).")
    return tuple(names[c] for c in cases)
