#!/usr/bin/env python3
"""A small OTLP trace receiver (gRPC and HTTP), for the trace test (tests/tests/tracing.rs).

No collector binary is packaged in the registries the tests can reach, so this one is
built on PyPI's `grpcio` and `opentelemetry-proto` (the OpenTelemetry project's own
generated messages and service stubs), installed by shared/models/registry/prepare.sh.
It serves opentelemetry.proto.collector.trace.v1.TraceService/Export on plain HTTP/2,
as a collector's OTLP/gRPC port does, and POST /v1/traces with protobuf bodies on plain
HTTP/1.1, as its OTLP/HTTP port does, and appends every span it receives to a file, one
JSON object per line, with its resource's service name and attributes and the protocol
it came by.

usage: otlp_receiver.py --ready FILE --out FILE [--listen 127.0.0.1:0]
  --ready: written as {"port": N, "http_port": M} once both ports listen
  --out:   spans, one JSON object per line
"""

import argparse
import json
import os
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


def plain(value):
    """An AnyValue as a JSON value (the scalar kinds nephele sends)."""
    kind = value.WhichOneof("value")
    if kind in ("string_value", "bool_value", "int_value", "double_value"):
        return getattr(value, kind)
    return None


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, out):
        self.out = out
        self.lock = threading.Lock()

    def Export(self, request, context):
        self.keep(request, "grpc")
        return trace_service_pb2.ExportTraceServiceResponse()

    def keep(self, request, protocol):
        lines = []
        for resource_spans in request.resource_spans:
            resource = {kv.key: plain(kv.value) for kv in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    lines.append(json.dumps({
                        "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(),
                        "parent_span_id": span.parent_span_id.hex(),
                        "name": span.name,
                        "kind": span.kind,
                        "start": span.start_time_unix_nano,
                        "end": span.end_time_unix_nano,
                        "flags": span.flags,
                        "status_code": span.status.code,
                        "status_message": span.status.message,
                        "attributes": {kv.key: plain(kv.value) for kv in span.attributes},
                        "service": resource.get("service.name"),
                        "resource": resource,
                        "scope": scope_spans.scope.name,
                        "protocol": protocol,
                    }))
        with self.lock, open(self.out, "a", encoding="utf-8") as out:
            out.write("".join(line + "\n" for line in lines))


def http_handler(receiver):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            if self.path != "/v1/traces":
                self.answer(404, b"not found", "text/plain")
            elif self.headers.get("Content-Type") != "application/x-protobuf":
                self.answer(415, b"protobuf only", "text/plain")
            else:
                receiver.keep(trace_service_pb2.ExportTraceServiceRequest.FromString(body), "http")
                answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.answer(200, answer, "application/x-protobuf")

        def answer(self, status, body, kind):
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    return Handler


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ready", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--listen", default="127.0.0.1:0")
    args = parser.parse_args()
    receiver = Receiver(args.out)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port(args.listen)
    if port == 0:
        raise SystemExit(f"cannot listen on {args.listen}")
    server.start()
    host = args.listen.rsplit(":", 1)[0]
    http = ThreadingHTTPServer((host, 0), http_handler(receiver))
    threading.Thread(target=http.serve_forever, daemon=True).start()
    tmp = args.ready + ".tmp"
    with open(tmp, "w", encoding="utf-8") as ready:
        json.dump({"port": port, "http_port": http.server_address[1]}, ready)
    os.replace(tmp, args.ready)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
