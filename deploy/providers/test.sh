#!/usr/bin/env bash
# Tests the two `command` provider examples (kubernetes/ and cloud-cli/) against fake
# `kubectl`, `gcloud`, `curl` (GCE metadata server) and `nephele-edge` executables from
# testing/fake-bin, put first on PATH. The fakes keep a tiny cluster / project in files,
# answer as the real tools do, and record every call's arguments (and what kubectl
# reads from stdin). Checks that add / remove / list call the tools as intended, that
# a join token never appears in any recorded command line nor in the scripts' output,
# that a missing environment variable fails with a message naming it, and the error
# paths (StatefulSet order, foreign instances, tool failures).
#
#   usage: deploy/providers/test.sh [-v]     (-v: print every check, not only failures)
#
# Needs bash and coreutils only; runs in about 10 seconds. Prints one line per failed
# check and a summary; exits 1 if any check failed, else 0. KEEP=1 keeps the work
# directory (fake state and call logs) and prints its path.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
FAKES="$HERE/testing/fake-bin"
VERBOSE=0
[[ "${1:-}" == -v ]] && VERBOSE=1
WORK="$(mktemp -d)"
if [[ "${KEEP:-0}" == 1 ]]; then
    trap 'echo "work directory kept: $WORK"' EXIT
else
    trap 'rm -rf "$WORK"' EXIT
fi

PASSED=0
FAILED=()
SECTION=""
ok() { PASSED=$((PASSED + 1)); [[ $VERBOSE == 0 ]] || echo "ok   - $SECTION: $1"; }
bad() { FAILED+=("$SECTION: $1"); echo "FAIL - $SECTION: $1" >&2; }
check() { # description command...
    local what="$1"
    shift
    if "$@"; then ok "$what"; else bad "$what"; fi
}
has() { [[ "$1" == *"$2"* ]]; }
hasnt() { [[ "$1" != *"$2"* ]]; }
file_is() { [[ -f "$1" && "$(cat "$1")" == "$2" ]]; }

# run SCRIPT [VAR=VALUE | -ARG]...: runs SCRIPT with the -ARGs as arguments in a clean
# environment (fakes first on PATH, nothing inherited but the VAR=VALUEs) and sets RC,
# OUT, ERR. Every run also checks that the join token it was given is not in its output.
run() {
    local script="$1" a envs=() args=()
    shift
    for a in "$@"; do
        if [[ "$a" == -* ]]; then args+=("$a"); else envs+=("$a"); fi
    done
    RC=0
    env -i PATH="$FAKES:/usr/local/bin:/usr/bin:/bin" HOME="$WORK/home" LANG=C \
        FAKE_STATE="$STATE" "${envs[@]}" bash "$script" "${args[@]}" >"$WORK/out" 2>"$WORK/err" || RC=$?
    OUT="$(cat "$WORK/out")" ERR="$(cat "$WORK/err")"
    local var token=""
    for var in "$@"; do [[ "$var" == NEPHELE_JOIN_TOKEN=* ]] && token="${var#*=}"; done
    if [[ -n "$token" ]]; then
        if [[ "$OUT$ERR" == *"$token"* ]]; then bad "$(basename "$script") printed the join token"; else ok "no token in output"; fi
    fi
}
expect_rc() { # description want
    if [[ "$RC" == "$2" ]]; then ok "$1 (exit $2)"; else bad "$1: exit $RC, expected $2; stderr: $ERR"; fi
}
new_state() { STATE="$WORK/$1"; mkdir -p "$STATE"; : >"$STATE/calls.log"; : >"$STATE/stdin.log"; }

