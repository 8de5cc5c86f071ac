"""The OTLP/HTTP receiver's cost per request: requests/s and the server's CPU per request, on loopback.

``python -m benchmarks.http_receiver_cost [--requests N] [--clients C] [--rounds R] [--variant framing|h11]``

The receiver runs in a child process of its own (so its CPU time is its own) with an ingest that does no
work, answering producer-sized requests (8 GPUs, 1.9 KB of protobuf) that ``C`` clients post on keep-alive
connections with ``http.client``. What is left is HTTP framing, the OTLP handling around it (gate, budget,
protobuf parse of the request, the answer) and the socket calls. ``framing`` is the receiver as it is
(run this script on an older checkout to measure that one); ``h11`` serves the very same OTLP app
(``otlp_http._OtlpApp``) over h11's parser instead, with the least connection loop h11 allows (no head
deadline, no minimum rate, no early chunk refusal): a floor for what h11 would cost, not a full receiver;
``floor`` is the framing with an app that does only what no OTLP/HTTP receiver can leave out: it takes the body
and answers 200 with an empty ExportMetricsServiceResponse (no gate, no parse), the end-to-end benchmark's
OTLP/HTTP floor (``floor(port)``).
Each round runs every variant once, in turn, so machine noise falls on all alike; the medians are printed.
The script is not part of ``python -m benchmarks``: it answers one question (whether to frame on h11), see
``receivers/http_framing.py``; its ``floor`` is.
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
from typing import Any

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


def _use_h11() -> None:
    """Serve every connection of the framing module's server with h11 instead (in this process only)."""
    import importlib
    import socket

    from otel_ofu_collector.receivers import http_framing

    h11: Any = importlib.import_module("h11")  # not a dependency: pip install h11 to measure it

    class H11Connection:
        def __init__(self, sock: socket.socket, peer: str, server: http_framing.HttpServer) -> None:
            self.sock, self.peer, self.app, self.budget = sock, peer, server.app, server.budget
            self.sock.settimeout(server.limits.read_timeout_s)
            self.h11 = h11.Connection(h11.SERVER)

        def _event(self) -> Any:
            while True:
                event = self.h11.next_event()
                if event is not h11.NEED_DATA:
                    return event
                self.h11.receive_data(self.sock.recv(1024 * 1024))

        def _send(self, response: http_framing.Response) -> None:
            headers = [("Content-Length", str(len(response.body))), *response.headers]
            data = self.h11.send(h11.Response(status_code=response.status, headers=headers))
            data = (data or b"") + (self.h11.send(h11.Data(data=response.body)) or b"")
            self.sock.sendall(data + (self.h11.send(h11.EndOfMessage()) or b""))

        def serve(self) -> None:
            try:
                while True:
                    event = self._event()
                    if not isinstance(event, h11.Request):
                        return
                    headers: dict[str, list[str]] = {}
                    for name, value in event.headers:
                        headers.setdefault(name.decode("ascii"), []).append(value.decode("latin-1"))
                    head = http_framing.RequestHead(
                        event.method.decode("ascii"),
                        event.target.decode("ascii"),
                        "HTTP/" + event.http_version.decode("ascii"),
                        headers,
                        self.peer,
                    )
                    refusal = self.app.admit(head)
                    lease = self.budget.open(self.peer) if refusal is None else None
                    body = bytearray()
                    while not isinstance(event := self._event(), h11.EndOfMessage):
                        if lease is not None and not lease.take(len(event.data)):
                            return
                        body += event.data
                    try:
                        if refusal is None:
                            assert lease is not None
                            refusal = self.app.respond(head, bytes(body), lease)
                        self._send(refusal)
                    finally:
                        if lease is not None:
                            lease.release()
                    self.h11.start_next_cycle()
            except (OSError, h11.ProtocolError):
                return
            finally:
                self.sock.close()

    http_framing._Connection = H11Connection  # type: ignore[assignment,misc]


def _serve(variant: str, pipe: Connection) -> None:
    if variant == "h11":
        _use_h11()
    server: HttpReceiver | HttpServer = (
        floor_server() if variant == "floor" else HttpReceiver(_ingest, Gate(max_in_flight=64), "127.0.0.1:0")
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
    parser.add_argument("--variant", action="append", choices=("framing", "h11", "floor"))
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
