"""A producer layout's shape: a Resource's points read through a template, without walking protobuf objects.

Producers send their metrics in the same layout every interval, so once a layout's shape is known (a
``templates.Template`` and what each of its points is), a Resource whose bytes fit it is read with one ``struct``
call instead of a walk through a protobuf object per metric and point, which was most of the ingest time (about
1.5 us per metric to reach a value). A shape is built only after its slots match the real parse of the request
it came in, and is shared by every Resource that sends the layout.

A point through a shape is checked as it would be point by point, in the same order (its value's bounds, then
its time), and refused with the same reason and words, so that the two ways take the same points and answer the
same (``tests/test_collector_decode_shapes.py``); refusing a point through a shape costs what taking it does.
Only what a template cannot read (attributes on a point, a field twice in one interval, another layout) goes
point by point.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any, NamedTuple

import attrs

from otel_ofu import bounds, names
from otel_ofu_collector.otlp import roles, templates
from otel_ofu_collector.otlp.rejections import Rejections
from otel_ofu_collector.otlp.resources import ResourceEntry

if TYPE_CHECKING:
    from otel_ofu_collector.otlp.decode import PointSink

R = names.RejectReason
_THROTTLE = names.GPU_THROTTLE.name
_INPUTS = "loss inputs"  # how refused loss inputs are named (they are taken per GPU interval, all together)


class Planned(NamedTuple):
    """One point of a layout: its role, its field (the metric, or a keyed point's: ``roles.keyed_field``), whether
    it is a gpu.throttle share, where its start time, time and value are among the template's numbers (no start: None),
    the bounds of its value, and its metric's name."""

    role: int
    field: str
    throttle: bool
    start_index: int | None
    time_index: int
    value_index: int
    low: float
    high: float
    metric: str


@attrs.frozen
class Shape:
    """A producer layout of ScopeMetrics, shared by every Resource that sends it: its template and its points."""

    template: templates.Template
    plan: tuple[Planned, ...]


def shape_of(rm: Any, scope_bytes: bytes) -> Shape | None:
    """The shape of one ResourceMetrics' only ScopeMetrics (``scope_bytes`` its encoding as sent, ``rm`` the same
    parsed), when a template can read it: only gpu.ofu, loss inputs and consumed metrics, each a gauge or sum of
    as_double points with a time, no attributes but a gpu.throttle point's known reason, no field twice. The
    slots ``templates.scan`` finds are checked against the parsed points: a template never reads what the parse
    would read otherwise."""
    scanned = templates.scan(scope_bytes)
    metrics = rm.scope_metrics[0].metrics
    if scanned is None or len(scanned) != len(metrics):
        return None
    read: list[tuple[int, str]] = []
    skip: list[tuple[int, str]] = []
    plan: list[Planned] = []
    fields: set[str] = set()
    for slots, metric in zip(scanned, metrics, strict=True):
        name = metric.name
        role = roles.ROLES.get(name)
        kind = metric.WhichOneof("data")
        if slots.name != name or role is None or role == roles.MFU or kind not in ("gauge", "sum"):
            return None
        points = getattr(metric, kind).data_points
        if len(points) != len(slots.points):
            return None
        for slot, point in zip(slots.points, points, strict=True):
            if role == roles.CONSUMED:
                skip.extend(
                    (offset, code)
                    for offset, code in ((slot.start, "Q"), (slot.time, "Q"), (slot.value, "d"))
                    if offset is not None
                )
                continue
            if slot.time is None or slot.value is None:
                return None
            if not templates.same_number(struct.unpack_from("<d", scope_bytes, slot.value)[0], point.as_double):
                return None
            if struct.unpack_from("<Q", scope_bytes, slot.time)[0] != point.time_unix_nano:
                return None
            start = 0 if slot.start is None else struct.unpack_from("<Q", scope_bytes, slot.start)[0]
            if start != point.start_time_unix_nano:
                return None
            throttle = name == _THROTTLE
            field = name
            keyed = roles.KEYED.get(name)
            if keyed is not None:  # one attribute, its key's known value: the field it feeds
                attribute, known = keyed
                attributes = point.attributes
                if len(attributes) != 1 or attributes[0].key != attribute:
                    return None
                text = attributes[0].value.string_value
                if text not in known or attributes[0].value.WhichOneof("value") != "string_value":
                    return None
                field = roles.keyed_field(name, text)
            elif slot.has_attributes or point.attributes:
                return None
            if role == roles.INPUT:
                if field in fields:
                    return None  # one interval's field twice: the point-by-point grouping decides
                fields.add(field)
            start_index = None
            if slot.start is not None:
                start_index = len(read)
                read.append((slot.start, "Q"))
            read.append((slot.time, "Q"))
            read.append((slot.value, "d"))
            low, high = bounds.range_of(name)
            plan.append(Planned(role, field, throttle, start_index, len(read) - 2, len(read) - 1, low, high, name))
    if not plan:
        return None
    return Shape(templates.Template.of(scope_bytes, read, skip), tuple(plan))


def read_through(
    entry: ResourceEntry, plan: tuple[Planned, ...], numbers: tuple[Any, ...], latest: int, sink: PointSink,
    rejections: Rejections,
) -> int:  # fmt: skip
    """A Resource's points read through its shape into the sink; how many were taken (the rest refused, each
    with its reason). Loss inputs are grouped by their (start, end) as point by point (gpu.energy, a cumulative
    counter, starts when its series did, the gauges when their interval did)."""
    ofu: list[tuple[float, int, int]] = []
    groups: dict[tuple[int, int], tuple[dict[str, float], dict[str, float]]] = {}
    accepted = 0
    for role, field, throttle, start_index, time_index, value_index, low, high, metric in plan:
        value = numbers[value_index]
        if not low <= value <= high:  # NaN fails both comparisons
            rejections.refuse(metric, bounds.refusal(metric, value) or R.OUT_OF_RANGE)
            continue
        end_ns = numbers[time_index]
        if not end_ns or end_ns > latest:
            rejections.refuse(metric, R.BAD_TIME)
            continue
        start_ns = (numbers[start_index] if start_index is not None else 0) or end_ns
        if role == roles.OFU:
            ofu.append((value, start_ns, end_ns))
            continue
        if throttle and value == 0.0:
            # The windows average throttle shares over the GPU's OFU time, so a reason absent from an interval
            # reads as 0 for it: taken, nothing to add.
            accepted += 1
            continue
        group = groups.get((start_ns, end_ns))
        if group is None:
            group = groups[(start_ns, end_ns)] = ({}, {})
        (group[1] if throttle else group[0])[field] = value
    identity, key, profile = entry.identity, entry.stream_key, entry.profile
    assert key is not None  # a shape is built only for a Resource with a stream key
    for value, start_ns, end_ns in ofu:
        refused = sink.add_ofu(key, value, start_ns, end_ns, identity, profile)
        if refused is None:
            accepted += 1
        else:
            rejections.refuse(names.GPU_OFU.name, refused)
    for (start_ns, end_ns), (values, shares) in groups.items():
        count = len(values) + len(shares)
        refused = sink.add_gpu_inputs(key, start_ns, end_ns, identity, values, shares)
        if refused is None:
            accepted += count
        else:
            rejections.refuse(_INPUTS, refused, count)
    return accepted
