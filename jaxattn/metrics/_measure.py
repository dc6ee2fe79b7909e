"""The tokens as a measure (the mean-field view): its mean and its density on S²,
in O(n) memory at any n."""

import math

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from .._stacked import map_batch
from .._validate import check_count, refuse_first
from ._consensus import _tokens


def order_parameter(x: Float[Array, "*batch n d"]) -> Float[Array, "*batch"]:
    """The order parameter of the mean-field literature: the norm of the mean token,
    `|(1/n) Σ_i x_i|`.

    For tokens on the unit sphere it lies in `[0, 1]`: `1` exactly when all tokens
    coincide (collapse), about `1/√n` for `n` independent uniform tokens
    (`E |mean|² = 1/n`), `0` for configurations balanced around the origin.

    **Arguments:**

    - `x`: tokens `(..., n, d)`, usually on the unit sphere (it is not projected:
      tokens of other lengths give the norm of their plain mean). NaN or inf is
      refused with a `ValueError` when `x` is concrete; traced, the result is NaN.

    **Returns:**

    `|x̄|` with the shape of the leading axes.
    """
    x = _tokens(x, "order_parameter", directions=False)
    return jnp.linalg.norm(jnp.mean(x, axis=-2), axis=-1)


class SphereDensity(eqx.Module):
    """Tokens binned on S² over equal-area cells: `bands` bands of equal height in
    `z` (Archimedes: equal heights, equal areas) times `sectors` equal longitude
    sectors, each cell of area `4π / (bands · sectors)`.

    - `counts`: `(..., bands, sectors)` tokens per cell (band 0 at the south pole,
      sector 0 starting at longitude `−π`); they sum to `n`.
    - `density`: `(..., bands, sectors)` the density per unit area,
      `counts / (n · cell area)`: it integrates to 1 over the sphere, and a uniform
      measure gives `1/(4π)` in every cell.
    - `z_edges`: `(bands + 1,)` the bands' boundaries in `z = sin(latitude)`, `−1…1`.
    - `lon_edges`: `(sectors + 1,)` the sectors' boundaries in longitude, `−π…π`.
    """

    counts: Int[Array, "*batch bands sectors"]
    density: Float[Array, "*batch bands sectors"]
    z_edges: Float[Array, " bands_1"]
    lon_edges: Float[Array, " sectors_1"]


def sphere_density(
    x: Float[Array, "*batch n 3"], cells: tuple[int, int] = (12, 24)
) -> SphereDensity:
    """The density of tokens on S² as a histogram over equal-area cells.

    Each token is taken by its direction `x / |x|` and binned by its height
    `z = x₃/|x|` (bands of equal height have equal area) and its longitude
    `atan2(x₂, x₁)`. The applications' figures (`draw_sphere_density`, above the
    library) draw the result as a map in the cylindrical equal-area projection,
    where these cells are equal rectangles.

    **Arguments:**

    - `x`: tokens `(..., n, 3)`, nonzero finite rows (refused when concrete, as in
      `misalignment`).
    - `cells`: `(bands, sectors)`, the numbers of bands in `z` and of longitude
      sectors, each `≥ 1`.

    **Returns:**

    A `SphereDensity`: counts and density per cell `(..., bands, sectors)`, and the
    cell boundaries.
    """
    x = _tokens(x, "sphere_density")
    refuse_first((
        (x.shape[-1] != 3, f"sphere_density needs tokens in R³ for a map of S², got d = "
         f"{x.shape[-1]}; pass three coordinates, e.g. x @ V with V (d, 3)."),
        (not (isinstance(cells, tuple | list) and len(cells) == 2), f"sphere_density: `cells` "
         f"must be (bands, sectors), two whole numbers ≥ 1 such as (12, 24), got {cells!r}."),
    ))
    bands = check_count(cells[0], "cells[0] (bands)", 1)
    sectors = check_count(cells[1], "cells[1] (sectors)", 1)
    n = x.shape[-2]
    counts = map_batch(lambda xi: _cell_counts(xi, bands, sectors), x)
    area = 4 * math.pi / (bands * sectors)
    return SphereDensity(
        counts=counts,
        density=counts / (n * area),
        # The edges the binning below uses: `(z + 1)/2 · bands` crosses k at -1 + 2k/bands.
        z_edges=(2 * jnp.arange(bands + 1, dtype=x.dtype) / bands - 1),
        lon_edges=(2 * jnp.arange(sectors + 1, dtype=x.dtype) / sectors - 1) * math.pi,
    )


def _cell_counts(x: Float[Array, "n 3"], bands: int, sectors: int) -> Int[Array, "bands sectors"]:
    """Tokens per cell: one index per token and a bincount, O(n + cells) memory."""
    r = jnp.linalg.norm(x, axis=-1)
    z = x[:, 2] / r
    lon = jnp.arctan2(x[:, 1], x[:, 0])
    # z = 1 and lon = π sit on the last closed edge: clipped into the last cell.
    band = jnp.clip(jnp.floor((z + 1) / 2 * bands), 0, bands - 1).astype(jnp.int32)
    sector = jnp.clip(jnp.floor((lon + math.pi) / (2 * math.pi) * sectors), 0,
                      sectors - 1).astype(jnp.int32)
    counts = jnp.bincount(band * sectors + sector, length=bands * sectors)
    return counts.reshape(bands, sectors)
