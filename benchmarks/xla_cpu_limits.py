"""Where XLA's CPU kernels put a floor under two benchmark cases (S4 GPT-2 pure
attention, S1 tiny systems). Each figure is measured in this run, on this machine.

    .venv/bin/python benchmarks/xla_cpu_limits.py            # ~2 minutes
    .venv/bin/python benchmarks/xla_cpu_limits.py --json limits.json

**S4, GPT-2 small pure attention, 100 prompts × 200 tokens.** One block multiplies
the tokens `(20000, 768)` by the fused Q/K/V weights `(768, 2304)` and by the
output projection `(768, 768)` — 94.4 GFLOP of plain 2-D matrix products, 12 times
per pass — plus the per-head score and value products (batched `200×64×200`).
The script times those products alone, as single XLA programs on contiguous
arrays (the best case for XLA), and the same products in PyTorch, then compares
the resulting *lower bound* on a jaxattn pass (the two projections only, nothing
else) with the target, the HuggingFace pass divided by 1.1. It also times PyTorch's fused
causal SDPA kernel, which the HuggingFace blocks use for the attention core.

**S1, many tiny systems (n = 10, d = 3, h = 2, batch 1000).** Times one evaluation
of the velocity under `vmap` in the formulations tried (einsum as in
`SelfAttentionDynamics`, broadcast-and-sum, batch-last with the batch as the
vectorised axis) against the plain PyTorch evaluation.
"""

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch

import jaxattn as ja


def best_of(fn, repeats: int) -> float:
    """Minimum wall seconds of `repeats` calls after one warm-up call."""
    jax.block_until_ready(fn())
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        ts.append(time.perf_counter() - t)
    return min(ts)


def s4_floor(repeats: int, hf_pass_s: float | None) -> dict:
    B, n, d, h, k = 100, 200, 768, 12, 64
    rng = np.random.default_rng(0)
    x = rng.standard_normal((B * n, d), np.float32)
    w_qkv = rng.standard_normal((d, 3 * d), np.float32)
    w_o = rng.standard_normal((d, d), np.float32)
    q = rng.standard_normal((B * h, n, k), np.float32)
    kt = rng.standard_normal((B * h, k, n), np.float32)
    a = rng.standard_normal((B * h, n, n), np.float32)
    mm = jax.jit(jnp.matmul)
    arrays = dict(x=x, w_qkv=w_qkv, w_o=w_o, q=q, kt=kt, a=a)
    J = {name: jnp.asarray(v) for name, v in arrays.items()}
    T = {name: torch.from_numpy(v) for name, v in arrays.items()}
    products = {  # name: (flops, jax call, torch call)
        "Q/K/V projection (20000×768 @ 768×2304)": (
            2 * B * n * d * 3 * d, lambda: mm(J["x"], J["w_qkv"]), lambda: T["x"] @ T["w_qkv"]),
        "output projection (20000×768 @ 768×768)": (
            2 * B * n * d * d, lambda: mm(J["x"], J["w_o"]), lambda: T["x"] @ T["w_o"]),
        "scores (1200 × 200×64 @ 64×200)": (
            2 * B * h * n * n * k, lambda: mm(J["q"], J["kt"]), lambda: torch.bmm(T["q"], T["kt"])),
        "values (1200 × 200×200 @ 200×64)": (
            2 * B * h * n * n * k, lambda: mm(J["a"], J["q"]), lambda: torch.bmm(T["a"], T["q"])),
    }
    rows = []
    with torch.no_grad():
        for name, (flops, fj, ft) in products.items():
            tj, tt = best_of(fj, repeats), best_of(ft, repeats)
            rows.append({"product": name, "gflop": flops / 1e9, "jax_s": tj, "torch_s": tt,
                         "jax_gflops": flops / tj / 1e9, "torch_gflops": flops / tt / 1e9})
        qs = T["q"].reshape(B, h, n, k)
        sdpa = best_of(lambda: torch.nn.functional.scaled_dot_product_attention(
            qs, qs, qs, is_causal=True), repeats)
    L = 12
    proj = sum(r["jax_s"] for r in rows[:2]) * L
    core = sum(r["jax_s"] for r in rows[2:]) * L
    out = {"rows": rows, "layers": L, "jax_projection_floor_s": proj,
           "jax_batched_products_alone_s": core, "torch_sdpa_core_s": sdpa * L}
    if hf_pass_s:
        out["hf_pass_s"] = hf_pass_s
        out["target_s"] = hf_pass_s / 1.1
    return out


