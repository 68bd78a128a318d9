#!/usr/bin/env python3
"""The task-level check of the wider model zoo (tests/tests/model_zoo_wide.rs): given a
model's cases.json (make_zoo_wide.py) and nephele's answers to its cases, recomputes
each case's task answer from nephele's outputs (YOLOv8, YOLOX and PicoDet detections
after NMS, argmax classes, thresholded speech or wake-word decisions, text masks, a
table recogniser's tokens) and compares it with the answer onnxruntime's outputs gave.
The decoders are the task's definition, written once here; what is under test is the
outputs they are given.

usage: zoo_task.py CASES_JSON ANSWERS_JSON
  ANSWERS_JSON: [{OUTPUT_NAME: {"shape": [...], "data": [...]}}, ...], one per case.
Prints one line per case; exits 1 when any case's task answer differs.
"""
import json
import math
import sys

import numpy as np


def iou(a, b):
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def detections(task, outs):
    layout = task["layout"]
    if layout == "yolov8":
        p = outs[task["outputs"][0]][0]
        boxes = np.stack([p[0] - p[2] / 2, p[1] - p[3] / 2, p[0] + p[2] / 2, p[1] + p[3] / 2], 1)
        scores, classes = p[4:].max(0), p[4:].argmax(0)
    elif layout == "yolox":
        p = outs[task["outputs"][0]][0].astype(np.float64)
        rows = []
        for s in task["strides"]:
            gh, gw = task["input_size"][0] // s, task["input_size"][1] // s
            for y in range(gh):
                for x in range(gw):
                    rows.append((x, y, s))
        g = np.array(rows, np.float64)
        cx, cy = (p[:, 0] + g[:, 0]) * g[:, 2], (p[:, 1] + g[:, 1]) * g[:, 2]
        w, h = np.exp(p[:, 2]) * g[:, 2], np.exp(p[:, 3]) * g[:, 2]
        boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1)
        cls = p[:, 4:5] * p[:, 5:]
        scores, classes = cls.max(1), cls.argmax(1)
    elif layout == "picodet":
        names, n = task["outputs"], len(task["strides"])
        rm = task["reg_max"]
        bl, sl, cl = [], [], []
        for k, s in enumerate(task["strides"]):
            sc = outs[names[k]][0]
            d = outs[names[n + k]][0].reshape(-1, rm + 1).astype(np.float64)
            d = np.exp(d - d.max(1, keepdims=True))
            d = (d / d.sum(1, keepdims=True)) @ np.arange(rm + 1)
            d = d.reshape(-1, 4) * s
            fw = math.ceil(task["input_size"][1] / s)
            idx = np.arange(sc.shape[0])
            cx, cy = (idx % fw + 0.5) * s, (idx // fw + 0.5) * s
            bl.append(np.stack([cx - d[:, 0], cy - d[:, 1], cx + d[:, 2], cy + d[:, 3]], 1))
            sl.append(sc.max(1))
            cl.append(sc.argmax(1))
        boxes, scores, classes = np.concatenate(bl), np.concatenate(sl), np.concatenate(cl)
    else:
        raise SystemExit(f"unknown layout {layout}")
    thr, keep = task["score_threshold"], []
    for i in sorted(np.nonzero(scores >= thr)[0], key=lambda i: -scores[i]):
        if all(iou(boxes[i], boxes[j]) <= task["nms_iou"] for j in keep
               if task["class_agnostic_nms"] or classes[j] == classes[i]):
            keep.append(i)
    return [list(map(float, boxes[i])) + [float(scores[i]), int(classes[i])] for i in keep]


def same_detections(got, want, thr):
    def covered(a_list, b_list):
        for a in a_list:
            if a[4] < thr + 0.01:
                continue
            if not any(b[5] == a[5] and iou(a, b) >= 0.9 for b in b_list):
                return False
        return True
    return covered(want, got) and covered(got, want)


def task_ok(task, tolerance, outs, case):
    kind, ans = task["kind"], case.get("answer")
    if kind == "argmax":
        a = outs[task["output"]]
        a = a.reshape(-1, a.shape[-1])
        want = ans["argmax"]
        return ans["margin"] <= 2 * tolerance or a.argmax(1).tolist() == want
    if kind == "threshold":
        v = outs[task["output"]]
        if task.get("complement"):
            v = 1.0 - v[..., task["index"]]
        above = (v.reshape(-1) >= task["threshold"]).tolist()
        return ans is None or above == ans["above"]
    if kind == "detections":
        return same_detections(detections(task, outs), ans["detections"], task["score_threshold"])
    if kind == "mask":
        p = outs[task["output"]][0, 0] > task["threshold"]
        frac = float(p.mean())
        return abs(frac - ans["fraction"]) <= 1 - task["min_agreement"]
    if kind == "tokens":
        t = []
        for s in outs[task["output"]][0].argmax(1).tolist():
            t.append(s)
            if s == task["end_token"]:
                break
        return t == ans["tokens"]
    if kind == "cosine":
        return True  # checked against the stored answer below
    raise SystemExit(f"unknown task {kind}")



def main():
    cases = json.load(open(sys.argv[1]))
    answers = json.load(open(sys.argv[2]))
    task = cases["task"]
    failed = 0
    for k, (case, got) in enumerate(zip(cases["cases"], answers)):
        outs = {name: np.array(v["data"], np.float64).reshape(v["shape"]) for name, v in got.items()}
        try:
            ok = task_ok(task, cases["tolerance"], outs, case)
        except (KeyError, ValueError, IndexError) as error:
            ok = False
            print(f"case {k}: cannot read nephele's answer for the task: {error!r}")
        if task["kind"] == "cosine":
            g = outs[task["output"]]
            r = np.array(case["outputs"][task["output"]]["data"], np.float64).reshape(g.shape)
            g, r = g.reshape(-1, g.shape[-1]), r.reshape(-1, r.shape[-1])
            cos = (g * r).sum(1) / np.linalg.norm(g, axis=1) / np.linalg.norm(r, axis=1)
            ok = bool(cos.min() >= task["min_cosine"])
        print(f"case {k}: task '{task['kind']}' {'same answer' if ok else 'DIFFERENT answer'}")
        failed += 0 if ok else 1
    if len(answers) != len(cases["cases"]):
        print(f"{len(answers)} answers for {len(cases['cases'])} cases")
        failed += 1
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
