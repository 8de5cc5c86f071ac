"""A Prometheus ``/metrics`` endpoint for the window outputs and the collector's own counters.

A window consumer: it shows the gauges of the recent closed windows (quantiles, fleet.gpus, the job gauges,
the fleet correlation and MAE), built from the window values themselves (``results.gauge_points``, the same
points the OTLP encoder writes), and leaves the exponential histogram out: Prometheus text has no
exponential histogram, and the SDK's Prometheus reader fails on them. Names follow the OpenTelemetry-to-Prometheus
convention (``otel_ofu.prometheus_names``): dots become underscores (``fleet.ofu.quantile`` ->
``fleet_ofu_quantile``), attribute keys too; the outputs' names get no unit suffix. The one exception is the
percentile gauge's ``quantile`` attribute, exposed as ``ofu_quantile`` (``names.PROMETHEUS_QUANTILE_LABEL``):
Prometheus reserves ``quantile`` for summaries, and ``promtool check metrics`` refuses it on a gauge.

A series stays on the endpoint, at its latest value, while it was in one of the last ``expiration_windows`` windows
(``--prometheus-expiration-windows``, default 2), as the OpenTelemetry Collector's Prometheus exporter keeps a series
for its ``metric_expiration``: a GPU or job that misses one window keeps its series (and an alert's ``for``), and
when producers stop, the collector's empty windows take every series off within that many windows, so Prometheus
marks them stale and the alerts on them resolve. Expiry counts windows by their end times, not batches: one flush
that closes several windows counts each. Every reason of a self-metric counter with a known set of reasons starts
at 0, so ``rate()`` sees the first burst (a series born at its first value has no increase to show).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

import attrs
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from otel_ofu import names
from otel_ofu.control_chars import escaped
from otel_ofu.http_endpoint import HttpEndpoint, Reply, Request
from otel_ofu.prometheus_names import label_name, metric_name
from otel_ofu_collector.results import OUTPUT_METRICS, WindowReport, gauge_points


@functools.cache  # a handful of keys, looked up for every attribute of every point of every window
def output_label(key: str) -> str:
    """The Prometheus label of an output attribute (``label_name``, but quantile -> ofu_quantile)."""
    return names.PROMETHEUS_QUANTILE_LABEL if key == names.QUANTILE else label_name(key)


@functools.cache  # the contract's few dozen names
def prometheus_name(name: str) -> str:
    """The exposed name of an output or self-metric: by name alone, no unit suffix (what the dashboards query)."""
    return metric_name(name)


DEFAULT_EXPIRATION_WINDOWS: Final = 2  # --prometheus-expiration-windows
# A value as prometheus-client writes it (Go's float format: "+Inf", "NaN", "1.5e+06"), so the page reads the same.
_float_text: Callable[[float], str] = floatToGoString

_GAUGE_ORDER: Mapping[str, int] = {spec.name: index for index, spec in enumerate(OUTPUT_METRICS)}


@attrs.frozen
class Series:
    name: str
    description: str
    labels: tuple[tuple[str, str], ...]
    value: float
    order: int  # the metric's place in the contract: families are shown in that order
    label_text: str = ""  # ``{key="value",...}`` as the exposition writes it ("" without labels)


def _label_value(value: str) -> str:
    """A label value as the text format escapes it (the backslash, the double quote, the newline)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def window_series(report: WindowReport) -> Iterator[Series]:
    """One closed window's gauge outputs (no histograms, no partial state) as Prometheus series."""
    for point in gauge_points(report):
        # The receiver refuses control characters in identity values; written out here all the same.
        labels = tuple(sorted((output_label(key), escaped(str(value))) for key, value in point.attributes.items()))
        text = ",".join(f'{key}="{_label_value(value)}"' for key, value in labels)
        yield Series(
            prometheus_name(point.spec.name),
            point.spec.description or point.spec.name,
            labels,
            float(point.value),
            _GAUGE_ORDER.get(point.spec.name, len(_GAUGE_ORDER)),
            f"{{{text}}}" if text else "",
        )


def _positive(_instance: object, _attribute: object, value: int) -> None:
    if value < 1:
        raise ValueError(f"expiration_windows must be at least 1, got {value}")


