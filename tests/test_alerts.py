"""The alert rules under examples/alerts: generated from the vocabulary, and checked by their own tools.

Prometheus rules go through the real ``promtool check rules`` and ``promtool test rules`` (synthetic series
where each alert must fire and where it must not); Datadog monitors load into datadog-api-client's
models with nothing unparsed; Honeycomb triggers follow the Triggers API's documented shape.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from otel_ofu import names
from otel_ofu.prometheus_names import label_name, metric_name
from tests.example_checks import ATTRIBUTE_KEYS, EXAMPLES, load_generator, unparsed_paths

ALERTS = EXAMPLES / "alerts"


generate = load_generator("alerts")

OUTPUT_SPECS = (*names.COLLECTOR_METRICS, *names.COLLECTOR_LOSS_METRICS, *names.COLLECTOR_GOODPUT_METRICS)
METRIC_NAMES = {spec.name for spec in OUTPUT_SPECS}
ALERT_NAMES = {alert.name for alert in generate.ALERTS}


def test_committed_files_match_the_generator() -> None:
    for file_name, text in generate.generated().items():
        assert (ALERTS / file_name).read_text() == text, f"{file_name} is stale: run examples/alerts/generate.py"


def test_generator_check_mode_passes_on_committed_files_and_catches_a_stale_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert generate.main(["--check"]) == 0
    monkeypatch.setattr(generate, "HERE", tmp_path)  # an empty folder: every file is missing
    assert generate.main(["--check"]) == 1


# --- Prometheus: promtool itself --------------------------------------------------------------------------


def _promtool(promtool: str, *args: str, cwd: Path = ALERTS) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], capture_output=True, text=True, check=False, cwd=cwd, timeout=120)


def test_promtool_check_rules_accepts_every_rule(promtool: str) -> None:
    result = _promtool(promtool, "check", "rules", "prometheus-rules.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERT_NAMES)} rules found" in result.stdout


def test_promtool_unit_tests_pass(promtool: str) -> None:
    result = _promtool(promtool, "test", "rules", "prometheus-rules.test.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def _write_pair(tmp_path: Path, rules: Any, tests: Any) -> None:
    (tmp_path / "prometheus-rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
    (tmp_path / "prometheus-rules.test.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))


def test_promtool_unit_tests_catch_a_wrong_expectation(promtool: str, tmp_path: Path) -> None:
    tests = generate.prometheus_rule_tests()
    miscount = tests["tests"][0]
    firing = next(case for case in miscount["alert_rule_test"] if case["exp_alerts"])
    healthy = dict(firing["exp_alerts"][0])
    healthy["exp_labels"] = {**healthy["exp_labels"], label_name(names.JOB_ID): "dense-1"}
    firing["exp_alerts"].append(healthy)  # the job whose flag is 0 must not be alerted on
    _write_pair(tmp_path, generate.prometheus_rules(), tests)
    result = _promtool(promtool, "test", "rules", "prometheus-rules.test.yaml", cwd=tmp_path)
    assert result.returncode != 0
    assert "OfuFlopsMiscount" in result.stdout + result.stderr


def test_promtool_unit_tests_catch_a_rule_that_fires_on_zero(promtool: str, tmp_path: Path) -> None:
    rules = generate.prometheus_rules()
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule["alert"] == "OfuFlopsMiscount":
                rule["expr"] = f"{metric_name(names.JOB_FLOPS_MISCOUNT.name)} >= 0"  # a flag at 0 would fire
    _write_pair(tmp_path, rules, generate.prometheus_rule_tests())
    result = _promtool(promtool, "test", "rules", "prometheus-rules.test.yaml", cwd=tmp_path)
    assert result.returncode != 0


def _got(output: str, alert: str, eval_time: str) -> str:
    """The alerts promtool got in a failed case (its ``got:[...]`` list), from its report."""
    found = re.search(rf"alertname: {alert}, time: {eval_time}, .*?got:(\[.*?\])\n\n", output + "\n\n", re.S)
    assert found is not None, output
    return found.group(1).strip()


def _with_rule(alert: str, expr: str, duration: str | None) -> Any:
    rules = generate.prometheus_rules()
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule["alert"] == alert:
                rule["expr"] = expr
                rule.pop("for", None)
                if duration is not None:
                    rule["for"] = duration
    return rules


def test_promtool_unit_tests_catch_a_straggler_rule_keyed_by_its_throttle_reason(promtool: str, tmp_path: Path) -> None:
    # The rule as it was: a straggler whose dominant reason alternates power/thermal is two series, neither of
    # which lasts 15 minutes, so it never fired.
    rules = _with_rule("OfuStragglerGpu", f"{metric_name(names.GPU_STRAGGLER.name)} == 1", "15m")
    _write_pair(tmp_path, rules, generate.prometheus_rule_tests())
    result = _promtool(promtool, "test", "rules", "prometheus-rules.test.yaml", cwd=tmp_path)
    assert result.returncode != 0
    got = _got(result.stdout + result.stderr, "OfuStragglerGpu", "20m")
    assert 'hw_id="GPU-3"' in got  # the steady straggler still alerts
    assert 'hw_id="GPU-17"' not in got  # the alternating one does not


def test_promtool_unit_tests_catch_a_rejection_rule_that_misses_a_one_off_burst(promtool: str, tmp_path: Path) -> None:
    # The rule as it was: a 10-minute rate that had to hold for 15 minutes, which a one-off burst never does.
    counter = "otel_ofu_collector_points_{}_total"
    rejected = f"sum by (job, instance) (rate({counter.format('rejected')}[10m]))"
    accepted = f"sum by (job, instance) (rate({counter.format('accepted')}[10m]))"
    rules = _with_rule("OfuCollectorRejectingPoints", f"{rejected} / ({accepted} + {rejected}) > 0.01", "15m")
    _write_pair(tmp_path, rules, generate.prometheus_rule_tests())
    result = _promtool(promtool, "test", "rules", "prometheus-rules.test.yaml", cwd=tmp_path)
    assert result.returncode != 0
    assert _got(result.stdout + result.stderr, "OfuCollectorRejectingPoints", "20m") == "[]"  # no alert at all


def test_the_series_as_prometheus_records_the_endpoint_from_hand_worked_cases() -> None:
    stale = generate.STALE
    # Windows 0-1 hold 1, window 2 none, window 3 holds 2, window 4 none, windows 5-6 none. With 2 expiration
    # windows the endpoint shows 1 at minutes 0-2 (held at 2), 2 at 3-4 (held at 4); minute 5 is the first scrape
    # without it: stale; then no sample.
    windows: list[float | None] = [1.0, 1.0, None, 2.0, None, None, None]
    assert generate.shown_by_the_endpoint(windows) == [1.0, 1.0, 1.0, 2.0, 2.0, stale, None]
    # With 1 the endpoint shows the latest window only: stale at the first window without it.
    assert generate.shown_by_the_endpoint(windows, 1) == [1.0, 1.0, stale, 2.0, stale, None, None]
    # promtool's notation: "a xN" is N + 1 samples, "_xN" is N gaps, "stale" one marker.
    assert generate.promtool_values([1.0, 1.0, 1.0, 2.0, 2.0, stale, None]) == "1x2 2x1 stale _"
    assert generate.promtool_values([0.0, None, None, stale, stale, 3.5]) == "0 _x2 stale stale 3.5"


def test_every_alert_has_a_firing_and_a_quiet_promtool_case() -> None:
    tests = yaml.safe_load((ALERTS / "prometheus-rules.test.yaml").read_text())
    fired: set[str] = set()
    quiet: set[str] = set()
    for test in tests["tests"]:
        for case in test["alert_rule_test"]:
            (fired if case["exp_alerts"] else quiet).add(case["alertname"])
    assert fired == ALERT_NAMES
    assert quiet == ALERT_NAMES


def _self_metric_exposition() -> set[str]:
    """Series names the collector's real Prometheus endpoint shows for its self-metrics."""
    from otel_ofu_collector.outputs.prometheus import OutputsCollector

    values: dict[str, Any] = {}
    for spec in names.COLLECTOR_SELF_METRICS:
        values[spec.name] = {"some_label": 1} if spec.kind == "sum" else {"windows": 0}
    values[names.COLLECTOR_POINTS_ACCEPTED.name] = 5  # unlabelled, as the service gives it
    registry = CollectorRegistry(auto_describe=False)
    registry.register(OutputsCollector(lambda: values))
    text = generate_latest(registry).decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


