# shellcheck shell=bash
# Shared by add.sh, remove.sh and list.sh of the Kubernetes example (sourced, not run).
# Finds the pool's StatefulSet and its join Secret and wraps kubectl.

PROG="kubernetes/${0##*/}"
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
        [[ -n "${!var:-}" ]] || die "$var is not set. nephele-cloud's command provider sets it when it runs this script; to run it by hand, export it (see --help and deploy/providers/README.md)"
    done
}

# Node names are Kubernetes pod names here: lowercase letters, digits and '-'.
check_node_name() {
    [[ "$1" =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ && ${#1} -le 63 ]] \
        || die "NEPHELE_NODE='$1' is not a valid pod name (lowercase letters, digits, '-', at most 63)"
}

KUBECTL="${KUBECTL:-kubectl}"
command -v "$KUBECTL" >/dev/null 2>&1 || die "'$KUBECTL' not found on PATH (install kubectl or set KUBECTL=/path/to/kubectl)"
NS_ARGS=()
[[ -z "${NEPHELE_K8S_NAMESPACE:-}" ]] || NS_ARGS=(--namespace "$NEPHELE_K8S_NAMESPACE")
k() { "$KUBECTL" ${NS_ARGS[@]+"${NS_ARGS[@]}"} "$@"; }

# Sets STS (the pool's StatefulSet) and SECRET (its join Secret): NEPHELE_K8S_STATEFULSET,
# else the one StatefulSet labelled nephele.dev/region=$NEPHELE_REGION,nephele.dev/pool=$NEPHELE_POOL.
find_statefulset() {
    if [[ -n "${NEPHELE_K8S_STATEFULSET:-}" ]]; then
        STS="$NEPHELE_K8S_STATEFULSET"
    else
        local selector="nephele.dev/region=$NEPHELE_REGION,nephele.dev/pool=$NEPHELE_POOL" names
        names="$(k get statefulset -l "$selector" -o 'jsonpath={.items[*].metadata.name}')" \
            || die "kubectl could not list the StatefulSets labelled $selector (see its message above)"
        local found=()
        read -r -a found <<<"$names" || true
        case ${#found[@]} in
            0) die "no StatefulSet labelled $selector${NEPHELE_K8S_NAMESPACE:+ in namespace $NEPHELE_K8S_NAMESPACE}: create it from deploy/providers/kubernetes/pool-statefulset.yaml (or set NEPHELE_K8S_STATEFULSET)" ;;
            1) STS="${found[0]}" ;;
            *) die "several StatefulSets are labelled $selector (${found[*]}); set NEPHELE_K8S_STATEFULSET to the one to use" ;;
        esac
    fi
    SECRET="${NEPHELE_K8S_SECRET:-$STS-join}"
}

# Sets ORDINAL from a node name, which must be <statefulset>-<ordinal>: a StatefulSet
# names its pods that way and the pod joins under its own name.
ordinal_of() {
    local node="$1" suffix
    suffix="${node#"$STS"-}"
    if [[ "$suffix" == "$node" || ! "$suffix" =~ ^(0|[1-9][0-9]*)$ ]]; then
        die "node '$node' cannot be a pod of StatefulSet '$STS': its pods are named '$STS-<ordinal>' (0, 1, 2, ...). Give the pool's nodes such names, or name the StatefulSet after the prefix of the pool's node names"
    fi
    ORDINAL="$suffix"
}

replicas() {
    local r
    r="$(k get statefulset "$STS" -o 'jsonpath={.spec.replicas}')" \
        || die "kubectl could not read StatefulSet '$STS' (see its message above)"
    [[ "$r" =~ ^[0-9]+$ ]] || die "StatefulSet '$STS' reports replicas '$r', not a number"
    printf '%s\n' "$r"
}

# The node names that hold a join token in the Secret, one per line (nothing when the
# Secret does not exist yet).
secret_keys() {
    k get secret "$SECRET" --ignore-not-found -o 'go-template={{range $k, $v := .data}}{{$k}}{{"\n"}}{{end}}' \
        || die "kubectl could not read Secret '$SECRET' (see its message above)"
}

# Scales from exactly $1 to $2 replicas (kubectl's --current-replicas precondition, so
# that two scripts running at once never undo each other). Returns 1 when the replica
# count changed under us; the caller re-reads it and decides again.
scale_from_to() {
    local from="$1" to="$2" err
    if err="$(k scale statefulset "$STS" --current-replicas="$from" --replicas="$to" 2>&1 >/dev/null)"; then
        return 0
    fi
    local now
    now="$(replicas)"
    [[ "$now" != "$from" ]] && return 1
    die "kubectl could not scale StatefulSet '$STS' from $from to $to replicas: $err"
}
