"""The decoder's resource cache keys Resources by their encoding read from the request's raw bytes.

Whatever the bytes look like (a Resource sent in two pieces, long Resources keyed by digest, a small cache
that keeps clearing), decoding with the raw bytes must give exactly what decoding without them gives.
"""

from __future__ import annotations

import random

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.metrics.v1 import metrics_pb2

from otel_ofu import names
from otel_ofu.testing.otlp_requests import T0, RecordingSink, set_attribute
from otel_ofu_collector.decode import Decoder, resource_encodings

S = 1_000_000_000
KEYS = (names.HOST_NAME, names.HW_ID, names.JOB_ID, names.HW_MODEL, names.GPU_PRECISION, "other.attr")


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        if not value:
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)


def _resource_metrics(rng: random.Random) -> bytes:
    rm = metrics_pb2.ResourceMetrics()
    for key in rng.sample(KEYS, rng.randint(1, len(KEYS))):
        set_attribute(rm.resource.attributes, key, rng.choice(["a", "b", "node-1", "H100", "bf16"]))
    if rng.random() < 0.3:  # long enough to be keyed by digest
        set_attribute(rm.resource.attributes, names.K8S_POD_NAME, "p" * 500)
    metric = rm.scope_metrics.add().metrics.add(name=rng.choice([names.GPU_OFU.name, names.JOB_MFU.name]))
    point = metric.gauge.data_points.add(as_double=rng.random(), time_unix_nano=T0 + rng.randint(0, 50) * S)
    point.start_time_unix_nano = point.time_unix_nano - 10 * S
    blob = rm.SerializeToString()
    if rng.random() < 0.2:  # the Resource again, in a second piece: the parser merges the two
        extra = metrics_pb2.ResourceMetrics()
        set_attribute(extra.resource.attributes, names.JOB_ID, rng.choice(["x", "y"]))
        blob += extra.SerializeToString()
    return blob


def _request(rng: random.Random) -> tuple[ExportMetricsServiceRequest, bytes]:
    raw = b"".join(b"\x0a" + _varint(len(blob)) + blob for blob in (_resource_metrics(rng) for _ in range(6)))
    return ExportMetricsServiceRequest.FromString(raw), raw


@pytest.mark.parametrize("seed", range(40))
def test_decoding_with_raw_bytes_equals_decoding_without(seed: int) -> None:
    rng = random.Random(seed)
    cache_size = rng.choice([2, 5, 262_144])
    with_raw, without_raw = RecordingSink(), RecordingSink()
    fast, slow = Decoder(with_raw), Decoder(without_raw)
    fast.resource_cache_size = slow.resource_cache_size = cache_size
    for _ in range(20):
        request, raw = _request(rng)
        outcome_fast = fast.decode(request, raw)
        outcome_slow = slow.decode(request, None)
        assert (outcome_fast.accepted, outcome_fast.rejected) == (outcome_slow.accepted, outcome_slow.rejected)
    assert with_raw.ofu == without_raw.ofu
    assert with_raw.mfu == without_raw.mfu


def test_a_resource_in_two_pieces_is_keyed_as_the_merged_resource() -> None:
    first = metrics_pb2.ResourceMetrics()
    set_attribute(first.resource.attributes, names.HW_ID, "GPU-1")
    second = metrics_pb2.ResourceMetrics()
    set_attribute(second.resource.attributes, names.JOB_ID, "job-9")
    blob = first.SerializeToString() + second.SerializeToString()
    raw = b"\x0a" + _varint(len(blob)) + blob
    request = ExportMetricsServiceRequest.FromString(raw)
    (encoding,) = resource_encodings(request, raw)
    assert encoding == request.resource_metrics[0].resource.SerializeToString()
