#!/usr/bin/env python3
"""Train a small numpy MLP on scikit-learn's 8x8 digits and export it to ONNX.

Outputs (next to this file):
  model.onnx    - Gemm -> Relu -> Gemm -> Relu -> Gemm, input "input" [N,64] f32,
                  output "logits" [N,10] f32 (opset 13, IR version 8)
  heldout.json  - the 20% stratified held-out split (features scaled to [0,1])
  metrics.json  - accuracies, sizes, versions

Regenerate: pip install -r requirements.txt && python3 train.py
"""
import os

# Single-threaded BLAS: keeps CPU use modest and makes float reductions
# reproducible run-to-run. Must be set before numpy is imported.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import json
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

SEED = 7
EPOCHS = 100
BATCH = 64
LR = 1e-3
L2 = 1e-4
SIZES = [64, 128, 64, 10]
HERE = os.path.dirname(os.path.abspath(__file__))


def load():
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int64)
    xtr, xte, ytr, yte = train_test_split(
        x, y, test_size=0.2, train_size=0.8, stratify=y, random_state=SEED
    )
    return xtr, xte, ytr, yte


def init_params(rng):
    params = []
    for fan_in, fan_out in zip(SIZES[:-1], SIZES[1:]):
        w = rng.normal(0.0, np.sqrt(2.0 / fan_in), size=(fan_in, fan_out))  # He init
        b = np.zeros(fan_out)
        params += [w, b]
    return params  # float64 during training


def forward(params, x):
    w1, b1, w2, b2, w3, b3 = params
    z1 = x @ w1 + b1
    a1 = np.maximum(z1, 0)
    z2 = a1 @ w2 + b2
    a2 = np.maximum(z2, 0)
    logits = a2 @ w3 + b3
    return logits, (x, z1, a1, z2, a2)


def loss_and_grads(params, x, y):
    w1, b1, w2, b2, w3, b3 = params
    logits, (x, z1, a1, z2, a2) = forward(params, x)
    n = x.shape[0]
    shifted = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(shifted)
    p /= p.sum(axis=1, keepdims=True)
    ce = -np.log(p[np.arange(n), y] + 1e-12).mean()
    l2 = 0.5 * L2 * sum(float((w * w).sum()) for w in (w1, w2, w3))

    d = p
    d[np.arange(n), y] -= 1.0
    d /= n  # dL/dlogits
    gw3 = a2.T @ d + L2 * w3
    gb3 = d.sum(axis=0)
    da2 = d @ w3.T
    dz2 = da2 * (z2 > 0)
    gw2 = a1.T @ dz2 + L2 * w2
    gb2 = dz2.sum(axis=0)
    da1 = dz2 @ w2.T
    dz1 = da1 * (z1 > 0)
    gw1 = x.T @ dz1 + L2 * w1
    gb1 = dz1.sum(axis=0)
    return ce + l2, [gw1, gb1, gw2, gb2, gw3, gb3]


def train(xtr, ytr, rng):
    params = init_params(rng)
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    b1, b2, eps = 0.9, 0.999, 1e-8
    t = 0
    x64 = xtr.astype(np.float64)
    n = x64.shape[0]
    for epoch in range(1, EPOCHS + 1):
        order = rng.permutation(n)
        total = 0.0
        for start in range(0, n, BATCH):
            idx = order[start:start + BATCH]
            loss, grads = loss_and_grads(params, x64[idx], ytr[idx])
            total += loss * len(idx)
            t += 1
            for i, g in enumerate(grads):
                m[i] = b1 * m[i] + (1 - b1) * g
                v[i] = b2 * v[i] + (1 - b2) * g * g
                mhat = m[i] / (1 - b1 ** t)
                vhat = v[i] / (1 - b2 ** t)
                params[i] -= LR * mhat / (np.sqrt(vhat) + eps)
        if epoch == 1 or epoch % 20 == 0:
            print(f"epoch {epoch:3d}  loss {total / n:.4f}")
    return params


def predict32(params32, x):
    logits, _ = forward(params32, x.astype(np.float32))
    return logits.astype(np.float32)


