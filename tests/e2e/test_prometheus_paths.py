"""One set of Prometheus names whichever way a user scrapes: the Grafana dashboard's and the alert rules' queries,
run by a real Prometheus against the collector's own ``/metrics`` and against the shipped backend gateway's
``prometheus`` exporter (the real OpenTelemetry Collector, otelcol-ofu, with ``backend-gateway.yaml``).

The demo fleet (32 simulated H100s, nine jobs, priced) runs 20 simulated minutes, ending now, through the real
producer and OTLP into an in-process collector whose windows go downstream to the gateway. One Prometheus
scrapes the collector, another the gateway, each under the job name the rules expect. Every query of the
dashboard (its variables set to "All") and every rule's expression must evaluate on both; every one that
answers on the collector's endpoint (all of the dashboard's do: the fleet exercises every panel) answers the
same on the gateway's, series for series (by the labels the collector's answer carries) and value for value.
Before the gateway named and shaped its series as the collector does, the gateway path answered nothing.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import pytest
import yaml

from otel_ofu.attribution import build_chain
from otel_ofu.clock import ManualClock
from otel_ofu.mfu.timed import timed_mfu_metrics_data
from otel_ofu.producer.exporters import otlp_exporter
from otel_ofu.producer.loop import Producer
from otel_ofu.sources.simulated import SimulatedFleet
from otel_ofu.testing.otlp_sink import OtlpSink, unused_port
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.demo.command import EXAMPLE_CURRENCY, EXAMPLE_PRICES, frameworks_mfu
from otel_ofu_collector.service import CollectorOptions, CollectorService
from tests.e2e.helpers import PrometheusApi, StartProcess, prometheus_config, start_prometheus
from tests.e2e.test_otelcol_topologies import Parts, backends_to_sink, load

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "examples" / "dashboards" / "grafana.json"
RULES = ROOT / "examples" / "alerts" / "prometheus-rules.yaml"
SCRAPE_JOB = "otel-ofu-collector"  # the rules' up{job=...}: both endpoints are scraped under it
WINDOW_S = 60
INTERVAL_S = 10
WINDOWS = 20  # the regression of the demo's job-1004 sets in at 40% of 30 min: 12 min
WAIT_S = 90.0
# Labels one path adds and the other has not: the scrape's own, and what the Collector's exporter adds from the
# OTLP scope and resource (service.name becomes job, then exported_job beside the scrape's).
PATH_LABELS = re.compile(r"^(job|instance|exported_job|exported_instance|otel_scope_.*|service_.*)$")


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {WAIT_S:g} s")
        time.sleep(0.5)


def dashboard_queries() -> list[str]:
    """Every panel's expression, its variables at "All" (their allValue, .*)."""
    board = json.loads(GRAFANA.read_text())
    variables = {v["name"]: v.get("allValue", ".*") for v in board["templating"]["list"] if v["type"] == "query"}
    queries = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for name, value in variables.items():
                expr = expr.replace(f"${name}", value)
            queries.append(expr)
    return queries


def rule_queries() -> list[tuple[str, str]]:
    rules = yaml.safe_load(RULES.read_text())
    return [(rule["alert"], rule["expr"]) for group in rules["groups"] for rule in group["rules"]]


Series = dict[frozenset[tuple[str, str]], float]


def answer(api: PrometheusApi, promql: str, keys: frozenset[str] | None = None) -> Series:
    """The instant vector by its labels (less the path's own, or only ``keys``), each value summed over them."""
    found: Series = {}
    for item in api.query(promql):
        labels = frozenset(
            (key, value)
            for key, value in item["metric"].items()
            if key != "__name__" and not PATH_LABELS.match(key) and (keys is None or key in keys)
        )
        found[labels] = found.get(labels, 0.0) + float(item["value"][1])
    return found


def same(got: float, want: float) -> bool:
    return (math.isnan(got) and math.isnan(want)) or math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9)


