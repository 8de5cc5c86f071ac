"""Prometheus recording rules that compute each GPU's OFU from dcgm-exporter's series, and the alert rules beside them:
for fleets that only want the number on the Prometheus that already scrapes dcgm-exporter (``otel-ofu
prometheus-rules`` prints them).

Per GPU (a tensor-activity series: a whole GPU, or a MIG instance), as the producer computes it
(``otel_ofu.gpu_values.compute``), with the catalog's clocks per model and no calibration:

    gpu_ofu     = TPA x min(f / f_ref, 1), f_ref the catalog's tensor clock for the model, else the board max
    gpu_ofu_raw = TPA x min(f / f_max, 1), f_max the device's own max SM clock where the page has it, else the
                  catalog's board max

A clock above the device's own max by more than ``ofu_math.MAX_CLOCK_TOLERANCE`` gives neither (a stale or wrong max);
tensor activity 0 is OFU 0 whatever the clocks. Both field-name generations are read (the SM clock in MHz or Hz, the
tensor activity by its old or its DCGM 4.6 tag), both spellings of the labels (``UUID``/``uuid``,
``Hostname``/``hostname``), and the values are held to the producer's physical bounds (a blank sentinel is no
reading). A MIG instance takes its GPU's clocks when it has none of its own.

The results carry the series' own labels plus the contract's identity as the producer's ``/metrics`` names it
(``hw_id``, ``hw_model``, ``host_name``), so the producer's dashboards read them. The models are matched as
``catalog.lookup`` matches them: the catalog's name patterns in its order, the first that matches winning (an ``or``
chain of one branch per model); a pattern Prometheus' RE2 cannot express (a look-around) is left out.

What the rules cannot give, and the producer and the collector path do: calibration per job (none here), the loss
split, energy and cost per job, attribution to jobs beyond the pod labels, cycle-counter OFU and the interval averages
of NVML/GPM clocks (dcgm-exporter's SM clock is a sample).
"""

from __future__ import annotations

from typing import Any, Final

from otel_ofu import bounds, catalog, names, ofu_math
from otel_ofu.prometheus_names import label_name, metric_name
from otel_ofu.sources import dcgm_exporter

# One group: Prometheus evaluates a group's rules in order, each seeing what the ones before it recorded at the same
# time, and groups apart from each other; alerts in a group of their own would read a scrape's series before their
# inputs were recorded (and, at a start, see every GPU without tensor activity for an evaluation).
GROUP: Final = "otel-ofu-dcgm-exporter"
GPU_IDLE_FOR: Final = "30m"
IDLE_OFU: Final = 0.01  # under 1% OFU is no tensor work (the collector's idle threshold)
FLEET_OFU_MEDIAN_LOW: Final = 0.25  # the collector's OfuFleetLow threshold (examples/alerts)
MISSING_FOR: Final = "15m"

# Recorded names. The outputs are the producer's own Prometheus names; the inputs they are made of are recorded under
# "dcgm:" names (level:metric:operations), one series per tensor-activity series, so that a GPU's OFU can be traced
# to the clocks it was taken against.
OFU: Final = metric_name(names.GPU_OFU.name, names.GPU_OFU.unit)
OFU_RAW: Final = metric_name(names.GPU_OFU_RAW.name, names.GPU_OFU_RAW.unit)
TENSOR_ACTIVE: Final = "dcgm:tensor_active:ratio"
SM_CLOCK: Final = "dcgm:sm_clock:hertz"
SM_CLOCK_MAX: Final = "dcgm:sm_clock_max:hertz"  # the device's own, where the page has it
CATALOG_SM_CLOCK_MAX: Final = "dcgm:catalog_sm_clock_max:hertz"
CATALOG_TENSOR_CLOCK: Final = "dcgm:catalog_tensor_clock:hertz"

HW_ID: Final = label_name(names.HW_ID)
HW_MODEL: Final = label_name(names.HW_MODEL)
HOST_NAME: Final = label_name(names.HOST_NAME)
MIG_ID: Final = dcgm_exporter.MIG_ID_LABEL
MHZ: Final = 1e6


def _metrics(*metric_names: str) -> str:
    """Any of dcgm-exporter's names for one field (``or``: a page prints one of them)."""
    return " or ".join(metric_names)


