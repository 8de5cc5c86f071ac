"""Alerts as code: Prometheus rules, Datadog monitors and Honeycomb triggers for otel-ofu, from the vocabulary.

Every metric and attribute name comes from ``otel_ofu.names`` (and, for Prometheus, the naming rule of
``otel_ofu.prometheus_names`` that the collector's ``/metrics`` endpoint follows), so a renamed metric
changes the generated files and the test comparing them with the committed copies fails until they are
regenerated:

    python examples/alerts/generate.py          # rewrite the committed files
    python examples/alerts/generate.py --check  # exit 1 if they are stale

``prometheus-rules.test.yaml`` holds promtool unit tests of the rules over synthetic series: each alert
once where it must fire and once where it must not (a flag at 0, a flag that is absent, a condition
that did not last long enough), some with series that go stale as Prometheus records the collector's
endpoint (``shown_by_the_endpoint``): producers that stop, a throttle reason that alternates, one-off
bursts of rejected points.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import yaml

from otel_ofu import names
from otel_ofu.commands.prometheus_rules import rules_yaml
from otel_ofu.generated_files import write_or_check
from otel_ofu.prometheus_names import label_name, metric_name

HERE = Path(__file__).resolve().parent
JSON = dict[str, Any]

# --- Thresholds: one place, used by all three backends -------------------------------------------------

COLLECTOR_SCRAPE_JOB = "otel-ofu-collector"  # the Prometheus job scraping the collector's --prometheus-port
FLEET_OFU_MEDIAN_LOW = 0.25  # a GPU model's median OFU below this for an hour is worth a look
LOST_COST_PER_HOUR = 100.0  # in the currency the collector's prices are given in
REJECTED_SHARE = 0.01  # more than 1% of the points sent to the collector rejected
SECONDS_PER_HOUR = 3600


@attrs.frozen
class Alert:
    """One alert of the set: its name and meaning, shared by the three backends."""

    name: str
    severity: str  # "critical" pages; "warning" and "info" go to a ticket or a channel
    title: str  # plain words, for Datadog and Honeycomb
    summary: str  # Prometheus template ({{ $labels.x }})
    description: str  # plain words; Prometheus may append a template after them


def _lbl(key: str) -> str:
    return "{{ $labels." + label_name(key) + " }}"


JOB = _lbl(names.JOB_ID)
STRAGGLER_GPU = (names.HOST_NAME, names.HW_ID, names.JOB_ID)  # what names a straggler GPU in a query


def _throttle_now() -> str:
    """The straggler's throttle reasons of the moment, as a query in the alert's template: the reason is not a
    label of the alert (a GPU whose dominant reason alternates power/thermal is one straggler all along)."""
    reason = label_name(names.GPU_THROTTLE_REASON)
    matchers = ",".join(f"{label_name(key)}=%q" for key in STRAGGLER_GPU)
    selector = f'{metric_name(names.GPU_STRAGGLER.name)}{{{matchers},{reason}!=\\"\\"}}'
    arguments = " ".join(f"$labels.{label_name(key)}" for key in STRAGGLER_GPU)
    return (
        f'{{{{ range query (printf "max by ({reason}) ({selector} == 1)" {arguments}) }}}}'
        f" Its clock is held down: {{{{ .Labels.{reason} }}}}.{{{{ end }}}}"
    )


_THROTTLE_NOW = _throttle_now()
ALERTS: tuple[Alert, ...] = (
    Alert(
        "OfuFlopsMiscount",
        "info",
        "Job reports more FLOPs than its GPUs execute",
        f"Job {JOB} reports more FLOPs than its GPUs execute",
        "The MFU the training framework reports exceeds the job's measured OFU by more than the collector's "
        "--miscount-ratio for --miscount-windows windows in a row: its FLOP count is likely wrong (MoE routing "
        "counted as dense, recomputation counted twice, the wrong peak). Its MFU is not a utilization figure.",
    ),
    Alert(
        "OfuRegression",
        "warning",
        "Job runs below its own OFU baseline",
        f"Job {JOB} runs below its own OFU baseline",
        "The job's OFU fell below its own baseline by more than the collector's --regression-factor: the same "
        "job now does less tensor work per GPU-second (a data-loader stall, a slower kernel, a lost fused path).",
    ),
    Alert(
        "OfuStragglerGpu",
        "warning",
        "GPU straggles behind its job",
        f"GPU {_lbl(names.HW_ID)} on {_lbl(names.HOST_NAME)} straggles in job {JOB}",
        "The GPU's OFU stays below its job's median by more than the collector's --straggler-factor; in a "
        "synchronous job every other GPU waits for it." + _THROTTLE_NOW,
    ),
    Alert(
        "OfuIdleGpus",
        "warning",
        "Job holds GPUs that do no tensor work",
        f"Job {JOB} holds {{{{ $value }}}} GPUs that do no tensor work",
        "GPUs attributed to the job showed no tensor activity for the collector's --idle-windows windows: "
        "allocated and paid for, but idle.",
    ),
    Alert(
        "OfuJobHang",
        "critical",
        "Job is hung: its GPUs run kernels and nothing moves",
        f"Job {JOB} is hung: its GPUs run kernels and nothing moves",
        "Every GPU of the job has run kernels with no tensor, memory or link traffic for the collector's "
        "--hang-windows windows (a collective that never completes, a deadlock): it holds its GPUs and makes no "
        "progress. Its time counts as hang badput; restart it from its last checkpoint (the collector's flag events "
        "can trigger that).",
    ),
    Alert(
        "OfuFleetLow",
        "info",
        "Median OFU of a GPU model is low",
        f"Median OFU of {_lbl(names.HW_MODEL)} GPUs is low",
        f"The fleet's median OFU for this GPU model stayed under {FLEET_OFU_MEDIAN_LOW:.0%} for an hour.",
    ),
    Alert(
        "OfuHighLostCost",
        "warning",
        "Job loses too much money to lost OFU",
        f'Job {JOB} loses {{{{ $value | printf "%.0f" }}}} per hour to idle, clock or tensor loss',
        f"The cost of the job's lost GPU-time (its 1 - OFU, priced per GPU-hour) exceeds {LOST_COST_PER_HOUR:g} "
        "per hour; the dashboards split it by cause.",
    ),
    Alert(
        "OfuCollectorDown",
        "critical",
        "otel-ofu collector is down",
        "otel-ofu collector {{ $labels.instance }} is down",
        "Prometheus cannot scrape the collector: no fleet OFU, no flags, no alerts from it.",
    ),
    Alert(
        "OfuCollectorNoWindows",
        "warning",
        "otel-ofu collector closes no windows with GPUs",
        "otel-ofu collector {{ $labels.instance }} closes no windows with GPUs",
        "The collector is up but no GPU reported in its latest windows: producers cannot reach it, or send elsewhere.",
    ),
    Alert(
        "OfuCollectorRejectingPoints",
        "warning",
        "otel-ofu collector rejects points",
        "otel-ofu collector {{ $labels.instance }} rejects {{ $value | humanizePercentage }} of the points",
        "Points the collector cannot use (non-finite, out of range, no GPU identity) are rejected and reported "
        "in partial_success; a producer or pipeline is sending bad data.",
    ),
    Alert(
        "OfuCollectorDroppingData",
        "warning",
        "otel-ofu collector dropped data",
        "otel-ofu collector {{ $labels.instance }} dropped data ({{ $labels.reason }})",
        "Requests beyond the export queue or spool bound were dropped: the downstream is down or too slow.",
    ),
    Alert(
        "OfuCollectorOverloaded",
        "warning",
        "otel-ofu collector refuses requests for overload",
        "otel-ofu collector {{ $labels.instance }} refuses requests for overload",
        "The collector answers UNAVAILABLE to shed load; producers retry, but a lasting overload needs more "
        "replicas (shard by job.id).",
    ),
)
BY_NAME: Mapping[str, Alert] = {alert.name: alert for alert in ALERTS}


# --- Prometheus: the names the collector's /metrics endpoint exposes -----------------------------------
# Outputs by name alone (dots -> underscores, no unit suffix); self-metric sums as counters with _total.
# Each window's sums show as gauges holding that window's value.


def _prom(spec: names.MetricSpec) -> str:
    return metric_name(spec.name)


def _prom_counter(spec: names.MetricSpec) -> str:
    return f"{metric_name(spec.name)}_total"


def _prometheus_exprs() -> dict[str, tuple[str, str | None]]:
    """Alert name -> (PromQL, for)."""
    job = label_name(names.JOB_ID)
    per_collector = "job, instance"
    # Over the last 15 minutes, with no `for`: every reason's counter starts at 0, so a one-off burst of rejected
    # points shows in rate() and fires at once, for as long as it is in the range (a lasting share keeps it up).
    rejected = f"sum by ({per_collector}) (rate({_prom_counter(names.COLLECTOR_POINTS_REJECTED)}[15m]))"
    accepted = f"sum by ({per_collector}) (rate({_prom_counter(names.COLLECTOR_POINTS_ACCEPTED)}[15m]))"
    # Cost lost per second = cost lost / GPU-seconds x GPUs: needs no window length.
    cost_per_hour = (
        f"sum by ({job}) ({_prom(names.JOB_COST_LOST)}) / sum by ({job}) ({_prom(names.JOB_GPU_TIME)})"
        f" * sum by ({job}) ({_prom(names.JOB_GPUS)}) * {SECONDS_PER_HOUR}"
    )
    up = f'up{{job="{COLLECTOR_SCRAPE_JOB}"}}'
    return {
        # Flags are 1 or 0, absent when they cannot be assessed: == 1 fires on neither 0 nor absence.
        "OfuFlopsMiscount": (f"{_prom(names.JOB_FLOPS_MISCOUNT)} == 1", "15m"),
        "OfuRegression": (f"{_prom(names.JOB_OFU_REGRESSION)} == 1", "10m"),
        # Without the throttle reason: a straggler whose dominant reason alternates is one series that holds `for`.
        "OfuStragglerGpu": (
            f"max without ({label_name(names.GPU_THROTTLE_REASON)}) ({_prom(names.GPU_STRAGGLER)}) == 1",
            "15m",
        ),
        "OfuIdleGpus": (f"{_prom(names.JOB_GPUS_IDLE)} > 0", "30m"),
        # The flag has waited its windows already: 5 minutes more only rides out a scrape or two.
        "OfuJobHang": (f"{_prom(names.JOB_HANG)} == 1", "5m"),
        "OfuFleetLow": (
            f'{_prom(names.FLEET_OFU_QUANTILE)}{{{names.PROMETHEUS_QUANTILE_LABEL}="0.5"}} < {FLEET_OFU_MEDIAN_LOW}',
            "1h",
        ),
        "OfuHighLostCost": (f"{cost_per_hour} > {LOST_COST_PER_HOUR:g}", "30m"),
        "OfuCollectorDown": (f"{up} == 0", "5m"),
        "OfuCollectorNoWindows": (
            f"{up} == 1 unless on ({per_collector}) {_prom(names.FLEET_GPUS)}",
            "15m",
        ),
        "OfuCollectorRejectingPoints": (f"{rejected} / ({accepted} + {rejected}) > {REJECTED_SHARE:g}", None),
        "OfuCollectorDroppingData": (
            f"sum by ({per_collector}, reason) (increase({_prom_counter(names.COLLECTOR_DROPPED)}[10m])) > 0",
            None,
        ),
        "OfuCollectorOverloaded": (
            f'sum by ({per_collector}) (rate({_prom_counter(names.COLLECTOR_REQUESTS_REFUSED)}{{reason="overload"}}'
            "[5m])) > 0",
            "10m",
        ),
    }


COLLECTOR_ALERTS = frozenset(name for name in BY_NAME if name.startswith("OfuCollector"))


def prometheus_rules() -> JSON:
    exprs = _prometheus_exprs()

    def rule(alert: Alert) -> JSON:
        expr, duration = exprs[alert.name]
        body: JSON = {"alert": alert.name, "expr": expr}
        if duration is not None:
            body["for"] = duration
        body["labels"] = {"severity": alert.severity}
        body["annotations"] = {"summary": alert.summary, "description": alert.description}
        return body

    return {
        "groups": [
            {"name": "otel-ofu-jobs", "rules": [rule(a) for a in ALERTS if a.name not in COLLECTOR_ALERTS]},
            {"name": "otel-ofu-collector", "rules": [rule(a) for a in ALERTS if a.name in COLLECTOR_ALERTS]},
        ]
    }


# --- promtool unit tests over synthetic series ----------------------------------------------------------


def _series(name: str, labels: Mapping[str, str], values: str) -> JSON:
    rendered = ",".join(f'{key}="{value}"' for key, value in labels.items())
    return {"series": f"{name}{{{rendered}}}", "values": values}


STALE = "stale"  # a staleness marker: what Prometheus records at the first scrape without a series it had
Minute = float | str | None  # a sample, STALE, or None: no sample


def promtool_values(minutes: Sequence[Minute]) -> str:
    """promtool's expanding notation of one sample a minute: ``a xN`` is N + 1 samples of a, ``_xN`` N gaps."""
    runs: list[str] = []
    index = 0
    while index < len(minutes):
        value = minutes[index]
        end = index
        while end + 1 < len(minutes) and minutes[end + 1] == value and value != STALE:
            end += 1
        count = end - index + 1
        if value is None:
            runs.append("_" if count == 1 else f"_x{count}")
        elif value == STALE:
            runs.append(STALE)
        else:
            runs.append(f"{value:g}" if count == 1 else f"{value:g}x{count - 1}")
        index = end + 1
    return " ".join(runs)


