"""XLA CPU flags against jaxattn's workloads: each setting in a fresh process.

    .venv/bin/python benchmarks/xla_flags.py                 # ~3 minutes
    .venv/bin/python benchmarks/xla_flags.py --json flags.json

For every `XLA_FLAGS` value below, a child process times (best of `--repeats`
after compilation): a float32 4096² matrix product, S1 (200 RK4 steps of 1000 tiny
systems, n = 10, d = 3, h = 2), S2 (100 causal layers, n = 50, d = 500, h = 2,
batch 16) and one GPT-2-small pure-attention block on 100 × 200 tokens (the unit of
the S4 pass, 12 of them per pass); and XLA's compile time (its own monitoring event)
for the small programs a test compiles: `solve_flow`, its gradient and `run_layers`
at n = 5 … 8 (12 programs, no compilation cache). jaxattn keeps XLA's defaults
unless a flag wins beyond the run-to-run spread; a user sets `XLA_FLAGS` before the
first JAX call. The test suite compiles with `TEST_XLA_FLAGS` (`tests/_suite_start.py`),
the last setting below: most of a fresh clone's test time is compilation.
"""

import argparse
import json
import os
import subprocess
import sys

SETTINGS = [
    "",
    "--xla_cpu_use_xnnpack=true",
    "--xla_cpu_use_onednn=true",
    "--xla_cpu_experimental_ynn_fusion_type=dot,eltwise,reduce",
    "--xla_cpu_experimental_ynn_fusion_type=individual_dot",
    "--xla_backend_optimization_level=0",
    "--xla_backend_optimization_level=1",
    "--xla_cpu_use_fusion_emitters=false",
    "--xla_cpu_use_fusion_emitters=false --xla_backend_optimization_level=1",
]

CHILD = r"""
import json, sys, time
import diffrax as dfx
import jax, jax.numpy as jnp, numpy as np
import jaxattn as ja
import jaxattn.models as jm
from jaxattn.bench import suite

repeats = int(sys.argv[1])
jax.config.update("jax_enable_x64", True)  # as the tests
compiling = [0.0]


def on_event(event, seconds, **kwargs):
    if event == "/jax/core/compile/backend_compile_duration":
        compiling[0] += seconds


jax.monitoring.register_event_duration_secs_listener(on_event)
key = jax.random.PRNGKey(0)
for n in (5, 6, 7, 8):  # the small programs of a test: 12 compilations
    dyn = ja.SelfAttentionDynamics(jax.random.normal(key, (1, 3, 3)), jnp.eye(3)[None])
    x = ja.sample_ellipsoid(key, n, 3)
    ts = jnp.linspace(0.0, 3.0, 4)
    jax.block_until_ready(ja.solve_flow(dyn, x, ts))
    jax.block_until_ready(ja.run_layers(dyn, x, 20, 0.1))
    jax.block_until_ready(jax.grad(lambda x: ja.solve_flow(dyn, x, ts).sum())(x))
out = {"test_programs_compile_s": compiling[0]}
jax.config.update("jax_enable_x64", False)

def best(fn, *args):
    compiled = jax.jit(fn).lower(*args).compile()
    jax.block_until_ready(compiled(*args))
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        ts.append(time.perf_counter() - t)
    return min(ts)

a = jnp.asarray(np.random.default_rng(0).standard_normal((4096, 4096), np.float32))
out["matmul_gflops"] = 2 * 4096**3 / best(jnp.matmul, a, a) / 1e9
for name, layers in (("S1", None), ("S2", 100)):
    prob = suite.SIZES[suite.case_names([name])[0]]  # S1, S2: the suite's labels
    arr = prob.arrays()
    dyn, x0 = prob.dynamics(arr), jnp.asarray(arr["x0"])
    if layers is None:
        ts = jnp.array([0.0, 10.0], jnp.float32)
        fn = lambda dyn, x0: ja.solve_flow(dyn, x0, ts, solver=ja.RK4(), dt0=0.05,
                                           stepsize_controller=dfx.ConstantStepSize())
    else:
        fn = lambda dyn, x0: ja.run_layers(dyn, x0, layers, 0.1, observe=ja.misalignment)
    out[name + "_s"] = best(fn, dyn, x0)
model = jm.init("gpt2", jax.random.PRNGKey(0))
block = model.layer_block(0)
x = jax.random.normal(jax.random.PRNGKey(1), (100, 200, 768))
mask = model.mask(200, 0)
out["gpt2_attn_block_s"] = best(
    lambda block, x: jax.vmap(lambda s: block(s, mask, None, ffn=False))(x), block, x)
print(json.dumps(out))
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--settings", nargs="+", default=SETTINGS, metavar="FLAGS",
                   help="XLA_FLAGS values to compare ('' is the default)")
    p.add_argument("--json")
    args = p.parse_args()
    rows = []
    for flags in args.settings:
        env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu",
                   JAX_ENABLE_COMPILATION_CACHE="0")
        res = subprocess.run([sys.executable, "-c", CHILD, str(args.repeats)], env=env,
                             capture_output=True, text=True, timeout=900)
        if res.returncode != 0:
            rows.append({"flags": flags, "error": res.stderr.strip().splitlines()[-1]})
        else:
            rows.append({"flags": flags, **json.loads(res.stdout.strip().splitlines()[-1])})
        r = rows[-1]
        label = flags or "(default)"
        if "error" in r:
            print(f"{label:<58} failed: {r['error']}", flush=True)
        else:
            print(f"{label:<58} matmul {r['matmul_gflops']:6.0f} GFLOP/s  S1 {r['S1_s']:.3f} s  "
                  f"S2 {r['S2_s']:.3f} s  GPT-2 attn block {r['gpt2_attn_block_s']:.3f} s  "
                  f"compiling 12 test programs {r['test_programs_compile_s']:.1f} s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
