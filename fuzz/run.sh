#!/usr/bin/env bash
# Short AFL++ runs of the fuzz targets (fuzz/README.md):
#   fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]
# Default: every target, 30 s each. Installs what is missing (cargo-afl from crates.io
# into a cache folder; it builds its own AFL++ and the runtime the targets link), builds
# the targets instrumented (`cargo afl build --release`), runs each one with `cargo afl
# fuzz -V SECONDS` on its seeds in fuzz/corpus/<target>, prints what each did, and fails
# naming the target and the files if any recorded a crash or a hang.
#
# Environment:
#   NEPHELE_FUZZ_CACHE   where cargo-afl is installed (default ~/.cache/nephele-fuzz)
#   CARGO_TARGET_DIR     build folder of the fuzz crate (default target/fuzz)
#   NEPHELE_FUZZ_OUT     AFL++ output folders (default target/fuzz-out/<target>)
#   NEPHELE_FUZZ_TIMEOUT_MS  per-input hang limit (default 2000; onnx 10000)
# Run it niced on a shared machine: `nice -n 19 bash fuzz/run.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

all_targets=(frame_decoder firmware_profile manifest onnx cloud_config)
seconds=30
if [ $# -gt 0 ]; then
    seconds=$1
    shift
fi
case $seconds in '' | *[!0-9]*)
    echo "usage: fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]; targets: ${all_targets[*]}" >&2
    exit 2
    ;;
esac
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all_targets[@]}")

features=afl
# afl; afl,edge; afl,edge,cloud: the order matters (one build of the shared dependencies).
for t in "${targets[@]}"; do
    case $t in
    frame_decoder | firmware_profile) ;;
    manifest | onnx) [[ $features == *edge* ]] || features+=,edge ;;
    cloud_config) [[ $features == *cloud* ]] || features+=,cloud ;; # includes edge
    *)
        echo "unknown target $t; targets: ${all_targets[*]}" >&2
        exit 2
        ;;
    esac
done

cache=${NEPHELE_FUZZ_CACHE:-$HOME/.cache/nephele-fuzz}
export PATH="$cache/bin:$PATH"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target/fuzz}
out_root=${NEPHELE_FUZZ_OUT:-$root/target/fuzz-out}
# cargo-afl and the `afl` crate must be the same version (fuzz/Cargo.toml pins it).
cargo_afl_version=0.18.2

step() { printf '%s fuzz: %s\n' "$(date +%T)" "$*" >&2; }

# 1. cargo-afl. Its build compiles AFL++ (afl-fuzz and the runtime), which needs a C
#    compiler and make. Debian's afl++ package is not used: cargo-afl runs its own
#    afl-fuzz, which must match the runtime linked into the targets.
if ! command -v cc >/dev/null || ! command -v make >/dev/null; then
    step "installing a C compiler and make (Debian build-essential) for AFL++"
    if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get install -y -qq build-essential >/dev/null ||
        { $sudo apt-get update -qq && $sudo apt-get install -y -qq build-essential >/dev/null; }
fi
if ! cargo afl --version 2>/dev/null | grep -q "cargo-afl $cargo_afl_version"; then
    step "installing cargo-afl $cargo_afl_version into $cache"
    cargo install --quiet --locked --force --root "$cache" cargo-afl --version "$cargo_afl_version"
fi
# 2. AFL++'s runtime for this rustc (built by the install, or rebuilt after a toolchain
#    update). `config --build` refuses, saying so, when it is there already.
if ! config_log=$(cargo afl config --build 2>&1); then
    if ! grep -q "already built" <<<"$config_log"; then
        echo "$config_log" >&2
        echo "fuzz: cargo afl config --build failed" >&2
        exit 1
    fi
fi

# 3. The instrumented targets.
[[ $features != *cloud* ]] || features=afl,edge,cloud
step "building ${targets[*]} (cargo afl build --release --features $features)"
bins=()
for t in "${targets[@]}"; do bins+=(--bin "$t"); done
(cd fuzz && cargo afl build --release --quiet --features "$features" "${bins[@]}")

# 4. The runs.
mkdir -p "$out_root"
failed=()
summary=()
# 4a. Kept crashes (fuzz/regressions/<target>/*) through the binaries, which read one
#     input from stdin when not run by AFL: each must now pass.
for t in "${targets[@]}"; do
    for file in fuzz/regressions/"$t"/*; do
        [ -f "$file" ] && [ "${file##*/}" != README.md ] || continue
        if ! timeout 60 "$CARGO_TARGET_DIR/release/$t" <"$file" >/dev/null 2>"$out_root.replay.log"; then
            tail -n 20 "$out_root.replay.log" >&2
            failed+=("$t: regression $file fails again")
        fi
    done
done

# 4b. Settings for a container or CI machine: no terminal UI, no CPU governor check,
#     no core_pattern check (crashes are still recorded, as files), no CPU pinning
#     (other jobs share the cores), a short calibration.
export AFL_NO_UI=1 AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 \
    AFL_NO_AFFINITY=1 AFL_FAST_CAL=1 AFL_NO_WARN_INSTABILITY=1
unset AFL_AUTORESUME
for t in "${targets[@]}"; do
    out=$out_root/$t
    rm -rf "$out"
    mkdir -p "$out"
    timeout_ms=${NEPHELE_FUZZ_TIMEOUT_MS:-2000}
    [ "$t" != onnx ] || timeout_ms=${NEPHELE_FUZZ_TIMEOUT_MS:-10000}
    step "fuzzing $t for ${seconds}s (log: $out.log)"
    status=0
    # `-c -`: no CMPLOG binary (cargo-afl asks for one; it needs the LLVM plugins,
    # which are not built here).
    (cd fuzz && cargo afl fuzz -c - -i "corpus/$t" -o "$out" -t "$timeout_ms" -V "$seconds" \
        "$CARGO_TARGET_DIR/release/$t") >"$out.log" 2>&1 || status=$?
    stats=$out/default/fuzzer_stats
    if [ ! -f "$stats" ]; then
        tail -n 30 "$out.log" >&2
        failed+=("$t: afl-fuzz did not run (exit $status; see $out.log)")
        continue
    fi
    field() { sed -n "s/^$1 *: *//p" "$stats" | head -n 1; }
    crashes=$(find "$out/default/crashes" -type f -name 'id:*' 2>/dev/null | sort)
    hangs=$(find "$out/default/hangs" -type f -name 'id:*' 2>/dev/null | sort)
    line=$(printf '%-17s execs %10s  execs/s %8s  corpus %5s  edges %6s  crashes %s  hangs %s  (%ss)' \
        "$t" "$(field execs_done)" "$(field execs_per_sec)" "$(field corpus_count)" \
        "$(field edges_found)" "$(field saved_crashes)" "$(field saved_hangs)" "$(field run_time)")
    summary+=("$line")
    if [ -n "$crashes" ] || [ -n "$hangs" ]; then
        failed+=("$t: $(printf '%s ' $crashes $hangs)")
    elif [ "$status" != 0 ]; then
        tail -n 30 "$out.log" >&2
        failed+=("$t: afl-fuzz exited $status (see $out.log)")
    fi
done

echo "fuzz summary (${seconds}s per target):"
printf '  %s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz: FAILED" >&2
    printf '  %s\n' "${failed[@]}" >&2
    echo "Replay one: $CARGO_TARGET_DIR/release/TARGET < FILE (the binaries read stdin" \
        "outside AFL); keep it as fuzz/regressions/TARGET/NAME (fuzz/README.md)." >&2
    exit 1
fi
echo "fuzz: ${#targets[@]} targets, no crash and no hang"
