"""OTLP ExportMetricsServiceRequest -> the windows (a ``PointSink``), plus the untouched rest for pass-through.

This is the collector's hot loop: every received data point goes through the decoder once, given the request's
bytes by the receivers (``Decoder.decode_bytes``) or a parsed request (``Decoder.decode``: the write-ahead's replay,
tests). A Resource's identity is read once and cached under its encoding (``otlp.resources``); a Resource whose
metrics come in a layout already seen is read through that layout's template (``otlp.shapes``), the rest point by
point (``otlp.points``, by role: ``otlp.roles``); ``Decoder._read`` is the one place that chooses. A request given as
bytes is parsed only when one of its Resources must be read point by point (or is new): a producer's usual request,
every Resource known and in its layout, is read from its bytes alone, since parsing it whole cost as much as a
fifth of its ingest (``_all_through_templates``). Each point is checked in
the same order both ways (its value's bounds, its identity, its time) and refused with a reason code and words
(``otlp.rejections``).

One protocol joins the decoder to the windows, ``otlp.sink.PointSink`` (the merge tier's: ``PartialSink``): the
sink owns the lock, and the decoder takes it once a request's parsing is done, for the sink's calls and for its own
caches and counters, which go with them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import attrs
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from otel_ofu import names
from otel_ofu_collector.otlp import partials, points, roles
from otel_ofu_collector.otlp.points import Reading
from otel_ofu_collector.otlp.rejections import MalformedRequest, Rejections, message
from otel_ofu_collector.otlp.resources import (
    EMPTY,
    ResourceEntry,
    cache_key,
    entry_bytes,
    identity_of,
    parse_request,
    resource_views,
    stream_key,
    unusable,
    views_as_sent,
)
from otel_ofu_collector.otlp.shapes import Shape, read_through, refuse_through, shape_of
from otel_ofu_collector.otlp.sink import PartialSink, PointSink

R = names.RejectReason
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
# What one request may carry of one GPU or job, per metric (``otlp.points``).
MAX_POINTS_PER_INTERVAL = points.MAX_POINTS_PER_INTERVAL
MAX_POINTS_PER_STREAM = points.MAX_POINTS_PER_STREAM


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
        """A parsed request (``raw`` its bytes as received, when there are some) into the sink."""
        return self._decode(request, raw)

    def decode_bytes(self, raw: bytes) -> DecodeOutcome:
        """A request as received: parsed only when a Resource cannot be read through a template, so a producer's
        usual request is never parsed whole. MalformedRequest, with nothing taken, when the bytes are not one."""
        return self._decode(None, raw)

    def _decode(self, request: ExportMetricsServiceRequest | None, raw: bytes | None) -> DecodeOutcome:
        rejections = Rejections()
        if self.sink is not None:
            reading = self._ingest_points(request, raw, rejections)
            accepted, any_ours, any_foreign = reading.accepted, reading.any_ours, reading.any_foreign
            request = reading.request  # None only when every Resource was read through a template
        else:
            if request is None:
                assert raw is not None
                request = parse_request(raw)
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
        self, request: ExportMetricsServiceRequest | None, raw: bytes | None, rejections: Rejections
    ) -> Reading:
        sink = self.sink
        assert sink is not None
        latest = 2**64  # beyond any uint64 timestamp
        if self.clock is not None and self.max_future_ns is not None:
            latest = self.clock() + self.max_future_ns
        reading = Reading(self, sink, request, raw, rejections, latest)
        try:
            self._read(reading)
        finally:
            reading.release()
        return reading

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
            same = next((k for k in known if k.template.layout == shape.template.layout), None)
            if same is not None:
                shape = same
            else:
                known.append(shape)
                del known[:-_MAX_LAYOUTS_PER_LENGTH]
        # A layout no template reads (a foreign metric, an attribute on a point) is often one interval's: the
        # Resource keeps the shape it had, for the next report in its usual layout.
        entry.shape = shape or entry.shape
        entry.builds += 1

    def _read(self, reading: Reading) -> None:
        """Every ResourceMetrics of the request, by one of the two paths: through the template of a layout already
        seen when its bytes fit one (``_through_template``), else point by point (``Reading.points``), whose reading
        then teaches the decoder the Resource's layout for its next report."""
        use_shapes = self.read_through_shapes
        if reading.request is None and use_shapes and self._layouts and self._all_through_templates(reading):
            return
        resource_metrics = reading.message().resource_metrics
        # By index: a Resource read through a template never needs its parsed message (nor its Python wrapper).
        for index in range(len(resource_metrics)):
            entry: ResourceEntry | None = None
            missed = False  # the Resource's own layout was tried and its bytes were not that layout
            if use_shapes and self._layouts:
                entry, done, missed = self._through_template(reading, index)
                if done:
                    continue
            rm = resource_metrics[index]
            entry = reading.points(index, rm, entry)
            if (
                use_shapes
                and entry is not None
                and entry.builds < _MAX_SHAPE_BUILDS
                and (entry.shape is None or missed)
                and entry.unusable is None
            ):
                self.learn_shape(rm, reading.view(index), entry)

    def _all_through_templates(self, reading: Reading) -> bool:
        """A request that came as bytes alone, read without parsing it when every Resource is one seen before (its
        encoding cached) whose metrics fit a template: all of them read (True), or none (False: the caller parses
        the request and reads it Resource by Resource). The bytes such a request has beyond what was parsed before
        are the templates' number slots and its ResourceMetrics' schema URLs (checked here as the parser would):
        it is a request the parser takes, and reads the same."""
        assert reading.raw is not None
        views = views_as_sent(reading.raw)
        if views is None:
            return False
        reading.hold(views)
        cache = self._resource_cache
        fits = []
        for view in views:  # the decoder's hottest loop: what it needs is in locals
            entry = cache.get(cache_key(view.resource))
            if entry is None or entry.unusable is not None or (view.schema_url and not _utf8(view.schema_url)):
                return False
            scopes = view.scope_metrics
            if len(scopes) != 1:
                return False
            data = scopes[0]
            shape = entry.shape
            numbers = None if shape is None else shape.template.read(data)
            if numbers is None:  # not its own layout: another Resource's of its length, as in _through_template
                shape, numbers, _ = self._fit(entry, data)
                if shape is None or numbers is None:
                    return False
            fits.append((entry, shape, numbers))
        self._take(reading, fits)
        return True

    def _through_template(self, reading: Reading, index: int) -> tuple[ResourceEntry, bool, bool]:
        """A Resource read through the template of its own layout, or of another Resource's of its length (a fleet's
        GPUs send one layout, so a GPU seen the first time is read through it too): (its entry, whether it was read,
        whether its own layout was tried and did not fit)."""
        view = reading.view(index) if reading.views is None else reading.views[index]
        key = cache_key(view.resource)
        entry = self._resource_cache.get(key) or self.entry(reading.message().resource_metrics[index], key)
        scopes = view.scope_metrics
        if len(scopes) != 1 or entry.unusable is not None:
            return entry, False, False
        shape, numbers, missed = self._fit(entry, scopes[0])
        if shape is None or numbers is None:
            return entry, False, missed
        self._take(reading, [(entry, shape, numbers)])
        return entry, True, missed

    def _fit(self, entry: ResourceEntry, data: bytes) -> tuple[Shape | None, tuple[Any, ...] | None, bool]:
        """The shape whose template reads a Resource's ScopeMetrics ``data`` (its own, else one of another Resource
        of that length) and the numbers it read (None: none fits); and whether its own was tried and did not fit."""
        shape = entry.shape
        numbers = None if shape is None else shape.template.read(data)
        missed = numbers is None and shape is not None
        if numbers is None:
            for shape in self._layouts.get(len(data), ()):
                numbers = shape.template.read(data)
                if numbers is not None:
                    break
        return shape, numbers, missed

    def _take(self, reading: Reading, fits: list[tuple[ResourceEntry, Shape, tuple[Any, ...]]]) -> None:
        """Resources' numbers, each read through its shape, into the sink (the lock held). A request's in one call:
        what every Resource shares is looked up once, and the counts are added once."""
        latest, sink, rejections = reading.latest, reading.sink, reading.rejections
        accepted = 0
        for entry, shape, numbers in fits:
            if entry.stream_key is None:  # no GPU identity: every point refused, at a template's cost
                refuse_through(shape, numbers, rejections)
            else:
                accepted += read_through(entry, shape, numbers, latest, sink, rejections)
            entry.shape = shape  # the Resource's layout from now, with a fresh build budget
            entry.builds = 0
        reading.accepted += accepted
        reading.any_ours = True
        self.stats.shaped_resources += len(fits)  # under the lock

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
        self, request: ExportMetricsServiceRequest | None, raw: bytes | None, any_ours: bool, any_foreign: bool
    ) -> bytes | None:
        """What goes downstream untouched. ``request`` is None only for a request read whole through templates: all
        ours, at least one Resource, and ``raw`` its bytes."""
        if not self.pass_through:
            return None
        if (self.forward_inputs and self.sink is not None) or (any_foreign and not any_ours):
            if request is None:
                return raw
            if not request.resource_metrics:
                return None
            return raw if raw is not None else request.SerializeToString()
        if not any_foreign:
            return None
        assert request is not None  # a foreign metric was read point by point, from the parsed request
        return _subset(request, lambda name: not self._ours(name)).SerializeToString()


def _utf8(text: bytes) -> bool:
    """Whether a string field sent as these bytes is one the parser takes (valid UTF-8)."""
    try:
        text.decode()
    except UnicodeDecodeError:
        return False
    return True


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
    "MalformedRequest",
    "PartialSink",
    "PointSink",
    "message",
    "parse_request",
    "resource_views",
]
