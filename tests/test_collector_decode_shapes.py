"""Reading a Resource's points through its layout's template takes exactly what reading them one by one takes.

Producer-layout requests (one Resource per GPU: gpu.ofu, the loss inputs with gpu.throttle per reason and the
gpu.energy sum, and metrics the collector only consumes) repeat over intervals, each GPU's report now and then
spoiled in a way that either keeps its layout (a value out of range, NaN, a zero throttle share, a time in the
future or missing, no start time, a start time of its own on one input, no hw.id on its Resource) or changes it (a
foreign metric, an attribute on a point, an unknown throttle reason, as_int instead of as_double, a second scope, a
metric twice, a histogram among the consumed metrics). Two real Decoders, one reading through templates and one
point by point, feed two real Aggregators; every request's outcome, the decoders' counts and every closed window
must be the same, and the templates must have been used.
"""

from __future__ import annotations

import math
import random

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.metrics.v1 import metrics_pb2

from otel_ofu import names
from otel_ofu.testing.otlp_requests import T0, RecordingSink, set_attribute
from otel_ofu_collector.aggregation.windows import Aggregator
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.otlp import roles, templates
from otel_ofu_collector.otlp.decode import Decoder
from otel_ofu_collector.results import WindowReport

S = 1_000_000_000
INTERVAL = 10 * S
CONFIG = AggregatorConfig(window_s=30.0, lateness_s=5.0)
GAUGES = (
    names.GPU_OFU.name,
    names.GPU_OFU_RAW.name,
    names.GPU_TENSOR_ACTIVE.name,
    names.GPU_CLOCK_SM.name,
    names.GPU_CLOCK_SM_MAX.name,
    names.GPU_FLOPS_ACHIEVED.name,
    names.GPU_POWER.name,
)
REASONS = sorted(names.ThrottleReason.ALL)[:3]
KEEPS_LAYOUT = (
    "ofu out of range",
    "nan",
    "zero share",
    "future",
    "no time",
    "no start",
    "own start",
    "inf input",
    "no hw.id",
)
CHANGES_LAYOUT = ("foreign", "attribute", "unknown reason", "as_int", "two scopes", "twice", "histogram")


