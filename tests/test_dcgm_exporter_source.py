"""The dcgm-exporter source against real exporter output served by a real HTTP server on loopback."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from otel_ofu import gpu_values, names
from otel_ofu.model import GpuError, GpuReading, IoCounter, Snapshot, SourceUnavailable
from otel_ofu.sources.dcgm_exporter import DcgmExporterSource, normalize_url
from otel_ofu.testing.otlp_sink import unused_port
from tests.exporter_server import ExporterServer, Route, Ticks, serving


@pytest.fixture
def exporter() -> Iterator[ExporterServer]:
    with serving() as server:
        yield server


def read_once(url: str, **kwargs: object) -> Snapshot:
    source = DcgmExporterSource(url, **kwargs)  # type: ignore[arg-type]
    try:
        return source.read()
    finally:
        source.close()


def by_key(snapshot: Snapshot) -> dict[str, GpuReading | GpuError]:
    items: dict[str, GpuReading | GpuError] = {r.gpu.key: r for r in snapshot.readings}
    for error in snapshot.errors:
        assert error.gpu is not None
        items[error.gpu.key] = error
    return items


def with_metric(line: str, metric: str, value: str) -> str:
    """The same series (labels and all) as another metric with another value."""
    rest = line.split("{", 1)[1]
    labels = rest.rsplit("}", 1)[0]
    return f"{metric}{{{labels}}} {value}"


# --- the real fixtures ---------------------------------------------------------------------------------


def test_every_fixture_parses_and_incomplete_gpus_are_errors_not_zeros(
    exporter: ExporterServer, shared_fixtures: Path
) -> None:
    # The published pages (the pages written for tests, the generation pages and the node page, are not among them).
    written = ("_generation_", "_written")
    files = sorted(
        path for path in shared_fixtures.glob("dcgm_exporter_*.prom") if not any(part in path.name for part in written)
    )
    assert len(files) == 4
    for path in files:
        snapshot = read_once(exporter.serve(path.read_text(), f"/{path.stem}"))
        # None of the published samples has both TPA and the SM clock for a GPU: each is an error, and
        # what a GPU did publish stays as its reading beside the error, never a 0 for the rest.
        failed = {error.gpu.key for error in snapshot.errors if error.gpu is not None}
        for reading in snapshot.readings:
            assert reading.gpu.key in failed, path.name
            assert reading.tensor_active is None or reading.sm_clock_hz is None, path.name
        assert snapshot.errors, path.name
        for error in snapshot.errors:
            assert error.reason == names.ErrorReason.NO_VALUE
            assert error.gpu is not None
            assert "no value for" in error.message


def test_titan_v_fixture_identities(exporter: ExporterServer, shared_fixtures: Path) -> None:
    text = (shared_fixtures / "dcgm_exporter_titanv_issue58.prom").read_text()
    snapshot = read_once(exporter.serve(text))
    errors = sorted(snapshot.errors, key=lambda e: e.gpu.index if e.gpu else -1)
    assert [e.gpu.index for e in errors if e.gpu] == [0, 1, 2, 3, 4]
    for error in errors:
        assert error.gpu is not None
        assert error.gpu.model == "NVIDIA TITAN V"
        assert error.gpu.host == "dcgm-exporter-lcxpl"
        assert error.gpu.hints == {}  # pod="" is no pod
        assert "tensor pipe activity" in error.message
        assert "SM clock" not in error.message


def test_a30_mig_instance_lacks_the_sm_clock(exporter: ExporterServer, shared_fixtures: Path) -> None:
    text = (shared_fixtures / "dcgm_exporter_a30_mig_issue68.prom").read_text()
    (error,) = read_once(exporter.serve(text)).errors
    assert error.gpu is not None
    assert error.gpu.uuid == "GPU-603a8873-0edd-c157-ce48-2078e8b1a935"
    assert (error.gpu.mig_profile, error.gpu.mig_instance_id) == ("2g.12gb", 1)
    assert error.gpu.key == "GPU-603a8873-0edd-c157-ce48-2078e8b1a935/1"
    assert "SM clock" in error.message
    assert "tensor" not in error.message


def test_h100_mig_instances_carry_pod_hints(exporter: ExporterServer, shared_fixtures: Path) -> None:
    text = (shared_fixtures / "dcgm_exporter_h100_mig_k8s_issue512.prom").read_text()
    items = by_key(read_once(exporter.serve(text)))
    uuid = "GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77"
    assert set(items) == {f"{uuid}/7", f"{uuid}/8", f"{uuid}/9"}
    seven = items[f"{uuid}/7"].gpu
    assert seven is not None
    assert seven.hints == {
        names.K8S_POD_NAME: "text-embedding-predictor-00008-deployment-57946f6c67-vdtjl",
        names.K8S_NAMESPACE_NAME: "model-playground-stg",
        names.K8S_CONTAINER_NAME: "kserve-container",
        names.JOB_SCHEDULER: "kubernetes",
    }
    eight = items[f"{uuid}/8"].gpu
    assert eight is not None
    assert eight.hints == {}
    assert (eight.mig_profile, eight.host, eight.model) == ("1g.10gb", "gsrh100-074", "NVIDIA H100 80GB HBM3")


# --- label generations and metric names ----------------------------------------------------------------


def _new_generation(text: str) -> str:
    for old, new in (
        ("Hostname=", "hostname="),
        ("UUID=", "uuid="),
        ("pod=", "pod_name="),
        ("namespace=", "pod_namespace="),
        ("container=", "container_name="),
    ):
        text = re.sub(rf"([{{,]){old}", rf"\g<1>{new}", text)
    return text


def test_both_label_generations_give_the_same_identities(exporter: ExporterServer, shared_fixtures: Path) -> None:
    text = (shared_fixtures / "dcgm_exporter_h100_mig_k8s_issue512.prom").read_text()
    rewritten = _new_generation(text)
    assert "hostname=" in rewritten
    assert "pod_name=" in rewritten
    old = by_key(read_once(exporter.serve(text, "/old")))
    new = by_key(read_once(exporter.serve(rewritten, "/new")))
    assert {key: item.gpu for key, item in old.items()} == {key: item.gpu for key, item in new.items()}


def _h100_complete(shared_fixtures: Path, tensor_metric: str = names.DCGM_EXPORTER_TENSOR_ACTIVE) -> list[str]:
    clock_line = next(
        line
        for line in (shared_fixtures / "dcgm_exporter_h100_digitalocean_docs.prom").read_text().splitlines()
        if line.startswith(names.DCGM_EXPORTER_SM_CLOCK)
    )
    clock_line = with_metric(clock_line, names.DCGM_EXPORTER_SM_CLOCK, "1755")
    return [clock_line, with_metric(clock_line, tensor_metric, "0.5")]


@pytest.mark.parametrize("tensor_metric", [names.DCGM_EXPORTER_TENSOR_ACTIVE, names.DCGM_EXPORTER_TENSOR_ACTIVE_46])
def test_complete_gpu_reads_and_takes_the_catalog_max_clock(
    exporter: ExporterServer, shared_fixtures: Path, tensor_metric: str
) -> None:
    snapshot = read_once(exporter.serve("\n".join(_h100_complete(shared_fixtures, tensor_metric)) + "\n"))
    assert snapshot.errors == ()
    (reading,) = snapshot.readings
    assert reading.tensor_active == 0.5
    assert reading.sm_clock_hz == 1755e6
    assert reading.max_sm_clock_hz is None  # field 113 is not exported by default
    values = gpu_values.compute(reading)
    assert values.max_clock_from_catalog
    assert values.max_sm_clock_hz == 1980e6
    assert values.ofu_raw == pytest.approx(0.5 * 1755 / 1980)


def test_device_max_clock_when_exported(exporter: ExporterServer, shared_fixtures: Path) -> None:
    lines = _h100_complete(shared_fixtures)
    lines.append(with_metric(lines[0], names.DCGM_EXPORTER_MAX_SM_CLOCK, "1980"))
    lines.append(with_metric(lines[0], names.DCGM_EXPORTER_SM_ACTIVE, "0.7"))
    lines.append(with_metric(lines[0], names.DCGM_EXPORTER_DRAM_ACTIVE_46, "0.2"))
    (reading,) = read_once(exporter.serve("\n".join(lines) + "\n")).readings
    assert reading.max_sm_clock_hz == 1980e6
    assert (reading.sm_active, reading.dram_active) == (0.7, 0.2)
    assert not gpu_values.compute(reading).max_clock_from_catalog


@pytest.mark.parametrize(
    ("metric", "value"),
    [
        (names.DCGM_EXPORTER_TENSOR_ACTIVE, "140737488355328.0"),
        (names.DCGM_EXPORTER_TENSOR_ACTIVE, "9223372036854775794"),
        (names.DCGM_EXPORTER_TENSOR_ACTIVE, "NaN"),
        (names.DCGM_EXPORTER_SM_CLOCK, "9223372036854775794"),
        (names.DCGM_EXPORTER_SM_CLOCK, "2147483632"),
        (names.DCGM_EXPORTER_SM_CLOCK, "NaN"),
    ],
)
def test_blank_sentinels_and_nan_are_no_value(
    exporter: ExporterServer, shared_fixtures: Path, metric: str, value: str
) -> None:
    lines = [
        with_metric(line, metric, value) if line.startswith(metric + "{") else line
        for line in _h100_complete(shared_fixtures)
    ]
    snapshot = read_once(exporter.serve("\n".join(lines) + "\n"))
    (error,) = snapshot.errors
    assert error.reason == names.ErrorReason.NO_VALUE
    assert "blank sentinel or NaN" in error.message
    # The field that was read stays beside the error: a blank TPA does not cost the GPU its clock.
    (reading,) = snapshot.readings
    assert reading.gpu == error.gpu
    if metric == names.DCGM_EXPORTER_TENSOR_ACTIVE:
        assert (reading.tensor_active, reading.sm_clock_hz) == (None, 1755e6)
    else:
        assert reading.sm_clock_hz is None
        assert reading.tensor_active is not None


def test_hpc_job_and_pod_uid_hints(exporter: ExporterServer, shared_fixtures: Path) -> None:
    lines = _h100_complete(shared_fixtures)
    lines = [line.replace("Hostname=", 'hpc_job="4242",pod_uid="",Hostname=') for line in lines]
    (reading,) = read_once(exporter.serve("\n".join(lines) + "\n")).readings
    assert reading.gpu.hints == {names.JOB_ID: "4242", names.JOB_SCHEDULER: "slurm"}
    lines = [line.replace('pod_uid=""', 'pod_uid="u-1",pod="p"') for line in lines]
    (reading,) = read_once(exporter.serve("\n".join(lines) + "\n", "/2")).readings
    assert reading.gpu.hints[names.K8S_POD_UID] == "u-1"
    assert reading.gpu.hints[names.JOB_SCHEDULER] == "kubernetes"


def test_mig_instance_takes_the_parents_sm_clock(exporter: ExporterServer, shared_fixtures: Path) -> None:
    text = (shared_fixtures / "dcgm_exporter_a30_mig_issue68.prom").read_text()
    tensor = next(line for line in text.splitlines() if line.startswith(names.DCGM_EXPORTER_TENSOR_ACTIVE))
    parent = re.sub(r',GPU_I_PROFILE="[^"]*",GPU_I_ID="[^"]*"', "", tensor)
    body = text + with_metric(parent, names.DCGM_EXPORTER_SM_CLOCK, "1440") + "\n"
    snapshot = read_once(exporter.serve(body))
    assert snapshot.errors == ()  # the parent has no TPA of its own under MIG: it is not an error
    (reading,) = snapshot.readings
    assert reading.gpu.mig_instance_id == 1
    assert (reading.tensor_active, reading.sm_clock_hz) == (0.022137, 1440e6)


# --- intervals and counters ------------------------------------------------------------------------------


def test_interval_runs_from_the_previous_scrape(exporter: ExporterServer, shared_fixtures: Path) -> None:
    clock = Ticks()
    source = DcgmExporterSource(exporter.serve("\n".join(_h100_complete(shared_fixtures)) + "\n"), clock=clock)
    opened = clock.now
    first = source.read().readings[0]
    second = source.read().readings[0]
    assert (first.start_ns, first.end_ns) == (opened, opened + 10_000_000_000)
    assert (second.start_ns, second.end_ns) == (first.end_ns, first.end_ns + 10_000_000_000)


def test_cycle_counters_become_deltas_and_a_stale_counter_is_none(
    exporter: ExporterServer, shared_fixtures: Path
) -> None:
    base = _h100_complete(shared_fixtures)

    def page(elapsed: int, mma: int) -> str:
        return (
            "\n".join(
                [
                    *base,
                    f"# TYPE {names.DCGM_EXPORTER_SM_CYCLES_ELAPSED_TOTAL} counter",
                    with_metric(base[0], names.DCGM_EXPORTER_SM_CYCLES_ELAPSED_TOTAL, str(elapsed)),
                    f"# TYPE {names.DCGM_EXPORTER_MMA_CYCLES_ACTIVE_TOTAL} counter",
                    with_metric(base[0], names.DCGM_EXPORTER_MMA_CYCLES_ACTIVE_TOTAL, str(mma)),
                ]
            )
            + "\n"
        )

    clock = Ticks()
    url = exporter.serve(page(10**15, 10**14))
    source = DcgmExporterSource(url, clock=clock)
    assert source.read().readings[0].cycles is None  # one value is not a delta
    t_first = clock.now
    exporter.serve(page(10**15 + 17_550_000_000, 10**14 + 8_775_000_000))
    reading = source.read().readings[0]
    assert reading.cycles is not None
    assert (reading.cycles.sm_cycles_elapsed, reading.cycles.mma_cycles_active) == (17_550_000_000, 8_775_000_000)
    assert (reading.start_ns, reading.end_ns) == (t_first, clock.now)
    values = gpu_values.compute(reading)
    assert values.tensor_active == pytest.approx(0.5)
    assert values.sm_clock_hz == pytest.approx(1755e6)
    assert source.read().readings[0].cycles is None  # the exporter has not refreshed: no new delta


# --- failures of the scrape ------------------------------------------------------------------------------


def _only_scrape_error(snapshot: Snapshot) -> str:
    assert snapshot.readings == ()
    (error,) = snapshot.errors
    assert error.reason == names.ErrorReason.SCRAPE
    assert error.gpu is None
    return error.message


def test_http_500_is_a_scrape_error_and_the_last_good_state_is_not_reemitted(
    exporter: ExporterServer, shared_fixtures: Path
) -> None:
    url = exporter.serve("\n".join(_h100_complete(shared_fixtures)) + "\n")
    source = DcgmExporterSource(url)
    assert len(source.read().readings) == 1
    exporter.routes["/metrics"] = Route("boom", status=500)
    assert "HTTP 500" in _only_scrape_error(source.read())


def test_timeout_is_a_scrape_error(exporter: ExporterServer) -> None:
    exporter.routes["/metrics"] = Route(stall=True)
    message = _only_scrape_error(read_once(exporter.url(), timeout_s=0.2))
    assert exporter.url() in message


def test_malformed_text_is_a_scrape_error(exporter: ExporterServer) -> None:
    message = _only_scrape_error(read_once(exporter.serve('DCGM_FI_DEV_SM_CLOCK{gpu="0" 1\n')))
    assert "malformed" in message


def test_connection_refused_is_a_scrape_error() -> None:
    _only_scrape_error(read_once(f"http://127.0.0.1:{unused_port()}/metrics", timeout_s=1.0))


def test_404_and_urls() -> None:
    assert normalize_url("gpu-node:9400") == "http://gpu-node:9400/metrics"
    assert normalize_url("https://n:1/custom") == "https://n:1/custom"
    with pytest.raises(SourceUnavailable, match="HOST:9400"):
        normalize_url("ftp://gpu-node/metrics")


def test_not_found_path(exporter: ExporterServer) -> None:
    assert "HTTP 404" in _only_scrape_error(read_once(exporter.url("/nope")))


# --- power, energy, throttling ------------------------------------------------------------------------------

_LABELS = (
    'gpu="{gpu}",UUID="GPU-{gpu}a7e2c1-0000-4000-8000-00000000000{gpu}",pci_bus_id="00000000:{bus}:00.0",'
    'device="nvidia{gpu}",modelName="NVIDIA H100 80GB HBM3",Hostname="node-7",DCGM_FI_DRIVER_VERSION="550.54.15"'
)


def power_scrape(energy_mj: int, power_violation_ns: int, reasons: int) -> str:
    """A scrape in dcgm-exporter's shape (HELP/TYPE as its counters file words them, its label set), written
    for this test: GPU 0 with the energy counter, two violation counters and the throttle bitmask enabled,
    GPU 1 with the default counters only (power usage). None of the real samples carries these series."""
    gpu0, gpu1 = _LABELS.format(gpu=0, bus="19"), _LABELS.format(gpu=1, bus="3B")
    return f"""\
# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz).
# TYPE DCGM_FI_DEV_SM_CLOCK gauge
DCGM_FI_DEV_SM_CLOCK{{{gpu0}}} 1755
DCGM_FI_DEV_SM_CLOCK{{{gpu1}}} 1980
# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{{{gpu0}}} 650.000000
DCGM_FI_DEV_POWER_USAGE{{{gpu1}}} 300.250000
# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot (in mJ).
# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{gpu0}}} {energy_mj}
# HELP DCGM_FI_DEV_POWER_VIOLATION Throttling duration due to power constraints (in us).
# TYPE DCGM_FI_DEV_POWER_VIOLATION counter
DCGM_FI_DEV_POWER_VIOLATION{{{gpu0}}} {power_violation_ns}
# HELP DCGM_FI_DEV_THERMAL_VIOLATION Throttling duration due to thermal constraints (in us).
# TYPE DCGM_FI_DEV_THERMAL_VIOLATION counter
DCGM_FI_DEV_THERMAL_VIOLATION{{{gpu0}}} 0
# HELP DCGM_FI_DEV_CLOCK_THROTTLE_REASONS Current clock throttle reasons.
# TYPE DCGM_FI_DEV_CLOCK_THROTTLE_REASONS gauge
DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{{{gpu0}}} {reasons}
# HELP DCGM_FI_PROF_PIPE_TENSOR_ACTIVE Ratio of cycles the tensor (HMMA) pipe is active.
# TYPE DCGM_FI_PROF_PIPE_TENSOR_ACTIVE gauge
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{gpu0}}} 0.512000
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{gpu1}}} 0.250000
"""


def test_power_energy_and_throttle_from_the_exporter(exporter: ExporterServer) -> None:
    url = exporter.serve(power_scrape(123_456_789, 5_000_000_000, 0x4))
    source = DcgmExporterSource(url, clock=Ticks())
    first = by_key(source.read())
    exporter.serve(power_scrape(123_456_789 + 7_000_000, 7_500_000_000, 0x0))
    second = by_key(source.read())
    source.close()

    gpu0, gpu1 = "GPU-0a7e2c1-0000-4000-8000-000000000000", "GPU-1a7e2c1-0000-4000-8000-000000000001"
    start = first[gpu0]
    assert isinstance(start, GpuReading)
    assert start.power_w == 650.0  # the counter has no delta yet: the exporter's power reading
    assert start.energy is not None
    assert start.energy.joules == 0.0
    assert start.throttle == {reason: float(reason == "power") for reason in names.ThrottleReason.ALL}
    reading = second[gpu0]
    assert isinstance(reading, GpuReading)
    assert reading.power_w == pytest.approx(700.0)  # 7000 J over the 10 s between scrapes
    assert reading.energy is not None
    assert reading.energy.joules == pytest.approx(7000.0)
    assert reading.energy.start_ns == start.end_ns  # the first scrape that saw the counter
    assert reading.throttle == pytest.approx(
        {"power": 0.25, "thermal": 0.0, "hw_slowdown": 0.0, "sync_boost": 0.0, "app_clock": 0.0, "other": 0.0}
    )
    other = second[gpu1]
    assert isinstance(other, GpuReading)
    assert (other.power_w, other.energy, dict(other.throttle)) == (300.25, None, {})


def test_a_scrape_that_repeats_the_previous_refresh_does_not_read_as_unthrottled(exporter: ExporterServer) -> None:
    url = exporter.serve(power_scrape(1_000_000, 0, 0x0))
    source = DcgmExporterSource(url, clock=Ticks())
    source.read()
    exporter.serve(power_scrape(1_000_000, 4_000_000_000, 0x0))  # the exporter had not refreshed energy yet
    stale = by_key(source.read())
    exporter.serve(power_scrape(13_000_000, 10_000_000_000, 0x0))
    fresh = by_key(source.read())
    source.close()

    gpu0 = "GPU-0a7e2c1-0000-4000-8000-000000000000"
    stale_reading, fresh_reading = stale[gpu0], fresh[gpu0]
    assert isinstance(stale_reading, GpuReading)
    assert isinstance(fresh_reading, GpuReading)
    assert stale_reading.power_w == 650.0  # no counter delta: the instantaneous reading
    assert stale_reading.throttle[names.ThrottleReason.POWER] == 0.0  # from the bitmask alone
    assert fresh_reading.power_w == pytest.approx(600.0)  # 12000 J over the 20 s since the counter last moved
    assert fresh_reading.throttle[names.ThrottleReason.POWER] == pytest.approx(0.5)  # 10 s of violation in 20 s


def test_mig_instances_keep_the_gpu_throttle_and_take_their_share_of_the_board_power(
    exporter: ExporterServer,
) -> None:
    labels = (
        'gpu="0",UUID="GPU-7f1c0000-0000-4000-8000-000000000000",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",'
        'GPU_I_PROFILE="3g.40gb",GPU_I_ID="{gi}",Hostname="node-7"'
    )
    body = "".join(
        f"DCGM_FI_DEV_SM_CLOCK{{{labels.format(gi=gi)}}} 1755\n"
        f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{labels.format(gi=gi)}}} 0.3\n"
        f"DCGM_FI_DEV_POWER_USAGE{{{labels.format(gi=gi)}}} 512.0\n"  # the board's, printed per instance
        f"DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{{labels.format(gi=gi)}}} 32\n"  # SW thermal slowdown
        for gi in (1, 2)
    )
    snapshot = read_once(exporter.serve(body), clock=Ticks())
    assert len(snapshot.readings) == 2
    for reading in snapshot.readings:
        # A 3g instance is 3 of the H100's 7 compute slices: 512 W x 3/7 = 219.43 W each. The two add up to 6/7
        # of the board; the unconfigured seventh is attributed to no one.
        assert reading.power_w == pytest.approx(512 * 3 / 7)
        assert reading.throttle[names.ThrottleReason.THERMAL] == 1.0


def mig_scrape(energy_mj: int) -> str:
    """An H100 in 7 x 1g.10gb MIG instances as dcgm-exporter prints it: the board's power and energy on the parent
    GPU's own series (no GPU_I_ID), the tensor activity on each instance, written for this test."""
    parent = (
        'gpu="0",UUID="GPU-3c1d0000-0000-4000-8000-000000000000",device="nvidia0",'
        'modelName="NVIDIA H100 80GB HBM3",Hostname="node-8"'
    )
    lines = [
        f"DCGM_FI_DEV_SM_CLOCK{{{parent}}} 1830",
        f"DCGM_FI_DEV_POWER_USAGE{{{parent}}} 700.0",
        f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{parent}}} {energy_mj}",
    ]
    for gi in range(7):
        instance = parent + f',GPU_I_PROFILE="1g.10gb",GPU_I_ID="{gi + 7}"'
        lines.append(f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{instance}}} 0.5")
    return "\n".join(lines) + "\n"


