"""The collector's Prometheus endpoint: the newest window when one flush closes several; series that expire after
--prometheus-expiration-windows windows without them, scraped over real HTTP; reason counters that start at 0; a
busy port; a burst of scrapes."""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from otel_ofu import cli, names
from otel_ofu.testing.otlp_requests import gpu_request
from otel_ofu.testing.otlp_sink import OtlpSink
from otel_ofu_collector import command
from otel_ofu_collector.aggregation.windows import Aggregator
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.outputs.prometheus import OutputsCollector, PrometheusEndpoint
from otel_ofu_collector.results import FleetReport, GpuFlagReport, GroupReport, JobReport, WindowReport
from otel_ofu_collector.service import CollectorOptions, CollectorService
from otel_ofu_collector.stats.comoments import CoMoments
from otel_ofu_collector.stats.exphist import ExpHistogram

SECOND = 1_000_000_000
WINDOW = 60 * SECOND
W0 = 1_700_000_040 * SECOND  # a multiple of 60 s, as the windows are
H100 = "NVIDIA H100 80GB HBM3"
GROUP = {names.HW_MODEL: H100, names.GPU_PRECISION: "bf16"}


def test_the_newest_window_wins_when_one_flush_closes_two() -> None:
    aggregator = Aggregator(AggregatorConfig(window_s=60, lateness_s=0))
    identity = {names.JOB_ID: "job-a", names.HW_MODEL: "NVIDIA H100 80GB HBM3", names.GPU_PRECISION: "bf16"}
    for window, ofu in enumerate((0.1, 0.9)):
        end = (window * 60 + 30) * SECOND
        aggregator.add_ofu("gpu-0", ofu, end - 10 * SECOND, end, identity)
    reports = aggregator.flush(150 * SECOND)  # windows (0, 60 s] and (60 s, 120 s]
    assert len(reports) == 2
    collector = OutputsCollector()
    collector.consume_windows(reports)
    job_ofu = {
        sample.value
        for family in collector.collect()
        for sample in family.samples
        if family.name == "job_ofu" and sample.labels.get("job_id") == "job-a"
    }
    assert job_ofu == {0.9}


def test_a_busy_port_is_one_line_naming_the_address() -> None:
    first = PrometheusEndpoint(host="127.0.0.1")
    first.start()
    port = first.port
    try:
        with pytest.raises(OSError, match=f"cannot serve Prometheus metrics on 127.0.0.1:{port} ") as caught:
            PrometheusEndpoint(host="127.0.0.1", port=port).start()
        assert "\n" not in str(caught.value)
    finally:
        first.shutdown()


# --- series expire after --prometheus-expiration-windows windows without them -------------------------------

FLEET = FleetReport(correlation=None, mae=None, jobs=0, comoments=CoMoments(), abs_diff_sum=0.0)


def _straggler(reason: str | None) -> GpuFlagReport:
    labels = {names.HOST_NAME: "node-3", names.HW_ID: "GPU-3"}
    if reason is not None:
        labels[names.GPU_THROTTLE_REASON] = reason
    return GpuFlagReport(names.GPU_STRAGGLER.name, "train-1", labels, 1, ofu=0.2, job_median_ofu=0.6)


def _window(index: int, *, ofu: float | None = None, reason: str | None = None, idle: int = 0) -> WindowReport:
    """Window ``index`` (W0 + index x 60 s, + 60 s]: job train-1 on 2 GPUs at ``ofu`` with ``idle`` of them idle and a
    straggler GPU-3 held down by ``reason``; ``ofu`` None: an empty window (no groups, no jobs), as a fleet whose
    producers stopped gives."""
    start = W0 + index * WINDOW
    if ofu is None:
        return WindowReport(start, start + WINDOW, (), (), FLEET)
    group = GroupReport(GROUP, 2, {0.5: ofu}, ExpHistogram.from_values([ofu, ofu], max_buckets=160), 2 * ofu, ofu, ofu)
    job = JobReport(
        job_id="train-1",
        attributes={names.JOB_NAME: "pretrain", **GROUP},
        ofu=ofu,
        mfu=None,
        gap=None,
        correlation=None,
        flags={names.JOB_GPUS_IDLE.name: idle},
        status="no_mfu",
        gpus=2,
    )
    return WindowReport(start, start + WINDOW, (group,), (job,), FLEET, (_straggler(reason),))


Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]  # (name, sorted labels) -> value