def _report(rng: random.Random, gpu: int, interval: int, spoil: str | None) -> metrics_pb2.ResourceMetrics:
    rm = metrics_pb2.ResourceMetrics()
    for key, value in (
        (names.HOST_NAME, f"node-{gpu // 4}"),
        (names.HW_ID, f"GPU-{gpu}"),
        (names.HW_MODEL, "NVIDIA H100 80GB HBM3"),
        (names.JOB_ID, f"job-{gpu // 8}"),
    ):
        set_attribute(rm.resource.attributes, key, value)
    sm = rm.scope_metrics.add()
    sm.scope.name = names.INSTRUMENTATION_SCOPE
    end = T0 + (interval + 1) * INTERVAL
    start = end - INTERVAL

    def point(points: object, value: float) -> metrics_pb2.NumberDataPoint:
        p: metrics_pb2.NumberDataPoint = points.add(as_double=value, time_unix_nano=end)  # type: ignore[attr-defined]
        p.start_time_unix_nano = start
        return p

    for name in GAUGES:
        metric = sm.metrics.add(name=name)
        point(metric.gauge.data_points, rng.random() if name == names.GPU_OFU.name else 10 + 1000 * rng.random())
    throttle = sm.metrics.add(name=names.GPU_THROTTLE.name)
    for reason in REASONS:
        share = point(throttle.gauge.data_points, rng.choice((0.0, rng.random())))
        set_attribute(share.attributes, names.GPU_THROTTLE_REASON, reason)
    energy = sm.metrics.add(name=names.GPU_ENERGY.name)
    energy.sum.is_monotonic = True
    energy.sum.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
    energy_point = point(energy.sum.data_points, 1e6 + 3000.0 * interval + gpu)
    energy_point.start_time_unix_nano = T0 - 3600 * S  # the board's counter started long before
    metrics = sm.metrics
    ofu = metrics[0].gauge.data_points[0]
    tensor = metrics[2].gauge.data_points[0]
    if spoil == "no hw.id":  # its metrics in the usual layout: every point refused, read through the template
        kept = [kv for kv in rm.resource.attributes if kv.key != names.HW_ID]
        del rm.resource.attributes[:]
        rm.resource.attributes.extend(kept)
        tensor.as_double = rng.choice((0.5, 2.0))  # at times refused for its value first
    elif spoil == "ofu out of range":
        ofu.as_double = 1.5
    elif spoil == "nan":
        tensor.as_double = math.nan
    elif spoil == "inf input":
        tensor.as_double = math.inf
    elif spoil == "zero share":
        for share in throttle.gauge.data_points:
            share.as_double = 0.0
    elif spoil == "future":
        tensor.time_unix_nano = end + 3600 * S
    elif spoil == "no time":
        ofu.time_unix_nano = 0
    elif spoil == "no start":
        tensor.ClearField("start_time_unix_nano")
    elif spoil == "own start":
        tensor.start_time_unix_nano = start + S  # one input over another span than the rest
    elif spoil == "foreign":
        sm.metrics.add(name="app.requests").gauge.data_points.add(as_double=1.0, time_unix_nano=end)
    elif spoil == "attribute":
        set_attribute(tensor.attributes, names.JOB_ID, "job-elsewhere")
    elif spoil == "unknown reason":
        throttle.gauge.data_points[0].attributes[0].value.string_value = "cosmic_rays"
    elif spoil == "as_int":
        metrics[3].gauge.data_points[0].as_int = 1980
    elif spoil == "two scopes":
        other = rm.scope_metrics.add()
        other.scope.name = "another"
        point(other.metrics.add(name=names.GPU_CLOCK_SM_MAX.name).gauge.data_points, 1980.0)
    elif spoil == "twice":
        again = sm.metrics.add(name=names.GPU_TENSOR_ACTIVE.name)
        point(again.gauge.data_points, 0.25)
    elif spoil == "histogram":
        sm.metrics.add(name=names.GPU_SM_ACTIVE.name).histogram.data_points.add(count=3, time_unix_nano=end)
    return rm


def _requests(seed: int) -> list[tuple[int, bytes]]:
    """(interval, request bytes) in the order sent: 16 GPUs, 4 per request, 12 intervals, some reports spoiled."""
    rng = random.Random(seed)
    sent = []
    for interval in range(12):
        for first in range(0, 16, 4):
            request = ExportMetricsServiceRequest()
            for gpu in range(first, first + 4):
                spoil = None
                if interval > 1 and rng.random() < 0.3:
                    spoil = rng.choice(KEEPS_LAYOUT + CHANGES_LAYOUT)
                request.resource_metrics.append(_report(rng, gpu, interval, spoil))
            sent.append((interval, request.SerializeToString()))
    return sent


@pytest.mark.parametrize("seed", range(12))
def test_through_templates_and_point_by_point_take_the_same(seed: int) -> None:
    clock = [T0]
    ways: list[tuple[Decoder, Aggregator, list[WindowReport]]] = []
    # Through templates given the bytes alone (as the receivers give them), through templates given the parsed
    # request, and point by point.
    kinds = ((True, True), (True, False), (False, False))
    for shaped, _ in kinds:
        aggregator = Aggregator(CONFIG)
        decoder = Decoder(aggregator, read_through_shapes=shaped, clock=lambda: clock[0], max_future_ns=60 * S)
        ways.append((decoder, aggregator, []))
    outcomes: list[list[tuple[int, int, str, bytes | None]]] = [[], [], []]
    for interval, raw in _requests(seed):
        clock[0] = T0 + (interval + 1) * INTERVAL
        for (decoder, aggregator, reports), seen, (_, as_bytes) in zip(ways, outcomes, kinds, strict=True):
            if as_bytes:
                outcome = decoder.decode_bytes(raw)
            else:
                outcome = decoder.decode(ExportMetricsServiceRequest.FromString(raw), raw)
            seen.append((outcome.accepted, outcome.rejected, outcome.error_message, outcome.forward))
            reports.extend(aggregator.flush(clock[0]))
    for _, aggregator, reports in ways:
        reports.extend(aggregator.close_all())
    (as_sent, as_sent_aggregator, as_sent_reports) = ways[0]
    (through, through_aggregator, through_reports), (by_point, by_point_aggregator, by_point_reports) = ways[1:]
    assert outcomes[0] == outcomes[1] == outcomes[2]
    assert as_sent.stats == through.stats
    assert as_sent_aggregator.stats == through_aggregator.stats
    assert as_sent_reports == through_reports
    assert through.stats.rejected_by_reason == by_point.stats.rejected_by_reason
    assert through.stats.rejected > 0  # the spoiled reports were refused, in both ways alike
    assert through_aggregator.stats == by_point_aggregator.stats
    assert through_reports == by_point_reports
    assert through_reports
    # Of the 176 reports after each GPU's first, about 30% of those from the third interval on spoiled: the rest
    # (115-140 of them over these seeds) went through a template, a report in its usual layout after a spoiled
    # one among them; none did in the other way.
    assert through.stats.shaped_resources > 100
    assert by_point.stats.shaped_resources == 0