def s1_velocity(repeats: int) -> dict:
    B, n, d, h = 1000, 10, 3, 2
    key = jax.random.PRNGKey(0)
    P, U = jax.random.normal(key, (2, h, d, d))
    dyn = ja.SelfAttentionDynamics(P, U)
    x = jax.vmap(lambda k: ja.sample_ellipsoid(k, n, d))(jax.random.split(key, B))

    def broadcast_sum(x):  # no dot products at all: XLA fuses it into loops
        px = jnp.sum(P[:, None] * x[None, :, None, :], -1)
        s = jnp.sum(x[None, :, None, :] * px[:, None], -1)
        mixed = jnp.sum(jax.nn.softmax(s, -1)[..., None] * x[None, None], 2)
        v = jnp.sum(mixed[:, :, None, :] * U[:, None], (0, -1))
        return v - jnp.sum(x * v, -1, keepdims=True) * x

    def batch_last(xt):  # (n, d, B): the batch is the contiguous, vectorised axis
        px = jnp.einsum("hde,jeb->hjdb", P, xt)
        s = jnp.sum(xt[None, :, None] * px[:, None], 3)
        mixed = jnp.sum(jax.nn.softmax(s, 2)[:, :, :, None] * xt[None, None], 2)
        v = jnp.einsum("hidb,hed->ieb", mixed, U)
        return v - jnp.sum(xt * v, 1, keepdims=True) * xt

    xt = jnp.transpose(x, (1, 2, 0))
    forms = {
        "einsum (SelfAttentionDynamics.velocity)":
            (jax.jit(jax.vmap(lambda s: dyn.velocity(0.0, s))), x),
        "broadcast-and-sum": (jax.jit(jax.vmap(broadcast_sum)), x),
        "batch-last": (jax.jit(batch_last), xt),
    }
    ref = forms["einsum (SelfAttentionDynamics.velocity)"][0](x)
    rows = []
    for name, (f, arg) in forms.items():
        y = f(arg)
        y = jnp.transpose(y, (2, 0, 1)) if y.shape != ref.shape else y
        rows.append({"form": name, "ms": 1e3 * best_of(lambda: f(arg), repeats),
                     "max_abs_diff": float(jnp.abs(y - ref).max())})
    xt_torch, P_t, U_t = (torch.from_numpy(np.array(a)) for a in (x, P, U))

    def torch_velocity():
        px = torch.einsum("hde,bje->bhjd", P_t, xt_torch)
        s = torch.einsum("bid,bhjd->bhij", xt_torch, px)
        v = torch.einsum("bhij,bjd,hed->bie", torch.softmax(s, -1), xt_torch, U_t)
        return v - (xt_torch * v).sum(-1, keepdim=True) * xt_torch

    with torch.no_grad():
        ms = 1e3 * best_of(torch_velocity, repeats)
        rows.append({"form": "PyTorch (same mathematics)", "ms": ms})
    return {"rows": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--hf-pass-s", type=float, default=None,
                   help="the HuggingFace GPT-2 attention s/pass measured by `jaxattn bench`")
    p.add_argument("--json")
    args = p.parse_args()
    print(f"jax {jax.__version__}, torch {torch.__version__} ({torch.get_num_threads()} threads)")
    s4 = s4_floor(args.repeats, args.hf_pass_s)
    print("\nS4 GPT-2 attention block at 100 × 200 tokens: matrix products alone (best of "
          f"{args.repeats})")
    print(f"{'product':<44}{'GFLOP':>7}{'jax s':>8}{'GFLOP/s':>9}{'torch s':>9}{'GFLOP/s':>9}")
    for r in s4["rows"]:
        print(f"{r['product']:<44}{r['gflop']:>7.1f}{r['jax_s']:>8.3f}{r['jax_gflops']:>9.0f}"
              f"{r['torch_s']:>9.3f}{r['torch_gflops']:>9.0f}")
    print(f"floor under a jaxattn pass (the two projections alone, × 12 blocks): "
          f"{s4['jax_projection_floor_s']:.2f} s")
    print("attention core per pass: XLA batched products alone "
          f"{s4['jax_batched_products_alone_s']:.2f} s (isolated; not part of the floor), "
          f"PyTorch fused causal SDPA {s4['torch_sdpa_core_s']:.2f} s")
    if "target_s" in s4:
        print(f"target (HF {s4['hf_pass_s']:.2f} s / 1.1): {s4['target_s']:.2f} s")
    s1 = s1_velocity(args.repeats)
    print("\nS1 one velocity evaluation, batch 1000 × (10 tokens in R³, 2 heads)")
    for r in s1["rows"]:
        diff = f"  (max |Δ| {r['max_abs_diff']:.1e})" if "max_abs_diff" in r else ""
        print(f"{r['form']:<44}{r['ms']:>8.3f} ms{diff}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"S4": s4, "S1": s1}, f, indent=2)


if __name__ == "__main__":
    main()