def test_an_h100_at_700_w_in_seven_1g_instances_gives_each_100_w(exporter: ExporterServer) -> None:
    source = DcgmExporterSource(exporter.serve(mig_scrape(50_000_000)), clock=Ticks())
    first = source.read()
    exporter.serve(mig_scrape(50_000_000 + 7_000_000))  # 7000 J in the 10 s between scrapes: the board at 700 W
    second = source.read()
    source.close()
    assert len(second.readings) == 7  # the instances; the parent has no TPA of its own and is not a reading
    for reading in first.readings:
        assert reading.power_w == pytest.approx(100.0)  # 700 W x 1/7, the instantaneous reading
    for reading in second.readings:
        assert reading.gpu.mig_profile == "1g.10gb"
        assert reading.power_w == pytest.approx(100.0)  # 7000 J x 1/7 over 10 s
        assert reading.energy is not None
        assert reading.energy.joules == pytest.approx(1000.0)
    assert sum(r.energy.joules for r in second.readings if r.energy) == pytest.approx(7000.0)  # the board's, once


# --- a page of the seven models with no board max clock, default counters only -----------------------------------

SEVEN_MODELS = (  # (gpu index, modelName as NVML prints it, TPA, SM clock MHz)
    (0, "Tesla V100-SXM2-32GB", 0.40, 1380),
    (1, "Tesla T4", 0.25, 1200),
    (2, "NVIDIA A40", 0.50, 1500),
    (3, "NVIDIA L40", 0.30, 2100),
    (4, "NVIDIA H20", 0.35, 1755),
    (5, "NVIDIA B200", 0.60, 1800),
    (6, "NVIDIA GB200", 0.70, 1900),
)


