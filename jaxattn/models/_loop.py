"""Running models: hidden states (HuggingFace's convention) and the looped-model
protocol of paper 001 §6.2 (docs/usage/models.md), both one compiled program scanned
over blocks; a long loop runs as segments of passes (`iterate_loop`), so that its
progress bar moves and `jaxattn loop` can save and resume it."""

import functools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int
from tqdm.auto import tqdm

from .._batch import as_mesh, shard_batch, unshard
from .._precision import Precision, check_precision
from .._programs import kept_jit
from .._validate import check_count, check_flag, refuse_first, surface_errors
from ..metrics import misalignment
from ._arch import AbstractTransformer
from ._arch._nn import accumulation_dtype, product
from ._checks import (
    MAX_SEGMENTS,
    check_dtype,
    check_ids,
    check_model,
    default_chunk,
    depths_refusal,
    loop_flops,
    show_progress,
    size_refusals,
)
from ._tokenize import is_int

WEIGHTS = ("trained", "random", "resample")


def _apply(model, block, x, layer, ctx, keys, chunk, **options):
    """One block on every prompt of `x (B, n, d)`, with the prompts' padding masks
    `keys (B, n)` (`None`: no padding, an empty tree to map over): vmapped over all
    of them, or `chunk` at a time."""

    def one(xk):
        return model.apply_block(block, xk[0], layer, ctx, keys=xk[1], **options)

    if chunk is None or chunk >= x.shape[0]:
        return jax.vmap(one)((x, keys))
    return jax.lax.map(one, (x, keys), batch_size=chunk)


def _forward(model, x, ctx, blocks, *, ffn: bool, precision: str, emit, keys=None):
    """Scan one sequence batch `x (B, n, d)` through every layer; `emit(x)` per layer."""

    def body(x, layer_slot):
        layer, slot = layer_slot
        block = jax.tree.map(lambda a: a[slot], blocks)
        x = _apply(model, block, x, layer, ctx, keys, None, ffn=ffn, precision=precision)
        return x, emit(x)

    return jax.lax.scan(body, x, (jnp.arange(model.num_layers), jnp.asarray(model.slots)))


@kept_jit
def _hidden_states(model, ids, ffn: bool, precision: str, keys=None):
    x = jax.vmap(lambda s: model.embed(s, precision=precision))(ids)
    last, xs = _forward(model, x, model.context(ids.shape[1], x.dtype), model.blocks, ffn=ffn,
                        precision=precision, emit=lambda x: x, keys=keys)
    xs = xs.at[-1].set(jax.vmap(model.final_norm)(last))
    return jnp.concatenate([x[None], xs]).swapaxes(0, 1)


def _call_sharded(fn, ids, devices, keys=None):
    """`fn(ids, keys)` with the prompts `(B, n)` and their padding masks (or `None`)
    sharded over `devices` (see `ja.run_layers`); padding rows are dropped from
    every output."""
    mesh = as_mesh(devices)
    if mesh is None:
        return fn(ids, keys)
    if keys is None:
        flat, size = shard_batch(ids, mesh, 1)
        return unshard(fn(flat, None), size, (size,))
    n = ids.shape[1]  # ids and masks sharded together, as one array
    flat, size = shard_batch(jnp.concatenate([ids, keys.astype(ids.dtype)], axis=1), mesh, 1)
    return unshard(fn(flat[:, :n], flat[:, n:].astype(bool)), size, (size,))


def check_mask(mask, ids) -> Bool[Array, "B n"] | None:
    """The padding mask of `loop`/`hidden_states`/`logits` as a boolean `(B, n)`
    array (`None` stays `None`), or a one-line error: the shape of the ids, booleans,
    each prompt's text first (at least one token) and its padding after it."""
    if mask is None:
        return None
    shape = np.shape(ids)
    what = f"`mask` must be booleans of the ids' shape {shape} (True: text, False: padding)"
    traced = isinstance(mask, jax.core.Tracer)
    try:
        arr = None if traced else np.asarray(mask)
    except (TypeError, ValueError):
        arr = None
    error = ValueError
    if arr is None or arr.dtype != np.bool_:
        error, problem = TypeError, (
            f"{what}, known before the call (not traced)." if traced else
            f"{what}, got {type(mask).__name__}." if arr is None else
            f"{what}, got dtype {arr.dtype}.")
    elif arr.shape != shape:
        problem = f"{what}, got shape {arr.shape}."
    else:
        rows = arr.reshape(-1, shape[-1])
        count = rows.sum(axis=1)
        bad = np.flatnonzero((count == 0) | (rows != (np.arange(rows.shape[1]) < count[:, None]))
                             .any(axis=1))
        if not bad.size:
            return jnp.asarray(rows)
        problem = (f"`mask` row {bad[0]}: each prompt's text comes first (at least one True) "
                   "and its padding after it (False), as ja.models.tokenize(…, pad=…, "
                   "return_mask=True) makes it.")
    raise error(problem)


