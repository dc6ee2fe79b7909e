"""Checks of user input: shape and configuration errors at trace time, value
errors through `eqx.error_if` when the values are only known inside `jit`."""

import functools
import os
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


def refuse_first(refusals, error: type[Exception] = ValueError) -> None:
    """Refuse the first of `refusals` whose `wrong` holds, in order: rows `(wrong, line)`
    raise `error(line)`, rows `(wrong, error_type, line)` their own type. The one
    form of an entry point's table of one-line refusals."""
    for wrong, *kind, line in refusals:
        if wrong:
            raise (kind[0] if kind else error)(line)


def check_final(cls: type, base: type) -> None:
    """Refuse, when `cls` is created, a method of `cls` that a class of `base`'s
    family above it already made concrete: members implement abstract methods only
    (equinox's abstract/final rule, which equinox 0.13 no longer enforces through
    `strict=True`). A family base calls it from `__init_subclass__`; dunder methods
    (`__init__`, `__check_init__`) and class variables are free."""
    for name, value in vars(cls).items():
        if name.startswith("__") or not (callable(value) or isinstance(
                value, property | classmethod | staticmethod)):
            continue
        for parent in cls.__mro__[1:]:
            if not issubclass(parent, base) or name not in vars(parent):
                continue
            if not getattr(vars(parent)[name], "__isabstractmethod__", False):
                home = next((p for p in parent.__mro__ if issubclass(p, base) and getattr(
                    vars(p).get(name), "__isabstractmethod__", False)), base)
                raise TypeError(
                    f"{cls.__name__} overrides `{name}`, which {parent.__name__} already makes "
                    f"concrete: a member of {base.__name__} implements only abstract methods "
                    f"(the library's other paths rely on the concrete ones); subclass "
                    f"{home.__name__} and implement `{name}` there.")
            break


def float_dtype(*arrays):
    """The floating dtype to compute in: the inputs' own (a NumPy float64 read as
    float32 without x64, silently: JAX's own warning is about a dtype asked for), or
    the default one."""
    dtypes = [jax.dtypes.canonicalize_dtype(a.dtype) for a in arrays if hasattr(a, "dtype")]
    dtypes = [d for d in dtypes if jnp.issubdtype(d, jnp.floating)]
    return jnp.result_type(*dtypes) if dtypes else jnp.result_type(float)


def is_real(dtype) -> bool:
    """Whether `dtype` is a real number type (floating, bfloat16 too, or integer)."""
    return jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer)


def as_float_array(x, name: str, dtype=None) -> Array:
    """`x` as a floating JAX array, or a `TypeError` that names it. Host input is
    converted by NumPy and placed with `jax.device_put` (`jnp.asarray` of a host array
    compiles a copy program per shape)."""
    arr = None
    if not isinstance(x, str | bytes):  # jnp.asarray would read "1" as a number
        try:
            arr = _host_numbers(x)
            arr = jnp.asarray(x) if arr is None else arr
        except (TypeError, ValueError):
            pass
    if arr is None or not (is_real(arr.dtype) or arr.dtype == jnp.bool_):
        got = (f"the string {x!r}" if isinstance(x, str | bytes) else type(x).__name__
               if arr is None else f"dtype {arr.dtype}")
        complex_ = arr is not None and jnp.issubdtype(arr.dtype, jnp.complexfloating)
        raise TypeError(f"`{name}` must be {'real' if complex_ else 'an array of numbers'}, "
                        f"got {got}.")
    if isinstance(arr, jax.Array):
        return arr.astype(dtype or float_dtype(arr))
    with np.errstate(over="ignore"):  # an overflow to inf is refused by the callers' checks
        return jax.device_put(arr.astype(dtype or float_dtype(arr)))


def _host_numbers(x) -> np.ndarray | None:
    """`x`, not a JAX array, as a NumPy array of numbers (or bools); `None` for anything
    else (a list holding tracers, objects, strings: `jnp.asarray` judges those)."""
    if isinstance(x, jax.Array):
        return None
    try:
        arr = np.asarray(x)
    except Exception:  # e.g. a list of tracers
        return None
    return arr if is_real(arr.dtype) or arr.dtype == np.bool_ else None