def _scrape(endpoint: PrometheusEndpoint | int) -> Series:
    """GET /metrics (of an endpoint, or a port) over real HTTP, parsed by prometheus-client's own parser."""
    port = endpoint if isinstance(endpoint, int) else endpoint.port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _outputs(series: Series) -> Series:
    """The window outputs only (the self-metrics are always there)."""
    return {key: value for key, value in series.items() if not key[0].startswith("otel_ofu_collector_")}


@pytest.fixture
def endpoint() -> Iterator[PrometheusEndpoint]:
    served = PrometheusEndpoint(host="127.0.0.1", expiration_windows=2)
    served.start()
    yield served
    served.shutdown()


JOB_LABELS = (("gpu_precision", "bf16"), ("hw_model", H100), ("job_id", "train-1"), ("job_name", "pretrain"))
GROUP_LABELS = (("gpu_precision", "bf16"), ("hw_model", H100))


def _straggler_labels(reason: str | None) -> tuple[tuple[str, str], ...]:
    labels = {"host_name": "node-3", "hw_id": "GPU-3", "job_id": "train-1"}
    if reason is not None:
        labels["gpu_throttle_reason"] = reason
    return tuple(sorted(labels.items()))


def _expected(ofu: float, reason: str | None, idle: int = 0) -> Series:
    """What one window of ``_window`` shows, written out: job train-1 at ``ofu`` on 2 GPUs, the group's median and
    GPU count, the idle count and the straggler flag at 1."""
    return {
        ("fleet_ofu_quantile", tuple(sorted({**dict(GROUP_LABELS), "ofu_quantile": "0.5"}.items()))): ofu,
        ("fleet_gpus", GROUP_LABELS): 2.0,
        ("job_ofu", JOB_LABELS): ofu,
        ("job_gpus_idle", JOB_LABELS): float(idle),
        ("job_gpus", JOB_LABELS): 2.0,
        ("gpu_straggler", _straggler_labels(reason)): 1.0,
    }


def test_a_fleet_whose_producers_stop_goes_quiet_after_the_expiration_windows(endpoint: PrometheusEndpoint) -> None:
    # Window 0 has GPUs; windows 1 and 2 are empty (the producers stopped). With --prometheus-expiration-windows 2
    # a series is shown while it was in one of the last 2 windows: after window 1 (not seen for 1 window) it still
    # shows window 0's values; after window 2 (not seen for 2) it is gone, and Prometheus marks it stale.
    endpoint.consume_windows([_window(0, ofu=0.4, reason="power", idle=1)])
    assert _outputs(_scrape(endpoint)) == _expected(0.4, "power", idle=1)
    endpoint.consume_windows([_window(1)])
    assert _outputs(_scrape(endpoint)) == _expected(0.4, "power", idle=1)
    endpoint.consume_windows([_window(2)])
    scraped = _scrape(endpoint)
    assert _outputs(scraped) == {}  # no straggler, no idle GPUs, no fleet_gpus: the "no windows" alert can fire


def test_expiry_counts_windows_not_batches(endpoint: PrometheusEndpoint) -> None:
    # One flush after a pause closes the two empty windows at once: they count as two windows without the series.
    endpoint.consume_windows([_window(0, ofu=0.4)])
    endpoint.consume_windows([_window(1), _window(2)])
    assert _outputs(_scrape(endpoint)) == {}


def test_a_series_missing_from_one_window_is_held_and_then_updated(endpoint: PrometheusEndpoint) -> None:
    # A window the job missed (its producer late, say) does not break its series: window 1 shows window 0's 0.4,
    # window 2 the job's new 0.6.
    endpoint.consume_windows([_window(0, ofu=0.4)])
    endpoint.consume_windows([_window(1)])
    assert _outputs(_scrape(endpoint)) == _expected(0.4, None)
    endpoint.consume_windows([_window(2, ofu=0.6)])
    assert _outputs(_scrape(endpoint)) == _expected(0.6, None)


def test_a_straggler_whose_reason_changes_shows_the_old_reason_one_window_more(endpoint: PrometheusEndpoint) -> None:
    endpoint.consume_windows([_window(0, ofu=0.4, reason="power")])
    endpoint.consume_windows([_window(1, ofu=0.4, reason="thermal")])
    stragglers = {key: value for key, value in _scrape(endpoint).items() if key[0] == "gpu_straggler"}
    assert stragglers == {("gpu_straggler", _straggler_labels("power")): 1.0,
                          ("gpu_straggler", _straggler_labels("thermal")): 1.0}  # fmt: skip
    endpoint.consume_windows([_window(2, ofu=0.4, reason="thermal")])
    stragglers = {key: value for key, value in _scrape(endpoint).items() if key[0] == "gpu_straggler"}
    assert stragglers == {("gpu_straggler", _straggler_labels("thermal")): 1.0}


