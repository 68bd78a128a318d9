#!/usr/bin/env bash
# A `command` provider script that never finishes, for the project's tests of the
# provider's timeout handling. Usable as add, remove or list.
#
# Writes one line to stderr, appends "hang.sh <node> <pid> <unix seconds>" to
# NEPHELE_PROVIDER_TEST_LOG when set, then becomes `sleep` (exec: same pid, no child left
# behind when the control plane kills it) for HANG_SECONDS (default 3600 s, far past
# any timeout).
echo "hang.sh: node '${NEPHELE_NODE:-?}': sleeping ${HANG_SECONDS:-3600} s (pid $$)" >&2
if [[ -n "${NEPHELE_PROVIDER_TEST_LOG:-}" ]]; then
    echo "hang.sh ${NEPHELE_NODE:--} $$ $(date +%s)" >>"$NEPHELE_PROVIDER_TEST_LOG"
fi
exec sleep "${HANG_SECONDS:-3600}"
