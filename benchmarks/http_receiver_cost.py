"""The OTLP/HTTP receiver's cost per request: requests/s and the server's CPU per request, on loopback.

``python -m benchmarks.http_receiver_cost [--requests N] [--clients C] [--rounds R] [--variant framing|floor]``

The receiver runs in a child process of its own (so its CPU time is its own) with an ingest that does no
work, answering producer-sized requests (8 GPUs, 1.9 KB of protobuf) that ``C`` clients post on keep-alive
connections with ``http.client``. What is left is HTTP framing, the OTLP handling around it (gate, budget,
protobuf parse of the request, the answer) and the socket calls. ``framing`` is the receiver as it is (run this
script on an older checkout to measure that one: the thread-per-connection framing this replaced, or the h11
variant it once carried); ``floor`` is the framing with an app that does only what no OTLP/HTTP receiver can leave
out: it takes the body and answers 200 with an empty ExportMetricsServiceResponse (no gate, no parse), the
end-to-end benchmark's OTLP/HTTP floor (``floor(port)``).
Each round runs every variant once, in turn, so machine noise falls on all alike; the medians are printed.
The script is not part of ``python -m benchmarks`` (it answers how the framing's own cost moves between
checkouts, see ``receivers/http_framing.py``); its ``floor`` is.
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing
import statistics
import threading
import time
from http import HTTPStatus
from multiprocessing.connection import Connection

import attrs

from otel_ofu.testing.otlp_requests import gpu_request
from otel_ofu_collector.otlp.decode import DecodeOutcome
from otel_ofu_collector.receivers.admission import BodyBudget, BodyLease, Gate
from otel_ofu_collector.receivers.http_framing import HttpServer, Limits, RequestHead, Response
from otel_ofu_collector.receivers.otlp_http import HttpReceiver

_OUTCOME = DecodeOutcome(accepted=8, rejected=0, error_message="", forward=None)
# An empty ExportMetricsServiceResponse: every field at its default, so no bytes (the OTLP/HTTP success body).
_EMPTY_RESPONSE = Response(200, b"", (("Content-Type", "application/x-protobuf"),))


@attrs.frozen
class NoopApp:
    """An ``HttpApp`` that takes every body and answers it with an empty ExportMetricsServiceResponse: the least any
    OTLP/HTTP receiver on this framing does per request (no path, type or gate check, no protobuf parse)."""

    def admit(self, head: RequestHead) -> Response | None:
        return None

    def inline(self, head: RequestHead, body: bytes) -> bool:
        return True  # nothing to wait on: no hop to a worker thread

    def respond(self, head: RequestHead, body: bytes, lease: BodyLease) -> Response:
        return _EMPTY_RESPONSE

    def refuse(self, head: RequestHead | None, status: HTTPStatus, message: str) -> Response:
        return Response(int(status))


def floor_server(host: str = "127.0.0.1", port: int = 0) -> HttpServer:
    """The framing serving ``NoopApp`` on ``host:port`` (not started)."""
    return HttpServer(NoopApp(), host, port, Limits(), BodyBudget(), name="otlp-http-floor")


def floor(port: int) -> None:
    """The OTLP/HTTP floor on ``port`` until SIGTERM (the e2e benchmark's floor peer over OTLP/HTTP)."""
    import signal

    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    server = floor_server(port=port)
    server.start()
    stopped.wait()
    server.stop()


def _ingest(raw: bytes) -> DecodeOutcome:
    return _OUTCOME


def _serve(variant: str, pipe: Connection) -> None:
    server: HttpReceiver | HttpServer = (
        floor_server()
        if variant == "floor"
        # As the collector runs it while its windows are free: each request answered on the server's thread.
        else HttpReceiver(_ingest, Gate(max_in_flight=64), "127.0.0.1:0", inline_when=lambda: True)
    )
    pipe.send(server.start())
    while (command := pipe.recv()) != "stop":
        assert command == "cpu"
        pipe.send(time.process_time())
    server.stop()


def _post_many(port: int, body: bytes, count: int) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Content-Type": "application/x-protobuf"}
    for _ in range(count):
        connection.request("POST", "/v1/metrics", body, headers)
        response = connection.getresponse()
        response.read()
        if response.status != 200:
            raise RuntimeError(f"the receiver answered {response.status}")
    connection.close()


def measure(variant: str, requests: int, clients: int) -> tuple[float, float]:
    """Requests per second, and the server's CPU microseconds per request."""
    parent, child = multiprocessing.Pipe()
    server = multiprocessing.get_context("fork").Process(target=_serve, args=(variant, child), daemon=True)
    server.start()
    port = parent.recv()
    body = gpu_request({f"GPU-{i}": 0.5 for i in range(8)}).SerializeToString()
    _post_many(port, body, 50)  # warm: imports, the first connection, the date cache
    parent.send("cpu")
    cpu_before = parent.recv()
    each = requests // clients
    threads = [threading.Thread(target=_post_many, args=(port, body, each)) for _ in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    parent.send("cpu")
    cpu = parent.recv() - cpu_before
    parent.send("stop")
    server.join(10)
    done = each * clients
    return done / wall, cpu / done * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--variant", action="append", choices=("framing", "floor"))
    args = parser.parse_args()
    variants = args.variant or ["framing"]
    results: dict[str, list[tuple[float, float]]] = {variant: [] for variant in variants}
    for _ in range(args.rounds):
        for variant in variants:
            results[variant].append(measure(variant, args.requests, args.clients))
    for variant, runs in results.items():
        rates = [rate for rate, _ in runs]
        cpus = [cpu for _, cpu in runs]
        print(
            f"{variant}: {statistics.median(rates):.0f} requests/s (runs {min(rates):.0f}-{max(rates):.0f}), "
            f"server CPU {statistics.median(cpus):.0f} us/request (runs {min(cpus):.0f}-{max(cpus):.0f})"
        )


if __name__ == "__main__":
    main()
