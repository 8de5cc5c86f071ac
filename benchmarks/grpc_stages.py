"""Where a request's CPU goes inside the collector process, stage by stage, beside floors: over OTLP/gRPC and OTLP/HTTP
at 8 GPUs per request (a node's producer), and over gRPC at 1000 (a gateway's batch).

A server runs in a child process (``python -m benchmarks.grpc_stages serve KIND``); this process sends it the same
pre-serialised requests as ``bench_collector_e2e`` (8 points per GPU, a fleet seen once before the measured
requests): over gRPC one in flight at a time, over OTLP/HTTP from ``SENDERS`` keep-alive clients at once, as the
end-to-end benchmark sends them. The child counts its own process CPU (``time.process_time``, every thread) over the
measured requests and the thread CPU (``time.thread_time_ns``) of each stage of ``GrpcReceiver._export`` and its
ingest thread's ``_process``, by wrapping the calls they make: the gate (admission: ``Gate.enter`` +
``Gate.leave``), the collector's ingest (decode + aggregation, ``ingest_bytes``), the protobuf parse inside it
(``ExportMetricsServiceRequest.FromString``, only for a request not read from its bytes) and, with a bearer token
configured, the interceptor's check (auth). Over OTLP/HTTP the handler is the OTLP app's ``respond`` (the body is
in: gate, parse, ingest, the answer). What is left of the handler is its own code and the response; what is left of
the process is the server around the handler: grpcio's C core (HTTP/2, the completion queue) and its Python server
(the hand-off of each call to a thread of the pool, the context, the interceptors' plumbing), or over OTLP/HTTP our
HTTP/1.1 framing (``receivers/http_framing``: the socket calls, the head and body, its event loop). The
wrappers exist only in the child of this benchmark; the collector itself carries no timer.

The ingest is split in this process, on the very same request bytes: the decoder (``Decoder.decode_bytes``) feeding
a null sink that takes every point and keeps nothing, then feeding the real windows (the collector's own
``CollectorService``, so its ``Aggregator``), then through the service's ``ingest_bytes`` (what the receivers call):
the decode alone, the aggregation (the difference), the service's seam around the decoder, and what the server's
ingest spends beyond all three (running between the receiver's socket calls, and the wrappers' timers, rather than
alone in a loop).

Floors, in the same run on the same bytes: a grpcio server whose handler returns an empty response at once, with
grpcio's synchronous server (``noop``) and its asyncio server (``noop-aio``, what the collector uses since its calls
wait for their messages without a thread): the least a Python gRPC server costs per request here; over OTLP/HTTP our
framing with an app that takes the body and answers an empty ExportMetricsServiceResponse (``noop-http``,
``http_receiver_cost.floor``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import grpc

from benchmarks.bench_collector_e2e import (
    EXPORT_METHOD,
    GATEWAY_GPUS,
    NODE_GPUS,
    HttpSenders,
    RefusedPoints,
    producer_requests,
    rejected_points,
    warmup_requests,
)

POINTS = 8
KINDS = ("ours", "ours-auth", "noop", "noop-aio", "ours-http", "noop-http")
HTTP_KINDS = ("ours-http", "noop-http")
# (server, GPUs per request): the columns of the table, in order.
CASES: tuple[tuple[str, int], ...] = (
    ("ours", NODE_GPUS),
    ("ours-auth", NODE_GPUS),
    ("noop", NODE_GPUS),
    ("noop-aio", NODE_GPUS),
    ("ours-http", NODE_GPUS),
    ("noop-http", NODE_GPUS),
    ("ours", GATEWAY_GPUS),
    ("noop", GATEWAY_GPUS),
)
COLUMNS = {
    ("ours", NODE_GPUS): "ours, gRPC, 8 GPUs/request",
    ("ours-auth", NODE_GPUS): "ours with a bearer token, gRPC, 8",
    ("noop", NODE_GPUS): "grpcio no-op (sync), 8",
    ("noop-aio", NODE_GPUS): "grpcio no-op (asyncio), 8",
    ("ours-http", NODE_GPUS): "ours, OTLP/HTTP, 8 GPUs/request",
    ("noop-http", NODE_GPUS): "our HTTP framing, no-op app, 8",
    ("ours", GATEWAY_GPUS): f"ours, gRPC, {GATEWAY_GPUS} GPUs/request",
    ("noop", GATEWAY_GPUS): f"grpcio no-op (sync), {GATEWAY_GPUS}",
}
TOKEN = "bench-token"
STAGES = ("auth", "admission", "parse", "ingest")


def case_key(kind: str, gpus: int) -> str:
    """A case's key in the JSON: the 8-GPU cases by their server alone (as before 2026-12-04)."""
    return kind if gpus == NODE_GPUS else f"{kind}@{gpus}"


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


