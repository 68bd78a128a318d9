"""The validation-file format shared by the three benchmark models (see README.md).

A model directory holds:

  validation.json            metadata (this module writes and reads it)
  validation.rows.bin        `count` input rows, float32 little-endian, row-major, back to back
  validation.reference.bin   `count` reference outputs, float32 little-endian, same order

`shape` / `reference_shape` are the shapes of ONE row / ONE output including a leading
batch axis of 1, e.g. [1, 3, 48, 192] and [1, 2]. File names in the JSON are relative
to the JSON's own directory.
"""

import hashlib
import json
import os

import numpy as np

FORMAT = "nephele-validation/1"


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write(json_path, rows, reference, *, input_name, output_name, reference_by,
          tolerance, description, extra=None):
    """rows: [count, *shape[1:]] array; reference: [count, *reference_shape[1:]]."""
    rows = np.ascontiguousarray(rows, dtype="<f4")
    reference = np.ascontiguousarray(reference, dtype="<f4")
    if rows.shape[0] != reference.shape[0]:
        raise ValueError("rows and reference differ in count")
    if not (np.isfinite(rows).all() and np.isfinite(reference).all()):
        raise ValueError("non-finite value in rows or reference")
    base = os.path.dirname(os.path.abspath(json_path))
    rows_file = "validation.rows.bin"
    ref_file = "validation.reference.bin"
    rows.tofile(os.path.join(base, rows_file))
    reference.tofile(os.path.join(base, ref_file))
    meta = {
        "format": FORMAT,
        "description": description,
        "model": "model.onnx",
        "input_name": input_name,
        "output_name": output_name,
        "dtype": "float32",
        "byte_order": "little",
        "count": int(rows.shape[0]),
        "shape": [1] + [int(d) for d in rows.shape[1:]],
        "rows_file": rows_file,
        "reference_shape": [1] + [int(d) for d in reference.shape[1:]],
        "reference_file": ref_file,
        "reference_by": reference_by,
        "tolerance": tolerance,
        "sha256": {
            rows_file: _sha256(os.path.join(base, rows_file)),
            ref_file: _sha256(os.path.join(base, ref_file)),
        },
    }
    if extra:
        meta.update(extra)
    tmp = json_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    os.replace(tmp, json_path)
    return meta


def read(json_path):
    """Returns (meta, rows [count, *shape[1:]], reference [count, *reference_shape[1:]])."""
    with open(json_path) as f:
        meta = json.load(f)
    if meta.get("format") != FORMAT:
        raise ValueError(f"{json_path}: not a {FORMAT} file")
    base = os.path.dirname(os.path.abspath(json_path))
    count = meta["count"]
    rows = np.fromfile(os.path.join(base, meta["rows_file"]), dtype="<f4")
    ref = np.fromfile(os.path.join(base, meta["reference_file"]), dtype="<f4")
    rows = rows.reshape([count] + meta["shape"][1:])
    ref = ref.reshape([count] + meta["reference_shape"][1:])
    return meta, rows.astype(np.float32), ref.astype(np.float32)