@surface_errors
def hidden_states(
    model: AbstractTransformer, ids: Int[Array, "*B n"], *, ffn: bool = True, devices=None,
    precision: Precision = "float32", progress: bool | None = None,
    mask: Bool[Array, "*B n"] | None = None,
) -> Float[Array, "*B L+1 n d"]:
    """The hidden states after every block, as HuggingFace's `output_hidden_states`.

    Index 0 is the embedding output; index `l` the output of block `l`; the last one has
    the model's final norm applied (none for BERT/ALBERT), as HuggingFace returns it.

    **Arguments:**

    - `model`: from `ja.models.load` or `ja.models.init`.
    - `ids`: token ids `(n,)` or `(B, n)`.
    - `ffn`: `False` drops every block's feed-forward sub-block with its norm.
    - `devices`: shard the prompts over devices (as in `ja.run_layers`); results equal
      the unsharded run.
    - `precision`: of every matrix product: `"float32"` (default), `"tensorfloat32"` or
      `"bfloat16"` (docs/precision.md).
    - `progress`: a progress bar (`None`: for a big batch; `True`; `False`).
    - `mask`: the padding mask, as in `loop` (`True` for text): the text tokens' states
      equal those of the unpadded prompt. Default: every id is text.

    **Returns:**

    `(L + 1, n, d)`, or `(B, L + 1, n, d)` for a batch.
    """
    setup = setup_loop(model, ids, passes=1, ffn=ffn, precision=precision, mask=mask)
    batch, opts = setup.ids, setup.options
    B, n = batch.shape
    bar = show_progress(progress, loop_flops(model, B, n, 1), model, ids) and B > 1
    step = math.ceil(B / min(B, MAX_SEGMENTS)) if bar else B  # one group of prompts per step
    parts = []
    with tqdm(total=B, unit="prompt", desc="hidden states", leave=False, disable=not bar) as t:
        for lo in range(0, B, step):
            keys = None if opts["keys"] is None else opts["keys"][lo:lo + step]
            part = _call_sharded(
                lambda b, k: _hidden_states(model, b, opts["ffn"], opts["precision"], k),
                batch[lo:lo + step], devices, keys)
            parts.append(jax.block_until_ready(part) if bar else part)
            t.update(part.shape[0])
    hs = parts[0] if len(parts) == 1 else jnp.concatenate(parts)
    return hs[0] if np.ndim(ids) == 1 else hs


def _wide(x):
    return x.astype(accumulation_dtype(x.dtype))


def _metric(x):
    return misalignment(_wide(x))


def _measure(observe, keys=None):
    """The per-block measure of a batch `(B, n, d)`: `E` by default (`_metric`, looked up
    when traced; of the text tokens `keys (B, n)` only, when given), else `observe` on
    each prompt."""
    if observe is not None:
        return lambda x: jax.vmap(observe)(_wide(x))
    return lambda x: _metric(x) if keys is None else _text_metric(x, keys)


def _text_metric(x, keys):
    """`E` of each prompt's text tokens: the padding rows replaced by copies of token
    1 (each adds exactly 0 to the sum of `E`), the mean taken over the text tokens."""
    E = _metric(jnp.where(keys[..., None], x, x[:, :1]))
    return E * (x.shape[1] / keys.sum(axis=-1).astype(E.dtype))


def _keep(buf, x, depth, depths: tuple):
    """Write `x` into the slots of `buf` whose depth is `depth`."""
    hit = (jnp.asarray(depths, jnp.int32).reshape(-1) == depth)[:, None, None, None]
    return jnp.where(hit, x[None], buf)


def _embed(model, ids, dtype, precision):
    """The embeddings in `dtype`, computed in it where it is wider than float32 (a
    float64 loop's embeddings are float64 sums and norms, not float32 ones cast)."""
    wide = jnp.promote_types(dtype, jnp.float32)
    if wide != jnp.float32:
        model = jax.tree.map(lambda a: a.astype(wide) if eqx.is_inexact_array(a) else a, model)
    return jax.vmap(lambda s: model.embed(s, precision=precision))(ids).astype(dtype)