def export_onnx(params32, path):
    w1, b1, w2, b2, w3, b3 = params32
    inits = [
        numpy_helper.from_array(a, name)
        for a, name in zip(params32, ["fc1.weight", "fc1.bias", "fc2.weight",
                                      "fc2.bias", "fc3.weight", "fc3.bias"])
    ]
    nodes = [
        helper.make_node("Gemm", ["input", "fc1.weight", "fc1.bias"], ["fc1"], name="fc1", transB=0),
        helper.make_node("Relu", ["fc1"], ["relu1"], name="relu1"),
        helper.make_node("Gemm", ["relu1", "fc2.weight", "fc2.bias"], ["fc2"], name="fc2", transB=0),
        helper.make_node("Relu", ["fc2"], ["relu2"], name="relu2"),
        helper.make_node("Gemm", ["relu2", "fc3.weight", "fc3.bias"], ["logits"], name="fc3", transB=0),
    ]
    graph = helper.make_graph(
        nodes,
        "digits_mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        initializer=inits,
    )
    model = helper.make_model(
        graph,
        producer_name="nephele-digits-mlp",
        producer_version="1",
        opset_imports=[helper.make_opsetid("", 13)],
    )
    model.ir_version = 8
    model.doc_string = ("MLP 64-128-64-10 trained on sklearn load_digits (pixels/16). "
                        "Output: unnormalised class logits for digits 0-9.")
    onnx.checker.check_model(model, full_check=True)
    onnx.save_model(model, path)
    return model


def main():
    t0 = time.time()
    rng = np.random.default_rng(SEED)
    xtr, xte, ytr, yte = load()
    params = train(xtr, ytr, rng)
    params32 = [p.astype(np.float32) for p in params]

    train_acc = float((predict32(params32, xtr).argmax(1) == ytr).mean())
    ref_logits = predict32(params32, xte)
    heldout_acc = float((ref_logits.argmax(1) == yte).mean())
    print(f"numpy float32: train acc {train_acc:.4f}  held-out acc {heldout_acc:.4f}")

    model_path = os.path.join(HERE, "model.onnx")
    export_onnx(params32, model_path)

    # heldout.json (values are k/16, so rounding to 6 decimals is exact)
    feats = [[round(float(v), 6) for v in row] for row in xte]
    heldout = {
        "dataset": "sklearn load_digits",
        "split": ("sklearn.model_selection.train_test_split(X, y, test_size=0.2, "
                  "stratify=y, random_state=7); this is the 20% held-out test part; "
                  "X = pixels / 16 as float32 (range [0,1]), 64 features = 8x8 image row-major"),
        "features": feats,
        "labels": [int(v) for v in yte],
    }
    with open(os.path.join(HERE, "heldout.json"), "w") as f:
        json.dump(heldout, f, separators=(",", ":"))
        f.write("\n")

    # Verify the exported file with onnxruntime, fed from the JSON as a consumer would.
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"])
    xj = np.asarray(heldout["features"], dtype=np.float32)
    assert np.array_equal(xj, xte), "heldout.json features do not round-trip"
    ort_logits = sess.run(["logits"], {"input": xj})[0]
    ort_acc = float((ort_logits.argmax(1) == np.asarray(heldout["labels"])).mean())
    max_diff = float(np.abs(ort_logits - ref_logits).max())
    print(f"onnxruntime: held-out acc {ort_acc:.4f}  max |logit diff| vs numpy {max_diff:.3e}")
    assert ort_acc == heldout_acc, "onnxruntime accuracy differs from numpy"
    assert max_diff < 1e-4, f"logit mismatch {max_diff}"
    # single-row batch works too (symbolic N)
    one = sess.run(["logits"], {"input": xj[:1]})[0]
    assert one.shape == (1, 10)

    n_params = int(sum(p.size for p in params32))
    metrics = {
        "heldout_accuracy": heldout_acc,
        "train_accuracy": train_acc,
        "n_train": int(len(ytr)),
        "n_heldout": int(len(yte)),
        "params": n_params,
        "seed": SEED,
        "epochs": EPOCHS,
        "numpy": np.__version__,
        "onnx": onnx.__version__,
        "onnxruntime_accuracy": ort_acc,
    }
    with open(os.path.join(HERE, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=2)
        f.write("\n")

    size = os.path.getsize(model_path)
    assert size < 2 * 1024 * 1024, f"model.onnx too large: {size}"
    assert heldout_acc >= 0.96, f"held-out accuracy below target: {heldout_acc}"
    print(f"wrote model.onnx ({size} bytes), heldout.json, metrics.json "
          f"in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
