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

import operator
import struct
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

import attrs

from otel_ofu import bounds, names
from otel_ofu_collector.otlp import roles, templates
from otel_ofu_collector.otlp.rejections import Rejections, message
from otel_ofu_collector.otlp.resources import ResourceEntry
from otel_ofu_collector.otlp.sink import PointSink

R = names.RejectReason
_THROTTLE = names.GPU_THROTTLE.name
_INPUTS = "loss inputs"  # how refused loss inputs are named (they are taken per GPU interval, all together)
_NONE: Mapping[str, float] = MappingProxyType({})  # a part without gauges or shares: one empty mapping, never a new one
MAX_SHAPE_POINTS = 512


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
    cumulative: bool  # a sum (its start is its series'), not a gauge (its start is its interval's)


@attrs.frozen
class _Part:
    """The points of a layout that shared one (start, time) when the layout was learnt (the gauges of an interval,
    the counters of a series): where their starts and times are, and their fields and values, the OFU, gauge and
    throttle-share points apart, each read with one C-level getter."""

    cumulative: bool  # counters (their values go to the sink as such), not gauges
    start: int | None  # where its first point's start is (None: a point sent none)
    time: int  # where its first point's time is
    # The other points' starts and times, which must equal the first's (None: the part has one point).
    other_starts: Callable[[tuple[Any, ...]], tuple[Any, ...]] | None
    other_times: Callable[[tuple[Any, ...]], tuple[Any, ...]] | None
    size: int  # its points
    ofu: tuple[int, ...]  # where its OFU points' values are
    gauge_fields: tuple[str, ...]
    gauges: Callable[[tuple[Any, ...]], tuple[Any, ...]] | None
    share_fields: tuple[str, ...]
    shares: Callable[[tuple[Any, ...]], tuple[Any, ...]] | None
    inputs: int = attrs.field(init=False)  # the points of its one sink call (no field is twice in a layout)

    def __attrs_post_init__(self) -> None:
        inputs = len(self.gauge_fields) + (0 if self.cumulative else len(self.share_fields))
        object.__setattr__(self, "inputs", inputs)  # a frozen class's derived field, set once here


def _parts(plan: tuple[Planned, ...], learnt: tuple[Any, ...]) -> tuple[_Part, ...]:
    """The plan's points by kind (gauges over an interval, sums since their series began) and by the (start, time)
    they had in the report the layout was learnt from (a producer's first interval can start when its counters'
    series do: the kind keeps the two apart)."""
    by_part: dict[tuple[bool, Any, Any], list[Planned]] = {}
    for planned in plan:
        start = learnt[planned.start_index] if planned.start_index is not None else None
        by_part.setdefault((planned.cumulative, start, learnt[planned.time_index]), []).append(planned)
    return tuple(_part(cumulative, points) for (cumulative, _start, _time), points in by_part.items())


def _part(cumulative: bool, points: list[Planned]) -> _Part:
    """One part's points: where the first's start and time are and the others' (to check they are the same), its
    OFU points' values, and its gauges' and throttle shares' fields and values. A point sent without a start leaves
    the part none: its points then start at their time."""
    starts = [p.start_index for p in points if p.start_index is not None]
    every_start = len(starts) == len(points)
    gauges = [p for p in points if p.role != roles.OFU and not p.throttle]
    shares = [p for p in points if p.throttle]
    return _Part(
        cumulative,
        starts[0] if every_start else None,
        points[0].time_index,
        _getter(starts[1:]) if every_start else None,
        _getter([p.time_index for p in points[1:]]),
        len(points),
        tuple(p.value_index for p in points if p.role == roles.OFU),
        tuple(p.field for p in gauges),
        _getter([p.value_index for p in gauges]),
        tuple(p.field for p in shares),
        _getter([p.value_index for p in shares]),
    )


@attrs.frozen
class Shape:
    """A producer layout of ScopeMetrics, shared by every Resource that sends it: its template and its points; and
    for the part by part read of a report whose every value is in bounds and every part's points share their times
    (nearly all of them), each value's place and bounds and the points by part (``_parts``)."""

    template: templates.Template
    plan: tuple[Planned, ...]
    parts: tuple[_Part, ...]
    # (where its value is, its low, its high) per point: what ``in_bounds`` checks, in the plan's order.
    bounds: tuple[tuple[int, float, float], ...] = attrs.field(init=False)
    # (what refusing a metric's points for want of hw.id says, its points), in the plan's order: a Resource without a
    # GPU identity refuses them all in one call, its words made once per layout, not per report and metric.
    no_identity: tuple[tuple[str, int], ...] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        set_ = object.__setattr__  # a frozen class's derived fields, set once here
        set_(self, "bounds", tuple((p.value_index, p.low, p.high) for p in self.plan))
        counts: dict[str, int] = {}
        for planned in self.plan:
            counts[planned.metric] = counts.get(planned.metric, 0) + 1
        set_(self, "no_identity", tuple((message(metric, R.NO_IDENTITY), count) for metric, count in counts.items()))

    def in_bounds(self, numbers: tuple[Any, ...]) -> bool:
        """Whether every value a template read is in its metric's bounds (NaN is in none). A plain loop: for a
        layout's few points it costs less than two passes of ``map(operator.le)`` through ``all``."""
        for index, low, high in self.bounds:  # noqa: SIM110 - all() of a generator costs twice the loop
            if not low <= numbers[index] <= high:  # NaN fails both comparisons
                return False
        return True


