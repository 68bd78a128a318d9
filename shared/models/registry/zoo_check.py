"""Compares an agent's typed answers with onnxruntime's for magika's byte classifier.

Not part of the test suite yet (issue 14's model zoo); the README quotes its output.

    pip download --no-deps --only-binary=:all: magika==1.0.3 -d /tmp/zoo
    unzip -o /tmp/zoo/magika-1.0.3-*.whl magika/models/standard_v3_3/model.onnx -d /tmp/zoo
    nephele model push magika /tmp/zoo/magika/models/standard_v3_3/model.onnx --input bytes=1,2048:i32
    nephele deploy create magika --model magika --selector site=lab --no-offload
    target/models/venv/bin/python shared/models/registry/zoo_check.py \
        --model /tmp/zoo/magika/models/standard_v3_3/model.onnx \
        --endpoint http://127.0.0.1:9090 README.md Cargo.toml tests/run.sh \
        target/release/nephele edge/nephele-runtime/src/lib.rs shared/models/digits-mlp/model.onnx
"""
import argparse
import json
import urllib.request

import numpy as np
import onnxruntime as ort


def features(content: bytes) -> np.ndarray:
    """magika's input: the first and the last 1024 bytes, padded with 256."""
    beg = list(content[:1024]) + [256] * max(0, 1024 - len(content[:1024]))
    end = [256] * max(0, 1024 - len(content[-1024:])) + list(content[-1024:])
    return np.array([beg + end], dtype=np.int32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--endpoint", required=True, help="the agent's local HTTP endpoint")
    parser.add_argument("--deployment", default="magika")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    session = ort.InferenceSession(args.model, providers=["CPUExecutionProvider"])
    worst, same = 0.0, 0
    for path in args.files:
        with open(path, "rb") as f:
            x = features(f.read())
        reference = session.run(None, {"bytes": x})[0]
        body = json.dumps({"inputs": {"bytes": {"dtype": "i32", "shape": [1, 2048],
                                                "data": x[0].tolist()}}}).encode()
        request = urllib.request.Request(f"{args.endpoint}/v1/infer/{args.deployment}", data=body,
                                         headers={"content-type": "application/json"})
        answer = json.load(urllib.request.urlopen(request))
        got = np.array(answer["outputs"]["target_label"]["data"]).reshape(reference.shape)
        worst = max(worst, float(np.abs(got - reference).max()))
        same += int(got.argmax() == reference.argmax())
    print(f"magika: {len(args.files)} files, max |nephele - onnxruntime {ort.__version__}| = "
          f"{worst:.2e}, same top class {same}/{len(args.files)}")


if __name__ == "__main__":
    main()
