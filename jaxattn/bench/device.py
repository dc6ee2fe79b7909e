"""The device a benchmark runs on and what it can do, so that every figure compares
like with like: its name, where and at which matmul precision the PyTorch references
run (`TorchSide`), the matmul peaks per precision, the copy bandwidth and the rate of
`jnp.exp`. See BENCHMARKS.md ("The device-aware suite").
"""

import contextlib
import dataclasses
import math
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._precision import PRECISIONS, matmul, on_gpu
from .timing import Timing

# torch's float32 matmul modes that match jaxattn's precisions on a GPU ("medium"
# lets torch use bfloat16 products for float32 tensors).
TORCH_MATMUL = {"float32": "highest", "tensorfloat32": "high", "bfloat16": "medium"}


def device_label(device=None) -> str:
    """The device in words: `cpu (2 cores)`, `NVIDIA H100 80GB HBM3 (gpu)`."""
    device = device or jax.devices()[0]
    if device.platform == "cpu":
        return f"cpu ({os.cpu_count()} cores)"
    return f"{device.device_kind} ({device.platform})"


def device_meta() -> dict:
    """What the JSON records of the device: its name, kind, platform and count."""
    device = jax.devices()[0]
    return {"device": str(device), "device_kind": device.device_kind,
            "platform": device.platform, "device_label": device_label(device),
            "device_count": jax.device_count()}


@dataclasses.dataclass(frozen=True)
class TorchSide:
    """Where and how the PyTorch references run.

    - `torch`: the module; `device`: `"cuda"` or `"cpu"`.
    - `note`: why torch is not on JAX's device (empty when it is).
    - `precision`: the jaxattn precision its float32 products are matched to.
    """

    torch: Any
    device: str
    note: str
    precision: str = "float32"

    @classmethod
    def choose(cls, torch, precision: str = "float32") -> "TorchSide":
        """CUDA when JAX runs on a GPU and torch can reach one, with its float32
        matmul mode matched to `precision`; else the CPU, in true float32 (torch's
        CPU products have no TF32 mode to match)."""
        if not on_gpu():
            return cls(torch, "cpu", "")
        if torch.cuda.is_available():
            return cls(torch, "cuda", "", precision)
        return cls(torch, "cpu", "torch has no CUDA here: PyTorch runs on the CPU")

    @property
    def same_device(self) -> bool:
        """Whether torch runs on JAX's device (then ratios compare like with like)."""
        return self.device == ("cuda" if on_gpu() else "cpu")

    @contextlib.contextmanager
    def matmul_mode(self, precision: str | None = None):
        """torch's float32 matmul precision set to match `precision` (default: the
        side's), restored after."""
        before = self.torch.get_float32_matmul_precision()
        self.torch.set_float32_matmul_precision(TORCH_MATMUL[precision or self.precision])
        try:
            yield
        finally:
            self.torch.set_float32_matmul_precision(before)

    def tensor(self, array):
        """A NumPy array as a tensor on the side's device."""
        return self.torch.from_numpy(np.array(array)).to(self.device)

    def call(self, fn):
        """`fn` as a timed call: waits for the device to finish."""
        def run():
            out = fn()
            if self.device == "cuda":
                self.torch.cuda.synchronize()
            return out
        return run

    @staticmethod
    def numpy(tensor) -> np.ndarray:
        return tensor.detach().float().cpu().numpy()


def best_seconds(fn, *args, repeats: int, budget_s: float = math.inf) -> float:
    """The fastest of `repeats` calls (fewer past `budget_s`) of `jax.jit(fn)(*args)`,
    after one call that compiles it (and `Timing.run`'s untimed one)."""
    fn = jax.jit(fn)
    call = lambda: jax.block_until_ready(fn(*args))  # noqa: E731
    call()
    return Timing.of(call, repeats, budget_s).min


def _jax_peak(a, b, precision: str, repeats: int, budget_s: float) -> float:
    return best_seconds(lambda a, b: matmul(a, b, precision), jnp.asarray(a), jnp.asarray(b),
                        repeats=repeats, budget_s=budget_s)


