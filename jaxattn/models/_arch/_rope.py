"""Rotary position embeddings and their scalings, as HuggingFace computes them
(`transformers.modeling_rope_utils`): `default`, `linear`, `dynamic` (NTK),
`llama3` and `yarn`.

A scaling is read once from a config into a hashable `((key, value), …)` record
(`read_rope`), a static part of the model's `TransformerConfig`; the tables of a
sequence length are computed from it when the model runs (`rotary_tables`).
"""

import math

import jax.numpy as jnp
from jaxtyping import Array, Float

# rope_type → the keys of its parameters that HuggingFace reads (besides
# `rope_type`/`type`, `rope_theta` and `partial_rotary_factor`).
ROPE_KEYS: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings"),
    "yarn": ("factor", "attention_factor", "beta_fast", "beta_slow", "mscale",
             "mscale_all_dim", "original_max_position_embeddings", "truncate"),
}
_REQUIRED = {"linear": ("factor",), "dynamic": ("factor",),
             "llama3": ("factor", "low_freq_factor", "high_freq_factor")}


def real_problem(key: str, value, least: float = 0.0, strict: bool = True) -> str | None:
    """What is wrong with config field `key` unless `value` is a finite real number
    `> least` (`≥` when not `strict`), else None; a boolean or a string is not a number."""
    if (isinstance(value, (int, float)) and not isinstance(value, bool)
            and (isinstance(value, int) or math.isfinite(value))
            and (value > least if strict else value >= least)):
        return None
    bound = f"> {least:g}" if strict else f"≥ {least:g}"
    return f"`{key}` must be a finite number {bound}, got {value!r}."


def read_rope(hf: dict) -> tuple[float, tuple]:
    """The rotary base and scaling of a HuggingFace config, read as transformers 5
    reads it (`PreTrainedConfig.convert_rope_params_to_dict`): a non-empty
    `rope_scaling` (transformers < 5's spelling) replaces `rope_parameters` whole, the
    base is the chosen object's `rope_theta`, else the top-level `rope_theta`, else
    10,000; `llama3`/`yarn` take a top-level `original_max_position_embeddings` first
    (transformers standardises again when the model builds its tables), then the
    object's, else `max_position_embeddings`.

    **Arguments:**

    - `hf`: the `config.json` dict.

    **Returns:**

    `(theta, scaling)`: `scaling` is `()` for plain rotary positions, else the sorted
    `(key, value)` pairs of the parameters, `rope_type` among them. A rotary type
    jaxattn does not implement, a partial rotary factor, a missing or bad parameter
    is one `ValueError` naming the field and its value.
    """
    field = "rope_scaling" if hf.get("rope_scaling") else "rope_parameters"
    params = hf.get(field) or {}
    not_object = not isinstance(params, dict) and f"`{field}` must be an object, got {params!r}."
    params = {} if not_object else params
    kind = params.get("rope_type", params.get("type", "default"))
    partial = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    scaling = {k: params[k] for k in ROPE_KEYS.get(kind, ()) if params.get(k) is not None}
    if hf.get("original_max_position_embeddings") is not None and kind in ("llama3", "yarn"):
        scaling["original_max_position_embeddings"] = hf["original_max_position_embeddings"]
    missing = [f"`{key}`" for key in _REQUIRED.get(kind, ()) if key not in scaling]
    numbers = {"rope_theta": theta, **{f"{field}.{k}": v for k, v in scaling.items()
                                       if k != "truncate"}}
    problems = [
        not_object,
        kind not in ROPE_KEYS and f"config: {field}.rope_type={kind!r}: jaxattn does not "
        f"implement the rotary scaling {kind!r} (it implements {', '.join(ROPE_KEYS)}).",
        partial != 1.0 and f"config: partial_rotary_factor={partial!r}: jaxattn does not "
        "implement partial rotary positions (only 1.0).",
        missing and f"config: {field} of rope_type {kind!r} needs {', '.join(missing)}.",
        *(real_problem(key, value) for key, value in numbers.items()),
        not isinstance(scaling.get("truncate", True), bool)
        and f"`{field}.truncate` must be true or false, got {scaling['truncate']!r}.",
    ]
    problem = next((p for p in problems if p), None)
    if problem:
        raise ValueError(problem)
    return theta, () if kind == "default" else tuple(sorted({"rope_type": kind, **scaling}.items()))


