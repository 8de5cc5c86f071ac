"""A mixed NVIDIA + AMD fleet end to end: dcgm-exporter and AMD Device Metrics Exporter pages on loopback, scraped by
the real producers, their OTLP sent over real gRPC to the real collector service (127.0.0.1 port 0), one window
closed by hand. Every figure below is worked by hand from the pages."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse

from otel_ofu import names
from otel_ofu.clock import ManualClock
from otel_ofu.model import Source
from otel_ofu.producer.loop import Producer
from otel_ofu.sources.amd_exporter import AmdExporterSource
from otel_ofu.sources.dcgm_exporter import DcgmExporterSource
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.outputs.consumer import CallbackConsumer
from otel_ofu_collector.receivers.otlp_grpc import EXPORT_METHOD
from otel_ofu_collector.results import WindowReport
from otel_ofu_collector.service import CollectorService
from tests.collector_helpers import collector_options
from tests.exporter_server import ExporterServer, serving

S = 1_000_000_000
W0 = 1_700_000_040 * S  # a multiple of 60 s: windows are aligned to the epoch
H100 = "NVIDIA H100 80GB HBM3"
MI300X = "AMD Instinct MI300X OAM"

# (UUID, TPA, SM clock MHz, power W): two H100s of Slurm job "train-h100" (hpc_job, dcgm-exporter's job mapping).
H100S = (
    ("GPU-a1000000-0000-4000-8000-000000000001", 0.6, 1830, 700.0),
    ("GPU-a1000000-0000-4000-8000-000000000002", 0.4, 1830, 500.0),
)
# (UUID, MFMA %, GPU activity %, engine clock MHz, power W): three MI300X of Slurm job "train-mi300" (the AMD
# exporter's job_id label), one of them idle.
MI300XS = (
    ("b2000000-0000-1000-8000-000000000001", 80, 90, 2100, 650.0),
    ("b2000000-0000-1000-8000-000000000002", 50, 100, 1890, 600.0),
    ("b2000000-0000-1000-8000-000000000003", 0, 0, 132, 140.0),
)


def dcgm_page(step: int) -> str:
    lines = []
    for index, (uuid, tpa, clock, watts) in enumerate(H100S):
        labels = (
            f'gpu="{index}",UUID="{uuid}",pci_bus_id="00000000:{index + 0x19:02X}:00.0",device="nvidia{index}",'
            f'modelName="{H100}",hostname="nv-1",hpc_job="train-h100",DCGM_FI_DRIVER_VERSION="570.124.06"'
        )
        lines += [
            f"DCGM_FI_DEV_SM_CLOCK{{{labels}}} {clock}",
            f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{labels}}} {tpa:.6f}",
            f"DCGM_FI_DEV_POWER_USAGE{{{labels}}} {watts:.6f}",
            # mJ since boot, growing by 10 s of the power per scrape
            f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{labels}}} {1_000_000_000 + step * round(watts * 10_000)}",
        ]
    return "\n".join(lines) + "\n"


def amd_page(step: int) -> str:
    lines = []
    for index, (uuid, mfma, active, clock, watts) in enumerate(MI300XS):
        labels = (
            f'card_model="102-G30211-0C",card_series="{MI300X}",card_vendor="AMD",driver_version="6.12.12",'
            f'gpu_compute_partition_type="spx",gpu_id="{index}",gpu_memory_partition_type="nps1",gpu_partition_id="0",'
            f'gpu_uuid="{uuid}",hostname="amd-1",job_id="train-mi300",serial_number="69240900{index}",'
            'vbios_version="022.040.003.043.000001"'
        )
        lines += [
            f"gpu_prof_tensor_active_percent{{{labels}}} {mfma}",
            f"gpu_prof_gui_util_percent{{{labels}}} {active}",
            f'gpu_clock{{clock_index="0",clock_type="system",{labels}}} {clock}',
            f'gpu_max_clock{{clock_index="0",clock_type="system",{labels}}} 2100',
            f"gpu_power_usage{{{labels}}} {watts}",
            f"gpu_energy_consumed{{{labels}}} {5_000_000_000 + step * round(watts * 10_000_000)}",  # uJ
        ]
    return "\n".join(lines) + "\n"


@pytest.fixture
def exporters() -> Iterator[tuple[ExporterServer, ExporterServer]]:
    with serving() as nvidia, serving() as amd:
        yield nvidia, amd


def send(port: int, data: bytes) -> ExportMetricsServiceResponse:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(EXPORT_METHOD, None, None)
        return ExportMetricsServiceResponse.FromString(call(data, timeout=10))


def run_window(nvidia: ExporterServer, amd: ExporterServer) -> tuple[WindowReport, list[bytes]]:
    """Both producers scrape every 10 s through the window (W0, W0 + 60 s], each interval sent as it is read."""
    clock = ManualClock(start_ns=W0)
    sources: list[Source] = [
        DcgmExporterSource(nvidia.serve(dcgm_page(0)), clock=clock),
        AmdExporterSource(amd.serve(amd_page(0)), clock=clock),
    ]
    producers = [Producer(source=source, interval_s=10.0, clock=clock) for source in sources]
    seen: list[Sequence[WindowReport]] = []
    service = CollectorService(
        collector_options(None, aggregator=AggregatorConfig(window_s=60.0, lateness_s=10.0), grpc_listen="127.0.0.1:0"),
        environ={},
    )
    service.consumers.append(CallbackConsumer(seen.append))
    service.start()
    sent: list[bytes] = []
    try:
        for step in range(1, 7):
            clock.advance(10.0)
            nvidia.serve(dcgm_page(step))
            amd.serve(amd_page(step))
            for producer in producers:
                request = encode_metrics(producer.run_once()).SerializeToString()
                sent.append(request)
                response = send(service.ports["grpc"], request)
                assert response.partial_success.rejected_data_points == 0, response.partial_success.error_message
        service.flush(W0 + 70 * S)
    finally:
        service.stop(grace=2)
        for producer in producers:
            producer.close()
    ((report,),) = seen
    assert (report.start_ns, report.end_ns) == (W0, W0 + 60 * S)
    return report, sent


def test_a_mixed_fleet_gets_each_vendors_rows_right(exporters: tuple[ExporterServer, ExporterServer]) -> None:
    report, sent = run_window(*exporters)

    # Percentiles per model. H100 OFU (tensor clock 1830 MHz, the SM clock at it): 0.6 and 0.4.
    # MI300X OFU = MFMA x activity x engine clock / 2100 MHz: 0.8 x 0.9 = 0.72; 0.5 x 1.0 x 1890/2100 = 0.45; 0.
    groups = {group.attributes[names.HW_MODEL]: group for group in report.groups}
    assert set(groups) == {H100, MI300X}
    # GPU equivalents over the window: each GPU's first scrape marks its start (the SDK's encoder sends its gauges
    # without start times), as its energy counter's first reading does, so each reports 50 of the window's 60 s.
    assert groups[H100].gpus == pytest.approx(2 * 50 / 60)
    assert groups[H100].ofu_min == pytest.approx(0.4)
    assert groups[H100].ofu_max == pytest.approx(0.6)
    assert groups[MI300X].gpus == pytest.approx(3 * 50 / 60)
    assert groups[MI300X].ofu_min == 0.0
    assert groups[MI300X].ofu_max == pytest.approx(0.72)
    assert groups[MI300X].ofu_sum == pytest.approx(0.72 + 0.45)
    assert groups[MI300X].quantiles[0.5] == pytest.approx(0.45, rel=0.01)  # the middle GPU, to the histogram's 1 %

    jobs = {job.job_id: job for job in report.jobs}
    h100, mi300 = jobs["train-h100"], jobs["train-mi300"]
    assert h100.attributes[names.HW_MODEL] == H100
    assert mi300.attributes[names.HW_MODEL] == MI300X
    assert h100.ofu == pytest.approx(0.5)
    assert mi300.ofu == pytest.approx((0.72 + 0.45 + 0.0) / 3)  # 0.39

    # The loss split the AMD inputs allow (tensor activity, engine clock, its max): per GPU, idle = 1 - O where
    # T < 1 %, clock = T x (1 - f / f_ref) with f_ref the catalog's 2100 MHz, tensor the rest. GPU 1: clock 0,
    # tensor 0.28; GPU 2: r = 1890/2100 = 0.9, clock = 0.5 x 0.1 = 0.05, tensor 0.5; GPU 3: idle 1.
    # Job means: idle 1/3, clock 0.05/3 = 0.016667, tensor 1 - 0.39 - 0.333333 - 0.016667 = 0.26.
    assert mi300.loss is not None
    shares = mi300.loss.shares
    assert shares[names.OfuLossCause.IDLE] == pytest.approx(1 / 3)
    assert shares[names.OfuLossCause.CLOCK] == pytest.approx(0.05 / 3)
    assert shares[names.OfuLossCause.TENSOR] == pytest.approx(0.26)
    assert mi300.ofu is not None
    assert mi300.ofu + sum(shares.values()) == pytest.approx(1.0)
    # Its energy, from the exporter's counter (uJ): 5 deltas of 10 s after the first point, 650 + 600 + 140 W.
    assert mi300.loss.energy_j == pytest.approx(5 * 10 * (650 + 600 + 140), rel=1e-6)
    assert h100.loss is not None
    assert h100.loss.shares[names.OfuLossCause.CLOCK] == 0.0  # at the tensor clock: no clock loss
    assert h100.loss.energy_j == pytest.approx(5 * 10 * (700 + 500), rel=1e-6)

    # What the AMD inputs do not allow is absent, never 0: no throttle reasons were sent for the AMD GPUs, and no
    # FLOP/s (no precision is known for either job, so neither has a peak).
    amd_metrics = _producer_metrics(sent, names.HW_VENDOR_AMD)
    assert names.GPU_THROTTLE.name not in amd_metrics
    assert {names.GPU_OFU.name, names.GPU_POWER.name, names.GPU_ENERGY.name, names.GPU_CLOCK_SM_MAX.name} <= amd_metrics
    assert mi300.loss.flops_per_joule is None


def _producer_metrics(requests: list[bytes], vendor: str) -> set[str]:
    """The metric names the producers sent on the Resources of ``vendor``'s GPUs."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    found: set[str] = set()
    for data in requests:
        for resource_metrics in ExportMetricsServiceRequest.FromString(data).resource_metrics:
            attributes = {kv.key: kv.value.string_value for kv in resource_metrics.resource.attributes}
            if attributes.get(names.HW_VENDOR) == vendor:
                found |= {metric.name for scope in resource_metrics.scope_metrics for metric in scope.metrics}
    return found
