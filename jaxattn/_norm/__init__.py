"""The normalisation placements: a family (`base.py` + one file per member), as
diffrax's `_solver/`. `as_norm` turns a user's string into its member, once, where a
model is built."""

from .base import AbstractNorm as AbstractNorm
from .base import Update as Update
from .euler import AbstractEulerNorm as AbstractEulerNorm
from .ngpt import NGPT as NGPT
from .none import NoNorm as NoNorm
from .peri import PeriNorm as PeriNorm
from .post import PostNorm as PostNorm
from .pre import PreNorm as PreNorm

#: The built-in placements by their string spelling (the one declaration of the names).
BUILTIN = {cls.name: cls for cls in (PostNorm, PreNorm, PeriNorm, NGPT, NoNorm)}
NORMS = tuple(BUILTIN)


def as_norm(norm) -> AbstractNorm:
    """The placement a model's `norm=` names: a member of `AbstractNorm` as given, or a
    built-in one by name."""
    if isinstance(norm, AbstractNorm):
        return norm
    if isinstance(norm, str) and norm in BUILTIN:
        return BUILTIN[norm]()
    raise ValueError(f"`norm` must be one of {', '.join(map(repr, NORMS))} or a "
                     f"ja.AbstractNorm (e.g. ja.PostNorm()), got {norm!r}.")
