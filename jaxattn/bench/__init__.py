"""The benchmark suite behind `jaxattn bench`: an application above the library, like
`jaxattn.experiments` and `jaxattn.sweep`; nothing in the library imports it.

`suite` (the cases, `run_suite`, `PRESETS`), `cases` (the problems and their sizes),
`device` (the device, the PyTorch side, peaks, bandwidth), `timing`, `table`
(`format_table`), `floors` (the exp rate in registers), `agreement` (two float32
runs judged in law against float64), `scaling` (`run_scaling`, `write_figure`).
`reference_torch` and `loop_vs_hf` import torch (and transformers) at the top, so the
suite imports them only when a case needs them, and skips those comparisons without.
"""
