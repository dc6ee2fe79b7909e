"""Checks of user input: shape and configuration errors at trace time, value
errors through `eqx.error_if` when the values are only known inside `jit`."""

import functools
import re
from collections.abc import Callable
from typing import TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float


def is_concrete(x) -> bool:
    """Whether `x` has a value now (not a tracer inside `jit`/`grad`/`vmap`)."""
    return not isinstance(x, jax.core.Tracer)


def float_dtype(*arrays):
    """The floating dtype to compute in: the inputs' own, or the default one."""
    dtypes = [a.dtype for a in arrays if hasattr(a, "dtype")]
    dtypes = [d for d in dtypes if jnp.issubdtype(d, jnp.floating)]
    return jnp.result_type(*dtypes) if dtypes else jnp.result_type(float)


def as_float_array(x, name: str, dtype=None) -> Array:
    """`x` as a floating JAX array, or a `TypeError` that names it."""
    if isinstance(x, str | bytes):  # jnp.asarray would read "1" as a number
        raise TypeError(f"`{name}` must be an array of numbers, got the string {x!r}.")
    try:
        arr = jnp.asarray(x)
    except (TypeError, ValueError) as e:
        raise TypeError(f"`{name}` must be an array of numbers, got {type(x).__name__}.") from e
    if jnp.issubdtype(arr.dtype, jnp.complexfloating):
        raise TypeError(f"`{name}` must be real, got dtype {arr.dtype}.")
    if not (jnp.issubdtype(arr.dtype, jnp.floating) or jnp.issubdtype(arr.dtype, jnp.integer)
            or arr.dtype == jnp.bool_):
        raise TypeError(f"`{name}` must be an array of numbers, got dtype {arr.dtype}.")
    return arr.astype(dtype or float_dtype(arr))


def check_scalar(value, name: str, *, positive: bool = False, dtype=None):
    """A finite (optionally positive) real scalar.

    A value known now (a Python or NumPy number, a concrete array) is checked in
    Python and returned as a float: `ValueError` if it is bad, or if it is not
    finite (or, with `positive`, not > 0) once stored in `dtype` (when given: e.g.
    `β = 1e40` is `inf` in float32). A traced value is returned checked through
    `eqx.error_if`.
    """
    if isinstance(value, jax.core.Tracer):
        if not jnp.issubdtype(value.dtype, jnp.floating) and \
                not jnp.issubdtype(value.dtype, jnp.integer):
            raise TypeError(f"`{name}` must be a real number, got a traced {value.dtype}.")
        if value.ndim != 0:
            raise ValueError(f"`{name}` must be a scalar, got shape {value.shape}.")
        bad = ~jnp.isfinite(value)
        if positive:
            bad = bad | (value <= 0)
        return eqx.error_if(value, bad, f"`{name}` must be finite{' and > 0' if positive else ''}.")
    # Only numbers: not a string ("1" would parse), a bool, None or a complex number.
    try:
        dt = np.dtype(object) if isinstance(value, str | bytes) else np.asarray(value).dtype
    except (TypeError, ValueError):  # a ragged list
        dt = np.dtype(object)
    if not (jnp.issubdtype(dt, jnp.floating) or jnp.issubdtype(dt, jnp.integer)):
        raise TypeError(f"`{name}` must be a real number, got {value!r}.")
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim != 0:
        raise ValueError(f"`{name}` must be a scalar, got shape {arr.shape}.")
    v = float(arr)
    if not np.isfinite(v):
        raise ValueError(f"`{name}` must be finite, got {v}.")
    if positive and v <= 0:
        raise ValueError(f"`{name}` must be > 0, got {v}.")
    if dtype is not None:
        _check_representable(v, name, positive, jnp.dtype(dtype))
    return v


def _check_representable(v: float, name: str, positive: bool, dtype) -> None:
    """`ValueError` unless `v` stays finite (and > 0 if `positive`) in `dtype`."""
    info = jnp.finfo(dtype)
    if abs(v) > float(info.max):
        raise ValueError(f"`{name}` = {v:g} overflows {dtype.name} (largest "
                         f"{float(info.max):.3g}); use a smaller value or float64 "
                         "(jax_enable_x64).")
    if positive and v < float(info.smallest_subnormal):
        raise ValueError(f"`{name}` = {v:g} is 0 in {dtype.name}; use a larger value or float64 "
                         "(jax_enable_x64).")