def _named(expression: str) -> str:
    """The series with the contract's identity labels added from whichever spelling the exporter printed."""
    for target, sources in (
        (HW_ID, dcgm_exporter.UUID_LABELS),
        (HW_MODEL, (dcgm_exporter.MODEL_LABEL,)),
        (HOST_NAME, dcgm_exporter.HOST_LABELS),
    ):
        for source in reversed(sources):  # the first spelling is applied last: it wins where a page has both
            expression = f'label_replace({expression}, "{target}", "$1", "{source}", "(.+)")'
    return expression


def _field_names(field_id: int) -> tuple[str, ...]:
    """Every dcgm-exporter metric name of a DCGM field, in the vocabulary's order."""
    return tuple(name for name, field in names.DCGM_EXPORTER_FIELDS.items() if field == field_id)


def _clock_hz(mhz_field: int, hz_field: int, matchers: str = "") -> str:
    """A clock in Hz from either generation (the old field in MHz, the DCGM 4.6 one in Hz), with the contract's
    identity labels, held to the physical bounds (a blank sentinel, or a value in the wrong unit, is no reading)."""
    hertz = " or ".join(f"{name}{matchers}" for name in _field_names(hz_field))
    megahertz = " or ".join(f"{name}{matchers} * {MHZ:.0f}" for name in _field_names(mhz_field))
    return f"{_named(f'(({hertz}) or ({megahertz}))')} >= {bounds.MIN_CLOCK_HZ:.0f} <= {bounds.MAX_CLOCK_HZ:.0f}"


def _on_gpus(mhz_field: int, hz_field: int) -> str:
    """A device-level clock on every tensor-activity series of its GPU: the MIG instance's own, else its GPU's (one
    value per GPU, so that pods sharing a GPU cannot make the match many-to-many)."""
    every = _clock_hz(mhz_field, hz_field)
    gpus = _clock_hz(mhz_field, hz_field, f'{{{MIG_ID}=""}}')  # whole GPUs and MIG parents, not instances
    own = f"0 * {TENSOR_ACTIVE} + on({HW_ID}, {MIG_ID}) group_left max by ({HW_ID}, {MIG_ID}) ({every})"
    parent = f"0 * {TENSOR_ACTIVE} + on({HW_ID}) group_left max by ({HW_ID}) ({gpus})"
    return f"({own})\nor ({parent})"


def _prometheus_pattern(pattern: str) -> str | None:
    """A catalog name pattern (Python, searched anywhere, case ignored) as a Prometheus matcher (RE2, anchored); None
    where RE2 has no way to say it."""
    if any(construct in pattern for construct in ("(?=", "(?!", "(?<")):
        return None
    return f"(?i).*(?:{pattern}).*"


def _per_model(clock: str) -> str:
    """A catalog clock (``tensor_clock_hz`` or ``boost_clock_hz``) on every tensor-activity series whose model the
    catalog knows it for: the first pattern that matches wins, as in ``catalog.lookup``."""
    branches = []
    for pattern, spec in catalog.name_patterns():
        hz = getattr(spec, clock)
        matcher = _prometheus_pattern(pattern)
        if matcher is not None:
            # A model without this clock still takes its place in the chain, so that no later pattern claims it.
            value = f"{hz:.0f}" if hz is not None else "NaN"
            escaped = matcher.replace("\\", "\\\\")
            branches.append(f'(0 * {TENSOR_ACTIVE}{{{HW_MODEL}=~"{escaped}"}} + {value})')
    return "(" + "\n  or ".join(branches) + ") >= 0"  # NaN compares false: a model without the clock has none


