#!/usr/bin/env bash
# Two builds of `nephele` measured side by side on this machine, alternating, so a
# change's effect is not confused with the machine's drift:
#   cloud/nephele/scripts/side-by-side.sh BEFORE_BIN AFTER_BIN [ROUNDS] [JOBS...]
# Each round runs, for each binary: `bench placement --nodes 10000` (the placement
# core's decisions) and `bench fleet --agents 10 --offload-rps 0 --jobs N` for each N
# (jobs through the REST API). Writes target/bench-results/side-by-side/results.csv
# (round, binary, what, figure, value) and each run's JSON beside it.
# Make BEFORE_BIN with e.g. `git stash; cargo build --release --bin nephele;
# cp target/release/nephele /tmp/nephele-before; git stash pop`.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 BEFORE_BIN AFTER_BIN [ROUNDS] [JOBS...]" >&2; exit 2; }
before=$1 after=$2
rounds=${3:-2}
shift $(($# < 3 ? $# : 3))
jobs=("$@")
[ ${#jobs[@]} -gt 0 ] || jobs=(20000 40000)
cd "$(dirname "$0")/../../.."
out=target/bench-results/side-by-side
mkdir -p "$out"
csv=$out/results.csv
echo "round,binary,what,figure,value" >"$csv"
for round in $(seq 1 "$rounds"); do
    for side in before after; do
        bin=$before
        [ $side = after ] && bin=$after
        "$bin" bench placement --nodes 10000 --json >"$out/placement-$side-$round.json"
        python3 - "$out/placement-$side-$round.json" "$round" "$side" >>"$csv" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["results"]:
    for k in ("placements_per_sec", "pods_per_sec"):
        print(f"{sys.argv[2]},{sys.argv[3]},placement {r['kind']},{k},{r[k]}")
PY
        for n in "${jobs[@]}"; do
            "$bin" bench fleet --agents 10 --deploy-agents 10 --offload-rps 0 --hold-s 2 \
                --jobs "$n" --json --out "$out/fleet-$side-$n-$round" >"$out/jobs-$side-$n-$round.json"
            python3 - "$out/jobs-$side-$n-$round.json" "$round" "$side" "$n" >>"$csv" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))["jobs"]
for k in ("jobs_placed_per_sec", "submit_p50_ms", "submit_p99_ms", "cloud_cpu_cores", "errors"):
    print(f"{sys.argv[2]},{sys.argv[3]},jobs {sys.argv[4]},{k},{d[k]}")
PY
        done
    done
done
column -s, -t "$csv"
