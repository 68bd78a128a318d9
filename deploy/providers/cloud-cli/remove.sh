#!/usr/bin/env bash
# nephele `command` provider, cloud CLI example (Google Cloud, gcloud): REMOVE one pool node.
#
# Deletes the Compute Engine instance $NEPHELE_NODE in $NEPHELE_GCP_ZONE (and its boot
# disk, which gcloud deletes with it by default), after checking that it carries this
# pool's labels (nephele-region, nephele-pool): an instance that is not this pool's node
# is never deleted. No such instance: exit 0, it is gone (a spot node reclaimed by
# Google is deleted by its termination action).
#
# Usage: remove.sh         (run by nephele-cloud; -h/--help prints this)
# Environment from the control plane: NEPHELE_REGION, NEPHELE_POOL, NEPHELE_NODE.
# From the operator: NEPHELE_GCP_ZONE (required), NEPHELE_GCP_PROJECT, GCLOUD.
# Exit: 0 = the instance is gone; 1 = failed (stderr says why).

set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_args "$@"
need_env NEPHELE_REGION NEPHELE_POOL NEPHELE_NODE NEPHELE_GCP_ZONE
check_node_name "$NEPHELE_NODE"

describe_instance
if [[ -z "$INSTANCE_LABELS" ]]; then
    say "instance $NEPHELE_NODE does not exist in $NEPHELE_GCP_ZONE: gone"
    exit 0
fi
if [[ "$INSTANCE_LABELS" != "$NEPHELE_REGION $NEPHELE_POOL" ]]; then
    die "instance $NEPHELE_NODE in $NEPHELE_GCP_ZONE is not a node of pool $NEPHELE_REGION/$NEPHELE_POOL (labels: '$INSTANCE_LABELS'); not deleting it"
fi
if ! err="$(g compute instances delete "$NEPHELE_NODE" --zone="$NEPHELE_GCP_ZONE" --quiet 2>&1 >/dev/null)"; then
    # Deleted meanwhile (a spot reclaim, another attempt)? Then it is gone all the same.
    describe_instance
    [[ -n "$INSTANCE_LABELS" ]] || { say "instance $NEPHELE_NODE is gone"; exit 0; }
    die "gcloud could not delete instance $NEPHELE_NODE in $NEPHELE_GCP_ZONE: $err"
fi
say "deleted instance $NEPHELE_NODE in $NEPHELE_GCP_ZONE"
