"""An optional Prometheus ``/metrics`` endpoint serving the latest interval.

Prometheus has no resources, so each GPU's identity and job attribution become labels. Names follow
``otel_ofu.prometheus_names`` with the unit as a suffix: ``gpu.clock.sm`` (``Hz``) -> ``gpu_clock_sm_hertz``,
``gpu.flops.achieved`` -> ``gpu_flops_achieved_per_second``, counters end in ``_total`` (``gpu.nvlink.io`` ->
``gpu_nvlink_io_bytes_total``); ``hw.id`` -> ``hw_id``.
The producer's own counters (``otel_ofu.source.errors``, ``otel_ofu.export.failures``, ``otel_ofu.export.rejected``)
show from the first scrape (every reason), at 0 until they count.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping

import attrs
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from otel_ofu import names
from otel_ofu.control_chars import escaped
from otel_ofu.gpu_samples import GpuSample, PartialSample
from otel_ofu.http_endpoint import HttpEndpoint, Reply, Request
from otel_ofu.model import IoCounter
from otel_ofu.producer.metrics_data import AttributeValue, ComputedSnapshot
from otel_ofu.producer.self_metrics import SelfMetrics
from otel_ofu.prometheus_names import label_name, metric_name


def prometheus_name(spec: names.MetricSpec) -> str:
    """The Prometheus metric name of a contract metric (without the ``_total`` a counter gets)."""
    return metric_name(spec.name, spec.unit)


PROMETHEUS_NAMES: Mapping[str, str] = {
    spec.name: prometheus_name(spec)
    for spec in (
        *names.PRODUCER_METRICS,
        names.SOURCE_ERRORS,
        names.EXPORT_FAILURES,
        names.EXPORT_DURATION,
        names.EXPORT_REJECTED,
    )
}


@attrs.define(eq=False)  # the registry keys collectors by identity
class LatestSnapshotCollector(Collector):
    """Yields the latest interval's gauges; ``update`` is the producer's observer hook."""

    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    _latest: ComputedSnapshot = attrs.field(factory=ComputedSnapshot, init=False)
    _self_metrics: SelfMetrics | None = attrs.field(default=None, init=False)

    def update(self, computed: ComputedSnapshot, self_metrics: SelfMetrics) -> None:
        with self._lock:
            self._latest, self._self_metrics = computed, self_metrics

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            latest, self_metrics = self._latest, self._self_metrics
        gpus: list[GpuSample | PartialSample] = [*latest.samples, *latest.partial]
        labels = sorted({label_name(key) for sample in gpus for key in sample.attributes})
        families: dict[str, GaugeMetricFamily] = {}
        for sample in gpus:
            values = _label_values(sample.attributes, labels)
            gauges = sample.values.as_metrics() if isinstance(sample, GpuSample) else sample.known
            for name, value in gauges.items():
                family = families.get(name)
                if family is None:
                    spec = _spec(name)
                    family = families[name] = GaugeMetricFamily(PROMETHEUS_NAMES[name], spec.description, labels=labels)
                family.add_metric(values, value)
        yield from families.values()
        if latest.partial:  # GPUs read without OFU: 1, with why (error_type)
            spec = names.GPU_OFU_UNMEASURED
            unmeasured = GaugeMetricFamily(
                PROMETHEUS_NAMES[spec.name], spec.description, labels=[*labels, label_name(names.ERROR_TYPE)]
            )
            for partial in latest.partial:
                unmeasured.add_metric([*_label_values(partial.attributes, labels), partial.reason], 1.0)
            yield unmeasured
        yield from _loss_families(latest, labels)
        yield from _self_families(self_metrics)


def _loss_families(latest: ComputedSnapshot, labels: list[str]) -> Iterator[Metric]:
    """gpu.energy and the link counters as counters (``_total``, ``_created`` at their start; the links with a
    ``network_io_direction`` label), gpu.throttle with a reason label."""
    energy_spec, throttle_spec = names.GPU_ENERGY, names.GPU_THROTTLE
    energy = CounterMetricFamily(PROMETHEUS_NAMES[energy_spec.name], energy_spec.description, labels=labels)
    reason = label_name(names.GPU_THROTTLE_REASON)
    shares = GaugeMetricFamily(
        PROMETHEUS_NAMES[throttle_spec.name], throttle_spec.description, labels=[*labels, reason]
    )
    direction = label_name(names.NETWORK_IO_DIRECTION)
    links = {
        spec.name: CounterMetricFamily(PROMETHEUS_NAMES[spec.name], spec.description, labels=[*labels, direction])
        for spec in (names.GPU_NVLINK_IO, names.GPU_PCIE_IO)
    }
    gpus: list[GpuSample | PartialSample] = [*latest.samples, *latest.partial]
    for sample in gpus:
        values = _label_values(sample.attributes, labels)
        link_counters: Iterable[tuple[names.MetricSpec, Mapping[str, IoCounter]]]
        if isinstance(sample, GpuSample):
            counter, throttle = sample.values.energy, sample.values.throttle
            link_counters = sample.values.link_counters()
        else:
            counter, throttle = sample.energy, sample.throttle
            link_counters = ((names.GPU_NVLINK_IO, sample.nvlink_io), (names.GPU_PCIE_IO, sample.pcie_io))
        if counter is not None:
            energy.add_metric(values, counter.joules, created=counter.start_ns / 1e9)
        for cause, share in throttle.items():
            shares.add_metric([*values, cause], share)
        for spec, counters in link_counters:
            for way, link in counters.items():
                links[spec.name].add_metric([*values, way], link.total_bytes, created=link.start_ns / 1e9)
    for family in (energy, shares, *links.values()):
        if family.samples:
            yield family


def _spec(name: str) -> names.MetricSpec:
    return next(spec for spec in names.PRODUCER_METRICS if spec.name == name)


def _label_values(attributes: Mapping[str, AttributeValue], labels: list[str]) -> list[str]:
    # A value a page or a pod label gave: its control characters written out, never a raw ESC on /metrics.
    by_label = {label_name(key): escaped(str(value)) for key, value in attributes.items()}
    return [by_label.get(label, "") for label in labels]  # an empty label is an absent one in Prometheus


def _self_families(self_metrics: SelfMetrics | None) -> Iterator[Metric]:
    """The producer's counters; before its first interval (``self_metrics`` None) every reason at 0."""
    errors, failures = self_metrics.totals() if self_metrics is not None else ({}, {})
    for spec, reasons, counts in (
        (names.SOURCE_ERRORS, names.ErrorReason.ALL, errors),
        (names.EXPORT_FAILURES, names.ExportFailureReason.ALL, failures),
    ):
        family = CounterMetricFamily(PROMETHEUS_NAMES[spec.name], spec.description, labels=[names.ERROR_REASON])
        # Every reason from the first scrape, at 0 until it counts: a series born at its first value shows no
        # increase, so rate() would miss a one-off burst.
        for reason, count in {**dict.fromkeys(reasons, 0), **counts}.items():
            family.add_metric([reason], count)
        yield family
    spec = names.EXPORT_REJECTED
    yield CounterMetricFamily(
        PROMETHEUS_NAMES[spec.name], spec.description, value=self_metrics.rejected_points if self_metrics else 0
    )
    duration = self_metrics.last_export_duration_s if self_metrics is not None else None
    if duration is not None:
        spec = names.EXPORT_DURATION
        yield GaugeMetricFamily(PROMETHEUS_NAMES[spec.name], spec.description, value=duration)