# ======================================================================== kubernetes
SECTION=kubernetes
K8S="$HERE/kubernetes"
new_state k8s
NS="$STATE/k8s/nephele"
make_sts() { # name region pool profile capacity server
    local d="$NS/sts/$1"
    mkdir -p "$d/annotations/nephele.dev"
    echo 0 >"$d/replicas"
    printf 'nephele.dev/region=%s\nnephele.dev/pool=%s\napp=nephele\n' "$2" "$3" >"$d/labels"
    printf '%s' "$4" >"$d/annotations/nephele.dev/profile"
    printf '%s' "$5" >"$d/annotations/nephele.dev/capacity-type"
    printf '%s' "$6" >"$d/annotations/nephele.dev/server"
}
make_sts l4-spot eu-west l4-spot gpu-4x-l4 spot cp.example:7443
make_sts t4 eu-west t4 gpu-1x-t4 on-demand cp.example:7443
replicas() { cat "$NS/sts/$1/replicas"; }
K_POOL=(NEPHELE_K8S_NAMESPACE=nephele NEPHELE_REGION=eu-west NEPHELE_POOL=l4-spot)
K_ADD=("${K_POOL[@]}" NEPHELE_PROFILE=gpu-4x-l4 NEPHELE_CAPACITY_TYPE=spot NEPHELE_SERVER=cp.example:7443)
TOK0=nph1.k8s0.SECRETk8sZero.0123abcd
TOK1=nph1.k8s1.SECRETk8sOne.0123abcd
TOK2=nph1.k8s2.SECRETk8sTwo.0123abcd

run "$K8S/add.sh" --help
expect_rc "--help" 0
check "--help prints the usage" has "$OUT" "Usage: add.sh"

run "$K8S/add.sh" "${K_ADD[@]}" NEPHELE_NODE=l4-spot-0 NEPHELE_JOIN_TOKEN=$TOK0
expect_rc "add l4-spot-0" 0
check "add l4-spot-0 scales 0 -> 1" [ "$(replicas l4-spot)" = 1 ]
check "add creates the Secret and stores the token under the node's name" file_is "$NS/secrets/l4-spot-join/l4-spot-0" "$TOK0"
check "add finds the StatefulSet by its pool labels" grep -qF -- "kubectl --namespace nephele get statefulset -l nephele.dev/region=eu-west\\,nephele.dev/pool=l4-spot" "$STATE/calls.log"
check "add scales with the --current-replicas precondition" grep -qxF -- "kubectl --namespace nephele scale statefulset l4-spot --current-replicas=0 --replicas=1" "$STATE/calls.log"
check "add passes the token on stdin (patch --patch-file /dev/stdin)" grep -qF "{\"stringData\":{\"l4-spot-0\":\"$TOK0\"}}" "$STATE/stdin.log"

run "$K8S/add.sh" "${K_ADD[@]}" NEPHELE_NODE=l4-spot-1 NEPHELE_JOIN_TOKEN=$TOK1
expect_rc "add l4-spot-1" 0
check "add l4-spot-1 scales 1 -> 2" [ "$(replicas l4-spot)" = 2 ]

run "$K8S/add.sh" "${K_ADD[@]}" NEPHELE_NODE=l4-spot-3 NEPHELE_JOIN_TOKEN=$TOK2
expect_rc "add l4-spot-3 past the next ordinal is refused" 1
check "the refusal says which pod comes next" has "$ERR" "Add l4-spot-2 first"
check "the refusal leaves the replicas alone" [ "$(replicas l4-spot)" = 2 ]
check "the refusal leaves no token behind" [ ! -e "$NS/secrets/l4-spot-join/l4-spot-3" ]

run "$K8S/add.sh" "${K_ADD[@]}" NEPHELE_NODE=l4-spot-2 NEPHELE_PROFILE=gpu-1x-t4 NEPHELE_JOIN_TOKEN=$TOK2
expect_rc "add with a profile the StatefulSet does not run" 1
check "the message names both profiles" has "$ERR" "runs profile 'gpu-4x-l4', but pool eu-west/l4-spot asks for 'gpu-1x-t4'"
run "$K8S/add.sh" "${K_ADD[@]}" NEPHELE_NODE=l4-spot-2 NEPHELE_CAPACITY_TYPE=on-demand NEPHELE_JOIN_TOKEN=$TOK2
expect_rc "add with another capacity type" 1
run "$K8S/add.sh" "${K_ADD[@]}" NEPHELE_NODE=l4-spot-2 NEPHELE_SERVER=other:7443 NEPHELE_JOIN_TOKEN=$TOK2
expect_rc "add with another server address" 1
check "the message names the server" has "$ERR" "'other:7443'"
run "$K8S/add.sh" "${K_ADD[@]}" NEPHELE_NODE=gpu-node-7 NEPHELE_JOIN_TOKEN=$TOK2
expect_rc "add of a node not named <statefulset>-<ordinal>" 1
check "the message explains pod naming" has "$ERR" "pods are named 'l4-spot-<ordinal>'"
run "$K8S/add.sh" "${K_ADD[@]}" NEPHELE_POOL=a100 NEPHELE_NODE=a100-0 NEPHELE_JOIN_TOKEN=$TOK2
expect_rc "add for a pool without a StatefulSet" 1
check "the message says how to create it" has "$ERR" "no StatefulSet labelled nephele.dev/region=eu-west,nephele.dev/pool=a100"
run "$K8S/add.sh" "${K_ADD[@]}" NEPHELE_NODE=l4-spot-2 NEPHELE_CAPACITY_TYPE=preemptible NEPHELE_JOIN_TOKEN=$TOK2
expect_rc "add with an unknown capacity type" 1

