"""A ResourceMetrics' identity as the collector keys it, read once per Resource and cached by its encoding.

Producers send the same Resource every interval, so a Resource's identity (its identity attributes), stream key
and profile are cached under the Resource's exact encoding. That encoding comes from re-reading the request's
bytes with a schema in which ``ResourceMetrics.resource`` is a ``bytes`` field (a message and a bytes field share
the wire format): one C-level pass that decodes nothing else. Serialising and digesting every Resource again, the
key before, cost about a fifth of the ingest time. The same view holds each ScopeMetrics' bytes as sent, which
is what a layout's template reads (``otlp.shapes``).
"""

from __future__ import annotations

from collections.abc import Mapping
from hashlib import blake2b
from typing import Any

import attrs
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from otel_ofu import names
from otel_ofu.control_chars import has_control
from otel_ofu_collector.otlp.rejections import MalformedRequest

IDENTITY = frozenset(names.IDENTITY_ATTRIBUTES)
EMPTY: Mapping[str, str] = {}
# The resource cache keys a Resource by its encoding up to this size (the producer's are about 250 bytes), a
# longer one by a 128-bit digest of it: a key never holds more than this, and no collision is realistic.
_INLINE_KEY_BYTES = 384


@attrs.define(slots=True)
class ResourceEntry:
    """A Resource's cached reading: its identity, its stream key (None without hw.id), the sink's profile of it,
    why its identity is refused (an identity value over the length limit or holding a control character, in words;
    None: it is not), the layout its metrics came in (an ``otlp.shapes.Shape``;
    None: none yet, or none a template can read), and how many layouts were built for it since one was last read
    through (a Resource whose layout changes every interval is read point by point, not scanned every interval)."""

    identity: Mapping[str, str]
    stream_key: str | None
    profile: Any
    unusable: str | None
    shape: Any = None
    builds: int = 0


