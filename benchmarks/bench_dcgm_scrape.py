"""No new agent where dcgm-exporter runs: the collector's CPU per GPU report when it computes OFU from dcgm-exporter
scrapes (an OpenTelemetry Collector's Prometheus receiver in front), beside the producer path, in one run.

The fleet: 1,000 nodes of 8 GPUs, each node's dcgm-exporter page shaped as its default counters file prints it (the 24
fields of dcgm-exporter 3.x's ``default-counters.csv``: clocks, temperatures, power, energy, utilisations, frame
buffer, NVLink, remapped rows, and the profiling fields GR_ENGINE_ACTIVE, PIPE_TENSOR_ACTIVE, DRAM_ACTIVE and the PCIe
rates), with the real DigitalOcean H100 label set and pod labels on half the GPUs. Each scrape is one OTLP/gRPC
request as the Prometheus receiver (v0.161.0) builds it and the ``otlp`` exporter sends it (one ResourceMetrics per
target, one point per series, ``otel_ofu.testing.prometheus_receiver``): 8 GPU reports per request, as a node's
producer sends them. The whole fleet's shape runs here, not a sample of it: one round is one 10 s interval of the
fleet, 1,000 requests (8,000 GPU reports); a round of warm-up (every target's first scrape, which has no interval),
then the measured rounds, scrape times 10 s apart. The 10 s of the fleet are not waited for: the requests go back to
back, one in flight, and the collector's process CPU (utime + stime, /proc) is what is measured, as in the end-to-end
benchmark (``bench_collector_e2e``), whose harness this reuses.

Beside it, in the same run: the producer path at the same shape (8 GPUs per request, the producer's 8 gauges per GPU),
and the dcgm-exporter path with ``--no-pass-through`` (the collector then forwards nothing: with pass-through, which
is on by default, the decoder also copies each scrape's series for the downstream). Where ``otelcol-ofu`` is built,
the scraping Collector's own CPU per GPU report too: ``collector/otelcol/dcgm-exporter.yaml``'s receiver scraping
100 pages of 8 GPUs served on loopback every second (the scrapes a 1,000-node fleet makes at 10 s), exporting to a
``nop`` exporter.
"""

from __future__ import annotations

import http.server
import json
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.bench_collector_e2e import (
    OTEL_OFU,
    OTELCOL,
    Peer,
    cpu_per_report,
    process_cpu_s,
    producer_requests,
    running,
)
from benchmarks.common import BenchResult, RunContext, Table, doc_summary
from otel_ofu.testing.prometheus_receiver import scrape_request

S = 1_000_000_000
NODES = 1_000
NODE_GPUS = 8
INTERVAL_S = 10.0
DCGM = "dcgm-exporter scrapes (Prometheus receiver)"
DCGM_NO_PASS = "dcgm-exporter scrapes, --no-pass-through"
PRODUCER = "producer requests (otel-ofu run)"
SCRAPER = "the scraping OpenTelemetry Collector (its own CPU)"
# dcgm-exporter 3.x default-counters.csv, in its order: (field, TYPE, a value per GPU slot).
DEFAULT_COUNTERS: tuple[tuple[str, str], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge"),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge"),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge"),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge"),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge"),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter"),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter"),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge"),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge"),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge"),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge"),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge"),
    ("DCGM_FI_DEV_FB_FREE", "gauge"),
    ("DCGM_FI_DEV_FB_USED", "gauge"),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter"),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge"),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter"),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge"),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge"),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge"),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "counter"),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "counter"),
)


def _value(field: str, gpu: int) -> str:
    """A plausible reading of ``field`` for GPU slot ``gpu`` (an H100 at work), in the exporter's units."""
    share = 0.2 + 0.1 * (gpu % 7)
    values = {
        "DCGM_FI_DEV_SM_CLOCK": f"{1410 + 60 * (gpu % 5)}",
        "DCGM_FI_DEV_MEM_CLOCK": "2619",
        "DCGM_FI_DEV_POWER_USAGE": f"{300 + 40 * (gpu % 8):.3f}",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": f"{123456789 + 1000 * gpu}",
        "DCGM_FI_DEV_FB_USED": "61234",
        "DCGM_FI_DEV_FB_FREE": "20243",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": f"{min(1.0, share + 0.3):.6f}",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": f"{share:.6f}",
        "DCGM_FI_PROF_DRAM_ACTIVE": f"{share / 2:.6f}",
        "DCGM_FI_PROF_PCIE_TX_BYTES": "1500000000",
        "DCGM_FI_PROF_PCIE_RX_BYTES": "500000000",
    }
    return values.get(field, "0" if "UTIL" not in field and "TEMP" not in field else "45")


