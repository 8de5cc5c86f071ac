"""Where a ScopeMetrics' numbers sit in its bytes, so that the next interval's can be read without parsing.

A producer sends each GPU's Resource with the same metrics every interval: same names, units, attributes and
point layout; only the point values and times change. Those are fixed-width fields on the wire (``double``
and ``fixed64``), so two encodings of such a ScopeMetrics are the same bytes except in those 8-byte slots.
A ``Template`` records, from one encoding, where the slots are and every byte between them. Another encoding
of the same length whose in-between bytes are all equal is then, field for field, the same message with
other numbers in the slots (a tag, a length or a field of another kind would differ in between), and one
``struct`` call reads all its numbers: the per-point walk through protobuf objects, most of the decoder's
time, is skipped.

``scan`` finds the slots with a small wire-format reader; ``otlp.shapes.shape_of`` builds a template only
after checking what the scan found against the real parse of the same request (``same_number`` for each
value), and the decoder falls back to that parse whenever bytes differ or a value would be refused, so the
template never decides anything the parse would decide differently.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from operator import itemgetter
from typing import Any

import attrs

# OTLP field numbers (opentelemetry/proto/metrics/v1/metrics.proto).
_SCOPE_METRICS_METRICS = 2
_METRIC_NAME, _METRIC_GAUGE, _METRIC_SUM = 1, 5, 7
_DATA_POINTS = 1
_POINT_START, _POINT_TIME, _POINT_AS_DOUBLE, _POINT_ATTRIBUTES = 2, 3, 4, 7
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


@attrs.frozen
class PointSlots:
    """Offsets of one number data point's fixed-width fields in the ScopeMetrics' bytes (None: not sent)."""

    start: int | None
    time: int | None
    value: int | None  # as_double; a point sent as_int has no template
    has_attributes: bool


@attrs.frozen
class MetricSlots:
    name: str
    points: tuple[PointSlots, ...]


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]  # IndexError past the end: the caller treats it as unreadable
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def _fields(data: bytes, pos: int, end: int) -> list[tuple[int, int, int, int]]:
    """(field number, wire type, payload start, payload end) of each field in ``data[pos:end]``."""
    found = []
    while pos < end:
        tag, pos = _varint(data, pos)
        number, wire = tag >> 3, tag & 7
        if wire == _VARINT:
            _, after = _varint(data, pos)
        elif wire == _FIXED64:
            after = pos + 8
        elif wire == _LENGTH:
            length, pos = _varint(data, pos)
            after = pos + length
        elif wire == _FIXED32:
            after = pos + 4
        else:
            raise ValueError(f"wire type {wire}")
        if after > end:
            raise ValueError("field runs past its message")
        found.append((number, wire, pos, after))
        pos = after
    return found


def _point(data: bytes, pos: int, end: int) -> PointSlots | None:
    slots: dict[int, int] = {}
    attributes = False
    for number, wire, start, _ in _fields(data, pos, end):
        if number in (_POINT_START, _POINT_TIME, _POINT_AS_DOUBLE):
            if wire != _FIXED64 or number in slots:
                return None  # not the fixed-width field expected, or sent twice
            slots[number] = start
        elif number == _POINT_ATTRIBUTES:
            attributes = True
        elif wire == _FIXED64:
            return None  # another number (as_int): its slot would sit in the bytes compared
    return PointSlots(slots.get(_POINT_START), slots.get(_POINT_TIME), slots.get(_POINT_AS_DOUBLE), attributes)


def scan(data: bytes) -> list[MetricSlots] | None:
    """The metrics of one encoded ScopeMetrics with their gauge or sum points' slots; None when any metric is
    of another kind, or anything is unreadable."""
    try:
        metrics = []
        for number, wire, start, end in _fields(data, 0, len(data)):
            if number != _SCOPE_METRICS_METRICS or wire != _LENGTH:
                continue
            name: str | None = None
            points: list[PointSlots] = []
            kinds = 0
            for field, kind, begin, finish in _fields(data, start, end):
                if field == _METRIC_NAME and kind == _LENGTH:
                    name = data[begin:finish].decode()
                elif field in (_METRIC_GAUGE, _METRIC_SUM) and kind == _LENGTH:
                    kinds += 1
                    for inner, inner_kind, first, last in _fields(data, begin, finish):
                        if inner == _DATA_POINTS and inner_kind == _LENGTH:
                            point = _point(data, first, last)
                            if point is None:
                                return None
                            points.append(point)
                elif kind == _LENGTH and field not in (2, 3, 12):  # description, unit, metadata
                    return None  # a histogram, summary, ...: their numbers are not slots
            if name is None or kinds != 1:
                return None
            metrics.append(MetricSlots(name, tuple(points)))
        return metrics
    except (IndexError, ValueError, UnicodeDecodeError):
        return None


@attrs.frozen
class Template:
    """The slots of one ScopeMetrics encoding and the bytes between them (see the module's doc).

    The bytes between are compared as one integer: the encoding read as a little-endian number with its slots'
    bytes masked out must equal the template's, one C-level pass however many slots there are (a tuple of every
    gap's bytes, compared gap by gap, cost half as much again). The numbers read are then unpacked with the gaps,
    and the slots skipped, as pad bytes, so no gap is copied and no skipped number is made; in the order they were
    given to ``of`` straight from the unpack when that is their order in the encoding (as in a layout learnt from an
    encoder that writes fields in their numbers' order, as the OTLP encoders do)."""

    length: int
    mask: int  # 0xff at every byte between the slots, 0 in the slots
    between: int  # the encoding's bytes with its slots masked out: what the layout is compared by
    slots: struct.Struct  # the slots read, in offset order, the gaps and the skipped slots as pad bytes
    # itemgetter: the numbers of the slots read, in the order they were given to ``of``; None when that is their
    # offset order (the unpack's own)
    numbers_of: Any

    @classmethod
    def of(cls, data: bytes, read: Sequence[tuple[int, str]], skip: Sequence[tuple[int, str]] = ()) -> Template:
        """A template of ``data`` whose ``read`` slots ((offset, ``d`` or ``Q``) each, at least two) it reads, in
        that order; ``skip`` slots hold numbers that may change but are not read."""
        if len(read) < 2:
            raise ValueError("a template reads at least two slots")
        ordered = sorted(set(read))
        codes = ["<"]
        at = 0
        for offset, code in ordered:
            codes.append(f"{offset - at}x{code}")
            at = offset + 8
        mask = bytearray(b"\xff" * len(data))
        for offset, _ in {*read, *skip}:
            mask[offset : offset + 8] = bytes(8)
        position = {offset: i for i, (offset, _) in enumerate(ordered)}
        indices = [position[offset] for offset, _ in read]
        numbers_of = None if indices == list(range(len(ordered))) else itemgetter(*indices)
        as_int = int.from_bytes(mask, "little")
        between = int.from_bytes(data, "little") & as_int
        return cls(len(data), as_int, between, struct.Struct("".join(codes)), numbers_of)

    @property
    def layout(self) -> tuple[int, int, int]:
        """What two templates of one layout share: the same length and the same bytes between the same slots."""
        return self.length, self.mask, self.between

    def read(self, data: bytes) -> tuple[Any, ...] | None:
        """The numbers of ``data``'s read slots, in order, when it is this template's layout; else None."""
        if len(data) != self.length or int.from_bytes(data, "little") & self.mask != self.between:
            return None
        numbers: tuple[Any, ...] = self.slots.unpack_from(data)
        return numbers if self.numbers_of is None else self.numbers_of(numbers)


def same_number(read: float, parsed: float) -> bool:
    """Whether a slot read as ``read`` is the field the parser read as ``parsed`` (NaN is itself)."""
    return read == parsed or (math.isnan(read) and math.isnan(parsed))
