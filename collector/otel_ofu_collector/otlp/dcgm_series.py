"""dcgm-exporter's series, as an OpenTelemetry Collector's Prometheus receiver sends them, into what otel-ofu's producer
would have sent for each GPU: the one stage in front of the decoder that gives fleets without our producer their OFU.

The Prometheus receiver turns each scrape of a dcgm-exporter into one ResourceMetrics: the scrape target's Resource
(``service.name`` the scrape job, ``service.instance.id`` the target's ``host:port``, and the ``k8s.*`` of the
exporter's own pod where Kubernetes service discovery found it), one gauge (or sum, for the counters) per metric, named
as the exporter names it (``DCGM_FI_PROF_PIPE_TENSOR_ACTIVE``, ``DCGM_FI_DEV_SM_CLOCK_HERTZ``, ...), and on every data
point the series' labels: the GPU's identity (``UUID``, ``gpu``, ``modelName``, ``Hostname``, the MIG labels, the pod
that holds it), all stamped with the scrape's time.

Such a Resource is read back into the page it was scraped from (a ``prometheus_text.Sample`` per point, grouped by
scrape time) and handed to the producer's own code, not a copy of it: ``dcgm_exporter.entries_of`` and
``ExporterPages`` (what the dcgm-exporter source does with a page), ``gpu_samples.compute_snapshot`` (attribution,
catalog, calibration, physical bounds), ``MetricsDataBuilder`` and ``encode_request`` (the producer's request). What
comes out is a Resource per GPU with ``gpu.ofu``, ``gpu.ofu.raw``, the clocks, power, energy, throttle shares, link
counters, or ``gpu.ofu.unmeasured`` where the page has no tensor activity for it: appended to the request, which the
decoder then reads as it reads a producer's. The scrape's own Resource stays in the request as it came, so
pass-through forwards it untouched (as every metric that is not ours).

One ``ExporterPages`` per scrape target keeps what the dcgm-exporter source keeps between scrapes: the previous
scrape's time (a reading covers the time since the previous scrape of its target, as the producer's covers the time
since its previous scrape; a target's first scrape has no start, which the windows infer), and the counters' last
values. Targets are bounded in number and forgotten once silent for ``stale_after_s``. A scrape that is not after
the target's previous one (sent twice, or out of order) is refused whole, and said so in ``partial_success``.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import attrs
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource as PbResource
from opentelemetry.sdk.resources import Resource

from otel_ofu import names
from otel_ofu.gpu_samples import Attribution, compute_snapshot, hints_attribution
from otel_ofu.gpu_values import CalibrationTable
from otel_ofu.producer.metrics_data import MetricsDataBuilder
from otel_ofu.producer.otlp_encoding import encode_request
from otel_ofu.sources.dcgm_exporter import ExporterPages, entries_of
from otel_ofu.sources.prometheus_text import Sample

R = names.RejectReason
log = logging.getLogger(__name__)

# Every dcgm-exporter metric name starts so; a request without these bytes has no dcgm-exporter series (one C-level
# search of the request's bytes: the producers' requests pay nothing more for this stage).
_DCGM_PREFIX = "DCGM_"
_DCGM_MARK = _DCGM_PREFIX.encode()
# DataPointFlags.FLAG_NO_RECORDED_VALUE: the receiver's staleness marker for a series gone from the page.
_NO_RECORDED_VALUE = 1
# The Resource attributes the receiver names a scrape target by, and those that say where the exporter runs: the node
# Kubernetes service discovery found its pod on, else the address it was scraped at (what the producer's dcgm-exporter
# source names a GPU's host by when the page's Hostname label is missing: the URL's host).
_TARGET_KEYS = (names.SERVICE_NAME, names.SERVICE_INSTANCE_ID)
_HOST_KEYS = ("k8s.node.name", "server.address")
# The scrape targets kept at most: a dcgm-exporter per node, so the largest fleets' nodes many times over.
DEFAULT_MAX_TARGETS = 65_536
DEFAULT_STALE_AFTER_S = 600.0
# Silent targets are looked for every this many pages, not on every one.
_SWEEP_EVERY = 1024


@attrs.frozen
class Refusal:
    """A scrape of a target that was not translated: its points, why (a ``names.RejectReason`` code) and in words."""

    points: int
    code: str
    message: str


@attrs.frozen
class Translation:
    """A request with each dcgm-exporter scrape's GPUs appended as the producer would have sent them.

    ``raw`` is the new request's bytes: the old ones with the new Resources' after them (two encodings of a request
    side by side are the encoding of the two concatenated, so nothing is re-encoded)."""

    request: ExportMetricsServiceRequest
    raw: bytes
    gpus: int  # the GPU Resources appended
    refusals: tuple[Refusal, ...] = ()


@attrs.define
class _Target:
    pages: ExporterPages
    last_ns: int = 0  # the newest scrape time translated, for the staleness sweep


def _scrape_view_class() -> type[Message]:
    """ExportMetricsServiceRequest read down to its number data points, each point's attributes left as their
    encodings (``repeated bytes``: a message and a bytes field share the wire format), so that a GPU's label set is
    decoded once per request, not once per series. Field numbers are OTLP's; proto2, so that ``as_double`` and
    ``as_int`` (a oneof in OTLP) say which is set. What is not declared (exemplars, histograms, ...) stays unread."""
    field = descriptor_pb2.FieldDescriptorProto
    package = "otel_ofu_collector.scrape_view"
    proto = descriptor_pb2.FileDescriptorProto(name="otel_ofu_collector/scrape_view.proto", package=package)
    proto.syntax = "proto2"

    def message(name: str, *fields: tuple[str, int, int, str | None, bool]) -> None:
        added = proto.message_type.add(name=name)
        for field_name, number, kind, type_name, repeated in fields:
            entry = added.field.add(name=field_name, number=number, type=kind)
            entry.label = field.LABEL_REPEATED if repeated else field.LABEL_OPTIONAL
            if type_name is not None:
                entry.type_name = f".{package}.{type_name}"

    message(
        "Point",
        ("time_unix_nano", 3, field.TYPE_FIXED64, None, False),
        ("as_double", 4, field.TYPE_DOUBLE, None, False),
        ("as_int", 6, field.TYPE_SFIXED64, None, False),
        ("attributes", 7, field.TYPE_BYTES, None, True),
        ("flags", 8, field.TYPE_UINT32, None, False),
    )
    message("Points", ("data_points", 1, field.TYPE_MESSAGE, "Point", True))
    message(
        "Metric",
        ("name", 1, field.TYPE_STRING, None, False),
        ("gauge", 5, field.TYPE_MESSAGE, "Points", False),
        ("sum", 7, field.TYPE_MESSAGE, "Points", False),
    )
    message("ScopeMetrics", ("metrics", 2, field.TYPE_MESSAGE, "Metric", True))
    message(
        "ResourceMetrics",
        ("resource", 1, field.TYPE_BYTES, None, False),
        ("scope_metrics", 2, field.TYPE_MESSAGE, "ScopeMetrics", True),
    )
    message("Request", ("resource_metrics", 1, field.TYPE_MESSAGE, "ResourceMetrics", True))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.Request"))


_ScrapeView: Any = _scrape_view_class()


def _labels(encoded: tuple[bytes, ...]) -> dict[str, str]:
    """A point's attributes as the series' labels (the receiver writes every label as a string)."""
    labels = {}
    for item in encoded:
        kv = KeyValue.FromString(item)
        labels[kv.key] = kv.value.string_value
    return labels


def _value(point: Any) -> float | None:
    if point.HasField("as_double"):
        value: float = point.as_double
        return value
    if point.HasField("as_int"):
        return float(point.as_int)
    return None


def _attribute(resource: Any, keys: tuple[str, ...]) -> str | None:
    found = {kv.key: kv.value.string_value for kv in resource.attributes if kv.key in keys}
    return next((found[key] for key in keys if found.get(key)), None)


def _target_key(resource: Any) -> tuple[str, ...]:
    """What names a scrape target: the receiver's job and instance, else (not from a Prometheus receiver) the whole
    Resource."""
    key = tuple(_attribute(resource, (attribute,)) or "" for attribute in _TARGET_KEYS)
    return key if any(key) else (resource.SerializeToString().hex(),)


def scrapes(rm: Any) -> dict[int, list[Sample]] | None:
    """A ResourceMetrics' points (of the bytes view, ``_ScrapeView``) as the page(s) they were scraped from: samples by
    scrape time; None when the Resource carries no dcgm-exporter metric (then it is not a dcgm-exporter scrape).

    Every series of a GPU makes the GPU known, as on the producer's side, but only the fields the producer reads carry
    a value there (``names.DCGM_EXPORTER_FIELDS``): a series of another metric is kept only when its label set is new
    to the request, which is all the page reader can learn from it. A counter's name loses a ``_total`` suffix as the
    producer's page parser drops the one prometheus-client adds (dcgm-exporter's own ``..._TOTAL`` names keep theirs).
    """
    if not any(metric.name.startswith(_DCGM_PREFIX) for sm in rm.scope_metrics for metric in sm.metrics):
        return None  # the common case for every other Resource: one look at each metric's name
    pages: dict[int, list[Sample]] = {}
    label_sets: dict[tuple[bytes, ...], dict[str, str]] = {}
    read = names.DCGM_EXPORTER_FIELDS
    for sm in rm.scope_metrics:
        for metric in sm.metrics:
            if metric.HasField("gauge"):
                points = metric.gauge.data_points
            elif metric.HasField("sum"):
                points = metric.sum.data_points
            else:
                continue  # histograms and summaries: dcgm-exporter prints none, and no reading is one
            name = metric.name.removesuffix("_total")
            wanted = name in read
            for point in points:
                encoded = tuple(point.attributes)
                labels = label_sets.get(encoded)
                if labels is None:
                    labels = label_sets[encoded] = _labels(encoded)
                elif not wanted:
                    continue  # a GPU this request has shown already, in a metric the reader does not read
                value = _value(point)
                if value is None or point.flags & _NO_RECORDED_VALUE:
                    continue  # a staleness marker says the series is gone: not a reading
                pages.setdefault(point.time_unix_nano, []).append(Sample(name, labels, value))
    return pages


def carries_dcgm_series(raw: bytes) -> bool:
    """Whether a request may hold a dcgm-exporter scrape: one search of its bytes."""
    return _DCGM_MARK in raw


@attrs.define
class DcgmSeries:
    """The stage: ``translate`` a request before the decoder reads it (``CollectorService.ingest`` calls it).

    ``attribution`` and ``calibration`` are the producer's (``otel_ofu.attribution``, ``--calibration``): the same
    options give the same attributes and OFU. Thread-safe: receivers call it from many threads; one lock guards the
    targets and the builder's caches."""

    attribution: Attribution = hints_attribution
    calibration: CalibrationTable = attrs.field(factory=CalibrationTable)
    max_targets: int = DEFAULT_MAX_TARGETS
    stale_after_s: float = DEFAULT_STALE_AFTER_S
    # The translated GPUs' Resources: the producer's, without this process's environment (it is not the GPUs' host).
    builder: MetricsDataBuilder = attrs.field(
        factory=lambda: MetricsDataBuilder(base=Resource({names.SERVICE_NAME: names.PRODUCER_SERVICE_NAME}))
    )
    pages_translated: int = attrs.field(init=False, default=0)
    targets_evicted: int = attrs.field(init=False, default=0)
    _unswept: int = attrs.field(init=False, default=0)  # pages translated since the last sweep
    _targets: OrderedDict[tuple[str, ...], _Target] = attrs.field(init=False, factory=OrderedDict)
    _newest_ns: int = attrs.field(init=False, default=0)
    _lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)
    _failed: bool = attrs.field(init=False, default=False)  # a defect said once

    def __attrs_post_init__(self) -> None:
        if self.max_targets < 1:
            raise ValueError(f"max_targets must be at least 1, got {self.max_targets}")
        if not self.stale_after_s > 0:
            raise ValueError(f"stale_after_s must be positive, got {self.stale_after_s}")

    @property
    def targets(self) -> int:
        """Scrape targets held now."""
        return len(self._targets)

    def translate(self, request: ExportMetricsServiceRequest, raw: bytes | None) -> Translation | None:
        """``request`` with the GPUs of every dcgm-exporter scrape in it appended (``request`` itself is extended);
        None when it holds none (a producer's request: nothing to do, nothing copied). A defect here costs the scrapes
        their GPUs, never the request: it is logged (once) and the request goes to the decoder as it came."""
        before = raw if raw is not None else request.SerializeToString()
        if not carries_dcgm_series(before):
            return None
        try:
            return self._translate(request, before)
        except Exception:
            if not self._failed:
                self._failed = True
                log.exception("reading dcgm-exporter scrapes failed; the request goes on without their GPUs")
            return None

    def _translate(self, request: ExportMetricsServiceRequest, before: bytes) -> Translation | None:
        # Scrapes by target, so that a target's scrapes are read oldest first however the request orders them (a
        # batch of several scrapes), and one scrape sent as several ResourceMetrics is one page.
        targets: dict[tuple[str, ...], tuple[Any, dict[int, list[Sample]]]] = {}
        for rm in _ScrapeView.FromString(before).resource_metrics:
            pages = scrapes(rm)
            if pages is None:
                continue
            resource = PbResource.FromString(rm.resource)
            key = _target_key(resource)
            if key not in targets:
                targets[key] = (resource, pages)
                continue
            merged = targets[key][1]
            for time_ns, samples in pages.items():
                merged.setdefault(time_ns, []).extend(samples)
        if not targets:
            return None
        encoded: list[bytes] = []
        refusals: list[Refusal] = []
        gpus = 0
        with self._lock:
            for key, (resource, pages) in targets.items():
                for part, count in self._translate_target(key, resource, pages, refusals):
                    encoded.append(part)
                    gpus += count
            self._sweep()
        if not encoded:
            return Translation(request, before, 0, tuple(refusals))
        appended = b"".join(encoded)
        request.MergeFromString(appended)  # parses only what was appended
        return Translation(request, before + appended, gpus, tuple(refusals))

    def _translate_target(
        self, key: tuple[str, ...], resource: Any, pages: dict[int, list[Sample]], refusals: list[Refusal]
    ) -> Iterator[tuple[bytes, int]]:
        """Each scrape of one target, oldest first, as the encoded request of its GPUs and how many they are."""
        target = self._target(key, _attribute(resource, _HOST_KEYS))
        where = "/".join(part for part in key if part)
        for time_ns in sorted(pages):
            samples = pages[time_ns]
            previous = target.pages.previous_ns
            if time_ns <= 0 or (previous is not None and time_ns <= previous):
                refusals.append(
                    Refusal(
                        len(samples),
                        R.LATE if time_ns > 0 else R.BAD_TIME,
                        f"dcgm-exporter scrape of {where} at {time_ns} ns not after its previous one ({previous} ns)",
                    )
                )
                continue
            entries = entries_of(samples)
            if not entries:
                refusals.append(
                    Refusal(
                        len(samples),
                        R.NO_IDENTITY,
                        f"dcgm-exporter scrape of {where}: no series with a GPU UUID label (UUID or uuid)",
                    )
                )
                continue
            snapshot = target.pages.snapshot(entries, time_ns)
            target.last_ns = time_ns
            self._newest_ns = max(self._newest_ns, time_ns)
            self.pages_translated += 1
            self._unswept += 1
            computed = compute_snapshot(snapshot, attribution=self.attribution, calibration=self.calibration)
            data = self.builder.build(computed)
            yield encode_request(data), len(data.resource_metrics)

    def _target(self, key: tuple[str, ...], host: str | None) -> _Target:
        target = self._targets.get(key)
        if target is None:
            while len(self._targets) >= self.max_targets:
                self._targets.popitem(last=False)  # the least recently scraped
                self.targets_evicted += 1
            target = self._targets[key] = _Target(ExporterPages(host_fallback=host))
        else:
            self._targets.move_to_end(key)
        return target

    def _sweep(self) -> None:
        """Forget the targets silent for ``stale_after_s`` (by the scrapes' own clock), every so many pages."""
        if self._unswept < _SWEEP_EVERY:
            return
        self._unswept = 0
        oldest = self._newest_ns - int(self.stale_after_s * 1e9)
        for key in [key for key, target in self._targets.items() if target.last_ns < oldest]:
            del self._targets[key]
            self.targets_evicted += 1
