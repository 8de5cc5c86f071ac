"""The decoder's resource cache keys Resources by their encoding read from the request's raw bytes.

Checked against a reference decode written here: it reads every point's identity from the attributes
themselves, the data point's first and the Resource's second (as the collector does), with no cache and no
re-encoding. The same requests go through the real Decoder into a real Aggregator (raw bytes with a cache
that keeps clearing and one that never does, and no raw bytes) and through the reference into another
real Aggregator; flushed at the same times, all of them close exactly the same windows.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.metrics.v1 import metrics_pb2

from otel_ofu import bounds, names
from otel_ofu.testing.otlp_requests import T0, set_attribute
from otel_ofu_collector.aggregation.windows import Aggregator
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.otlp.decode import DEFAULT_MAX_MFU, Decoder, resource_views
from otel_ofu_collector.results import WindowReport
from tests.collector_helpers import add_gpu_input

S = 1_000_000_000
IDENTITY = frozenset(names.IDENTITY_ATTRIBUTES)
KEYS = (names.HOST_NAME, names.HW_ID, names.JOB_ID, names.HW_MODEL, names.GPU_PRECISION, "other.attr")
VALUES = ("a", "b", "node-1", "H100", "bf16")
CONFIG = AggregatorConfig(window_s=10.0, lateness_s=5.0)
REQUESTS = 20
# A cache that clears on nearly every new Resource, one that clears now and then, one that never does.
CACHE_SIZES = (1, 3, 262_144)


# --- the reference: identity read point by point -----------------------------------------------------------


def _identity_attributes(attributes: Iterable[Any]) -> dict[str, str]:
    """The identity attributes among ``attributes`` (strings here), a later copy of a key replacing an earlier."""
    return {kv.key: kv.value.string_value for kv in attributes if kv.key in IDENTITY and kv.value.string_value}


def _stream(identity: Mapping[str, str]) -> str | None:
    """One GPU (or MIG instance) on one host; None without hw.id."""
    hw_id = identity.get(names.HW_ID)
    if not hw_id:
        return None
    return f"{identity.get(names.HOST_NAME, '')}|{hw_id}|{identity.get(names.GPU_MIG_INSTANCE_ID, '')}"


def _value(point: Any) -> float:
    return float(point.as_int) if point.WhichOneof("value") == "as_int" else float(point.as_double)


@attrs.define
class ReferenceDecoder:
    """Every gpu.ofu, gpu.clock.sm and job.mfu point into ``sink``, its identity the data point's attributes over its
    Resource's (parsed, so a Resource sent in pieces is already one)."""

    sink: Aggregator
    accepted: int = 0
    rejected: int = 0

    def decode(self, request: ExportMetricsServiceRequest) -> None:
        for rm in request.resource_metrics:
            resource = _identity_attributes(rm.resource.attributes)
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    for point in metric.gauge.data_points:
                        identity = {**resource, **_identity_attributes(point.attributes)}
                        if metric.name == names.GPU_OFU.name:
                            taken = self._ofu(point, identity)
                        elif metric.name == names.JOB_MFU.name:
                            taken = self._mfu(point, identity)
                        elif metric.name == names.GPU_CLOCK_SM.name:
                            taken = self._gpu_input(metric.name, point, identity)
                        else:
                            continue
                        if taken:
                            self.accepted += 1
                        else:
                            self.rejected += 1

    def _ofu(self, point: Any, identity: dict[str, str]) -> bool:
        value, key, end_ns = _value(point), _stream(identity), point.time_unix_nano
        if not 0.0 <= value <= 1.0 or key is None or not end_ns:
            return False
        return self.sink.add_ofu(key, value, point.start_time_unix_nano or end_ns, end_ns, identity) is None

    def _gpu_input(self, name: str, point: Any, identity: dict[str, str]) -> bool:
        value, key, end_ns = _value(point), _stream(identity), point.time_unix_nano
        low, high = bounds.range_of(name)  # what a GPU can report: a clock between 1 MHz and 10 GHz
        if not low <= value <= high or key is None or not end_ns:
            return False
        return (
            add_gpu_input(self.sink, key, name, value, point.start_time_unix_nano or end_ns, end_ns, identity) is None
        )

    def _mfu(self, point: Any, identity: dict[str, str]) -> bool:
        value, job_id, time_ns = _value(point), identity.get(names.JOB_ID), point.time_unix_nano
        if not 0.0 <= value <= DEFAULT_MAX_MFU or not job_id or not time_ns:
            return False
        return self.sink.add_mfu(job_id, value, time_ns, identity) is None


# --- requests: a few Resources sent again and again, some in pieces, some long, some overridden per point ---


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        if not value:
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)


def _resource(rng: random.Random) -> metrics_pb2.ResourceMetrics:
    rm = metrics_pb2.ResourceMetrics()
    for key in rng.sample(KEYS, rng.randint(1, len(KEYS))):
        set_attribute(rm.resource.attributes, key, rng.choice(VALUES))
    if rng.random() < 0.3:  # long enough to be keyed by digest, in two values within the attribute length bound
        set_attribute(rm.resource.attributes, names.K8S_POD_NAME, "p" * 250)
        set_attribute(rm.resource.attributes, names.K8S_POD_UID, "u" * 250)
    if rng.random() < 0.2:
        set_attribute(rm.resource.attributes, names.GPU_MIG_INSTANCE_ID, rng.choice(["1", "2"]))
    return rm


