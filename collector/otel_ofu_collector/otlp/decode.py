"""OTLP ExportMetricsServiceRequest -> aggregator calls, plus the untouched rest for pass-through.

This is the collector's hot loop: every received data point goes through ``Decoder.decode`` once. It
reads protobuf fields directly, resolves identity once per ResourceMetrics, and builds a new identity
mapping only for points that carry identity attributes of their own.

Producers send the same Resource every interval, so a Resource's identity is cached under its exact
encoding. That encoding comes from re-reading the request's bytes with a schema in which
``ResourceMetrics.resource`` is a ``bytes`` field (a message and a bytes field share the wire format):
one C-level pass that decodes nothing else. Serialising and digesting every Resource again, the key
before, cost about a fifth of the ingest time.

The same view holds each ScopeMetrics' bytes as sent. Producers send their metrics in the same layout every
interval, so once a layout's shape is known (``_Shape``: a ``templates.Template`` and what each of its points
is), a Resource whose bytes fit it is read with one ``struct`` call instead of a walk through a protobuf
object per metric and point, which was most of the ingest time (about 1.5 us per metric to reach a value).
Any point the template path would refuse sends the Resource to the point-by-point read, which gives every
refusal its reason; the two take the same points (``tests/test_collector_decode_shapes.py``).
"""

from __future__ import annotations

import math
import struct
import threading
from collections.abc import Callable, Mapping
from hashlib import blake2b
from typing import Any, Protocol, cast

import attrs
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from otel_ofu import names
from otel_ofu_collector.otlp import partials, templates
from otel_ofu_collector.results import PartialWindow

_OFU = names.GPU_OFU.name
_MFU = names.JOB_MFU.name
_HW_ID = names.HW_ID
_HOST = names.HOST_NAME
_MIG = names.GPU_MIG_INSTANCE_ID
_JOB_ID = names.JOB_ID
_IDENTITY = frozenset(names.IDENTITY_ATTRIBUTES)
_THROTTLE = names.GPU_THROTTLE.name
_THROTTLE_REASON = names.GPU_THROTTLE_REASON
_THROTTLE_REASONS = frozenset(names.ThrottleReason.ALL)
# The per-GPU inputs of the loss split (what ``Aggregator.add_gpu_input`` takes), beside gpu.ofu.
GPU_INPUT_NAMES: frozenset[str] = frozenset(spec.name for spec in names.LOSS_SPLIT_INPUTS)

# Everything the producer and the MFU reporter send us: consumed here, forwarded only on request.
INPUT_METRIC_NAMES: frozenset[str] = frozenset({spec.name for spec in names.PRODUCER_METRICS} | {_MFU})

# What the decoder does with each of those, by name (one lookup per metric): aggregate it as gpu.ofu, job.mfu or
# a loss input, or only consume it. A name not here is foreign (forwarded on pass-through).
_CONSUMED, _OFU_ROLE, _MFU_ROLE, _INPUT = range(4)
_ROLES: dict[str, int] = {
    **dict.fromkeys(INPUT_METRIC_NAMES, _CONSUMED),
    **dict.fromkeys(GPU_INPUT_NAMES, _INPUT),
    _OFU: _OFU_ROLE,
    _MFU: _MFU_ROLE,
}
# For a sink that does not take the loss inputs: they are consumed only.
_ROLES_WITHOUT_INPUTS: dict[str, int] = {**_ROLES, **dict.fromkeys(GPU_INPUT_NAMES, _CONSUMED)}

# The resource cache keys a Resource by its encoding up to this size (the producer's are about 250 bytes),
# a longer one by a 128-bit digest of it: a key never holds more than this, and no collision is realistic.
_INLINE_KEY_BYTES = 384

# The same bound the MFU reporter applies: one vocabulary, so a value one side takes the other does not drop.
DEFAULT_MAX_MFU = names.MFU_MAX
# The longest identity attribute value (job.id, host.name, ...) taken, in characters. Real ones are tens of
# characters; a megabyte one would be copied into every output of its job and could make a window too large
# for any downstream. Over it the point is rejected (counted by reason), never silently truncated.
DEFAULT_MAX_ATTRIBUTE_LENGTH = 4096
_EMPTY: Mapping[str, str] = {}


class PointSink(Protocol):
    """The aggregator's ingest surface (``Aggregator`` in process and shard mode)."""

    def add_ofu(
        self, stream_key: str, value: float, start_ns: int, end_ns: int, identity: Mapping[str, str]
    ) -> bool: ...

    def add_mfu(self, job_id: str, value: float, time_ns: int, identity: Mapping[str, str]) -> bool: ...


