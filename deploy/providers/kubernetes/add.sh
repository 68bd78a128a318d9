#!/usr/bin/env bash
# nephele `command` provider, Kubernetes example: ADD one pool node.
#
# The pool's nodes are the pods of one StatefulSet (pool-statefulset.yaml), named
# <statefulset>-<ordinal>; each pod joins nephele under its own name. This script:
#   1. finds the StatefulSet (NEPHELE_K8S_STATEFULSET, else the one labelled
#      nephele.dev/region=$NEPHELE_REGION,nephele.dev/pool=$NEPHELE_POOL) and checks
#      that its pod template runs NEPHELE_PROFILE / NEPHELE_CAPACITY_TYPE / NEPHELE_SERVER
#      (annotations nephele.dev/profile, nephele.dev/capacity-type, nephele.dev/server);
#   2. stores the join token in the Secret <statefulset>-join under the key
#      $NEPHELE_NODE (kubectl patch --patch-file /dev/stdin: never on a command line);
#   3. makes the pod exist: scales the StatefulSet from N to N+1 when NEPHELE_NODE is
#      <statefulset>-N (with kubectl's --current-replicas precondition, retried, so adds
#      running at once do not undo each other); when the pod already exists (a pod left
#      waiting for its token), deletes it so that it restarts with the new token.
# A node whose ordinal is above the replica count is refused: the StatefulSet would
# create the pods in between, which nobody asked for. The pod then joins by itself
# (`nephele-edge join`, then `nephele-edge run`; see pool-statefulset.yaml).
#
# Usage: add.sh            (run by nephele-cloud; -h/--help prints this)
# Environment from the control plane: NEPHELE_REGION, NEPHELE_POOL, NEPHELE_NODE,
#   NEPHELE_PROFILE, NEPHELE_CAPACITY_TYPE (spot|on-demand), NEPHELE_SERVER,
#   NEPHELE_JOIN_TOKEN (single-use, expiring; never printed).
# Optional, from the operator: KUBECTL (default kubectl), NEPHELE_K8S_NAMESPACE,
#   NEPHELE_K8S_STATEFULSET, NEPHELE_K8S_SECRET (default <statefulset>-join); kubectl's
#   own KUBECONFIG and context apply.
# Exit: 0 = the pod is being created and will enrol by itself; 1 = failed (stderr says why).

set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_args "$@"
need_env NEPHELE_REGION NEPHELE_POOL NEPHELE_NODE NEPHELE_PROFILE NEPHELE_CAPACITY_TYPE NEPHELE_SERVER NEPHELE_JOIN_TOKEN
case "$NEPHELE_CAPACITY_TYPE" in
    spot | on-demand) ;;
    *) die "NEPHELE_CAPACITY_TYPE must be 'spot' or 'on-demand', not '$NEPHELE_CAPACITY_TYPE'" ;;
esac
check_node_name "$NEPHELE_NODE"
# The token goes into a JSON document; refuse characters that would need escaping
# (nephele's tokens are nph1.<id>.<secret>.<hex>). The message does not show it.
[[ "$NEPHELE_JOIN_TOKEN" =~ ^[A-Za-z0-9._~+/=:-]+$ ]] \
    || die "NEPHELE_JOIN_TOKEN has characters a join token never has (value not shown)"

find_statefulset
ordinal_of "$NEPHELE_NODE"

# 1. The pod template must be the pool's: profile, capacity type, control plane address.
template="$(k get statefulset "$STS" -o 'jsonpath={.spec.template.metadata.annotations.nephele\.dev/profile}{"|"}{.spec.template.metadata.annotations.nephele\.dev/capacity-type}{"|"}{.spec.template.metadata.annotations.nephele\.dev/server}')" \
    || die "kubectl could not read StatefulSet '$STS' (see its message above)"
IFS='|' read -r t_profile t_capacity t_server <<<"$template" || true
[[ "${t_profile:-}" == "$NEPHELE_PROFILE" ]] \
    || die "StatefulSet '$STS' runs profile '${t_profile:-<no nephele.dev/profile annotation>}', but pool $NEPHELE_REGION/$NEPHELE_POOL asks for '$NEPHELE_PROFILE' (one StatefulSet per pool; fix its pod template's annotations and node selector)"
[[ "${t_capacity:-}" == "$NEPHELE_CAPACITY_TYPE" ]] \
    || die "StatefulSet '$STS' runs capacity type '${t_capacity:-<no nephele.dev/capacity-type annotation>}', but the pool asks for '$NEPHELE_CAPACITY_TYPE'"
[[ "${t_server:-}" == "$NEPHELE_SERVER" ]] \
    || die "StatefulSet '$STS' points its agents at '${t_server:-<no nephele.dev/server annotation>}', but the control plane's QUIC address is '$NEPHELE_SERVER'"

# 2. The token, in the Secret, under the node's name.
if ! k get secret "$SECRET" -o name >/dev/null 2>&1; then
    if ! err="$(k create secret generic "$SECRET" 2>&1 >/dev/null)" && [[ "$err" != *AlreadyExists* && "$err" != *"already exists"* ]]; then
        die "kubectl could not create Secret '$SECRET': $err"
    fi
fi
printf '{"stringData":{"%s":"%s"}}' "$NEPHELE_NODE" "$NEPHELE_JOIN_TOKEN" \
    | k patch secret "$SECRET" --type merge --patch-file /dev/stdin >/dev/null \
    || die "kubectl could not store the join token in Secret '$SECRET' (see its message above)"

# 3. The pod.
for _ in 1 2 3 4 5 6 7 8; do
    current="$(replicas)"
    if ((ORDINAL < current)); then
        # The pod exists: waiting for a token (a removed node's pod below the top, or an
        # earlier attempt). Restart it so it reads the new token now.
        k delete pod "$NEPHELE_NODE" --ignore-not-found --wait=false >/dev/null \
            || die "kubectl could not restart pod '$NEPHELE_NODE' (see its message above)"
        say "pod $NEPHELE_NODE exists (StatefulSet $STS has $current replicas); restarted it with the new join token"
        exit 0
    fi
    if ((ORDINAL > current)); then
        k patch secret "$SECRET" --type merge --patch-file /dev/stdin >/dev/null 2>&1 <<<"{\"data\":{\"$NEPHELE_NODE\":null}}" || true
        die "cannot add $NEPHELE_NODE: StatefulSet '$STS' has $current replicas, so its next pod is $STS-$current. A StatefulSet creates pods in order; adding ordinal $ORDINAL would also start $STS-$current..$STS-$((ORDINAL - 1)), which nobody asked for. Add $STS-$current first"
    fi
    if scale_from_to "$current" "$((ORDINAL + 1))"; then
        say "scaled StatefulSet $STS from $current to $((ORDINAL + 1)) replicas; pod $NEPHELE_NODE will join $NEPHELE_SERVER as a $NEPHELE_PROFILE ($NEPHELE_CAPACITY_TYPE) node"
        exit 0
    fi
    sleep 0.5 # another script scaled the StatefulSet at the same time: look again
done
die "StatefulSet '$STS' kept changing size while adding $NEPHELE_NODE; giving up for now (the control plane retries)"
