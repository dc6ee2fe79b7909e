"""Measures over all pairs of tokens, in blocks of rows: at 10⁵–10⁶ tokens no n × n
array is ever formed (`potential`; `cluster_labels` and `cluster_count`, one
clustering)."""

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Bool, Float, Int

from .._precision import matmul
from .._validate import check_count

#: Elements of one block of rows against all keys (`block × n`): 2²² is 16 MiB in
#: float32, so a block is far below n² at the mean-field sizes and still large
#: enough that each step of the loop over blocks is a full kernel.
TILE = 2**22

#: `cluster_labels` (and so `cluster_count`) keeps the dense reachability matrix
#: (log₂ n squarings, O(n³ log n) work, O(n² d) memory) up to this n, for the many
#: small systems of a batch: vmapped, the blocked sweeps' while loop runs until the
#: batch's slowest system is done, and past ~100 tokens the n³ products lose
#: (BENCHMARKS.md, "Measured claims behind design choices").
DENSE_COUNT_MAX = 64


def block_rows(n: int, block_size) -> int:
    """Rows per block: `block_size` if given (at most `n`), else `TILE // n`."""
    if block_size is None:
        return max(1, min(n, TILE // max(n, 1)))
    return min(check_count(block_size, "block_size", 1), n)


def _blocks(x: Float[Array, "n d"], block: int):
    """`x` cut into `(n_blocks, block, d)` with zero rows padding the last block, and
    which rows are real `(n_blocks, block)`."""
    n = x.shape[0]
    pad = -n % block
    xb = jnp.pad(x, ((0, pad), (0, 0))).reshape(-1, block, x.shape[1])
    real = (jnp.arange(n + pad) < n).reshape(-1, block)
    return xb, real


def exp_score_sum(x: Float[Array, "n d"], P: Float[Array, "d d"], beta,
                  block: int) -> Float[Array, ""]:
    """`Σ_ij exp(β x_iᵀ P x_j)` a block of rows at a time (O(block · n) memory; the
    block is recomputed in the backward pass rather than stored). The block sums are
    added as one array at the end, not carried, so the blocks add no rounding chain
    of their own. Products are true float32 (a measure, not the model's run)."""
    y = matmul(x, P, "float32")
    yb, real = _blocks(y, block)

    @jax.checkpoint
    def one(args):
        yi, keep = args
        terms = jnp.exp(beta * matmul(yi, x.T, "float32"))
        return jnp.sum(jnp.where(keep[:, None], terms, 0))

    return jnp.sum(lax.map(one, (yb, real)))


def linked(a: Float[Array, "m d"], b: Float[Array, "k d"], eps) -> Bool[Array, "m k"]:
    """`|a_i − b_j| < eps`, from the differences themselves (no Gram-matrix
    cancellation). The dense and the blocked counts both use it, so they see the
    same links bit for bit."""
    return jnp.linalg.norm(a[:, None, :] - b[None, :, :], axis=-1) < eps


def dense_labels(x: Float[Array, "n d"], eps) -> Int[Array, " n"]:
    """Each token's cluster, named by its smallest token index, from the n × n
    reachability matrix squared until it covers every chain: for small n only (see
    `DENSE_COUNT_MAX`)."""
    n = x.shape[0]
    reach = linked(x, x, eps).astype(x.dtype)
    # Squaring the reachability matrix doubles the chain length it covers. Its
    # entries are 0/1 and its counts at most n < 2^24: exact in a true float32
    # product, which is stated like every other.
    num_squarings = max(1, (max(n, 2) - 1).bit_length())
    reach = lax.fori_loop(
        0, num_squarings, lambda _, r: (matmul(r, r, "float32") > 0).astype(r.dtype), reach
    )
    # Every token reaches itself, so the first token each row reaches is the smallest
    # of its cluster.
    return jnp.argmax(reach > 0, axis=1)


def component_roots(x: Float[Array, "n d"], eps, block: int
                    ) -> tuple[Int[Array, " n"], Int[Array, ""]]:
    """Each token's cluster, named by its smallest token index, in O(block · n)
    memory, and the number of sweeps that took.

    A forest of parent pointers `f` (`f_i ≤ i`, so no cycles), as in
    Shiloach–Vishkin: each sweep finds, a block of rows at a time, the smallest label
    `m_i` among the tokens within `eps` of token `i`, hooks `i`'s root under it
    (`f[f_i] ← min(f[f_i], m_i)`) and then jumps pointers (`f ← f[f]`) until every
    tree is a star. Labels only decrease, so the sweeps stop; at their fixed point
    linked tokens carry equal labels, hence one label per cluster. Hooking roots
    rather than single tokens merges whole trees at once: a chain needs a number of
    sweeps that grows like log n, not like its length.
    """
    n = x.shape[0]
    xb, _ = _blocks(x, block)

    def smallest_linked_label(f):
        def one(xi):
            return jnp.min(jnp.where(linked(xi, x, eps), f[None, :], n), axis=1)

        return lax.map(one, xb).reshape(-1)[:n]

    def jump(f):
        return lax.while_loop(lambda g: jnp.any(g[g] != g), lambda g: g[g], f)

    def sweep(state):
        f, _, k = state
        m = smallest_linked_label(f)
        g = jump(jnp.minimum(f.at[f].min(m), m))
        return g, jnp.any(g != f), k + 1

    f, _, sweeps = lax.while_loop(lambda s: s[1], sweep, (jnp.arange(n), jnp.array(True), 0))
    return f, sweeps