def seven_model_page() -> str:
    """A scrape in dcgm-exporter's shape with its default counters file's OFU inputs (SM clock, tensor activity):
    no DCGM_FI_DEV_MAX_SM_CLOCK, as on every default deployment. Written for this test in the format
    of the real pages in tests/data (HELP/TYPE as the counters file words them, the newer label set)."""
    series: dict[str, list[str]] = {"DCGM_FI_DEV_SM_CLOCK": [], "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": []}
    for gpu, model, tpa, clock in SEVEN_MODELS:
        labels = (
            f'gpu="{gpu}",UUID="GPU-5e7e0000-0000-4000-8000-00000000000{gpu}",'
            f'pci_bus_id="00000000:{gpu + 10:02X}:00.0",device="nvidia{gpu}",modelName="{model}",'
            'hostname="mixed-1",DCGM_FI_DRIVER_VERSION="570.124.06"'
        )
        series["DCGM_FI_DEV_SM_CLOCK"].append(f"DCGM_FI_DEV_SM_CLOCK{{{labels}}} {clock}")
        series["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"].append(f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{labels}}} {tpa:.6f}")
    return (
        "# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz).\n# TYPE DCGM_FI_DEV_SM_CLOCK gauge\n"
        + "\n".join(series["DCGM_FI_DEV_SM_CLOCK"])
        + "\n# HELP DCGM_FI_PROF_PIPE_TENSOR_ACTIVE Ratio of cycles the tensor (HMMA) pipe is active.\n"
        "# TYPE DCGM_FI_PROF_PIPE_TENSOR_ACTIVE gauge\n" + "\n".join(series["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"]) + "\n"
    )