def _getter(indices: list[int]) -> Callable[[tuple[Any, ...]], tuple[Any, ...]] | None:
    """A C-level getter of these positions as a tuple (itemgetter of one position gives the value alone); None for
    no positions."""
    if not indices:
        return None
    if len(indices) == 1:
        index = indices[0]
        return lambda numbers: (numbers[index],)
    return operator.itemgetter(*indices)


def shape_of(rm: Any, scope_bytes: bytes) -> Shape | None:
    """The shape of one ResourceMetrics' only ScopeMetrics (``scope_bytes`` its encoding as sent, ``rm`` the same
    parsed), when a template can read it: only gpu.ofu, loss inputs and consumed metrics, each a gauge or sum of
    as_double points with a time, no attributes but a gpu.throttle point's known reason, no field twice. The
    slots ``templates.scan`` finds are checked against the parsed points: a template never reads what the parse
    would read otherwise."""
    metrics = rm.scope_metrics[0].metrics
    # A producer's layout holds a few dozen points; one of thousands is no layout to learn (and not worth a scan).
    if _point_count(metrics) > MAX_SHAPE_POINTS:
        return None
    scanned = templates.scan(scope_bytes)
    if scanned is None or len(scanned) != len(metrics):
        return None
    layout = _Layout(scope_bytes)
    for slots, metric in zip(scanned, metrics, strict=True):
        if not layout.add(slots, metric):
            return None
    return layout.shape()


def _point_count(metrics: Any) -> int:
    """The data points of these metrics, of whatever kind."""
    points = 0
    for metric in metrics:
        kind = metric.WhichOneof("data")
        points += len(getattr(metric, kind).data_points) if kind is not None else 0
    return points


# The roles of metrics a template reads (a GPU's OFU and loss inputs, and the producer's metrics it only consumes):
# any other (a job's MFU or progress, an unmeasured interval, a role to come) goes point by point. And the kinds of
# metric it reads.
_TEMPLATED_ROLES = (roles.OFU, roles.INPUT, roles.CONSUMED)
_TEMPLATE_KINDS = ("gauge", "sum")


@attrs.define
class _Layout:
    """A shape as ``shape_of`` learns it from one encoding, metric by metric: the slots a template reads (in the
    plan's order) and skips, the plan, and the loss inputs' fields seen (one interval's field twice is no layout)."""

    data: bytes
    read: list[tuple[int, str]] = attrs.field(factory=list)
    skip: list[tuple[int, str]] = attrs.field(factory=list)
    plan: list[Planned] = attrs.field(factory=list)
    fields: set[str] = attrs.field(factory=set)

    def add(self, slots: templates.MetricSlots, metric: Any) -> bool:
        """Whether a metric's points can be read through a template (then they are in the layout): one the
        collector takes or consumes, a gauge or sum, whose slots are the parsed metric's."""
        name = metric.name
        role = roles.ROLES.get(name)
        kind = metric.WhichOneof("data")
        if slots.name != name or role not in _TEMPLATED_ROLES or kind not in _TEMPLATE_KINDS:
            return False
        points = getattr(metric, kind).data_points
        if len(points) != len(slots.points):
            return False
        if role == roles.CONSUMED:  # its numbers may change, unread
            for slot in slots.points:
                self.skip.extend(
                    (offset, code)
                    for offset, code in ((slot.start, "Q"), (slot.time, "Q"), (slot.value, "d"))
                    if offset is not None
                )
            return True
        return all(self._add_point(role, name, slot, point) for slot, point in zip(slots.points, points, strict=True))

    def _add_point(self, role: int, name: str, slot: templates.PointSlots, point: Any) -> bool:
        """Whether a point of gpu.ofu or a loss input can be read through a template (then it is planned): its
        slots read what the parse read, and its field is known and not yet in the layout."""
        time, value = slot.time, slot.value
        if time is None or value is None or not _reads_as_parsed(self.data, slot.start, time, value, point):
            return False
        field = _field_of(name, slot, point)
        if field is None:
            return False
        if role == roles.INPUT:
            if field in self.fields:
                return False  # one interval's field twice: the point-by-point grouping decides
            self.fields.add(field)
        start_index = None
        if slot.start is not None:
            start_index = len(self.read)
            self.read.append((slot.start, "Q"))
        self.read.append((time, "Q"))
        self.read.append((value, "d"))
        low, high = bounds.range_of(name)
        self.plan.append(
            Planned(
                role,
                field,
                name == _THROTTLE,
                start_index,
                len(self.read) - 2,
                len(self.read) - 1,
                low,
                high,
                name,
                name in roles.COUNTERS,
            )
        )
        return True

    def shape(self) -> Shape | None:
        """The shape learnt, when it plans a point and the template reads the encoding it was learnt from."""
        if not self.plan:
            return None
        template = templates.Template.of(self.data, self.read, self.skip)
        learnt = template.read(self.data)
        if learnt is None:
            return None
        plan = tuple(self.plan)
        return Shape(template, plan, _parts(plan, learnt))