def node_page(node: int, gpus: int = NODE_GPUS) -> str:
    """One node's dcgm-exporter page: the default counters of ``gpus`` H100s, pod labels on the even GPUs."""
    lines = []
    for field, kind in DEFAULT_COUNTERS:
        lines.append(f"# HELP {field} {field}.")
        lines.append(f"# TYPE {field} {kind}")
        for gpu in range(gpus):
            pod = (
                f',container="pytorch",namespace="llm-train",pod="job-{node // 4}-worker-{node % 4}"'
                if gpu % 2 == 0
                else ',container="",namespace="",pod=""'
            )
            labels = (
                f'gpu="{gpu}",UUID="GPU-{node:08x}-{gpu:04x}-4b6e-9a0c-7e2b8d1f6a53",'
                f'pci_bus_id="00000000:{gpu + 9:02X}:00.0",device="nvidia{gpu}",modelName="NVIDIA H100 80GB HBM3",'
                f'Hostname="gpu-node-{node:05d}",DCGM_FI_DRIVER_VERSION="535.183.01"{pod}'
            )
            lines.append(f"{field}{{{labels}}} {_value(field, gpu)}")
    return "\n".join(lines) + "\n"


def scrape_rounds(nodes: int, rounds: int, start_ns: int) -> list[bytes]:
    """``rounds`` scrapes of every node, round after round, 10 s apart: each request one node's scrape."""
    return stamped_rounds(scrape_templates(nodes, start_ns), rounds, start_ns)


def scrape_templates(nodes: int, start_ns: int) -> list[Any]:
    """Every node's scrape as a request (slow: seconds for 1,000 nodes), to be stamped by ``stamped_rounds``."""
    return [
        scrape_request(node_page(node), time_ns=start_ns, instance=f"10.{node // 250}.{node % 250}.7:9400")
        for node in range(nodes)
    ]


def stamped_rounds(templates: Sequence[Any], rounds: int, start_ns: int) -> list[bytes]:
    """``rounds`` of the scrapes in ``templates``, the first at ``start_ns``, 10 s apart (fast)."""
    payloads = []
    for round_index in range(rounds):
        time_ns = start_ns + round_index * int(INTERVAL_S * S)
        for request in templates:
            for metric in request.resource_metrics[0].scope_metrics[0].metrics:
                data = metric.sum if metric.WhichOneof("data") == "sum" else metric.gauge
                for point in data.data_points:
                    point.time_unix_nano = time_ns
            payloads.append(request.SerializeToString())
    return payloads


def collector(*extra: str) -> Peer:
    def argv(port: int, work: Path) -> list[str]:
        return [OTEL_OFU, "collector", f"--listen=127.0.0.1:{port}", "--http-listen=off", *extra]

    return Peer("otel-ofu collector", "-", argv)


def measure_collector(nodes: int, rounds: int) -> list[dict[str, Any]]:
    """Our collector's CPU per GPU report on each path, after one round of warm-up."""
    rows = []

    # Made once (it takes seconds), stamped just before each path is sent them: points stamped when the pages were
    # made would be late by the time they are sent.
    templates = scrape_templates(nodes, time.time_ns())

    def dcgm() -> list[bytes]:
        return stamped_rounds(templates, 1 + rounds, time.time_ns())

    def producer() -> list[bytes]:
        return producer_requests(NODE_GPUS, 8, (1 + rounds) * nodes, nodes * NODE_GPUS)

    with tempfile.TemporaryDirectory(prefix="bench-dcgm-") as scratch:
        for name, peer, make in (
            (PRODUCER, collector(), producer),
            (DCGM, collector(), dcgm),
            (DCGM_NO_PASS, collector("--no-pass-through"), dcgm),
        ):
            # Made just before they are sent: the collector closes windows by its clock, and points made for an
            # earlier path could be late by now (refused, and the refusals timed; ``cpu_per_report`` stops on a
            # measured one).
            payloads = make()
            with running(peer, Path(scratch)) as (process, channel):
                per_report = cpu_per_report(channel, process.pid, payloads, NODE_GPUS, warmup=nodes)
            rows.append(
                {
                    "path": name,
                    "requests": len(payloads) - nodes,
                    "gpu_reports": (len(payloads) - nodes) * NODE_GPUS,
                    "us_per_report": per_report * 1e6,
                    "gpus_per_core": INTERVAL_S / per_report if per_report > 0 else None,
                }
            )
    return rows