def test_a_template_reads_only_its_own_layout() -> None:
    rng = random.Random(1)
    first = _report(rng, 0, 0, None).scope_metrics[0].SerializeToString()
    later = _report(rng, 0, 5, None).scope_metrics[0].SerializeToString()
    scanned = templates.scan(first)
    assert scanned is not None
    assert [m.name for m in scanned][:2] == [names.GPU_OFU.name, names.GPU_OFU_RAW.name]
    ofu = scanned[0].points[0]
    assert ofu.time is not None
    assert ofu.value is not None
    assert ofu.start is not None
    template = templates.Template.of(first, [(ofu.time, "Q"), (ofu.value, "d")], [])
    assert template.read(first) is not None
    # Another interval changes the numbers the template skips over as bytes: not its layout.
    assert template.read(later) is None
    template = templates.Template.of(
        first,
        [(ofu.time, "Q"), (ofu.value, "d")],
        [(p.value, "d") for m in scanned[1:] for p in m.points if p.value is not None]
        + [(p.time, "Q") for m in scanned[1:] for p in m.points if p.time is not None]
        + [(p.start, "Q") for m in scanned for p in m.points if p.start is not None],
    )
    numbers = template.read(later)
    parsed = metrics_pb2.ScopeMetrics.FromString(later).metrics[0].gauge.data_points[0]
    assert numbers == (parsed.time_unix_nano, parsed.as_double)
    assert template.read(later[:-1]) is None  # another length
    assert template.read(later.replace(b"gpu.ofu.raw", b"gpu.ofu.rax")) is None  # a byte between the slots


def test_a_template_gives_the_numbers_it_reads_in_the_order_asked() -> None:
    """The slots a template reads come back in the order given to ``Template.of``, whatever their order in the bytes:
    straight from the unpack when it is theirs, reordered when not; the slots it skips are never among them, and
    both orders make one layout."""
    rng = random.Random(1)
    first = _report(rng, 0, 0, None).scope_metrics[0].SerializeToString()
    later = _report(rng, 0, 5, None).scope_metrics[0].SerializeToString()
    scanned = templates.scan(first)
    assert scanned is not None
    ofu, raw = scanned[0].points[0], scanned[1].points[0]
    assert ofu.start is not None
    assert ofu.time is not None
    assert ofu.value is not None
    assert raw.value is not None
    # Every number of the other metrics but gpu.ofu.raw's value: they change from one interval to the next.
    others = [(p.value, "d") for m in scanned[2:] for p in m.points if p.value is not None]
    others += [(p.time, "Q") for m in scanned[1:] for p in m.points if p.time is not None]
    others += [(p.start, "Q") for m in scanned[1:] for p in m.points if p.start is not None]
    skip = [*others, (raw.value, "d")]
    parsed = metrics_pb2.ScopeMetrics.FromString(later).metrics
    start, time, value = (
        parsed[0].gauge.data_points[0].start_time_unix_nano,
        parsed[0].gauge.data_points[0].time_unix_nano,
        parsed[0].gauge.data_points[0].as_double,
    )
    as_sent = templates.Template.of(first, [(ofu.start, "Q"), (ofu.time, "Q"), (ofu.value, "d")], skip)
    assert as_sent.read(later) == (start, time, value)
    backwards = templates.Template.of(first, [(ofu.value, "d"), (ofu.start, "Q"), (ofu.time, "Q")], skip)
    assert backwards.read(later) == (value, start, time)
    assert as_sent.layout == backwards.layout
    # gpu.ofu.raw's value read (its slot after gpu.ofu's time) and gpu.ofu's start and value skipped: two numbers.
    with_raw = templates.Template.of(
        first, [(raw.value, "d"), (ofu.time, "Q")], [*others, (ofu.start, "Q"), (ofu.value, "d")]
    )
    numbers = with_raw.read(later)
    assert numbers is not None
    assert numbers == (parsed[1].gauge.data_points[0].as_double, time)