def _resource_bytes_request_class() -> type[Message]:
    """ExportMetricsServiceRequest with each ResourceMetrics' fields as raw bytes, the Resource's among them.

    Field numbers are OTLP's (request.resource_metrics = 1; ResourceMetrics: resource = 1, scope_metrics = 2,
    schema_url = 3). Every field of ResourceMetrics is declared, so that re-encoding this view is as long as
    the input exactly when the parse dropped nothing (see ``resource_views``).
    """
    field = descriptor_pb2.FieldDescriptorProto
    package = "otel_ofu_collector.resource_bytes"
    proto = descriptor_pb2.FileDescriptorProto(name="otel_ofu_collector/resource_bytes.proto", package=package)
    proto.syntax = "proto3"
    resource_metrics = proto.message_type.add(name="ResourceMetrics")
    resource_metrics.field.add(name="resource", number=1, type=field.TYPE_BYTES, label=field.LABEL_OPTIONAL)
    resource_metrics.field.add(name="scope_metrics", number=2, type=field.TYPE_BYTES, label=field.LABEL_REPEATED)
    resource_metrics.field.add(name="schema_url", number=3, type=field.TYPE_BYTES, label=field.LABEL_OPTIONAL)
    request = proto.message_type.add(name="Request")
    request.field.add(
        name="resource_metrics",
        number=1,
        type=field.TYPE_MESSAGE,
        label=field.LABEL_REPEATED,
        type_name=f".{package}.ResourceMetrics",
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.Request"))


_ResourceBytesRequest: Any = _resource_bytes_request_class()


def resource_views(request: ExportMetricsServiceRequest, raw: bytes | None) -> list[Any]:
    """Each ResourceMetrics with its fields as sent, in order: ``.resource`` the Resource's complete encoding (what
    its identity is cached under) and ``.scope_metrics`` each ScopeMetrics' (what its template is read from).

    ``raw`` must be ``request``'s own bytes (both receivers pass the bytes they parsed): read as bytes
    fields, each Resource comes out as sent. A field sent twice is merged by the real parser but only its
    last copy survives here, so the view must re-encode to exactly ``len(raw)`` bytes: re-encoding never
    grows (minimal tags and lengths, unknown fields verbatim), and any dropped copy would shrink it. Else
    (a Resource sent in pieces, a non-minimal encoding, no ``raw``) the request is serialised here, where
    each Resource is one canonical encoding of the merged message.
    """
    if raw is not None:
        found = views_as_sent(raw)
        if found is not None and len(found) == len(request.resource_metrics):
            return found
    return list(_ResourceBytesRequest.FromString(request.SerializeToString()).resource_metrics)


def parse_request(raw: bytes) -> ExportMetricsServiceRequest:
    """``raw`` parsed; MalformedRequest, in one line, when it is not an ExportMetricsServiceRequest."""
    try:
        return ExportMetricsServiceRequest.FromString(raw)
    except (DecodeError, RuntimeError, ValueError) as error:
        raise MalformedRequest(f"malformed ExportMetricsServiceRequest: {error}") from error


def views_as_sent(raw: bytes) -> list[Any] | None:
    """Each ResourceMetrics of the request ``raw`` encodes, its fields as sent (see ``resource_views``); None when the
    bytes are not that request's one minimal encoding, or not a request."""
    try:
        view = _ResourceBytesRequest.FromString(raw)
    except DecodeError:
        return None
    if view.ByteSize() != len(raw):
        return None
    return list(view.resource_metrics)


def cache_key(encoding: bytes) -> bytes:
    """What a Resource is cached under: its encoding, or a 128-bit digest of a long one."""
    return encoding if len(encoding) <= _INLINE_KEY_BYTES else blake2b(encoding, digest_size=16).digest()


def any_value_text(value: Any) -> str | None:
    """An AnyValue as the string our identity uses; None for kinds identity cannot be (arrays, maps, bytes)."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        text: str = value.string_value
        return text
    if kind == "int_value":
        return str(value.int_value)
    if kind == "double_value":
        number: float = value.double_value
        return str(int(number)) if number.is_integer() else repr(number)
    if kind == "bool_value":
        return "true" if value.bool_value else "false"
    return None


def identity_of(attributes: Any, base: Mapping[str, str]) -> Mapping[str, str]:
    """``base`` overlaid with the identity attributes among ``attributes`` (data point wins over resource)."""
    found: dict[str, str] | None = None
    for kv in attributes:
        key = kv.key
        if key in IDENTITY:
            value = kv.value
            # Identity is nearly always a string: read it straight, and ask for the kind only when it is not.
            text = value.string_value or any_value_text(value)
            if not text:
                continue
            if found is None:
                found = dict(base)
            found[key] = text
    return base if found is None else found


def unusable(identity: Mapping[str, str], limit: int) -> str | None:
    """Why an identity is refused, in the words after a metric's name, or None: a value longer than ``limit``
    characters (it would be copied into every output of its job), or one holding a control character (a terminal
    showing it would obey it: ``control_chars``)."""
    for value in identity.values():
        if len(value) > limit:
            return f"with an attribute value longer than {limit} characters"
        if has_control(value):
            return "with a control character in an identity attribute value"
    return None


def stream_key(identity: Mapping[str, str]) -> str | None:
    """One GPU (or MIG instance) on one host: ``host|hw.id[|mig]``; None without ``hw.id``."""
    hw_id = identity.get(names.HW_ID)
    if not hw_id:
        return None
    mig = identity.get(names.GPU_MIG_INSTANCE_ID)
    host = identity.get(names.HOST_NAME, "")
    return f"{host}|{hw_id}|{mig}" if mig else f"{host}|{hw_id}"


def entry_bytes(key: bytes, identity: Mapping[str, str]) -> int:
    """What a cache entry costs, roughly: its key and identity values plus a fixed part for the entry itself
    (measured about 1.3 KB with its dict and tuples); what the state bound in bytes counts."""
    return 1300 + len(key) + sum(len(k) + len(v) for k, v in identity.items())