@contextmanager
def serving_pages(pages: Sequence[str]) -> Iterator[int]:
    """The pages on 127.0.0.1, page i at /i/metrics; yields the port."""
    bodies = [page.encode() for page in pages]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            index = int(self.path.split("/")[1])
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(bodies[index])))
            self.end_headers()
            self.wfile.write(bodies[index])

        def log_message(self, *_: object) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


SCRAPER_CONFIG = """\
receivers:
  prometheus:
    config:
      scrape_configs:
{jobs}
exporters:
  nop:
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    metrics:
      receivers: [prometheus]
      exporters: [nop]
"""


def measure_scraper(targets: int, seconds: float) -> dict[str, Any] | None:
    """The scraping Collector's own CPU per GPU report: ``targets`` pages scraped every second for ``seconds``."""
    if not OTELCOL.is_file():
        return None
    with serving_pages([node_page(node) for node in range(targets)]) as port, tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        jobs = "".join(
            f"        - job_name: node-{index}\n"
            "          scrape_interval: 1s\n"
            "          scrape_timeout: 1s\n"
            f"          metrics_path: /{index}/metrics\n"
            f"          static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n"
            for index in range(targets)
        )
        (work / "scraper.yaml").write_text(SCRAPER_CONFIG.format(jobs=jobs))
        log = (work / "scraper.out").open("wb")
        import subprocess

        process = subprocess.Popen([str(OTELCOL), f"--config={work / 'scraper.yaml'}"], stdout=log, stderr=log)
        try:
            time.sleep(8.0)  # discovery and the first scrapes (Prometheus spreads targets over the interval)
            before, started = process_cpu_s(process.pid), time.monotonic()
            time.sleep(seconds)
            spent, elapsed = process_cpu_s(process.pid) - before, time.monotonic() - started
        finally:
            process.terminate()
            process.wait(timeout=10)
            log.close()
    reports = targets * NODE_GPUS * elapsed  # one scrape of each target a second
    return {
        "path": SCRAPER,
        "requests": int(targets * elapsed),
        "gpu_reports": int(reports),
        "us_per_report": spent / reports * 1e6,
        "gpus_per_core": INTERVAL_S / (spent / reports) if spent > 0 else None,
    }


def measure_all(quick: bool = False) -> dict[str, Any]:
    rows = measure_collector(NODES, rounds=1 if quick else 3)
    scraper = measure_scraper(targets=100, seconds=10.0 if quick else 30.0)
    if scraper is not None:
        rows.append(scraper)
    return {"nodes": NODES, "gpus_per_node": NODE_GPUS, "interval_s": INTERVAL_S, "rows": rows}


def run(ctx: RunContext) -> BenchResult:
    data = measure_all(quick=ctx.quick)
    rows = data["rows"]
    base = next(r for r in rows if r["path"] == PRODUCER)["us_per_report"]
    table = [
        (
            r["path"],
            f"{r['gpu_reports']:,}",
            f"{r['us_per_report']:.1f}",
            f"{r['gpus_per_core']:,.0f}" if r["gpus_per_core"] else "-",
            f"{r['us_per_report'] / base:.1f}" if r["path"] != SCRAPER else "-",
        )
        for r in rows
    ]
    return BenchResult(
        "dcgm_scrape",
        "dcgm-exporter scrapes into the collector: CPU per GPU report beside the producer path",
        doc_summary(__doc__),
        tables=(
            Table(
                f"CPU per GPU report at a {NODES:,}-node, {NODE_GPUS}-GPU fleet's scrape shape ({NODE_GPUS} GPUs per "
                "request)",
                ("path", "GPU reports", "us CPU per report", "GPUs per core at 10 s", "x the producer path"),
                table,
                note="Reported, no target: the design sets none for this path. The collector's rows are its whole "
                "process; the scraper's is the OpenTelemetry Collector's own process, which this path runs instead of "
                "a producer on every node.",
            ),
        ),
        data=data,
    )


def main() -> None:
    print(json.dumps(measure_all(quick="--quick" in sys.argv), indent=2))


if __name__ == "__main__":
    main()
