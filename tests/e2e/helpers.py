"""What the end-to-end tests share: a port probe, OTLP attributes as a dict, another service's counter, Prometheus.

The fixtures that start processes are in tests/e2e/conftest.py; these are the plain functions and types the
test modules import (a conftest cannot be imported).
"""

from __future__ import annotations

import json
import socket
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_ofu.testing.otlp_sink import unused_port

# ``start(argv, name, ready)``: the start_process fixture of tests/e2e/conftest.py.
StartProcess = Callable[[Sequence[str], str, Callable[[], bool]], subprocess.Popen[bytes]]


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def attributes(kvs: Iterable[Any]) -> dict[str, Any]:
    """OTLP protobuf key-values as a dict of their set values."""
    return {kv.key: getattr(kv.value, kv.value.WhichOneof("value")) for kv in kvs}


def app_requests(resource: Resource, points: Sequence[NumberDataPoint]) -> MetricsData:
    """Another service's cumulative ``app.requests`` counter: what a collector must pass through untouched."""
    metric = Metric(
        name="app.requests",
        description="HTTP requests served",
        unit="{request}",
        data=Sum(data_points=points, aggregation_temporality=AggregationTemporality.CUMULATIVE, is_monotonic=True),
    )
    scope = InstrumentationScope("checkout.http", "2.3.1")
    return MetricsData([ResourceMetrics(resource, [ScopeMetrics(scope, [metric], "")], "")])


# --- Prometheus, the real server, through its HTTP API ----------------------------------------------


@attrs.define
class PrometheusApi:
    base: str

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base}/-/ready", timeout=1) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def get(self, path: str, **params: str) -> Any:
        """The ``data`` of an API answer, which must be a success."""
        url = f"{self.base}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        with urllib.request.urlopen(url, timeout=5) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.get("/api/v1/query", query=promql)["result"]
        return result

    def by_label(self, promql: str, label: str) -> dict[str, float]:
        """The instant vector's values by one label (every series of the answer must have it)."""
        return {item["metric"][label]: float(item["value"][1]) for item in self.query(promql)}


def prometheus_config(job_name: str, target_port: int, interval_s: float = 1.0, rule_files: Sequence[Path] = ()) -> str:
    """One scrape job of one loopback target, scraped (and its rules evaluated) every ``interval_s``."""
    rules = "".join(f"  - {path}\n" for path in rule_files)
    return (
        "global:\n"
        f"  scrape_interval: {interval_s:g}s\n"
        f"  scrape_timeout: {interval_s:g}s\n"
        f"  evaluation_interval: {interval_s:g}s\n" + (f"rule_files:\n{rules}" if rules else "") + "scrape_configs:\n"
        f"  - job_name: {job_name}\n"
        "    static_configs:\n"
        f"      - targets: ['127.0.0.1:{target_port}']\n"
    )


def start_prometheus(start_process: StartProcess, binary: Path, tmp_path: Path, config: str) -> PrometheusApi:
    """Prometheus with ``config`` on a free loopback port, its TSDB in ``tmp_path``, once it is ready."""
    port = unused_port()
    config_path = tmp_path / "prometheus.yml"
    config_path.write_text(config)
    api = PrometheusApi(f"http://127.0.0.1:{port}")
    start_process(
        [
            str(binary),
            f"--config.file={config_path}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        "prometheus",
        api.ready,
    )
    return api