@pytest.fixture
def two_paths(
    otelcol_binary: Path,
    otelcol_components: dict[str, set[str]],
    prometheus_binary: Path,
    start_process: StartProcess,
    tmp_path: Path,
) -> Iterator[tuple[PrometheusApi, PrometheusApi]]:
    """(Prometheus of the collector's endpoint, Prometheus of the gateway's) after the fleet's 20 minutes."""
    parts = Parts(start_process, otelcol_binary, tmp_path)
    with OtlpSink.start() as sink:
        gateway = load("backend-gateway.yaml")
        gateway_port = unused_port()
        gateway["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"] = f"127.0.0.1:{gateway_port}"
        exporter_port = backends_to_sink(gateway, sink, otelcol_components["exporters"])
        parts.otelcol_process(gateway, "gateway", gateway_port)

        window_ns = WINDOW_S * 1_000_000_000
        clock = ManualClock(start_ns=(time.time_ns() // window_ns - WINDOWS) * window_ns)
        demo = SimulatedFleet.demo(seed=7, clock=clock, duration_s=1800)
        # The mixed-precision job keeps one precision here, and the hung and the restarting job train all along: the
        # gateway keeps a series for its metric_expiration of wall-clock time (3 min), the collector for two windows,
        # and 20 windows pass here in seconds, so the precision a job left, or the MFU a hung or relaunching job no
        # longer reports, would still be on the gateway and not on the collector.
        jobs = tuple(attrs.evolve(job, alternate_precision=None, hang_at_s=None, training=None) for job in demo.jobs)
        fleet = attrs.evolve(demo, jobs=jobs)
        service = CollectorService(
            CollectorOptions(
                aggregator=AggregatorConfig(
                    window_s=WINDOW_S,
                    lateness_s=INTERVAL_S,
                    price_per_gpu_hour=EXAMPLE_PRICES,
                    currency=EXAMPLE_CURRENCY,
                ),
                grpc_listen="127.0.0.1:0",
                prometheus_port=0,
                export_endpoint=f"http://127.0.0.1:{gateway_port}",
                flush_interval_s=0,
                pass_through=False,
            ),
            clock=clock,
            environ={},
        )
        service.start()
        try:
            (collector_dir := tmp_path / "collector-prometheus").mkdir()
            (gateway_dir := tmp_path / "gateway-prometheus").mkdir()
            direct = start_prometheus(
                start_process, prometheus_binary, collector_dir,
                prometheus_config(SCRAPE_JOB, service.ports["prometheus"]),
            )  # fmt: skip
            through = start_prometheus(
                start_process, prometheus_binary, gateway_dir, prometheus_config(SCRAPE_JOB, exporter_port)
            )
            endpoint = f"http://127.0.0.1:{service.ports['grpc']}"
            gpu_exporter = otlp_exporter(protocol="grpc", endpoint=endpoint)
            mfu_exporter = otlp_exporter(protocol="grpc", endpoint=endpoint)
            producer = Producer(source=fleet, attribution=build_chain(clock=clock).attribute, clock=clock)
            mfu = frameworks_mfu(fleet)
            last = clock()
            for _ in range(WINDOWS * WINDOW_S // INTERVAL_S + 1):
                clock.advance(INTERVAL_S)
                gpu_exporter.export(producer.run_once())
                points = mfu(last, clock())
                last = clock()
                if points:
                    mfu_exporter.export(timed_mfu_metrics_data(points))
                service.flush(clock())
            for exporter in (gpu_exporter, mfu_exporter):
                exporter.shutdown()
            wanted = answer(direct, "job_ofu", frozenset({"job_id"}))

            def both_have_the_last_window() -> bool:
                return bool(wanted) and answer(through, "job_ofu", frozenset({"job_id"})) == wanted

            wait_until(lambda: bool(answer(direct, "job_ofu")), "the collector's endpoint scraped")
            wanted = answer(direct, "job_ofu", frozenset({"job_id"}))
            try:
                wait_until(both_have_the_last_window, "the gateway's endpoint showing the last window")
            except BaseException:
                print("DIRECT", wanted)

                import urllib.request

                print(urllib.request.urlopen(f"http://127.0.0.1:{exporter_port}/metrics").read().decode()[:3000])
                raise
            yield direct, through
        finally:
            service.stop(grace=1)


def test_the_dashboard_and_the_rules_read_the_same_series_on_both_endpoints(
    two_paths: tuple[PrometheusApi, PrometheusApi],
) -> None:
    direct, through = two_paths
    rules_answered = 0
    for where, promql in [*(("dashboard", q) for q in dashboard_queries()), *rule_queries()]:
        want = answer(direct, promql)
        if where == "dashboard":
            # A panel of the jobs a flag is up for (``... == 1``) is empty while none is: its series must be there.
            series = re.sub(r"\s*==\s*1$", "", promql)
            assert answer(direct, series), f"the dashboard's {series!r} answers nothing on the collector's own endpoint"
        keys = frozenset(key for labels in want for key, _ in labels)
        got = answer(through, promql, keys)
        assert set(got) == set(want), f"{where}: {promql}\ncollector: {sorted(want)[:5]}\ngateway: {sorted(got)[:5]}"
        for labels, value in want.items():
            assert same(got[labels], value), (where, promql, sorted(labels), got[labels], value)
        rules_answered += bool(want) and where != "dashboard"
    flagged = {name for name, promql in rule_queries() if answer(direct, promql)}
    assert {"OfuFlopsMiscount", "OfuRegression", "OfuStragglerGpu", "OfuIdleGpus"} <= flagged
    assert rules_answered >= 4  # the four flags' rules above, each compared on both endpoints with something in it


def test_the_variables_and_the_names_are_the_same_on_both_endpoints(
    two_paths: tuple[PrometheusApi, PrometheusApi],
) -> None:
    """The dashboard's variables list the same jobs and models; every metric name the collector's endpoint has for
    its outputs and self-metrics is on the gateway's too."""
    direct, through = two_paths
    for promql in ("count by (job_id) (job_ofu)", "count by (hw_model, gpu_precision) (fleet_gpus)"):
        assert answer(through, promql).keys() == answer(direct, promql).keys() != set()
    names_direct = {item["metric"]["__name__"] for item in direct.query('{__name__=~"(job|fleet|gpu)_.+"}')}
    names_through = {item["metric"]["__name__"] for item in through.query('{__name__=~"(job|fleet|gpu)_.+"}')}
    assert names_direct <= names_through, sorted(names_direct - names_through)
    quantile = through.query('fleet_ofu_quantile{ofu_quantile="0.5"}')
    assert quantile
    assert all("quantile" not in item["metric"] for item in quantile)