def test_one_expiration_window_shows_the_latest_window_only() -> None:
    served = PrometheusEndpoint(host="127.0.0.1", expiration_windows=1)
    served.start()
    try:
        served.consume_windows([_window(0, ofu=0.4)])
        assert _outputs(_scrape(served)) == _expected(0.4, None)
        served.consume_windows([_window(1)])
        assert _outputs(_scrape(served)) == {}
    finally:
        served.shutdown()


def test_an_older_window_arriving_late_does_not_replace_newer_values(endpoint: PrometheusEndpoint) -> None:
    endpoint.consume_windows([_window(1, ofu=0.6)])
    endpoint.consume_windows([_window(0, ofu=0.4)])
    assert _outputs(_scrape(endpoint)) == _expected(0.6, None)


def test_the_expiration_is_an_option_with_its_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def options(*argv: str) -> int:
        args = cli.build_parser().parse_args(["collector", *argv])  # built now: defaults read the variables
        return command.options_from_args(args).prometheus_expiration_windows

    assert options() == 2
    assert options("--prometheus-expiration-windows", "5") == 5
    monkeypatch.setenv("OTEL_OFU_COLLECTOR_PROMETHEUS_EXPIRATION_WINDOWS", "3")
    assert options() == 3
    with pytest.raises(SystemExit) as refused:
        options("--prometheus-expiration-windows", "0")
    assert refused.value.code == 2  # a usage error, before anything starts
    capsys.readouterr()
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["collector", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "--prometheus-expiration-windows" in shown
    assert "OTEL_OFU_COLLECTOR_PROMETHEUS_EXPIRATION_WINDOWS" in shown


# --- counters by reason start at 0, so rate() sees the first burst ---------------------------------------


def _by_reason(series: Series, name: str) -> dict[str, float]:
    return {dict(labels)["reason"]: value for (found, labels), value in series.items() if found == name}


def test_every_reason_counter_starts_at_zero_and_counts_from_there() -> None:
    sink = OtlpSink.start()  # a downstream, so the export's drop reasons exist
    options = CollectorOptions(
        grpc_listen=None,
        prometheus_port=0,
        prometheus_host="127.0.0.1",
        export_endpoint=sink.grpc_endpoint,
        flush_interval_s=0,
    )
    service = CollectorService(options, environ={})
    service.start()
    try:
        endpoint = service.ports["prometheus"]
        first = _scrape(endpoint)  # before any request: every reason is there, at 0
        rejected = "otel_ofu_collector_points_rejected_total"
        assert _by_reason(first, rejected) == dict.fromkeys(names.RejectReason.ALL, 0.0)
        assert _by_reason(first, "otel_ofu_collector_requests_refused_total") == {"overload": 0.0, "shutdown": 0.0}
        drops = ("overflow", "rejected", "oversized")
        assert _by_reason(first, "otel_ofu_collector_dropped_total") == {
            f"{stream}_{drop}": 0.0 for stream in ("windows", "pass_through", "events") for drop in drops
        }
        # One bad point (OFU 1.5, outside [0, 1]) is one rejection: the total over reasons goes from 0 to 1.
        assert service.ingest(gpu_request({"GPU-1": 1.5}, time_ns=W0 + SECOND)).rejected == 1
        counted = _by_reason(_scrape(endpoint), rejected)
        assert sum(counted.values()) == 1.0
        assert set(names.RejectReason.ALL) <= set(counted)  # the others stay, at 0
    finally:
        service.stop(grace=1)
        sink.close()


# --- a burst of scrapes ----------------------------------------------------------------------------------


def test_a_burst_of_simultaneous_scrapes_all_succeed() -> None:
    # As the receivers: socketserver's listen backlog of 5 reset the connections of a burst beyond it.
    served = PrometheusEndpoint(host="127.0.0.1")
    served.start()
    clients = 128
    barrier = threading.Barrier(clients)
    statuses: list[int | str] = []
    lock = threading.Lock()

    def client() -> None:
        barrier.wait()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{served.port}/metrics", timeout=30) as response:
                status: int | str = response.status
        except OSError as error:  # a reset connection
            status = type(error).__name__
        with lock:
            statuses.append(status)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert statuses == [200] * clients
    finally:
        served.shutdown()
