"""A request's points read one by one: the decoder's general read path, which every layout takes.

``Reading`` holds one request on its way into the sink (its views, parsed once when the first point needs a
Resource's identity; the sink's lock, taken with them; what was taken and refused) and reads a Resource's metrics by
role (``otlp.roles``: OFU, unmeasured intervals, loss inputs, MFU, progress), each point checked in one order: its
value's bounds, its identity, its time, and how many of one GPU's points the request already carried (``Plausible``).
The other path, a layout's byte template (``otlp.shapes``), reads the same points to the same sink calls; the
decoder (``otlp.decode``) chooses between them per Resource.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Protocol, cast

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from otel_ofu import bounds, names
from otel_ofu_collector.otlp import roles
from otel_ofu_collector.otlp.rejections import Rejections
from otel_ofu_collector.otlp.resources import (
    IDENTITY,
    ResourceEntry,
    cache_key,
    identity_of,
    parse_request,
    resource_views,
    stream_key,
    unusable,
)
from otel_ofu_collector.otlp.shapes import take_inputs
from otel_ofu_collector.otlp.sink import PointSink

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

# What one request may carry of one GPU (or job), per metric: a source reports a field once per interval, an
# exporter's retry or a gateway may repeat one now and then, and a queue drained at once sends a backlog of
# intervals (a day of 10 s intervals is 8,640). Past either bound the request is not a report but a bomb (one GPU
# and 2,000,000 identical points of 138 KiB gzipped took 30 s of CPU and 3.7 GB): the rest of that metric's points
# are refused as implausible without being read one by one.
MAX_POINTS_PER_INTERVAL = 4
MAX_POINTS_PER_STREAM = 10_000
_REPEATS = "with more points of one GPU for one interval than any source sends"
_BACKLOG = "with more intervals of one GPU in one request than any source sends"

# A Resource's loss inputs, grouped by (stream key, start, end): (identity, gauges by metric, throttle shares by reason,
# counters by field) per group; a metric sent twice for one interval opens another group, so each point counts as sent.
_Group = tuple[Mapping[str, str], dict[str, float], dict[str, float], dict[str, float]]


class Decoding(Protocol):
    """What a reading needs of the decoder: the sink's lock, its bounds and its cache of Resources."""

    @property
    def lock(self) -> threading.Lock: ...

    max_mfu: float
    max_attribute_length: int

    def entry(self, rm: Any, key: bytes) -> ResourceEntry:
        """The cached reading of a Resource (cached under ``key`` if new); the caller holds the lock."""
        ...