@attrs.define
class PrometheusEndpoint:
    """``/metrics`` on ``addr:port`` (port 0 picks a free one; ``port`` says which) with its own registry, under the
    bounds of ``http_endpoint`` (idle and slow clients cut, connections bounded).

    No default port: 9400 is dcgm-exporter's and the usual choice, 9464, may be taken; the caller says.
    """

    port: int
    addr: str = "0.0.0.0"
    collector: LatestSnapshotCollector = attrs.field(factory=LatestSnapshotCollector)
    _registry: CollectorRegistry = attrs.field(init=False, factory=lambda: CollectorRegistry(auto_describe=False))
    _server: HttpEndpoint | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        self._registry.register(self.collector)
        server = HttpEndpoint(self._reply, self.addr, self.port, name="otel-ofu-prometheus")
        self.port = server.start()
        self._server = server

    def _reply(self, request: Request) -> Reply:
        # Every path but the favicon is the page, as prometheus-client's own server answers.
        if request.path == "/favicon.ico":
            return Reply.text(404, "not found\n")
        return Reply(200, CONTENT_TYPE_LATEST, (generate_latest(self._registry),))

    def update(self, computed: ComputedSnapshot, self_metrics: SelfMetrics) -> None:
        self.collector.update(computed, self_metrics)

    def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop()