@attrs.define(eq=False)  # the registry keys collectors by identity
class OutputsCollector(Collector):
    """A prometheus-client custom collector over the recent window outputs and the self-metrics."""

    self_metrics: Callable[[], Mapping[str, Any]] | None = None
    expiration_windows: int = attrs.field(default=DEFAULT_EXPIRATION_WINDOWS, validator=_positive)
    # (name, labels) -> (the series, the end of the newest window it was in)
    _shown: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[Series, int]] = attrs.field(factory=dict, init=False)
    _newest_end_ns: int | None = attrs.field(default=None, init=False)
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    # The windows' part of the page, rendered at the first scrape after the windows changed and served from memory
    # until they change again: at 50,000 jobs it is tens of MB, which prometheus-client took seconds to write per
    # scrape (9.6 s, near Prometheus's 10 s timeout). ``renders`` counts the renderings.
    _page: bytes | None = attrs.field(default=None, init=False)
    _version: int = attrs.field(default=0, init=False)
    renders: int = attrs.field(default=0, init=False)

    def consume_windows(self, windows: Sequence[WindowReport]) -> None:
        """Take the windows' values (oldest first; a window older than a series' newest one does not replace it),
        then drop every series not seen for ``expiration_windows`` windows."""
        fresh = [(report, list(window_series(report))) for report in windows]
        with self._lock:
            shown = self._shown
            for report, series in fresh:
                end = report.end_ns
                refreshed = 0  # series first seen in this window now
                for item in series:
                    key = (item.name, item.labels)
                    known = shown.get(key)
                    if known is None or known[1] <= end:
                        refreshed += known is None or known[1] < end
                        shown[key] = (item, end)
                self._version += 1
                self._page = None
                if self._newest_end_ns is None or end > self._newest_end_ns:
                    self._newest_end_ns = end
                    if len(shown) > refreshed:  # else every series is in this window: none to expire
                        # Seen in window end - k x width for k < expiration_windows: kept; one window older: gone.
                        oldest_kept = end - (self.expiration_windows - 1) * (end - report.start_ns)
                        shown = {key: item for key, item in shown.items() if item[1] >= oldest_kept}
                        self._shown = shown

    def page(self) -> bytes:
        """The windows' series in the text format (the self-metrics are apart: ``self_metrics_page``)."""
        with self._lock:
            if self._page is not None:
                return self._page
            version = self._version
            series = [item for item, _end in self._shown.values()]
        families: dict[str, list[Series]] = {}
        for item in series:
            families.setdefault(item.name, []).append(item)
        lines: list[str] = []
        for name in sorted(families, key=lambda found: families[found][0].order):
            members = families[name]
            description = members[0].description.replace("\\", "\\\\").replace("\n", "\\n")
            lines.append(f"# HELP {name} {description}\n# TYPE {name} gauge\n")
            lines.extend(f"{name}{item.label_text} {_float_text(item.value)}\n" for item in members)
        page = "".join(lines).encode()
        with self._lock:
            if self._version == version:
                self._page = page
            self.renders += 1
        return page

    def self_metrics_page(self) -> bytes:
        """The collector's own counters in the text format (small: written per scrape, always current)."""
        if self.self_metrics is None:
            return b""
        return generate_latest(_Families(list(_self_metric_families(self.self_metrics()))))

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        with self._lock:
            series = [item for item, _end in self._shown.values()]
        families: dict[str, GaugeMetricFamily] = {}
        order: dict[str, int] = {}
        for item in series:
            family = families.get(item.name)
            if family is None:
                # A metric's series may differ in label keys (a straggler with and without its throttle reason):
                # one family, each sample with its own labels.
                family = families[item.name] = GaugeMetricFamily(item.name, item.description, labels=[])
                order[item.name] = item.order
            family.add_sample(item.name, dict(item.labels), item.value)
        for name in sorted(families, key=order.__getitem__):
            yield families[name]
        if self.self_metrics is not None:
            yield from _self_metric_families(self.self_metrics())


_SELF_METRIC_KINDS: Mapping[str, str] = {spec.name: spec.kind for spec in names.COLLECTOR_SELF_METRICS}
# The counters whose reasons are a fixed set: each is shown from the start, at 0 until it counts.
_REASONS: Mapping[str, tuple[str, ...]] = {names.COLLECTOR_POINTS_REJECTED.name: names.RejectReason.ALL}


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
            counts = {**dict.fromkeys(_REASONS.get(name, ()), 0), **value}
            for key, count in counts.items():
                family.add_metric([str(key)], float(count))
        else:
            family = GaugeMetricFamily(base, name) if is_gauge else CounterMetricFamily(base, name)
            family.add_metric([], float(value))
        yield family


@attrs.frozen
class _Families:
    """Metric families as prometheus-client's writer takes them (anything with ``collect``)."""

    families: list[GaugeMetricFamily | CounterMetricFamily]

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        return iter(self.families)


@attrs.define
class PrometheusEndpoint:
    """Serves ``/metrics`` on ``host:port`` (port 0: a free one, ``port`` once started) under the bounds of
    ``http_endpoint``: the windows' page from memory, the self-metrics written per scrape.

    A window consumer: the endpoint shows the series of the last ``expiration_windows`` windows.
    """

    self_metrics: Callable[[], Mapping[str, Any]] | None = None
    collector: OutputsCollector = attrs.field(init=False)
    host: str = "0.0.0.0"
    port: int = 0
    expiration_windows: int = attrs.field(default=DEFAULT_EXPIRATION_WINDOWS, validator=_positive)
    _server: HttpEndpoint | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        self.collector = OutputsCollector(self.self_metrics, self.expiration_windows)

    def start(self) -> None:
        """Bind and serve; OSError (one line, naming the address) when the port cannot be had."""
        host, port = self.host, self.port
        server = HttpEndpoint(self._reply, host, port, name="otel-ofu-prometheus")
        try:
            self.port = server.start()
        except OSError as error:
            address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            raise OSError(f"cannot serve Prometheus metrics on {address} ({error.strerror or error})") from error
        self._server = server

    def _reply(self, request: Request) -> Reply:
        # Every path but the favicon is the page, as prometheus-client's own server answers.
        if request.path == "/favicon.ico":
            return Reply.text(404, "not found\n")
        return Reply(200, CONTENT_TYPE_LATEST, (self.collector.page(), self.collector.self_metrics_page()))

    def consume_windows(self, windows: Sequence[WindowReport]) -> None:
        self.collector.consume_windows(windows)

    def shutdown(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop()
