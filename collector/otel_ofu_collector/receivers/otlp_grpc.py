"""OTLP MetricsService/Export over gRPC.

The method is registered with a generic handler and no request deserializer, so a malformed body
reaches our code as bytes and is answered INVALID_ARGUMENT rather than failing inside grpc.

The bearer token is checked by a server interceptor, on the call's metadata alone: grpc runs interceptors
when the call arrives, before a unary handler asks for its request message. A call without the token gets
a handler that takes its request as a stream it never reads and answers UNAUTHENTICATED at once, so an
unauthenticated client cannot make us buffer its (up to 128 MiB) body.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent import futures
from typing import TYPE_CHECKING, Any, ClassVar

import attrs
import grpc
from google.protobuf import duration_pb2
from google.protobuf.any_pb2 import Any as AnyProto
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]
from grpc_status import rpc_status
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from otel_ofu_collector.receivers.admission import MAX_REQUEST_BYTES, Gate
from otel_ofu_collector.receivers.auth import BearerAuth, TlsFiles
from otel_ofu_collector.receivers.base import Ingest

logger = logging.getLogger(__name__)

SERVICE_NAME = "opentelemetry.proto.collector.metrics.v1.MetricsService"
EXPORT_METHOD = f"/{SERVICE_NAME}/Export"
RETRY_INFO_TRAILER = "google.rpc.retryinfo-bin"
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


def _unauthenticated(_requests: object, context: grpc.ServicerContext) -> bytes:
    context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
    raise AssertionError("abort raises")  # pragma: no cover


_REFUSE_UNAUTHENTICATED = grpc.stream_unary_rpc_method_handler(_unauthenticated)


if TYPE_CHECKING:  # the stubs' classes are generic, grpc's own are not subscriptable
    _Interceptor = grpc.ServerInterceptor[Any, Any]
    _Handler = grpc.RpcMethodHandler[Any, Any]
else:
    _Interceptor = grpc.ServerInterceptor
    _Handler = grpc.RpcMethodHandler


@attrs.frozen
class BearerInterceptor(_Interceptor):
    """Refuses a call without the bearer token before its request is received (see the module's doc)."""

    auth: BearerAuth

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], _Handler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> _Handler | None:
        header = None
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "authorization" and isinstance(value, str):
                header = value
        if not self.auth.allows(header):
            return _REFUSE_UNAUTHENTICATED
        return continuation(handler_call_details)


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
    workers: int = 0  # 0: gate.max_in_flight + a few, so overload is seen by the gate, not queued in grpc
    port: int = 0
    _server: grpc.Server | None = None

    def start(self) -> int:
        # grpc's own limit sits above ours so that a too-large request is refused by us as
        # INVALID_ARGUMENT (permanent) instead of by grpc as RESOURCE_EXHAUSTED (which clients retry).
        options = [
            ("grpc.max_receive_message_length", 2 * self.max_request_bytes),
            ("grpc.max_send_message_length", 4 * 1024 * 1024),
            # Without this a second collector on the same port binds too (SO_REUSEPORT) and the two
            # split the traffic, each with half of every window.
            ("grpc.so_reuseport", 0),
        ]
        workers = self.workers or self.gate.max_in_flight + 4
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="otlp-grpc"),
            options=options,
            interceptors=[BearerInterceptor(self.auth)] if self.auth is not None else None,
        )
        handler = grpc.unary_unary_rpc_method_handler(self._export)  # bytes in, bytes out
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
            server.stop(None)
            raise OSError(f"cannot listen for OTLP/gRPC on {self.listen} (address in use or not available)")
        server.start()
        self._server = server
        self.port = port
        return port

    def stop(self, grace: float | None = None) -> None:
        if self._server is not None:
            self._server.stop(grace).wait()
            self._server = None

    def _refuse(self, context: grpc.ServicerContext, why: str) -> None:
        status, trailers = retry_trailers(
            grpc.StatusCode.UNAVAILABLE,
            "collector shutting down" if why == "shutdown" else "collector overloaded, retry later",
            self.gate.retry_after_s,
        )
        context.set_trailing_metadata(trailers)
        context.abort(status.code, status.details)

    def _export(self, raw: bytes, context: grpc.ServicerContext) -> bytes:
        # The bearer token was checked already, before the request was read (BearerInterceptor).
        why = self.gate.enter()
        if why is not None:
            self._refuse(context, why)
        try:
            if len(raw) > self.max_request_bytes:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"request of {len(raw)} bytes exceeds the {self.max_request_bytes}-byte limit",
                )
            try:
                request = ExportMetricsServiceRequest.FromString(raw)
            except (DecodeError, RuntimeError, ValueError) as error:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed ExportMetricsServiceRequest: {error}")
            if self.gate.closing:
                self._refuse(context, "shutdown")
            try:
                outcome = self.ingest(request, raw)
            except Exception:  # one bad request must not take the receiver down
                logger.exception("OTLP/gRPC request failed inside the collector")
                context.abort(grpc.StatusCode.INTERNAL, "internal error while processing the request")
        finally:
            self.gate.leave()
        if not outcome.rejected:
            return _ACCEPTED_WHOLE
        response = ExportMetricsServiceResponse()
        response.partial_success.rejected_data_points = outcome.rejected
        response.partial_success.error_message = outcome.error_message
        return response.SerializeToString()