def _segment(model, x, key, start, *, passes: int, ffn: bool, weights: str, dtype,
             depths: tuple, chunk, precision, observe, keys=None):
    """`passes` passes from pass `start` on `x (B, n, d)`, the input of block 0:
    `(x after the last pass's final norm, the measure (passes, L, B, …) after every
    block, the states at `depths` (len, B, n, d) reached here, zeros elsewhere)`."""
    n, L = x.shape[1], model.num_layers
    ctx, measure = model.context(n, x.dtype), _measure(observe, keys)

    def one_pass(carry, p):
        x, buf = carry
        blocks = model.blocks
        if weights == "resample":  # a fresh draw before every pass, seeded by the pass
            blocks = type(model).init_blocks(model.config, jax.random.fold_in(key, p))
        blocks = jax.tree.map(lambda a: a.astype(dtype) if eqx.is_inexact_array(a) else a,
                              blocks)

        def body(carry, layer_slot):
            x, buf = carry
            layer, slot = layer_slot
            block = jax.tree.map(lambda a: a[slot], blocks)
            x = _apply(model, block, x, layer, ctx, keys, chunk, ffn=ffn, precision=precision)
            return (x, _keep(buf, x, p * L + layer + 1, depths)), measure(x)

        layers = (jnp.arange(L), jnp.asarray(model.slots))
        (x, buf), values = jax.lax.scan(body, (x, buf), layers)
        return (jax.vmap(model.final_norm)(x), buf), values

    buf = jnp.zeros((len(depths),) + x.shape, dtype)
    (x, buf), values = jax.lax.scan(one_pass, (x, buf), start + jnp.arange(passes))
    return x, values, buf


def _batch_first(values, first=None):
    """`(passes, L, B, …)` → `(B, [1 +] passes·L, …)`, after `first (B, …)` if given."""
    flat = values.reshape((-1,) + values.shape[2:])
    if first is not None:
        flat = jnp.concatenate([first[None], flat])
    return jnp.moveaxis(flat, 1, 0)


@kept_jit  # its executable kept in the cache folder: a warm process does not trace it
def loop_program(model, ids, key, *, passes: int, ffn: bool, weights: str, dtype, depths: tuple,
                 chunk: int | None = None, precision: Precision = "float32", observe=None,
                 keys=None):
    """The compiled program behind `loop` (one shard of prompts): the measure (`E`
    by default) after every block, `(B, passes·L + 1, …)`, and the states at
    `depths`. Public within the package so that the benchmarks can compile it
    ahead of time."""
    x0 = _embed(model, ids, dtype, precision)
    _, values, buf = _segment(model, x0, key, 0, passes=passes, ffn=ffn, weights=weights,
                              dtype=dtype, depths=depths, chunk=chunk, precision=precision,
                              observe=observe, keys=keys)
    buf = _keep(buf, x0, 0, depths)
    return _batch_first(values, _measure(observe, keys)(x0)), buf.swapaxes(0, 1)


@kept_jit
def _start(model, ids, *, dtype, depths: tuple, precision, observe, keys=None):
    x0 = _embed(model, ids, dtype, precision)
    buf = _keep(jnp.zeros((len(depths),) + x0.shape, dtype), x0, 0, depths)
    return x0, _measure(observe, keys)(x0)[:, None], buf.swapaxes(0, 1)


@kept_jit
def _continue(model, x, key, start, **options):
    x, values, buf = _segment(model, x, key, start, **options)
    return x, _batch_first(values), buf.swapaxes(0, 1)


class Segment(NamedTuple):
    """A stretch of a loop (`iterate_loop`): passes `[start, stop)` (`stop = 0`: the
    input), the measure after each of their blocks `(B, (stop − start)·L, …)` (the
    input: `(B, 1, …)`), the carry `x (B, n, d)` (the input of pass `stop`), and the
    states `(B, len(depths), n, d)` at the depths reached here (`hit`)."""

    start: int
    stop: int
    values: Array
    x: Array
    states: Array
    hit: np.ndarray


class LoopSetup(NamedTuple):
    """A checked loop: the model to run (its random draw for `"random"` /
    `"resample"` weights and their key, `None` for trained ones), the ids `(B, n)` and
    the compiled program's options."""

    model: AbstractTransformer
    ids: Int[Array, "B n"]
    key: Array | None
    passes: int
    options: dict


