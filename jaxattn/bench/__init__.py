"""The benchmark suite behind `jaxattn bench`: an application above the library, like
`jaxattn.experiments` and `jaxattn.sweep`; nothing in the library imports it. Its
modules: ARCHITECTURE.md. `reference_torch` and `loop_vs_hf` import torch, so the
suite imports them only when a case needs them, and skips those comparisons without.
"""