def test_the_seven_models_without_a_board_max_field_get_ofu_from_the_catalog(exporter: ExporterServer) -> None:
    from otel_ofu.gpu_samples import compute_snapshot

    computed = compute_snapshot(read_once(exporter.serve(seven_model_page())))
    values = {sample.gpu.index: sample.values for sample in computed.samples}
    # By hand, OFU = TPA x min(f / f_tensor, 1) where the catalog has a tensor clock, else TPA x f / f_board;
    # raw OFU = TPA x f / f_board where the catalog has a board max:
    # V100 SXM2 (board 1530, tensor 1526): 0.40 x 1380/1526 = 0.36173; raw 0.40 x 1380/1530 = 0.36078
    # T4 (board 1590, tensor 1587):        0.25 x 1200/1587 = 0.18904; raw 0.25 x 1200/1590 = 0.18868
    # A40 (board = tensor 1740):           0.50 x 1500/1740 = 0.43103 = raw
    # L40 (board 2490, no tensor clock):   0.30 x 2100/2490 = 0.25301 = raw
    # B200 (tensor 1856, no board max):    0.60 x 1800/1856 = 0.58190; no raw
    # GB200 (tensor 2062, no board max):   0.70 x 1900/2062 = 0.64501; no raw
    expected = {
        0: (0.36173, 0.36078),
        1: (0.18904, 0.18868),
        2: (0.43103, 0.43103),
        3: (0.25301, 0.25301),
        5: (0.58190, None),
        6: (0.64501, None),
    }
    assert set(values) == set(expected)
    for index, (ofu, raw) in expected.items():
        assert values[index].ofu == pytest.approx(ofu, abs=1e-5), index
        if raw is None:
            assert values[index].ofu_raw is None, index
        else:
            assert values[index].ofu_raw == pytest.approx(raw, abs=1e-5), index
    # The H20: no source gives its clocks, so no OFU; its error says which option to add, its clock is kept.
    (h20_error,) = [error for error in computed.errors if error.gpu is not None and error.gpu.index == 4]
    assert h20_error.reason == names.ErrorReason.NO_VALUE
    assert '--max-sm-clock "NVIDIA H20=MHZ"' in h20_error.message
    (h20,) = [partial for partial in computed.partial if partial.gpu.index == 4]
    assert h20.known[names.GPU_CLOCK_SM.name] == 1755e6


