"""One Prometheus naming rule for the producer's and the collector's ``/metrics`` and the Grafana dashboard."""

from __future__ import annotations

import threading
import urllib.request

import pytest

from otel_ofu import names
from otel_ofu.producer.prometheus import PROMETHEUS_NAMES
from otel_ofu.prometheus_names import label_name, metric_name, unit_suffix
from otel_ofu_collector.outputs import prometheus as collector_prometheus
from otel_ofu_collector.outputs.prometheus import PrometheusEndpoint


@pytest.mark.parametrize(
    ("name", "unit", "expected"),
    [
        ("fleet.ofu.quantile", None, "fleet_ofu_quantile"),  # the collector's: by name alone
        ("gpu.ofu", "1", "gpu_ofu"),
        ("gpu.clock.sm", "Hz", "gpu_clock_sm_hertz"),
        ("gpu.flops.achieved", "{flop}/s", "gpu_flops_achieved_per_second"),
        ("otel_ofu.export.duration", "s", "otel_ofu_export_duration_seconds"),
        ("request.seconds", "s", "request_seconds"),  # the suffix is not doubled
        ("job:ofu:rate5m", None, "job:ofu:rate5m"),  # colons are legal in metric names
        ("9lives-metric", None, "_9lives_metric"),
    ],
)
def test_metric_names(name: str, unit: str | None, expected: str) -> None:
    assert metric_name(name, unit) == expected


def test_label_names_and_unit_suffixes() -> None:
    assert label_name(names.HW_MODEL) == "hw_model"
    assert label_name("k8s.pod:name") == "k8s_pod_name"  # no colon in a label
    assert label_name("1st.key") == "_1st_key"
    assert unit_suffix("By/s") == "bytes_per_second"
    assert unit_suffix("{gpu}") == ""


def test_both_endpoints_use_the_rule() -> None:
    assert PROMETHEUS_NAMES[names.GPU_CLOCK_SM.name] == metric_name(names.GPU_CLOCK_SM.name, names.GPU_CLOCK_SM.unit)
    for spec in names.COLLECTOR_METRICS:  # what the Grafana dashboard queries
        assert collector_prometheus.prometheus_name(spec.name) == spec.name.replace(".", "_")


def test_collector_endpoint_shutdown_joins_its_server_thread() -> None:
    before = set(threading.enumerate())
    endpoint = PrometheusEndpoint(host="127.0.0.1")
    endpoint.start()
    port = endpoint.port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        assert response.status == 200
    (server_thread,) = (t for t in set(threading.enumerate()) - before if t.name == "otel-ofu-prometheus")
    endpoint.shutdown()
    assert not server_thread.is_alive()  # shutdown returns only once the server thread has ended
    endpoint.shutdown()  # a second shutdown is harmless
