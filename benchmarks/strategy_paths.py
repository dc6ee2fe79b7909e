"""Compiled per-call time of the layers and RK4 flow on the fused, general and kernel-free paths (S1's shape)."""
import sys, time, json
import jax, jax.numpy as jnp
import jaxattn as ja
import diffrax as dfx
key = jax.random.key(0)
dyn = ja.random_dynamics(key, 2, 3)
x0 = jax.random.normal(jax.random.key(1), (1000, 10, 3), jnp.float32)
def t(f):
    jax.block_until_ready(f()); best = 1e9
    for _ in range(7):
        s = time.perf_counter(); jax.block_until_ready(f()); best = min(best, time.perf_counter() - s)
    return best
ts = jnp.linspace(0.0, 2.0, 3)
out = {}
for s in ("fused", "general"):
    out[f"layers_{s}"] = t(lambda: ja.run_layers(dyn, x0, 200, 0.05, observe=ja.misalignment, strategy=s))
    out[f"rk4_{s}"] = t(lambda: ja.solve_flow(dyn, x0, ts, solver=ja.RK4(), dt0=0.01,
                                              stepsize_controller=dfx.ConstantStepSize(), strategy=s))
print(json.dumps({k: round(v * 1e3, 2) for k, v in out.items()}))