def test_a_mig_instance_whose_profile_cannot_be_read_leaves_the_board_power_out(exporter: ExporterServer) -> None:
    # Counted whole on each of two instances, the board's 700 W would read 1400 W: absent instead.
    parent = 'gpu="0",UUID="GPU-3c1d0000-0000-4000-8000-000000000009",modelName="NVIDIA H100 80GB HBM3",Hostname="n"'
    lines = [f"DCGM_FI_DEV_SM_CLOCK{{{parent}}} 1830", f"DCGM_FI_DEV_POWER_USAGE{{{parent}}} 700.0"]
    lines += [f'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{parent},GPU_I_ID="{gi}"}} 0.5' for gi in (1, 2)]
    snapshot = read_once(exporter.serve("\n".join(lines) + "\n"), clock=Ticks())
    assert [reading.power_w for reading in snapshot.readings] == [None, None]


# --- engine activity, occupancy and link traffic -------------------------------------------------------------

TX, RX = names.IoDirection.TRANSMIT, names.IoDirection.RECEIVE


def readings_by_key(snapshot: Snapshot) -> dict[str, GpuReading]:
    return {reading.gpu.key: reading for reading in snapshot.readings}


def test_the_fixtures_engine_activity_is_read_per_mig_instance(exporter: ExporterServer, shared_fixtures: Path) -> None:
    a30 = (shared_fixtures / "dcgm_exporter_a30_mig_issue68.prom").read_text()
    (reading,) = read_once(exporter.serve(a30, "/a30")).readings  # kept beside its error (no SM clock)
    assert (reading.gpu.mig_instance_id, reading.engine_active, reading.tensor_active) == (1, 0.381124, 0.022137)

    h100 = (shared_fixtures / "dcgm_exporter_h100_mig_k8s_issue512.prom").read_text()
    readings = readings_by_key(read_once(exporter.serve(h100, "/h100")))
    uuid = "GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77"
    # Three idle 1g instances: GR_ENGINE_ACTIVE 0.000000 is a measured 0, kept as one, not a missing value.
    assert {key: r.engine_active for key, r in readings.items()} == {f"{uuid}/{gi}": 0.0 for gi in (7, 8, 9)}
    assert all(r.sm_occupancy is None and not r.pcie_io for r in readings.values())  # not on the page: absent