def _serve_ours(auth: bool, totals: dict[str, int], http: bool = False) -> tuple[int, Callable[[], object]]:
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    from otel_ofu_collector.otlp import resources
    from otel_ofu_collector.receivers import otlp_grpc, otlp_http
    from otel_ofu_collector.receivers.admission import Gate
    from otel_ofu_collector.receivers.auth import BearerAuth
    from otel_ofu_collector.service import CollectorOptions, CollectorService

    # The classes are slotted: their methods are wrapped on the class (in this child process only).
    _wrap(totals, CollectorService, "ingest_bytes", "ingest")  # what both receivers call
    _wrap(totals, CollectorService, "flush", "flush")
    _wrap(totals, Gate, "enter", "admission")
    _wrap(totals, Gate, "leave", "admission")
    _wrap(totals, BearerAuth, "allows", "auth")
    _wrap(totals, otlp_grpc.GrpcReceiver, "_process", "handler")  # its ingest thread's part (the rest is a coroutine)
    _wrap(totals, otlp_http._OtlpApp, "respond", "handler")  # the body is in: gate, parse, ingest, the answer

    class Parse:  # what the decoder parses a request with when it must (inside ingest), timed
        FromString = staticmethod(_timed(totals, "parse", ExportMetricsServiceRequest.FromString))

    setattr(resources, "ExportMetricsServiceRequest", Parse)  # noqa: B010 - a name mypy does not see exported
    listen = {"http_listen": "127.0.0.1:0", "grpc_listen": None} if http else {"grpc_listen": "127.0.0.1:0"}
    service = CollectorService(CollectorOptions(**listen, bearer_token=TOKEN if auth else None, self_telemetry=False))
    service.start()
    return service.ports["http" if http else "grpc"], service.stop


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


def _serve_noop_http() -> tuple[int, Callable[[], object]]:
    from benchmarks.http_receiver_cost import floor_server

    server = floor_server()
    return server.start(), server.stop


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
    if kind == "noop":
        port, stop = _serve_noop()
    elif kind == "noop-http":
        port, stop = _serve_noop_http()
    else:
        port, stop = _serve_ours(kind == "ours-auth", totals, http=kind == "ours-http")
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


def measure(kind: str, payloads: Sequence[bytes], warmup: int, gpus: int = NODE_GPUS) -> dict[str, float]:
    """us of CPU per GPU report, per stage, for one server of ``kind`` over ``payloads`` of ``gpus`` GPUs each."""
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

        def mark(command: str) -> dict[str, int]:
            assert child.stdin is not None
            assert child.stdout is not None
            child.stdin.write(command + "\n")
            child.stdin.flush()
            answer: dict[str, int] = json.loads(child.stdout.readline())
            return answer

        if kind in HTTP_KINDS:
            senders = HttpSenders(port)
            try:
                senders.send(payloads[:warmup], whole=False)
                time.sleep(0.3)
                mark("mark")
                senders.send(payloads[warmup:])
                totals = mark("report")
            finally:
                senders.close()
        else:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                export = channel.unary_unary(EXPORT_METHOD, request_serializer=None, response_deserializer=None)
                metadata = (("authorization", f"Bearer {TOKEN}"),) if kind == "ours-auth" else None
                for payload in payloads[:warmup]:
                    export(payload, timeout=30, metadata=metadata)
                time.sleep(0.3)
                mark("mark")
                rejected = 0
                for payload in payloads[warmup:]:
                    rejected += rejected_points(export(payload, timeout=30, metadata=metadata))
                totals = mark("report")
                if rejected:
                    raise RefusedPoints(rejected)
        child.stdin.write("stop\n")
        child.stdin.flush()
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdin.close()
        child.stdout.close()
    reports = (len(payloads) - warmup) * gpus
    per = {key: value / 1e3 / reports for key, value in totals.items()}
    if "ingest" in per:  # the parse happens inside the ingest, when it happens: apart in the table
        per["ingest"] -= per.get("parse", 0.0)
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


