"""A request as received (``Decoder.decode_bytes``, what both receivers call): parsed only when a Resource needs it.

Worked by hand: two GPUs of one node report OFU 0.25 and 0.75 every 10 s in the producer's layout. The first
request teaches the decoder their Resources and layout, so it is parsed; the second is the same bytes but for its
numbers, so every Resource is read through the template and the request is never parsed, and the sink gets
exactly the two points the parsed request would give, with their times. Bytes that are not a request the parser
takes (a truncated body, a schema URL that is not UTF-8 between otherwise known bytes) are refused whole with
nothing taken, as the parse would refuse them; a GPU not seen before makes the request parsed and read in full.
"""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from otel_ofu.testing.otlp_requests import INTERVAL_NS, T0, RecordingSink, gpu_request
from otel_ofu_collector.otlp import resources
from otel_ofu_collector.otlp.decode import Decoder
from otel_ofu_collector.otlp.rejections import MalformedRequest


class _CountingRequest:
    """The request class the decoder parses with, counting its parses (the real parse each time)."""

    parses = 0

    @classmethod
    def FromString(cls, raw: bytes) -> ExportMetricsServiceRequest:  # noqa: N802 (protobuf's name)
        cls.parses += 1
        return ExportMetricsServiceRequest.FromString(raw)


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> type[_CountingRequest]:
    _CountingRequest.parses = 0
    monkeypatch.setattr(resources, "ExportMetricsServiceRequest", _CountingRequest)
    return _CountingRequest


def _node(interval: int, ofu: dict[str, float], schema_url: str = "") -> bytes:
    request = gpu_request(ofu, time_ns=T0 + interval * INTERVAL_NS)
    for rm in request.resource_metrics:
        rm.schema_url = schema_url
    return request.SerializeToString()


def _taught() -> tuple[Decoder, RecordingSink]:
    sink = RecordingSink()
    decoder = Decoder(sink)
    outcome = decoder.decode_bytes(_node(0, {"GPU-a": 0.5, "GPU-b": 0.5}, schema_url="Z"))
    assert (outcome.accepted, outcome.rejected) == (2, 0)
    sink.ofu.clear()
    return decoder, sink


def _points(sink: RecordingSink) -> list[tuple[Any, ...]]:
    return [(key, value, start, end) for key, value, start, end, _ in sink.ofu]


def test_a_producers_usual_request_is_read_without_a_parse(parses: type[_CountingRequest]) -> None:
    decoder, sink = _taught()
    parses.parses = 0
    raw = _node(1, {"GPU-a": 0.25, "GPU-b": 0.75}, schema_url="Z")
    outcome = decoder.decode_bytes(raw)
    assert parses.parses == 0
    assert (outcome.accepted, outcome.rejected, outcome.forward) == (2, 0, None)
    end = T0 + INTERVAL_NS
    keys = [key for key, *_ in sink.ofu]
    assert _points(sink) == [(keys[0], 0.25, end - INTERVAL_NS, end), (keys[1], 0.75, end - INTERVAL_NS, end)]
    # The same as the parsed request gives a decoder taught alike.
    parsed_decoder, parsed_sink = _taught()
    parsed_decoder.decode(ExportMetricsServiceRequest.FromString(raw), raw)
    assert parsed_sink.ofu == sink.ofu
    # Through a template: both now, and GPU-b in the first request already (through the layout GPU-a taught).
    assert decoder.stats.shaped_resources == 3


def test_bytes_the_parser_refuses_are_refused_whole_with_nothing_taken(parses: type[_CountingRequest]) -> None:
    decoder, sink = _taught()
    raw = _node(1, {"GPU-a": 0.25, "GPU-b": 0.75}, schema_url="Z")
    # ResourceMetrics.schema_url (field 3, length 1) of the second GPU made invalid UTF-8; every other byte is known.
    at = raw.rindex(b"\x1a\x01Z")
    not_utf8 = raw[:at] + b"\x1a\x01\xff" + raw[at + 3 :]
    with pytest.raises(DecodeError):
        ExportMetricsServiceRequest.FromString(not_utf8)
    for bad in (not_utf8, raw[:-3]):
        with pytest.raises(MalformedRequest, match=r"^malformed ExportMetricsServiceRequest: "):
            decoder.decode_bytes(bad)
    assert sink.ofu == []
    assert decoder.stats.accepted == 2  # the first request's only
    assert decoder.decode_bytes(raw).accepted == 2  # and the decoder goes on


def test_a_gpu_not_seen_before_makes_the_request_read_in_full(parses: type[_CountingRequest]) -> None:
    decoder, sink = _taught()
    parses.parses = 0
    outcome = decoder.decode_bytes(_node(1, {"GPU-a": 0.25, "GPU-b": 0.75, "GPU-c": 0.125}, schema_url="Z"))
    assert parses.parses == 1
    assert outcome.accepted == 3
    assert sorted(value for _, value, *_ in _points(sink)) == [0.125, 0.25, 0.75]


def test_forwarding_every_input_forwards_the_bytes_as_received(parses: type[_CountingRequest]) -> None:
    sink = RecordingSink()
    decoder = Decoder(sink, forward_inputs=True)
    decoder.decode_bytes(_node(0, {"GPU-a": 0.5}))
    raw = _node(1, {"GPU-a": 0.25})
    parses.parses = 0
    assert decoder.decode_bytes(raw).forward == raw
    assert parses.parses == 0
