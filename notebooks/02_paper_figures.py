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
# # 02 — Paper 001 §6.1: the experiments, the theorem checker and a sweep
#
# Each simulation of paper 001 §6.1 is one command, `jaxattn run NAME`, writing a run
# folder with its data, figures and a verdict against the theorem. `ja.theory`
# says which theorem covers a model and checks its prediction; `ja.sweep` repeats
# an experiment over a parameter grid with many random instances.

# %%
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import jax
from IPython.display import Image, display

import jaxattn as ja

jax.config.update("jax_enable_x64", True)
SMALL = os.environ.get("JAXATTN_NOTEBOOK_SMALL") == "1"
work = Path(tempfile.mkdtemp(prefix="jaxattn-nb02-"))

# %% [markdown]
# ## Theorem 4.1: 10 tokens on S², two time-varying heads (Figs. 1–3)

# %%
size = ["--horizon", "2", "--saves", "40"] if SMALL else []
out = work / "thm41"
r = subprocess.run([sys.executable, "-m", "jaxattn", "run", "thm41-sphere", "--out", str(out),
                    "--no-progress", *size], capture_output=True, text=True)
print(r.stdout, r.stderr[-500:])
display(Image(filename=str(out / "thm41_sphere.png"), width=800))

# %% [markdown]
# ## Which theorem covers a model?

# %%
from jaxattn.experiments import paper  # noqa: E402  (the paper's model set-ups, as in `jaxattn run`)

key = jax.random.PRNGKey(0)
dyn = paper.symmetric_dynamics(key, 3)  # causal, one head, symmetric U (§6.1.3)
print(ja.theory.classify(dyn).summary())
v1 = paper.top_eigenvector(dyn.U(0.0)[0])
x0 = paper.hemisphere_of(jax.random.PRNGKey(1), v1, 8)
pred = ja.theory.predict(dyn, x0)
print(pred.theorem, pred.outcome, "in domain:", bool(pred.in_domain))
ys = ja.solve_flow(dyn, x0, jax.numpy.linspace(0.0, 5.0 if SMALL else 20.0, 11))
print("prediction held at T:", bool(pred.check(ys[-1])))

# %% [markdown]
# ## A sweep: consensus time against β, many instances per point

# %%
result = ja.sweep(
    "thm41-sphere", {"beta": [0.5, 2.0] if SMALL else [0.5, 1, 2, 4]},
    instances=4 if SMALL else 64, set={"horizon": 3.0 if SMALL else 10.0, "saves": 30},
    out=work / "sweep", progress=False,
)
print(ja.sweep.format_table(result.summary, ["beta"]))
display(Image(filename=str(result.folder / "sweep.png"), width=800))
