"""Splitting a serialized ExportMetricsServiceRequest into requests that each fit a size limit.

A downstream refuses a request over its limit (gRPC's default is 4 MiB: RESOURCE_EXHAUSTED, which no
retry cures), so a window of 50,000 jobs or a large foreign request passed through must go in pieces.
Pieces keep every data point exactly once, each under its own Resource, scope and metric (name,
description, unit, temporality), in the original order: a receiver sees the same data as one request.
Halving (resources, then scopes, then metrics, then data points) keeps the number of re-encodings at
about log2(size / limit) per point. A single data point larger than the limit cannot be split: it is
returned apart, for the caller to drop and count.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

# Room left under a downstream's limit for what the transport adds (gRPC framing, HTTP headers).
HEADROOM_BYTES = 64 * 1024
DEFAULT_MAX_EXPORT_BYTES = 4 * 1024 * 1024 - HEADROOM_BYTES

_POINT_KINDS = ("gauge", "sum", "histogram", "exponential_histogram", "summary")


def split_request(payload: bytes, max_bytes: int) -> tuple[list[bytes], int]:
    """``payload`` as requests of at most ``max_bytes`` each, and how many data points could not fit alone.

    A payload within the limit comes back as it is. One that does not parse is returned whole (the
    downstream, not this splitter, is the judge of it).
    """
    if len(payload) <= max_bytes:
        return [payload], 0
    try:
        request = ExportMetricsServiceRequest.FromString(payload)
    except DecodeError:
        return [payload], 0
    pieces: list[bytes] = []
    unfit = _split(request, max_bytes, pieces)
    return pieces, unfit


def _split(request: ExportMetricsServiceRequest, max_bytes: int, out: list[bytes]) -> int:
    if request.ByteSize() <= max_bytes:
        if request.resource_metrics:
            out.append(request.SerializeToString())
        return 0
    halves = _halve(request)
    if halves is None:  # one data point alone is over the limit
        return 1
    return sum(_split(half, max_bytes, out) for half in halves)


def _halve(request: ExportMetricsServiceRequest) -> tuple[ExportMetricsServiceRequest, ...] | None:
    """Two requests holding ``request``'s data between them, or None when it holds one data point."""
    resources = request.resource_metrics
    if len(resources) > 1:
        middle = len(resources) // 2
        return tuple(
            ExportMetricsServiceRequest(resource_metrics=part) for part in (resources[:middle], resources[middle:])
        )
    if not resources:
        return None
    rm = resources[0]
    if len(rm.scope_metrics) > 1:
        middle = len(rm.scope_metrics) // 2
        return tuple(_with_scopes(rm, part) for part in (rm.scope_metrics[:middle], rm.scope_metrics[middle:]))
    if not rm.scope_metrics:
        return None
    sm = rm.scope_metrics[0]
    if len(sm.metrics) > 1:
        middle = len(sm.metrics) // 2
        return tuple(_with_metrics(rm, sm, part) for part in (sm.metrics[:middle], sm.metrics[middle:]))
    if not sm.metrics:
        return None
    metric = sm.metrics[0]
    kind = metric.WhichOneof("data")
    if kind not in _POINT_KINDS:
        return None
    points = getattr(metric, kind).data_points
    if len(points) < 2:
        return None
    middle = len(points) // 2
    halves = []
    for part in (points[:middle], points[middle:]):
        copy = type(metric)()
        copy.CopyFrom(metric)
        target: Any = getattr(copy, kind).data_points
        del target[:]
        target.extend(part)
        halves.append(_with_metrics(rm, sm, [copy]))
    return tuple(halves)


def _with_scopes(rm: Any, scopes: Any) -> ExportMetricsServiceRequest:
    request = ExportMetricsServiceRequest()
    new_rm = request.resource_metrics.add()
    new_rm.resource.CopyFrom(rm.resource)
    new_rm.schema_url = rm.schema_url
    new_rm.scope_metrics.extend(scopes)
    return request


def _with_metrics(rm: Any, sm: Any, metrics: Any) -> ExportMetricsServiceRequest:
    request = ExportMetricsServiceRequest()
    new_rm = request.resource_metrics.add()
    new_rm.resource.CopyFrom(rm.resource)
    new_rm.schema_url = rm.schema_url
    new_sm = new_rm.scope_metrics.add()
    new_sm.scope.CopyFrom(sm.scope)
    new_sm.schema_url = sm.schema_url
    new_sm.metrics.extend(metrics)
    return request