def recording_rules() -> list[dict[str, Any]]:
    tpa = _metrics(*_field_names(names.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE))
    reference = f"({CATALOG_TENSOR_CLOCK} or {SM_CLOCK_MAX} or {CATALOG_SM_CLOCK_MAX})"
    board = f"({SM_CLOCK_MAX} or {CATALOG_SM_CLOCK_MAX})"
    above_own_max = f"{SM_CLOCK} > {1 + ofu_math.MAX_CLOCK_TOLERANCE:g} * {SM_CLOCK_MAX}"
    return [
        {"record": TENSOR_ACTIVE, "expr": f"{_named(f'({tpa})')} >= 0 <= 1"},
        {"record": SM_CLOCK, "expr": _on_gpus(names.DCGM_FI_DEV_SM_CLOCK, names.DCGM_FI_DEV_SM_CLOCK_HERTZ)},
        {
            "record": SM_CLOCK_MAX,
            "expr": _on_gpus(names.DCGM_FI_DEV_MAX_SM_CLOCK, names.DCGM_FI_DEV_SM_MAX_CLOCK_HERTZ),
        },
        {"record": CATALOG_SM_CLOCK_MAX, "expr": _per_model("boost_clock_hz")},
        {"record": CATALOG_TENSOR_CLOCK, "expr": _per_model("tensor_clock_hz")},
        {
            "record": OFU,
            "expr": (
                f"({TENSOR_ACTIVE} * clamp_max({SM_CLOCK} / {reference}, 1) unless ({above_own_max}))"
                f"\nor ({TENSOR_ACTIVE} == 0)"
            ),
        },
        {
            "record": OFU_RAW,
            "expr": (
                f"({TENSOR_ACTIVE} * clamp_max({SM_CLOCK} / {board}, 1) unless ({above_own_max}))"
                f"\nor (({TENSOR_ACTIVE} == 0) and {board})"
            ),
        },
    ]


def _gpu(labels: str = "") -> str:
    return "{{ $labels." + HW_ID + " }} on {{ $labels." + HOST_NAME + " }}" + labels


def alert_rules() -> list[dict[str, Any]]:
    clock = _clock_hz(names.DCGM_FI_DEV_SM_CLOCK, names.DCGM_FI_DEV_SM_CLOCK_HERTZ)
    identity = f"{HW_ID}, {HW_MODEL}, {HOST_NAME}"
    return [
        {
            "alert": "OfuDcgmGpuIdle",
            "expr": f'{OFU}{{pod!=""}} < {IDLE_OFU:g}',
            "for": GPU_IDLE_FOR,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "GPU " + _gpu(" held by pod {{ $labels.namespace }}/{{ $labels.pod }} does no tensor work"),
                "description": f"Its OFU has stayed under {IDLE_OFU:.0%} for {GPU_IDLE_FOR} while a pod holds it: "
                "allocated but idle.",
            },
        },
        {
            "alert": "OfuDcgmFleetLow",
            "expr": f"quantile by ({HW_MODEL}) (0.5, {OFU}) < {FLEET_OFU_MEDIAN_LOW:g}",
            "for": "1h",
            "labels": {"severity": "info"},
            "annotations": {
                "summary": "Median OFU of the {{ $labels." + HW_MODEL + " }} GPUs is {{ $value | humanizePercentage }}",
                "description": f"Half of these GPUs have done less than {FLEET_OFU_MEDIAN_LOW:.0%} of their dense "
                "tensor peak for an hour.",
            },
        },
        {
            "alert": "OfuDcgmNoTensorActivity",
            "expr": f"max by ({identity}) ({clock}) unless on({HW_ID}) {TENSOR_ACTIVE}",
            "for": MISSING_FOR,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "GPU " + _gpu(" has no tensor activity on dcgm-exporter's page: no OFU"),
                "description": "dcgm-exporter prints its SM clock but not DCGM_FI_PROF_PIPE_TENSOR_ACTIVE (field "
                "1004): add it to the exporter's counters file (DCGM's profiling module must be able to read the "
                "GPU; otel-ofu doctor --source dcgm-exporter says what else is missing).",
            },
        },
        {
            "alert": "OfuDcgmNoOfu",
            "expr": f"{TENSOR_ACTIVE} unless {OFU}",
            "for": MISSING_FOR,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "GPU " + _gpu(" has tensor activity but no OFU"),
                "description": "The page has no SM clock for it (DCGM_FI_DEV_SM_CLOCK), its clock is above its own "
                "max, or its model ({{ $labels." + HW_MODEL + " }}) has no clock in otel-ofu's catalog and the page "
                "no max clock (add DCGM_FI_DEV_MAX_SM_CLOCK to the counters file).",
            },
        },
    ]


def rule_groups() -> dict[str, Any]:
    """The rules file: one group, the recording rules first, then the alerts that read what they record."""
    return {"groups": [{"name": GROUP, "rules": [*recording_rules(), *alert_rules()]}]}