def test_rules_query_only_series_the_collector_exposes() -> None:
    rules = yaml.safe_load((ALERTS / "prometheus-rules.yaml").read_text())
    outputs = {metric_name(spec.name) for spec in OUTPUT_SPECS}  # outputs by name alone, no unit suffix
    exposed = outputs | _self_metric_exposition() | {"up"}
    labels = {label_name(key) for key in ATTRIBUTE_KEYS} | {"job", "instance", "reason"}
    functions = {"sum", "max", "by", "without", "on", "rate", "increase", "unless"}
    for group in rules["groups"]:
        for rule in group["rules"]:
            expr = re.sub(r'"[^"]*"|\[\w+\]', "", rule["expr"])
            identifiers = set(re.findall(r"[a-zA-Z_][a-zA-Z0-9_]*", expr)) - functions
            assert identifiers <= exposed | labels, (rule["alert"], identifiers - exposed - labels)
            assert identifiers & exposed, rule["alert"]


# --- Datadog: the official client's Monitor model ----------------------------------------------------------


def _monitor(monitor: dict[str, Any]) -> Any:
    from datadog_api_client import ApiClient, Configuration
    from datadog_api_client.v1.model.monitor import Monitor

    configuration = Configuration()  # type: ignore[no-untyped-call]
    return ApiClient(configuration).deserialize(json.dumps(monitor), (Monitor,), True)  # True: _check_type