def check_scalar(value, name: str, *, positive: bool = False, nonnegative: bool = False,
                 dtype=None):
    """A finite (optionally positive, or nonnegative) real scalar.

    A value known now (a Python or NumPy number, a concrete array) is checked in
    Python and returned as a float: `ValueError` if it is bad, or if it is not
    finite (or, with `positive`, not > 0) once stored in `dtype` (when given: e.g.
    `β = 1e40` is `inf` in float32). A traced value is returned checked (`checked`:
    on the host under `vmap` alone, through `eqx.error_if` inside `jit`).
    """
    traced = isinstance(value, jax.core.Tracer)
    # Only numbers: not a string ("1" would parse), a bool, None or a complex number.
    try:
        arr = value if traced else np.asarray(None if isinstance(value, str | bytes) else value)
    except (TypeError, ValueError):  # a ragged list
        arr = np.asarray(None)
    shaped = is_real(arr.dtype) and arr.ndim == 0
    v = float(arr) if shaped and not traced else 0.0
    info = jnp.finfo(dtype or np.float64)
    big, tiny = float(info.max), float(info.smallest_subnormal)
    now = shaped and not traced
    refuse_first((bad, error, f"`{name}` {message}.") for bad, error, message in (
        (not is_real(arr.dtype), TypeError,
         f"must be a real number, got {f'a traced {arr.dtype}' if traced else repr(value)}"),
        (arr.ndim != 0, ValueError, f"must be a scalar, got shape {arr.shape}"),
        (now and not np.isfinite(v), ValueError, f"must be finite, got {v}"),
        (now and positive and v <= 0, ValueError, f"must be > 0, got {v}"),
        (now and nonnegative and v < 0, ValueError, f"must be ≥ 0, got {v}"),
        # Stored in `dtype`: it must stay finite (and > 0 if `positive`) there.
        (now and abs(v) > big, ValueError, f"= {v:g} overflows {info.dtype.name} (largest "
                                           f"{big:.3g}); use a smaller value or float64 "
                                           "(jax_enable_x64)"),
        (now and positive and v < tiny, ValueError, f"= {v:g} is 0 in {info.dtype.name}; use "
                                                    "a larger value or float64 (jax_enable_x64)"),
    ))
    if traced:
        bad = ~jnp.isfinite(value)
        bad = bad | (value <= 0) if positive else bad | (value < 0) if nonnegative else bad
        sign = "≥ 0 and " if nonnegative else ""
        return checked(value, ~bad, f"`{name}` must be {sign}finite"
                                    f"{' and > 0' if positive else ''}.")
    return v


def check_finite(x: Array, name: str) -> Array:
    """Refuse NaN or inf in concrete weights `x` with a `ValueError` naming `name`. A
    traced `x` passes (no host callback in the caller's program): the simulators turn
    non-finite weights into NaN tokens and raise `NONFINITE`."""
    if known_nonfinite(x):
        raise ValueError(f"`{name}` contains NaN or inf; weights must be finite.")
    return x


def known_nonfinite(x: Array) -> bool:
    """Whether `x` is concrete and has a NaN or inf entry (`False` when traced).

    Evaluated on the host, also when called while another function is being traced
    (a constant closed over by a `jit`)."""
    if not is_concrete(x):
        return False
    return not np.all(np.isfinite(np.asarray(x)))  # on the host: no program


def check_count(value, name: str, minimum: int = 0, maximum: int | None = None) -> int:
    """A Python int ≥ `minimum` (and ≤ `maximum` when given, e.g. `INDEX_MAX`), or a
    `ValueError` naming `name`: the one integer check of jaxattn, from the library
    to the command line."""
    traced = isinstance(value, jax.core.Tracer)
    try:
        number = None if traced or isinstance(value, bool) or int(value) != value else int(value)
    except (TypeError, ValueError, OverflowError):
        number = None
    if number is None or number < minimum or (maximum is not None and number > maximum):
        low = number is None or number < minimum
        bound = f"≥ {minimum}" if low else f"in [{minimum}, {maximum}]"
        raise ValueError(f"`{name}` fixes the shape of a compiled program: it must be a Python "
                         "int known before tracing, got a traced array." if traced else
                         f"`{name}` must be a whole number {bound}, got {value!r}.")
    return number


