"""A batch of jaxattn simulations spread over several processes (hosts).

Every process runs this same script: it joins the others through
`jax.distributed.initialize`, builds the same batch of random token sets, and
passes a `Mesh` over `jax.devices()` (the devices of all processes) as
`devices=`. Each process holds its own devices' slice of the batch; the result is
gathered with `process_allgather`, and process 0 prints a summary (and with
`--out`, saves the gathered tokens).

On a cluster, start one process per host (or let SLURM / Open MPI start them and
leave the flags out: `jax.distributed.initialize()` reads their environment):

    python examples/multihost.py --coordinator host0:12345 --num-processes 2 --process-id 0
    python examples/multihost.py --coordinator host0:12345 --num-processes 2 --process-id 1

The flags default to the environment variables JAX_COORDINATOR_ADDRESS,
JAX_NUM_PROCESSES and JAX_PROCESS_ID. To try the multi-host path on one machine,

    python examples/multihost.py --launch-local 2

starts 2 processes on localhost, each with 2 CPU devices
(`XLA_FLAGS=--xla_force_host_platform_device_count=2`), talking through gloo.
"""

import argparse
import os
import sys
import time

from jaxattn._process.distributed import gather, initialize, launch_argv, launch_local


def parse_args(argv=None) -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--coordinator", default=env("JAX_COORDINATOR_ADDRESS"),
                   help="host:port of process 0 (default: $JAX_COORDINATOR_ADDRESS)")
    p.add_argument("--num-processes", type=int, default=env("JAX_NUM_PROCESSES"),
                   help="number of processes (default: $JAX_NUM_PROCESSES)")
    p.add_argument("--process-id", type=int, default=env("JAX_PROCESS_ID"),
                   help="this process's index (default: $JAX_PROCESS_ID)")
    p.add_argument("--launch-local", type=int, metavar="N",
                   help="start N processes on localhost, 2 CPU devices each, and wait")
    p.add_argument("--devices-per-process", type=int, default=2,
                   help="CPU devices per process with --launch-local (default 2)")
    p.add_argument("--batch", type=int, default=16, help="token sets (default 16)")
    p.add_argument("--tokens", type=int, default=8, help="tokens per set (default 8)")
    p.add_argument("--dim", type=int, default=4, help="token dimension (default 4)")
    p.add_argument("--heads", type=int, default=2, help="attention heads (default 2)")
    p.add_argument("--layers", type=int, default=50, help="layers (default 50)")
    p.add_argument("--tau", type=float, default=0.1, help="layer step (default 0.1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shard", choices=("batch", "tokens"), default="batch",
                   help="split the token sets over the devices (default), or each set's "
                        "tokens (attention as a ring; --tokens a multiple of the devices)")
    p.add_argument("--out", help="process 0 saves the gathered tokens here (.npz)")
    return p.parse_args(argv)


def make_problem(seed: int, batch: int, tokens: int, dim: int, heads: int):
    """The model and the batch `(batch, tokens, dim)`, float32, the same in every
    process (same seed): each process then places its own devices' slice."""
    import jax
    import jax.numpy as jnp

    import jaxattn as ja

    kP, kx = jax.random.split(jax.random.PRNGKey(seed))
    P = jax.random.normal(kP, (heads, dim, dim), jnp.float32) / dim**0.5
    U = jnp.broadcast_to(jnp.eye(dim, dtype=jnp.float32), (heads, dim, dim))
    dyn = ja.SelfAttentionDynamics(P, U, causal=True)
    x0 = jax.vmap(lambda k: ja.sample_ellipsoid(k, tokens, dim, dtype=jnp.float32))(
        jax.random.split(kx, batch)
    )
    return dyn, x0


def simulate(args, devices):
    """`run_layers` on the batch: tokens `(batch, layers + 1, tokens, dim)`."""
    import jaxattn as ja

    dyn, x0 = make_problem(args.seed, args.batch, args.tokens, args.dim, args.heads)
    return ja.run_layers(dyn, x0, args.layers, args.tau, devices=devices, shard=args.shard)


def worker(args) -> None:
    import jax

    # gloo between CPU processes, a one-line error for a coordinator out of reach
    initialize(args.coordinator, args.num_processes, args.process_id)

    import numpy as np
    from jax.sharding import Mesh

    import jaxattn as ja

    mesh = Mesh(np.asarray(jax.devices()), ("batch",))
    me = jax.process_index()
    print(f"process {me}/{jax.process_count()}: {jax.local_device_count()} of "
          f"{jax.device_count()} devices", flush=True)
    start = time.perf_counter()
    xs = simulate(args, mesh)
    # A global array: every process must take part in gathering it.
    xs = gather(xs)
    seconds = time.perf_counter() - start
    if me == 0:
        E = np.asarray(ja.misalignment(xs[:, -1]))
        print(f"{xs.shape[0]} token sets, {args.layers} layers on {jax.device_count()} "
              f"devices in {jax.process_count()} processes: {seconds:.1f} s "
              f"(with compilation); final misalignment E: mean {E.mean():.3g}, "
              f"max {E.max():.3g}", flush=True)
        if args.out:
            np.savez(args.out, xs=xs, E=E, devices=jax.device_count(),
                     processes=jax.process_count())
    jax.distributed.shutdown()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.launch_local is not None:
        if args.launch_local < 1:
            raise SystemExit(f"--launch-local must be ≥ 1, got {args.launch_local}.")
        return launch_local([sys.executable, os.path.abspath(__file__), *launch_argv(argv)],
                            args.launch_local, devices_per_process=args.devices_per_process)
    worker(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
