#!/usr/bin/env python3
"""The onnxruntime side of the tract-vs-onnxruntime benchmark.

usage: ort_bench.py --model PATH [--row-shape 3,48,192] [--batches 1,8,32] [--threads 1]
                    [--warmup 5] [--seconds 3] [--min-runs 5] [--input-file FILE]
                    [--profile-ops RUNS]

Prints ONE JSON object on stdout (diagnostics go to stderr):
  {"runtime": "onnxruntime", "version": "1.32.0", "threads": 1, "model": PATH, ...,
   "results": [{"batch": 1, "runs": .., "p50_ms": .., "p99_ms": .., "mean_ms": ..,
                "items_per_s": ..}, ...]}

Same protocol as edge/nephele-runtime/src/bench.rs: 4 distinct batches built from the
input rows (batch `o` holds rows (o*batch + i) % count), `warmup` untimed runs, then timed
runs (each session.run timed alone with perf_counter_ns) until `seconds` have passed and at
least `min_runs` were made; p50/p99 are nearest-rank percentiles, mean = total / runs,
items_per_s = runs * batch / total run time.

--profile-ops RUNS adds "ops": onnxruntime's own per-node profile (enable_profiling) of
RUNS batch-1 runs after the warm-up, summed per operator type: [{"op", "nodes",
"us_per_run", "share"}], largest first (what `nephele bench inference --only profile`
prints beside tract's).

Inputs: --input-file is a validation.json (nephele-validation/1, see valfile.py), a JSON
with inline "rows" (list of flat float lists), or a raw little-endian float32 .bin holding
whole rows of --row-shape; without it, one row of zeros. --row-shape (one row, without
the batch axis) defaults to the file's shape or to the model's fixed input dims.
"""

import argparse
import json
import os
import platform
import sys
import time

import numpy as np
import onnxruntime as ort

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import valfile  # noqa: E402


def ints(text):
    return [int(x) for x in text.split(",") if x.strip()]


def load_rows(path, row_shape):
    """Returns ([count, *row_shape] float32 array, row_shape, description)."""
    if path.endswith(".json"):
        with open(path) as f:
            meta = json.load(f)
        if meta.get("format") == valfile.FORMAT:
            _, rows, _ = valfile.read(path)
        elif "rows" in meta:
            rows = np.asarray(meta["rows"], np.float32)
            if row_shape is None and "shape" in meta:
                row_shape = list(meta["shape"])[1:]
        else:
            raise SystemExit(f"{path}: neither a {valfile.FORMAT} file nor a JSON with \"rows\"")
        if row_shape is None:
            row_shape = list(rows.shape[1:])
    else:
        if row_shape is None:
            raise SystemExit("--row-shape is needed with a raw .bin input file")
        rows = np.fromfile(path, dtype="<f4").astype(np.float32)
    size = int(np.prod(row_shape))
    if rows.size % size or rows.size == 0:
        raise SystemExit(f"{path}: {rows.size} values are not whole rows of {row_shape}")
    return rows.reshape([-1] + list(row_shape)), list(row_shape), path


def percentile(sorted_vals, q):
    """Nearest rank, as in bench.rs."""
    if not sorted_vals:
        return float("nan")
    rank = int(np.ceil(min(max(q, 0.0), 1.0) * len(sorted_vals)))
    return sorted_vals[min(max(rank, 1), len(sorted_vals)) - 1]


