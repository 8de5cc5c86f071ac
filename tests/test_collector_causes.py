"""Why the tensor pipes sat idle: the 'tensor' loss split by what the engine and SMs were doing, worked by hand.

With tensor activity T, SM activity S and engine activity E (clamped so that T <= S <= E), a GPU's loss beyond
idle and clock is no_kernel = 1 - E, sm_idle = E - S and non_tensor = S - O - clock, so that OFU + the causes = 1;
a GPU without E and S keeps the coarse 'tensor' cause. Beside the split, a job's DRAM activity and NVLink/PCIe
throughput say what its SMs were busy with.
"""

from __future__ import annotations

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.metrics.v1 import metrics_pb2

from otel_ofu import names
from otel_ofu.testing.otlp_requests import set_attribute
from otel_ofu_collector.aggregation.windows import Aggregator
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.otlp.decode import Decoder
from otel_ofu_collector.results import FleetLoss, JobReport, WindowReport, gauge_points
from tests.collector_helpers import split_gpu

S_NS = 1_000_000_000
W = 60 * S_NS
T0 = 29_000_000 * W
H100 = "NVIDIA H100 80GB HBM3"  # tensor clock 1830 MHz: 1647 MHz is r = 0.9
C = names.OfuLossCause


def _identity(gpu: str, job: str = "j") -> dict[str, str]:
    return {
        names.HOST_NAME: "n",
        names.HW_ID: gpu,
        names.HW_MODEL: H100,
        names.GPU_PRECISION: "bf16",
        names.JOB_ID: job,
    }


def _window(agg: Aggregator, gpu: str, ofu: float, inputs: dict[str, float], job: str = "j", window: int = 0) -> None:
    """Six 10 s intervals covering the window, the same values each."""
    identity = _identity(gpu, job)
    for tick in range(6):
        start = T0 + window * W + tick * 10 * S_NS
        assert agg.add_ofu(f"n|{gpu}", ofu, start, start + 10 * S_NS, identity) is None
        assert agg.add_gpu_inputs(f"n|{gpu}", start, start + 10 * S_NS, identity, inputs, {}) is None


def _job(report: WindowReport, job_id: str = "j") -> JobReport:
    return next(job for job in report.jobs if job.job_id == job_id)


FINER = {  # T 0.4 at r 0.9, E 0.8, S 0.6, with OFU 0.3
    names.GPU_TENSOR_ACTIVE.name: 0.4,
    names.GPU_CLOCK_SM.name: 1.647e9,
    names.GPU_CLOCK_SM_MAX.name: 1.98e9,
    names.GPU_ENGINE_ACTIVE.name: 0.8,
    names.GPU_SM_ACTIVE.name: 0.6,
}


def test_one_gpu_split_by_hand() -> None:
    # clock = T x (1 - r) = 0.4 x 0.1 = 0.04 (within T - O = 0.1); no_kernel = 1 - E = 0.2; sm_idle = E - S = 0.2;
    # non_tensor = S - O - clock = 0.6 - 0.3 - 0.04 = 0.26; and 0.3 + 0.04 + 0.2 + 0.2 + 0.26 = 1.
    split = split_gpu(0.3, 0.4, 0.9, seconds=60.0, engine_active=0.8, sm_active=0.6)
    assert (split.idle, split.tensor) == (0.0, 0.0)
    assert split.clock == pytest.approx(0.04)
    assert split.no_kernel == pytest.approx(0.2)
    assert split.sm_idle == pytest.approx(0.2)
    assert split.non_tensor == pytest.approx(0.26)
    total = split.ofu + split.clock + split.no_kernel + split.sm_idle + split.non_tensor  # type: ignore[operator]
    assert total == pytest.approx(1.0, abs=1e-12)
    # Without E and S the same GPU keeps the coarse cause: 1 - 0.3 - 0.04 = 0.66.
    coarse = split_gpu(0.3, 0.4, 0.9, seconds=60.0)
    assert coarse.tensor == pytest.approx(0.66)
    assert coarse.no_kernel is None


def test_disordered_samples_are_clamped_into_order() -> None:
    # Sampling noise put S (0.45) below T (0.5) and E (0.4) below S: S and E are taken as 0.5. With O = 0.45 at full
    # clock: no_kernel 0.5, sm_idle 0, non_tensor = 0.5 - 0.45 - 0 = 0.05; nothing negative, the sum 1.
    split = split_gpu(0.45, 0.5, 1.0, seconds=1.0, engine_active=0.4, sm_active=0.45)
    assert split.no_kernel == pytest.approx(0.5)
    assert split.sm_idle == 0.0
    assert split.non_tensor == pytest.approx(0.05)
    assert split.ofu + split.no_kernel + split.sm_idle + split.non_tensor == pytest.approx(1.0, abs=1e-12)  # type: ignore[operator]
    # An idle GPU's whole loss is idle, whatever its engine did (a stray kernel).
    idle = split_gpu(0.002, 0.004, 0.5, seconds=1.0, engine_active=0.9, sm_active=0.1)
    assert (idle.idle, idle.no_kernel, idle.sm_idle, idle.non_tensor) == (0.998, 0.0, 0.0, 0.0)


