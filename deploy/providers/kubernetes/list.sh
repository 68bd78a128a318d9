#!/usr/bin/env bash
# nephele `command` provider, Kubernetes example: LIST the pool's nodes.
#
# Prints, one per line, the names of the nodes this provider manages for the pool:
# the pods <statefulset>-<ordinal> below the replica count whose join token is in the
# Secret <statefulset>-join (a pod without one is a removed node waiting to be scaled
# away, and is not listed). The control plane uses it to reconcile after a restart.
#
# Usage: list.sh           (run by nephele-cloud; -h/--help prints this)
# Environment from the control plane: NEPHELE_REGION, NEPHELE_POOL.
# Optional, from the operator: KUBECTL, NEPHELE_K8S_NAMESPACE, NEPHELE_K8S_STATEFULSET,
#   NEPHELE_K8S_SECRET (as for add.sh).
# Exit: 0 with the list on stdout (possibly empty); 1 = could not list (stderr says why).

set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_args "$@"
need_env NEPHELE_REGION NEPHELE_POOL
find_statefulset
current="$(replicas)"
keys="$(secret_keys)"
for ((i = 0; i < current; i++)); do
    if grep -qxF "$STS-$i" <<<"$keys"; then
        printf '%s\n' "$STS-$i"
    fi
done