@pytest.mark.parametrize(
    "data",
    [b"\xff", b"\x12\x05abc", b"\x12\x02\x0a\xff", b"\x0f", b"\x12\x03\x2a\x01\x0a"],
)
def test_unreadable_bytes_have_no_template(data: bytes) -> None:
    assert templates.scan(data) is None


def test_a_resource_without_hw_id_is_refused_through_its_layouts_template() -> None:
    """Refusing what can never be taken must cost no more than taking it (``benchmarks/bench_refusals.py``): a
    Resource without hw.id in a known layout is refused through the template, not walked point by point."""
    rng = random.Random(1)
    decoder = Decoder(Aggregator(CONFIG), clock=lambda: T0 + 3 * INTERVAL, max_future_ns=60 * S)
    learnt = ExportMetricsServiceRequest(resource_metrics=[_report(rng, 0, 0, None)])
    decoder.decode(learnt, learnt.SerializeToString())
    anonymous = _report(rng, 1, 1, None)
    kept = [kv for kv in anonymous.resource.attributes if kv.key != names.HW_ID]
    del anonymous.resource.attributes[:]
    anonymous.resource.attributes.extend(kept)
    request = ExportMetricsServiceRequest(resource_metrics=[anonymous])
    for _ in range(2):  # the Resource's first report, and one it sends again
        before = decoder.stats.shaped_resources
        outcome = decoder.decode(request, request.SerializeToString())
        assert decoder.stats.shaped_resources == before + 1
        # Every point of the collector's own metrics but those it only consumes (gpu.ofu.raw): 6 gauges, 3 shares
        # and the energy counter.
        points = 6 + len(REASONS) + 1
        assert (outcome.accepted, outcome.rejected) == (0, points)
        assert f"{len(REASONS)} {names.GPU_THROTTLE.name} without hw.id" in outcome.error_message
    # The fractions' random gauges (10 to 1010) are refused for their values first, as point by point.
    assert decoder.stats.rejected_by_reason[names.RejectReason.NO_IDENTITY] > 0
    assert decoder.stats.rejected_by_reason[names.RejectReason.OUT_OF_RANGE] > 0
    assert [name for name in GAUGES if roles.ROLES[name] == roles.CONSUMED] == [names.GPU_OFU_RAW.name]


@pytest.mark.parametrize("shaped", [True, False])
def test_a_step_in_a_gpus_layout_is_the_jobs_progress_either_way(shaped: bool) -> None:
    """A GPU's Resource that also carries its job's job.step (steps 5, 6, 7 over three intervals) gives the job those
    three steps, read through a template or point by point; never a loss input named job.step."""
    sink = RecordingSink()
    decoder = Decoder(sink, read_through_shapes=shaped)
    rng = random.Random(1)
    for interval in range(3):
        rm = _report(rng, 0, interval, None)
        end = T0 + (interval + 1) * INTERVAL
        step = rm.scope_metrics[0].metrics.add(name=names.JOB_STEP.name, unit="{step}")
        step.gauge.data_points.add(as_double=5.0 + interval, time_unix_nano=end)
        request = ExportMetricsServiceRequest()
        request.resource_metrics.append(rm)
        raw = request.SerializeToString()
        decoder.decode(ExportMetricsServiceRequest.FromString(raw), raw)
    assert [value for _job, value, _time in sink.steps] == [5.0, 6.0, 7.0]
    assert not [inputs for inputs in sink.inputs if names.JOB_STEP.name in inputs[3]]