def _reads_as_parsed(data: bytes, start: int | None, time: int, value: int, point: Any) -> bool:
    """Whether a point's slots in ``data`` hold what the parse read: its value, its time and its start (a start
    not sent is 0)."""
    return (
        templates.same_number(struct.unpack_from("<d", data, value)[0], point.as_double)
        and struct.unpack_from("<Q", data, time)[0] == point.time_unix_nano
        and (0 if start is None else struct.unpack_from("<Q", data, start)[0]) == point.start_time_unix_nano
    )


def _field_of(name: str, slot: templates.PointSlots, point: Any) -> str | None:
    """The field a point feeds: a keyed point's (``_keyed_field``), any other's its metric when it has no
    attributes; None when a template cannot read it."""
    if name in roles.KEYED:
        return _keyed_field(name, point.attributes)
    if slot.has_attributes or point.attributes:
        return None
    return name


def _keyed_field(name: str, attributes: Any) -> str | None:
    """The field a keyed point feeds when its one attribute is its key's, with a known value; None otherwise."""
    attribute, known = roles.KEYED[name]
    if len(attributes) != 1 or attributes[0].key != attribute:
        return None
    text: str = attributes[0].value.string_value
    if text not in known or attributes[0].value.WhichOneof("value") != "string_value":
        return None
    return roles.keyed_field(name, text)


def read_through(
    entry: ResourceEntry, shape: Shape, numbers: tuple[Any, ...], latest: int, sink: PointSink, rejections: Rejections
) -> int:
    """A Resource's points read through its shape into the sink; how many were taken (the rest refused, each
    with its reason). Loss inputs are grouped by their (start, end) as point by point (gpu.energy, a cumulative
    counter, starts when its series did, the gauges when their interval did).

    A report whose values are all in bounds and whose parts' points share their times, all due (nearly every
    one), goes part by part, each part's values into the sink at once; any other point by point, where each
    refusal has its reason.
    """
    if shape.in_bounds(numbers):
        taken = _by_part(entry, shape, numbers, latest, sink, rejections)
        if taken >= 0:
            return taken
    plan = shape.plan
    ofu: list[tuple[float, int, int]] = []
    groups: dict[tuple[int, int], _Inputs] = {}
    accepted = 0
    for role, field, throttle, start_index, time_index, value_index, low, high, metric, cumulative in plan:
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
        group = groups.get((start_ns, end_ns))
        if group is None:
            group = groups[(start_ns, end_ns)] = ({}, {}, {})
        (group[2] if cumulative else group[1] if throttle else group[0])[field] = value
    return accepted + _into_sink(entry, ofu, groups, sink, rejections)


def refuse_through(shape: Shape, numbers: tuple[Any, ...], rejections: Rejections) -> None:
    """A Resource without a GPU identity (no hw.id) read through a shape: every point refused, each for the first
    thing point by point finds wrong with it (its value's bounds, then its identity), at the cost of a template read
    rather than a walk of the Resource: a sender of what can never be taken costs no more than one that is taken.
    (Point by point a missing identity comes before the time, so no time is read here.)"""
    if shape.in_bounds(numbers):
        rejections.add_each(R.NO_IDENTITY, shape.no_identity)
        return
    for planned in shape.plan:
        value = numbers[planned.value_index]
        if not planned.low <= value <= planned.high:  # NaN fails both comparisons
            rejections.refuse(planned.metric, bounds.refusal(planned.metric, value) or R.OUT_OF_RANGE)
        else:
            rejections.refuse(planned.metric, R.NO_IDENTITY)