run "$K8S/list.sh" "${K_POOL[@]}"
expect_rc "list" 0
check "list prints the two nodes" [ "$OUT" = $'l4-spot-0\nl4-spot-1' ]

run "$K8S/add.sh" "${K_ADD[@]}" NEPHELE_NODE=l4-spot-2 NEPHELE_JOIN_TOKEN=$TOK2
expect_rc "add l4-spot-2" 0
run "$K8S/remove.sh" "${K_POOL[@]}" NEPHELE_NODE=l4-spot-1
expect_rc "remove l4-spot-1, below the top, reports failure" 1
check "the message explains the StatefulSet order" has "$ERR" "can only shrink from l4-spot-2"
check "remove below the top deletes the token" [ ! -e "$NS/secrets/l4-spot-join/l4-spot-1" ]
check "remove below the top restarts the pod (agent stops)" grep -qxF l4-spot-1 "$NS/deleted-pods"
check "remove below the top keeps the replicas" [ "$(replicas l4-spot)" = 3 ]
check "remove deletes the key with a null merge patch on stdin" grep -qxF '{"data":{"l4-spot-1":null}}' "$STATE/stdin.log"
run "$K8S/list.sh" "${K_POOL[@]}"
check "list leaves out the removed node" [ "$OUT" = $'l4-spot-0\nl4-spot-2' ]

run "$K8S/remove.sh" "${K_POOL[@]}" NEPHELE_NODE=l4-spot-2
expect_rc "remove l4-spot-2, the top" 0
check "removing the top scales past the earlier removed l4-spot-1 (3 -> 1)" [ "$(replicas l4-spot)" = 1 ]
check "the message says so" has "$ERR" "l4-spot-1..l4-spot-1, whose nodes were removed earlier"
run "$K8S/remove.sh" "${K_POOL[@]}" NEPHELE_NODE=l4-spot-5
expect_rc "remove a node whose pod does not exist" 0
run "$K8S/list.sh" "${K_POOL[@]}"
check "list after the removals" [ "$OUT" = l4-spot-0 ]

# Another script scales at the same time: the precondition fails once, then it decides again.
echo 2 >"$STATE/race-scale"
run "$K8S/add.sh" "${K_ADD[@]}" NEPHELE_NODE=l4-spot-1 NEPHELE_JOIN_TOKEN=$TOK1
expect_rc "add while another script scaled the StatefulSet" 0
check "the first scale attempt hit the precondition, the retry saw the pod and restarted it" \
    [ "$(grep -c 'scale statefulset l4-spot' "$STATE/calls.log")" -ge 1 ] && grep -qxF l4-spot-1 "$NS/deleted-pods"
check "the replicas are not lowered by the retry" [ "$(replicas l4-spot)" = 2 ]
check "the new token is stored" file_is "$NS/secrets/l4-spot-join/l4-spot-1" "$TOK1"

# Explicit StatefulSet and Secret names.
run "$K8S/list.sh" NEPHELE_K8S_NAMESPACE=nephele NEPHELE_REGION=x NEPHELE_POOL=y NEPHELE_K8S_STATEFULSET=l4-spot
check "NEPHELE_K8S_STATEFULSET overrides the label lookup" [ "$RC" = 0 -a "$OUT" = $'l4-spot-0\nl4-spot-1' ]