def jax_matmul_peak(size: int, precision: str, repeats: int,
                    budget_s: float = math.inf) -> float:
    """GFLOP/s of JAX's best `size`² product at `precision` (JAX alone: what a case
    that needs the peak measures when the `peak` case did not run)."""
    a, b = _operands(size)
    return 2 * size**3 / _jax_peak(a, b, precision, repeats, budget_s) / 1e9


def exp_rate(count: int, repeats: int, sweeps: int = 1) -> float:
    """Exponentials per second of `jnp.exp` over a float32 array of `count` elements,
    `sweeps` times in one call (`x ← exp(−x)`), best of `repeats` calls after
    compilation. One sweep over a large array measures the memory as much as the
    exp units; many over an array that stays in cache measure the units alone."""
    x = jnp.linspace(0.0, 1.0, count, dtype=jnp.float32)
    seconds = best_seconds(lambda x: lax.fori_loop(0, sweeps, lambda _, y: jnp.exp(-y), x), x,
                           repeats=repeats)
    return count * sweeps / seconds


def _operands(size: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return tuple(rng.standard_normal((size, size), dtype=np.float32) for _ in range(2))


def matmul_peaks(size: int, repeats: int, side: TorchSide | None = None,
                 budget_s: float = math.inf) -> dict[str, dict | None]:
    """GFLOP/s of a `size`² product per precision on JAX's device.

    **Arguments:**

    - `size`: the matrix side; `repeats`, `budget_s`: as for every figure (the best
      call counts).
    - `side`: the PyTorch side, measured where it runs on JAX's device.

    **Returns:**

    `{precision: {"jax": GF, "torch": GF, ["numpy": GF,] "best": GF}}`; NumPy (host
    only) on a CPU device and for float32 only; `None` for `"tensorfloat32"` off
    the GPU (a CPU has no TF32 units: jaxattn only emulates its rounding there).
    """
    a, b = _operands(size)
    flops = 2 * size**3
    out: dict[str, dict | None] = {}
    for precision in PRECISIONS:
        if precision == "tensorfloat32" and not on_gpu():
            out[precision] = None
            continue
        seconds = {"jax": _jax_peak(a, b, precision, repeats, budget_s)}
        if side is not None and side.same_device:
            at, bt = side.tensor(a), side.tensor(b)
            if precision == "bfloat16":
                at, bt = at.bfloat16(), bt.bfloat16()
            with side.matmul_mode(precision):
                seconds["torch"] = Timing.of(side.call(lambda: at @ bt), repeats, budget_s).min
        if precision == "float32" and not on_gpu():
            seconds["numpy"] = Timing.of(lambda: a @ b, repeats, budget_s).min
        figures = {k: flops / s / 1e9 for k, s in seconds.items()}
        out[precision] = {**figures, "best": max(figures.values())}
    return out


def copy_bandwidth(nbytes: int, repeats: int, side: TorchSide | None = None) -> dict:
    """GB/s of a device-to-device copy of `nbytes` float32 bytes, counting the bytes
    read and written (`2 nbytes` per copy): JAX (`x + 1` into a new buffer) and,
    on the same device, torch (`y.copy_(x)`)."""
    count = nbytes // 4
    moved = 2 * 4 * count / 1e9
    out = {"bytes": 4 * count, "jax": moved / best_seconds(
        lambda x: x + 1, jnp.zeros((count,), jnp.float32), repeats=repeats)}
    if side is not None and side.same_device:
        xt = side.torch.zeros(count, dtype=side.torch.float32, device=side.device)
        yt = side.torch.empty_like(xt)
        out["torch"] = moved / Timing.of(side.call(lambda: yt.copy_(xt)), repeats).min
    return out


def peak_of(peaks: dict | None, precision: str) -> float:
    """The best GFLOP/s measured at `precision`, NaN when not measured or not
    applicable (then no `%peak` is reported)."""
    figures = (peaks or {}).get(precision)
    return figures["best"] if figures else math.nan
