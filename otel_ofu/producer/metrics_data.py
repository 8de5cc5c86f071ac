"""From a source snapshot to the SDK's ``MetricsData``: one ResourceMetrics per GPU, gauges of the contract.

The Python SDK has no MetricProducer hook, and an observable-gauge pipeline would stamp every point with
the collection time and one resource for the whole process. Building ``MetricsData`` ourselves keeps the
sample's own interval as the point's timestamps and gives each GPU its own Resource. The ``MetricsData`` goes
to an SDK ``MetricExporter``: the producer's own OTLP exporter (``exporters.py``) encodes it itself (the gauges'
start times kept), sends it itself and reads the ``OTEL_EXPORTER_OTLP_*`` variables; the console exporter prints it.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterable, Iterator, Mapping, Sequence

import attrs
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

import otel_ofu
from otel_ofu import names
from otel_ofu.gpu_samples import (
    AttributeValue,
    Attribution,
    ComputedSnapshot,
    GpuSample,
    PartialSample,
    compute_snapshot,
    hints_attribution,
    no_attribution,
)
from otel_ofu.gpu_values import CalibrationTable
from otel_ofu.model import EnergyCounter, IoCounter, Snapshot

log = logging.getLogger(__name__)

# Re-exported: the producer's callers import the per-GPU values from here.
__all__ = [
    "AttributeValue",
    "Attribution",
    "ComputedSnapshot",
    "GpuSample",
    "MetricsDataBuilder",
    "compute_snapshot",
    "env_resource",
    "no_attribution",
    "snapshot_to_metrics_data",
]

# The schema URL (on the scope and on every resource, as OTLP carries it) names the semantic conventions the
# resources follow: hw.*, host.name, k8s.*.
SCOPE = InstrumentationScope(names.INSTRUMENTATION_SCOPE, otel_ofu.__version__, names.SCHEMA_URL)
_IDENTITY = frozenset(names.IDENTITY_ATTRIBUTES)
# name -> (description, unit, whether it is a cumulative sum), looked up for every metric of every export.
_METRIC_HEADERS = {spec.name: (spec.description, spec.unit, spec.kind == "sum") for spec in names.PRODUCER_METRICS}


def env_resource(
    host_name: str | None = None,
    *,
    default_service_name: str = names.PRODUCER_SERVICE_NAME,
    with_host: bool = True,
) -> Resource:
    """A process's own resource: SDK defaults, ``OTEL_RESOURCE_ATTRIBUTES``/``OTEL_SERVICE_NAME``, our names.

    ``service.name`` is ``default_service_name`` unless the user set one through the standard variables.
    With ``with_host``, ``host.name`` is ``host_name`` (else this machine's) unless the user pinned one: a
    container's hostname is rarely the node's.
    """
    user = OTELResourceDetector().detect().attributes
    ours: dict[str, AttributeValue] = {}
    if names.SERVICE_NAME not in user:
        ours[names.SERVICE_NAME] = default_service_name
    if with_host and names.HOST_NAME not in user:
        ours[names.HOST_NAME] = host_name or socket.gethostname()
    # Resource.create lets ours override the environment's: only what the user left unset is in ``ours``.
    return Resource.create(ours)


class _GpuResource(Resource):
    """A Resource whose hash is computed once: the SDK's encoder hashes every resource on every export,
    and the stock hash serialises all attributes to JSON each time."""

    def __init__(self, attributes: Mapping[str, AttributeValue]) -> None:
        super().__init__(dict(attributes), names.SCHEMA_URL)
        self._hash = super().__hash__()

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return super().__eq__(other)


# Our points carry no exemplars: one shared empty sequence instead of a new list per point, which would
# be one more object per point for the garbage collector to track while the export is alive.
_NO_EXEMPLARS: tuple[()] = ()


def _metric(name: str, points: list[NumberDataPoint]) -> Metric:
    description, unit, is_sum = _METRIC_HEADERS[name]
    if is_sum:  # gpu.energy, gpu.nvlink.io, gpu.pcie.io: counters since their start time
        data: Gauge | Sum = Sum(points, AggregationTemporality.CUMULATIVE, True)
    else:
        data = Gauge(points)
    return Metric(name, description, unit, data)


def _sample_metrics(sample: GpuSample, point_attributes: Mapping[str, AttributeValue]) -> list[Metric]:
    """One metric per known value of the sample: the gauges, gpu.energy, gpu.throttle with a point per reason, the
    link counters with a point per network.io.direction (each its own series, from its own start time).

    Built positionally and without intermediate grouping: this runs for every GPU on every export."""
    start, end, values = sample.start_ns, sample.end_ns, sample.values
    headers = _METRIC_HEADERS
    metrics = [
        Metric(
            name,
            headers[name][0],
            headers[name][1],
            Gauge([NumberDataPoint(point_attributes, start, end, value, _NO_EXEMPLARS)]),
        )
        for name, value in values.as_metrics().items()
    ]
    metrics += _counter_metrics(values.energy, values.throttle, values.link_counters(), point_attributes, start, end)
    return metrics


def _counter_metrics(
    energy: EnergyCounter | None,
    throttle: Mapping[str, float],
    links: Iterable[tuple[names.MetricSpec, Mapping[str, IoCounter]]],
    point_attributes: Mapping[str, AttributeValue],
    start: int,
    end: int,
) -> list[Metric]:
    """gpu.energy, gpu.throttle with a point per reason, the link counters with a point per network.io.direction
    (each its own series, from its own start time): what a GPU gave beside its gauges."""
    metrics: list[Metric] = []
    if energy is not None:
        point = NumberDataPoint(point_attributes, energy.start_ns, end, energy.joules, _NO_EXEMPLARS)
        metrics.append(_metric(names.GPU_ENERGY.name, [point]))
    if throttle:
        points = [
            NumberDataPoint({**point_attributes, names.GPU_THROTTLE_REASON: reason}, start, end, share, _NO_EXEMPLARS)
            for reason, share in throttle.items()
        ]
        metrics.append(_metric(names.GPU_THROTTLE.name, points))
    for spec, counters in links:
        points = [
            NumberDataPoint(
                {**point_attributes, names.NETWORK_IO_DIRECTION: direction},
                counter.start_ns,
                end,
                counter.total_bytes,
                _NO_EXEMPLARS,
            )
            for direction, counter in counters.items()
        ]
        metrics.append(_metric(spec.name, points))
    return metrics


def _partial_metrics(partial: PartialSample, point_attributes: Mapping[str, AttributeValue]) -> list[Metric]:
    """A GPU read without OFU: ``gpu.ofu.unmeasured`` over its interval (with ``error.type``, why), and whatever it
    did give (clocks, activities, power, energy, throttle shares, link bytes), so that its time and energy are billed
    as its own, unmeasured, neither as work nor as idleness."""
    start, end = partial.start_ns, partial.end_ns
    headers = _METRIC_HEADERS
    marker = NumberDataPoint({**point_attributes, names.ERROR_TYPE: partial.reason}, start, end, 1, _NO_EXEMPLARS)
    metrics = [_metric(names.GPU_OFU_UNMEASURED.name, [marker])]
    metrics += [
        Metric(
            name,
            headers[name][0],
            headers[name][1],
            Gauge([NumberDataPoint(point_attributes, start, end, value, _NO_EXEMPLARS)]),
        )
        for name, value in partial.known.items()
    ]
    metrics += _counter_metrics(partial.energy, partial.throttle, _links(partial), point_attributes, start, end)
    return metrics


def _links(partial: PartialSample) -> tuple[tuple[names.MetricSpec, Mapping[str, IoCounter]], ...]:
    return tuple(
        (spec, counters)
        for spec, counters in ((names.GPU_NVLINK_IO, partial.nvlink_io), (names.GPU_PCIE_IO, partial.pcie_io))
        if counters
    )


def _sample_points(
    sample: GpuSample | PartialSample, point_attributes: Mapping[str, AttributeValue]
) -> Iterator[tuple[str, NumberDataPoint]]:
    """(metric name, point) of every known value of the sample, in the order of ``_sample_metrics``."""
    metrics = (
        _sample_metrics(sample, point_attributes)
        if isinstance(sample, GpuSample)
        else _partial_metrics(sample, point_attributes)
    )
    for metric in metrics:
        for point in metric.data.data_points:
            yield metric.name, point  # type: ignore[misc]


@attrs.define
class MetricsDataBuilder:
    """Builds one export's ``MetricsData``; caches each GPU's Resource while its attributes stay the same."""

    placement: str = "resource"
    base: Resource = attrs.field(factory=env_resource)
    _cache: dict[tuple[tuple[str, AttributeValue], ...], Resource] = attrs.field(factory=dict, init=False)
    _own: Resource | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        if self.placement not in names.PLACEMENTS:
            raise ValueError(f"placement {self.placement!r} is not one of {', '.join(names.PLACEMENTS)}")

    @property
    def own_resource(self) -> Resource:
        """The producer's own resource, where its self-metrics go."""
        if self._own is None:
            self._own = _GpuResource(self.base.attributes)  # type: ignore[arg-type]
        return self._own

    def _resource(self, attributes: Mapping[str, AttributeValue]) -> Resource:
        # In the attributes' own order (hints, attribution, identity: the same every read); an equal set
        # in another order gets an equal Resource, which the encoder merges as the SDK's does.
        key = tuple(attributes.items())
        resource = self._cache.get(key)
        if resource is None:
            if len(self._cache) > 4096:  # jobs come and go; never grow without bound
                self._cache.clear()
            merged: dict[str, AttributeValue] = dict(self.base.attributes)  # type: ignore[arg-type]
            merged.update(attributes)  # the GPU's identity and job win over the environment's
            resource = self._cache[key] = _GpuResource(merged)
        return resource

    def build(self, computed: ComputedSnapshot, self_metrics: Sequence[Metric] = ()) -> MetricsData:
        # The GPUs read without OFU too: they are allocated and draw power, and their time is billed.
        gpus: list[GpuSample | PartialSample] = [*computed.samples, *computed.partial]
        gpu_resources = self._host_level(gpus) if self.placement == "datapoint" else self._per_gpu(gpus)
        resource_metrics = [
            ResourceMetrics(resource=resource, scope_metrics=[ScopeMetrics(SCOPE, metrics, "")], schema_url="")
            for resource, metrics in gpu_resources
        ]
        if self_metrics:
            scope = ScopeMetrics(SCOPE, list(self_metrics), "")
            resource_metrics.append(ResourceMetrics(self.own_resource, [scope], ""))
        return MetricsData(resource_metrics=resource_metrics)

    def _per_gpu(self, samples: Iterable[GpuSample | PartialSample]) -> list[tuple[Resource, list[Metric]]]:
        # Grouped by resource: the SDK's encoder keys resources in a dict, so two entries with equal
        # resources (a GPU read twice) would silently lose one.
        grouped: dict[Resource, list[Metric]] = {}
        for sample in samples:
            resource = self._resource(sample.attributes)
            point_attributes = self._identity(sample.attributes) if self.placement == "both" else {}
            metrics = (
                _sample_metrics(sample, point_attributes)
                if isinstance(sample, GpuSample)
                else _partial_metrics(sample, point_attributes)
            )
            grouped.setdefault(resource, []).extend(metrics)
        return list(grouped.items())

    def _host_level(self, samples: Sequence[GpuSample | PartialSample]) -> list[tuple[Resource, list[Metric]]]:
        # Identity only on the points: every GPU's resource would be the same, so the host sends one
        # resource with a gauge per metric and a point per GPU.
        if not samples:
            return []
        shared = {
            key: value for key, value in samples[0].attributes.items() if key not in _IDENTITY or key == names.HOST_NAME
        }
        points: dict[str, list[NumberDataPoint]] = {}
        for sample in samples:
            point_attributes = self._identity(sample.attributes)
            for name, point in _sample_points(sample, point_attributes):
                points.setdefault(name, []).append(point)
        metrics = [_metric(name, pts) for name, pts in points.items()]
        return [(self._resource(shared), metrics)]

    @staticmethod
    def _identity(attributes: Mapping[str, AttributeValue]) -> dict[str, AttributeValue]:
        return {key: value for key, value in attributes.items() if key in _IDENTITY}


def snapshot_to_metrics_data(
    snapshot: Snapshot,
    *,
    attribution: Attribution = hints_attribution,
    calibration: CalibrationTable | None = None,
    placement: str = "resource",
    base: Resource | None = None,
) -> MetricsData:
    """One-shot conversion without self-metrics (the producer loop keeps a builder and its caches)."""
    builder = MetricsDataBuilder(placement=placement, base=base if base is not None else env_resource())
    return builder.build(compute_snapshot(snapshot, attribution=attribution, calibration=calibration))
