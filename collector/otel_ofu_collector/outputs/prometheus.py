"""A Prometheus ``/metrics`` endpoint for the window outputs and the collector's own counters.

A window consumer: it shows the gauges of the latest closed windows (quantiles, fleet.gpus, the job gauges,
the fleet correlation and MAE), built from the window values themselves (``results.gauge_points``, the same
points the OTLP encoder writes), and leaves the exponential histogram out: Prometheus text has no
exponential histogram, and the SDK's Prometheus reader fails on them. Names follow the OpenTelemetry-to-Prometheus
convention (``otel_ofu.prometheus_names``): dots become underscores (``fleet.ofu.quantile`` ->
``fleet_ofu_quantile``), attribute keys too; the outputs' names get no unit suffix. The one exception is the
percentile gauge's ``quantile`` attribute, exposed as ``ofu_quantile`` (``names.PROMETHEUS_QUANTILE_LABEL``):
Prometheus reserves ``quantile`` for summaries, and ``promtool check metrics`` refuses it on a gauge.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from http.server import ThreadingHTTPServer
from typing import Any

import attrs
from prometheus_client import CollectorRegistry, MetricsHandler
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from otel_ofu import names
from otel_ofu.prometheus_names import label_name, metric_name
from otel_ofu_collector.results import OUTPUT_METRICS, WindowReport, gauge_points


def output_label(key: str) -> str:
    """The Prometheus label of an output attribute (``label_name``, but quantile -> ofu_quantile)."""
    return names.PROMETHEUS_QUANTILE_LABEL if key == names.QUANTILE else label_name(key)


def prometheus_name(name: str) -> str:
    """The exposed name of an output or self-metric: by name alone, no unit suffix (what the dashboards query)."""
    return metric_name(name)


@attrs.frozen
class _Series:
    name: str
    description: str
    labels: tuple[tuple[str, str], ...]
    value: float


_GAUGE_ORDER: Mapping[str, int] = {spec.name: index for index, spec in enumerate(OUTPUT_METRICS)}


def gauge_series(reports: Sequence[WindowReport]) -> list[_Series]:
    """The closed windows' gauge outputs (no histograms, no partial state) as Prometheus series: metric by
    metric in the contract's order, each metric's points window by window."""
    points = sorted(
        (point for report in reports for point in gauge_points(report)),
        key=lambda point: _GAUGE_ORDER.get(point.spec.name, len(_GAUGE_ORDER)),
    )  # stable: within a metric the windows keep their order
    return [
        _Series(
            prometheus_name(point.spec.name),
            point.spec.description or point.spec.name,
            tuple(sorted((output_label(key), str(value)) for key, value in point.attributes.items())),
            float(point.value),
        )
        for point in points
    ]


@attrs.define(eq=False)  # the registry keys collectors by identity
class OutputsCollector(Collector):
    """A prometheus-client custom collector over the latest window outputs and the self-metrics."""

    self_metrics: Callable[[], Mapping[str, Any]] | None = None
    _series: list[_Series] = attrs.field(factory=list)
    _lock: threading.Lock = attrs.field(factory=threading.Lock)

    def consume_windows(self, windows: Sequence[WindowReport]) -> None:
        """Replace the shown outputs with the newest windows' (a job that stopped reporting disappears)."""
        fresh = gauge_series(windows)
        with self._lock:
            self._series = fresh

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        with self._lock:
            series = list(self._series)
        families: dict[tuple[str, tuple[str, ...]], GaugeMetricFamily] = {}
        seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
        for item in reversed(series):  # windows are encoded oldest first
            if (item.name, item.labels) in seen:
                continue  # two windows closed in one flush: the newest wins
            seen.add((item.name, item.labels))
            keys = tuple(key for key, _ in item.labels)
            family = families.get((item.name, keys))
            if family is None:
                family = GaugeMetricFamily(item.name, item.description, labels=list(keys))
                families[(item.name, keys)] = family
            family.add_metric([value for _, value in item.labels], item.value)
        merged: dict[str, GaugeMetricFamily] = {}
        for (name, _keys), family in families.items():
            if name in merged:
                merged[name].samples.extend(family.samples)
            else:
                merged[name] = family
        yield from merged.values()
        if self.self_metrics is not None:
            yield from _self_metric_families(self.self_metrics())


_SELF_METRIC_KINDS: Mapping[str, str] = {spec.name: spec.kind for spec in names.COLLECTOR_SELF_METRICS}


def _self_metric_families(values: Mapping[str, Any]) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
    for name, value in values.items():
        base = prometheus_name(name)
        is_gauge = _SELF_METRIC_KINDS.get(name) == "gauge"
        if isinstance(value, Mapping):
            label = label_name(names.COLLECTOR_SELF_METRIC_KEYS.get(name, "reason"))
            family: GaugeMetricFamily | CounterMetricFamily = (
                GaugeMetricFamily(base, name, labels=[label])
                if is_gauge
                else CounterMetricFamily(base, name, labels=[label])
            )
            for key, count in value.items():
                family.add_metric([str(key)], float(count))
        else:
            family = GaugeMetricFamily(base, name) if is_gauge else CounterMetricFamily(base, name)
            family.add_metric([], float(value))
        yield family


@attrs.define
class PrometheusEndpoint:
    """Serves ``/metrics`` from a private registry on ``host:port`` (0 picks a free port)."""

    self_metrics: Callable[[], Mapping[str, Any]] | None = None
    collector: OutputsCollector = attrs.field(init=False)
    registry: CollectorRegistry = attrs.field(init=False, factory=lambda: CollectorRegistry(auto_describe=False))
    port: int = 0
    _server: ThreadingHTTPServer | None = attrs.field(default=None, init=False)
    _thread: threading.Thread | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        self.collector = OutputsCollector(self.self_metrics)
        self.registry.register(self.collector)

    def consume_windows(self, windows: Sequence[WindowReport]) -> None:
        """A window consumer: the endpoint shows the gauges of each newest batch of closed windows."""
        self.collector.consume_windows(windows)

    def start(self, host: str = "0.0.0.0", port: int = 0) -> int:
        """Bind and serve; OSError (one line, naming the address) when the port cannot be had."""
        try:
            server = ThreadingHTTPServer((host, port), MetricsHandler.factory(self.registry))
        except OSError as error:
            address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            raise OSError(f"cannot serve Prometheus metrics on {address} ({error.strerror or error})") from error
        server.daemon_threads = True
        thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="otel-ofu-prometheus", daemon=True
        )
        thread.start()
        self._server, self._thread = server, thread
        self.port = int(server.server_address[1])
        return self.port

    def stop(self) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join()