# Missing environment and broken tools.
run "$K8S/add.sh" "${K_ADD[@]}" NEPHELE_NODE=l4-spot-2
expect_rc "add without NEPHELE_JOIN_TOKEN" 1
check "the message names NEPHELE_JOIN_TOKEN" has "$ERR" "NEPHELE_JOIN_TOKEN is not set"
run "$K8S/add.sh" NEPHELE_K8S_NAMESPACE=nephele NEPHELE_POOL=l4-spot NEPHELE_NODE=l4-spot-2 NEPHELE_JOIN_TOKEN=$TOK2
expect_rc "add without NEPHELE_REGION" 1
check "the message names NEPHELE_REGION" has "$ERR" "NEPHELE_REGION is not set"
run "$K8S/remove.sh" "${K_POOL[@]}"
expect_rc "remove without NEPHELE_NODE" 1
check "the message names NEPHELE_NODE" has "$ERR" "NEPHELE_NODE is not set"
run "$K8S/list.sh" NEPHELE_K8S_NAMESPACE=nephele NEPHELE_REGION=eu-west
expect_rc "list without NEPHELE_POOL" 1
check "the message names NEPHELE_POOL" has "$ERR" "NEPHELE_POOL is not set"
run "$K8S/add.sh" "${K_ADD[@]}" NEPHELE_NODE=l4-spot-2 NEPHELE_JOIN_TOKEN=$TOK2 KUBECTL=/nonexistent/kubectl
expect_rc "add without kubectl" 1
check "the message says kubectl is missing" has "$ERR" "'/nonexistent/kubectl' not found"
touch "$STATE/kubectl-down"
run "$K8S/list.sh" "${K_POOL[@]}"
expect_rc "list while the API server is down" 1
check "list passes kubectl's message on" has "$ERR" "connection to the server"
rm -f "$STATE/kubectl-down"
run "$K8S/add.sh" "${K_ADD[@]}" NEPHELE_NODE=l4-spot-2 'NEPHELE_JOIN_TOKEN=bad"token'
expect_rc "add refuses a token that would break the JSON patch" 1
check "the message does not show the token" hasnt "$ERR" 'bad"token'
run "$K8S/add.sh" --bogus
expect_rc "an unexpected argument" 1

check "no join token in any recorded kubectl command line" \
    bash -c '! grep -q SECRETk8s "$1"' _ "$STATE/calls.log"

# ======================================================================== cloud-cli (gcloud)
SECTION=cloud-cli
GCE="$HERE/cloud-cli"
new_state gce
I="$STATE/gce"
G_POOL=(NEPHELE_GCP_ZONE=europe-west4-a NEPHELE_GCP_PROJECT=acme-ml NEPHELE_REGION=eu-west NEPHELE_POOL=l4-spot)
G_ADD=("${G_POOL[@]}" NEPHELE_GCP_IMAGE_FAMILY=common-gpu NEPHELE_GCP_IMAGE_PROJECT=dl-images
    NEPHELE_PROFILE=gpu-4x-l4 NEPHELE_CAPACITY_TYPE=spot NEPHELE_SERVER=cp.example:7443)
GT0=nph1.gce0.SECRETgceZero.0123abcd
GT1=nph1.gce1.SECRETgceOne.0123abcd
GT2=nph1.gce2.SECRETgceTwo.0123abcd

run "$GCE/add.sh" --help
expect_rc "--help" 0
check "--help prints the usage" has "$OUT" "Usage: add.sh"

