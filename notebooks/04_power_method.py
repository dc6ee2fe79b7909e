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
# # 04 — Layers as a power method (paper 004)
#
# A layer's value matrices sum to the layer matrix `Ω = Σ_η U_η`. Repeating a layer
# acts like the power method: tokens align with the principal eigenvector `v₁` of
# `Ω`. `ja.spectral` computes `Ω`, its spectrum and the alignment
# `c = mean_i |cos(x_i, v₁)|`, and steers a layer with a rank-1 edit `Ω + γ u uᵀ`.

# %%
import os

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

import jaxattn as ja

jax.config.update("jax_enable_x64", True)
SMALL = os.environ.get("JAXATTN_NOTEBOOK_SMALL") == "1"
prompts, tokens, depth = (2, 8, 10) if SMALL else (8, 32, 60)

# %% [markdown]
# ## The layer matrix of a trained model and its spectrum

# %%
model = ja.models.load("all-MiniLM-L6-v2")
Omega = ja.spectral.layer_matrix(model, -1)
spec = ja.spectral.spectrum(Omega)
print("Ω:", Omega.shape, " leading |λ|:", np.round(np.abs(np.asarray(spec.eigenvalues[:5])), 3))

# %% [markdown]
# ## Shared weights: repeat the last layer and watch the tokens align with `v₁`

# %%
x0 = ja.spectral.random_tokens(jax.random.PRNGKey(0), prompts, tokens, Omega.shape[0])
specs, cos = ja.spectral.shared_alignment(model, x0, depth, layer=-1)
c = np.asarray(cos[..., 0, 0]).mean(axis=(0, 2))  # mean over prompts and tokens, v₁ by |λ|
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(c)
ax.set_xlabel("repetitions of the last layer"), ax.set_ylabel(r"mean $|\cos(x_i, v_1)|$")
plt.tight_layout()
print(f"alignment with v₁: {c[0]:.3f} → {c[-1]:.3f}")

# %% [markdown]
# ## Steering: add `γ u uᵀ` to the last layer and the principal direction follows `u`

# %%
u = jax.random.normal(jax.random.PRNGKey(1), (Omega.shape[0],))
u = u / jnp.linalg.norm(u)
for gamma in (0.0, 5.0, 50.0):
    steered = ja.spectral.steer(model, u, gamma)
    principal = ja.spectral.spectrum(ja.spectral.layer_matrix(steered, -1)).principal
    print(f"γ = {gamma:>4}: alignment of u with the principal direction "
          f"{float(ja.spectral.alignment(u[None, :], principal)):.3f}")