class _GpuInputAdd(Protocol):
    """``Aggregator.add_gpu_inputs``: a GPU stream's loss inputs of one interval."""

    def __call__(
        self,
        stream_key: str,
        start_ns: int,
        end_ns: int,
        identity: Mapping[str, str],
        values: Mapping[str, float],
        throttle: Mapping[str, float],
    ) -> bool: ...


# A Resource's loss inputs, grouped by (stream key, start, end): (identity, values by metric, throttle by reason)
# per group; a metric sent twice for one interval opens another group, so each point counts as sent.
_Group = tuple[Mapping[str, str], dict[str, float], dict[str, float]]
_Batch = dict[tuple[str, int, int], list[_Group]]


@attrs.frozen
class _Shape:
    """A producer layout of ScopeMetrics (shared by every Resource that sends it): its template, and per point
    read through it (role, field, is gpu.throttle, index of its start time or None, of its time, of its value)."""

    template: templates.Template
    plan: tuple[tuple[int, str, bool, int | None, int, int], ...]


# A Resource's cached reading: identity, stream key (None without hw.id), profile, whether any identity value is
# over the length limit, the shape its metrics came in (None: none yet, or none that a template can read), and
# how many shapes were built for it since one was last read through (at most _MAX_SHAPE_BUILDS: a Resource whose
# layout changes every interval is read point by point, not scanned again every interval).
_Resource = tuple[Mapping[str, str], str | None, Any, bool, _Shape | None, int]
_MAX_SHAPE_BUILDS = 3
# Layouts kept to share (real fleets send a handful): lengths, and layouts of one length tried per Resource.
_MAX_LAYOUT_LENGTHS = 256
_MAX_LAYOUTS_PER_LENGTH = 4


class _ProfilingAdd(Protocol):
    """``Aggregator.add_ofu`` with the profile derived once per Resource (see ``Aggregator.profile_of``)."""

    def __call__(
        self,
        stream_key: str,
        value: float,
        start_ns: int,
        end_ns: int,
        identity: Mapping[str, str],
        profile: Any = None,
    ) -> bool: ...


class PartialSink(Protocol):
    """The merge tier's ingest surface (``MergeAggregator``)."""

    def add_partial(self, partial: PartialWindow) -> bool: ...


@attrs.frozen
class DecodeOutcome:
    """What one request did: points taken, points rejected (with why), and what to forward untouched."""

    accepted: int
    rejected: int
    error_message: str
    forward: bytes | None  # a serialized ExportMetricsServiceRequest for the downstream, or None


