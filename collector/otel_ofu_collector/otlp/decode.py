"""OTLP ExportMetricsServiceRequest -> the windows (a ``PointSink``), plus the untouched rest for pass-through.

This is the collector's hot loop: every received data point goes through ``Decoder.decode`` once. A Resource's
identity is read once and cached under its encoding (``otlp.resources``); a Resource whose metrics come in a
layout already seen is read through that layout's template (``otlp.shapes``), the rest point by point, one
reader per role (``otlp.roles``: OFU, loss inputs, MFU), each point checked in the same order both ways (its
value's bounds, its identity, its time) and refused with a reason code and words (``otlp.rejections``).

One protocol joins the decoder to the windows, ``otlp.sink.PointSink`` (the merge tier's: ``PartialSink``): the
sink owns the lock, and the decoder takes it once a request's parsing is done, for the sink's calls and for its own
caches and counters, which go with them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, cast

import attrs
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from otel_ofu import bounds, names
from otel_ofu_collector.otlp import partials, roles
from otel_ofu_collector.otlp.rejections import Rejections, message
from otel_ofu_collector.otlp.resources import (
    EMPTY,
    IDENTITY,
    ResourceEntry,
    cache_key,
    entry_bytes,
    identity_of,
    resource_views,
    stream_key,
    unusable,
)
from otel_ofu_collector.otlp.shapes import Shape, read_through, refuse_through, shape_of, take_inputs
from otel_ofu_collector.otlp.sink import PartialSink, PointSink

R = names.RejectReason
_OFU = names.GPU_OFU.name
_UNMEASURED = names.GPU_OFU_UNMEASURED.name
_MFU = names.JOB_MFU.name
_STEP = names.JOB_STEP.name
_OPERATION = names.CHECKPOINT_OPERATION
# A step count no training reaches (2^53: past it a float no longer holds every whole number); checkpoint seconds of a
# reporter that ran a year.
_MAX_STEP = float(2**53)
_MAX_CHECKPOINT_S = 365 * 86400.0
_JOB_ID = names.JOB_ID
_THROTTLE = names.GPU_THROTTLE.name
_INPUTS = "loss inputs"  # how refused loss inputs are named (taken per GPU interval, all together)
GPU_INPUT_NAMES = roles.GPU_INPUT_NAMES
INPUT_METRIC_NAMES = roles.INPUT_METRIC_NAMES

# The same bound the MFU reporter applies: one vocabulary, so a value one side takes the other does not drop.
DEFAULT_MAX_MFU = names.MFU_MAX
# The longest identity attribute value (job.id, host.name, ...) taken, in characters. Real ones are at most a few
# hundred (a Kubernetes "namespace/name" is at most 63 + 1 + 253); a megabyte one would be copied into every output
# of its job and could make a window too large for any downstream. Over it the point is rejected (counted by
# reason), never silently truncated.
DEFAULT_MAX_ATTRIBUTE_LENGTH = 320
# What the resource cache may hold in bytes (``resources.entry_bytes``), beside its bound in entries.
DEFAULT_RESOURCE_CACHE_BYTES = 256 * 1024 * 1024
# Layouts kept to share (real fleets send a handful): lengths, and layouts of one length tried per Resource.
_MAX_LAYOUT_LENGTHS = 256
_MAX_LAYOUTS_PER_LENGTH = 4
_MAX_SHAPE_BUILDS = 3  # layouts built for one Resource before it is read point by point for good
# What one request may carry of one GPU (or job), per metric: a source reports a field once per interval, an
# exporter's retry or a gateway may repeat one now and then, and a queue drained at once sends a backlog of
# intervals (a day of 10 s intervals is 8,640). Past either bound the request is not a report but a bomb (one GPU
# and 2,000,000 identical points of 138 KiB gzipped took 30 s of CPU and 3.7 GB): the rest of that metric's points
# are refused as implausible without being read one by one.
MAX_POINTS_PER_INTERVAL = 4
MAX_POINTS_PER_STREAM = 10_000
_REPEATS = "with more points of one GPU for one interval than any source sends"
_BACKLOG = "with more intervals of one GPU in one request than any source sends"


@attrs.frozen
class DecodeOutcome:
    """What one request did: points taken, points rejected (with why), and what to forward untouched."""

    accepted: int
    rejected: int
    error_message: str
    forward: bytes | None  # a serialized ExportMetricsServiceRequest for the downstream, or None


@attrs.define
class DecoderStats:
    """Running totals over every request, read by the self-metrics (by code) and the log (in words)."""

    accepted: int = 0
    rejected: int = 0
    rejected_by_reason: dict[str, int] = attrs.field(factory=lambda: dict.fromkeys(R.ALL, 0))
    rejected_by_message: dict[str, int] = attrs.field(factory=dict)
    forwarded_requests: int = 0
    shaped_resources: int = 0  # ResourceMetrics read through their layout's template (``otlp.shapes``)


# A Resource's loss inputs, grouped by (stream key, start, end): (identity, gauges by metric, throttle shares by reason,
# counters by field) per group; a metric sent twice for one interval opens another group, so each point counts as sent.
_Group = tuple[Mapping[str, str], dict[str, float], dict[str, float], dict[str, float]]


@attrs.define
class Decoder:
    """Routes the points of a request into the sink and keeps what is not ours for pass-through.

    Receivers call ``decode`` from many threads; the sink's lock is taken only once a request's parsing is done
    and its first point is due. In merge mode ``sink`` is None and ``partial_sink`` takes the shards' partial
    state, read with ``otlp.partials``; the shards' own fleet gauges (``partials.is_merge_recomputed_metric``)
    are dropped, since the merge tier emits fleet-wide ones.
    """

    sink: PointSink | None
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
    # Producers send the same Resource every interval: its identity, stream key and profile are looked up by the
    # Resource's encoding instead of re-reading its attributes. Entries outlive their Resources as jobs come and
    # go, and some Resources carry no accepted point at all: the cache is cleared when it outgrows twice the sink's
    # live entries plus 1024, ``resource_cache_size`` entries, or ``resource_cache_bytes``.
    resource_cache_size: int = 262_144
    resource_cache_bytes: int = DEFAULT_RESOURCE_CACHE_BYTES
    # Read each Resource's points through the template of its layout once one is known (``otlp.shapes``).
    # False: always point by point (tests compare the two).
    read_through_shapes: bool = True
    _resource_cache: dict[bytes, ResourceEntry] = attrs.field(factory=dict)
    _cache_bytes: int = 0
    _cache_limit: int = 0  # the cache bound last read (see ``_remember``)
    _layouts: dict[int, list[Shape]] = attrs.field(factory=dict)  # the shapes learnt, by ScopeMetrics length
    _own_lock: threading.Lock = attrs.field(factory=threading.Lock)  # only without a sink to take one from

    @property
    def lock(self) -> threading.Lock:
        """The lock of the sink the decoder feeds (its own only when it feeds none)."""
        if self.sink is not None:
            return self.sink.lock
        if self.partial_sink is not None:
            return self.partial_sink.lock
        return self._own_lock

    @property
    def cached_resources(self) -> int:
        """Resources in the identity cache now."""
        return len(self._resource_cache)

    @property
    def cache_bytes(self) -> int:
        """What the identity cache holds, roughly, in bytes (``resources.entry_bytes``)."""
        return self._cache_bytes

    def _ours(self, name: str) -> bool:
        if self.sink is None:
            return partials.is_partial_metric(name) or partials.is_merge_recomputed_metric(name)
        return name in INPUT_METRIC_NAMES

    def decode(self, request: ExportMetricsServiceRequest, raw: bytes | None = None) -> DecodeOutcome:
        rejections = Rejections()
        if self.sink is not None:
            accepted, any_ours, any_foreign = self._ingest_points(request, raw, rejections)
        else:
            accepted, any_ours, any_foreign = self._ingest_partials(request, rejections)
        forward = self._forward(request, raw, any_ours, any_foreign)
        stats = self.stats
        with self.lock:
            stats.accepted += accepted
            stats.rejected += rejections.total
            for code, count in rejections.by_code.items():
                stats.rejected_by_reason[code] = stats.rejected_by_reason.get(code, 0) + count
            for text, count in rejections.by_message.items():
                stats.rejected_by_message[text] = stats.rejected_by_message.get(text, 0) + count
            if forward is not None:
                stats.forwarded_requests += 1
        return DecodeOutcome(accepted, rejections.total, rejections.message(), forward)

    def _ingest_points(
        self, request: ExportMetricsServiceRequest, raw: bytes | None, rejections: Rejections
    ) -> tuple[int, bool, bool]:
        sink = self.sink
        assert sink is not None
        latest = 2**64  # beyond any uint64 timestamp
        if self.clock is not None and self.max_future_ns is not None:
            latest = self.clock() + self.max_future_ns
        reading = _Reading(self, sink, request, raw, rejections, latest)
        try:
            reading.run()
        finally:
            reading.release()
        return reading.accepted, reading.any_ours, reading.any_foreign

    def entry(self, rm: Any, key: bytes) -> ResourceEntry:
        """The cached reading of a Resource (cached under ``key`` if new); the caller holds the lock."""
        found = self._resource_cache.get(key)
        if found is not None:
            return found
        assert self.sink is not None
        identity = identity_of(rm.resource.attributes, EMPTY)
        found = ResourceEntry(
            identity,
            stream_key(identity),
            self.sink.profile_of(identity),
            unusable(identity, self.max_attribute_length),
        )
        self._remember(key, found)
        return found

    def _remember(self, key: bytes, entry: ResourceEntry) -> None:
        cache = self._resource_cache
        cost = entry_bytes(key, entry.identity)
        assert self.sink is not None
        # The cache counts in the sink's state bound: it holds at most what the bound leaves the sink's own state.
        most = min(self.resource_cache_bytes, self.sink.cache_budget(self._cache_bytes))
        if len(cache) >= self._cache_limit or self._cache_bytes + cost > most:
            # The bound is read again only when the cache reaches the last one read (it moves with the sink's
            # live entries), not on every new Resource: a fleet's first interval is all new ones.
            self._cache_limit = min(self.resource_cache_size, 2 * self.sink.live_entries() + 1024)
            if len(cache) >= self._cache_limit or self._cache_bytes + cost > most:
                cache.clear()
                self._cache_bytes = 0
        if cost > most:
            self.sink.cache_budget(self._cache_bytes)
            return  # no room even alone: read again next time, never held past the bound
        cache[key] = entry
        self._cache_bytes += cost
        self.sink.cache_budget(self._cache_bytes)

    def learn_shape(self, rm: Any, view: Any, entry: ResourceEntry) -> None:
        """Build the shape of a Resource's metrics as just read point by point, and keep it with the Resource."""
        scopes = view.scope_metrics
        shape = shape_of(rm, scopes[0]) if len(scopes) == 1 and len(rm.scope_metrics) == 1 else None
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
        entry.shape = shape or entry.shape
        entry.builds += 1

    def _ingest_partials(self, request: ExportMetricsServiceRequest, rejections: Rejections) -> tuple[int, bool, bool]:
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
            rejections.add(R.UNREADABLE, f"partial window outputs unreadable ({error})")
            return 0, any_ours, any_foreign
        accepted = 0
        with self.lock:
            for partial in windows:
                refused = self.partial_sink.add_partial(partial)
                if refused is None:
                    accepted += 1
                else:
                    rejections.refuse("partial window", refused)
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


