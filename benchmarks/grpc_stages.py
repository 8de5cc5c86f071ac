"""Where one 8-GPU OTLP/gRPC request's CPU goes inside the collector process, stage by stage, beside floors.

A server runs in a child process (``python -m benchmarks.grpc_stages serve KIND``); this process sends it
the same pre-serialised requests as ``bench_collector_e2e`` (8 GPUs per request, 8 points per GPU, a fleet
seen once before the measured requests), one in flight at a time. The child counts its own process CPU
(``time.process_time``, every thread) over the measured requests and the thread CPU (``time.thread_time_ns``) of
each stage of ``GrpcReceiver._export`` and its ingest thread's ``_process``, by wrapping the calls they make: the gate
(admission: ``Gate.enter`` + ``Gate.leave``), the protobuf parse (``ExportMetricsServiceRequest.FromString``),
the collector's ingest (decode + aggregation) and, with a bearer token configured, the interceptor's check
(auth). What is left of the handler is its own code and the response; what is left of the process is
grpcio's: its C core (HTTP/2, the completion queue) and its Python server (the hand-off of each call to a
thread of the pool, the context, the interceptors' plumbing). The wrappers exist only in the child of this
benchmark; the collector itself carries no timer.

Floors, in the same run on the same bytes: a grpcio server whose handler returns an empty response at once,
with grpcio's synchronous server (``noop``) and its asyncio server (``noop-aio``, what the collector uses since
its calls wait for their messages without a thread): the least a Python gRPC server costs per request here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from benchmarks.bench_collector_e2e import EXPORT_METHOD, NODE_GPUS, producer_requests, warmup_requests

POINTS = 8
KINDS = ("ours", "ours-auth", "noop", "noop-aio")
TOKEN = "bench-token"
STAGES = ("auth", "admission", "parse", "ingest")


# --- the child ---------------------------------------------------------------------------------------


def _timed(totals: dict[str, int], stage: str, call: Callable[..., Any]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.thread_time_ns()
        try:
            return call(*args, **kwargs)
        finally:
            totals[stage] += time.thread_time_ns() - start

    return timed


def _wrap(totals: dict[str, int], owner: object, attribute: str, stage: str) -> None:
    setattr(owner, attribute, _timed(totals, stage, getattr(owner, attribute)))


def _serve_ours(auth: bool, totals: dict[str, int]) -> tuple[int, Callable[[], object]]:
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    from otel_ofu_collector.receivers import otlp_grpc
    from otel_ofu_collector.receivers.admission import Gate
    from otel_ofu_collector.receivers.auth import BearerAuth
    from otel_ofu_collector.service import CollectorOptions, CollectorService

    # The classes are slotted: their methods are wrapped on the class (in this child process only).
    _wrap(totals, CollectorService, "ingest", "ingest")
    _wrap(totals, CollectorService, "flush", "flush")
    _wrap(totals, Gate, "enter", "admission")
    _wrap(totals, Gate, "leave", "admission")
    _wrap(totals, BearerAuth, "allows", "auth")
    _wrap(totals, otlp_grpc.GrpcReceiver, "_process", "handler")  # its ingest thread's part (the rest is a coroutine)

    class Parse:  # what the receiver parses with, timed
        FromString = staticmethod(_timed(totals, "parse", ExportMetricsServiceRequest.FromString))

    setattr(otlp_grpc, "ExportMetricsServiceRequest", Parse)  # noqa: B010 - a name mypy does not see exported
    service = CollectorService(
        CollectorOptions(grpc_listen="127.0.0.1:0", bearer_token=TOKEN if auth else None, self_telemetry=False)
    )
    service.start()
    return service.ports["grpc"], service.stop


def _noop_server(listen: str) -> tuple[int, grpc.Server]:
    """grpcio's synchronous server, as the collector builds it (a pool of 68 threads: 64 in flight + 4),
    answering Export with an empty response at once."""
    from concurrent import futures

    def export(raw: bytes, context: grpc.ServicerContext) -> bytes:
        return b""

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=68))
    handler = grpc.unary_unary_rpc_method_handler(export)
    name, _, method = EXPORT_METHOD.strip("/").partition("/")
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, {method: handler}),))
    port = server.add_insecure_port(listen)
    server.start()
    return port, server


def _serve_noop() -> tuple[int, Callable[[], object]]:
    port, server = _noop_server("127.0.0.1:0")
    return port, lambda: server.stop(None).wait()


def _serve_noop_aio() -> None:
    import asyncio

    async def export(raw: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        return b""

    async def main() -> None:
        server = grpc.aio.server()
        handler = grpc.unary_unary_rpc_method_handler(export)
        name, _, method = EXPORT_METHOD.strip("/").partition("/")
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, {method: handler}),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        loop = asyncio.get_running_loop()
        print(json.dumps({"port": port}), flush=True)
        start = 0.0
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if line.strip() == "mark":
                start = time.process_time()
                print("{}", flush=True)
            elif line.strip() == "report":
                print(json.dumps({"process_ns": int((time.process_time() - start) * 1e9)}), flush=True)
            else:
                await server.stop(None)
                return

    asyncio.run(main())


def serve(kind: str) -> None:
    if kind == "noop-aio":
        _serve_noop_aio()
        return
    totals: dict[str, int] = defaultdict(int)
    port, stop = _serve_noop() if kind == "noop" else _serve_ours(kind == "ours-auth", totals)
    print(json.dumps({"port": port}), flush=True)
    start = 0.0
    for line in sys.stdin:
        if line.strip() == "mark":
            totals.clear()
            start = time.process_time()
            print("{}", flush=True)
        elif line.strip() == "report":
            print(json.dumps({"process_ns": int((time.process_time() - start) * 1e9), **totals}), flush=True)
        else:
            break
    stop()


# --- the parent --------------------------------------------------------------------------------------


def measure(kind: str, payloads: Sequence[bytes], warmup: int) -> dict[str, float]:
    """us of CPU per GPU report, per stage, for one server of ``kind`` over ``payloads``."""
    child = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.grpc_stages", "serve", kind],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None
    assert child.stdout is not None
    try:
        port = json.loads(child.stdout.readline())["port"]
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            export = channel.unary_unary(EXPORT_METHOD, request_serializer=None, response_deserializer=None)
            metadata = (("authorization", f"Bearer {TOKEN}"),) if kind == "ours-auth" else None
            for payload in payloads[:warmup]:
                export(payload, timeout=30, metadata=metadata)
            time.sleep(0.3)
            child.stdin.write("mark\n")
            child.stdin.flush()
            child.stdout.readline()
            for payload in payloads[warmup:]:
                export(payload, timeout=30, metadata=metadata)
            child.stdin.write("report\n")
            child.stdin.flush()
            totals = json.loads(child.stdout.readline())
        child.stdin.write("stop\n")
        child.stdin.flush()
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdin.close()
        child.stdout.close()
    reports = (len(payloads) - warmup) * NODE_GPUS
    per = {key: value / 1e3 / reports for key, value in totals.items()}
    row = {"process": per["process_ns"]}
    if "handler" in per:
        staged = sum(per.get(stage, 0.0) for stage in STAGES if stage != "auth")
        row.update({stage: per.get(stage, 0.0) for stage in STAGES})
        row["handler rest (response, own code)"] = per["handler"] - staged
        row["flush (the timer thread: windows closed)"] = per.get("flush", 0.0)
        row["grpcio (core + Python server)"] = (
            per["process_ns"] - per["handler"] - per.get("auth", 0.0) - per.get("flush", 0.0)
        )
    return row


def run_all(requests: int = 1500, repeats: int = 3, fleet: int = 1024, kinds: Sequence[str] = KINDS) -> dict[str, Any]:
    warmup = warmup_requests(NODE_GPUS, fleet)
    payloads = producer_requests(NODE_GPUS, POINTS, warmup + requests, fleet)
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    for _ in range(repeats):  # interleaved, so drift on a shared machine lands on every kind alike
        for kind in kinds:
            runs[kind].append(measure(kind, payloads, warmup))
    return {"requests": requests, "gpus_per_request": NODE_GPUS, "points_per_gpu": POINTS, "runs": runs}


def spread(values: Sequence[float]) -> str:
    """Median (min-max) of the repeats."""
    ordered = sorted(values)
    return f"{ordered[len(ordered) // 2]:.1f} ({ordered[0]:.1f}-{ordered[-1]:.1f})"


ROW_NAMES = {
    "process": "whole process",
    "auth": "auth (bearer token, in the interceptor)",
    "admission": "admission (Gate.enter + Gate.leave)",
    "parse": "parse (ExportMetricsServiceRequest.FromString)",
    "ingest": "ingest (decode + aggregation)",
    "handler rest (response, own code)": "rest of the handler (its own code, the response)",
    "flush (the timer thread: windows closed)": "flush (the timer thread closing windows)",
    "grpcio (core + Python server)": "grpcio (C core, Python server, hand-off to the pool)",
}


def table_rows(data: dict[str, Any]) -> list[tuple[str, ...]]:
    """One row per stage: us of CPU per GPU report, median (min-max) of the repeats, per server."""
    runs = data["runs"]
    rows = []
    for key, label in ROW_NAMES.items():
        cells = [spread([r[key] for r in runs[kind]]) if key in runs[kind][0] else "-" for kind in KINDS]
        rows.append((label, *cells))
    return rows


def floor(port: int) -> None:
    """The no-op grpcio server on ``port`` until SIGTERM (the e2e benchmark's floor peer)."""
    import signal
    import threading

    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    server = _noop_server(f"127.0.0.1:{port}")[1]
    stopped.wait()
    server.stop(None).wait()


def main(argv: Sequence[str]) -> None:
    if len(argv) >= 2 and argv[0] == "serve":
        serve(argv[1])
        return
    if len(argv) >= 2 and argv[0] == "floor":
        floor(int(argv[1]))
        return
    kinds = [a for a in argv if a in KINDS] or list(KINDS)
    data = run_all(kinds=kinds)
    for kind, rows in data["runs"].items():
        print(kind)
        for key in rows[0]:
            values = sorted(r[key] for r in rows)
            print(f"  {key:40s} {values[len(values) // 2]:8.1f} us/report  ({values[0]:.1f}-{values[-1]:.1f})")


if __name__ == "__main__":
    main(sys.argv[1:])
