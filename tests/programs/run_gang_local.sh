#!/usr/bin/env bash
# Runs a gang program as N processes on this machine, the way nephele's pool agents
# would start the members of one gang job (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
# MASTER_PORT, NEPHELE_JOB, NEPHELE_JOB_ATTEMPT), and waits for all of them.
#
#   usage: tests/programs/run_gang_local.sh [-n N] [-p PORT] [-o DIR] [-- PROGRAM_ARGS...]
#
#   -n N       number of members (default 4)
#   -p PORT    rendezvous port (default: a free port picked by the kernel)
#   -o DIR     keep member r's stdout in DIR/rank-r.out and stderr in DIR/rank-r.err
#              (default: a temporary directory, removed afterwards)
#   PROGRAM    GANG_PROGRAM (default tests/programs/gang_allreduce.py)
#   PYTHON     interpreter with jax (default target/models/venv/bin/python)
#
# Prints each member's stdout (its JSON line), then one summary line; exits 0 when
# every member exited 0, else 1 (after printing the failing members' stderr).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
N=4
PORT=""
OUT=""
while getopts "n:p:o:h" opt; do
    case "$opt" in
        n) N="$OPTARG" ;;
        p) PORT="$OPTARG" ;;
        o) OUT="$OPTARG" ;;
        h) sed -n '2,17p' "$0"; exit 0 ;;
        *) echo "run_gang_local.sh: see -h" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[[ "${1:-}" == "--" ]] && shift
PYTHON="${PYTHON:-$ROOT/target/models/venv/bin/python}"
PROGRAM="${GANG_PROGRAM:-$HERE/gang_allreduce.py}"
[[ -x "$PYTHON" ]] || { echo "run_gang_local.sh: error: no interpreter at $PYTHON (run shared/models/registry/prepare.sh, or set PYTHON)" >&2; exit 2; }
[[ "$N" =~ ^[1-9][0-9]*$ ]] || { echo "run_gang_local.sh: error: -n must be a positive integer" >&2; exit 2; }
if [[ -z "$PORT" ]]; then
    PORT="$("$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
fi
KEEP=1
if [[ -z "$OUT" ]]; then OUT="$(mktemp -d)"; KEEP=0; fi
mkdir -p "$OUT"

start=$(date +%s%N)
pids=()
for ((r = 0; r < N; r++)); do
    RANK=$r WORLD_SIZE=$N LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT \
        NEPHELE_JOB="${NEPHELE_JOB:-local/gang}" NEPHELE_JOB_ATTEMPT="${NEPHELE_JOB_ATTEMPT:-1}" \
        "$PYTHON" "$PROGRAM" "$@" >"$OUT/rank-$r.out" 2>"$OUT/rank-$r.err" &
    pids+=($!)
done
failed=()
for ((r = 0; r < N; r++)); do
    if wait "${pids[$r]}"; then :; else failed+=("rank $r: exit $?"); fi
done
ms=$(( ($(date +%s%N) - start) / 1000000 ))
for ((r = 0; r < N; r++)); do cat "$OUT/rank-$r.out"; done
if [[ ${#failed[@]} -gt 0 ]]; then
    for ((r = 0; r < N; r++)); do sed "s/^/[rank $r stderr] /" "$OUT/rank-$r.err" >&2; done
    echo "gang of $N on 127.0.0.1:$PORT FAILED after ${ms} ms: ${failed[*]}" >&2
    [[ $KEEP == 1 ]] || rm -rf "$OUT"
    exit 1
fi
echo "gang of $N on 127.0.0.1:$PORT: all members exited 0 in ${ms} ms" >&2
[[ $KEEP == 1 ]] || rm -rf "$OUT"
