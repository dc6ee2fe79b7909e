"""Running models: hidden states (HuggingFace's convention) and the looped-model
protocol of paper 001 §6.2, both one compiled program scanned over blocks."""

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from .._precision import Precision, check_precision
from .._sharding import as_mesh, shard_batch, unshard
from ..metrics._consensus import misalignment
from ._arch import FAMILIES, AbstractTransformer

WEIGHTS = ("trained", "random", "resample")


def check_model(model) -> AbstractTransformer:
    if not isinstance(model, AbstractTransformer):
        raise TypeError(
            "expected a model from ja.models.load / ja.models.init, got "
            f"{type(model).__name__}."
        )
    return model


def check_ids(model: AbstractTransformer, ids) -> Int[Array, "B n"]:
    """Token ids as an int32 `(B, n)` array; `ValueError` for a wrong shape or ids
    outside the vocabulary / position table."""
    arr = np.asarray(ids) if not isinstance(ids, jax.core.Tracer) else ids
    if not jnp.issubdtype(arr.dtype, jnp.integer):
        raise TypeError(f"token ids must be integers, got dtype {arr.dtype}.")
    if arr.ndim not in (1, 2) or arr.shape[-1] < 1:
        raise ValueError(f"token ids must be (n,) or (B, n) with n ≥ 1, got shape {arr.shape}.")
    cfg = model.config
    n = arr.shape[-1]
    if cfg.model_type != "llama" and cfg.max_positions and n > cfg.max_positions:
        raise ValueError(
            f"{n} tokens exceed the model's {cfg.max_positions} learned positions."
        )
    if isinstance(arr, np.ndarray) and arr.size and (arr.min() < 0 or arr.max() >= cfg.vocab_size):
        raise ValueError(
            f"token ids must lie in [0, {cfg.vocab_size}) (the vocabulary), got "
            f"[{arr.min()}, {arr.max()}]."
        )
    return jnp.asarray(arr, jnp.int32).reshape(-1, n)


def _layer_xs(model: AbstractTransformer):
    return jnp.arange(model.num_layers), jnp.asarray(model.slots)


CHUNK_TOKENS = 1024