run "$GCE/add.sh" "${G_ADD[@]}" NEPHELE_NODE=l4-spot-0 NEPHELE_JOIN_TOKEN=$GT0
expect_rc "add a spot gpu-4x-l4 node" 0
args="$(cat "$I/l4-spot-0/args" 2>/dev/null)"
check "machine type from the profile table" has "$args" "--machine-type=g2-standard-48"
check "spot: --provisioning-model=SPOT" has "$args" "--provisioning-model=SPOT"
check "spot: deleted when reclaimed" has "$args" "--instance-termination-action=DELETE"
check "GPU machines: --maintenance-policy=TERMINATE" has "$args" "--maintenance-policy=TERMINATE"
check "g2 comes with its GPUs: no --accelerator" hasnt "$args" "--accelerator"
check "project, zone and image are passed" has "$args" "--project=acme-ml compute instances create l4-spot-0 --zone=europe-west4-a"
check "image family and project" has "$args" "--image-family=common-gpu --image-project=dl-images"
check "pool labels" file_is "$I/l4-spot-0/labels/nephele-pool" l4-spot
check "capacity label" file_is "$I/l4-spot-0/labels/nephele-capacity" spot
check "the token is instance metadata" file_is "$I/l4-spot-0/metadata/nephele-join-token" "$GT0"
check "the startup script is startup.sh" cmp -s "$I/l4-spot-0/metadata/startup-script" "$GCE/startup.sh"
check "node name, profile and server are metadata" \
    bash -c '[ "$(cat "$1/nephele-node") $(cat "$1/nephele-profile") $(cat "$1/nephele-server")" = "l4-spot-0 gpu-4x-l4 cp.example:7443" ]' _ "$I/l4-spot-0/metadata"
token_file="$(sed -n 's/.*nephele-join-token=\([^ ]*\).*/\1/p' "$I/l4-spot-0/args")"
check "the token file is gone after the script" [ -n "$token_file" -a ! -e "$token_file" ]

run "$GCE/add.sh" "${G_ADD[@]}" NEPHELE_NODE=l4-spot-1 NEPHELE_PROFILE=gpu-1x-t4 NEPHELE_CAPACITY_TYPE=on-demand NEPHELE_JOIN_TOKEN=$GT1 NEPHELE_GCP_BUNDLE=gs://acme/nephele.tar.gz
expect_rc "add an on-demand gpu-1x-t4 node" 0
args="$(cat "$I/l4-spot-1/args" 2>/dev/null)"
check "on-demand: --provisioning-model=STANDARD" has "$args" "--provisioning-model=STANDARD"
check "on-demand: no termination action" hasnt "$args" "--instance-termination-action"
check "T4 on n1: machine type and accelerator" has "$args" "--machine-type=n1-standard-4"
check "T4 accelerator" has "$args" "--accelerator=type=nvidia-tesla-t4\\,count=1"
check "the bundle URL is metadata" file_is "$I/l4-spot-1/metadata/nephele-bundle" gs://acme/nephele.tar.gz

run "$GCE/add.sh" "${G_ADD[@]}" NEPHELE_NODE=l4-spot-2 NEPHELE_PROFILE=jetson-orin-nano-8gb NEPHELE_JOIN_TOKEN=$GT2
expect_rc "add with a profile missing from the table" 1
check "the message names the table" has "$ERR" "no machine type for profile 'jetson-orin-nano-8gb'"

mkdir -p "$I/other-vm/labels" && echo europe-west4-a >"$I/other-vm/zone" && printf 'us-east' >"$I/other-vm/labels/nephele-region" && printf 'l4-spot' >"$I/other-vm/labels/nephele-pool"
mkdir -p "$I/web-1/labels" && echo europe-west4-a >"$I/web-1/zone"
run "$GCE/list.sh" "${G_POOL[@]}"
expect_rc "list" 0
check "list prints the pool's instances only" [ "$OUT" = $'l4-spot-0\nl4-spot-1' ]
check "list filters by the pool labels" grep -qF -- "--filter=labels.nephele-region=eu-west\\ AND\\ labels.nephele-pool=l4-spot --format=value\\(name\\)" "$STATE/calls.log"

run "$GCE/add.sh" "${G_ADD[@]}" NEPHELE_NODE=l4-spot-0 NEPHELE_JOIN_TOKEN=$GT2
expect_rc "add over an existing instance of the pool (an earlier attempt)" 0
check "it gets the new token" file_is "$I/l4-spot-0/metadata/nephele-join-token" "$GT2"
check "and is reset" [ -f "$I/l4-spot-0/resets" ]
run "$GCE/add.sh" "${G_ADD[@]}" NEPHELE_NODE=other-vm NEPHELE_JOIN_TOKEN=$GT2
expect_rc "add over an instance of another pool" 1
check "the message refuses to touch it" has "$ERR" "not touching it"
check "the foreign instance has no token" [ ! -e "$I/other-vm/metadata/nephele-join-token" ]