class _Reading:
    """One request's points on their way into the sink: the request's views (read once, when the first point
    needs identity), the lock (taken with them), and what was taken and refused."""

    __slots__ = (
        "accepted",
        "any_foreign",
        "any_ours",
        "decoder",
        "latest",
        "locked",
        "raw",
        "rejections",
        "request",
        "sink",
        "views",
    )

    def __init__(
        self,
        decoder: Decoder,
        sink: PointSink,
        request: ExportMetricsServiceRequest,
        raw: bytes | None,
        rejections: Rejections,
        latest: int,
    ) -> None:
        self.decoder = decoder
        self.sink = sink
        self.request = request
        self.raw = raw
        self.rejections = rejections
        self.latest = latest
        self.views: list[Any] | None = None
        self.locked = False
        self.accepted = 0
        self.any_ours = False
        self.any_foreign = False

    def view(self, index: int) -> Any:
        """The index-th ResourceMetrics as sent; the first call parses the views (outside the lock) and locks."""
        if self.views is None:
            self.views = resource_views(self.request, self.raw)
            self.decoder.lock.acquire()
            self.locked = True
        return self.views[index]

    def release(self) -> None:
        if self.locked:
            self.decoder.lock.release()
            self.locked = False

    def run(self) -> None:
        """Every ResourceMetrics of the request: through its layout's template when one fits, else point by point.

        Known layouts exist: a Resource is looked up before its metrics are walked, to read them through a template
        when its bytes fit its shape, or another Resource's (a fleet's GPUs send one layout, so a GPU seen the first
        time is read through it too). The loop is the decoder's hottest: what it needs is in locals.
        """
        decoder = self.decoder
        cache = decoder._resource_cache
        layouts = decoder._layouts
        use_shapes = decoder.read_through_shapes
        stats = decoder.stats
        for index, rm in enumerate(self.request.resource_metrics):
            entry: ResourceEntry | None = None
            shape_missed = False  # a shape was tried and the bytes were not its layout
            if use_shapes and layouts:
                view = self.view(index) if self.views is None else self.views[index]
                key = cache_key(view.resource)
                entry = cache.get(key) or decoder.entry(rm, key)
                scopes = view.scope_metrics
                if len(scopes) == 1 and entry.unusable is None:
                    data = scopes[0]
                    shape = entry.shape
                    numbers = None if shape is None else shape.template.read(data)
                    if numbers is None:
                        shape_missed = shape is not None
                        for shape in layouts.get(len(data), ()):
                            numbers = shape.template.read(data)
                            if numbers is not None:
                                break
                    if numbers is not None:
                        assert shape is not None
                        if entry.stream_key is None:  # no GPU identity: every point refused, at a template's cost
                            refuse_through(shape, numbers, self.rejections)
                        else:
                            self.accepted += read_through(
                                entry, shape, numbers, self.latest, self.sink, self.rejections
                            )
                        self.any_ours = True
                        stats.shaped_resources += 1  # under the lock, taken with the views
                        entry.shape = shape  # the Resource's layout from now, with a fresh build budget
                        entry.builds = 0
                        continue
            entry = self.points(index, rm, entry)
            if (
                use_shapes
                and entry is not None
                and entry.builds < _MAX_SHAPE_BUILDS
                and (entry.shape is None or shape_missed)
                and entry.unusable is None
            ):
                decoder.learn_shape(rm, self.view(index), entry)

    def points(self, index: int, rm: Any, entry: ResourceEntry | None) -> ResourceEntry | None:
        """A Resource's points one by one, by role; its entry (None: no point of ours needed its identity)."""
        batch: dict[tuple[str, int, int], list[_Group]] = {}
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                name = metric.name
                role = roles.ROLES.get(name)
                if role is None:
                    self.any_foreign = True
                    continue
                self.any_ours = True
                if role == roles.CONSUMED:
                    continue  # other producer metrics: consumed, nothing to aggregate
                # Reading an unset gauge gives an empty default: ask for the kind only when no gauge points.
                points = metric.gauge.data_points
                if not points:
                    kind = metric.WhichOneof("data")
                    if kind == "sum":
                        points = metric.sum.data_points
                    elif kind != "gauge":
                        if kind is not None:
                            self.rejections.refuse(name, R.WRONG_TYPE, len(getattr(metric, kind).data_points))
                        continue
                if entry is None:
                    entry = self.decoder.entry(rm, cache_key(self.view(index).resource))
                if entry.unusable is not None:
                    self.rejections.add(R.BAD_ATTRIBUTE, f"{name} {entry.unusable}", len(points))
                elif role == roles.OFU:
                    self.ofu(points, entry)
                elif role == roles.UNMEASURED:
                    self.unmeasured(points, entry)
                elif role == roles.INPUT:
                    self.inputs(name, points, entry, batch)
                elif role == roles.MFU:
                    self.mfu(points, entry)
                else:
                    self.progress(name, points, entry)
        for (key, start_ns, end_ns), groups in batch.items():
            for identity, gauges, shares, counters in groups:
                count = len(gauges) + len(shares) + len(counters)
                self.accepted += (
                    take_inputs(self.sink, key, start_ns, end_ns, identity, gauges, shares, counters, self.rejections)
                    - count
                )  # counted as taken point by point: less what the sink refused
        return entry

    def _own_identity(self, name: str, attributes: Any, entry: ResourceEntry) -> tuple[Mapping[str, str], str | None]:
        """A point's identity and stream key: the Resource's, or overlaid with the point's own attributes."""
        identity = identity_of(attributes, entry.identity) if attributes else entry.identity
        if identity is entry.identity:
            return identity, entry.stream_key
        return identity, stream_key(identity)

    def ofu(self, points: Any, entry: ResourceEntry) -> None:
        rejections = self.rejections
        latest = self.latest
        sink = self.sink
        max_length = self.decoder.max_attribute_length
        plausible = _Plausible(_OFU, len(points), rejections)
        for index, point in enumerate(points):
            # as_double reads 0.0 when unset or when the value is as_int: only then ask which.
            value = point.as_double or _number(point)
            if value is None or not 0.0 <= value <= 1.0:  # NaN fails both comparisons
                rejections.refuse(_OFU, R.OUT_OF_RANGE)
                continue
            identity, key = self._own_identity(_OFU, point.attributes, entry)
            profile = entry.profile
            if identity is not entry.identity:
                words = unusable(identity, max_length)
                if words is not None:
                    rejections.add(R.BAD_ATTRIBUTE, f"{_OFU} {words}")
                    continue
                profile = sink.profile_of(identity)
            if key is None:
                rejections.refuse(_OFU, R.NO_IDENTITY)
                continue
            end_ns = point.time_unix_nano
            if not end_ns or end_ns > latest:
                rejections.refuse(_OFU, R.BAD_TIME)
                continue
            start_ns = point.start_time_unix_nano or end_ns
            if not plausible.one_more(key, start_ns, end_ns, index):
                break
            refused = sink.add_ofu(key, value, start_ns, end_ns, identity, profile)
            if refused is None:
                self.accepted += 1
            else:
                rejections.refuse(_OFU, refused)

    def unmeasured(self, points: Any, entry: ResourceEntry) -> None:
        """``gpu.ofu.unmeasured`` points: a GPU's time without OFU (the value says nothing: the interval is what counts;
        its ``error.type`` is for people, not for the windows)."""
        plausible = _Plausible(_UNMEASURED, len(points), self.rejections)
        for index, point in enumerate(points):
            identity, key = self._own_identity(_UNMEASURED, point.attributes, entry)
            profile = entry.profile
            if identity is not entry.identity:
                words = unusable(identity, self.decoder.max_attribute_length)
                if words is not None:
                    self.rejections.add(R.BAD_ATTRIBUTE, f"{_UNMEASURED} {words}")
                    continue
                profile = self.sink.profile_of(identity)
            if key is None:
                self.rejections.refuse(_UNMEASURED, R.NO_IDENTITY)
                continue
            end_ns = point.time_unix_nano
            if not end_ns or end_ns > self.latest:
                self.rejections.refuse(_UNMEASURED, R.BAD_TIME)
                continue
            start_ns = point.start_time_unix_nano or end_ns
            if not plausible.one_more(key, start_ns, end_ns, index):
                break
            refused = self.sink.add_unmeasured(key, start_ns, end_ns, identity, profile)
            if refused is None:
                self.accepted += 1
            else:
                self.rejections.refuse(_UNMEASURED, refused)

    def inputs(
        self, name: str, points: Any, entry: ResourceEntry, batch: dict[tuple[str, int, int], list[_Group]]
    ) -> None:
        """A loss input's points, grouped into ``batch`` by GPU interval (taken in one call each once the Resource is
        read). A point's group is nearly always the last one touched: the producer sends all of an interval's
        inputs under one identity."""
        rejections = self.rejections
        latest = self.latest
        max_length = self.decoder.max_attribute_length
        throttle = name == _THROTTLE
        cumulative = name in roles.COUNTERS
        keyed = roles.KEYED.get(name)
        low, high = bounds.range_of(name)
        group: _Group | None = None
        group_at: tuple[str, int, int] | None = None
        plausible = _Plausible(name, len(points), rejections)
        for index, point in enumerate(points):
            value = point.as_double or _number(point)
            if value is None or not low <= value <= high:  # NaN fails both comparisons
                rejections.refuse(name, (bounds.refusal(name, value) if value is not None else None) or R.OUT_OF_RANGE)
                continue
            field = name
            attributes = point.attributes
            if keyed is not None:
                attribute, known = keyed
                found, own = _keyed_by(attributes, attribute, known)
                if found is None:
                    rejections.add(R.BAD_ATTRIBUTE, f"{name} without a known {attribute}")
                    continue
                field = roles.keyed_field(name, found)
                identity, key = (
                    self._own_identity(name, attributes, entry) if own else (entry.identity, entry.stream_key)
                )
            else:
                identity, key = self._own_identity(name, attributes, entry)
            if identity is not entry.identity and (words := unusable(identity, max_length)) is not None:
                rejections.add(R.BAD_ATTRIBUTE, f"{name} {words}")
                continue
            if key is None:
                rejections.refuse(name, R.NO_IDENTITY)
                continue
            end_ns = point.time_unix_nano
            if not end_ns or end_ns > latest:
                rejections.refuse(name, R.BAD_TIME)
                continue
            start_ns = point.start_time_unix_nano or end_ns
            if not plausible.one_more(key, start_ns, end_ns, index, field):
                break
            self.accepted += 1
            at = (key, start_ns, end_ns)
            # A metric sent twice for one interval (or another identity) opens a new group: each point counts as sent.
            slot = 3 if cumulative else 2 if throttle else 1
            if group is None or group_at != at or group[0] is not identity or field in group[slot]:
                groups = batch.setdefault(at, [])
                group = groups[-1] if groups else None
                if group is None or group[0] is not identity or field in group[slot]:
                    group = (identity, {}, {}, {})
                    groups.append(group)
                group_at = at
            cast(dict[str, float], group[slot])[field] = value

    def mfu(self, points: Any, entry: ResourceEntry) -> None:
        rejections = self.rejections
        max_mfu = self.decoder.max_mfu
        max_length = self.decoder.max_attribute_length
        plausible = _Plausible(_MFU, len(points), rejections)
        for index, point in enumerate(points):
            value = _number(point)
            if value is None or not 0.0 <= value <= max_mfu:
                rejections.refuse(_MFU, R.OUT_OF_RANGE)
                continue
            attributes = point.attributes
            identity = identity_of(attributes, entry.identity) if attributes else entry.identity
            if identity is not entry.identity and (words := unusable(identity, max_length)) is not None:
                rejections.add(R.BAD_ATTRIBUTE, f"{_MFU} {words}")
                continue
            job_id = identity.get(_JOB_ID)
            if not job_id:
                rejections.add(R.NO_IDENTITY, f"{_MFU} without {_JOB_ID}")
                continue
            time_ns = point.time_unix_nano
            if not time_ns or time_ns > self.latest:
                rejections.refuse(_MFU, R.BAD_TIME)
                continue
            if not plausible.one_more(job_id, time_ns, time_ns, index):
                break
            refused = self.sink.add_mfu(job_id, value, time_ns, identity)
            if refused is None:
                self.accepted += 1
            else:
                rejections.refuse(_MFU, refused)

    def progress(self, name: str, points: Any, entry: ResourceEntry) -> None:
        """``job.step`` and ``job.checkpoint.time`` points, read as ``job.mfu``'s are: a finite value in the metric's
        range, ``job.id`` on the point or its resource, a time; a checkpoint time also names its operation."""
        rejections = self.rejections
        step = name == _STEP
        high = _MAX_STEP if step else _MAX_CHECKPOINT_S
        for point in points:
            value = _number(point)
            if value is None or not 0.0 <= value <= high:
                rejections.refuse(name, R.OUT_OF_RANGE)
                continue
            attributes = point.attributes
            identity = identity_of(attributes, entry.identity) if attributes else entry.identity
            unfit = unusable(identity, self.decoder.max_attribute_length) if identity is not entry.identity else None
            if unfit is not None:
                rejections.add(R.BAD_ATTRIBUTE, f"{name} {unfit}")
                continue
            job_id = identity.get(_JOB_ID)
            if not job_id:
                rejections.add(R.NO_IDENTITY, f"{name} without {_JOB_ID}")
                continue
            time_ns = point.time_unix_nano
            if not time_ns or time_ns > self.latest:
                rejections.refuse(name, R.BAD_TIME)
                continue
            if step:
                refused = self.sink.add_progress(job_id, value, time_ns, identity)
            else:
                operation = next((kv.value.string_value for kv in attributes if kv.key == _OPERATION), None)
                if operation not in names.CheckpointOperation.ALL:
                    rejections.add(R.BAD_ATTRIBUTE, f"{name} without a known {_OPERATION}")
                    continue
                start_ns = point.start_time_unix_nano
                refused = self.sink.add_progress(job_id, value, time_ns, identity, operation, start_ns)
            if refused is None:
                self.accepted += 1
            else:
                rejections.refuse(name, refused)