class NullSink:
    """A ``PointSink`` that takes every point and keeps nothing: the decoder's own cost, with no windows behind it.
    It never bounds the decoder's identity cache (a sink of many live entries and bytes to spare)."""

    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()

    def profile_of(self, identity: Mapping[str, str]) -> Any:
        return None

    def add_ofu(self, *args: Any) -> str | None:
        return None

    def add_unmeasured(self, *args: Any) -> str | None:
        return None

    def add_mfu(self, *args: Any) -> str | None:
        return None

    def add_progress(self, *args: Any, **kwargs: Any) -> str | None:
        return None

    def add_gpu_inputs(self, *args: Any) -> str | None:
        return None

    def add_gpu_counters(self, *args: Any) -> str | None:
        return None

    def live_entries(self) -> int:
        return 1 << 30

    def cache_budget(self, cache_bytes: int) -> int:
        return 1 << 40


def decoder_split(payloads: Sequence[bytes], warmup: int, gpus: int) -> dict[str, float]:
    """us of this thread's CPU per GPU report over ``payloads[warmup:]`` (after ``payloads[:warmup]`` went through
    the same path), each given as the receivers give it, its bytes (``decode_bytes``: parsed only where the decoder
    needs the message): ``Decoder.decode_bytes`` into a null sink, into the collector's real windows, and the
    service's ``ingest_bytes`` in front of it."""
    import gc

    from otel_ofu_collector.service import CollectorOptions, CollectorService

    reports = (len(payloads) - warmup) * gpus
    result = {}
    for name in ("decode (null sink)", "decode + aggregation", "service ingest"):
        # The collector as it runs (its clock, its limits), with no receiver and no timer thread closing windows.
        service = CollectorService(CollectorOptions(grpc_listen=None, flush_interval_s=0, self_telemetry=False))
        if name == "decode (null sink)":
            service.decoder.sink = NullSink()
        # The service's ingest is what the receivers call: the decoder behind its seam (scrapes, write-ahead log).
        call = service.ingest_bytes if name == "service ingest" else service.decoder.decode_bytes
        for raw in payloads[:warmup]:
            call(raw)
        gc.collect()
        rejected = 0
        started = time.thread_time_ns()
        for raw in payloads[warmup:]:
            rejected += call(raw).rejected
        result[name] = (time.thread_time_ns() - started) / 1e3 / reports
        if rejected:  # every point of a healthy fleet is taken: else this times the refusals
            raise RefusedPoints(rejected)
    return result


def run_all(
    requests: int = 1500,
    repeats: int = 3,
    fleet: int = 1024,
    cases: Sequence[tuple[str, int]] = CASES,
    gateway_requests: int = 100,
) -> dict[str, Any]:
    """Every case ``repeats`` times, in turn; ``requests`` measured requests of 8 GPUs, ``gateway_requests`` of 1000.

    The requests are made just before each of ours is sent them (and before each decoder split): ours closes its
    windows by the clock, so points stamped a minute earlier would be late, and what was timed its refusals."""

    def workload(gpus: int) -> tuple[int, list[bytes]]:
        warmup = warmup_requests(gpus, fleet)
        measured = requests if gpus == NODE_GPUS else gateway_requests
        return warmup, producer_requests(gpus, POINTS, warmup + measured, fleet)

    sizes = sorted({gpus for _, gpus in cases})
    runs: dict[str, list[dict[str, float]]] = {case_key(kind, gpus): [] for kind, gpus in cases}
    split: dict[str, list[dict[str, float]]] = {str(gpus): [] for gpus in sizes}
    workloads: dict[int, tuple[int, list[bytes]]] = {}
    for _ in range(repeats):  # interleaved, so drift on a shared machine lands on every kind alike
        for kind, gpus in cases:
            if kind.startswith("ours") or gpus not in workloads:
                workloads[gpus] = workload(gpus)
            warmup, payloads = workloads[gpus]
            runs[case_key(kind, gpus)].append(measure(kind, payloads, warmup, gpus))
        for gpus in sizes:
            warmup, payloads = workloads[gpus] = workload(gpus)
            split[str(gpus)].append(decoder_split(payloads, warmup, gpus))
    return {
        "requests": requests,
        "gateway_requests": gateway_requests,
        "gpus_per_request": NODE_GPUS,
        "points_per_gpu": POINTS,
        "cases": [[kind, gpus] for kind, gpus in cases],
        "runs": runs,
        "decoder_split": split,
    }