def shown_by_the_endpoint(windows: Sequence[float | None], expiration_windows: int = 2) -> list[Minute]:
    """What Prometheus scraping every minute records of one series whose value in each 1-minute window is given
    (None: not in that window): the collector's endpoint shows the series while it was in one of the last
    ``expiration_windows`` windows, at its latest value, and Prometheus marks it stale at the first scrape
    without it."""
    recorded: list[Minute] = []
    latest: float | None = None
    for minute, value in enumerate(windows):
        latest = value if value is not None else latest
        recent = windows[max(0, minute - expiration_windows + 1) : minute + 1]
        if any(seen is not None for seen in recent):
            recorded.append(latest)
        elif recorded and recorded[-1] is not None and recorded[-1] != STALE:
            recorded.append(STALE)
        else:
            recorded.append(None)
    return recorded


def _case(alert: str, eval_time: str, *expected: tuple[Mapping[str, str], Mapping[str, str]]) -> JSON:
    return {
        "eval_time": eval_time,
        "alertname": alert,
        "exp_alerts": [
            {"exp_labels": {**labels, "severity": BY_NAME[alert].severity}, "exp_annotations": dict(annotations)}
            for labels, annotations in expected
        ],
    }


def _annotations(alert: str, summary: str, description: str | None = None) -> dict[str, str]:
    return {"summary": summary, "description": BY_NAME[alert].description if description is None else description}


