"""The Pallas kernels of the core: whole ensemble runs in one kernel
(`ensemble.py`: `strategy="kernel"`, evaluated on lanes by `lanes.py`) and
mean-field attention as flash kernels (`flash.py`, taken by `_blocks` on CUDA), both
through one `pallas_call` (`call.py`: Triton on CUDA, interpret mode elsewhere). Pallas
itself is imported on a kernel's first use."""

from .ensemble import KernelConfig as KernelConfig
from .ensemble import kernel_config as kernel_config
from .ensemble import key_rows as key_rows
from .ensemble import run_ensemble as run_ensemble
from .ensemble import use_kernel_config as use_kernel_config
