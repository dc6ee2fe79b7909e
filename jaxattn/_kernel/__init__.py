"""The attention kernels: a family (`base.py` + one file per member), as diffrax's
`_solver/`. `as_kernel` turns a user's string into its member, once, where a model
is built."""

import equinox as eqx

from .._validate import refuse_first
from .base import AbstractKernel as AbstractKernel
from .base import State as State
from .check import check_kernel as check_kernel
from .exp import Exp as Exp
from .exponential import AbstractExponentialKernel as AbstractExponentialKernel
from .hardmax import Hardmax as Hardmax
from .pointwise import AbstractPointwiseKernel as AbstractPointwiseKernel
from .sigmoid import Sigmoid as Sigmoid
from .softmax import Softmax as Softmax
from .usa import USA as USA

#: The built-in kernels by their string spelling (the one declaration of the names).
BUILTIN = {cls.name: cls for cls in (Softmax, Sigmoid, Exp, USA, Hardmax)}
KERNELS = tuple(BUILTIN)


def as_kernel(kernel, bias=None) -> AbstractKernel:
    """The kernel a model's `kernel=` names: a member of `AbstractKernel` as given, or
    a built-in one by name; `bias=` is the sigmoid's (kept for `kernel="sigmoid",
    bias=b`)."""
    named = isinstance(kernel, str) and kernel in BUILTIN
    member = isinstance(kernel, AbstractKernel)
    refuse_first((
        (not (named or member), f"`kernel` must be one of {', '.join(map(repr, KERNELS))} or "
                                f"a ja.AbstractKernel (e.g. ja.Softmax()), got {kernel!r}."),
        (named and bias is not None and kernel != "sigmoid",
         f"`bias` is the sigmoid's b: it needs kernel='sigmoid', got kernel={kernel!r}."),
        (member and bias is not None, "`bias` goes into the kernel: pass "
                                      "kernel=ja.Sigmoid(bias=b) and no `bias=`."),
    ))
    if member:
        return kernel
    return BUILTIN[kernel]() if bias is None else Sigmoid(bias)


def bias_of(kernel: AbstractKernel):
    """The sigmoid's bias `b` (what `kernel="sigmoid", bias=b` set; `None` for its
    default `−log n` and for every other kernel)."""
    return kernel.bias if isinstance(kernel, Sigmoid) else None


def static_part(kernel: AbstractKernel) -> AbstractKernel:
    """The kernel without its array parameters (hashable: a static argument of the
    blocks' custom VJP; the parameters reach the blocks through `offset`)."""
    return eqx.filter(kernel, eqx.is_array, inverse=True)