def _resource_bytes_request_class() -> type[Message]:
    """ExportMetricsServiceRequest with each ResourceMetrics' fields as raw bytes, the Resource's among them.

    Field numbers are OTLP's (request.resource_metrics = 1; ResourceMetrics: resource = 1, scope_metrics = 2,
    schema_url = 3). Every field of ResourceMetrics is declared, so that re-encoding this view is as long as
    the input exactly when the parse dropped nothing (see ``resource_encodings``).
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
        try:
            view = _ResourceBytesRequest.FromString(raw)
        except DecodeError:
            view = None
        if view is not None and view.ByteSize() == len(raw):
            found: list[Any] = list(view.resource_metrics)
            if len(found) == len(request.resource_metrics):
                return found
    return list(_ResourceBytesRequest.FromString(request.SerializeToString()).resource_metrics)


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


def _identity_of(attributes: Any, base: Mapping[str, str]) -> Mapping[str, str]:
    """``base`` overlaid with the identity attributes among ``attributes`` (data point wins over resource)."""
    found: dict[str, str] | None = None
    for kv in attributes:
        key = kv.key
        if key in _IDENTITY:
            value = kv.value
            # Identity is nearly always a string: read it straight, and ask for the kind only when it is not.
            text = value.string_value or any_value_text(value)
            if not text:
                continue
            if found is None:
                found = dict(base)
            found[key] = text
    return base if found is None else found


def _overlong(identity: Mapping[str, str], limit: int) -> bool:
    """Whether any identity value is longer than ``limit`` characters."""
    return any(len(value) > limit for value in identity.values())


def stream_key(identity: Mapping[str, str]) -> str | None:
    """One GPU (or MIG instance) on one host: ``host|hw.id[|mig]``; None without ``hw.id``."""
    hw_id = identity.get(_HW_ID)
    if not hw_id:
        return None
    mig = identity.get(_MIG)
    host = identity.get(_HOST, "")
    return f"{host}|{hw_id}|{mig}" if mig else f"{host}|{hw_id}"


def _number(point: Any) -> float | None:
    kind = point.WhichOneof("value")
    if kind == "as_double":
        number: float = point.as_double
        return number
    if kind == "as_int":
        return float(point.as_int)
    return None


class _Rejections:
    """Counts rejected points by reason, for partial_success and the self-metrics."""

    __slots__ = ("by_reason", "total")

    def __init__(self) -> None:
        self.total = 0
        self.by_reason: dict[str, int] = {}

    def add(self, reason: str, count: int = 1) -> None:
        self.total += count
        self.by_reason[reason] = self.by_reason.get(reason, 0) + count

    def message(self) -> str:
        if not self.total:
            return ""
        parts = "; ".join(f"{count} {reason}" for reason, count in sorted(self.by_reason.items()))
        return f"rejected {self.total} data point(s): {parts}"


@attrs.define
class DecoderStats:
    """Running totals over every request, read by the self-metrics."""

    accepted: int = 0
    rejected: int = 0
    rejected_by_reason: dict[str, int] = attrs.field(factory=dict)
    forwarded_requests: int = 0
    shaped_resources: int = 0  # ResourceMetrics read through their layout's template (see ``_Shape``)


@attrs.define
class Decoder:
    """Routes the points of a request into the aggregator and keeps what is not ours for pass-through.

    Receivers call ``decode`` from many threads: ``lock`` guards the sink (not thread-safe), the resource
    cache and the stats. It is taken only once a request's parsing is done and its first point is due
    for the sink. In merge mode ``sink`` is None and ``partial_sink`` takes the shards' partial state, read
    with ``otlp.partials``; the shards' own fleet gauges (``partials.is_merge_recomputed_metric``) are
    dropped, since the merge tier emits fleet-wide ones.
    """

    sink: PointSink | None
    lock: threading.Lock = attrs.field(factory=threading.Lock)
    pass_through: bool = True
    forward_inputs: bool = False
    max_mfu: float = DEFAULT_MAX_MFU
    partial_sink: PartialSink | None = None  # merge mode (with sink None): takes the shards' partial windows
    stats: DecoderStats = attrs.field(factory=DecoderStats)
    # Windows close by the collector's clock, so a point stamped far ahead cannot close anything early; but it
    # would open a window that sits in state until the clock gets there (then reports one stray GPU), and lift
    # the data watermark that keeps eviction from outrunning data that lags the clock. Points later than
    # clock() + max_future_ns are rejected. None: no such check.
    clock: Callable[[], int] | None = None
    max_future_ns: int | None = None
    max_attribute_length: int = DEFAULT_MAX_ATTRIBUTE_LENGTH
    # Producers send the same Resource every interval: its identity, stream key and profile are looked up by
    # the Resource's encoding instead of re-reading its attributes. Entries (about 1.3 KB each) outlive their
    # Resources as jobs come and go, and some Resources carry no accepted point at all: the cache is cleared
    # when it outgrows twice the sink's live streams and jobs plus 1024, and at ``resource_cache_size``.
    resource_cache_size: int = 262_144
    _resource_cache: dict[bytes, _Resource] = attrs.field(factory=dict)
    _cache_limit: int = 0  # the cache bound last read (see ``_resource_identity``)
    # Read each Resource's points through the template of its layout once one is known (``otlp.templates``).
    # False: always point by point (tests compare the two).
    read_through_shapes: bool = True
    # The shapes learnt, by the length of their ScopeMetrics: any Resource whose bytes fit one is read through it.
    _layouts: dict[int, list[_Shape]] = attrs.field(factory=dict)

    @property
    def cached_resources(self) -> int:
        """Resources in the identity cache now."""
        return len(self._resource_cache)

    def _ours(self, name: str) -> bool:
        if self.sink is None:
            return partials.is_partial_metric(name) or partials.is_merge_recomputed_metric(name)
        return name in INPUT_METRIC_NAMES

    def decode(self, request: ExportMetricsServiceRequest, raw: bytes | None = None) -> DecodeOutcome:
        rejections = _Rejections()
        if self.sink is not None:
            accepted, any_ours, any_foreign = self._ingest_points(request, raw, rejections)
        else:
            accepted, any_ours, any_foreign = self._ingest_partials(request, rejections)
        forward = self._forward(request, raw, any_ours, any_foreign)
        stats = self.stats
        with self.lock:
            stats.accepted += accepted
            stats.rejected += rejections.total
            for reason, count in rejections.by_reason.items():
                stats.rejected_by_reason[reason] = stats.rejected_by_reason.get(reason, 0) + count
            if forward is not None:
                stats.forwarded_requests += 1
        return DecodeOutcome(accepted, rejections.total, rejections.message(), forward)

    def _ingest_points(
        self, request: ExportMetricsServiceRequest, raw: bytes | None, rejections: _Rejections
    ) -> tuple[int, bool, bool]:
        sink = self.sink
        assert sink is not None
        # A sink that can take each Resource's profile once (the Aggregator) gets it with every point.
        profile_of: Callable[[Mapping[str, str]], Any] | None = getattr(sink, "profile_of", None)
        add_ofu = _without_profile(sink) if profile_of is None else cast(_ProfilingAdd, sink.add_ofu)
        add_mfu = sink.add_mfu
        # A sink that takes the loss inputs (the Aggregator) gets them; another only consumes them.
        add_gpu_inputs: _GpuInputAdd | None = getattr(sink, "add_gpu_inputs", None)
        roles = _ROLES if add_gpu_inputs is not None else _ROLES_WITHOUT_INPUTS
        max_mfu = self.max_mfu
        accepted = 0
        any_ours = False
        any_foreign = False
        latest = 2**64  # beyond any uint64 timestamp
        if self.clock is not None and self.max_future_ns is not None:
            latest = self.clock() + self.max_future_ns
        cache = self._resource_cache
        max_length = self.max_attribute_length
        overlong_reason = f"attribute value longer than {max_length} characters"
        views: list[Any] | None = None  # read once, when the first of our points needs identity
        lock = self.lock
        locked = False  # taken with the views: nothing before the first point needing them touches shared state
        use_shapes = self.read_through_shapes
        layouts = self._layouts
        try:
            for index, rm in enumerate(request.resource_metrics):
                resource: _Resource | None = None
                cache_key: bytes | None = None
                shape_missed = False  # a shape was tried and the bytes were not its layout
                if use_shapes and layouts:
                    # Known layouts exist: look the Resource up before walking its metrics, to read them
                    # through a template when the bytes fit its shape, or another Resource's (a fleet's GPUs
                    # send one layout, so a GPU seen the first time is read through it too).
                    if views is None:
                        views = resource_views(request, raw)  # a parse, outside the lock
                        lock.acquire()
                        locked = True
                    view = views[index]
                    cache_key = _cache_key(view.resource)
                    resource = cache.get(cache_key)
                    if resource is None:
                        resource = self._resource_identity(rm, cache_key, profile_of)
                    scopes = view.scope_metrics
                    if len(scopes) == 1 and resource[1] is not None and not resource[3]:
                        data = scopes[0]
                        shape = resource[4]
                        numbers = None if shape is None else shape.template.read(data)
                        if numbers is None:
                            shape_missed = shape is not None
                            for shape in layouts.get(len(data), ()):
                                numbers = shape.template.read(data)
                                if numbers is not None:
                                    break
                        if numbers is not None:
                            assert shape is not None
                            taken = _through_shape(
                                resource, shape.plan, numbers, latest, add_ofu, add_gpu_inputs, rejections, sink
                            )
                            if taken is not None:
                                accepted += taken
                                any_ours = True
                                self.stats.shaped_resources += 1  # under the lock, taken with the views
                                if shape is not resource[4] or resource[5]:
                                    # A shape read through: the Resource's from now, with a fresh build budget.
                                    cache[cache_key] = (*resource[:4], shape, 0)
                                continue
                resource_identity: Mapping[str, str] = _EMPTY
                resource_key: str | None = None
                resource_profile: Any = None
                # The Resource's loss inputs, taken in one call per GPU interval once the Resource is read.
                # ``group`` is the last group of ``batch`` touched, under (group_key, group_start, group_end):
                # the producer sends all of an interval's inputs under one identity, so nearly every point
                # lands in it without a lookup of ``batch``.
                batch: _Batch | None = None
                group: _Group | None = None
                group_key: str | None = None
                group_start = group_end = 0
                for sm in rm.scope_metrics:
                    for metric in sm.metrics:
                        name = metric.name
                        role = roles.get(name)
                        if role is None:
                            any_foreign = True
                            continue
                        any_ours = True
                        if role == _CONSUMED:
                            continue  # other producer metrics: consumed, nothing to aggregate
                        # Reading an unset gauge gives an empty default: ask for the kind only when no gauge points.
                        points = metric.gauge.data_points
                        if not points:
                            kind = metric.WhichOneof("data")
                            if kind == "sum":
                                points = metric.sum.data_points
                            elif kind != "gauge":
                                if kind is not None:
                                    count = len(getattr(metric, kind).data_points)
                                    rejections.add(f"{name} not a gauge ({kind})", count)
                                continue
                        if resource is None:
                            if views is None:
                                views = resource_views(request, raw)  # a parse, outside the lock
                                lock.acquire()
                                locked = True
                            cache_key = _cache_key(views[index].resource)
                            resource = cache.get(cache_key)
                            if resource is None:
                                resource = self._resource_identity(rm, cache_key, profile_of)
                        resource_identity, resource_key, resource_profile = resource[0], resource[1], resource[2]
                        if resource[3]:
                            rejections.add(f"{name} {overlong_reason}", len(points))
                            continue
                        if role == _OFU_ROLE:
                            for point in points:
                                # as_double reads 0.0 when unset or when the value is as_int: only then ask which.
                                value = point.as_double or _number(point)
                                if value is None or not 0.0 <= value <= 1.0:  # NaN fails both comparisons
                                    rejections.add("gpu.ofu not finite or outside [0, 1]")
                                    continue
                                attributes = point.attributes
                                identity = resource_identity
                                key = resource_key
                                profile = resource_profile
                                if attributes:
                                    identity = _identity_of(attributes, resource_identity)
                                    if identity is not resource_identity:
                                        if _overlong(identity, max_length):
                                            rejections.add(f"gpu.ofu {overlong_reason}")
                                            continue
                                        key = stream_key(identity)
                                        profile = None
                                if key is None:
                                    rejections.add("gpu.ofu without hw.id")
                                    continue
                                end_ns = point.time_unix_nano
                                if not end_ns or end_ns > latest:
                                    rejections.add("gpu.ofu without a timestamp or stamped in the future")
                                    continue
                                if add_ofu(key, value, point.start_time_unix_nano or end_ns, end_ns, identity, profile):
                                    accepted += 1
                                else:
                                    rejections.add(_refused("gpu.ofu", sink))
                        elif role == _INPUT:
                            throttle = name == _THROTTLE
                            for point in points:
                                value = point.as_double or _number(point)
                                if value is None or not 0.0 <= value < math.inf:  # NaN fails both comparisons
                                    rejections.add(f"{name} not finite or negative")
                                    continue
                                if throttle and value == 0.0:
                                    # The windows average throttle shares over the GPU's OFU time, so a reason
                                    # absent from an interval reads as 0 for it: taken, nothing to add.
                                    accepted += 1
                                    continue
                                identity = resource_identity
                                key = resource_key
                                field = name
                                attributes = point.attributes
                                if attributes:
                                    found = _input_identity(name, throttle, attributes, resource_identity, resource_key)
                                    if isinstance(found, str):
                                        rejections.add(found)
                                        continue
                                    identity, key, field = found
                                    if identity is not resource_identity and _overlong(identity, max_length):
                                        rejections.add(f"{name} {overlong_reason}")
                                        continue
                                elif throttle:
                                    rejections.add(f"{name} without a known {_THROTTLE_REASON}")
                                    continue
                                if key is None:
                                    rejections.add(f"{name} without hw.id")
                                    continue
                                end_ns = point.time_unix_nano
                                if not end_ns or end_ns > latest:
                                    rejections.add(f"{name} without a timestamp or stamped in the future")
                                    continue
                                start_ns = point.start_time_unix_nano or end_ns
                                accepted += 1
                                # A metric sent twice for one interval (or another identity) opens a new group,
                                # so that each point counts as sent.
                                if (
                                    group is not None
                                    and end_ns == group_end
                                    and start_ns == group_start
                                    and key == group_key
                                    and identity is group[0]
                                ):
                                    target = group[2] if throttle else group[1]
                                    if field not in target:
                                        target[field] = value
                                        continue
                                if batch is None:
                                    batch = {}
                                groups = batch.setdefault((key, start_ns, end_ns), [])
                                group = groups[-1] if groups else None
                                if (
                                    group is None
                                    or group[0] is not identity
                                    or field in (group[2] if throttle else group[1])
                                ):
                                    group = (identity, {}, {})
                                    groups.append(group)
                                (group[2] if throttle else group[1])[field] = value
                                group_key, group_start, group_end = key, start_ns, end_ns
                        else:
                            for point in points:
                                value = _number(point)
                                if value is None or not 0.0 <= value <= max_mfu:
                                    rejections.add(f"job.mfu not finite or outside [0, {max_mfu:g}]")
                                    continue
                                attributes = point.attributes
                                identity = (
                                    _identity_of(attributes, resource_identity) if attributes else resource_identity
                                )
                                if identity is not resource_identity and _overlong(identity, max_length):
                                    rejections.add(f"job.mfu {overlong_reason}")
                                    continue
                                job_id = identity.get(_JOB_ID)
                                if not job_id:
                                    rejections.add("job.mfu without job.id")
                                    continue
                                time_ns = point.time_unix_nano
                                if not time_ns or time_ns > latest:
                                    rejections.add("job.mfu without a timestamp or stamped in the future")
                                    continue
                                if add_mfu(job_id, value, time_ns, identity):
                                    accepted += 1
                                else:
                                    rejections.add(_refused("job.mfu", sink))
                if batch:
                    assert add_gpu_inputs is not None
                    for (key, start_ns, end_ns), groups in batch.items():
                        for identity, values, shares in groups:
                            if not add_gpu_inputs(key, start_ns, end_ns, identity, values, shares):
                                refused = len(values) + len(shares)
                                accepted -= refused
                                rejections.add(_refused("loss inputs", sink), refused)
                if (
                    use_shapes
                    and resource is not None
                    and cache_key is not None
                    and resource[5] < _MAX_SHAPE_BUILDS
                    and (resource[4] is None or shape_missed)
                    and not resource[3]
                    and resource[1] is not None
                ):
                    assert views is not None
                    self._learn_shape(rm, views[index], cache_key, resource, roles)
        finally:
            if locked:
                lock.release()
        return accepted, any_ours, any_foreign

    def _resource_identity(
        self,
        resource_metrics: Any,
        key: bytes,
        profile_of: Callable[[Mapping[str, str]], Any] | None,
    ) -> _Resource:
        """Identity, stream key, profile and overlong-ness of a Resource not in the cache; cached under ``key``."""
        identity = _identity_of(resource_metrics.resource.attributes, _EMPTY)
        found: _Resource = (
            identity,
            stream_key(identity),
            None if profile_of is None else profile_of(identity),
            _overlong(identity, self.max_attribute_length),
            None,
            0,
        )
        cache = self._resource_cache
        if len(cache) >= self._cache_limit:
            # The bound is read again only when the cache reaches the last one read (it moves with the
            # sink's live streams), not on every new Resource: a fleet's first interval is all new ones.
            self._cache_limit = self._resource_cache_bound()
            if len(cache) >= self._cache_limit:
                cache.clear()
        cache[key] = found
        return found

    def _learn_shape(self, rm: Any, view: Any, cache_key: bytes, resource: _Resource, roles: Mapping[str, int]) -> None:
        """Build the shape of a Resource's metrics as just read point by point, and keep it with the Resource."""
        scopes = view.scope_metrics
        shape = _shape_of(rm, scopes[0], roles) if len(scopes) == 1 and len(rm.scope_metrics) == 1 else None
        if shape is not None:
            layouts = self._layouts
            if len(layouts) >= _MAX_LAYOUT_LENGTHS:
                layouts.clear()  # Resources keep the shapes they hold; only the sharing starts over
            known = layouts.setdefault(shape.template.length, [])
            same = next((k for k in known if k.template.gaps == shape.template.gaps), None)
            if same is not None:
                shape = same
            else:
                known.append(shape)
                del known[:-_MAX_LAYOUTS_PER_LENGTH]
        # A layout no template reads (a foreign metric, an attribute on a point) is often one interval's: the
        # Resource keeps the shape it had, for the next report in its usual layout.
        self._resource_cache[cache_key] = (*resource[:4], shape or resource[4], resource[5] + 1)

    def _resource_cache_bound(self) -> int:
        """How many Resources the cache may hold now: twice what the sink keeps alive, plus slack."""
        live = 0
        for count in (getattr(self.sink, "streams", None), getattr(self.sink, "jobs", None)):
            if not isinstance(count, int):
                return self.resource_cache_size  # a sink that does not say: the fixed bound alone
            live += count
        return min(self.resource_cache_size, 2 * live + 1024)

    def _ingest_partials(self, request: ExportMetricsServiceRequest, rejections: _Rejections) -> tuple[int, bool, bool]:
        any_ours = False
        any_foreign = False
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if self._ours(metric.name):
                        any_ours = True
                    else:
                        any_foreign = True
        if not any_ours or self.partial_sink is None:
            return 0, any_ours, any_foreign
        subset = _subset(request, partials.is_partial_metric)
        try:
            windows = partials.partials_from_request(subset)
        except (ValueError, KeyError, TypeError) as error:
            rejections.add(f"partial window outputs unreadable ({error})", 1)
            return 0, any_ours, any_foreign
        accepted = 0
        with self.lock:
            for partial in windows:
                if self.partial_sink.add_partial(partial):
                    accepted += 1
                else:
                    rejections.add("partial window late or beyond the collector's state bounds")
        return accepted, any_ours, any_foreign

    def _forward(
        self, request: ExportMetricsServiceRequest, raw: bytes | None, any_ours: bool, any_foreign: bool
    ) -> bytes | None:
        if not self.pass_through:
            return None
        if (self.forward_inputs and self.sink is not None) or (any_foreign and not any_ours):
            if not request.resource_metrics:
                return None
            return raw if raw is not None else request.SerializeToString()
        if not any_foreign:
            return None
        return _subset(request, lambda name: not self._ours(name)).SerializeToString()