def test_a_job_with_a_gpu_with_and_one_without_the_finer_inputs() -> None:
    agg = Aggregator(AggregatorConfig(lateness_s=0, price_per_gpu_hour={"default": 3.6}))
    _window(agg, "a", 0.3, FINER)
    _window(agg, "b", 0.5, {names.GPU_TENSOR_ACTIVE.name: 0.6, names.GPU_CLOCK_SM.name: 1.83e9})
    (report,) = agg.flush(T0 + W)
    job = _job(report)
    assert job.loss is not None
    assert job.ofu is not None
    # a: clock 0.04, no_kernel 0.2, sm_idle 0.2, non_tensor 0.26. b: r = 1, so clock 0 and tensor 1 - 0.5 = 0.5.
    # The job's means: OFU 0.4, clock 0.02, no_kernel 0.1, sm_idle 0.1, non_tensor 0.13, tensor 0.25.
    assert job.ofu == pytest.approx(0.4)
    expected = {C.IDLE: 0.0, C.CLOCK: 0.02, C.NO_KERNEL: 0.1, C.SM_IDLE: 0.1, C.NON_TENSOR: 0.13, C.TENSOR: 0.25}
    assert dict(job.loss.shares) == pytest.approx(expected)
    assert list(job.loss.shares) == [c for c in C.ALL if c != C.UNMEASURED]  # every split cause, in order
    assert job.ofu + sum(job.loss.shares.values()) == pytest.approx(1.0, abs=1e-12)
    # GPU-seconds lost: each GPU's share x 60 s, summed: clock 2.4, no_kernel 12, sm_idle 12, non_tensor 15.6,
    # tensor 30; at 0.001 per GPU-second, the cost lost is a thousandth of those.
    lost = {C.IDLE: 0.0, C.CLOCK: 2.4, C.NO_KERNEL: 12.0, C.SM_IDLE: 12.0, C.NON_TENSOR: 15.6, C.TENSOR: 30.0}
    assert dict(job.loss.lost_s) == pytest.approx(lost)
    assert job.loss.cost_lost is not None
    assert dict(job.loss.cost_lost) == pytest.approx({cause: value / 1000 for cause, value in lost.items()})
    assert dict(report.fleet.loss.lost_s) == pytest.approx(lost)


def test_a_job_whose_gpus_all_have_the_finer_inputs_has_no_coarse_cause() -> None:
    agg = Aggregator(AggregatorConfig(lateness_s=0))
    _window(agg, "a", 0.3, FINER)
    (report,) = agg.flush(T0 + W)
    job = _job(report)
    assert job.loss is not None
    assert job.ofu is not None
    assert C.TENSOR not in job.loss.shares
    assert job.ofu + sum(job.loss.shares.values()) == pytest.approx(1.0, abs=1e-12)
    assert job.loss.shares[C.NON_TENSOR] == pytest.approx(0.26)
    exported = {
        point.attributes[names.OFU_LOSS_CAUSE] for point in gauge_points(report) if point.spec == names.JOB_OFU_LOSS
    }
    assert exported == {C.IDLE, C.CLOCK, C.NO_KERNEL, C.SM_IDLE, C.NON_TENSOR}


def test_a_job_without_the_finer_inputs_keeps_the_three_causes() -> None:
    agg = Aggregator(AggregatorConfig(lateness_s=0))
    _window(agg, "b", 0.5, {names.GPU_TENSOR_ACTIVE.name: 0.6})
    (report,) = agg.flush(T0 + W)
    job = _job(report)
    assert job.loss is not None
    assert list(job.loss.shares) == [C.IDLE, C.CLOCK, C.TENSOR]
    assert (job.loss.dram_active, job.loss.nvlink_bytes_per_s, job.loss.pcie_bytes_per_s) == (None, None, None)


def test_dram_activity_and_link_throughput_beside_the_split() -> None:
    # GPU a: DRAM 71% busy; its NVLink counters send 3 GB and receive 3 GB every 10 s: 600 MB/s both ways together.
    # GPU b reports DRAM 29% and no link counters. The job: DRAM (0.71 + 0.29) / 2 = 0.5, NVLink 6e8 B/s over the
    # GPUs that report it (a alone). PCIe: neither reports it: absent.
    agg = Aggregator(AggregatorConfig(lateness_s=0))
    _window(agg, "a", 0.3, {**FINER, names.GPU_DRAM_ACTIVE.name: 0.71})
    _window(agg, "b", 0.5, {names.GPU_TENSOR_ACTIVE.name: 0.6, names.GPU_DRAM_ACTIVE.name: 0.29})
    identity = _identity("a")
    series = T0  # the producer started counting at the window's start: its first reading counts whole
    for tick in range(1, 7):
        counters = {f"{names.GPU_NVLINK_IO.name}|{d}": 3e9 * tick for d in names.IoDirection.ALL}
        assert agg.add_gpu_counters("n|a", series, T0 + tick * 10 * S_NS, identity, counters) is None
    (report,) = agg.flush(T0 + W)
    job = _job(report)
    assert job.loss is not None
    assert job.loss.dram_active == pytest.approx(0.5)
    assert job.loss.nvlink_bytes_per_s == pytest.approx(6e8)
    assert job.loss.pcie_bytes_per_s is None
    values = {point.spec.name: point.value for point in gauge_points(report) if point.spec.name.startswith("job.")}
    assert values[names.JOB_DRAM_ACTIVE.name] == pytest.approx(0.5)
    assert values[names.JOB_NVLINK_THROUGHPUT.name] == pytest.approx(6e8)
    assert names.JOB_PCIE_THROUGHPUT.name not in values


