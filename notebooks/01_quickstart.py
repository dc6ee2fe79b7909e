# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 01 — Quickstart: tokens on a sphere reach consensus
#
# Tokens `x_i ∈ S²` under multi-head self-attention (paper 001 eq. 6): each head
# pulls every token towards an attention-weighted mean. `ja.solve_flow` integrates
# the continuous flow, `ja.run_layers` the discrete layers (eq. 4), and
# `ja.misalignment` measures how far the tokens are from one cluster (eq. 25).
# Set `JAXATTN_NOTEBOOK_SMALL=1` to run everything at a tiny size.

# %%
import os

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt

import jaxattn as ja

jax.config.update("jax_enable_x64", True)
SMALL = os.environ.get("JAXATTN_NOTEBOOK_SMALL") == "1"
n, T, saves = (6, 3.0, 60) if SMALL else (10, 10.0, 400)

# %% [markdown]
# ## The model: two heads, `U = I`, random `P_η`

# %%
kP, kx = jax.random.split(jax.random.PRNGKey(0))
P = jax.random.normal(kP, (2, 3, 3))
U = jnp.broadcast_to(jnp.eye(3), (2, 3, 3))
dyn = ja.SelfAttentionDynamics(P, U, beta=1.0)
x0 = ja.sample_ellipsoid(kx, n, 3)
x0 = x0 * jnp.sign(x0[:, 2:3])  # all in the upper hemisphere: Theorem 4.1 applies
print(ja.theory.predict(dyn, x0).statement)

# %% [markdown]
# ## One simulation: the flow and the layers

# %%
ts = jnp.linspace(0.0, T, saves + 1)
ys = ja.solve_flow(dyn, x0, ts)             # (T, n, 3)
tau = 0.1
xl = ja.run_layers(dyn, x0, int(T / tau), tau)
E, E_layers = ja.misalignment(ys), ja.misalignment(xl)
print(f"E(0) = {float(E[0]):.3f}  →  E(T) = {float(E[-1]):.2e}")
print("consensus time (E < 1e-4):", float(ja.metrics.consensus_time(ts, E, 1e-4)))

# %%
fig = plt.figure(figsize=(10, 4))
ax = fig.add_subplot(1, 2, 1, projection="3d")
for i in range(n):
    ax.plot(*ys[:, i].T, lw=1)
    ax.scatter(*ys[0, i], color="k", s=8)
ax.set_title("token paths on $S^2$")
ax = fig.add_subplot(1, 2, 2)
ax.semilogy(ts, E, label="flow")
ax.semilogy(tau * jnp.arange(len(E_layers)), E_layers, ":", label=rf"layers, $\tau$={tau}")
ax.set_xlabel("t"), ax.set_ylabel("misalignment E"), ax.legend()
plt.tight_layout()

# %% [markdown]
# ## Many prompts at once
# Leading axes are a batch: one compiled, vmapped program. These starts are uniform
# on the sphere, not in a hemisphere, so Theorem 4.1 says nothing of them: most
# still reach consensus by `T`, and one may not (an `E` near 1: its tokens have
# not gathered by `T`, or sit at another equilibrium).

# %%
xs0 = jax.vmap(lambda k: ja.sample_ellipsoid(k, n, 3))(jax.random.split(kx, 16))
E_batch = ja.misalignment(ja.solve_flow(dyn, xs0, ts)[:, -1])
print("final E over 16 random starts:", jnp.round(E_batch, 6))
