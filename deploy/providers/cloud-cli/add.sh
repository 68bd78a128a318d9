#!/usr/bin/env bash
# nephele `command` provider, cloud CLI example (Google Cloud, gcloud): ADD one pool node.
#
# Creates the Compute Engine instance $NEPHELE_NODE in $NEPHELE_GCP_ZONE:
#   - machine type (and GPUs) from NEPHELE_PROFILE, by the table in machine_for_profile;
#   - NEPHELE_CAPACITY_TYPE spot -> --provisioning-model=SPOT with
#     --instance-termination-action=DELETE (a reclaimed node is deleted, not stopped);
#     on-demand -> --provisioning-model=STANDARD; GPUs need --maintenance-policy=TERMINATE;
#   - labels nephele-region, nephele-pool, nephele-capacity (list.sh and remove.sh use
#     the first two, and remove.sh never deletes an instance without them);
#   - startup.sh (next to this file) as its startup script; the node name, profile and
#     server as metadata; the join token as the metadata key nephele-join-token, read by
#     gcloud from a 0600 temporary file (--metadata-from-file): never on a command line.
# The startup script enrols the node (nephele-edge join, token from the metadata server,
# passed in the environment) and runs deploy/install-edge.sh --role pool, which installs
# and starts the agent. If the instance already exists (an earlier attempt that was cut
# short) and carries this pool's labels, its token is replaced and it is reset, so that
# its startup script enrols it with the new token.
#
# Usage: add.sh            (run by nephele-cloud; -h/--help prints this)
# Environment from the control plane: NEPHELE_REGION, NEPHELE_POOL, NEPHELE_NODE,
#   NEPHELE_PROFILE, NEPHELE_CAPACITY_TYPE (spot|on-demand), NEPHELE_SERVER,
#   NEPHELE_JOIN_TOKEN (single-use, expiring; never printed).
# From the operator: NEPHELE_GCP_ZONE (required), NEPHELE_GCP_IMAGE_FAMILY and
#   NEPHELE_GCP_IMAGE_PROJECT (required: an image with the NVIDIA driver, e.g. a Deep
#   Learning VM image), NEPHELE_GCP_PROJECT (default: gcloud's), NEPHELE_GCP_BUNDLE
#   (gs:// URL of a .tar.gz holding install-edge.sh, nephele-edge and
#   nephele-edge.service; default: the image has them in /opt/nephele),
#   NEPHELE_GCP_SERVICE_ACCOUNT, NEPHELE_GCP_DISK_GB (default 200), GCLOUD (default gcloud).
# Exit: 0 = the instance is being created and will enrol by itself; 1 = failed (stderr
#   says why, with gcloud's message, e.g. quota or no capacity in the zone).

set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
parse_args "$@"
need_env NEPHELE_REGION NEPHELE_POOL NEPHELE_NODE NEPHELE_PROFILE NEPHELE_CAPACITY_TYPE NEPHELE_SERVER NEPHELE_JOIN_TOKEN \
    NEPHELE_GCP_ZONE NEPHELE_GCP_IMAGE_FAMILY NEPHELE_GCP_IMAGE_PROJECT
check_node_name "$NEPHELE_NODE"
[[ -f "$HERE/startup.sh" ]] || die "startup.sh is missing next to this script ($HERE)"

# Firmware profile -> machine type, and the GPUs to attach when the machine type does
# not come with them. The accelerator-optimized types (g2, a2, a3) include their GPUs.
machine_for_profile() {
    ACCELERATOR=""
    case "$1" in
        gpu-4x-l4) MACHINE_TYPE=g2-standard-48 ;;      # 4x L4 24GB, 48 vCPU, 192 GB
        gpu-1x-t4) MACHINE_TYPE=n1-standard-4           # 4 vCPU, 15 GB
                   ACCELERATOR=type=nvidia-tesla-t4,count=1 ;;
        dgx-a100-80gb) MACHINE_TYPE=a2-ultragpu-8g ;;   # 8x A100 80GB
        hgx-h100-80gb) MACHINE_TYPE=a3-highgpu-8g ;;    # 8x H100 80GB
        *) die "no machine type for profile '$1' in this script's table (machine_for_profile): add one" ;;
    esac
}
machine_for_profile "$NEPHELE_PROFILE"

