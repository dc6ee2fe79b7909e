"""The process a run lives in: XLA's deterministic flags (`determinism.py`), the
persistent compilation cache (`cache.py`) and the other processes of a distributed run
(`distributed.py`). Importing this folder imports no JAX: the CLI reads the first two
before JAX starts."""