def setup_loop(model, ids, *, passes, ffn=True, weights="trained", key=None,
               dtype=jnp.float32, save_states=None, devices=None, chunk=None,
               precision="float32", observe=None, mask=None) -> LoopSetup:
    """Check `loop`'s arguments (one-line `ValueError`/`TypeError`s) and draw the
    random model for `"random"`/`"resample"` weights. The padding mask, if any,
    travels in the options as `keys (B, n)`."""
    check_model(model)
    precision = check_precision(precision)
    passes = check_count(passes, "passes", 1)
    keys = check_mask(mask, ids)
    dtype = check_dtype(dtype)
    depths = tuple(save_states or ())
    integers = all(is_int(d, -(1 << 62)) for d in depths)
    refuse_first((
        (not integers, TypeError, "`save_states` (--save-states) must be integer depths "
         f"(d: the state after d blocks), got {list(depths)}."),
        (weights not in WEIGHTS, ValueError,
         f"`weights` must be one of {WEIGHTS}, got {weights!r}."),
        (observe is not None and not callable(observe), TypeError,
         f"`observe` must be a function of one sequence (n, d), got {observe!r}."),
        (keys is not None and observe is not None, ValueError, "`observe` sees whole sequences, "
         "padding included: with `mask` only E (of the text tokens) is recorded; loop without "
         "`observe`."),
        depths_refusal(depths if integers else (), passes, model.num_layers),
        *size_refusals(model, np.shape(ids), passes, dtype.itemsize, len(depths)),
    ))
    depths = tuple(int(d) for d in depths)
    if weights == "trained":
        key = None  # drawn with nothing: no key, not even PRNGKey(0)'s own small program
    else:
        key = jax.random.PRNGKey(0) if key is None else key
        model = type(model).init(model.config, key)
    ids = check_ids(model, ids)
    chunk = (default_chunk(ids.shape[1], devices) if chunk is None
             else check_count(chunk, "chunk", 1))
    options = dict(ffn=check_flag(ffn, "ffn"), weights=weights, dtype=dtype, depths=depths,
                   chunk=chunk, precision=precision, observe=observe, keys=keys)
    return LoopSetup(model, ids, key, passes, options)


def iterate_loop(setup: LoopSetup, *, every: int = 1, start: int = 0,
                 x: Array | None = None) -> Iterator[Segment]:
    """Run a checked loop (`setup_loop`) segment by segment: from the input (`start =
    0`: first the input itself, as a `Segment` with `stop = 0`), or from the carry `x`
    of a loop stopped after `start` passes; then `every` passes at a time (one
    compiled program, the first pass an argument; the last segment may be shorter).

    Resuming from a segment's carry gives the values of the uninterrupted loop with
    the same `every`, bit for bit on the CPU.
    """
    model, ids, key, passes, opts = setup
    if start == 0:
        x, values, states = _start(model, ids, dtype=opts["dtype"], depths=opts["depths"],
                                   precision=opts["precision"], observe=opts["observe"],
                                   keys=opts["keys"])
        yield Segment(0, 0, values, x, states, np.asarray([d == 0 for d in opts["depths"]], bool))
    elif x is None:
        raise ValueError("resuming a loop after pass 0 needs its carry `x`.")
    L = model.num_layers
    for lo in range(start, passes, every):
        hi = min(lo + every, passes)
        x, values, states = _continue(model, x, key, jnp.asarray(lo, jnp.int32),
                                      passes=hi - lo, **opts)
        hit = np.asarray([lo * L < d <= hi * L for d in opts["depths"]], bool)
        yield Segment(lo, hi, values, x, states, hit)


def _segmented(setup: LoopSetup, desc: str):
    """`loop_program`'s outputs, computed segment by segment under a progress bar."""
    every = math.ceil(setup.passes / min(setup.passes, MAX_SEGMENTS))
    values, states = [], None
    with tqdm(total=setup.passes, unit="pass", desc=desc, leave=False) as bar:
        for seg in iterate_loop(setup, every=every):
            values.append(jax.block_until_ready(seg.values))
            hit = jnp.asarray(seg.hit)[None, :, None, None]
            states = seg.states if states is None else jnp.where(hit, seg.states, states)
            bar.update(seg.stop - seg.start)
    return jnp.concatenate(values, axis=1), states