def activity_page(pcie_tx: float, nvlink_rx: str, *, new_tags: bool = False) -> str:
    """One H100 with dcgm-exporter's default counters (engine activity, PCIe rates) and the SM and NVLink fields a
    counters file can add, in the label set of the real pages in tests/data; written for this test."""
    labels = (
        'gpu="0",UUID="GPU-9a1b0000-0000-4000-8000-000000000000",pci_bus_id="00000000:1A:00.0",device="nvidia0",'
        'modelName="NVIDIA H100 80GB HBM3",Hostname="node-5",DCGM_FI_DRIVER_VERSION="570.124.06"'
    )
    engine, occupancy = (
        ("DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", "DCGM_FI_PROF_SM_OCCUPANCY_RATIO")
        if new_tags
        else ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY")
    )
    lines = [
        f"DCGM_FI_DEV_SM_CLOCK{{{labels}}} 1755",
        f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{labels}}} 0.450000",
        f"{engine}{{{labels}}} 0.930000",
        f"DCGM_FI_PROF_SM_ACTIVE{{{labels}}} 0.810000",
        f"{occupancy}{{{labels}}} 0.310000",
        f"DCGM_FI_PROF_PCIE_TX_BYTES{{{labels}}} {pcie_tx:.0f}",
        f"DCGM_FI_PROF_PCIE_RX_BYTES{{{labels}}} 2000000000",
        f"DCGM_FI_PROF_NVLINK_TX_BYTES{{{labels}}} 300000000000",
        f"DCGM_FI_PROF_NVLINK_RX_BYTES{{{labels}}} {nvlink_rx}",
    ]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("new_tags", [False, True])
def test_engine_occupancy_and_link_rates_integrated_over_the_scrape_interval(
    exporter: ExporterServer, new_tags: bool
) -> None:
    url = exporter.serve(activity_page(1e9, "290000000000", new_tags=new_tags))
    clock = Ticks()  # 10 s per call: the source opens at the first tick
    source = DcgmExporterSource(url, clock=clock)
    start = clock.now
    (first,) = source.read().readings
    exporter.serve(activity_page(3e9, "9223372036854775794"))  # NVLink receive blank (INT64 not supported)
    (second,) = source.read().readings
    source.close()

    assert (first.engine_active, first.sm_active, first.sm_occupancy) == (0.93, 0.81, 0.31)
    # Rate x the 10 s between scrapes: PCIe 1 GB/s -> 10 GB, 2 GB/s -> 20 GB; NVLink 300 GB/s -> 3 TB, 290 -> 2.9 TB.
    assert first.pcie_io == {TX: IoCounter(1e10, start), RX: IoCounter(2e10, start)}
    assert first.nvlink_io == {TX: IoCounter(3e12, start), RX: IoCounter(2.9e12, start)}
    # Then PCIe + 3 GB/s x 10 s = 40 GB; the blank receive rate gives no point and its counter waits at 2.9 TB.
    assert second.pcie_io[TX] == IoCounter(4e10, start)
    assert second.nvlink_io == {TX: IoCounter(6e12, start)}


