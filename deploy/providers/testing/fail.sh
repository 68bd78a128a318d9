#!/usr/bin/env bash
# A `command` provider script that always fails, for the project's tests of the
# provider's retry and backoff handling. Usable as add, remove or list.
#
# Writes a message naming the node to stderr and exits 1. When NEPHELE_PROVIDER_TEST_LOG
# is set, first appends one line "fail.sh <node> <unix seconds>" to that file, so a test
# can count the attempts and see the backoff between them.
echo "fail.sh: node '${NEPHELE_NODE:-?}' in pool ${NEPHELE_REGION:-?}/${NEPHELE_POOL:-?}: failing on purpose (a test provider that always fails)" >&2
if [[ -n "${NEPHELE_PROVIDER_TEST_LOG:-}" ]]; then
    echo "fail.sh ${NEPHELE_NODE:--} $(date +%s)" >>"$NEPHELE_PROVIDER_TEST_LOG"
fi
exit 1
