#!/usr/bin/env bash
# nephele `command` provider, cloud CLI example (Google Cloud, gcloud): LIST the pool's nodes.
#
# Prints, one per line, the names of the instances labelled nephele-region=$NEPHELE_REGION
# and nephele-pool=$NEPHELE_POOL (in $NEPHELE_GCP_ZONE when it is set, else in every
# zone of the project), whatever their state. The control plane uses it to reconcile
# after a restart.
#
# Usage: list.sh           (run by nephele-cloud; -h/--help prints this)
# Environment from the control plane: NEPHELE_REGION, NEPHELE_POOL.
# From the operator: NEPHELE_GCP_ZONE (optional here), NEPHELE_GCP_PROJECT, GCLOUD.
# Exit: 0 with the list on stdout (possibly empty); 1 = could not list (stderr says why).

set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_args "$@"
need_env NEPHELE_REGION NEPHELE_POOL
ZONE_ARGS=()
[[ -z "${NEPHELE_GCP_ZONE:-}" ]] || ZONE_ARGS=(--zones="$NEPHELE_GCP_ZONE")
names="$(g compute instances list ${ZONE_ARGS[@]+"${ZONE_ARGS[@]}"} \
    --filter="labels.nephele-region=$NEPHELE_REGION AND labels.nephele-pool=$NEPHELE_POOL" \
    --format='value(name)')" || die "gcloud could not list the instances of pool $NEPHELE_REGION/$NEPHELE_POOL (see its message above)"
[[ -z "$names" ]] || printf '%s\n' "$names"