def measure(sess, in_name, out_names, rows, batch, warmup, seconds, min_runs):
    n = len(rows)
    batches = [np.ascontiguousarray(np.stack([rows[(o * batch + i) % n] for i in range(batch)]))
               for o in range(4)]
    for i in range(warmup):
        sess.run(out_names, {in_name: batches[i % 4]})
    times_ns = []
    limit = int(seconds * 1e9)
    started = time.perf_counter_ns()
    while len(times_ns) < max(min_runs, 1) or time.perf_counter_ns() - started < limit:
        feed = {in_name: batches[len(times_ns) % 4]}
        t0 = time.perf_counter_ns()
        sess.run(out_names, feed)
        times_ns.append(time.perf_counter_ns() - t0)
    ms = sorted(t / 1e6 for t in times_ns)
    total_ms = sum(ms)
    return {
        "batch": batch,
        "runs": len(ms),
        "p50_ms": round(percentile(ms, 0.5), 6),
        "p99_ms": round(percentile(ms, 0.99), 6),
        "mean_ms": round(total_ms / len(ms), 6),
        "min_ms": round(ms[0], 6),
        "items_per_s": round(len(ms) * batch / max(total_ms / 1e3, 1e-12), 3),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--row-shape", type=ints, help="one input row without the batch axis, e.g. 3,48,192")
    ap.add_argument("--batches", type=ints, default=[1, 8, 32])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--min-runs", type=int, default=5)
    ap.add_argument("--input-file")
    ap.add_argument("--profile-ops", type=int, default=0)
    args = ap.parse_args()

    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    t0 = time.perf_counter()
    sess = ort.InferenceSession(args.model, so, providers=["CPUExecutionProvider"])
    load_ms = (time.perf_counter() - t0) * 1e3
    inputs = sess.get_inputs()
    if len(inputs) != 1:
        raise SystemExit(f"{args.model}: expected one input, found {[i.name for i in inputs]}")
    inp = inputs[0]
    out_names = [o.name for o in sess.get_outputs()]

    row_shape = args.row_shape
    if args.input_file:
        rows, row_shape, source = load_rows(args.input_file, row_shape)
    else:
        if row_shape is None:
            dims = inp.shape[1:]
            if not all(isinstance(d, int) and d > 0 for d in dims):
                raise SystemExit(f"input {inp.name} has shape {inp.shape}: give --row-shape")
            row_shape = list(dims)
        rows = np.zeros([1] + list(row_shape), np.float32)
        source = "zeros"
    for want, got in zip(inp.shape[1:], row_shape):
        if isinstance(want, int) and want > 0 and want != got:
            raise SystemExit(f"--row-shape {row_shape} does not fit input {inp.name} {inp.shape}")

    results = []
    for b in args.batches:
        r = measure(sess, inp.name, out_names, rows, b, args.warmup, args.seconds, args.min_runs)
        print(f"[ort_bench] batch {b}: {r}", file=sys.stderr)
        results.append(r)

    ops = profile_ops(args, so, rows) if args.profile_ops > 0 else None

    print(json.dumps({
        "runtime": "onnxruntime",
        "version": ort.__version__,
        "threads": args.threads,
        "model": args.model,
        "row_shape": row_shape,
        "input": {"source": source, "rows": int(len(rows))},
        "settings": {"inter_op_num_threads": 1, "execution_mode": "ORT_SEQUENTIAL",
                     "graph_optimization_level": "ORT_ENABLE_ALL",
                     "provider": "CPUExecutionProvider", "warmup": args.warmup,
                     "seconds": args.seconds, "min_runs": args.min_runs},
        "load_ms": round(load_ms, 3),
        "host": {"python": platform.python_version(), "machine": platform.machine(),
                 "cpus": os.cpu_count()},
        "results": results,
        "ops": ops,
    }))
    return 0


def profile_ops(args, so, rows):
    """Per operator type: nodes and mean kernel time per batch-1 run, from onnxruntime's
    own profiler (a separate session, so the timed runs above ran without it)."""
    import tempfile

    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tempfile.mkdtemp(prefix="ort-profile-"), "ops")
    sess = ort.InferenceSession(args.model, so, providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    out_names = [o.name for o in sess.get_outputs()]
    feed = {inp.name: np.ascontiguousarray(rows[:1])}
    for _ in range(args.warmup):
        sess.run(out_names, feed)
    # The warm-up is in the trace too: the counted runs are the last profile_ops.
    for _ in range(args.profile_ops):
        sess.run(out_names, feed)
    path = sess.end_profiling()
    with open(path) as f:
        events = json.load(f)
    runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    if len(runs) < args.profile_ops:
        raise SystemExit(f"{path}: {len(runs)} runs recorded, {args.profile_ops} expected")
    counted_from = runs[-args.profile_ops]["ts"]
    per_node = {}
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        if e["ts"] < counted_from:
            continue
        op = e.get("args", {}).get("op_name", "?")
        key = e["name"]
        t = per_node.setdefault(key, [op, 0.0])
        t[1] += float(e.get("dur", 0))
    per_op = {}
    for op, us in per_node.values():
        n, total = per_op.get(op, (0, 0.0))
        per_op[op] = (n + 1, total + us)
    total = sum(us for _, us in per_op.values()) or 1.0
    ops = [{"op": op, "nodes": n, "us_per_run": round(us / args.profile_ops, 3),
            "share": round(us / total, 6)} for op, (n, us) in per_op.items()]
    return sorted(ops, key=lambda o: -o["us_per_run"])


if __name__ == "__main__":
    sys.exit(main())