def _datadog_monitors() -> list[dict[str, Any]]:
    monitors: list[dict[str, Any]] = json.loads((ALERTS / "datadog-monitors.json").read_text())
    return monitors


@pytest.mark.parametrize("index", range(len(generate.datadog_monitors())))
def test_datadog_monitor_loads_in_the_official_client_with_nothing_unparsed(index: int) -> None:
    monitor = _monitor(_datadog_monitors()[index])
    assert unparsed_paths(monitor, "monitor") == []
    assert str(monitor.type) == "query alert"
    assert monitor.options.thresholds.critical is not None


def test_datadog_check_catches_a_broken_monitor() -> None:
    broken = _datadog_monitors()[0]
    broken["options"]["thresholds"] = "critical"
    with pytest.raises(Exception, match="thresholds"):
        _monitor(broken)


def test_datadog_queries_name_contract_metrics_and_match_their_thresholds() -> None:
    monitors = _datadog_monitors()
    assert {monitor["name"].removeprefix("otel-ofu: ") for monitor in monitors} <= ALERT_NAMES
    for monitor in monitors:
        query = monitor["query"]
        found = re.fullmatch(
            r"(\w+)\(last_\w+\):\w+:([\w.]+)\{([^}]*)\}(?: by \{([^}]*)\})?(\.as_count\(\))? (.+)", query
        )
        assert found is not None, query
        assert found.group(2) in METRIC_NAMES, query
        for tag in filter(None, [*found.group(3).split(","), *(found.group(4) or "").split(",")]):
            assert tag == "*" or tag.split(":")[0] in ATTRIBUTE_KEYS, (tag, query)
        comparator, threshold = found.group(6).split(" ")
        assert comparator in (">", ">=", "<", "<=")
        assert float(threshold) == monitor["options"]["thresholds"]["critical"], query
        for tag in (found.group(4) or "").split(","):  # the message names each group's value
            if tag:
                assert "{{" + tag + ".name}}" in monitor["message"], monitor["message"]
        assert "{{ $" not in monitor["message"]  # no Prometheus template left over
        assert monitor["options"]["notify_no_data"] is (monitor["name"].endswith("NoWindows"))


# --- Honeycomb: the Triggers API's documented shape ---------------------------------------------------------
# A trigger: name (1-120 chars), description (<= 1023), query, threshold {op, value, exceeded_limit 1-5},
# frequency (a multiple of 60, 60-86400 s), alert_type on_change|on_true, disabled, recipients. Its query
# holds exactly one calculation and only calculations, filters, filter_combination, breakdowns and
# time_range, over at most four times the frequency; no HEATMAP, CONCURRENCY or RATE_* calculation.

TRIGGER_KEYS = {
    "name", "description", "disabled", "query", "query_id", "threshold", "frequency", "alert_type", "recipients",
    "evaluation_schedule_type", "evaluation_schedule", "tags",
}  # fmt: skip
TRIGGER_QUERY_KEYS = {"calculations", "filters", "filter_combination", "breakdowns", "time_range"}
TRIGGER_OPS = {
    "COUNT", "SUM", "AVG", "COUNT_DISTINCT", "MAX", "MIN", "P001", "P01", "P05", "P10", "P20", "P25", "P50",
    "P75", "P80", "P90", "P95", "P99", "P999",
}  # fmt: skip
FILTER_OPS = {
    "=", "!=", ">", ">=", "<", "<=", "starts-with", "does-not-start-with", "ends-with", "does-not-end-with",
    "exists", "does-not-exist", "contains", "does-not-contain", "in", "not-in",
}  # fmt: skip