@surface_errors
def loop(
    model: AbstractTransformer,
    ids: Int[Array, "*B n"],
    *,
    passes: int,
    ffn: bool = True,
    weights: str = "trained",
    key=None,
    dtype=jnp.float32,
    save_states: Sequence[int] | None = None,
    devices=None,
    chunk: int | None = None,
    precision: Precision = "float32",
    observe: Callable[[Float[Array, "n d"]], Array] | None = None,
    by_pass: bool = False,
    progress: bool | None = None,
    mask: Bool[Array, "*B n"] | None = None,
):
    """Run a model far past its depth (paper 001 §6.2) and record `E` after every block.

    The ids are embedded once; after each pass the final norm is applied and the result
    fed to block 0 again. `E` (eq. 25) is recorded at the input and after every block
    (before the final norm). One compiled program; memory does not grow with `passes`.
    The protocol, padding and timings: docs/usage/models.md.

    **Arguments:**

    - `model`: from `ja.models.load` / `ja.models.init`.
    - `ids`: token ids `(n,)` or `(B, n)` (random, or text through `ja.models.tokenize`).
    - `passes`: number of passes through the whole model (≥ 1).
    - `ffn`: `False` removes each block's feed-forward sub-block with its norm, keeping
      the attention residual (pure self-attention).
    - `weights`: `"trained"`, `"random"` (one draw of `ja.models.init(model.config, key)`,
      embeddings included) or `"resample"` (fresh blocks before every pass `p`, drawn
      with `fold_in(key, p)`).
    - `key`: the random key for `"random"`/`"resample"` (default `PRNGKey(0)`).
    - `dtype`: compute dtype: `jnp.float32` (default), `jnp.bfloat16` / `jnp.float16`
      (float32 accumulation, softmax and norm statistics; `E` is float32), or
      `jnp.float64` (x64 on: everything in float64, a reference).
    - `save_states`: integer depths whose hidden states to return as well: depth `d`
      is the state after `d` blocks (0: the embeddings, `p·L`: after `p` whole passes
      of the `L` blocks, before that pass's final norm).
    - `devices`: shard the prompts over devices (as in `ja.run_layers`); results equal
      the unsharded run with the same `chunk`.
    - `chunk`: prompts run through a block together; `None` (default) picks about 1024
      tokens per chunk on CPU without `devices`, the whole batch otherwise. Results do
      not depend on it beyond rounding.
    - `precision`: of every matrix product for float32/float64 compute: `"float32"`
      (default), `"tensorfloat32"` or `"bfloat16"` (docs/precision.md).
    - `observe`: a measure of one sequence `(n, d)` recorded in place of `E`, e.g.
      `ja.metrics.rank_collapse_residual`; pass the same function object again to reuse
      the compiled program.
    - `by_pass`: values as `(B, passes, L, …)`, without the input's; default
      `(B, passes·L + 1, …)`, the input first.
    - `progress`: a progress bar (`None`: for long loops; `True`; `False`); the values
      do not change.
    - `mask`: booleans of the ids' shape, `True` for text, `False` for the padding after
      it (`ja.models.tokenize(…, pad="auto", return_mask=True)`): padding is never
      attended to and `E` is taken over the text tokens. Not with `observe`.

    **Returns:**

    `E` (or the `observe` values) of shape `(passes·L + 1, …)` or
    `(B, passes·L + 1, …)` (with `by_pass`: `(passes, L, …)` or `(B, passes, L, …)`);
    with `save_states`, the pair `(E, states)` with states `(…, len(save_states), n, d)`.
    """
    setup = setup_loop(model, ids, passes=passes, ffn=ffn, weights=weights, key=key,
                       dtype=dtype, save_states=save_states, devices=devices, chunk=chunk,
                       precision=precision, observe=observe, mask=mask)
    B, n = setup.ids.shape
    bar = show_progress(progress, loop_flops(setup.model, B, n, setup.passes), model, ids, key)

    def run(b, k):
        shard = setup._replace(ids=b, options={**setup.options, "keys": k})
        if bar:
            return _segmented(shard, "loop")
        return loop_program(shard.model, b, shard.key, passes=shard.passes, **shard.options)
    E, states = _call_sharded(run, setup.ids, devices, setup.options["keys"])
    if by_pass:
        E = E[:, 1:].reshape((B, setup.passes, setup.model.num_layers) + E.shape[2:])
    if np.ndim(ids) == 1:
        E, states = E[0], states[0]
    return (E, states) if save_states is not None else E