def check_finite(x: Array, name: str) -> Array:
    """Refuse NaN or inf in `x` (weights): a one-line `ValueError` naming `name` when
    `x` is concrete; a traced `x` is returned unchanged (the simulators turn
    non-finite weights into NaN tokens and raise `NONFINITE`, see
    `SelfAttentionDynamics.scores`), so that no host callback enters programs
    that are sharded or vmapped by the caller."""
    if known_nonfinite(x):
        raise ValueError(f"`{name}` contains NaN or inf; weights must be finite.")
    return x


def known_nonfinite(x: Array) -> bool:
    """Whether `x` is concrete and has a NaN or inf entry (`False` when traced).

    Evaluated on the array's device, also when called while another function is
    being traced (a constant closed over by a `jit`)."""
    if not is_concrete(x):
        return False
    with jax.ensure_compile_time_eval():
        return not bool(jnp.all(jnp.isfinite(x)))


def check_count(value, name: str, minimum: int = 0, maximum: int | None = None) -> int:
    """A Python int ≥ `minimum` (and ≤ `maximum` when given: e.g. `INDEX_MAX` for a
    number compared with token indices inside a program) — a loop's length, a number
    of instances, a seed — or a `ValueError` naming `name`. The one integer check of
    jaxattn: the library, the experiments, the sweeps and the command line all use it."""
    if isinstance(value, jax.core.Tracer):
        raise ValueError(f"`{name}` fixes the shape of a compiled program: it must be a "
                         f"Python int known before tracing, got a traced array.")
    try:
        ok = not isinstance(value, bool) and int(value) == value and int(value) >= minimum
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise ValueError(f"`{name}` must be a whole number ≥ {minimum}, got {value!r}.")
    if maximum is not None and int(value) > maximum:
        raise ValueError(f"`{name}` must be a whole number in [{minimum}, {maximum}], "
                         f"got {value!r}.")
    return int(value)


def check_flag(value, name: str) -> bool:
    """`value` if it is `True` or `False` (a NumPy bool too), else a `TypeError` naming
    `name`: a string such as `"no"` would otherwise count as true."""
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"`{name}` must be True or False, got {value!r}.")
    return bool(value)


#: The largest integer a compiled program compares token indices with (int32).
INDEX_MAX = 2**31 - 1


def check_metric(W, d: int | None = None, *, rtol: float = 1e-6) -> Float[Array, "d d"]:
    """`W` as a symmetric (to `rtol · max|W|`) positive-definite `(d, d)` array, or a
    `ValueError`."""
    W = as_float_array(W, "W")
    if W.ndim != 2 or W.shape[0] != W.shape[1]:
        raise ValueError(f"`W` must be a square (d, d) matrix, got shape {W.shape}.")
    if d is not None and W.shape[0] != d:
        raise ValueError(
            f"`W` has shape {W.shape} but the tokens have dimension d={d}; "
            f"pass a ({d}, {d}) metric."
        )
    if is_concrete(W):
        Wn = np.asarray(W, dtype=np.float64)
        if not np.all(np.isfinite(Wn)):
            raise ValueError("`W` contains NaN or inf; it must be a finite SPD matrix.")
        scale = max(np.abs(Wn).max(), np.finfo(np.float64).tiny)
        if np.abs(Wn - Wn.T).max() > rtol * scale:
            raise ValueError(
                "`W` must be symmetric (max |W − Wᵀ| = "
                f"{np.abs(Wn - Wn.T).max():.3g}); symmetrise it with (W + W.T) / 2."
            )
        _check_positive_definite(Wn, jnp.finfo(W.dtype).eps)
    return W