def test_mig_instances_take_their_share_of_the_boards_pcie_traffic(exporter: ExporterServer) -> None:
    parent = (
        'gpu="0",UUID="GPU-3c1d0000-0000-4000-8000-000000000000",device="nvidia0",'
        'modelName="NVIDIA H100 80GB HBM3",Hostname="node-8"'
    )
    lines = [f"DCGM_FI_DEV_SM_CLOCK{{{parent}}} 1830", f"DCGM_FI_PROF_PCIE_RX_BYTES{{{parent}}} 7000000000"]
    for gi, profile in ((7, "1g.10gb"), (8, "1g.10gb"), (1, "3g.40gb")):
        instance = parent + f',GPU_I_PROFILE="{profile}",GPU_I_ID="{gi}"'
        lines.append(f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{instance}}} 0.5")
        lines.append(f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{instance}}} 0.{gi}")
    clock = Ticks()
    source = DcgmExporterSource(exporter.serve("\n".join(lines) + "\n"), clock=clock)
    start = clock.now
    readings = readings_by_key(source.read())
    source.close()

    uuid = "GPU-3c1d0000-0000-4000-8000-000000000000"
    assert set(readings) == {f"{uuid}/7", f"{uuid}/8", f"{uuid}/1"}  # the parent has no TPA: not a reading
    assert readings[f"{uuid}/7"].engine_active == 0.7  # each instance its own engine activity
    assert readings[f"{uuid}/1"].engine_active == 0.1
    # The board receives 7 GB/s: over 10 s a 1g slice (1/7) carries 10 GB, a 3g slice (3/7) 30 GB.
    assert readings[f"{uuid}/7"].pcie_io == {RX: IoCounter(pytest.approx(1e10), start)}  # type: ignore[arg-type]
    assert readings[f"{uuid}/1"].pcie_io == {RX: IoCounter(pytest.approx(3e10), start)}  # type: ignore[arg-type]


# --- a page that is not dcgm-exporter's --------------------------------------------------------------------------

# The first lines of node-exporter's /metrics (its go_* and node_* families, as node-exporter prints them): what a
# wrong port (9100 for 9400) or a mistyped host answers.
NODE_EXPORTER_PAGE = """\
# HELP go_gc_duration_seconds A summary of the pause duration of garbage collection cycles.
# TYPE go_gc_duration_seconds summary
go_gc_duration_seconds{quantile="0"} 2.7319e-05
go_gc_duration_seconds{quantile="1"} 0.000146524
go_gc_duration_seconds_sum 0.012411302
go_gc_duration_seconds_count 147
# HELP node_cpu_seconds_total Seconds the CPUs spent in each mode.
# TYPE node_cpu_seconds_total counter
node_cpu_seconds_total{cpu="0",mode="idle"} 2.36544e+06
node_cpu_seconds_total{cpu="0",mode="user"} 15321.12
# HELP node_load1 1m load average.
# TYPE node_load1 gauge
node_load1 0.21
"""


def test_a_page_without_dcgm_metrics_says_so_naming_what_it_had(exporter: ExporterServer) -> None:
    url = exporter.serve(NODE_EXPORTER_PAGE)
    snapshot = read_once(url)
    assert snapshot.readings == ()
    (error,) = snapshot.errors  # one line for the page, not silence
    assert error.gpu is None
    assert error.reason == names.ErrorReason.SCRAPE
    assert error.message.startswith(f"{url}: no dcgm-exporter metric on the page")
    # 2 + 2 + 1 samples (the summary's two quantiles, sum and count are its series) of 5 metric names.
    assert "the page had 7 series of 5 metrics: go_gc_duration_seconds, " in error.message
    assert "node_cpu_seconds" in error.message
    assert "port 9400" in error.message
    assert "\n" not in error.message


def test_dcgm_series_without_a_gpu_uuid_say_why_no_gpu_came(exporter: ExporterServer) -> None:
    page = 'DCGM_FI_DEV_SM_CLOCK{gpu="0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3"} 1755\n'
    (error,) = read_once(exporter.serve(page)).errors
    assert "1 DCGM series but none with a GPU UUID label (UUID or uuid)" in error.message


def test_snapshot_of_a_page_without_dcgm_metrics_exits_1_with_the_line(
    exporter: ExporterServer, capsys: pytest.CaptureFixture[str]
) -> None:
    from otel_ofu import cli

    url = exporter.serve(NODE_EXPORTER_PAGE)
    assert cli.main(["snapshot", "--source", "dcgm-exporter", "--url", url]) == 1
    (line,) = capsys.readouterr().out.splitlines()
    assert "no dcgm-exporter metric on the page" in line


def test_run_says_once_that_the_page_has_no_dcgm_metrics(
    exporter: ExporterServer, caplog: pytest.LogCaptureFixture
) -> None:
    from otel_ofu.producer.loop import Producer

    producer = Producer(source=DcgmExporterSource(exporter.serve(NODE_EXPORTER_PAGE), clock=Ticks()), clock=Ticks())
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            producer.run_once()
    producer.source.close()
    said = [record.getMessage() for record in caplog.records if "no dcgm-exporter metric" in record.getMessage()]
    assert len(said) == 1  # once, not once per interval
