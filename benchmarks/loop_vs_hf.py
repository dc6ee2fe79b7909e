"""Seconds per pass of the looped-model protocol, jaxattn against HuggingFace: a thin
script over `jaxattn.bench.loop_vs_hf` (`--help` for the options)."""

from jaxattn.bench.loop_vs_hf import main

if __name__ == "__main__":
    main()
