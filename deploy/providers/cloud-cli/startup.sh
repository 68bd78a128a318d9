#!/bin/bash
# Startup script of a nephele pool node on Google Compute Engine. cloud-cli/add.sh sets
# it as the instance's `startup-script` metadata; the guest agent runs it as root at
# every boot and logs its output to the journal (google-startup-scripts.service) and the
# serial console.
#
# First boot: reads the node name, profile, server and join token from the metadata
# server; fetches the nephele bundle (install-edge.sh, nephele-edge, nephele-edge.service)
# from the gs:// URL in `nephele-bundle`, or uses /opt/nephele baked into the image;
# enrols with `nephele-edge join --role pool`, the token passed in the environment
# (NEPHELE_JOIN_TOKEN), never on a command line; then runs
# `install-edge.sh --role pool --name ... --profile ...`, which installs the agent and
# its systemd unit, hands the data dir to the `nephele` user and starts the agent (it
# skips its own join because the node is already enrolled). Last, it tries to remove
# the spent token from the instance metadata (needs compute.instances.setMetadata;
# harmless when not allowed: the token is single-use).
# Later boots: the node is enrolled; the agent's unit starts it.
# NEPHELE_ROOT (tests only; unset on a real node): install under this directory
# (install-edge.sh --root), and do not touch systemd.

set -euo pipefail
MD=http://metadata.google.internal/computeMetadata/v1
md() { curl -fsS --retry 10 --retry-connrefused -H 'Metadata-Flavor: Google' "$MD/$1"; }
log() { echo "nephele-startup: $*"; }
ROOT="${NEPHELE_ROOT:-}"
DATA="$ROOT/var/lib/nephele-edge"
DIR="$ROOT/opt/nephele"

if [ -f "$DATA/agent.toml" ]; then
    log "already enrolled ($DATA/agent.toml); the nephele-edge service runs the agent"
    [ -n "$ROOT" ] || systemctl start nephele-edge || true
    exit 0
fi

NAME="$(md instance/attributes/nephele-node)"
PROFILE="$(md instance/attributes/nephele-profile)"
SERVER="$(md instance/attributes/nephele-server)"
BUNDLE="$(md instance/attributes/nephele-bundle 2>/dev/null || true)"

if [ -n "$BUNDLE" ]; then
    log "fetching $BUNDLE"
    mkdir -p "$DIR"
    gcloud storage cp "$BUNDLE" /tmp/nephele-bundle.tar.gz
    tar -xzf /tmp/nephele-bundle.tar.gz -C "$DIR"
    rm -f /tmp/nephele-bundle.tar.gz
fi
for f in install-edge.sh nephele-edge nephele-edge.service; do
    [ -f "$DIR/$f" ] || { log "error: $DIR/$f is missing (bake it into the image or set NEPHELE_GCP_BUNDLE)"; exit 1; }
done
chmod +x "$DIR/install-edge.sh" "$DIR/nephele-edge"

log "enrolling as $NAME ($PROFILE) with $SERVER"
mkdir -p "$DATA"
chmod 0700 "$DATA"
NEPHELE_JOIN_TOKEN="$(md instance/attributes/nephele-join-token)" \
    "$DIR/nephele-edge" join --role pool --name "$NAME" --profile "$PROFILE" \
    --server "$SERVER" --data-dir "$DATA"

log "installing and starting the agent"
"$DIR/install-edge.sh" --role pool --name "$NAME" --profile "$PROFILE" --server "$SERVER" \
    --binary "$DIR/nephele-edge" ${ROOT:+--root "$ROOT"}

ZONE="$(md instance/zone)"
gcloud compute instances remove-metadata "$NAME" --zone="${ZONE##*/}" --keys=nephele-join-token >/dev/null 2>&1 \
    || log "could not remove nephele-join-token from the metadata (no permission?); it is spent anyway"
log "done"
