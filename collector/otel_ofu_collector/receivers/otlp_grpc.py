"""OTLP MetricsService/Export over gRPC.

The method is registered with a generic handler and no request deserializer, so a malformed body
reaches our code as bytes and is answered INVALID_ARGUMENT rather than failing inside grpc.

The server is grpc's asyncio server, on an event loop of its own: a call waits for its request message as a
coroutine, without a thread. With the thread-pool server every call held a worker while its message arrived,
and 68 streams sending their message a byte a second held every worker, good calls waiting without end. Here a
call must have its message within ``message_deadline_s`` (DEADLINE_EXCEEDED after), and only a call whose
message is in takes an admission gate slot and is decoded and aggregated on one of ``gate.max_in_flight`` threads,
so the loop keeps answering every other call meanwhile (an overload's UNAVAILABLE at once, while a window closes).
The hop to a thread and back costs about 100-200 us a request here, more than the work of a producer's 8-GPU
request (about 80 us): so a small uncompressed request (``INLINE_BYTES``) is processed on the loop's own thread
when ``inline_when`` says nothing is in its way (the service: the windows' lock is free). Only a flush that
takes the lock in the moment between can then hold the loop, for as long as that flush.

Messages come as sent, compressed or not (``grpc.per_message_decompression`` off): a gzip or deflate message is
inflated here, a piece at a time, within the body budget both receivers share (``admission``), so many small
bombs inflating at once cost that budget, not each the receive limit; one that inflates past the limit is
INVALID_ARGUMENT, one the budget cannot hold now UNAVAILABLE (retry). A compressed message is told apart by its
first bytes: a gzip member starts 1f 8b, a zlib stream with a valid header; neither is the start of an OTLP
request (whose first field is 1).

The bearer token is checked by a server interceptor, on the call's metadata alone: grpc runs interceptors
when the call arrives, before the handler asks for its request message. A call without the token gets
a handler that never reads its request and answers UNAUTHENTICATED at once, so an unauthenticated client
cannot make us buffer its (up to 128 MiB) body.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent import futures
from typing import TYPE_CHECKING, Any, ClassVar

import attrs
import grpc
from google.protobuf import duration_pb2
from google.protobuf.any_pb2 import Any as AnyProto
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]
from grpc_status import rpc_status
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)

from otel_ofu_collector.otlp.rejections import MalformedRequest
from otel_ofu_collector.receivers.admission import (
    MAX_REQUEST_BYTES,
    BodyBudget,
    BodyLease,
    Gate,
    OverBudget,
    TooLarge,
    inflate,
)
from otel_ofu_collector.receivers.auth import BearerAuth, TlsFiles
from otel_ofu_collector.receivers.base import INLINE_BYTES, Ingest
from otel_ofu_collector.receivers.http_framing import BODY_DEADLINE_S

logger = logging.getLogger(__name__)

SERVICE_NAME = "opentelemetry.proto.collector.metrics.v1.MetricsService"
EXPORT_METHOD = f"/{SERVICE_NAME}/Export"
RETRY_INFO_TRAILER = "google.rpc.retryinfo-bin"
# What a stop may take beyond its grace for grpc's own shutdown before it is left to the process's exit.
_STOP_MARGIN_S = 5.0

# The answer to a request taken whole, serialised once: most requests get it, and it is the same bytes each time.
_ACCEPTED_WHOLE = ExportMetricsServiceResponse().SerializeToString()


def retry_trailers(
    code: grpc.StatusCode, message: str, retry_after_s: float
) -> tuple[Any, tuple[tuple[str, bytes], ...]]:
    """The status and trailing metadata of a retryable refusal: RetryInfo both in the standard
    ``grpc-status-details-bin`` Status details and in the ``google.rpc.retryinfo-bin`` trailer
    (the one the OpenTelemetry SDK exporters read)."""
    seconds = int(retry_after_s)
    retry = error_details_pb2.RetryInfo(
        retry_delay=duration_pb2.Duration(seconds=seconds, nanos=int((retry_after_s - seconds) * 1e9))
    )
    detail = AnyProto()
    detail.Pack(retry)
    status = rpc_status.to_status(status_pb2.Status(code=code.value[0], message=message, details=[detail]))
    trailers = (*tuple(status.trailing_metadata), (RETRY_INFO_TRAILER, retry.SerializeToString()))
    return status, trailers


async def _unauthenticated(_requests: object, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
    raise AssertionError("abort raises")  # pragma: no cover


_REFUSE_UNAUTHENTICATED = grpc.stream_unary_rpc_method_handler(_unauthenticated)


if TYPE_CHECKING:  # the stubs' classes are generic, grpc's own are not subscriptable
    _Interceptor = grpc.aio.ServerInterceptor[Any, Any]
    _Handler = grpc.RpcMethodHandler[Any, Any]
    _Context = grpc.aio.ServicerContext[Any, Any]
else:
    _Interceptor = grpc.aio.ServerInterceptor
    _Handler = grpc.RpcMethodHandler
    _Context = grpc.aio.ServicerContext


@attrs.frozen
class BearerInterceptor(_Interceptor):
    """Refuses a call without the bearer token before its request is received (see the module's doc)."""

    auth: BearerAuth

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[_Handler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> _Handler:
        header = None
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "authorization" and isinstance(value, str):
                header = value
        if not self.auth.allows(header):
            return _REFUSE_UNAUTHENTICATED
        return await continuation(handler_call_details)


class _Refusal(Exception):
    """How a request's processing ends when it is not answered with a response: a status to abort with."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _peer_address(peer: str) -> str:
    """``ipv4:1.2.3.4:5678`` -> ``1.2.3.4``; ``ipv6:[::1]:5678`` -> ``::1`` (the body budget's key)."""
    address = peer.split(":", 1)[1] if ":" in peer else peer
    return address.rsplit(":", 1)[0] if not address.startswith("[") else address[1:].split("]", 1)[0]


_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"  # a zstd frame (grpc-go and the OpenTelemetry Collector can send them)


def _compression(message: bytes) -> str | None:
    """ "gzip" or "deflate" when the message is one (by its first bytes), else None."""
    if message[:2] == b"\x1f\x8b":
        return "gzip"
    if len(message) >= 2 and message[0] & 0x0F == 8 and message[0] >> 4 <= 7 and int.from_bytes(message[:2]) % 31 == 0:
        return "deflate"
    return None


async def _first(requests: AsyncIterator[bytes]) -> bytes | None:
    async for message in requests:
        return message
    return None


@attrs.define
class GrpcReceiver:
    """Serves Export on ``host:port`` (port 0 picks a free one; ``port`` tells which after ``start``)."""

    kind: ClassVar[str] = "grpc"
    ingest: Ingest
    gate: Gate
    listen: str = "0.0.0.0:4317"
    tls: TlsFiles | None = None
    auth: BearerAuth | None = None
    max_request_bytes: int = MAX_REQUEST_BYTES
    workers: int = 0  # threads that decode and aggregate; 0: gate.max_in_flight
    port: int = 0
    # The request message must be in this long after the call arrived (as an OTLP/HTTP body: --http-body-deadline).
    message_deadline_s: float = BODY_DEADLINE_S
    # The bytes of messages held and inflated (default: 4 x max_request_bytes, two per peer); the service gives both
    # receivers one.
    bodies: BodyBudget = attrs.field(
        default=attrs.Factory(
            lambda self: BodyBudget(max_bytes=4 * self.max_request_bytes, max_peer_bytes=2 * self.max_request_bytes),
            takes_self=True,
        )
    )
    # When it says so, a small uncompressed request is decoded and ingested on the loop's own thread (see the module's
    # doc): the service says so while the windows' lock is free. None: always on an ingest thread.
    inline_when: Callable[[], bool] | None = None
    _server: grpc.aio.Server | None = attrs.field(init=False, default=None)
    _loop: asyncio.AbstractEventLoop | None = attrs.field(init=False, default=None)
    _thread: threading.Thread | None = attrs.field(init=False, default=None)
    _pool: futures.ThreadPoolExecutor | None = attrs.field(init=False, default=None)
    # The calls waiting for their message now, by their deadline: a stop moves each deadline to now.
    _waiting: dict[asyncio.Timeout, asyncio.Task[Any]] = attrs.field(init=False, factory=dict)
    _stopping: bool = attrs.field(init=False, default=False)

    def start(self) -> int:
        self._stopping = False
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="otlp-grpc", daemon=True)
        thread.start()
        self._pool = futures.ThreadPoolExecutor(
            max_workers=self.workers or self.gate.max_in_flight, thread_name_prefix="otlp-grpc-ingest"
        )
        try:
            port = asyncio.run_coroutine_threadsafe(self._serve(), loop).result()
        except BaseException:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()
            self._pool.shutdown(wait=False)
            self._pool = None
            raise
        self._loop, self._thread = loop, thread
        self.port = port
        return port

    async def _serve(self) -> int:
        # grpc's own limit sits above ours so that a too-large request is refused by us as
        # INVALID_ARGUMENT (permanent) instead of by grpc as RESOURCE_EXHAUSTED (which clients retry).
        options = [
            ("grpc.max_receive_message_length", 2 * self.max_request_bytes),
            ("grpc.max_send_message_length", 4 * 1024 * 1024),
            # Without this a second collector on the same port binds too (SO_REUSEPORT) and the two
            # split the traffic, each with half of every window.
            ("grpc.so_reuseport", 0),
            # Messages as sent: inflated here, within the body budget (see the module's doc).
            ("grpc.per_message_decompression", 0),
        ]
        server = grpc.aio.server(
            options=options,
            interceptors=[BearerInterceptor(self.auth)] if self.auth is not None else None,
        )
        handler = grpc.stream_unary_rpc_method_handler(self._export)  # bytes in, bytes out
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, {"Export": handler}),))
        try:
            if self.tls is None:
                port = server.add_insecure_port(self.listen)
            else:
                cert, key, client_ca = self.tls.read()
                credentials = grpc.ssl_server_credentials(
                    [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
                )
                port = server.add_secure_port(self.listen, credentials)
        except RuntimeError:  # recent grpcio raises here on a busy port; older ones return 0
            port = 0
        if port == 0:
            await server.stop(None)
            raise OSError(f"cannot listen for OTLP/gRPC on {self.listen} (address in use or not available)")
        await server.start()
        self._server = server
        return port

    def stop(self, grace: float | None = None) -> None:
        """Stop serving within ``grace`` (None: at once) and a few seconds more for grpc's own shutdown: a stop that
        does not end by then is said in one line and left to the process's exit (the loop's thread is a daemon), so
        a collector told to stop always stops."""
        loop, server = self._loop, self._server
        stopped = True
        if loop is not None and server is not None:
            bound = (grace or 0.0) + _STOP_MARGIN_S
            try:
                asyncio.run_coroutine_threadsafe(self._stop(server, grace), loop).result(timeout=bound)
            except futures.TimeoutError:
                stopped = False
                logger.warning("the OTLP/gRPC receiver did not stop within %.0f s: leaving it to the exit", bound)
            loop.call_soon_threadsafe(loop.stop)
            if self._thread is not None:
                self._thread.join(timeout=_STOP_MARGIN_S)
                stopped = stopped and not self._thread.is_alive()
            if stopped:
                loop.close()
        self._loop = self._server = self._thread = None
        if self._pool is not None:
            self._pool.shutdown(wait=stopped, cancel_futures=not stopped)
            self._pool = None

    async def _stop(self, server: grpc.aio.Server, grace: float | None) -> None:
        """Stop serving, then end every call still waiting for its message (a stream whose message never came) by
        moving its deadline to now: it answers UNAVAILABLE, as any call refused at shutdown. Left pending, the loop's
        close would throw GeneratorExit into each; cancelled from here, grpc's own task around the call logs the
        CancelledError with a traceback (whichever of the two is cancelled first)."""
        await server.stop(grace)
        self._stopping = True
        now = asyncio.get_running_loop().time()
        calls = list(self._waiting.values())
        for deadline in list(self._waiting):
            deadline.reschedule(now)
        if calls:
            await asyncio.wait(calls)
        # grpc's tasks around those calls end on the loop's next turns.
        others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        if others:
            await asyncio.wait(others, timeout=1.0)

    def _retry_status(self, why: str) -> tuple[Any, tuple[tuple[str, bytes], ...]]:
        return retry_trailers(
            grpc.StatusCode.UNAVAILABLE,
            "collector shutting down" if why == "shutdown" else "collector overloaded, retry later",
            self.gate.retry_after_s,
        )

    async def _refuse(self, context: _Context, why: str) -> None:
        status, trailers = self._retry_status(why)
        await context.abort(status.code, status.details, trailers)

    async def _export(self, requests: AsyncIterator[bytes], context: _Context) -> bytes:
        # The bearer token was checked already, before the request was read (BearerInterceptor).
        if self.gate.closing or self._stopping:
            self.gate.count_refusal("shutdown")
            await self._refuse(context, "shutdown")
        lease = self.bodies.open(_peer_address(context.peer()))
        if lease is None:
            self.gate.count_refusal("overload")
            await self._refuse(context, "overload")
        assert lease is not None
        try:
            try:
                async with asyncio.timeout(self.message_deadline_s) as deadline:  # no task of its own, unlike wait_for
                    call = asyncio.current_task()
                    assert call is not None
                    self._waiting[deadline] = call
                    try:
                        raw = await _first(requests)
                    finally:
                        del self._waiting[deadline]
            except TimeoutError:
                if self._stopping:
                    self.gate.count_refusal("shutdown")
                    await self._refuse(context, "shutdown")
                await context.abort(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"request message not received within {self.message_deadline_s:g} s",
                )
            if raw is None:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no request message")
            assert raw is not None
            if len(raw) > self.max_request_bytes:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"request of {len(raw)} bytes exceeds the {self.max_request_bytes}-byte limit",
                )
            if not lease.take(len(raw)):
                self.gate.count_refusal("overload")
                await self._refuse(context, "overload")
            why = self.gate.enter()
            if why is not None:
                await self._refuse(context, why)
            try:
                if (
                    len(raw) <= INLINE_BYTES
                    and self.inline_when is not None
                    and _compression(raw) is None
                    and (self.inline_when())
                ):
                    outcome = self._process(raw, lease)  # a node's request, nothing to wait on: no hop to a thread
                else:
                    outcome = await asyncio.get_running_loop().run_in_executor(self._pool, self._process, raw, lease)
            finally:
                self.gate.leave()
        finally:
            lease.release()
        if isinstance(outcome, _Refusal):
            if outcome.code == grpc.StatusCode.UNAVAILABLE:
                await self._refuse(context, outcome.message)
            await context.abort(outcome.code, outcome.message)
        if not outcome.rejected:
            return _ACCEPTED_WHOLE
        response = ExportMetricsServiceResponse()
        response.partial_success.rejected_data_points = outcome.rejected
        response.partial_success.error_message = outcome.error_message
        return response.SerializeToString()

    def _process(self, raw: bytes, lease: BodyLease) -> Any:
        """Inflate, parse and ingest one message, on an ingest thread: the outcome, or the ``_Refusal`` to answer."""
        compression = _compression(raw)
        if compression is not None:
            try:
                raw = inflate(raw, gzip=compression == "gzip", limit=self.max_request_bytes, lease=lease)
            except TooLarge:
                return _Refusal(
                    grpc.StatusCode.INVALID_ARGUMENT, f"request inflates past the {self.max_request_bytes}-byte limit"
                )
            except OverBudget:
                self.gate.count_refusal("overload")
                return _Refusal(grpc.StatusCode.UNAVAILABLE, "overload")
            except (zlib.error, EOFError) as error:
                if compression == "gzip":
                    return _Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"bad gzip message: {error}")
                # Not a zlib stream after all: its bytes are the request (an unknown first field is legal).
        if self.gate.closing:
            return _Refusal(grpc.StatusCode.UNAVAILABLE, "shutdown")
        try:
            return self.ingest(raw)
        except MalformedRequest as error:
            if raw[:4] == _ZSTD_MAGIC:
                return _Refusal(grpc.StatusCode.UNIMPLEMENTED, "zstd compression is not supported: use gzip")
            return _Refusal(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        except Exception:  # one bad request must not take the receiver down
            logger.exception("OTLP/gRPC request failed inside the collector")
            return _Refusal(grpc.StatusCode.INTERNAL, "internal error while processing the request")
