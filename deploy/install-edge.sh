#!/usr/bin/env bash
# Installs the nephele agent (nephele-edge) on this machine, enrols it with the control
# plane and starts it under systemd. Run `install-edge.sh --help` for the options.
set -euo pipefail

PROG=${0##*/}
SCRIPT_DIR=$(cd "$(dirname "$0")" && pwd)

usage() {
    cat <<EOF
Usage: $PROG --server HOST:PORT --token TOKEN [options]

Installs the nephele agent, enrols this device with the control plane and starts
the nephele-edge systemd service. With --root DIR it installs into an image instead:
nothing is enrolled or started there; given --server and --token, the image enrols at
its first boot (nephele-edge-join.service, from DIR/etc/nephele-edge/join.env).

Required (unless the device is already enrolled and --force is not given):
  --server HOST:PORT   QUIC address of the control plane (quic_listen, UDP)
  --token TOKEN        join token (\`nephele token create\` or POST /v1/tokens)

Options:
  --binary PATH        nephele-edge binary to install (default: nephele-edge next to
                       this script, else ./target/release/nephele-edge)
  --name NAME          device name (lowercase letters, digits, '-'; default: host name)
  --profile NAME       firmware profile (see \`nephele-edge profiles\`; default: detected)
  --label KEY=VALUE    label for deployment selectors (repeatable)
  --role edge|pool     \`edge\` for devices, \`pool\` for cloud GPU nodes (default: edge)
  --root DIR           install into an image or staging tree under DIR instead of /:
                       no root needed, no user created, no chown, nothing started, and
                       no join: --server/--token (optional here) go to
                       DIR/etc/nephele-edge/join.env for the first boot (a join token is
                       single use: one image per device, or drop a join.env per device)
  --join-now           with --root: enrol now into DIR's data dir (staging and tests)
  --force              re-enrol even if the data dir already holds an enrolment
  --no-start           install and enrol, but do not enable or start the service
  -h, --help           show this help

Installs: /usr/local/bin/nephele-edge, /var/lib/nephele-edge (data dir, 0700),
/etc/systemd/system/nephele-edge.service; runs the agent as the system user 'nephele'.
EOF
}

step() { printf '==> %s\n' "$*"; }
note() { printf '    %s\n' "$*"; }
die() {
    printf '%s: error: %s\n' "$PROG" "$*" >&2
    exit 1
}
on_error() {
    local status=$? line=$1 command=$2
    printf '%s: error: command failed (exit %s) at line %s: %s\n' "$PROG" "$status" "$line" "$command" >&2
    exit "$status"
}
trap 'on_error "$LINENO" "$BASH_COMMAND"' ERR

need_value() {
    # $1: option name, $2: number of remaining arguments including the option
    [ "$2" -ge 2 ] || die "$1 needs a value (see --help)"
}

SERVER=""
TOKEN=""
BINARY=""
NAME=""
PROFILE=""
ROLE="edge"
ROOT=""
ROOT_GIVEN=0
NO_START=0
FORCE=0
JOIN_NOW=0
LABELS=()

while [ $# -gt 0 ]; do
    case "$1" in
        --server) need_value "$1" $#; SERVER=$2; shift 2 ;;
        --server=*) SERVER=${1#*=}; shift ;;
        --token) need_value "$1" $#; TOKEN=$2; shift 2 ;;
        --token=*) TOKEN=${1#*=}; shift ;;
        --binary) need_value "$1" $#; BINARY=$2; shift 2 ;;
        --binary=*) BINARY=${1#*=}; shift ;;
        --name) need_value "$1" $#; NAME=$2; shift 2 ;;
        --name=*) NAME=${1#*=}; shift ;;
        --profile) need_value "$1" $#; PROFILE=$2; shift 2 ;;
        --profile=*) PROFILE=${1#*=}; shift ;;
        --label) need_value "$1" $#; LABELS+=("$2"); shift 2 ;;
        --label=*) LABELS+=("${1#*=}"); shift ;;
        --role) need_value "$1" $#; ROLE=$2; shift 2 ;;
        --role=*) ROLE=${1#*=}; shift ;;
        --root) need_value "$1" $#; ROOT=$2; ROOT_GIVEN=1; shift 2 ;;
        --root=*) ROOT=${1#*=}; ROOT_GIVEN=1; shift ;;
        --force) FORCE=1; shift ;;
        --join-now) JOIN_NOW=1; shift ;;
        --no-start) NO_START=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
done

# ---- validate arguments --------------------------------------------------------------

case "$ROLE" in
    edge | pool) ;;
    *) die "--role must be 'edge' or 'pool', not '$ROLE'" ;;
esac
if [ ${#LABELS[@]} -gt 0 ]; then
    for label in "${LABELS[@]}"; do
        case "$label" in
            ?*=*) ;;
            *) die "--label must be KEY=VALUE, not '$label'" ;;
        esac
    done
fi
if [ "$ROOT_GIVEN" -eq 1 ]; then
    [ -n "$ROOT" ] || die "--root needs a non-empty directory"
    mkdir -p "$ROOT" || die "cannot create --root directory $ROOT"
    ROOT=$(cd "$ROOT" && pwd)
    [ "$ROOT" != "/" ] || ROOT=""
elif [ "$(id -u || true)" != 0 ]; then
    die "run this script as root (e.g. with sudo), or pass --root DIR to install into a staging directory"
fi

BIN_DEST="$ROOT/usr/local/bin/nephele-edge"
DATA_DIR="$ROOT/var/lib/nephele-edge"
UNIT_DEST="$ROOT/etc/systemd/system/nephele-edge.service"
SERVICE_USER="nephele"

if [ -z "$BINARY" ]; then
    if [ -f "$SCRIPT_DIR/nephele-edge" ]; then
        BINARY="$SCRIPT_DIR/nephele-edge"
    elif [ -f "./target/release/nephele-edge" ]; then
        BINARY="./target/release/nephele-edge"
    else
        die "no nephele-edge binary next to this script ($SCRIPT_DIR) or in ./target/release; pass --binary PATH"
    fi
fi
[ -f "$BINARY" ] || die "binary not found: $BINARY"
if BINARY_VERSION=$("$BINARY" --version 2>/dev/null); then
    case "$BINARY_VERSION" in
        "nephele-edge "*) ;;
        *) die "$BINARY is not a nephele-edge binary (its --version says '$BINARY_VERSION')" ;;
    esac
elif [ -n "$ROOT" ] && [ "$JOIN_NOW" -eq 0 ] \
    && [ "$(head -c 4 "$BINARY" | od -An -c | tr -d ' ')" = '177ELF' ] \
    && grep -qa 'nephele-edge' "$BINARY"; then
    # An image for another architecture: the binary cannot run here, which is fine.
    note "$BINARY does not run on this machine (another architecture?); installing it into the image"
else
    die "$BINARY does not run here (wrong architecture, or not a nephele-edge binary?)"
fi

UNIT_SRC=""
for candidate in "$SCRIPT_DIR/nephele-edge.service" "./deploy/nephele-edge.service"; do
    if [ -f "$candidate" ]; then
        UNIT_SRC=$candidate
        break
    fi
done
[ -n "$UNIT_SRC" ] || die "nephele-edge.service not found next to this script ($SCRIPT_DIR) or in ./deploy"

ENROLLED=0
[ -f "$DATA_DIR/agent.toml" ] && ENROLLED=1
DO_JOIN=1
if [ "$ENROLLED" -eq 1 ] && [ "$FORCE" -eq 0 ]; then
    DO_JOIN=0
fi
FIRST_BOOT=0
if [ "$ROOT_GIVEN" -eq 1 ] && [ "$JOIN_NOW" -eq 0 ] && [ "$ENROLLED" -eq 0 ]; then
    # An image: enrol at its first boot, not here (a join here would spend the token
    # and bake one device's identity into every copy of the image).
    DO_JOIN=0
    if [ -n "$TOKEN" ]; then
        [ -n "$SERVER" ] || die "--token for the first boot's join needs --server too"
        FIRST_BOOT=1
    fi
elif [ "$JOIN_NOW" -eq 1 ] && [ "$ROOT_GIVEN" -eq 0 ]; then
    die "--join-now is for --root installs (without --root the device is enrolled anyway)"
fi
if [ "$DO_JOIN" -eq 1 ]; then
    [ -n "$SERVER" ] || die "--server HOST:PORT is required (the control plane's QUIC address)"
    [ -n "$TOKEN" ] || die "--token TOKEN is required (create one with \`nephele token create\`)"
fi

# ---- install ---------------------------------------------------------------------------

step "Installing $BINARY to $BIN_DEST"
mkdir -p "$(dirname "$BIN_DEST")"
# Copy then rename, so that upgrading a running agent does not fail with "text file busy".
install -m 0755 "$BINARY" "$BIN_DEST.new"
mv -f "$BIN_DEST.new" "$BIN_DEST"
VERSION=$("$BIN_DEST" --version)
note "$VERSION"

if [ -z "$ROOT" ]; then
    if id -u "$SERVICE_USER" >/dev/null 2>&1; then
        step "System user '$SERVICE_USER' already exists"
    else
        step "Creating system user '$SERVICE_USER'"
        command -v useradd >/dev/null 2>&1 || die "useradd not found; create the system user '$SERVICE_USER' by hand and re-run"
        NOLOGIN=/usr/sbin/nologin
        [ -x "$NOLOGIN" ] || NOLOGIN=/sbin/nologin
        [ -x "$NOLOGIN" ] || NOLOGIN=/bin/false
        useradd --system --user-group --no-create-home --home-dir /var/lib/nephele-edge \
            --shell "$NOLOGIN" "$SERVICE_USER"
    fi
fi

step "Creating data dir $DATA_DIR (0700)"
mkdir -p "$DATA_DIR"
chmod 0700 "$DATA_DIR"
if [ -z "$ROOT" ]; then
    chown -R "$SERVICE_USER:$SERVICE_USER" "$DATA_DIR"
fi

# ---- enrol -----------------------------------------------------------------------------

# What the device joins as, now or at the image's first boot.
DEVICE_ARGS=(--role "$ROLE")
[ -z "$NAME" ] || DEVICE_ARGS+=(--name "$NAME")
[ -z "$PROFILE" ] || DEVICE_ARGS+=(--profile "$PROFILE")
if [ ${#LABELS[@]} -gt 0 ]; then
    for label in "${LABELS[@]}"; do
        DEVICE_ARGS+=(--label "$label")
    done
fi

if [ "$DO_JOIN" -eq 1 ]; then
    JOIN_ARGS=(join --server "$SERVER" --data-dir "$DATA_DIR" "${DEVICE_ARGS[@]}")
    [ "$FORCE" -eq 0 ] || JOIN_ARGS+=(--force)
    # The token goes through the environment (nephele-edge reads NEPHELE_JOIN_TOKEN),
    # so that it does not show in the process list.
    export NEPHELE_JOIN_TOKEN="$TOKEN"

    RUN_AS=()
    if [ -z "$ROOT" ]; then
        if command -v runuser >/dev/null 2>&1; then
            RUN_AS=(runuser -u "$SERVICE_USER" --)
        elif command -v setpriv >/dev/null 2>&1; then
            RUN_AS=(setpriv "--reuid=$SERVICE_USER" "--regid=$SERVICE_USER" --init-groups --)
        fi
    fi
    if [ ${#RUN_AS[@]} -gt 0 ]; then
        step "Enrolling with $SERVER as user '$SERVICE_USER' (role $ROLE)"
    else
        step "Enrolling with $SERVER (role $ROLE)"
    fi
    if ! ${RUN_AS[@]+"${RUN_AS[@]}"} "$BIN_DEST" "${JOIN_ARGS[@]}"; then
        unset NEPHELE_JOIN_TOKEN
        die "enrolment failed (see the message above). Check that UDP port ${SERVER##*:} on ${SERVER%:*} is reachable and that the token is unused and not expired"
    fi
    unset NEPHELE_JOIN_TOKEN
    if [ -z "$ROOT" ] && [ ${#RUN_AS[@]} -eq 0 ]; then
        # Neither runuser nor setpriv: joined as root, hand the files to the service user.
        chown -R "$SERVICE_USER:$SERVICE_USER" "$DATA_DIR"
    fi
    [ -f "$DATA_DIR/agent.toml" ] || die "join reported success but $DATA_DIR/agent.toml is missing"
elif [ "$FIRST_BOOT" -eq 1 ]; then
    JOIN_ENV="$ROOT/etc/nephele-edge/join.env"
    step "Writing $JOIN_ENV (0600): the image enrols with $SERVER at its first boot"
    for word in "$SERVER" "$TOKEN" "${DEVICE_ARGS[@]}"; do
        case "$word" in
            *[[:space:]\"\\\$]*) die "'$word' cannot go into join.env (spaces, quotes, backslashes and \$ are not allowed there)" ;;
        esac
    done
    mkdir -p "$(dirname "$JOIN_ENV")"
    (
        umask 077
        printf 'NEPHELE_SERVER="%s"\nNEPHELE_JOIN_TOKEN="%s"\nNEPHELE_JOIN_ARGS="%s"\n' \
            "$SERVER" "$TOKEN" "${DEVICE_ARGS[*]}" >"$JOIN_ENV.tmp"
    )
    mv -f "$JOIN_ENV.tmp" "$JOIN_ENV"
    note "the token is single use: this image enrols one device (write a join.env per device for more)"
elif [ "$ROOT_GIVEN" -eq 1 ] && [ "$JOIN_NOW" -eq 0 ] && [ "$ENROLLED" -eq 0 ]; then
    step "Not enrolling (an image): put /etc/nephele-edge/join.env on the device before its first boot (see nephele-edge-join.service)"
else
    step "Already enrolled ($DATA_DIR/agent.toml exists); skipping join (use --force to re-enrol)"
fi

# ---- systemd ---------------------------------------------------------------------------

step "Installing systemd units to $(dirname "$UNIT_DEST")"
mkdir -p "$(dirname "$UNIT_DEST")"
install -m 0644 "$UNIT_SRC" "$UNIT_DEST"
JOIN_UNIT_SRC="$(dirname "$UNIT_SRC")/nephele-edge-join.service"
if [ -f "$JOIN_UNIT_SRC" ]; then
    install -m 0644 "$JOIN_UNIT_SRC" "$(dirname "$UNIT_DEST")/nephele-edge-join.service"
elif [ "$FIRST_BOOT" -eq 1 ]; then
    die "nephele-edge-join.service not found next to $UNIT_SRC; the image could not enrol at its first boot"
fi
if [ -n "$ROOT" ] && [ "$FIRST_BOOT" -eq 1 ]; then
    # Enabled in the image the way `systemctl enable` would.
    WANTS="$ROOT/etc/systemd/system/multi-user.target.wants"
    mkdir -p "$WANTS"
    ln -sf /etc/systemd/system/nephele-edge.service "$WANTS/nephele-edge.service"
    ln -sf /etc/systemd/system/nephele-edge-join.service "$WANTS/nephele-edge-join.service"
fi

STARTED=0
if [ "$NO_START" -eq 1 ]; then
    step "Not starting the service (--no-start)"
elif [ -n "$ROOT" ]; then
    step "Not starting the service (installed under --root $ROOT)"
elif ! command -v systemctl >/dev/null 2>&1 || [ ! -d /run/systemd/system ]; then
    step "systemd is not running here; start the agent by hand:"
    note "runuser -u $SERVICE_USER -- /usr/local/bin/nephele-edge run --data-dir /var/lib/nephele-edge"
else
    WAS_ACTIVE=0
    systemctl is-active --quiet nephele-edge && WAS_ACTIVE=1
    step "Enabling and starting nephele-edge"
    systemctl daemon-reload
    systemctl enable --now nephele-edge
    if [ "$WAS_ACTIVE" -eq 1 ]; then
        step "Restarting nephele-edge (it was already running)"
        systemctl restart nephele-edge
    fi
    STARTED=1
fi

echo
echo "nephele-edge is installed."
if [ "$STARTED" -eq 1 ]; then
    echo "Check it with:"
else
    echo "Once it is started (systemctl daemon-reload && systemctl enable --now nephele-edge), check it with:"
fi
echo "  systemctl status nephele-edge"
echo "  journalctl -u nephele-edge -f"
echo "  curl http://127.0.0.1:8700/v1/status"