case "$NEPHELE_CAPACITY_TYPE" in
    spot) CAPACITY_ARGS=(--provisioning-model=SPOT --instance-termination-action=DELETE) ;;
    on-demand) CAPACITY_ARGS=(--provisioning-model=STANDARD) ;;
    *) die "NEPHELE_CAPACITY_TYPE must be 'spot' or 'on-demand', not '$NEPHELE_CAPACITY_TYPE'" ;;
esac
for value in "$NEPHELE_REGION" "$NEPHELE_POOL" "$NEPHELE_SERVER" "${NEPHELE_GCP_BUNDLE:-}"; do
    [[ "$value" != *,* ]] || die "'$value' contains a comma, which gcloud's --metadata/--labels lists cannot carry"
done

# The token file: private directory (0700), file 0600, removed on exit.
TOKEN_FILE="$TMPDIR_P/join-token"
(umask 077 && printf '%s' "$NEPHELE_JOIN_TOKEN" >"$TOKEN_FILE")

describe_instance
if [[ -n "$INSTANCE_LABELS" ]]; then
    if [[ "$INSTANCE_LABELS" != "$NEPHELE_REGION $NEPHELE_POOL" ]]; then
        die "an instance named $NEPHELE_NODE already exists in $NEPHELE_GCP_ZONE and is not a node of pool $NEPHELE_REGION/$NEPHELE_POOL (labels: '$INSTANCE_LABELS'); not touching it"
    fi
    g compute instances add-metadata "$NEPHELE_NODE" --zone="$NEPHELE_GCP_ZONE" \
        --metadata-from-file=nephele-join-token="$TOKEN_FILE" >/dev/null \
        || die "gcloud could not give the existing instance $NEPHELE_NODE its new join token (see its message above)"
    g compute instances reset "$NEPHELE_NODE" --zone="$NEPHELE_GCP_ZONE" >/dev/null \
        || die "gcloud could not reset the existing instance $NEPHELE_NODE (see its message above)"
    say "instance $NEPHELE_NODE already existed (an earlier attempt); gave it the new join token and reset it"
    exit 0
fi

METADATA="nephele-node=$NEPHELE_NODE,nephele-profile=$NEPHELE_PROFILE,nephele-server=$NEPHELE_SERVER"
[[ -z "${NEPHELE_GCP_BUNDLE:-}" ]] || METADATA+=",nephele-bundle=$NEPHELE_GCP_BUNDLE"
ARGS=(compute instances create "$NEPHELE_NODE"
    --zone="$NEPHELE_GCP_ZONE"
    --machine-type="$MACHINE_TYPE"
    --maintenance-policy=TERMINATE
    "${CAPACITY_ARGS[@]}"
    --image-family="$NEPHELE_GCP_IMAGE_FAMILY" --image-project="$NEPHELE_GCP_IMAGE_PROJECT"
    --boot-disk-size="${NEPHELE_GCP_DISK_GB:-200}GB"
    --labels="nephele-region=$NEPHELE_REGION,nephele-pool=$NEPHELE_POOL,nephele-capacity=$NEPHELE_CAPACITY_TYPE"
    --metadata="$METADATA"
    --metadata-from-file="startup-script=$HERE/startup.sh,nephele-join-token=$TOKEN_FILE")
[[ -z "$ACCELERATOR" ]] || ARGS+=(--accelerator="$ACCELERATOR")
[[ -z "${NEPHELE_GCP_SERVICE_ACCOUNT:-}" ]] || ARGS+=(--service-account="$NEPHELE_GCP_SERVICE_ACCOUNT" --scopes=cloud-platform)
if ! err="$(g "${ARGS[@]}" 2>&1 >/dev/null)"; then
    die "gcloud could not create instance $NEPHELE_NODE ($MACHINE_TYPE, $NEPHELE_CAPACITY_TYPE) in $NEPHELE_GCP_ZONE: $err"
fi
say "created instance $NEPHELE_NODE ($MACHINE_TYPE${ACCELERATOR:+ + $ACCELERATOR}, $NEPHELE_CAPACITY_TYPE) in $NEPHELE_GCP_ZONE; it will join $NEPHELE_SERVER as a $NEPHELE_PROFILE node"