class Reading:
    """One request's points on their way into the sink: the request's views (read once, when the first point
    needs identity), the lock (taken with them), and what was taken and refused.

    A request may come as bytes alone (``request`` None): it is parsed when something needs the message, and
    never when every Resource is read through a template (``Decoder._all_through_templates``)."""

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
        decoder: Decoding,
        sink: PointSink,
        request: ExportMetricsServiceRequest | None,
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

    def message(self) -> ExportMetricsServiceRequest:
        """The request parsed (parsed now if it came as bytes alone, outside the lock); MalformedRequest when its
        bytes are not one."""
        if self.request is None:
            assert self.raw is not None
            relock = self.locked
            self.release()
            self.request = parse_request(self.raw)
            if relock:
                self.hold()
        return self.request

    def hold(self, views: list[Any] | None = None) -> None:
        """Take the lock (if not held), with the request's views if given."""
        if views is not None:
            self.views = views
        if not self.locked:
            self.decoder.lock.acquire()
            self.locked = True

    def view(self, index: int) -> Any:
        """The index-th ResourceMetrics as sent; the first call parses the views (outside the lock) and locks."""
        views = self.views
        if views is None:
            views = resource_views(self.message(), self.raw)
            self.hold(views)
        return views[index]

    def release(self) -> None:
        if self.locked:
            self.decoder.lock.release()
            self.locked = False

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

    def _gpu_point(
        self, name: str, point: Any, entry: ResourceEntry
    ) -> tuple[Mapping[str, str], str, Any, int, int] | None:
        """A GPU's interval point (``gpu.ofu``, ``gpu.ofu.unmeasured``) after its value: its identity (the Resource's,
        overlaid with the point's own attributes), stream key, profile, start and end; None, with the refusal counted,
        when its attributes are unusable, it names no GPU, or it has no time or one in the future."""
        identity, key = self._own_identity(name, point.attributes, entry)
        profile = entry.profile
        if identity is not entry.identity:
            words = unusable(identity, self.decoder.max_attribute_length)
            if words is not None:
                self.rejections.add(R.BAD_ATTRIBUTE, f"{name} {words}")
                return None
            profile = self.sink.profile_of(identity)
        if key is None:
            self.rejections.refuse(name, R.NO_IDENTITY)
            return None
        end_ns: int = point.time_unix_nano
        if not end_ns or end_ns > self.latest:
            self.rejections.refuse(name, R.BAD_TIME)
            return None
        return identity, key, profile, point.start_time_unix_nano or end_ns, end_ns

    def ofu(self, points: Any, entry: ResourceEntry) -> None:
        rejections = self.rejections
        plausible = Plausible(_OFU, len(points), rejections)
        for index, point in enumerate(points):
            # as_double reads 0.0 when unset or when the value is as_int: only then ask which.
            value = point.as_double or _number(point)
            if value is None or not 0.0 <= value <= 1.0:  # NaN fails both comparisons
                rejections.refuse(_OFU, R.OUT_OF_RANGE)
                continue
            found = self._gpu_point(_OFU, point, entry)
            if found is None:
                continue
            identity, key, profile, start_ns, end_ns = found
            if not plausible.one_more(key, start_ns, end_ns, index):
                break
            refused = self.sink.add_ofu(key, value, start_ns, end_ns, identity, profile)
            if refused is None:
                self.accepted += 1
            else:
                rejections.refuse(_OFU, refused)

    def unmeasured(self, points: Any, entry: ResourceEntry) -> None:
        """``gpu.ofu.unmeasured`` points: a GPU's time without OFU (the value says nothing: the interval is what counts;
        its ``error.type`` is for people, not for the windows)."""
        plausible = Plausible(_UNMEASURED, len(points), self.rejections)
        for index, point in enumerate(points):
            found = self._gpu_point(_UNMEASURED, point, entry)
            if found is None:
                continue
            identity, key, profile, start_ns, end_ns = found
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
        slot = 3 if name in roles.COUNTERS else 2 if name == _THROTTLE else 1  # a group's counters, shares or gauges
        keyed = roles.KEYED.get(name)
        low, high = bounds.range_of(name)
        group: _Group | None = None
        group_at: tuple[str, int, int] | None = None
        plausible = Plausible(name, len(points), rejections)
        for index, point in enumerate(points):
            value = point.as_double or _number(point)
            if value is None or not low <= value <= high:  # NaN fails both comparisons
                rejections.refuse(name, (bounds.refusal(name, value) if value is not None else None) or R.OUT_OF_RANGE)
                continue
            found = self._input_identity(name, point.attributes, entry, keyed, max_length)
            if found is None:
                continue
            field, identity, key = found
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
            if group is None or group_at != at or group[0] is not identity or field in group[slot]:
                group, group_at = _group_of(batch, at, identity, field, slot), at
            cast(dict[str, float], group[slot])[field] = value

    def _input_identity(
        self, name: str, attributes: Any, entry: ResourceEntry, keyed: Any, max_length: int
    ) -> tuple[str, Mapping[str, str], str] | None:
        """A loss input point's field (a keyed metric's names its key: ``gpu.throttle`` by reason), identity and
        stream key; None, with the refusal counted, for a point that names none of them usably."""
        rejections = self.rejections
        field = name
        if keyed is not None:
            attribute, known = keyed
            found, own = _keyed_by(attributes, attribute, known)
            if found is None:
                rejections.add(R.BAD_ATTRIBUTE, f"{name} without a known {attribute}")
                return None
            field = roles.keyed_field(name, found)
            identity, key = self._own_identity(name, attributes, entry) if own else (entry.identity, entry.stream_key)
        else:
            identity, key = self._own_identity(name, attributes, entry)
        if identity is not entry.identity and (words := unusable(identity, max_length)) is not None:
            rejections.add(R.BAD_ATTRIBUTE, f"{name} {words}")
            return None
        if key is None:
            rejections.refuse(name, R.NO_IDENTITY)
            return None
        return field, identity, key

    def _job_point(self, name: str, point: Any, entry: ResourceEntry) -> tuple[Mapping[str, str], str, int] | None:
        """A job's point (``job.mfu``, ``job.step``, ``job.checkpoint.time``) after its value: its identity (the
        Resource's, overlaid with the point's own attributes), its ``job.id`` and its time; None, with the refusal
        counted, when its attributes are unusable, it names no job, or it has no time or one in the future."""
        attributes = point.attributes
        identity = identity_of(attributes, entry.identity) if attributes else entry.identity
        max_length = self.decoder.max_attribute_length
        if identity is not entry.identity and (words := unusable(identity, max_length)) is not None:
            self.rejections.add(R.BAD_ATTRIBUTE, f"{name} {words}")
            return None
        job_id = identity.get(_JOB_ID)
        if not job_id:
            self.rejections.add(R.NO_IDENTITY, f"{name} without {_JOB_ID}")
            return None
        time_ns: int = point.time_unix_nano
        if not time_ns or time_ns > self.latest:
            self.rejections.refuse(name, R.BAD_TIME)
            return None
        return identity, job_id, time_ns

    def mfu(self, points: Any, entry: ResourceEntry) -> None:
        rejections = self.rejections
        max_mfu = self.decoder.max_mfu
        plausible = Plausible(_MFU, len(points), rejections)
        for index, point in enumerate(points):
            value = _number(point)
            if value is None or not 0.0 <= value <= max_mfu:
                rejections.refuse(_MFU, R.OUT_OF_RANGE)
                continue
            found = self._job_point(_MFU, point, entry)
            if found is None:
                continue
            identity, job_id, time_ns = found
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
        plausible = Plausible(name, len(points), rejections)
        for index, point in enumerate(points):
            value = _number(point)
            if value is None or not 0.0 <= value <= high:
                rejections.refuse(name, R.OUT_OF_RANGE)
                continue
            found = self._job_point(name, point, entry)
            if found is None:
                continue
            identity, job_id, time_ns = found
            operation = None
            if not step:
                operation = next((kv.value.string_value for kv in point.attributes if kv.key == _OPERATION), None)
                if operation not in names.CheckpointOperation.ALL:
                    rejections.add(R.BAD_ATTRIBUTE, f"{name} without a known {_OPERATION}")
                    continue
            start_ns = point.start_time_unix_nano
            if not plausible.one_more(job_id, start_ns, time_ns, index, operation or ""):  # a job's, as job.mfu's
                break
            if step:
                refused = self.sink.add_progress(job_id, value, time_ns, identity)
            else:
                refused = self.sink.add_progress(job_id, value, time_ns, identity, operation, start_ns)
            if refused is None:
                self.accepted += 1
            else:
                rejections.refuse(name, refused)


class Plausible:
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


def _group_of(
    batch: dict[tuple[str, int, int], list[_Group]], at: tuple[str, int, int], identity: Any, field: str, slot: int
) -> _Group:
    """The group of GPU interval ``at`` a point with ``field`` joins: the interval's last one, unless it is another
    identity's or already holds the field (then a new one)."""
    groups = batch.setdefault(at, [])
    group = groups[-1] if groups else None
    if group is None or group[0] is not identity or field in group[slot]:
        group = (identity, {}, {}, {})
        groups.append(group)
    return group


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