def check_flag(value, name: str) -> bool:
    """`value` if it is `True` or `False` (a NumPy bool too), else a `TypeError` naming
    `name`: a string such as `"no"` would otherwise count as true."""
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"`{name}` must be True or False, got {value!r}.")
    return bool(value)


def check_sphere(beta, d, name: str = "beta") -> tuple[float, int]:
    """`(value, d)` checked: a finite value `> 0` named `name`, and a dimension `d`, an
    int `≥ 2` (tokens on `S^{d−1}`); one-line `ValueError`s otherwise."""
    try:
        value = float(beta)
    except (TypeError, ValueError):
        value = float("nan")
    refuse_first((
        (isinstance(d, bool) or not isinstance(d, int | np.integer) or d < 2,
         f"`d` must be an int ≥ 2 (tokens on the sphere S^(d-1)), got {d!r}."),
        (not (np.isfinite(value) and value > 0),
         f"`{name}` must be finite and > 0 (a real number), got {beta!r}."),
    ))
    return value, int(d)


#: The largest integer a compiled program compares token indices with (int32).
INDEX_MAX = 2**31 - 1


def check_metric(W, d: int | None = None, *, rtol: float = 1e-6) -> Float[Array, "d d"]:
    """`W` as a symmetric (to `rtol · max|W|`) positive-definite `(d, d)` array, or a
    `ValueError`."""
    W = check_square(as_float_array(W, "W"), "W")
    if d is not None and W.shape[0] != d:
        problem = (f"`W` has shape {W.shape} but the tokens have dimension d={d}; pass a "
                   f"({d}, {d}) metric.")
    else:
        problem = _metric_defect(W, rtol) if is_concrete(W) else None
    if problem:
        raise ValueError(problem)
    return W


def is_one_key(key) -> bool:
    """Whether `key` is one JAX random key: typed (`jax.random.key(seed)`, shape `()`)
    or raw (`jax.random.PRNGKey(seed)`, `uint32` of shape `(2,)`)."""
    dtype = getattr(key, "dtype", None)
    if dtype is None:
        return False
    typed = jnp.issubdtype(dtype, jax.dtypes.prng_key)
    return np.shape(key) == (() if typed else (2,)) and (typed or dtype == jnp.uint32)


def check_square(M, name: str, where: str | None = None) -> Array:
    """`M` as an array, or a one-line `ValueError` (naming `where`, the function, when
    given) unless it is a square `(d, d)` matrix."""
    M = jnp.asarray(M)
    refuse_first([(M.ndim != 2 or M.shape[0] != M.shape[1],
                   f"{where + ': ' if where else ''}`{name}` must be a square (d, d) matrix, "
                   f"got shape {M.shape}.")])
    return M


def _metric_defect(W: Array, rtol: float) -> str | None:
    """What keeps a concrete square `W` from being a finite symmetric positive-definite
    metric, or `None`. Positive definite: the smallest eigenvalue exceeds
    `√d · eps · λ_max`, relative to the largest (an SPD `diag(1e6, 1, 1)` passes),
    with the margin by which rounding `W` to its dtype (`eps`) can move an eigenvalue
    (Weyl), below which `|y|²_W` is not reliably positive in that dtype."""
    Wn = np.asarray(W, dtype=np.float64)
    if not np.all(np.isfinite(Wn)):
        return "`W` contains NaN or inf; it must be a finite SPD matrix."
    asymmetry = np.abs(Wn - Wn.T).max()
    if asymmetry > rtol * max(np.abs(Wn).max(), np.finfo(np.float64).tiny):
        return (f"`W` must be symmetric (max |W − Wᵀ| = {asymmetry:.3g}); symmetrise it "
                "with (W + W.T) / 2.")
    lam = np.linalg.eigvalsh(Wn)
    if lam.min() <= np.sqrt(Wn.shape[0]) * jnp.finfo(W.dtype).eps * max(lam.max(), 0.0):
        return (f"`W` must be positive definite, but its smallest eigenvalue is "
                f"{lam.min():.3g} (largest {lam.max():.3g}); the ellipsoid |y|_W = 1 needs an "
                "SPD metric whose condition number stays well below 1/eps of its dtype.")
    return None


# --- runtime errors, one line first ---------------------------------------------------