def spread(values: Sequence[float]) -> str:
    """Median (min-max) of the repeats."""
    ordered = sorted(values)
    return f"{ordered[len(ordered) // 2]:.1f} ({ordered[0]:.1f}-{ordered[-1]:.1f})"


ROW_NAMES = {
    "process": "whole process",
    "auth": "auth (bearer token, in the interceptor)",
    "admission": "admission (Gate.enter + Gate.leave)",
    "parse": "protobuf parse (ExportMetricsServiceRequest.FromString: a request not read from its bytes alone)",
    "ingest": "ingest (decode + aggregation), in the server",
    "decode (null sink)": "- of which our decoder: Decoder.decode_bytes into a null sink (in process)",
    "aggregation": "- of which aggregation: into the real windows less the null sink (in process)",
    "seam": "- of which the service's seam: CollectorService.ingest_bytes less Decoder.decode_bytes (in process)",
    "ingest rest": "- of which the rest: the server's ingest less the in-process one (between the receiver's socket "
    "calls)",
    "handler rest (response, own code)": "rest of the handler (its own code, the response)",
    "flush (the timer thread: windows closed)": "flush (the timer thread closing windows)",
    "grpcio (core + Python server)": "the server around the handler: grpcio's C core, Python server, hand-off to the "
    "pool; or our HTTP/1.1 framing, socket calls, event loop",
}


def _cells(data: dict[str, Any], kind: str, gpus: int) -> dict[str, list[float]]:
    """Each row's values over the repeats for one case, the in-process split beside ours."""
    runs = data["runs"].get(case_key(kind, gpus), [])
    cells: dict[str, list[float]] = {key: [r[key] for r in runs] for key in ROW_NAMES if runs and key in runs[0]}
    split = data.get("decoder_split", {}).get(str(gpus), [])
    if kind.startswith("ours") and split and "ingest" in cells:
        cells["decode (null sink)"] = [s["decode (null sink)"] for s in split]
        cells["aggregation"] = [s["decode + aggregation"] - s["decode (null sink)"] for s in split]
        cells["seam"] = [s["service ingest"] - s["decode + aggregation"] for s in split]
        cells["ingest rest"] = [i - s["service ingest"] for i, s in zip(cells["ingest"], split, strict=False)]
    return cells


def table_columns(data: dict[str, Any]) -> list[str]:
    return [COLUMNS.get((kind, gpus), f"{kind}, {gpus}") for kind, gpus in data["cases"]]


def table_rows(data: dict[str, Any]) -> list[tuple[str, ...]]:
    """One row per stage: us of CPU per GPU report, median (min-max) of the repeats, per case."""
    cases = [_cells(data, kind, gpus) for kind, gpus in data["cases"]]
    return [(label, *(spread(case[key]) if key in case else "-" for case in cases)) for key, label in ROW_NAMES.items()]


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
    data = run_all(cases=[(kind, gpus) for kind, gpus in CASES if kind in kinds])
    print("stage |", " | ".join(table_columns(data)))
    for row in table_rows(data):
        print(" | ".join(row))


if __name__ == "__main__":
    main(sys.argv[1:])
