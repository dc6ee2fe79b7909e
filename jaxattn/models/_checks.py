"""Checks of the models' entry points, and when they show a progress bar."""

import math

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int

from .._validate import refuse_first, too_big
from ._arch import AbstractTransformer


def check_model(model) -> None:
    refuse_first([(not isinstance(model, AbstractTransformer), TypeError, "expected a model "
                   f"from ja.models.load / ja.models.init, got {type(model).__name__}.")])


def check_ids(model: AbstractTransformer, ids) -> Int[Array, "B n"]:
    """Token ids as an int32 `(B, n)` array; `ValueError` for a wrong shape or ids
    outside the vocabulary / position table."""
    arr = ids if isinstance(ids, jax.core.Tracer) else np.asarray(ids)
    cfg, shape = model.config, arr.shape
    n = shape[-1] if shape else 0
    integers = jnp.issubdtype(arr.dtype, jnp.integer)
    known = integers and isinstance(arr, np.ndarray) and arr.size > 0
    low, high = (arr.min(), arr.max()) if known else (0, 0)
    refuse_first((
        (not integers, TypeError, f"token ids must be integers, got dtype {arr.dtype}."),
        (arr.ndim not in (1, 2) or n < 1, ValueError,
         f"token ids must be (n,) or (B, n) with n ≥ 1, got shape {shape}."),
        (shape[:1] == (0,), ValueError,
         f"token ids must hold at least one prompt (B ≥ 1), got shape {shape}."),
        too_long(type(model), cfg, n),
        (low < 0 or high >= cfg.vocab_size, ValueError, f"token ids must lie in "
         f"[0, {cfg.vocab_size}) (the vocabulary), got [{low}, {high}]."),
    ))
    if isinstance(arr, np.ndarray):  # cast on the host: no program to trace and lower
        return jax.device_put(arr.astype(np.int32).reshape(-1, n))
    return jnp.asarray(arr, jnp.int32).reshape(-1, n)


def too_long(family: type[AbstractTransformer], cfg, n: int) -> tuple:
    """`refuse_first`'s row for `n` tokens past a model's learned positions."""
    return (family.bounded_positions and cfg.max_positions and n > cfg.max_positions,
            ValueError, f"{n} tokens exceed the model's {cfg.max_positions} learned positions: "
            f"give prompts of at most {cfg.max_positions} tokens (--tokens, or cut the ids).")


#: The hidden states a loop holds at its peak, per prompt: 4.0 measured (peak memory
#: grows 2.4 MB a prompt of 200 tokens of random GPT-2, `jaxattn loop --passes 1
#: --prompts` 500 → 2,000; one state is 0.61 MB).
HIDDEN_COPIES = 4
#: The largest count JAX's int32 indices reach (`--passes` beyond it is refused).
MAX_COUNT = 2**31 - 1


def loop_bytes(model: AbstractTransformer, prompts: int, tokens: int, passes: int,
               itemsize: int, saved: int = 0) -> float:
    """The bytes a loop holds at once, roughly (as `jaxattn loop` estimates them): the
    hidden states (`HIDDEN_COPIES` a prompt, in the compute dtype of `itemsize` bytes),
    `E` after every block (float32), the `saved` states and the int32 ids."""
    cfg = model.config
    tokens_all = float(prompts) * tokens
    return (tokens_all * cfg.hidden_size * (HIDDEN_COPIES * itemsize + 4 * saved)
            + 4.0 * prompts * (passes * model.num_layers + 1) + 4 * tokens_all)


def size_refusals(model: AbstractTransformer, shape: tuple, passes: int, itemsize: int,
                  saved: int = 0) -> tuple:
    """`refuse_first`'s rows for a loop of `passes` passes over ids of `shape` that
    cannot run: more passes than JAX counts, or more memory than the machine has;
    checked before the ids are read or any program is built."""
    prompts = math.prod(shape[:-1]) if len(shape) in (1, 2) else 0
    tokens = shape[-1] if shape else 0
    need = loop_bytes(model, prompts, tokens, passes, itemsize, saved)
    wrong, line = too_big(need, f"{prompts} prompts × {tokens} tokens, `passes` {passes} "
                          "(--prompts, --tokens, --passes): the loop's arrays need at least",
                          "choose fewer prompts, tokens or passes")
    return ((passes > MAX_COUNT, ValueError, f"`passes` (--passes) {passes} is more than "
             f"{MAX_COUNT} (JAX counts in int32); choose a smaller value."),
            (wrong, ValueError, line))


def depths_refusal(depths, passes: int, layers: int) -> tuple:
    """`refuse_first`'s entry for `save_states` depths outside a loop of `passes` passes
    of `layers` blocks."""
    total = passes * layers
    return (any(not 0 <= d <= total for d in depths), ValueError,
            f"`save_states` (--save-states) depths must lie in [0, {total}] (0: the "
            f"embeddings, {total}: after {passes} passes of {layers} blocks), got "
            f"{list(depths)}.")


CHUNK_TOKENS = 1024


def default_chunk(n: int, devices) -> int | None:
    """Prompts per chunk when `chunk=None`: on CPU, unsharded, about `CHUNK_TOKENS`
    tokens at a time (a block's activations stay in cache: BENCHMARKS.md, Measured
    claims behind design choices); elsewhere the whole batch at once."""
    if devices is not None or jax.default_backend() != "cpu":
        return None
    return max(1, CHUNK_TOKENS // n)


#: Multiply-adds above which `progress=None` shows a bar (seconds of work on a CPU
#: core: see BENCHMARKS.md, Measured claims behind design choices).
PROGRESS_WORK = 1e10
#: The most steps (segments of passes, groups of prompts) a progress bar is cut into.
MAX_SEGMENTS = 100


def loop_flops(model: AbstractTransformer, prompts: int, tokens: int, passes: int) -> float:
    """Multiply-adds of `passes` passes over `prompts × tokens` tokens, roughly: the
    projections, the scores and mixing, and the feed-forward sub-block of every block."""
    cfg = model.config
    d, inner = cfg.hidden_size, cfg.intermediate_size
    per_token = 4 * d * d + 2 * tokens * d + 3 * d * inner
    return float(prompts) * tokens * passes * model.num_layers * per_token


def show_progress(progress, amount: float, *inputs) -> bool:
    """Whether to show a bar: `progress` if given, else for `amount` of work above
    `PROGRESS_WORK`; never while tracing (a bar would count compilations)."""
    if any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(inputs)):
        return False
    if progress is None:
        return amount > PROGRESS_WORK
    if not isinstance(progress, (bool, np.bool_)):
        raise TypeError(f"`progress` must be True, False or None, got {progress!r}.")
    return bool(progress)


def check_dtype(dtype) -> jnp.dtype:
    """A floating compute dtype, or a one-line `ValueError`."""
    try:
        dtype = jnp.dtype(dtype)
    except TypeError:
        dtype = None
    if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
        problem = "`dtype` must be a floating dtype (jnp.float32, jnp.bfloat16 or jnp.float16)."
    elif dtype == jnp.float64 and not jax.config.read("jax_enable_x64"):
        problem = ("`dtype=float64` needs 64-bit JAX: "
                   "jax.config.update('jax_enable_x64', True) first.")
    else:
        return dtype
    raise ValueError(problem)
