"""The shipped Prometheus alerting rules in a real Prometheus scraping the real collector's /metrics.

promtool's unit tests (tests/test_alerts.py) prove the rules' logic on synthetic series; this proves
the series are the ones the collector really exposes, with the labels the rules join on. A collector
closes three windows in which job ``moe`` reports twice the FLOPs its GPUs execute, ``dense`` reports
honestly and ``no-mfu`` reports no MFU at all (a flag that cannot be assessed); then a producer sends one
or two requests of points the collector must reject. Prometheus (Debian's binary, loopback, 1 s scrapes and
evaluations) must hold exactly two alerts: the miscount for ``moe`` pending (neither ``dense``, flagged
0, nor ``no-mfu``) and the collector's rejected points firing (a one-off burst: the rejection counters
start at 0, so rate() sees it); every rule must evaluate without error. Then the producers stop: two
empty windows later the collector's series are gone, Prometheus marks them stale, the miscount alert
resolves and "no windows" is pending.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_ofu import names
from otel_ofu.prometheus_names import label_name, metric_name
from otel_ofu.testing.otlp_requests import gpu_request, mfu_request
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.service import CollectorOptions, CollectorService
from tests.e2e.helpers import StartProcess, prometheus_config, start_prometheus

RULES = Path(__file__).resolve().parents[2] / "examples" / "alerts" / "prometheus-rules.yaml"
S = 1_000_000_000
W0 = 1_700_000_040 * S  # a multiple of 60 s: windows are aligned to the epoch
WINDOW = 60 * S
WAIT_S = 30.0  # bounded poll for scrapes and rule evaluations at 1 s


def _wait_for(condition: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.2)
    pytest.fail(f"{what} within {WAIT_S:g} s")


@pytest.fixture
def collector() -> Iterator[CollectorService]:
    options = CollectorOptions(
        aggregator=AggregatorConfig(window_s=60.0, lateness_s=10.0, flag_settings={"miscount_windows": 2}),
        grpc_listen="127.0.0.1:0",
        prometheus_port=0,
        prometheus_host="127.0.0.1",
        flush_interval_s=0.0,  # the test closes windows by flushing at simulated times
    )
    service = CollectorService(options, environ={})
    service.start()
    yield service
    service.stop(grace=1.0)


def test_shipped_rules_alert_on_the_real_collector_series(
    prometheus_binary: Path, start_process: StartProcess, collector: CollectorService, tmp_path: Path
) -> None:
    for window in range(3):
        t = W0 + window * WINDOW + 30 * S
        gpus = {"GPU-1": ("dense", 0.5), "GPU-2": ("dense", 0.4), "GPU-3": ("moe", 0.2), "GPU-4": ("no-mfu", 0.3)}
        collector.ingest(gpu_request(gpus, time_ns=t))
        collector.ingest(mfu_request({"dense": 0.45, "moe": 0.4}, t))  # moe claims 2x its OFU
        collector.flush(W0 + (window + 1) * WINDOW + 10 * S)

    rules = tmp_path / "otel-ofu-rules.yaml"
    shutil.copy(RULES, rules)
    config = prometheus_config("otel-ofu-collector", collector.ports["prometheus"], rule_files=[rules])
    prometheus = start_prometheus(start_process, prometheus_binary, tmp_path, config)
    accepted = "otel_ofu_collector_points_accepted_total"
    _wait_for(lambda: prometheus.get("/api/v1/query", query=accepted)["result"], f"no scrape of {accepted}")
    # Then points the collector cannot use (non-finite OFU): rejected and counted. Every reason code's counter
    # is scraped at 0 before them, so a burst counted under a code is an increase rate() sees. (The second
    # request, after a scrape of the first, is for a decoder whose reason labels are not yet those codes: a
    # label of its own is born at its first count.)
    rejected = "sum(otel_ofu_collector_points_rejected_total)"
    _wait_for(lambda: prometheus.query(f"{rejected} == 0"), "no scrape of the rejection counters at 0")
    bad = gpu_request({"GPU-7": float("nan"), "GPU-8": float("inf")}, time_ns=W0 + 3 * WINDOW + 30 * S)
    assert collector.ingest(bad).rejected == 2
    _wait_for(lambda: prometheus.query(f"{rejected} == 2"), "no scrape of the first rejections")
    assert collector.ingest(bad).rejected == 2

    job, instance = label_name(names.JOB_ID), "instance"
    expected = {
        ("OfuFlopsMiscount", "moe"),
        ("OfuCollectorRejectingPoints", f"127.0.0.1:{collector.ports['prometheus']}"),
    }

    def active() -> set[tuple[str, str]]:
        alerts = prometheus.get("/api/v1/alerts")["alerts"]
        return {
            (alert["labels"]["alertname"], alert["labels"].get(job) or alert["labels"].get(instance, ""))
            for alert in alerts
        }

    _wait_for(lambda: active() >= expected, f"alerts {sorted(expected)} not active")
    assert active() == expected  # not dense (flag 0), not no-mfu (flag absent), no collector down/no windows

    groups = prometheus.get("/api/v1/rules")["groups"]
    evaluated = [rule for group in groups for rule in group["rules"]]
    assert len(evaluated) == sum(1 for line in RULES.read_text().splitlines() if line.lstrip().startswith("- alert:"))
    assert all(rule["health"] == "ok" for rule in evaluated), [(r["name"], r.get("lastError")) for r in evaluated]
    states = {rule["name"]: rule["state"] for rule in evaluated}
    assert states["OfuFlopsMiscount"] == "pending"  # for: 15m has not elapsed
    assert states["OfuCollectorRejectingPoints"] == "firing"  # no for: the burst fires while in the last 15 minutes
    assert states["OfuRegression"] == states["OfuCollectorNoWindows"] == states["OfuCollectorDown"] == "inactive"

    # The producers stop. Windows 3 and 4 close empty: after the second (--prometheus-expiration-windows 2) the
    # endpoint shows no window output, Prometheus marks every series stale, and the alerts on them resolve.
    collector.flush(W0 + 5 * WINDOW + 10 * S)
    flag, fleet_gpus = metric_name(names.JOB_FLOPS_MISCOUNT.name), metric_name(names.FLEET_GPUS.name)
    _wait_for(
        lambda: not prometheus.query(flag) and not prometheus.query(fleet_gpus), f"{flag} and {fleet_gpus} not stale"
    )

    def rule_states() -> dict[str, str]:
        groups = prometheus.get("/api/v1/rules")["groups"]
        return {rule["name"]: rule["state"] for group in groups for rule in group["rules"]}

    # The two rule groups evaluate on their own: each state is waited for (bounded), not read once.
    _wait_for(lambda: rule_states()["OfuFlopsMiscount"] == "inactive", "the miscount alert not resolved")
    _wait_for(lambda: rule_states()["OfuCollectorNoWindows"] == "pending", "no windows not pending")