printf "ERROR: (gcloud.compute.instances.create) Could not fetch resource:\n - The zone 'projects/acme-ml/zones/europe-west4-a' does not have enough resources available to fulfill the request. '(resource type:compute)'.\n" >"$STATE/gcloud-create-error"
run "$GCE/add.sh" "${G_ADD[@]}" NEPHELE_NODE=l4-spot-3 NEPHELE_JOIN_TOKEN=$GT2
expect_rc "add when the zone has no capacity" 1
check "gcloud's message is passed on" has "$ERR" "does not have enough resources available"
rm -f "$STATE/gcloud-create-error"

run "$GCE/remove.sh" "${G_POOL[@]}" NEPHELE_NODE=l4-spot-1
expect_rc "remove l4-spot-1" 0
check "the instance is deleted" [ ! -e "$I/l4-spot-1" ]
check "delete runs without a prompt" grep -qF -- "compute instances delete l4-spot-1 --zone=europe-west4-a --quiet" "$STATE/calls.log"
run "$GCE/remove.sh" "${G_POOL[@]}" NEPHELE_NODE=l4-spot-1
expect_rc "remove an instance that is already gone" 0
run "$GCE/remove.sh" "${G_POOL[@]}" NEPHELE_NODE=web-1
expect_rc "remove an instance without the pool's labels" 1
check "it is not deleted" [ -d "$I/web-1" ]

run "$GCE/add.sh" "${G_POOL[@]}" NEPHELE_GCP_IMAGE_FAMILY=f NEPHELE_GCP_IMAGE_PROJECT=p NEPHELE_PROFILE=gpu-4x-l4 NEPHELE_CAPACITY_TYPE=spot NEPHELE_SERVER=cp:1 NEPHELE_NODE=l4-spot-4
expect_rc "add without NEPHELE_JOIN_TOKEN" 1
check "the message names NEPHELE_JOIN_TOKEN" has "$ERR" "NEPHELE_JOIN_TOKEN is not set"
run "$GCE/add.sh" NEPHELE_REGION=eu-west NEPHELE_POOL=l4-spot NEPHELE_GCP_IMAGE_FAMILY=f NEPHELE_GCP_IMAGE_PROJECT=p NEPHELE_PROFILE=gpu-4x-l4 NEPHELE_CAPACITY_TYPE=spot NEPHELE_SERVER=cp:1 NEPHELE_NODE=l4-spot-4 NEPHELE_JOIN_TOKEN=$GT2
expect_rc "add without NEPHELE_GCP_ZONE" 1
check "the message names NEPHELE_GCP_ZONE" has "$ERR" "NEPHELE_GCP_ZONE is not set"
run "$GCE/remove.sh" NEPHELE_GCP_ZONE=europe-west4-a NEPHELE_REGION=eu-west NEPHELE_NODE=l4-spot-0
expect_rc "remove without NEPHELE_POOL" 1
check "the message names NEPHELE_POOL" has "$ERR" "NEPHELE_POOL is not set"
run "$GCE/list.sh" NEPHELE_POOL=l4-spot
expect_rc "list without NEPHELE_REGION" 1
check "the message names NEPHELE_REGION" has "$ERR" "NEPHELE_REGION is not set"
run "$GCE/add.sh" "${G_ADD[@]}" NEPHELE_NODE=L4_Spot NEPHELE_JOIN_TOKEN=$GT2
expect_rc "add with a name GCE does not accept" 1
run "$GCE/list.sh" "${G_POOL[@]}" GCLOUD=/nonexistent/gcloud
expect_rc "list without gcloud" 1
check "the message says gcloud is missing" has "$ERR" "'/nonexistent/gcloud' not found"

check "no join token in any recorded gcloud command line" \
    bash -c '! grep -q SECRETgce "$1"' _ "$STATE/calls.log"