def _trigger_problems(trigger: dict[str, Any]) -> list[str]:
    problems = []
    if not set(trigger) <= TRIGGER_KEYS:
        problems.append(f"unknown keys {set(trigger) - TRIGGER_KEYS}")
    if not 1 <= len(trigger.get("name", "")) <= 120:
        problems.append("name")
    if len(trigger.get("description", "")) > 1023:
        problems.append("description")
    threshold = trigger.get("threshold", {})
    if threshold.get("op") not in (">", ">=", "<", "<=") or not isinstance(threshold.get("value"), int | float):
        problems.append("threshold")
    if not 1 <= threshold.get("exceeded_limit", 1) <= 5:
        problems.append("exceeded_limit")
    frequency = trigger.get("frequency", 900)
    if not (isinstance(frequency, int) and frequency % 60 == 0 and 60 <= frequency <= 86400):
        problems.append("frequency")
    if trigger.get("alert_type", "on_change") not in ("on_change", "on_true"):
        problems.append("alert_type")
    query = trigger.get("query", {})
    if not set(query) <= TRIGGER_QUERY_KEYS:
        problems.append(f"query keys {set(query) - TRIGGER_QUERY_KEYS}")
    calculations = query.get("calculations", [])
    if len(calculations) != 1 or calculations[0].get("op") not in TRIGGER_OPS:
        problems.append("calculations")
    elif calculations[0]["op"] != "COUNT" and calculations[0].get("column") not in METRIC_NAMES:
        problems.append(f"column {calculations[0].get('column')}")
    time_range = query.get("time_range", 7200)  # Honeycomb's default
    if not (isinstance(time_range, int) and 0 < time_range <= 4 * frequency):
        problems.append("time_range")
    for spec_filter in query.get("filters", []):
        if spec_filter.get("op") not in FILTER_OPS or spec_filter.get("column") not in METRIC_NAMES | ATTRIBUTE_KEYS:
            problems.append(f"filter {spec_filter}")
        if (spec_filter.get("op") in ("exists", "does-not-exist")) == ("value" in spec_filter):
            problems.append(f"filter value {spec_filter}")
    if not set(query.get("breakdowns", [])) <= ATTRIBUTE_KEYS:
        problems.append("breakdowns")
    return problems


def test_honeycomb_triggers_follow_the_documented_shape() -> None:
    triggers = json.loads((ALERTS / "honeycomb-triggers.json").read_text())
    assert {trigger["name"].removeprefix("otel-ofu: ") for trigger in triggers} <= ALERT_NAMES
    for trigger in triggers:
        assert _trigger_problems(trigger) == [], trigger["name"]


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda t: t["query"]["calculations"].append({"op": "COUNT"}), "calculations"),
        (lambda t: t.update(frequency=90), "frequency"),
        (lambda t: t["query"].update(time_range=4 * t["frequency"] + 60), "time_range"),
        (lambda t: t["query"].update(orders=[]), "query keys"),
        (lambda t: t["threshold"].update(op="=="), "threshold"),
        (lambda t: t["query"]["calculations"][0].update(op="HEATMAP"), "calculations"),
    ],
)
def test_honeycomb_shape_check_catches_a_broken_trigger(change: Callable[[dict[str, Any]], None], problem: str) -> None:
    trigger = json.loads((ALERTS / "honeycomb-triggers.json").read_text())[0]
    change(trigger)
    assert any(found.startswith(problem) for found in _trigger_problems(trigger))


def test_every_backend_covers_the_job_flags() -> None:
    flags = {"OfuFlopsMiscount", "OfuRegression", "OfuStragglerGpu", "OfuIdleGpus", "OfuJobHang", "OfuHighLostCost"}
    for file_name in ("datadog-monitors.json", "honeycomb-triggers.json"):
        alerts = {item["name"].removeprefix("otel-ofu: ") for item in json.loads((ALERTS / file_name).read_text())}
        assert flags <= alerts, file_name