def default_chunk(n: int, devices) -> int | None:
    """Prompts per chunk when `chunk=None`: on CPU, unsharded, about `CHUNK_TOKENS`
    tokens at a time (a block's activations then stay in cache: a GPT-2-small
    pure-attention pass on 100 × 200 tokens took 9.8–10.3 s in chunks of 4–10
    prompts against 10.8–11.5 s vmapped over all 100); elsewhere the whole batch
    at once."""
    if devices is not None or jax.default_backend() != "cpu":
        return None
    return max(1, CHUNK_TOKENS // n)


def check_chunk(chunk) -> int | None:
    if chunk is None:
        return None
    if not isinstance(chunk, (int, np.integer)) or isinstance(chunk, bool) or chunk < 1:
        raise ValueError(f"`chunk` must be None or an integer ≥ 1 (prompts), got {chunk!r}.")
    return int(chunk)


def _map_prompts(fn, x: Float[Array, "B n d"], chunk: int | None) -> Float[Array, "B n d"]:
    """`fn` on every prompt of `x`: vmapped over all of them, or `chunk` at a time."""
    if chunk is None or chunk >= x.shape[0]:
        return jax.vmap(fn)(x)
    return jax.lax.map(fn, x, batch_size=chunk)


def _forward(model, x, ctx, blocks, *, ffn: bool, precision: str, emit):
    """Scan one sequence batch `x (B, n, d)` through every layer; `emit(x)` per layer."""

    def body(x, layer_slot):
        layer, slot = layer_slot
        block = jax.tree.map(lambda a: a[slot], blocks)
        x = jax.vmap(lambda s: model.apply_block(block, s, layer, ctx, ffn=ffn,
                                                 precision=precision))(x)
        return x, emit(x)

    return jax.lax.scan(body, x, _layer_xs(model))


@eqx.filter_jit
def _hidden_states(model, ids, ffn: bool, precision: str):
    x = jax.vmap(lambda s: model.embed(s, precision=precision))(ids)
    last, xs = _forward(model, x, model.context(ids.shape[1]), model.blocks, ffn=ffn,
                        precision=precision, emit=lambda x: x)
    xs = xs.at[-1].set(jax.vmap(model.final_norm)(last))
    return jnp.concatenate([x[None], xs]).swapaxes(0, 1)


def _call_sharded(fn, ids, devices, *args, **kwargs):
    """`fn(ids, ...)` with the prompts `(B, n)` sharded over `devices` (see
    `ja.run_layers`); padding rows are dropped from every output."""
    mesh = as_mesh(devices)
    if mesh is None:
        return fn(ids, *args, **kwargs)
    flat, size = shard_batch(ids, mesh, 1)
    return unshard(fn(flat, *args, **kwargs), size, (size,))


def hidden_states(
    model: AbstractTransformer, ids: Int[Array, "*B n"], *, ffn: bool = True, devices=None,
    precision: Precision = "float32",
) -> Float[Array, "*B L+1 n d"]:
    """The hidden states after every block, as HuggingFace's `output_hidden_states`.

    Index 0 is the embedding output (the input of block 0); index `l` the output of
    block `l`; the last one has the model's final norm applied (GPT-2/GPT-Neo
    `ln_f`, Llama `norm`; BERT/ALBERT have none), exactly as HuggingFace returns it.

    **Arguments:**

    - `model`: from `ja.models.load` or `ja.models.init`.
    - `ids`: token ids `(n,)` or `(B, n)`.
    - `ffn`: `False` drops every block's feed-forward sub-block with its norm.
    - `devices`: shard the prompts over devices (`None`, an int, a list of
      devices or a `Mesh`, as in `ja.run_layers`); results equal the unsharded run.
    - `precision`: of every matrix product: `"float32"` (default; true float32 on
      every backend, whatever `jax_default_matmul_precision` says),
      `"tensorfloat32"` or `"bfloat16"` (reduced operands, float32 accumulation);
      see `jaxattn._precision`.

    **Returns:**

    `(L + 1, n, d)`, or `(B, L + 1, n, d)` for a batch.
    """
    check_model(model)
    precision = check_precision(precision)
    batch = check_ids(model, ids)
    hs = _call_sharded(lambda b: _hidden_states(model, b, ffn, precision), batch, devices)
    return hs[0] if np.ndim(ids) == 1 else hs


def _metric(x):
    # float32 for float32 and reduced compute, float64 for float64 compute
    return misalignment(x.astype(jnp.promote_types(x.dtype, jnp.float32)))


def _pass_blocks(model, weights: str, key, p):
    if weights == "resample":  # a fresh draw before every pass, seeded by the pass
        family = FAMILIES[model.config.model_type]
        return family.init_blocks(model.config, jax.random.fold_in(key, p))
    return model.blocks


def _cast(tree, dtype):
    return jax.tree.map(
        lambda a: a.astype(dtype) if eqx.is_inexact_array(a) else a, tree
    )


@eqx.filter_jit
def loop_program(model, ids, key, *, passes: int, ffn: bool, weights: str, dtype, depths: tuple,
                 chunk: int | None = None, precision: Precision = "float32"):
    """The compiled program behind `loop` (one shard of prompts): `E` after every
    block and the states at `depths`. Public within the package so that the
    benchmarks can compile it ahead of time."""
    n, L = ids.shape[1], model.num_layers
    x0 = jax.vmap(lambda s: model.embed(s, precision=precision))(ids).astype(dtype)
    ctx = model.context(n)
    buf0 = jnp.zeros((len(depths),) + x0.shape, dtype)
    depth_arr = jnp.asarray(depths, jnp.int32).reshape(-1)

    def keep(buf, x, depth):  # write x into the slots whose depth is reached now
        hit = (depth_arr == depth)[:, None, None, None]
        return jnp.where(hit, x[None], buf)

    def one_pass(carry, p):
        x, buf = carry
        blocks = _cast(_pass_blocks(model, weights, key, p), dtype)

        def body(carry, layer_slot):
            x, buf = carry
            layer, slot = layer_slot
            block = jax.tree.map(lambda a: a[slot], blocks)
            x = _map_prompts(lambda s: model.apply_block(block, s, layer, ctx, ffn=ffn,
                                                         precision=precision), x, chunk)
            return (x, keep(buf, x, p * L + layer + 1)), _metric(x)

        (x, buf), E = jax.lax.scan(body, (x, buf), _layer_xs(model))
        return (jax.vmap(model.final_norm)(x), buf), E

    buf0 = keep(buf0, x0, 0)
    (_, buf), E = jax.lax.scan(one_pass, (x0, buf0), jnp.arange(passes))
    E = jnp.concatenate([_metric(x0)[None], E.reshape(passes * L, -1)])
    return E.T, buf.swapaxes(0, 1)


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
):
    """Run a model far past its depth (paper 001 §6.2) and record `E` after every block.

    The ids are embedded once. One pass runs every block in order; after a pass the
    model's final norm is applied and the result fed to block 0 again (no
    re-embedding). `E` (paper 001 eq. 25, `1 − mean_i cos(x_1, x_i)`) is recorded
    at the input and after every block of every pass (before the final norm).
    One compiled program: `lax.scan` over passes and blocks, prompts batched;
    memory does not grow with `passes` (only `E` is kept).

    **Arguments:**

    - `model`: from `ja.models.load` / `ja.models.init`.
    - `ids`: token ids `(n,)` or `(B, n)` (e.g. drawn uniformly from the vocabulary).
    - `passes`: number of passes through the whole model (≥ 1).
    - `ffn`: `False` removes each block's feed-forward sub-block together with its
      normalisation, keeping the attention residual (pure self-attention).
    - `weights`: `"trained"` (the model's own), `"random"` (one draw of
      `ja.models.init(model.config, key)`, embeddings included) or `"resample"`
      (embeddings from that draw; fresh blocks before every pass `p`, drawn with
      `fold_in(key, p)`).
    - `key`: the random key for `"random"`/`"resample"` (default `PRNGKey(0)`).
    - `dtype`: compute dtype: `jnp.float32` (default), or `jnp.bfloat16` /
      `jnp.float16` for reduced-precision compute with float32 accumulation in
      every matrix product and float32 softmax and normalisation statistics (as
      HuggingFace does); `E` is float32. `jnp.float64` (with x64 enabled) computes
      everything in float64, `E` included: a reference for the float32 modes.
    - `save_states`: depths (0 = embeddings, `p·L + l` = after block `l` of pass
      `p`) whose hidden states to return as well.
    - `devices`: shard the prompts over devices (`None`, an int, a list of
      devices or a `Mesh`, as in `ja.run_layers`): each device loops its share of
      the prompts. Results equal the unsharded run with the same `chunk`.
    - `chunk`: prompts run through a block together (`lax.map` over chunks);
      `None` (default) picks about 1024 tokens per chunk on CPU without `devices`
      (faster: activations stay in cache) and the whole batch otherwise. Results
      do not depend on it beyond float rounding.
    - `precision`: of every matrix product, for float32 (or float64) compute:
      `"float32"` (default; true float32 on every backend, whatever
      `jax_default_matmul_precision` says), `"tensorfloat32"` (TF32 on NVIDIA GPUs,
      its operand rounding emulated elsewhere) or `"bfloat16"` (bfloat16 operands,
      float32 accumulation); see `jaxattn._precision`. Orthogonal to `dtype`: a
      reduced `dtype` already has narrow operands.

    **Returns:**

    `E` of shape `(passes·L + 1,)` or `(B, passes·L + 1)`; with `save_states`, the
    pair `(E, states)` with states `(…, len(save_states), n, d)`.
    """
    check_model(model)
    precision = check_precision(precision)
    if not isinstance(passes, (int, np.integer)) or isinstance(passes, bool) or passes < 1:
        raise ValueError(f"`passes` must be an integer ≥ 1, got {passes!r}.")
    if weights not in WEIGHTS:
        raise ValueError(f"`weights` must be one of {WEIGHTS}, got {weights!r}.")
    try:
        dtype = jnp.dtype(dtype)
    except TypeError:
        dtype = None
    if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(
            "`dtype` must be a floating dtype (jnp.float32, jnp.bfloat16 or jnp.float16)."
        )
    depths = tuple(int(d) for d in (save_states or ()))
    total = int(passes) * model.num_layers
    if any(not 0 <= d <= total for d in depths):
        raise ValueError(f"save_states depths must lie in [0, {total}], got {list(depths)}.")
    key = jax.random.PRNGKey(0) if key is None else key
    if weights != "trained":
        model = FAMILIES[model.config.model_type].init(model.config, key)
    ids = check_ids(model, ids)
    chunk = check_chunk(chunk)
    chunk = default_chunk(ids.shape[1], devices) if chunk is None else chunk
    E, states = _call_sharded(
        lambda b: loop_program(model, b, key, passes=int(passes), ffn=bool(ffn), weights=weights,
                               dtype=dtype, depths=depths, chunk=chunk, precision=precision),
        ids, devices,
    )
    if np.ndim(ids) == 1:
        E, states = E[0], states[0]
    return (E, states) if save_states is not None else E