def _input_identity(
    name: str, throttle: bool, attributes: Any, resource_identity: Mapping[str, str], resource_key: str | None
) -> tuple[Mapping[str, str], str | None, str] | str:
    """A loss-input point's identity, stream key and field (its metric, or a gpu.throttle point's reason) from
    its own attributes; or why it is rejected."""
    if not throttle:
        identity = _identity_of(attributes, resource_identity)
        return identity, (resource_key if identity is resource_identity else stream_key(identity)), name
    reason: str | None = None
    own_identity = False
    for kv in attributes:
        if kv.key == _THROTTLE_REASON:
            reason = kv.value.string_value
        elif kv.key in _IDENTITY:
            own_identity = True
    if reason is None or reason not in _THROTTLE_REASONS:
        return f"{name} without a known {_THROTTLE_REASON}"
    if not own_identity:
        return resource_identity, resource_key, reason
    identity = _identity_of(attributes, resource_identity)
    return identity, stream_key(identity), reason


def _cache_key(encoding: bytes) -> bytes:
    """What a Resource is cached under: its encoding, or a 128-bit digest of a long one."""
    return encoding if len(encoding) <= _INLINE_KEY_BYTES else blake2b(encoding, digest_size=16).digest()


def _shape_of(rm: Any, scope_bytes: bytes, roles: Mapping[str, int]) -> _Shape | None:
    """The shape of one ResourceMetrics' only ScopeMetrics (``scope_bytes`` its encoding as sent, ``rm`` the same
    parsed), when a template can read it: only gpu.ofu, loss inputs and consumed metrics, each a gauge or sum of
    as_double points with a time, no attributes but a gpu.throttle point's known reason, no field twice. The
    slots ``templates.scan`` finds are checked against the parsed points: a template never reads what the parse
    would read otherwise."""
    scanned = templates.scan(scope_bytes)
    metrics = rm.scope_metrics[0].metrics
    if scanned is None or len(scanned) != len(metrics):
        return None
    read: list[tuple[int, str]] = []
    skip: list[tuple[int, str]] = []
    plan: list[tuple[int, str, bool, int | None, int, int]] = []
    fields: set[str] = set()
    for slots, metric in zip(scanned, metrics, strict=True):
        name = metric.name
        role = roles.get(name)
        kind = metric.WhichOneof("data")
        if slots.name != name or role is None or role == _MFU_ROLE or kind not in ("gauge", "sum"):
            return None
        points = getattr(metric, kind).data_points
        if len(points) != len(slots.points):
            return None
        for slot, point in zip(slots.points, points, strict=True):
            if role == _CONSUMED:
                skip.extend(
                    (offset, code)
                    for offset, code in ((slot.start, "Q"), (slot.time, "Q"), (slot.value, "d"))
                    if offset is not None
                )
                continue
            if slot.time is None or slot.value is None:
                return None
            if not templates.same_number(struct.unpack_from("<d", scope_bytes, slot.value)[0], point.as_double):
                return None
            if struct.unpack_from("<Q", scope_bytes, slot.time)[0] != point.time_unix_nano:
                return None
            start = 0 if slot.start is None else struct.unpack_from("<Q", scope_bytes, slot.start)[0]
            if start != point.start_time_unix_nano:
                return None
            throttle = name == _THROTTLE
            field = name
            if throttle:
                attributes = point.attributes
                if len(attributes) != 1 or attributes[0].key != _THROTTLE_REASON:
                    return None
                field = attributes[0].value.string_value
                if field not in _THROTTLE_REASONS or attributes[0].value.WhichOneof("value") != "string_value":
                    return None
            elif slot.has_attributes or point.attributes:
                return None
            if role == _INPUT:
                if field in fields:
                    return None  # one interval's field twice: the point-by-point grouping decides
                fields.add(field)
            start_index = None
            if slot.start is not None:
                start_index = len(read)
                read.append((slot.start, "Q"))
            read.append((slot.time, "Q"))
            read.append((slot.value, "d"))
            plan.append((role, field, throttle, start_index, len(read) - 2, len(read) - 1))
    if not plan:
        return None
    return _Shape(templates.Template.of(scope_bytes, read, skip), tuple(plan))