class _Plausible:
    """Counts one metric's points of a Resource by GPU (or job) and interval as they are taken; past
    ``MAX_POINTS_PER_INTERVAL`` for one interval or ``MAX_POINTS_PER_STREAM`` for one GPU, the rest of the metric's
    points are refused in one count (``one_more`` is False: the caller stops reading them)."""

    __slots__ = ("metric", "points", "rejections", "seen", "streams")

    def __init__(self, metric: str, points: int, rejections: Rejections) -> None:
        self.metric = metric
        self.points = points
        self.rejections = rejections
        self.seen: dict[tuple[str, int, int, str], int] = {}
        self.streams: dict[str, int] = {}

    def one_more(self, key: str, start_ns: int, end_ns: int, index: int, field: str = "") -> bool:
        at = (key, start_ns, end_ns, field)
        repeats = self.seen.get(at, 0) + 1
        self.seen[at] = repeats
        intervals = self.streams.get(key, 0) + 1
        self.streams[key] = intervals
        if repeats <= MAX_POINTS_PER_INTERVAL and intervals <= MAX_POINTS_PER_STREAM:
            return True
        words = _REPEATS if repeats > MAX_POINTS_PER_INTERVAL else _BACKLOG
        self.rejections.add(R.IMPLAUSIBLE, f"{self.metric} {words}", self.points - index)
        return False


def _keyed_by(attributes: Any, attribute: str, known: frozenset[str]) -> tuple[str | None, bool]:
    """A keyed point's value of its keying attribute (None: none, or not a known one: a throttle reason, an I/O
    direction) and whether it carries identity of its own."""
    found: str | None = None
    own_identity = False
    for kv in attributes:
        if kv.key == attribute:
            found = kv.value.string_value
        elif kv.key in IDENTITY:
            own_identity = True
    return (found if found in known else None), own_identity


def _number(point: Any) -> float | None:
    kind = point.WhichOneof("value")
    if kind == "as_double":
        number: float = point.as_double
        return number
    if kind == "as_int":
        return float(point.as_int)
    return None


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


__all__ = [
    "DEFAULT_MAX_ATTRIBUTE_LENGTH",
    "DEFAULT_MAX_MFU",
    "GPU_INPUT_NAMES",
    "INPUT_METRIC_NAMES",
    "DecodeOutcome",
    "Decoder",
    "DecoderStats",
    "PartialSink",
    "PointSink",
    "message",
    "resource_views",
]