def prometheus_rule_tests() -> JSON:
    job, job_name, host, hw_id, model, precision, reason, cause = (
        label_name(key)
        for key in (
            names.JOB_ID,
            names.JOB_NAME,
            names.HOST_NAME,
            names.HW_ID,
            names.HW_MODEL,
            names.GPU_PRECISION,
            names.GPU_THROTTLE_REASON,
            names.OFU_LOSS_CAUSE,
        )
    )
    h100 = "NVIDIA H100 80GB HBM3"
    moe = {job: "moe-7", job_name: "moe-pretrain", model: h100, precision: "bf16"}
    dense = {job: "dense-1", job_name: "dense-pretrain", model: h100, precision: "bf16"}
    scrape = {"job": COLLECTOR_SCRAPE_JOB, "instance": "collector-0:9465"}
    scrape_b = {"job": COLLECTOR_SCRAPE_JOB, "instance": "collector-1:9465"}

    def flag_test(alert: str, spec: names.MetricSpec, duration_min: int, summary_of: str) -> JSON:
        # fires on the job flagged throughout; not on a 0, not on an absent flag (dense-2 reports no MFU),
        # not on a flag that cleared once within the duration
        flapping = {job: "moe-8", job_name: "moe-finetune", model: h100, precision: "bf16"}
        span = duration_min + 10
        return {
            "interval": "1m",
            "input_series": [
                _series(_prom(spec), moe, f"1x{span}"),
                _series(_prom(spec), dense, f"0x{span}"),
                _series(_prom(spec), flapping, f"1x{span - 6} 0 1x6"),
                _series(_prom(names.JOB_OFU), {**dense, job: "dense-2"}, f"0.4x{span}"),
            ],
            "alert_rule_test": [
                _case(alert, f"{duration_min - 5}m"),  # true, but not for long enough yet
                _case(alert, f"{span}m", (moe, _annotations(alert, summary_of.format(job="moe-7")))),
            ],
        }

    straggler = {host: "node-3", hw_id: "GPU-3", job: "dense-1", model: h100}
    throttled = {host: "node-4", hw_id: "GPU-9", job: "dense-1", model: h100}
    alternating = {host: "node-6", hw_id: "GPU-17", job: "dense-1", model: h100}
    cleared = {host: "node-5", hw_id: "GPU-12", job: "dense-1", model: h100}
    straggler_text = BY_NAME["OfuStragglerGpu"].description.split("{{")[0]
    # GPU-17's dominant throttle reason alternates every 3 windows: power in windows 0-2, thermal in 3-5, ...
    # Each reason's series is on the endpoint 3 windows and held 1 more, then stale: never 15 minutes in a row.
    minutes = 31
    dominant = ["power" if (minute // 3) % 2 == 0 else "thermal" for minute in range(minutes)]
    alternating_series = [
        _series(
            _prom(names.GPU_STRAGGLER),
            {**alternating, reason: name},
            promtool_values(shown_by_the_endpoint([1.0 if now == name else None for now in dominant])),
        )
        for name in ("power", "thermal")
    ]
    # GPU-12 cleared after 6 windows: its one 0 is shown 2 windows, then the series goes stale.
    cleared_values = promtool_values(shown_by_the_endpoint([1.0] * 5 + [0.0] + [None] * (minutes - 6)))

    idle_collector = {**scrape, "instance": "idle:9465"}

    def producers_stop(value: float) -> str:
        """A series in every window up to minute 30 and in none of the 29 after, as Prometheus records it."""
        return promtool_values(shown_by_the_endpoint([value] * 31 + [None] * 29))

    def rejected_series(labels: Mapping[str, str], given: Mapping[str, str], others: str) -> list[JSON]:
        """The collector's rejected-points counter of every reason (each starts at 0): ``given`` by reason,
        the others ``others``."""
        counter = _prom_counter(names.COLLECTOR_POINTS_REJECTED)
        return [
            _series(counter, {**labels, "reason": code}, given.get(code, others)) for code in names.RejectReason.ALL
        ]

    def straggler_summary(labels: Mapping[str, str]) -> str:
        return f"GPU {labels[hw_id]} on {labels[host]} straggles in job {labels[job]}"

    def cost_series(labels: Mapping[str, str], gpus: int, lost: Mapping[str, float]) -> list[JSON]:
        window_s = 60
        found = [_series(_prom(names.JOB_GPUS), labels, f"{gpus}x60")]
        found.append(_series(_prom(names.JOB_GPU_TIME), labels, f"{gpus * window_s}x60"))
        for loss_cause, value in lost.items():
            found.append(_series(_prom(names.JOB_COST_LOST), {**labels, cause: loss_cause}, f"{value:g}x60"))
        return found

    # 8 GPUs x 60 s per window: cost lost per window x 60 is the cost lost per hour.
    expensive = {job: "moe-7", job_name: "moe-pretrain"}
    cheap = {job: "dense-1", job_name: "dense-pretrain"}
    unpriced = {job: "dense-2", job_name: "dense-eval"}
    return {
        "rule_files": ["prometheus-rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            flag_test(
                "OfuFlopsMiscount",
                names.JOB_FLOPS_MISCOUNT,
                15,
                "Job {job} reports more FLOPs than its GPUs execute",
            ),
            flag_test("OfuRegression", names.JOB_OFU_REGRESSION, 10, "Job {job} runs below its own OFU baseline"),
            flag_test("OfuJobHang", names.JOB_HANG, 5, "Job {job} is hung: its GPUs run kernels and nothing moves"),
            {
                "interval": "1m",
                "input_series": [
                    _series(_prom(names.GPU_STRAGGLER), straggler, "1x30"),
                    _series(_prom(names.GPU_STRAGGLER), {**throttled, reason: "thermal"}, "1x30"),
                    *alternating_series,
                    _series(_prom(names.GPU_STRAGGLER), cleared, cleared_values),
                ],
                "alert_rule_test": [
                    _case("OfuStragglerGpu", "10m"),
                    _case(
                        "OfuStragglerGpu",
                        "20m",  # window 20 is in GPU-17's power phase (windows 18-20; thermal went stale at 19)
                        (straggler, _annotations("OfuStragglerGpu", straggler_summary(straggler), straggler_text)),
                        (
                            throttled,
                            _annotations(
                                "OfuStragglerGpu",
                                straggler_summary(throttled),
                                f"{straggler_text} Its clock is held down: thermal.",
                            ),
                        ),
                        (
                            alternating,
                            _annotations(
                                "OfuStragglerGpu",
                                straggler_summary(alternating),
                                f"{straggler_text} Its clock is held down: power.",
                            ),
                        ),
                    ),
                ],
            },
            {
                "interval": "1m",
                "input_series": [
                    _series(_prom(names.JOB_GPUS_IDLE), {job: "idle-3"}, "2x50"),
                    _series(_prom(names.JOB_GPUS_IDLE), {job: "dense-1"}, "0x50"),
                    _series(_prom(names.JOB_GPUS_IDLE), {job: "short-4"}, "1x10 0x40"),
                ],
                "alert_rule_test": [
                    _case("OfuIdleGpus", "20m"),
                    _case(
                        "OfuIdleGpus",
                        "40m",
                        (
                            {job: "idle-3"},
                            _annotations("OfuIdleGpus", "Job idle-3 holds 2 GPUs that do no tensor work"),
                        ),
                    ),
                ],
            },
            {
                "interval": "1m",
                "input_series": [
                    _series(
                        _prom(names.FLEET_OFU_QUANTILE),
                        {names.PROMETHEUS_QUANTILE_LABEL: "0.5", model: h100, precision: "bf16"},
                        "0.1x90",
                    ),
                    _series(
                        _prom(names.FLEET_OFU_QUANTILE),
                        {names.PROMETHEUS_QUANTILE_LABEL: "0.05", model: "NVIDIA A100-SXM4-80GB", precision: "bf16"},
                        "0.01x90",  # a low tail is not a low median
                    ),
                    _series(
                        _prom(names.FLEET_OFU_QUANTILE),
                        {names.PROMETHEUS_QUANTILE_LABEL: "0.5", model: "NVIDIA A100-SXM4-80GB", precision: "bf16"},
                        "0.6x90",
                    ),
                ],
                "alert_rule_test": [
                    _case("OfuFleetLow", "30m"),
                    _case(
                        "OfuFleetLow",
                        "70m",
                        (
                            {names.PROMETHEUS_QUANTILE_LABEL: "0.5", model: h100, precision: "bf16"},
                            _annotations("OfuFleetLow", f"Median OFU of {h100} GPUs is low"),
                        ),
                    ),
                ],
            },
            {
                "interval": "1m",
                "input_series": [
                    # 2.5 per window x 60 = 150 per hour; 0.5 per window = 30 per hour; no prices: no cost series
                    *cost_series(expensive, 8, {"idle": 1.0, "clock": 0.5, "tensor": 1.0}),
                    *cost_series(cheap, 8, {"idle": 0.0, "clock": 0.25, "tensor": 0.25}),
                    _series(_prom(names.JOB_GPUS), unpriced, "8x60"),
                    _series(_prom(names.JOB_GPU_TIME), unpriced, "480x60"),
                ],
                "alert_rule_test": [
                    _case("OfuHighLostCost", "20m"),
                    _case(
                        "OfuHighLostCost",
                        "45m",
                        (
                            {job: "moe-7"},
                            _annotations(
                                "OfuHighLostCost", "Job moe-7 loses 150 per hour to idle, clock or tensor loss"
                            ),
                        ),
                    ),
                ],
            },
            {
                "interval": "1m",
                "input_series": [
                    _series("up", scrape, "0x20"),
                    _series("up", scrape_b, "1x20"),
                    _series(_prom(names.FLEET_GPUS), {**scrape_b, model: h100, precision: "bf16"}, "16x20"),
                ],
                "alert_rule_test": [
                    _case("OfuCollectorDown", "3m"),
                    _case(
                        "OfuCollectorDown",
                        "10m",
                        (scrape, _annotations("OfuCollectorDown", "otel-ofu collector collector-0:9465 is down")),
                    ),
                    # collector-0 is down (OfuCollectorDown), collector-1 has GPUs: neither has "no windows"
                    _case("OfuCollectorNoWindows", "20m"),
                ],
            },
            {
                "interval": "1m",
                "input_series": [
                    _series("up", scrape, "1x30"),  # up, but never a window with GPUs
                    _series("up", scrape_b, "1x30"),
                    _series(_prom(names.FLEET_GPUS), {**scrape_b, model: h100, precision: "bf16"}, "16x30"),
                ],
                "alert_rule_test": [
                    _case("OfuCollectorNoWindows", "10m"),
                    _case(
                        "OfuCollectorNoWindows",
                        "20m",
                        (
                            scrape,
                            _annotations(
                                "OfuCollectorNoWindows",
                                "otel-ofu collector collector-0:9465 closes no windows with GPUs",
                            ),
                        ),
                    ),
                ],
            },
            {
                "interval": "1m",
                "input_series": [
                    # The producers stop: the last window with GPUs ends at minute 30, every window after it is
                    # empty; the endpoint shows its series one window more, and Prometheus marks them stale.
                    _series("up", scrape, "1x59"),
                    _series(_prom(names.GPU_STRAGGLER), {**scrape, **straggler}, producers_stop(1.0)),
                    _series(_prom(names.JOB_GPUS_IDLE), {**scrape, job: "idle-3"}, producers_stop(2.0)),
                    _series(_prom(names.FLEET_GPUS), {**scrape, model: h100, precision: "bf16"}, producers_stop(16.0)),
                ],
                "alert_rule_test": [
                    _case(
                        "OfuStragglerGpu",
                        "30m",
                        (
                            {**scrape, **straggler},
                            _annotations("OfuStragglerGpu", straggler_summary(straggler), straggler_text),
                        ),
                    ),
                    _case(
                        "OfuIdleGpus",
                        "31m",
                        (
                            {**scrape, job: "idle-3"},
                            _annotations("OfuIdleGpus", "Job idle-3 holds 2 GPUs that do no tensor work"),
                        ),
                    ),
                    _case("OfuStragglerGpu", "33m"),  # stale since minute 32: resolved
                    _case("OfuIdleGpus", "33m"),
                    _case("OfuCollectorNoWindows", "40m"),  # no fleet_gpus since minute 32: pending for 15m
                    _case(
                        "OfuCollectorNoWindows",
                        "50m",
                        (
                            scrape,
                            _annotations(
                                "OfuCollectorNoWindows",
                                "otel-ofu collector collector-0:9465 closes no windows with GPUs",
                            ),
                        ),
                    ),
                ],
            },
            {
                "interval": "1m",
                "input_series": [
                    # A lasting share. collector-0: 1000 accepted and 50 rejected a minute, 750 of 15,750 in
                    # 15 minutes (4.762%); collector-1: 1 in 1001 (under 1%); idle: nothing at all (0 / 0).
                    _series(_prom_counter(names.COLLECTOR_POINTS_ACCEPTED), scrape, "0+1000x40"),
                    *rejected_series(scrape, {names.RejectReason.OUT_OF_RANGE: "0+50x40"}, "0x40"),
                    _series(_prom_counter(names.COLLECTOR_POINTS_ACCEPTED), scrape_b, "0+1000x40"),
                    *rejected_series(scrape_b, {names.RejectReason.NO_IDENTITY: "0+1x40"}, "0x40"),
                    _series(_prom_counter(names.COLLECTOR_POINTS_ACCEPTED), idle_collector, "0x40"),
                    *rejected_series(idle_collector, {}, "0x40"),
                ],
                "alert_rule_test": [
                    _case(
                        "OfuCollectorRejectingPoints",
                        "30m",
                        (
                            scrape,
                            _annotations(
                                "OfuCollectorRejectingPoints",
                                "otel-ofu collector collector-0:9465 rejects 4.762% of the points",
                            ),
                        ),
                    ),
                ],
            },
            {
                "interval": "1m",
                "input_series": [
                    # One-off bursts, seen because every reason's counter starts at 0 (a series born at 500 would
                    # show no increase). collector-0: 1000 accepted a minute, 500 rejected once at minute 11.
                    _series(_prom_counter(names.COLLECTOR_POINTS_ACCEPTED), scrape, "0+1000x40"),
                    *rejected_series(scrape, {names.RejectReason.OUT_OF_RANGE: "0x10 500x29"}, "0x40"),
                    # collector-1 restarts: its series go stale at the failed scrape of minute 10, come back at 0
                    # at minute 12 (the counters reset), and it rejects 300 points at minute 13.
                    _series(_prom_counter(names.COLLECTOR_POINTS_ACCEPTED), scrape_b, "0+1000x9 stale _ 0+1000x28"),
                    *rejected_series(
                        scrape_b, {names.RejectReason.OUT_OF_RANGE: "0x9 stale _ 0 300x27"}, "0x9 stale _ 0x28"
                    ),
                ],
                "alert_rule_test": [
                    _case("OfuCollectorRejectingPoints", "9m"),
                    # The last 15 minutes at 20m: collector-0 rejected 500 and accepted 15,000 (3.226%);
                    # collector-1 accepted 4,000 before its restart and 8,000 after, rejected 300 (2.439%).
                    _case(
                        "OfuCollectorRejectingPoints",
                        "20m",
                        (
                            scrape,
                            _annotations(
                                "OfuCollectorRejectingPoints",
                                "otel-ofu collector collector-0:9465 rejects 3.226% of the points",
                            ),
                        ),
                        (
                            scrape_b,
                            _annotations(
                                "OfuCollectorRejectingPoints",
                                "otel-ofu collector collector-1:9465 rejects 2.439% of the points",
                            ),
                        ),
                    ),
                    _case("OfuCollectorRejectingPoints", "35m"),  # the bursts are out of the 15-minute range
                ],
            },
            {
                "interval": "1m",
                "input_series": [
                    _series(
                        _prom_counter(names.COLLECTOR_DROPPED), {**scrape, "reason": "windows_overflow"}, "0x5 3x25"
                    ),
                    _series(_prom_counter(names.COLLECTOR_DROPPED), {**scrape, "reason": "windows_rejected"}, "0x30"),
                ],
                "alert_rule_test": [
                    _case("OfuCollectorDroppingData", "4m"),
                    _case(
                        "OfuCollectorDroppingData",
                        "8m",
                        (
                            {**scrape, "reason": "windows_overflow"},
                            _annotations(
                                "OfuCollectorDroppingData",
                                "otel-ofu collector collector-0:9465 dropped data (windows_overflow)",
                            ),
                        ),
                    ),
                    _case("OfuCollectorDroppingData", "29m"),  # nothing dropped in the last 10 minutes
                ],
            },
            {
                "interval": "1m",
                "input_series": [
                    _series(
                        _prom_counter(names.COLLECTOR_REQUESTS_REFUSED), {**scrape, "reason": "overload"}, "0+10x30"
                    ),
                    _series(_prom_counter(names.COLLECTOR_REQUESTS_REFUSED), {**scrape, "reason": "shutdown"}, "0x30"),
                    _series(
                        _prom_counter(names.COLLECTOR_REQUESTS_REFUSED), {**scrape_b, "reason": "shutdown"}, "0+10x30"
                    ),
                ],
                "alert_rule_test": [
                    _case("OfuCollectorOverloaded", "8m"),
                    _case(
                        "OfuCollectorOverloaded",
                        "20m",
                        (
                            scrape,
                            _annotations(
                                "OfuCollectorOverloaded",
                                "otel-ofu collector collector-0:9465 refuses requests for overload",
                            ),
                        ),
                    ),
                ],
            },
        ],
    }


# --- Datadog monitors ------------------------------------------------------------------------------------
# Metric names arrive as the OTLP names; job.id and the GPU identity are tags where the producer copies
# attributes onto data points or resource_attributes_as_tags is on (examples/dashboards/README.md).


def _plain(alert: Alert) -> str:
    return alert.description.split("{{")[0].strip()


def _dd_message(alert: Alert, tags: tuple[str, ...]) -> str:
    """The title with the group's tag values ({{job.id.name}}) and the value, then the description."""
    group = ", ".join(f"{key} {{{{{key}.name}}}}" for key in tags)
    where = f" ({group})" if group else ""
    return f"{{{{#is_alert}}}}{alert.title}{where}: {{{{value}}}}{{{{/is_alert}}}}\n{_plain(alert)}\n"


def _dd_monitor(
    alert: Alert,
    query: str,
    critical: float,
    group_by: tuple[str, ...],
    *,
    priority: int,
    notify_no_data: bool = False,
    no_data_minutes: int | None = None,
) -> JSON:
    options: JSON = {
        "thresholds": {"critical": critical},
        # Flags are absent when they cannot be assessed: missing data is no alert, except where it is the alert.
        "notify_no_data": notify_no_data,
        # The outputs arrive every window, so a full window is there: min(last_15m) of a flag means 15 minutes.
        "require_full_window": True,
        "include_tags": True,
        "new_group_delay": 300,
        "renotify_interval": 0,
    }
    if no_data_minutes is not None:
        options["no_data_timeframe"] = no_data_minutes
    return {
        "name": f"otel-ofu: {alert.name}",
        "type": "query alert",
        "query": query,
        "message": _dd_message(alert, group_by),
        "tags": ["service:otel-ofu", f"severity:{alert.severity}", f"alert:{alert.name}"],
        "priority": priority,
        "options": options,
    }


def datadog_monitors() -> list[JSON]:
    job = (names.JOB_ID,)
    gpu = (names.HOST_NAME, names.HW_ID, names.JOB_ID)
    group = (names.HW_MODEL, names.GPU_PRECISION)

    def by(keys: tuple[str, ...]) -> str:
        return " by {" + ",".join(keys) + "}"

    return [
        # min over the window of a 1/0 flag >= 1: the flag held for the whole window
        _dd_monitor(
            BY_NAME["OfuFlopsMiscount"],
            f"min(last_15m):max:{names.JOB_FLOPS_MISCOUNT.name}{{*}}{by(job)} >= 1",
            1,
            job,
            priority=4,
        ),
        _dd_monitor(
            BY_NAME["OfuRegression"],
            f"min(last_10m):max:{names.JOB_OFU_REGRESSION.name}{{*}}{by(job)} >= 1",
            1,
            job,
            priority=3,
        ),
        _dd_monitor(
            BY_NAME["OfuStragglerGpu"],
            f"min(last_15m):max:{names.GPU_STRAGGLER.name}{{*}}{by(gpu)} >= 1",
            1,
            gpu,
            priority=3,
        ),
        _dd_monitor(
            BY_NAME["OfuIdleGpus"],
            f"min(last_30m):max:{names.JOB_GPUS_IDLE.name}{{*}}{by(job)} >= 1",
            1,
            job,
            priority=3,
        ),
        _dd_monitor(
            BY_NAME["OfuJobHang"],
            f"min(last_5m):max:{names.JOB_HANG.name}{{*}}{by(job)} >= 1",
            1,
            job,
            priority=1,
        ),
        _dd_monitor(
            BY_NAME["OfuFleetLow"],
            f"max(last_1h):avg:{names.FLEET_OFU_QUANTILE.name}{{{names.QUANTILE}:0.5}}{by(group)} "
            f"< {FLEET_OFU_MEDIAN_LOW}",
            FLEET_OFU_MEDIAN_LOW,
            group,
            priority=4,
        ),
        _dd_monitor(
            BY_NAME["OfuHighLostCost"],
            f"sum(last_1h):sum:{names.JOB_COST_LOST.name}{{*}}{by(job)}.as_count() > {LOST_COST_PER_HOUR:g}",
            LOST_COST_PER_HOUR,
            job,
            priority=3,
        ),
        # Datadog sees the collector only through its outputs: windows that stop arriving are the alert.
        _dd_monitor(
            BY_NAME["OfuCollectorNoWindows"],
            f"max(last_15m):sum:{names.FLEET_GPUS.name}{{*}} < 1",
            1,
            (),
            priority=2,
            notify_no_data=True,
            no_data_minutes=30,
        ),
    ]


# --- Honeycomb triggers ------------------------------------------------------------------------------------
# POST /1/triggers/{dataset} with one of these bodies (add your recipients). A trigger's query holds exactly
# one calculation and only calculations, filters, filter_combination, breakdowns and time_range; the time
# range is at most four times the frequency; the frequency is a multiple of 60 between 60 and 86400.


def _hc_trigger(
    alert: Alert,
    calculation: JSON,
    threshold: tuple[str, float],
    *,
    time_range: int,
    frequency: int,
    breakdowns: tuple[str, ...] = (),
    filters: tuple[JSON, ...] = (),
) -> JSON:
    query: JSON = {"calculations": [calculation], "time_range": time_range}
    if filters:
        query["filters"] = list(filters)
    if breakdowns:
        query["breakdowns"] = list(breakdowns)
    return {
        "name": f"otel-ofu: {alert.name}",
        "description": _plain(alert),
        "disabled": False,
        "query": query,
        "threshold": {"op": threshold[0], "value": threshold[1], "exceeded_limit": 1},
        "frequency": frequency,
        "alert_type": "on_change",
        "recipients": [],
    }


def _hc_flag_held(
    alert: Alert, flag: names.MetricSpec, *, time_range: int, frequency: int, breakdowns: tuple[str, ...]
) -> JSON:
    """MIN of a 1/0 flag over the range >= 1: held the whole range; a group without the flag has no row."""
    calculation = {"op": "MIN", "column": flag.name}
    return _hc_trigger(alert, calculation, (">=", 1), time_range=time_range, frequency=frequency, breakdowns=breakdowns)


def honeycomb_triggers() -> list[JSON]:
    job = (names.JOB_ID,)
    return [
        _hc_flag_held(
            BY_NAME["OfuFlopsMiscount"], names.JOB_FLOPS_MISCOUNT, time_range=900, frequency=300, breakdowns=job
        ),
        _hc_flag_held(
            BY_NAME["OfuRegression"], names.JOB_OFU_REGRESSION, time_range=600, frequency=300, breakdowns=job
        ),
        _hc_flag_held(
            BY_NAME["OfuStragglerGpu"],
            names.GPU_STRAGGLER,
            time_range=900,
            frequency=300,
            breakdowns=STRAGGLER_GPU,  # not by throttle reason: one that alternates would split the straggler
        ),
        _hc_flag_held(BY_NAME["OfuIdleGpus"], names.JOB_GPUS_IDLE, time_range=1800, frequency=900, breakdowns=job),
        _hc_flag_held(BY_NAME["OfuJobHang"], names.JOB_HANG, time_range=300, frequency=300, breakdowns=job),
        _hc_trigger(
            BY_NAME["OfuFleetLow"],
            {"op": "MAX", "column": names.FLEET_OFU_QUANTILE.name},
            ("<", FLEET_OFU_MEDIAN_LOW),
            time_range=3600,
            frequency=900,
            breakdowns=(names.HW_MODEL, names.GPU_PRECISION),
            filters=({"column": names.QUANTILE, "op": "=", "value": 0.5},),
        ),
        _hc_trigger(
            BY_NAME["OfuHighLostCost"],
            {"op": "SUM", "column": names.JOB_COST_LOST.name},
            (">", LOST_COST_PER_HOUR),
            time_range=3600,
            frequency=900,
            breakdowns=job,
        ),
        _hc_trigger(
            BY_NAME["OfuCollectorNoWindows"],
            {"op": "COUNT"},
            ("<", 1),
            time_range=900,
            frequency=300,
            filters=({"column": names.FLEET_GPUS.name, "op": "exists"},),
        ),
    ]


# --- Files -------------------------------------------------------------------------------------------------

HEADER = "# Generated by examples/alerts/generate.py from otel_ofu.names: edit the generator, not this file.\n"


def _yaml(content: JSON) -> str:
    return HEADER + yaml.safe_dump(content, sort_keys=False, width=120, allow_unicode=True)


def _json(content: JSON | list[JSON]) -> str:
    return json.dumps(content, indent=2) + "\n"


def generated() -> dict[str, str]:
    """File name -> text of every generated alert file."""
    return {
        "prometheus-rules.yaml": _yaml(prometheus_rules()),
        "prometheus-rules.test.yaml": _yaml(prometheus_rule_tests()),
        "datadog-monitors.json": _json(datadog_monitors()),
        "honeycomb-triggers.json": _json(honeycomb_triggers()),
        # For a Prometheus that scrapes dcgm-exporter itself: OFU per GPU, alerts on it (otel-ofu prometheus-rules).
        "dcgm-exporter-rules.yaml": rules_yaml(),
    }


# The Helm chart's copy (its PrometheusRule): a chart reads only the files inside it.
CHART_COPY = "../deploy/helm/otel-ofu/files/prometheus-rules.yaml"


def main(argv: list[str] | None = None) -> int:
    files = generated()
    return write_or_check(HERE, {**files, CHART_COPY: files["prometheus-rules.yaml"]}, argv, __doc__ or "")


if __name__ == "__main__":
    sys.exit(main())
