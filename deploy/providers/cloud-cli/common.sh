# shellcheck shell=bash
# Shared by add.sh, remove.sh and list.sh of the cloud CLI (gcloud) example (sourced).

PROG="cloud-cli/${0##*/}"
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }
say() { printf '%s: %s\n' "$PROG" "$*" >&2; }

# --help prints the script's header comment (from line 2 to the first blank line).
usage() { sed -n '2,/^$/{s/^# \{0,1\}//;p}' "$0"; }
parse_args() {
    local arg
    for arg in "$@"; do
        case "$arg" in
            -h | --help) usage; exit 0 ;;
            *) die "unexpected argument '$arg': the control plane passes everything in the environment (see --help)" ;;
        esac
    done
}

need_env() {
    local var
    for var in "$@"; do
        [[ -n "${!var:-}" ]] || die "$var is not set. nephele-cloud's command provider sets NEPHELE_REGION/POOL/NODE/...; the operator sets NEPHELE_GCP_* (see --help and deploy/providers/README.md)"
    done
}

# GCE instance names: a lowercase letter, then lowercase letters, digits and '-'.
check_node_name() {
    [[ "$1" =~ ^[a-z]([-a-z0-9]*[a-z0-9])?$ && ${#1} -le 63 ]] \
        || die "NEPHELE_NODE='$1' is not a valid instance name (a lowercase letter first, then lowercase letters, digits, '-'; at most 63)"
}

GCLOUD="${GCLOUD:-gcloud}"
command -v "$GCLOUD" >/dev/null 2>&1 || die "'$GCLOUD' not found on PATH (install the Google Cloud CLI or set GCLOUD=/path/to/gcloud)"
PROJECT_ARGS=()
[[ -z "${NEPHELE_GCP_PROJECT:-}" ]] || PROJECT_ARGS=(--project="$NEPHELE_GCP_PROJECT")
g() { "$GCLOUD" ${PROJECT_ARGS[@]+"${PROJECT_ARGS[@]}"} "$@"; }

# Sets INSTANCE_LABELS to "<region> <pool>" of the instance NEPHELE_NODE, or to "" when
# there is no such instance; dies on any other error.
describe_instance() {
    local out err
    if out="$(g compute instances describe "$NEPHELE_NODE" --zone="$NEPHELE_GCP_ZONE" \
            --format='value(labels.nephele-region,labels.nephele-pool)' 2>"$TMPDIR_P/describe.err")"; then
        INSTANCE_LABELS="$(tr '\t' ' ' <<<"$out")"
        return
    fi
    err="$(cat "$TMPDIR_P/describe.err")"
    if [[ "$err" == *"was not found"* || "$err" == *"notFound"* ]]; then
        INSTANCE_LABELS=""
        return
    fi
    die "gcloud could not look up instance $NEPHELE_NODE in $NEPHELE_GCP_ZONE: $err"
}

# A private temporary directory (mode 0700), removed on exit.
TMPDIR_P="$(umask 077 && mktemp -d)"
trap 'rm -rf "$TMPDIR_P"' EXIT