def _llama3(inv_freq: Array, p: dict, max_positions: int) -> Array:
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    old = p.get("original_max_position_embeddings", max_positions)
    wavelen = 2 * math.pi / inv_freq
    scaled = jnp.where(wavelen > old / low, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old / high) & (wavelen <= old / low)
    return jnp.where(medium, smoothed, scaled)


def _yarn(pos_freqs: Array, dim: int, theta: float, p: dict, max_positions: int):
    old = p.get("original_max_position_embeddings", max_positions)
    factor = p.get("factor", max_positions / old)

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = p.get("attention_factor")
    if attention is None:
        m, m_all = p.get("mscale"), p.get("mscale_all_dim")
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)

    def correction(rotations):
        return dim * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction(p.get("beta_fast", 32)), correction(p.get("beta_slow", 1))
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    high = high + 0.001 if low == high else high
    ramp = jnp.clip((jnp.arange(dim // 2, dtype=pos_freqs.dtype) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    inv_freq = (1 / (factor * pos_freqs)) * (1 - extrapolation) + (1 / pos_freqs) * extrapolation
    return inv_freq, attention


def rope_frequencies(n: int, dim: int, theta: float, scaling: tuple = (),
                     max_positions: int | None = None, dtype=jnp.float32
                     ) -> tuple[Array, float]:
    """The inverse frequencies `(dim/2,)` in `dtype` (float32 as HuggingFace, float64
    for a float64 reference) and the factor on `cos`/`sin` of a sequence of `n` tokens,
    as HuggingFace computes them.

    `dynamic` rescales the base for `n > max_positions`, as a fresh HuggingFace
    model does on its first call (HuggingFace then keeps the grown frequencies for
    later calls on that module; jaxattn's tables depend on `n` only).
    """
    p = dict(scaling)
    kind = p.pop("rope_type", "default")
    exponents = jnp.arange(0, dim, 2, dtype=dtype) / dim
    max_positions = max_positions or n
    if kind == "dynamic":
        seq = max(n, max_positions)
        factor = p["factor"]
        theta = theta * ((factor * seq / max_positions) - (factor - 1)) ** (dim / (dim - 2))
    pos_freqs = theta ** exponents
    inv_freq = 1.0 / pos_freqs
    attention = 1.0
    if kind == "linear":
        inv_freq = inv_freq / p["factor"]
    elif kind == "llama3":
        inv_freq = _llama3(inv_freq, p, max_positions)
    elif kind == "yarn":
        inv_freq, attention = _yarn(pos_freqs, dim, theta, p, max_positions)
    return inv_freq.astype(dtype), float(attention)


def rotary_tables(n: int, dim: int, theta: float, scaling: tuple = (),
                  max_positions: int | None = None, dtype=jnp.float32) -> tuple[Array, Array]:
    """`cos`, `sin` tables `(n, dim)` of rotary position embeddings (HF's
    `rotate_half` layout: frequency `i` on features `i` and `i + dim/2`), scaled as
    `scaling` says (see `read_rope`), computed in `dtype` or float32 if narrower (in
    float32, as HuggingFace, they are off by 1e-4 at position 2048)."""
    dtype = jnp.promote_types(dtype, jnp.float32)
    inv_freq, attention = rope_frequencies(n, dim, theta, scaling, max_positions, dtype)
    freqs: Float[Array, "n half"] = (jnp.arange(n, dtype=dtype)[:, None]
                                     * inv_freq[None, :])
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb) * attention, jnp.sin(emb) * attention