def _check_positive_definite(W: np.ndarray, eps: float) -> None:
    """`ValueError` unless the smallest eigenvalue of `W` exceeds `√d · eps · λ_max`:
    relative to the largest (an SPD `diag(1e6, 1, 1)` passes), with the margin by
    which rounding `W` to its dtype (`eps`) can move an eigenvalue (Weyl), below
    which `|y|²_W` is not reliably positive in that dtype."""
    lam = np.linalg.eigvalsh(W)
    floor = np.sqrt(W.shape[0]) * eps * max(lam.max(), 0.0)
    if lam.min() <= floor:
        raise ValueError(
            f"`W` must be positive definite, but its smallest eigenvalue is "
            f"{lam.min():.3g} (largest {lam.max():.3g}); the ellipsoid |y|_W = 1 needs an "
            "SPD metric whose condition number stays well below 1/eps of its dtype."
        )


# --- runtime errors, one line first ---------------------------------------------------


class SimulationError(ValueError, eqx.EquinoxRuntimeError):
    """A run stopped on its values: tokens that became NaN or inf, a zero or
    non-finite initial token, a flow solver out of steps. Its message is one line
    that says what happened and how to fix it.

    A `ValueError` (bad values, like every other mistake jaxattn refuses) and an
    `eqx.EquinoxRuntimeError` (what the checks inside `jit` raised before, so
    `except eqx.EquinoxRuntimeError` still catches it). Raised the same way by
    sharded and unsharded runs.
    """


# `jaxattn.SimulationError: …` in tracebacks, the name users import it by.
SimulationError.__module__ = "jaxattn"

_FN = TypeVar("_FN", bound=Callable)
_PREFIX = "jaxattn: "
# equinox ends its message with advice on debugging after a blank line; a check
# inside a plain `jax.jit` arrives as a JaxRuntimeError with the same marker.
_EQX_MESSAGE = re.compile(r"EquinoxRuntimeError: (.+?)(?:\n\s*\n|\Z)", re.S)
_FRIENDLY = {
    "The maximum number of solver steps was reached.": (
        "the flow solver reached `max_steps` before the last save time: raise "
        "`max_steps`, shorten the horizon, or pass `throw=False` for a per-sample "
        "`success`."
    ),
}


def short_message(text: str) -> str:
    """One line for a runtime check's message: jaxattn's own without its
    `jaxattn: ` marker, diffrax's out-of-steps with the fix."""
    line = " ".join(text.split())
    for start, friendly in _FRIENDLY.items():
        if line.startswith(start):
            return friendly
    return line.removeprefix(_PREFIX)


def runtime_message(error: BaseException) -> str | None:
    """The message a check inside `jit` (`eqx.error_if`, diffrax's `throw`) raised
    `error` with, as one line; `None` when `error` is not such a failure."""
    if isinstance(error, SimulationError):
        return str(error)
    if not isinstance(error, eqx.EquinoxRuntimeError | jax.errors.JaxRuntimeError):
        return None
    text = str(error)
    found = _EQX_MESSAGE.findall(text)
    if found:
        return short_message(found[-1])
    # Raised on the host with the bare message (e.g. after a sharded run).
    return short_message(text) if isinstance(error, eqx.EquinoxRuntimeError) else None


def surface_errors(fn: _FN) -> _FN:
    """Decorate an entry point so that a value check failing inside its compiled
    program raises a one-line `SimulationError` (jaxattn's message and the fix)
    in place of equinox's 30–50 lines, whose "inside JIT" stack points at the
    call that compiled the program, not the one that failed. The same error as a
    sharded run's host-side check (`raise_unless`). Idempotent."""
    if getattr(fn, "__surfaces_errors__", False):
        return fn

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (eqx.EquinoxRuntimeError, jax.errors.JaxRuntimeError) as error:
            message = runtime_message(error)  # a SimulationError is one too
            if message is None:
                raise
        # Outside the `except`: the traceback shows no equinox error as context, and
        # ends here, not in the host-side check that raised it.
        raise SimulationError(message)

    wrapper.__surfaces_errors__ = True
    return wrapper


NONFINITE = (
    "jaxattn: the tokens became NaN or inf during the run: the weights overflow this "
    "floating-point type (e.g. |τ U| or β|P| near its largest value; kernel='exp' once "
    "β xᵀPy passes ≈ 88 in float32, 709 in float64: kernel='usa' is the same dynamics "
    "with time rescaled by e^β, finite there) or contain NaN or inf. Use smaller or "
    "finite weights, or float64 (jax_enable_x64)."
)


