#!/usr/bin/env bash
# nephele `command` provider, Kubernetes example: REMOVE one pool node.
#
# A StatefulSet can only shrink from its highest ordinal. This script:
#   1. deletes the node's join token from the Secret <statefulset>-join (so its pod,
#      if it restarts, waits instead of joining);
#   2. when NEPHELE_NODE is the highest ordinal (<statefulset>-(N-1)): scales the
#      StatefulSet down, past it and past every pod below it that holds no token
#      (nodes removed earlier while they were not the highest), and exits 0;
#   3. when the pod does not exist (ordinal >= replicas): exits 0, it is gone;
#   4. otherwise (a pod below the top): deletes the pod, so its agent stops and leaves
#      nephele (the StatefulSet recreates the pod, which then waits for a token without
#      joining), and exits 1 saying so: the pod still holds its Kubernetes node until
#      every higher ordinal is removed. The control plane retries the removal with
#      backoff; the retry that finds it at the top scales it away, and so does the
#      removal of the last node above it.
#
# Usage: remove.sh         (run by nephele-cloud; -h/--help prints this)
# Environment from the control plane: NEPHELE_REGION, NEPHELE_POOL, NEPHELE_NODE.
# Optional, from the operator: KUBECTL, NEPHELE_K8S_NAMESPACE, NEPHELE_K8S_STATEFULSET,
#   NEPHELE_K8S_SECRET (as for add.sh).
# Exit: 0 = the node is gone or going; 1 = not (yet) removed (stderr says why).

set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_args "$@"
need_env NEPHELE_REGION NEPHELE_POOL NEPHELE_NODE
check_node_name "$NEPHELE_NODE"
find_statefulset
ordinal_of "$NEPHELE_NODE"

# 1. Forget the token (a JSON merge patch with null deletes the key; no-op if absent).
if k get secret "$SECRET" -o name >/dev/null 2>&1; then
    printf '{"data":{"%s":null}}' "$NEPHELE_NODE" \
        | k patch secret "$SECRET" --type merge --patch-file /dev/stdin >/dev/null \
        || die "kubectl could not delete the join token of $NEPHELE_NODE from Secret '$SECRET' (see its message above)"
fi

for _ in 1 2 3 4 5 6 7 8; do
    current="$(replicas)"
    if ((ORDINAL >= current)); then
        say "$NEPHELE_NODE is gone (StatefulSet $STS has $current replicas)"
        exit 0
    fi
    if ((ORDINAL == current - 1)); then
        # 2. The top: scale down past it and past the token-less pods below it.
        keys="$(secret_keys)"
        target="$ORDINAL"
        while ((target > 0)) && ! grep -qxF "$STS-$((target - 1))" <<<"$keys"; do
            target=$((target - 1))
        done
        if scale_from_to "$current" "$target"; then
            if ((target < ORDINAL)); then
                say "scaled StatefulSet $STS from $current to $target replicas: removed $NEPHELE_NODE and the pods $STS-$target..$STS-$((ORDINAL - 1)), whose nodes were removed earlier"
            else
                say "scaled StatefulSet $STS from $current to $target replicas: removed $NEPHELE_NODE"
            fi
            exit 0
        fi
        sleep 0.5 # the size changed under us: look again
        continue
    fi
    # 4. Below the top.
    k delete pod "$NEPHELE_NODE" --ignore-not-found --wait=false >/dev/null \
        || die "kubectl could not delete pod '$NEPHELE_NODE' (see its message above)"
    die "$NEPHELE_NODE left nephele (its token is deleted and its pod restarted without one, so its agent stopped), but StatefulSet '$STS' has $current replicas and can only shrink from $STS-$((current - 1)): the pod keeps its Kubernetes node until every higher ordinal is removed. The next retry, or the removal of the nodes above it, scales it away"
done
die "StatefulSet '$STS' kept changing size while removing $NEPHELE_NODE; giving up for now (the control plane retries)"
