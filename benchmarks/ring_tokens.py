"""One layer of one system whose tokens are split over forced CPU devices
(`shard="tokens"`: attention as a ring), against the one-device blocked layer.

    XLA_FLAGS=--xla_force_host_platform_device_count=4 \
        .venv/bin/python benchmarks/ring_tokens.py [n_check] [n_big]

Prints the largest difference at `n_check` tokens (default 100,000) and the time and
per-device compiled memory of one layer at `n_big` tokens (default 1,000,000).
"""

import sys
import time

import jax
import jax.numpy as jnp

import jaxattn as ja


def tokens(n):
    x = jax.random.normal(jax.random.PRNGKey(1), (n, 3), jnp.float32)
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def main(n_check=100_000, n_big=1_000_000):
    devices = len(jax.devices())
    dyn = ja.random_dynamics(jax.random.PRNGKey(0), 1, 3, beta=4.0)
    x = tokens(n_check)
    one = ja.run_layers(dyn, x, 1, 0.1)
    ring = ja.run_layers(dyn, x, 1, 0.1, devices=devices, shard="tokens")
    err = float(jnp.max(jnp.abs(one - ring)))
    print(f"n={n_check:,}: one device vs {devices} (ring): max |diff| {err:.1e}", flush=True)
    x = tokens(n_big)
    t = time.perf_counter()
    out = ja.run_layers(dyn, x, 1, 0.1, devices=devices, shard="tokens")
    out.block_until_ready()
    wall = time.perf_counter() - t
    finite = bool(jnp.all(jnp.isfinite(out)))
    print(f"n={n_big:,} on {devices} devices: one layer (with compile) {wall:.0f} s, "
          f"finite: {finite}, sharding {out.sharding.spec}", flush=True)
    sharded = jax.device_put(x, jax.sharding.NamedSharding(
        jax.sharding.Mesh(jax.devices(), ("tokens",)), jax.sharding.PartitionSpec("tokens")))
    layer = jax.jit(lambda z: dyn.on_tokens(sharded.sharding.mesh).layer(0.0, z, 0.1))
    mem = layer.lower(sharded).compile().memory_analysis()
    print(f"per-device compiled memory: temp {mem.temp_size_in_bytes / 2**20:.0f} MiB, "
          f"arguments {mem.argument_size_in_bytes / 2**20:.0f} MiB", flush=True)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