def _pass_counts(passes) -> tuple[int, ...]:
    """`logits`' `passes` as a tuple of pass counts ≥ 1, or `None` when it is not one."""
    many = isinstance(passes, Sequence) and not isinstance(passes, str)
    counts = list(passes) if many else [passes]
    return tuple(map(int, counts)) if counts and all(is_int(c, 1) for c in counts) else None


@kept_jit
def _logits_program(model, ids, keys, *, passes: int, ffn: bool, dtype, depths: tuple,
                    chunk: int | None, precision: Precision):
    """The logits `(B, len(depths), n, V)` after the passes ending at `depths`: each
    state through the final norm and the model's head."""
    x0 = _embed(model, ids, dtype, precision)
    _, _, buf = _segment(model, x0, jax.random.PRNGKey(0), 0, passes=passes, ffn=ffn,
                         weights="trained", dtype=dtype, depths=depths, chunk=chunk,
                         precision=precision, observe=None, keys=keys)
    out = _wide(jax.vmap(jax.vmap(model.final_norm))(buf))
    logits = product("cbnd,vd->bcnv", out, model.head(), out.dtype, precision)
    return logits.astype(out.dtype)


@surface_errors
def logits(
    model: AbstractTransformer,
    ids: Int[Array, "*B n"],
    *,
    passes: int | Sequence[int] = 1,
    ffn: bool = True,
    mask: Bool[Array, "*B n"] | None = None,
    dtype=jnp.float32,
    devices=None,
    chunk: int | None = None,
    precision: Precision = "float32",
) -> Float[Array, "*BP n V"]:
    """The next-token logits of a decoder looped `passes` times (paper 001 §6.2): `loop`'s
    protocol, then the last pass's final norm through the model's head (HuggingFace's
    `lm_head`). `passes=1` is the model's own forward pass. See docs/usage/models.md,
    "Real text, padding, and predictions after k passes".

    **Arguments:**

    - `model`: a decoder (`GPT2`, `GPTNeo`, `Llama`) from `ja.models.load` /
      `ja.models.init`; the encoders (BERT, ALBERT) have no next-token head.
    - `ids`: token ids `(n,)` or `(B, n)`.
    - `passes`: the number of passes (default 1), or a sequence of them: the logits
      after each, from one loop as long as the largest.
    - `ffn`, `dtype`, `devices`, `chunk`, `precision`: as in `loop` (the logits are
      float32, float64 for float64 compute).
    - `mask`: the padding mask, as in `loop` (padding's logits mean nothing).

    **Returns:**

    Logits `(n, V)` or `(B, n, V)` for one pass count; `(P, n, V)` or
    `(B, P, n, V)` for a sequence of `P` of them. Row `i` scores the token after
    token `i`; `predict` takes their argmax.
    """
    check_model(model)
    counts = _pass_counts(passes)
    refuse_first((
        (model.head() is None, f"a {type(model).__name__} (an encoder) has no next-token "
         "head: logits need a decoder (GPT-2, GPT-Neo or a Llama)."),
        (counts is None, "`passes` must be an integer ≥ 1 or a non-empty sequence of them, "
         f"got {passes!r}."),
    ))
    L = model.num_layers
    setup = setup_loop(model, ids, passes=max(counts), ffn=ffn, dtype=dtype,
                       save_states=[c * L for c in counts], devices=devices, chunk=chunk,
                       precision=precision, mask=mask)
    opts = {k: setup.options[k] for k in ("ffn", "dtype", "depths", "chunk", "precision")}
    program = functools.partial(_logits_program, setup.model, passes=setup.passes, **opts)
    out = _call_sharded(program, setup.ids, devices, setup.options["keys"])
    if isinstance(passes, (int, np.integer)):
        out = out[:, 0]
    return out[0] if np.ndim(ids) == 1 else out


def predict(model: AbstractTransformer, ids: Int[Array, "*B n"], **options) -> Int[Array, "..."]:
    """The next-token predictions of a decoder looped `passes` times: the argmax of
    `logits(model, ids, **options)` over the vocabulary, int32, its shape without
    the vocabulary axis (`model.detokenize(predict(…))` reads them).

    **Arguments:**

    - `model`, `ids`, `options`: as `logits` takes them (`passes`, `mask`, `ffn`, …).

    **Returns:**

    Token ids `(n,)`, `(B, n)`, `(P, n)` or `(B, P, n)`; entry `i` is the token the
    model predicts after token `i`.
    """
    return jnp.argmax(logits(model, ids, **options), axis=-1).astype(jnp.int32)
