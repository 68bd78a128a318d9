#!/usr/bin/env python3
"""A stand-in for a training job that survives preemption (standard library only).

It counts steps (one every --interval-ms, default 50 ms), checkpoints the step count to
$NEPHELE_CHECKPOINT_DIR/state.json atomically every --every steps (default 20) and on
SIGTERM, and on start resumes from the checkpoint when there is one. So a job that is
preempted and requeued continues where it stopped instead of starting over.

Output (stdout, one line each, flushed at once; the job log keeps it):

  checkpoint_counter: job=acme/train attempt=2 host=node-3 rank=0 pid=4242 dir=/ckpt/acme/train
  resumed from step 40                 (or: starting fresh)
  step 60 checkpointed
  SIGTERM at step 73: checkpointed, exiting with 143
  done at step 100                     (with --steps 100, once the count reaches it)

Environment:
  NEPHELE_CHECKPOINT_DIR   where state.json lives (required unless --dir is given);
                           created if missing
  NEPHELE_JOB              tenant/name; recorded in the checkpoint, and a checkpoint of
                           another job in the same directory is refused (exit 2)
  NEPHELE_JOB_ATTEMPT      1, 2, ...; printed and recorded
  RANK                     printed; rank 0 (or no RANK) owns state.json, rank r > 0 of a
                           gang uses state.rank-<r>.json, so members sharing the
                           directory never overwrite each other

Exit codes:
  0    --steps reached (the checkpoint then says "done": true; a later start resumes at
       that step and exits 0 at once)
  143  stopped by SIGTERM (or SIGINT) after writing the checkpoint: 128 + 15, what a
       process ended by SIGTERM reports. Not 0, because the work is not finished: the
       control plane requeues a preempted job either way, but a job stopped for any
       other reason (a node shutting down, someone's kill) must not look like success
  1    --crash-at-step reached (tests of retry: on attempt 1 only)
  2    bad arguments, no checkpoint directory, or an unreadable / foreign checkpoint

The checkpoint is written to a temporary file in the same directory, fsync'ed, renamed
over state.json and the directory fsync'ed: a reader sees the old or the new state,
never half of one, even if the process is SIGKILLed mid-write.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time

FORMAT = "nephele-checkpoint-counter/1"


def say(message: str) -> None:
    print(message, flush=True)


def die(message: str, code: int = 2) -> "NoReturn":  # noqa: F821
    sys.stderr.write(f"checkpoint_counter: error: {message}\n")
    sys.stderr.flush()
    sys.exit(code)


def atomic_write_json(path: str, value: dict) -> None:
    directory = os.path.dirname(path) or "."
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def main() -> int:
    parser = argparse.ArgumentParser(
        description="Counts steps, checkpoints to $NEPHELE_CHECKPOINT_DIR/state.json, "
                    "resumes after preemption (see the module docstring).")
    parser.add_argument("--steps", type=int, default=0,
                        help="stop with exit 0 once this many steps are done in total "
                             "(0 = run until SIGTERM; default 0)")
    parser.add_argument("--interval-ms", type=float, default=50.0, help="one step per this many ms (default 50)")
    parser.add_argument("--every", type=int, default=20, help="checkpoint every this many steps (default 20)")
    parser.add_argument("--dir", default=None, help="checkpoint directory (default: $NEPHELE_CHECKPOINT_DIR)")
    parser.add_argument("--crash-at-step", type=int, default=0,
                        help="on attempt 1 only, exit 1 (without a checkpoint) when this step is reached")
    args = parser.parse_args()
    if args.steps < 0 or args.interval_ms < 0 or args.every < 1 or args.crash_at_step < 0:
        die("--steps, --interval-ms, --crash-at-step must be >= 0 and --every >= 1")

    directory = args.dir or os.environ.get("NEPHELE_CHECKPOINT_DIR", "")
    if not directory:
        die("NEPHELE_CHECKPOINT_DIR is not set and no --dir was given "
            "(nephele sets it for every job: a directory kept across the job's attempts)")
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as error:
        die(f"cannot create the checkpoint directory {directory}: {error}")

    job = os.environ.get("NEPHELE_JOB", "")
    attempt_raw = os.environ.get("NEPHELE_JOB_ATTEMPT", "")
    attempt = int(attempt_raw) if attempt_raw.isdigit() else None
    rank_raw = os.environ.get("RANK", "")
    rank = int(rank_raw) if rank_raw.isdigit() else None
    host = socket.gethostname()
    name = "state.json" if not rank else f"state.rank-{rank}.json"
    path = os.path.join(directory, name)

    # Install the handlers before anything else can take time, so that a SIGTERM that
    # arrives during start-up is not lost (the default action would skip the checkpoint).
    stop = {"signal": None}

    def on_signal(signum, _frame):
        stop["signal"] = signum

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    say(f"checkpoint_counter: job={job or '-'} attempt={attempt_raw or '-'} host={host} "
        f"rank={rank_raw or '-'} pid={os.getpid()} dir={directory}")

    step = 0
    history = []
    if os.path.exists(path):
        try:
            with open(path, encoding="utf-8") as f:
                state = json.load(f)
            if state.get("format") != FORMAT or not isinstance(state.get("step"), int) or state["step"] < 0:
                raise ValueError(f"not a {FORMAT} checkpoint")
        except (OSError, ValueError) as error:
            die(f"cannot resume from {path}: {error}; delete it to start over")
        if job and state.get("job") and state["job"] != job:
            die(f"{path} belongs to job {state['job']}, not {job}: checkpoint directories "
                f"must not be shared between jobs")
        step = state["step"]
        history = list(state.get("history", []))[-50:]
        say(f"resumed from step {step}")
    else:
        say("starting fresh")

    def checkpoint(done: bool = False) -> None:
        atomic_write_json(path, {
            "format": FORMAT, "step": step, "done": done, "job": job or None,
            "attempt": attempt, "rank": rank, "host": host, "updated_unix": round(time.time(), 3),
            "history": history + [{"attempt": attempt, "host": host, "pid": os.getpid(), "step": step}],
        })

    interval = args.interval_ms / 1000.0
    next_tick = time.monotonic()
    while True:
        if stop["signal"] is not None:
            checkpoint()
            signame = signal.Signals(stop["signal"]).name
            say(f"{signame} at step {step}: checkpointed, exiting with 143")
            return 143
        if args.steps and step >= args.steps:
            checkpoint(done=True)
            say(f"done at step {step}")
            return 0
        # One step of "training".
        next_tick += interval
        delay = next_tick - time.monotonic()
        if delay > 0:
            time.sleep(delay)  # a signal handler runs when the sleep ends (<= one interval)
        else:
            next_tick = time.monotonic()
        if stop["signal"] is not None:
            continue  # the step was interrupted: do not count it
        step += 1
        if args.crash_at_step and step == args.crash_at_step and attempt in (None, 1):
            sys.stderr.write(f"checkpoint_counter: crashing on purpose at step {step} "
                             f"(--crash-at-step, attempt {attempt_raw or '-'})\n")
            sys.stderr.flush()
            return 1
        if step % args.every == 0:
            checkpoint()
            say(f"step {step} checkpointed")


if __name__ == "__main__":
    sys.exit(main())
