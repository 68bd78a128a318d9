#!/usr/bin/env python3
"""A real distributed program for a nephele gang job: one JAX process per member.

Every member joins the gang's rendezvous (JAX's distributed runtime, coordinated by
rank 0 at MASTER_ADDR:MASTER_PORT), then the members exchange data over gloo, JAX's
cross-process CPU collectives:

  1. each member builds a rank-dependent vector  x_r[i] = (r + 1) * i + r
  2. psum (all-reduce) over the 4 global CPU devices, one per process, under shard_map
     -> every member holds  sum_r x_r[i] = i * W (W + 1) / 2 + W (W - 1) / 2
  3. process_allgather of (rank, reduced vector): every member checks that the ranks
     are exactly 0..W-1 and that all members hold the same, expected vector.

It prints one JSON line on stdout and exits 0 when everything agrees:

  {"rank": 2, "world_size": 4, "local_rank": 0, "master": "127.0.0.1:29500",
   "result": [6, 16, ...], "expected": [6, 16, ...], "agreed": true, ...}

Environment (as nephele's pool agent sets it for a gang member):
  RANK, WORLD_SIZE           this member's rank and the gang size (required)
  MASTER_ADDR, MASTER_PORT   rank 0's address and the rendezvous port (required)
  LOCAL_RANK                 rank on this node (optional, only reported)
  NEPHELE_JOB, NEPHELE_JOB_ATTEMPT   reported when set
  NEPHELE_GLOO_HOSTNAME      address gloo listens on for its peers (optional; default:
                             this host's address on the route to MASTER_ADDR)

Exit codes:
  0  all members agreed on the expected result
  1  the collective ran but a result, a rank or the gang size did not match
  2  bad or missing environment / arguments, or JAX is not installed
  3  the deadline (--timeout, default 60 s) passed: a peer never came, or hung
  4  JAX failed (rendezvous refused, a peer died mid-collective, ...)

Every wait is bounded: the rendezvous by --timeout, the whole program by a watchdog
thread (exit 3) and, should the interpreter itself be stuck, by SIGALRM a few seconds
later (the kernel's default action: the process dies with signal 14).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time

START = time.monotonic()

EXIT_OK, EXIT_MISMATCH, EXIT_USAGE, EXIT_TIMEOUT, EXIT_JAX = 0, 1, 2, 3, 4


def log(message: str) -> None:
    """Progress and errors go to stderr (the job log keeps both streams)."""
    sys.stderr.write(f"[gang_allreduce rank={os.environ.get('RANK', '?')} "
                     f"t={time.monotonic() - START:.2f}s] {message}\n")
    sys.stderr.flush()


def fail(code: int, message: str) -> "NoReturn":  # noqa: F821
    log(f"error: {message}")
    sys.stdout.flush()
    # os._exit: no atexit handlers, so JAX's shutdown barrier cannot hang a failing member.
    os._exit(code)


def start_watchdog(seconds: float) -> None:
    """Exit 3 with a clear message once the deadline passes, whatever JAX is doing."""

    def fire() -> None:
        fail(EXIT_TIMEOUT, f"deadline of {seconds:g} s passed (a gang member never joined "
                           f"the rendezvous or a collective hung); giving up")

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    # Backstop that needs no Python thread to run: SIGALRM's default action ends the
    # process even when a C++ call holds the interpreter lock.
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(int(seconds) + 5)


def env_int(name: str, minimum: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        fail(EXIT_USAGE, f"{name} is not set (nephele sets RANK, WORLD_SIZE, MASTER_ADDR, "
                         f"MASTER_PORT for every gang member; see tests/programs/README.md)")
    try:
        value = int(raw)
    except ValueError:
        fail(EXIT_USAGE, f"{name}={raw!r} is not an integer")
    if value < minimum:
        fail(EXIT_USAGE, f"{name}={value} must be >= {minimum}")
    return value


def host_port(addr: str, port: int) -> str:
    return f"[{addr}]:{port}" if ":" in addr and not addr.startswith("[") else f"{addr}:{port}"


def route_address(master_addr: str, master_port: int) -> str | None:
    """This host's address on the route to the master (no packet is sent: a UDP
    connect only picks the route). On one machine that is 127.0.0.1; across nodes it is
    the address peers can reach, which the host name may not resolve to."""
    try:
        infos = socket.getaddrinfo(master_addr.strip("[]"), master_port, type=socket.SOCK_DGRAM)
        family, _, _, _, sockaddr = infos[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(sockaddr)
            return s.getsockname()[0]
    except OSError as error:
        log(f"warning: no route to {master_addr} ({error}); gloo uses the host name")
        return None


def use_gloo_on(hostname: str, strict: bool) -> None:
    """Make JAX's CPU client create gloo collectives bound to `hostname`.

    jax.distributed.initialize + jax_cpu_collectives_implementation='gloo' already give
    gloo collectives, but gloo then listens on the address the host name resolves to
    (127.0.1.1 on many Debian hosts, unreachable from other nodes). The CPU backend is
    created lazily, so until it exists its factory can be replaced by one that passes
    the address. Private API: if it changes, or the address cannot be bound, fall back
    to JAX's default with a warning, unless the address was asked for (`strict`).
    """
    try:
        from functools import partial

        from jax._src import distributed, xla_bridge
        from jax._src.lib import _jax

        collectives = _jax.make_gloo_tcp_collectives(
            distributed_client=distributed.global_state.client, hostname=hostname)
        xla_bridge.register_backend_factory(
            "cpu", partial(xla_bridge.make_cpu_client, collectives=collectives),
            priority=0, fail_quietly=False)
    except Exception as error:  # noqa: BLE001 - any failure means: keep JAX's default
        if strict:
            fail(EXIT_JAX, f"NEPHELE_GLOO_HOSTNAME={hostname}: gloo cannot listen there "
                           f"({type(error).__name__}: {error})")
        log(f"warning: could not bind gloo to {hostname} ({type(error).__name__}: {error}); "
            f"using JAX's default gloo address")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=8, help="vector length (default 8)")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="deadline for the whole program in seconds (default 60)")
    args = parser.parse_args()
    if args.size < 1 or args.timeout <= 0:
        fail(EXIT_USAGE, "--size must be >= 1 and --timeout > 0")
    start_watchdog(args.timeout)
    # gloo's C++ code prints "[Gloo] Rank r is connected to ..." on stdout. Send fd 1 to
    # stderr while JAX runs, and keep the real stdout for the one JSON line.
    sys.stdout.flush()
    result_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    rank = env_int("RANK", 0)
    world = env_int("WORLD_SIZE", 1)
    if rank >= world:
        fail(EXIT_USAGE, f"RANK={rank} is not below WORLD_SIZE={world}")
    master_addr = os.environ.get("MASTER_ADDR", "")
    if not master_addr:
        fail(EXIT_USAGE, "MASTER_ADDR is not set (rank 0's node address)")
    master_port = env_int("MASTER_PORT", 1)
    if master_port > 65535:
        fail(EXIT_USAGE, f"MASTER_PORT={master_port} is not a port")
    master = host_port(master_addr, master_port)
    local_rank = os.environ.get("LOCAL_RANK")

    # One CPU device per process, no GPU/TPU probing (CUDA_VISIBLE_DEVICES may be set
    # by the agent; this program is about the exchange, not the accelerator).
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
    try:
        import jax
        import numpy as np
        from jax.experimental import multihost_utils
        from jax.sharding import NamedSharding, PartitionSpec as P
    except ImportError as error:
        fail(EXIT_USAGE, f"cannot import JAX ({error}); run it with target/models/venv/bin/python "
                         f"(shared/models/registry/prepare.sh installs jax there)")

    try:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        remaining = max(1, int(args.timeout - (time.monotonic() - START)))
        log(f"joining the rendezvous at {master} as rank {rank} of {world} "
            f"(jax {jax.__version__}, timeout {remaining} s)")
        jax.distributed.initialize(
            coordinator_address=master, num_processes=world, process_id=rank,
            initialization_timeout=remaining,
            heartbeat_timeout_seconds=max(10, remaining),
            shutdown_timeout_seconds=max(5, remaining // 2))
        asked = os.environ.get("NEPHELE_GLOO_HOSTNAME", "")
        gloo_host = asked or route_address(master_addr, master_port)
        if gloo_host:
            use_gloo_on(gloo_host, strict=bool(asked))

        if jax.process_index() != rank or jax.process_count() != world:
            fail(EXIT_MISMATCH, f"JAX sees process {jax.process_index()} of {jax.process_count()}, "
                                f"expected {rank} of {world}")
        devices = jax.devices()
        if len(devices) != world or len(jax.local_devices()) != 1:
            fail(EXIT_MISMATCH, f"expected {world} global CPU devices, one per process; JAX has "
                                f"{len(devices)} global, {len(jax.local_devices())} local")
        log(f"rendezvous complete: {len(devices)} global devices; all-reducing")

        # 1. rank-dependent input, one row per process, sharded over the 'gang' axis.
        n = args.size
        mine = ((rank + 1) * np.arange(n) + rank).astype(np.int32)[None, :]
        mesh = jax.make_mesh((world,), ("gang",), devices=devices)
        sharding = NamedSharding(mesh, P("gang"))
        local = jax.device_put(mine, jax.local_devices()[0])
        global_x = jax.make_array_from_single_device_arrays((world, n), sharding, [local])

        # 2. the all-reduce: psum across the gang axis, i.e. across the 4 processes.
        allreduce = jax.jit(jax.shard_map(
            lambda block: jax.lax.psum(block, "gang"),
            mesh=mesh, in_specs=P("gang"), out_specs=P("gang")))
        reduced = allreduce(global_x)
        result = np.asarray(reduced.addressable_shards[0].data)[0]

        # 3. agreement: gather every member's rank and result.
        ranks = multihost_utils.process_allgather(np.array([rank], dtype=np.int32))
        results = multihost_utils.process_allgather(result)
    except SystemExit:
        raise
    except Exception as error:  # noqa: BLE001 - report JAX's error and exit non-zero
        fail(EXIT_JAX, f"JAX failed: {type(error).__name__}: {error}")

    expected = (np.arange(n) * (world * (world + 1) // 2) + world * (world - 1) // 2).astype(np.int32)
    problems = []
    if sorted(np.asarray(ranks).reshape(-1).tolist()) != list(range(world)):
        problems.append(f"ranks seen across the gang are {np.asarray(ranks).reshape(-1).tolist()}, "
                        f"not 0..{world - 1}")
    if not np.array_equal(result, expected):
        problems.append(f"all-reduce gave {result.tolist()}, expected {expected.tolist()}")
    results = np.asarray(results).reshape(world, n)
    for r in range(world):
        if not np.array_equal(results[r], result):
            problems.append(f"member {r} holds {results[r].tolist()}, this member {result.tolist()}")

    line = {
        "rank": rank, "world_size": world,
        "local_rank": int(local_rank) if local_rank and local_rank.isdigit() else local_rank,
        "master": master, "host": socket.gethostname(), "pid": os.getpid(),
        "job": os.environ.get("NEPHELE_JOB"), "attempt": os.environ.get("NEPHELE_JOB_ATTEMPT"),
        "jax": jax.__version__, "collectives": "gloo",
        "result": result.tolist(), "expected": expected.tolist(),
        "agreed": not problems, "seconds": round(time.monotonic() - START, 3),
    }
    result_out.write(json.dumps(line) + "\n")
    result_out.flush()
    if problems:
        fail(EXIT_MISMATCH, "; ".join(problems))
    log("agreed; shutting down")
    try:
        jax.distributed.shutdown()
    except Exception as error:  # noqa: BLE001 - the result is already printed and agreed
        log(f"warning: distributed shutdown: {type(error).__name__}: {error}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