# ---------------------------------------------------------------- startup.sh on the node
SECTION=cloud-cli/startup.sh
new_state node
ROOT="$STATE/root"
mkdir -p "$ROOT/opt/nephele" "$STATE/metadata/instance/attributes"
cp "$REPO/deploy/nephele-edge.service" "$ROOT/opt/nephele/"
cp "$REPO/deploy/install-edge.sh" "$ROOT/opt/nephele/install-edge.real.sh"
# install-edge.sh records its command line too, then is the real one.
cat >"$ROOT/opt/nephele/install-edge.sh" <<'EOF'
#!/usr/bin/env bash
{ printf 'install-edge.sh'; printf ' %q' "$@"; printf '\n'; } >>"$FAKE_STATE/calls.log"
exec bash "$(dirname "$0")/install-edge.real.sh" "$@"
EOF
cp "$FAKES/nephele-edge" "$ROOT/opt/nephele/nephele-edge"
M="$STATE/metadata/instance"
printf l4-spot-0 >"$M/attributes/nephele-node"
printf gpu-4x-l4 >"$M/attributes/nephele-profile"
printf cp.example:7443 >"$M/attributes/nephele-server"
printf '%s' "$GT0" >"$M/attributes/nephele-join-token"
printf projects/123/zones/europe-west4-a >"$M/zone"
mkdir -p "$STATE/gce/l4-spot-0/metadata" && echo europe-west4-a >"$STATE/gce/l4-spot-0/zone" && cp "$M/attributes/nephele-join-token" "$STATE/gce/l4-spot-0/metadata/"

run "$GCE/startup.sh" NEPHELE_ROOT="$ROOT"
expect_rc "first boot" 0
check "nephele-edge join got the token in its environment" file_is "$STATE/join-token-env" "$GT0"
check "join ran as a pool node with the metadata's name, profile and server" \
    grep -qF "nephele-edge join --role pool --name l4-spot-0 --profile gpu-4x-l4 --server cp.example:7443" "$STATE/calls.log"
check "install-edge.sh ran as a pool node, without a token" \
    grep -qxF "install-edge.sh --role pool --name l4-spot-0 --profile gpu-4x-l4 --server cp.example:7443 --binary $ROOT/opt/nephele/nephele-edge --root $ROOT" "$STATE/calls.log"
check "install-edge.sh installed the agent and skipped its own join" has "$OUT" "Already enrolled"
check "install-edge.sh installed the unit" [ -f "$ROOT/etc/systemd/system/nephele-edge.service" ]
check "the spent token is removed from the metadata" [ ! -e "$STATE/gce/l4-spot-0/metadata/nephele-join-token" ]
check "no join token on any command line on the node" bash -c '! grep -q SECRETgce "$1"' _ "$STATE/calls.log"
check "the token is not in the boot log" hasnt "$OUT$ERR" "$GT0"
run "$GCE/startup.sh" NEPHELE_ROOT="$ROOT"
expect_rc "later boots" 0
check "later boots do not join again" has "$OUT" "already enrolled"

# ======================================================================== testing/ helpers
SECTION=testing
run "$HERE/testing/fail.sh" NEPHELE_NODE=n1 NEPHELE_REGION=r NEPHELE_POOL=p NEPHELE_PROVIDER_TEST_LOG="$WORK/attempts"
expect_rc "fail.sh" 1
check "fail.sh explains itself on stderr" has "$ERR" "failing on purpose"
check "fail.sh logs the attempt" grep -q '^fail.sh n1 [0-9]*$' "$WORK/attempts"
start=$SECONDS
env HANG_SECONDS=30 "$HERE/testing/hang.sh" 2>/dev/null &
hang_pid=$!
sleep 0.3
kill -KILL "$hang_pid" 2>/dev/null
wait "$hang_pid" 2>/dev/null
check "hang.sh is still running until killed, and dies with its pid (exec sleep)" [ $? = 137 -a $((SECONDS - start)) -lt 5 ]

# ======================================================================== summary
echo "deploy/providers/test.sh: $PASSED checks passed, ${#FAILED[@]} failed"
if [[ ${#FAILED[@]} -gt 0 ]]; then
    printf '  failed: %s\n' "${FAILED[@]}" >&2
    exit 1
fi