def _by_part(
    entry: ResourceEntry, shape: Shape, numbers: tuple[Any, ...], latest: int, sink: PointSink, rejections: Rejections
) -> int:
    """``read_through``'s part by part read: how many points were taken; -1, with nothing taken, where a part's points
    do not share their times or one is not due."""
    spans = _spans(shape.parts, numbers, latest)
    if spans is None:
        return -1
    identity, key, profile = entry.identity, entry.stream_key, entry.profile
    assert key is not None  # a shape is built only for a Resource with a stream key
    taken = 0
    # A part's values are made a mapping by C-level calls alone, without zip's strict check (its keyword argument
    # costs as much as the zip), the fields and their getter being as long by construction.
    for part, start_ns, end_ns in spans:
        for index in part.ofu:
            refused = sink.add_ofu(key, numbers[index], start_ns, end_ns, identity, profile)
            if refused is None:
                taken += 1
            else:
                rejections.refuse(names.GPU_OFU.name, refused)
        gauges, shares = part.gauges, part.shares
        if gauges is not None and part.cumulative:
            counters = dict(zip(part.gauge_fields, gauges(numbers)))  # noqa: B905 - as long by construction
            refused = sink.add_gpu_counters(key, start_ns, end_ns, identity, counters)
        elif gauges is not None or shares is not None:
            refused = sink.add_gpu_inputs(
                key,
                start_ns,
                end_ns,
                identity,
                dict(zip(part.gauge_fields, gauges(numbers))) if gauges is not None else _NONE,  # noqa: B905
                dict(zip(part.share_fields, shares(numbers))) if shares is not None else _NONE,  # noqa: B905
            )
        else:
            continue
        if refused is None:
            taken += part.inputs
        else:
            rejections.refuse(_INPUTS, refused, part.inputs)
    return taken


def _spans(parts: tuple[_Part, ...], numbers: tuple[Any, ...], latest: int) -> list[tuple[_Part, int, int]] | None:
    """Each part with its (start, end), when its points share them and are due (a part without a start starts at its
    end, as does a start of 0); None otherwise."""
    spans: list[tuple[_Part, int, int]] = []
    for part in parts:
        end_ns = numbers[part.time]
        if not end_ns or end_ns > latest:
            return None
        others = part.other_times
        if others is not None and others(numbers).count(end_ns) != part.size - 1:
            return None
        start_ns = end_ns
        if part.start is not None:
            start_ns = numbers[part.start]
            others = part.other_starts
            if others is not None and others(numbers).count(start_ns) != part.size - 1:
                return None
            start_ns = start_ns or end_ns
        spans.append((part, start_ns, end_ns))
    return spans


def _into_sink(
    entry: ResourceEntry,
    ofu: list[tuple[float, int, int]],
    groups: dict[tuple[int, int], _Inputs],
    sink: PointSink,
    rejections: Rejections,
) -> int:
    """A Resource's OFU points and grouped loss inputs into the sink; how many it took."""
    identity, key, profile = entry.identity, entry.stream_key, entry.profile
    assert key is not None  # a shape is built only for a Resource with a stream key
    accepted = 0
    for value, start_ns, end_ns in ofu:
        refused = sink.add_ofu(key, value, start_ns, end_ns, identity, profile)
        if refused is None:
            accepted += 1
        else:
            rejections.refuse(names.GPU_OFU.name, refused)
    for (start_ns, end_ns), (gauges, shares, counters) in groups.items():
        accepted += take_inputs(sink, key, start_ns, end_ns, identity, gauges, shares, counters, rejections)
    return accepted


# One GPU interval's loss inputs, as the sink takes them: gauges by metric, throttle shares by reason, counters by
# field (``roles.keyed_field``).
_Inputs = tuple[dict[str, float], dict[str, float], dict[str, float]]


def take_inputs(
    sink: PointSink,
    key: str,
    start_ns: int,
    end_ns: int,
    identity: Mapping[str, str],
    gauges: Mapping[str, float],
    shares: Mapping[str, float],
    counters: Mapping[str, float],
    rejections: Rejections,
) -> int:
    """One GPU interval's loss inputs into the sink (the gauges and shares in one call, the counters in another);
    how many points it took, the rest refused with its reason."""
    taken = 0
    if gauges or shares:
        count = len(gauges) + len(shares)
        refused = sink.add_gpu_inputs(key, start_ns, end_ns, identity, gauges, shares)
        if refused is None:
            taken += count
        else:
            rejections.refuse(_INPUTS, refused, count)
    if counters:
        refused = sink.add_gpu_counters(key, start_ns, end_ns, identity, counters)
        if refused is None:
            taken += len(counters)
        else:
            rejections.refuse(_INPUTS, refused, len(counters))
    return taken