TOKENS_NONFINITE = "jaxattn: the initial tokens contain NaN or inf; pass finite tokens."
TOKENS_ZERO = (
    "jaxattn: an initial token is zero (or all its entries are below the smallest "
    "normal float), so it has no direction to project onto the ellipsoid; every "
    "token needs a nonzero entry."
)


def _token_defects(x) -> tuple[Array, Array]:
    """Whether `x` has a NaN/inf entry, and whether it has a zero token.

    A token is zero when its largest entry is: the test is scale-aware (tokens of
    size `1e-20` are valid; `N_W` rescales them exactly before squaring) and needs
    no metric (an SPD `W` vanishes only at 0). Subnormal tokens count as zero: CPUs
    flush them to 0.
    """
    bad_value = ~jnp.all(jnp.isfinite(x))
    zero = jnp.any(jnp.max(jnp.abs(x), axis=-1) < jnp.finfo(x.dtype).tiny)
    return bad_value, zero


def check_tokens(x: Float[Array, "*batch n d"]) -> Float[Array, "*batch n d"]:
    """Refuse NaN/inf entries and zero tokens (they have no point on `E_W`).

    Runs inside `jit` through `eqx.error_if`; the returned array must be used.
    """
    bad_value, _ = _token_defects(x)
    x = eqx.error_if(x, bad_value, TOKENS_NONFINITE)
    _, zero = _token_defects(x)
    return eqx.error_if(x, zero, TOKENS_ZERO)


_token_defects_jit = jax.jit(_token_defects)


def check_tokens_now(x: Float[Array, "*batch n d"]) -> None:
    """`check_tokens` on concrete tokens, before a run: the `SimulationError` (a
    `ValueError`) that the check inside `jit` surfaces as."""
    bad_value, zero = jax.device_get(_token_defects_jit(x))
    if bad_value:
        raise SimulationError(short_message(TOKENS_NONFINITE))
    if zero:
        raise SimulationError(short_message(TOKENS_ZERO))


def check_rows_now(x: Float[Array, "*batch n d"], name: str, where: str) -> None:
    """Refuse, when `x` is concrete, NaN/inf entries and zero rows (tokens without a
    direction), with a one-line `ValueError` that names `where` (the function) and
    `name`. Traced `x` passes unchecked: a metric inside `jit`/`vmap` (an `observe`
    of `run_layers`, a sharded program) stays free of host callbacks, and its
    result is NaN for such rows, as documented by each caller."""
    if not is_concrete(x) or x.size == 0:
        return
    bad_value, zero = jax.device_get(_token_defects_jit(x))
    if bad_value:
        raise ValueError(f"{where}: `{name}` contains NaN or inf; pass finite tokens (the "
                         "tokens of a failed run are not meaningful: check its `success`).")
    if zero:
        raise ValueError(f"{where}: a token (row) of `{name}` is zero, so it has no direction; "
                         "every token needs a nonzero entry.")


def raise_unless(ok, message: str) -> None:
    """After a sharded run: raise `message` as a `SimulationError` (what a check
    inside `jit` surfaces as, see `surface_errors`) unless every entry of `ok` is
    true."""
    if not bool(jnp.all(ok)):
        raise SimulationError(short_message(message))


#: The largest seed `jax.random.PRNGKey` takes (a signed 64-bit integer).
MAX_SEED = 2**63 - 1


def check_seed(seed, name: str = "--seed", count: int = 1) -> int:
    """`seed` as a whole number ≥ 0 such that the `count` seeds `seed, seed + 1, …`
    fit JAX's 64-bit seeds, or a `ValueError`."""
    seed = check_count(seed, name)
    count = count if isinstance(count, int) and count > 1 else 1  # others: checked later
    if seed + count - 1 > MAX_SEED:
        raise ValueError(f"`{name}` must be at most {MAX_SEED - count + 1} "
                         f"(JAX's seeds are 64-bit integers), got {seed}.")
    return seed
