"""``otel-ofu prometheus-rules`` in a real Prometheus (Debian's binary, loopback, 1 s scrapes and evaluations) scraping
dcgm-exporter pages served on 127.0.0.1: the recorded ``gpu_ofu`` and ``gpu_ofu_raw`` of each GPU equal what the
producer (``otel-ofu snapshot --source dcgm-exporter``) reads from the same page, and every rule evaluates without
error.

The pages: tests/data/dcgm_exporter_h100_node_written.prom (dcgm-exporter 3.x names, MHz, GPU 2 without tensor
activity) and tests/data/dcgm_exporter_h100_generation_49.prom (DCGM 4.6 names, Hz, its own max clock), each a target.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_ofu import dcgm_rules, names
from otel_ofu.commands.prometheus_rules import rules_yaml
from tests.e2e.helpers import StartProcess, start_prometheus
from tests.e2e.test_dcgm_exporter_scrape import producer_snapshot
from tests.exporter_server import ExporterServer, serving

DATA = Path(__file__).resolve().parents[1] / "data"
PAGES = ("dcgm_exporter_h100_node_written.prom", "dcgm_exporter_h100_generation_49.prom")
WAIT_S = 30.0


@pytest.fixture
def exporter() -> Iterator[ExporterServer]:
    with serving() as server:
        yield server


def _wait_for(condition: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.2)
    pytest.fail(f"{what} within {WAIT_S:g} s")


def test_prometheus_records_the_producers_ofu_from_dcgm_exporter_pages(
    prometheus_binary: Path, start_process: StartProcess, exporter: ExporterServer, tmp_path: Path
) -> None:
    urls = [exporter.serve((DATA / page).read_text(), f"/{index}/metrics") for index, page in enumerate(PAGES)]
    expected: dict[tuple[str, str], tuple[float, float]] = {}  # by (scrape job, hw.id)
    for index, url in enumerate(urls):
        for hw_id, line in producer_snapshot(url).items():
            if names.GPU_OFU.name in line:
                expected[(f"dcgm-exporter-{index}", hw_id)] = (line[names.GPU_OFU.name], line[names.GPU_OFU_RAW.name])
    assert len(expected) == 3  # two GPUs of the node page, the 4.9 page's one (the same UUID as the node's GPU 0)
    rules = tmp_path / "otel-ofu-dcgm.yaml"
    rules.write_text(rules_yaml())
    host = urls[0].split("/")[2]
    jobs = "".join(
        f"  - job_name: dcgm-exporter-{index}\n"
        f"    metrics_path: /{index}/metrics\n"
        "    static_configs:\n"
        f"      - targets: ['{host}']\n"
        for index in range(len(PAGES))
    )
    config = (
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
        f"rule_files:\n  - {rules}\nscrape_configs:\n{jobs}"
    )
    api = start_prometheus(start_process, prometheus_binary, tmp_path, config)

    def recorded(metric: str) -> dict[tuple[str, str], float]:
        return {
            (item["metric"]["job"], item["metric"][dcgm_rules.HW_ID]): float(item["value"][1])
            for item in api.query(metric)
        }

    ofu = _wait_for(lambda: (found := recorded(dcgm_rules.OFU)) and len(found) == 3 and found, "gpu_ofu of 3 GPUs")
    raw = _wait_for(lambda: (found := recorded(dcgm_rules.OFU_RAW)) and len(found) == 3 and found, "gpu_ofu_raw")
    assert ofu == {key: values[0] for key, values in expected.items()}
    assert raw == {key: values[1] for key, values in expected.items()}
    # GPU 2 of the node page has no tensor activity: the alert that says so is pending (for 15 m).
    pending = _wait_for(lambda: api.query('ALERTS{alertname="OfuDcgmNoTensorActivity"}'), "the pending alert")
    assert [item["metric"]["hw_id"] for item in pending] == ["GPU-b83e0f27-9c1d-4a5b-8e6f-0d2c4a7b9e18"]
    assert pending[0]["metric"]["alertstate"] == "pending"
    # Every rule evaluated, none with an error.
    groups = api.get("/api/v1/rules")["groups"]
    assert [group["name"] for group in groups] == [dcgm_rules.GROUP]
    for group in groups:
        for rule in group["rules"]:
            assert rule["health"] == "ok", rule
