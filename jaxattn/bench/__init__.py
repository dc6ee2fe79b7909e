"""The benchmark suite behind `jaxattn bench`: an application above the library,
like `jaxattn.experiments` and `jaxattn.sweep`; nothing in the library imports it.

- `suite.py`: the cases, named by what they measure (`CASES`: `small_systems`,
  `meanfield`, …, with the short labels S1–S4, S1L, SN, G and MF their rows carry),
  against PyTorch (SN against torchsde) on JAX's device, compiled ahead of time,
  with a per-figure time budget and size presets (`run_suite`, `PRESETS`).
- `device.py`: the device's name, where PyTorch runs (`TorchSide`), matmul peaks
  per precision and the copy bandwidth.
- `timing.py`: `Timing`, `Repeats`, ahead-of-time compilation (`compile_jax`).
- `table.py`: the suite's result as a text table (`format_table`).
- `agreement.py`: two float32 runs of many layers judged in law against float64
  (`agreement_in_law`, what `benchmarks/gpu_check.py` checks the kernel with).
- `scaling.py`: time of `run_layers` versus n, d, batch and devices
  (`run_scaling`, `write_figure`).
- `reference_torch.py`, `loop_vs_hf.py`: the PyTorch and HuggingFace references.
  They import torch (and transformers) at the top, so this package imports them
  only when a case needs them (`suite._reference`); the suite skips those
  comparisons without torch.
"""