def test_a_link_counter_beyond_physics_is_refused() -> None:
    agg = Aggregator(AggregatorConfig(lateness_s=0))
    identity = _identity("a")
    field = f"{names.GPU_NVLINK_IO.name}|{names.IoDirection.TRANSMIT}"
    assert agg.add_gpu_counters("n|a", T0, T0 + 10 * S_NS, identity, {field: 1e9}) is None
    # 1e15 bytes in 10 s is 100 TB/s: ten times the bound of any GPU link.
    assert agg.add_gpu_counters("n|a", T0, T0 + 20 * S_NS, identity, {field: 1e15}) == "implausible"


def test_the_fleets_finer_causes_merge_across_shards_exactly() -> None:
    one = FleetLoss({C.NO_KERNEL: 12.0, C.TENSOR: 30.0}, 100.0, {C.NO_KERNEL: 0.012}, "USD")
    two = FleetLoss({C.NO_KERNEL: 3.0, C.SM_IDLE: 2.0}, None, {C.SM_IDLE: 0.002}, "USD")
    merged = one.merge(two)
    assert dict(merged.lost_s) == {C.NO_KERNEL: 15.0, C.TENSOR: 30.0, C.SM_IDLE: 2.0}
    assert merged.cost_lost == {C.NO_KERNEL: 0.012, C.SM_IDLE: 0.002}


def _request(end_ns: int, tx: float, rx: float) -> ExportMetricsServiceRequest:
    """One GPU's report in the producer's layout: OFU, tensor, engine and SM activity, NVLink counters by direction."""
    request = ExportMetricsServiceRequest()
    rm = request.resource_metrics.add()
    for key, value in _identity("a").items():
        set_attribute(rm.resource.attributes, key, value)
    metrics = rm.scope_metrics.add().metrics
    gauges: tuple[tuple[names.MetricSpec, float], ...] = (
        (names.GPU_OFU, 0.3),
        (names.GPU_TENSOR_ACTIVE, 0.4),
        (names.GPU_ENGINE_ACTIVE, 0.8),
        (names.GPU_SM_ACTIVE, 0.6),
    )
    for spec, gauge in gauges:
        metric = metrics.add(name=spec.name, unit=spec.unit)
        metric.gauge.data_points.add(as_double=gauge, start_time_unix_nano=end_ns - 10 * S_NS, time_unix_nano=end_ns)
    nvlink = metrics.add(name=names.GPU_NVLINK_IO.name, unit=names.GPU_NVLINK_IO.unit)
    nvlink.sum.is_monotonic = True
    nvlink.sum.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
    for direction, count in ((names.IoDirection.TRANSMIT, tx), (names.IoDirection.RECEIVE, rx)):
        point = nvlink.sum.data_points.add(as_double=count, start_time_unix_nano=T0, time_unix_nano=end_ns)
        set_attribute(point.attributes, names.NETWORK_IO_DIRECTION, direction)
    return request


@pytest.mark.parametrize("through_shapes", [True, False])
def test_link_counters_by_direction_through_the_decoder(through_shapes: bool) -> None:
    # Six reports, 1 GB sent and 2 GB received per 10 s: 3e8 B/s together, whether read through the layout's
    # template (from the second report on) or point by point; an unknown direction is refused by its attribute.
    agg = Aggregator(AggregatorConfig(lateness_s=0))
    decoder = Decoder(agg, read_through_shapes=through_shapes)
    for tick in range(1, 7):
        outcome = decoder.decode(_request(T0 + tick * 10 * S_NS, 1e9 * tick, 2e9 * tick))
        assert (outcome.accepted, outcome.rejected) == (6, 0)
    odd = _request(T0 + 55 * S_NS, 0.0, 0.0)
    nvlink = odd.resource_metrics[0].scope_metrics[0].metrics[4]
    nvlink.sum.data_points[0].attributes[0].value.string_value = "sideways"
    assert "gpu.nvlink.io without a known network.io.direction" in decoder.decode(odd).error_message
    (report,) = agg.flush(T0 + W)
    job = _job(report)
    assert job.loss is not None
    assert job.loss.nvlink_bytes_per_s == pytest.approx(3e8)
    assert job.loss.shares[C.NON_TENSOR] == pytest.approx(0.3)  # S - O with no clock reading: 0.6 - 0.3
    assert decoder.stats.shaped_resources == (5 if through_shapes else 0)