def _resource_metrics(rng: random.Random, pool: list[metrics_pb2.ResourceMetrics]) -> bytes:
    # Mostly a Resource seen before (what the cache is for), now and then a new one.
    rm = metrics_pb2.ResourceMetrics()
    rm.CopyFrom(rng.choice(pool) if rng.random() < 0.8 else _resource(rng))
    for _ in range(rng.randint(1, 3)):
        name = rng.choice([names.GPU_OFU.name, names.JOB_MFU.name, names.GPU_CLOCK_SM.name])
        metric = rm.scope_metrics.add().metrics.add(name=name)
        for _ in range(rng.randint(1, 3)):
            time_ns = T0 + rng.randint(0, 50) * S
            point = metric.gauge.data_points.add(time_unix_nano=time_ns, start_time_unix_nano=time_ns - 10 * S)
            if rng.random() < 0.1:
                point.as_int = rng.choice([0, 1, 2, 1_410_000_000])
            elif name == names.GPU_CLOCK_SM.name:  # in Hz: a clock, one in MHz (refused as implausible), junk
                point.as_double = rng.choice([rng.random() * 2e9, rng.random() * 2000, 2e10])
            else:
                point.as_double = rng.choice([rng.random(), rng.random() * 2, 1.5 * DEFAULT_MAX_MFU])
            if rng.random() < 0.2:  # the data point's identity overrides its Resource's
                set_attribute(point.attributes, rng.choice([names.JOB_ID, names.HW_ID]), rng.choice(VALUES))
    blob = rm.SerializeToString()
    if rng.random() < 0.2:  # the Resource again, in a second piece: the parser merges the two
        extra = metrics_pb2.ResourceMetrics()
        set_attribute(extra.resource.attributes, names.JOB_ID, rng.choice(["x", "y"]))
        blob += extra.SerializeToString()
    return blob


def _request(rng: random.Random, pool: list[metrics_pb2.ResourceMetrics]) -> tuple[ExportMetricsServiceRequest, bytes]:
    blobs = (_resource_metrics(rng, pool) for _ in range(rng.randint(1, 6)))
    raw = b"".join(b"\x0a" + _varint(len(blob)) + blob for blob in blobs)
    return ExportMetricsServiceRequest.FromString(raw), raw


# --- the comparison -------------------------------------------------------------------------------------------


@attrs.define
class Decoded:
    """One way of decoding, into its own real Aggregator, and what it said."""

    aggregator: Aggregator
    reports: list[WindowReport] = attrs.field(factory=list)
    accepted: int = 0
    rejected: int = 0


@pytest.mark.parametrize("seed", range(40))
def test_every_cache_size_closes_the_windows_a_point_by_point_decode_closes(seed: int) -> None:
    rng = random.Random(seed)
    pool = [_resource(rng) for _ in range(8)]
    reference = Decoded(Aggregator(CONFIG))
    reference_decoder = ReferenceDecoder(reference.aggregator)
    ways: dict[str, tuple[Decoded, Decoder, bool]] = {}
    for size in CACHE_SIZES:
        decoded = Decoded(Aggregator(CONFIG))
        ways[f"raw bytes, cache {size}"] = (decoded, Decoder(decoded.aggregator, resource_cache_size=size), True)
    serialised = Decoded(Aggregator(CONFIG))
    ways["no raw bytes"] = (serialised, Decoder(serialised.aggregator), False)
    for step in range(REQUESTS):
        request, raw = _request(rng, pool)
        reference_decoder.decode(request)
        for decoded, decoder, with_raw in ways.values():
            outcome = decoder.decode(request, raw if with_raw else None)
            decoded.accepted += outcome.accepted
            decoded.rejected += outcome.rejected
        # Windows close while points still arrive, so some of the later ones are late: in every way alike.
        now = T0 + (step + 1) * 3 * S
        reference.reports += reference.aggregator.flush(now)
        for decoded, _, _ in ways.values():
            decoded.reports += decoded.aggregator.flush(now)
    reference.reports += reference.aggregator.close_all()
    (reference.accepted, reference.rejected) = (reference_decoder.accepted, reference_decoder.rejected)
    # The test compares something: windows closed, points taken and points refused.
    assert reference.reports
    assert reference.accepted
    assert reference.rejected
    for way, (decoded, _, _) in ways.items():
        decoded.reports += decoded.aggregator.close_all()
        assert (decoded.accepted, decoded.rejected) == (reference.accepted, reference.rejected), way
        assert decoded.aggregator.stats == reference.aggregator.stats, way
        assert decoded.reports == reference.reports, way


def test_a_resource_in_two_pieces_is_keyed_as_the_merged_resource() -> None:
    first = metrics_pb2.ResourceMetrics()
    set_attribute(first.resource.attributes, names.HW_ID, "GPU-1")
    second = metrics_pb2.ResourceMetrics()
    set_attribute(second.resource.attributes, names.JOB_ID, "job-9")
    blob = first.SerializeToString() + second.SerializeToString()
    raw = b"\x0a" + _varint(len(blob)) + blob
    request = ExportMetricsServiceRequest.FromString(raw)
    (view,) = resource_views(request, raw)
    assert view.resource == request.resource_metrics[0].resource.SerializeToString()