def _through_shape(
    resource: _Resource,
    plan: tuple[tuple[int, str, bool, int | None, int, int], ...],
    numbers: tuple[Any, ...],
    latest: int,
    add_ofu: _ProfilingAdd,
    add_gpu_inputs: _GpuInputAdd | None,
    rejections: _Rejections,
    sink: object,
) -> int | None:
    """A Resource's points read through its shape into the sink; how many were taken. None, with nothing
    taken, when any point would be refused: then the Resource is read point by point, where every refusal
    has its reason. Loss inputs are grouped by their (start, end) as point by point (gpu.energy, a cumulative
    counter, starts when its series did, the gauges when their interval did)."""
    ofu: list[tuple[float, int, int]] = []
    groups: dict[tuple[int, int], tuple[dict[str, float], dict[str, float]]] = {}
    zeros = 0
    for role, field, throttle, start_index, time_index, value_index in plan:
        end_ns = numbers[time_index]
        if not end_ns or end_ns > latest:
            return None
        value = numbers[value_index]
        start_ns = (numbers[start_index] if start_index is not None else 0) or end_ns
        if role == _OFU_ROLE:
            if not 0.0 <= value <= 1.0:  # NaN fails both comparisons
                return None
            ofu.append((value, start_ns, end_ns))
            continue
        if add_gpu_inputs is None or not 0.0 <= value < math.inf:
            return None
        if throttle and value == 0.0:
            zeros += 1  # taken, nothing to add (as point by point)
            continue
        group = groups.get((start_ns, end_ns))
        if group is None:
            group = groups[(start_ns, end_ns)] = ({}, {})
        (group[1] if throttle else group[0])[field] = value
    identity, key, profile = resource[0], resource[1], resource[2]
    assert key is not None  # a shape is built only for a Resource with a stream key
    accepted = zeros
    for value, start_ns, end_ns in ofu:
        if add_ofu(key, value, start_ns, end_ns, identity, profile):
            accepted += 1
        else:
            rejections.add(_refused("gpu.ofu", sink))
    for (start_ns, end_ns), (values, shares) in groups.items():
        assert add_gpu_inputs is not None
        if add_gpu_inputs(key, start_ns, end_ns, identity, values, shares):
            accepted += len(values) + len(shares)
        else:
            rejections.add(_refused("loss inputs", sink), len(values) + len(shares))
    return accepted