def machine_memory() -> int:
    """This machine's physical memory in bytes (0 where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return 0


def memory_text(size: float) -> str:
    """A size in bytes in words: `"3.2 GB"`, `"1.3 TB"`."""
    return f"{size / 1e9:.3g} GB" if size < 1e12 else f"{size / 1e12:.3g} TB"


def too_big(need: float, what: str, fix: str, memory: int | None = None) -> tuple[bool, str]:
    """A row of `refuse_first`: `what` (a subject and its verb, "the grid needs about")
    takes `need` bytes, more than this machine's memory (never refused where the
    system does not say it); `fix` says what to choose instead."""
    memory = machine_memory() if memory is None else memory
    return 0 < memory < need, (f"{what} {memory_text(need)}, more than this machine's memory "
                               f"({memory_text(memory)}); {fix}.")


class SimulationError(ValueError, eqx.EquinoxRuntimeError):
    """A run stopped on its values (tokens that became NaN or inf, a zero or
    non-finite initial token, a flow solver out of steps), in one line that says
    what happened and how to fix it. A `ValueError`, and an `eqx.EquinoxRuntimeError`
    as the checks inside `jit` raise; the same from sharded and unsharded runs."""


# `jaxattn.SimulationError: …` in tracebacks, the name users import it by.
SimulationError.__module__ = "jaxattn"

_FN = TypeVar("_FN", bound=Callable)
_PREFIX = "jaxattn: "
# equinox ends its message with advice on debugging after a blank line; a check
# inside a plain `jax.jit` arrives as a JaxRuntimeError with the same marker.
_EQX_MESSAGE = re.compile(r"EquinoxRuntimeError: (.+?)(?:\n\s*\n|\Z)", re.S)


def short_message(text: str) -> str:
    """One line for a runtime check's message: jaxattn's own without its
    `jaxattn: ` marker, diffrax's out-of-steps with the fix."""
    line = " ".join(text.split())
    if line.startswith("The maximum number of solver steps was reached."):
        return ("the flow solver reached `max_steps` before the last save time: raise "
                "`max_steps`, shorten the horizon, or pass `throw=False` for a per-sample "
                "`success` (weights of a schedule that turn NaN or inf mid-run end the same "
                "way: every step there is rejected).")
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
    program raises a one-line `SimulationError` (as a sharded run's `raise_unless`
    does) in place of equinox's 30–50 lines, whose "inside JIT" stack points at the
    call that compiled the program. Idempotent."""
    if getattr(fn, "__surfaces_errors__", False):
        return fn

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (eqx.EquinoxRuntimeError, jax.errors.JaxRuntimeError) as error:
            failed = error
        message = runtime_message(failed)  # a SimulationError is one too
        # Outside the `except`: the traceback shows no equinox error as context, and
        # ends here, not in the host-side check that raised it.
        raise failed if message is None else SimulationError(message)

    wrapper.__surfaces_errors__ = True
    return wrapper


NONFINITE = (
    "jaxattn: the tokens became NaN or inf during the run: the weights overflow this "
    "floating-point type (e.g. |τ U| or β|P| near its largest value; kernel='exp' once "
    "β xᵀPy passes ≈ 88 in float32, 709 in float64: kernel='usa' is the same dynamics "
    "with time rescaled by e^β, finite while xᵀPy ≤ 1) or contain NaN or inf, or the "
    "kernel's own weights (a user kernel's `weights`/`pointwise` of the logits) are NaN "
    "or inf. Use smaller or finite weights, a kernel finite at every logit, or float64 "
    "(jax_enable_x64)."
)


TOKENS_NONFINITE = "jaxattn: the initial tokens contain NaN or inf; pass finite tokens."
TOKENS_ZERO = (
    "jaxattn: an initial token is zero (or all its entries are below the smallest "
    "normal float), so it has no direction to project onto the ellipsoid; every "
    "token needs a nonzero entry."
)


def _token_defects(x, xp=jnp) -> tuple[Array, Array]:
    """Whether `x` has a NaN/inf entry, and whether it has a zero token: one whose
    largest entry is zero or subnormal (CPUs flush those to 0). Scale-aware (`N_W`
    rescales tiny tokens exactly) and metric-free (an SPD `W` vanishes only at 0).
    With `xp=np`, on the host (concrete tokens: no program)."""
    bad_value = ~xp.all(xp.isfinite(x))
    zero = xp.any(xp.max(xp.abs(x), axis=-1, initial=-xp.inf) < jnp.finfo(x.dtype).tiny)
    return bad_value, zero


def check_tokens(x: Float[Array, "*batch n d"]) -> Float[Array, "*batch n d"]:
    """Refuse NaN/inf entries and zero tokens (they have no point on `E_W`).

    Runs inside `jit` through `eqx.error_if`; the returned array must be used.
    """
    bad_value, _ = _token_defects(x)
    x = eqx.error_if(x, bad_value, TOKENS_NONFINITE)
    _, zero = _token_defects(x)
    return eqx.error_if(x, zero, TOKENS_ZERO)


def check_tokens_now(x: Float[Array, "*batch n d"]) -> None:
    """`check_tokens` on concrete tokens, before a run: the `SimulationError` (a
    `ValueError`) that the check inside `jit` surfaces as."""
    bad_value, zero = _token_defects(np.asarray(x), np)
    raise_unless(not bad_value, TOKENS_NONFINITE)
    raise_unless(not zero, TOKENS_ZERO)


def check_rows_now(x: Float[Array, "*batch n d"], name: str, where: str,
                   directions: bool = True) -> None:
    """Refuse, when `x` is concrete, NaN/inf entries and (with `directions`) zero rows
    (tokens without a direction), with a one-line `ValueError` that names `where` (the
    function) and `name`. Traced `x` passes unchecked: a metric inside `jit`/`vmap` (an
    `observe` of `run_layers`, a sharded program) stays free of host callbacks, and
    its result is NaN for such rows, as documented by each caller."""
    if not is_concrete(x) or x.size == 0:
        return
    for bad, message in zip(_token_defects(np.asarray(x), np)[:1 + directions], (
        f"`{name}` contains NaN or inf; pass finite tokens (the tokens of a failed run are "
        "not meaningful: check its `success`).",
        f"a token (row) of `{name}` is zero, so it has no direction; every token needs a "
        "nonzero entry.",
    )):
        if bad:
            raise ValueError(f"{where}: {message}")


def raise_unless(ok, message: str) -> None:
    """After a sharded run: raise `message` as a `SimulationError` (what a check
    inside `jit` surfaces as, see `surface_errors`) unless every entry of `ok` is
    true."""
    if not np.all(host_values(ok)):  # on the host: no program for a check
        raise SimulationError(short_message(message))


def host_values(tree):
    """`tree`'s values on this host, those of arrays spread over several processes
    gathered from all of them (`jax.distributed`)."""
    def value(leaf):
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            from jax.experimental import multihost_utils

            return multihost_utils.process_allgather(leaf, tiled=True)
        return jax.device_get(leaf)

    return jax.tree.map(value, tree)


def checked(value, ok, message: str):
    """`value` once `ok` holds (a run's finiteness, a solve's result): checked on the
    host where `ok`'s values are known (`checked_on_host`), so that the program that
    computed it holds no callback (issue 42); inside the caller's program
    (`eqx.error_if`) where traced."""
    if checked_on_host(ok, lambda ok: raise_unless(ok, message)):
        return value
    return eqx.error_if(value, ~ok, message)


def checked_on_host(tree, check: Callable) -> bool:
    """Whether `check` (a host function that raises for bad values) has run on the
    values of `tree`: it does where they are concrete, and under `vmap`s alone, whose
    batching rules see the whole batch's values (so that `jax.vmap(ja.meanfield.solve)`
    runs no program for its check). Inside `jit` they are not known, and nothing is
    checked here."""
    if all(is_concrete(leaf) for leaf in jax.tree.leaves(tree)):
        check(tree)
        return True
    done = []

    @jax.custom_batching.custom_vmap
    def probe(tree):
        return tree

    @probe.def_vmap
    def rule(axis_size, in_batched, tree):
        if all(is_concrete(leaf) for leaf in jax.tree.leaves(tree)):
            check(tree)
            done.append(True)
            return tree, in_batched[0]
        return probe(tree), in_batched[0]  # an outer vmap's rule may know them

    probe(tree)
    return bool(done)


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
