#!/usr/bin/env python3
"""Writes deterministic validation inputs and onnxruntime reference outputs for the two
PaddleOCR models (see valfile.py / README.md for the format):

  OUT_DIR/ppocr-cls/validation.{json,rows.bin,reference.bin}   16 rows of [1,3,48,192]
  OUT_DIR/ppocr-det/validation.{json,rows.bin,reference.bin}    2 rows of [1,3,640,640]

Inputs are already normalised the way RapidOCR feeds the models ((pixel/255 - 0.5) / 0.5,
so values lie in [-1, 1]): half are seeded uniform noise, half are simple synthetic
"text" images (dark glyph-like blocks on a white background; for cls also rotated by 180
degrees). References come from onnxruntime, CPUExecutionProvider, 1 thread, ORT_ENABLE_ALL,
one row per run.

usage: make_inputs.py --out-dir target/models
"""

import argparse
import os
import sys

import numpy as np
import onnxruntime as ort

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import valfile  # noqa: E402

SEED = 20240601
WHITE = 1.0    # (255/255 - 0.5) / 0.5
INK = -0.8     # a dark grey, (25.5/255 - 0.5) / 0.5


def session(path):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def glyph(rng, h):
    """A glyph-like dark pattern of height h: a random 7x5 bitmap, upsampled."""
    bits = rng.random((7, 5)) < 0.45
    bits[rng.integers(0, 7), :] = True  # a horizontal stroke
    bits[:, rng.integers(0, 5)] = True  # a vertical stroke
    scale = max(1, h // 7)
    return np.kron(bits, np.ones((scale, scale), bool))


def text_line(rng, img, y0, x0, x1, h):
    """Draws glyphs along a baseline into img [H,W] (values in normalised units)."""
    x = x0
    while x < x1:
        g = glyph(rng, h)
        gh, gw = g.shape
        if x + gw > x1:
            break
        dy = int(rng.integers(0, max(1, h // 4))) if rng.random() < 0.2 else 0  # descender
        y = y0 + dy
        if y + gh <= img.shape[0]:
            img[y:y + gh, x:x + gw][g] = INK
        x += gw + int(rng.integers(1, 4))
        if rng.random() < 0.15:
            x += gw  # word gap


def text_image(rng, h, w, lines):
    img = np.full((h, w), WHITE, np.float32)
    for y0, x0, x1, lh in lines:
        text_line(rng, img, y0, x0, x1, lh)
    img += rng.normal(0.0, 0.03, img.shape).astype(np.float32)  # scanner noise
    img = np.clip(img, -1.0, 1.0)
    return np.repeat(img[None], 3, axis=0)  # grey -> 3 channels


def references(sess, rows):
    name = sess.get_inputs()[0].name
    outs = [sess.run(None, {name: rows[i:i + 1]})[0] for i in range(len(rows))]
    again = sess.run(None, {name: rows[:2]})[0]  # batched run must agree
    d = float(np.abs(again - np.concatenate(outs[:2])).max())
    return np.concatenate(outs), d


def make_cls(out_dir, rng):
    d = os.path.join(out_dir, "ppocr-cls")
    rows = []
    for _ in range(8):
        rows.append(rng.uniform(-1.0, 1.0, (3, 48, 192)).astype(np.float32))
    texts = []
    for _ in range(4):
        line = (int(rng.integers(8, 14)), int(rng.integers(2, 10)), int(rng.integers(120, 190)), 28)
        texts.append(text_image(rng, 48, 192, [line]))
    rows += texts + [t[:, ::-1, ::-1].copy() for t in texts]  # upright, then rotated 180 degrees
    rows = np.stack(rows).astype(np.float32)
    sess = session(os.path.join(d, "model.onnx"))
    ref, batch_diff = references(sess, rows)
    labels = ["0", "180"]
    pred = [f"{labels[int(np.argmax(p))]}:{float(np.max(p)):.3f}" for p in ref]
    print(f"[cls] predictions (label:prob) noise rows {pred[:8]}")
    print(f"[cls] predictions upright text {pred[8:12]}, rotated text {pred[12:]}")
    print(f"[cls] batch-of-2 vs single-row max abs diff {batch_diff:.2e}")
    meta = valfile.write(
        os.path.join(d, "validation.json"), rows, ref,
        input_name=sess.get_inputs()[0].name, output_name=sess.get_outputs()[0].name,
        reference_by=f"onnxruntime {ort.__version__} CPU, 1 thread, ORT_ENABLE_ALL, batch 1",
        tolerance=1e-4,
        description="PaddleOCR ch_ppocr_mobile_v2.0_cls (text direction, labels ['0','180']): rows 0-7 "
                    "uniform noise in [-1,1]; rows 8-11 synthetic text lines; rows 12-15 the same rotated "
                    "180 degrees. Reference: softmax probabilities [1,2].",
        extra={"seed": SEED, "labels": labels})
    print(f"[cls] wrote {d}/validation.json: {meta['count']} rows of {meta['shape']} -> {meta['reference_shape']}")


def make_det(out_dir, rng):
    d = os.path.join(out_dir, "ppocr-det")
    noise = rng.uniform(-1.0, 1.0, (3, 640, 640)).astype(np.float32)
    lines = []
    y = 40
    while y < 600:
        lh = int(rng.integers(16, 36))
        lines.append((y, int(rng.integers(20, 80)), int(rng.integers(300, 620)), lh))
        y += lh + int(rng.integers(14, 40))
    page = text_image(rng, 640, 640, lines)
    rows = np.stack([noise, page]).astype(np.float32)
    sess = session(os.path.join(d, "model.onnx"))
    ref, batch_diff = references(sess, rows)
    frac = [float((r > 0.3).mean()) for r in ref]
    print(f"[det] share of pixels with text probability > 0.3: noise {frac[0]:.4f}, "
          f"synthetic page ({len(lines)} lines) {frac[1]:.4f}")
    print(f"[det] batch-of-2 vs single-row max abs diff {batch_diff:.2e}")
    meta = valfile.write(
        os.path.join(d, "validation.json"), rows, ref,
        input_name=sess.get_inputs()[0].name, output_name=sess.get_outputs()[0].name,
        reference_by=f"onnxruntime {ort.__version__} CPU, 1 thread, ORT_ENABLE_ALL, batch 1",
        tolerance=1e-3,
        description="PaddleOCR ch_PP-OCRv4_det (DBNet) at a fixed 640x640 input: row 0 uniform noise "
                    "in [-1,1]; row 1 a synthetic page of text lines. Reference: text probability map "
                    "[1,1,640,640].",
        extra={"seed": SEED})
    print(f"[det] wrote {d}/validation.json: {meta['count']} rows of {meta['shape']} -> {meta['reference_shape']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", required=True)
    args = ap.parse_args()
    rng = np.random.default_rng(SEED)
    make_cls(args.out_dir, rng)
    make_det(args.out_dir, rng)
    return 0


if __name__ == "__main__":
    sys.exit(main())