_REFUSALS = {
    "late": "late (its window already closed)",
    "max_streams": "over --max-streams (a new GPU stream)",
    "max_jobs": "over --max-jobs (a new job)",
}


def _refused(name: str, sink: object) -> str:
    """The rejection reason of a point the sink refused: the Aggregator says why (``refusal``)."""
    why = _REFUSALS.get(getattr(sink, "refusal", ""), "late or beyond the collector's state bounds")
    return f"{name} {why}"


def _without_profile(sink: PointSink) -> _ProfilingAdd:
    def add_ofu(
        stream_key: str, value: float, start_ns: int, end_ns: int, identity: Mapping[str, str], profile: Any = None
    ) -> bool:
        return sink.add_ofu(stream_key, value, start_ns, end_ns, identity)

    return add_ofu


def _subset(request: ExportMetricsServiceRequest, keep: Any) -> ExportMetricsServiceRequest:
    """A copy of ``request`` with only the metrics whose name ``keep`` accepts, resources and scopes intact."""
    out = ExportMetricsServiceRequest()
    for rm in request.resource_metrics:
        new_rm = None
        for sm in rm.scope_metrics:
            kept = [metric for metric in sm.metrics if keep(metric.name)]
            if not kept:
                continue
            if new_rm is None:
                new_rm = out.resource_metrics.add()
                new_rm.resource.CopyFrom(rm.resource)
                new_rm.schema_url = rm.schema_url
            new_sm = new_rm.scope_metrics.add()
            new_sm.scope.CopyFrom(sm.scope)
            new_sm.schema_url = sm.schema_url
            new_sm.metrics.extend(kept)
    return out
