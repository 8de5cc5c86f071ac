"""The dashboards under examples/dashboards are generated from the vocabulary and load in their tools."""

from __future__ import annotations

import copy
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from otel_ofu import names
from tests.example_checks import ATTRIBUTE_KEYS, EXAMPLES, load_generator, unparsed_paths

DASHBOARDS = EXAMPLES / "dashboards"


generate = load_generator("dashboards")

METRIC_NAMES = {
    spec.name
    for spec in (
        *names.PRODUCER_METRICS,
        *names.COLLECTOR_METRICS,
        *names.COLLECTOR_LOSS_METRICS,
        *names.COLLECTOR_GOODPUT_METRICS,
        names.JOB_MFU,
    )
}


def test_committed_files_match_the_generator() -> None:
    for file_name, content in generate.generated().items():
        committed = (DASHBOARDS / file_name).read_text()
        assert committed == generate.render(content), f"{file_name} is stale: run examples/dashboards/generate.py"


def test_generator_check_mode_passes_on_committed_files() -> None:
    assert generate.main(["--check"]) == 0


# --- Datadog: the official client must parse every part into its model classes ----------------------


def _datadog_parse(text: str) -> Any:
    from datadog_api_client import ApiClient, Configuration
    from datadog_api_client.v1.model.dashboard import Dashboard

    configuration = Configuration()  # type: ignore[no-untyped-call]
    return ApiClient(configuration).deserialize(text, (Dashboard,), True)


def test_datadog_dashboard_loads_in_the_official_client_with_nothing_unparsed() -> None:
    dashboard = _datadog_parse((DASHBOARDS / "datadog.json").read_text())
    assert unparsed_paths(dashboard, "dashboard") == []
    kinds = [type(widget.definition._composed_instances[0]).__name__ for widget in dashboard.widgets]
    assert "TimeseriesWidgetDefinition" in kinds
    assert "ToplistWidgetDefinition" in kinds
    assert "QueryValueWidgetDefinition" in kinds


def test_datadog_check_catches_a_broken_widget() -> None:
    broken = copy.deepcopy(generate.datadog_dashboard())
    broken["widgets"][0]["definition"]["requests"][0]["queries"][0]["data_source"] = "no-such-source"
    assert unparsed_paths(_datadog_parse(json.dumps(broken)), "dashboard") != []


def test_datadog_queries_use_only_contract_names() -> None:
    text = (DASHBOARDS / "datadog.json").read_text()
    queries = re.findall(r'"query": "([^"]+)"', text)
    assert queries
    for query in queries:
        metric = re.match(r"\w+:([\w.]+)\{", query)
        assert metric is not None, query
        assert metric.group(1) in METRIC_NAMES, query
        for tag in re.findall(r"([a-z][\w.]*):[$\w*.]", query.split("{", 1)[1]):
            assert tag in ATTRIBUTE_KEYS, (tag, query)


# --- Honeycomb: the documented Query Specification shape ----------------------------------------------

HONEYCOMB_KEYS = {
    "calculations", "filters", "breakdowns", "orders", "havings", "limit", "time_range", "start_time",
    "end_time", "granularity", "filter_combination", "calculated_fields",
}  # fmt: skip
HONEYCOMB_OPS = {
    "COUNT", "CONCURRENCY", "SUM", "AVG", "COUNT_DISTINCT", "MAX", "MIN", "HEATMAP", "RATE_AVG", "RATE_SUM",
    "RATE_MAX", "P001", "P01", "P05", "P10", "P20", "P25", "P50", "P75", "P80", "P90", "P95", "P99", "P999",
}  # fmt: skip
HONEYCOMB_FILTER_OPS = {
    "=", "!=", ">", ">=", "<", "<=", "starts-with", "does-not-start-with", "ends-with", "does-not-end-with",
    "exists", "does-not-exist", "contains", "does-not-contain", "in", "not-in",
}  # fmt: skip


@pytest.mark.parametrize("query_name", sorted(generate.honeycomb_queries()))
def test_honeycomb_query_specs_follow_the_documented_shape(query_name: str) -> None:
    spec = json.loads((DASHBOARDS / "honeycomb-queries.json").read_text())[query_name]
    assert set(spec) <= HONEYCOMB_KEYS
    calculated = {field["name"]: field["expression"] for field in spec.get("calculated_fields", [])}
    for expression in calculated.values():  # query-scoped calculated fields read contract columns ($name)
        referenced = re.findall(r"\$([\w.]+)", expression)
        assert referenced, expression
        assert set(referenced) <= METRIC_NAMES | ATTRIBUTE_KEYS, expression
    columns = METRIC_NAMES | ATTRIBUTE_KEYS | set(calculated)
    for calculation in spec["calculations"]:
        assert calculation["op"] in HONEYCOMB_OPS
        assert calculation.get("column") in columns
    for spec_filter in spec.get("filters", []):
        assert spec_filter["op"] in HONEYCOMB_FILTER_OPS
        assert spec_filter["column"] in columns
        if spec_filter["op"] in ("exists", "does-not-exist"):
            assert "value" not in spec_filter
        else:
            assert "value" in spec_filter
    assert set(spec.get("breakdowns", [])) <= ATTRIBUTE_KEYS
    assert spec.get("filter_combination", "AND") in ("AND", "OR")
    assert isinstance(spec["time_range"], int)
    assert spec["time_range"] > 0


def test_honeycomb_board_references_every_query() -> None:
    board = json.loads((DASHBOARDS / "honeycomb-board.json").read_text())
    assert board["type"] == "flexible"
    refs = [panel["query_panel"]["query_ref"] for panel in board["panels"]]
    assert sorted(refs) == sorted(generate.honeycomb_queries())


# --- Grafana -------------------------------------------------------------------------------------------


def test_grafana_exprs_use_only_contract_names() -> None:
    dashboard = json.loads((DASHBOARDS / "grafana.json").read_text())
    prometheus_names = {generate.prometheus_name(name) for name in METRIC_NAMES}
    label_names = {generate.prometheus_name(key) for key in ATTRIBUTE_KEYS}
    assert dashboard["panels"]
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            identifiers = set(re.findall(r"[a-z][a-z0-9_]*", re.sub(r'"[^"]*"', "", target["expr"])))
            identifiers -= {"avg", "sum", "on", "by", "max", "min", "group_left"}
            assert identifiers, target
            assert identifiers <= prometheus_names | label_names, identifiers - prometheus_names - label_names


def test_grafana_has_job_model_and_host_variables_that_filter_the_panels() -> None:
    dashboard = json.loads((DASHBOARDS / "grafana.json").read_text())
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert {"datasource", "job", "model", "host"} <= set(variables)
    for name, label in (("job", names.JOB_ID), ("model", names.HW_MODEL), ("host", names.HOST_NAME)):
        variable = variables[name]
        assert variable["type"] == "query"
        assert generate.prometheus_name(label) in variable["definition"]
        assert variable["includeAll"]
        assert variable["allValue"] == ".*"  # "All" also keeps series that lack the label
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    job_label = generate.prometheus_name(names.JOB_ID)
    for metric in (names.JOB_OFU, names.JOB_OFU_LOSS, names.JOB_COST_LOST, names.GPU_STRAGGLER):
        uses = [expr for expr in exprs if generate.prometheus_name(metric.name) + "{" in expr]
        assert uses, metric.name
        assert all(f'{job_label}=~"$job"' in expr for expr in uses), uses
    assert any('host_name=~"$host"' in expr for expr in exprs)


def test_grafana_shows_where_ofu_is_lost_and_what_it_costs() -> None:
    text = (DASHBOARDS / "grafana.json").read_text()
    for spec in (
        names.JOB_OFU_LOSS,
        names.FLEET_GPU_TIME_LOST,
        names.FLEET_COST_LOST,
        names.JOB_COST_LOST,
        names.FLEET_ENERGY,
        names.JOB_FLOPS_PER_JOULE,
        names.GPU_STRAGGLER,
        names.JOB_GPUS_IDLE,
    ):
        assert generate.prometheus_name(spec.name) in text, spec.name


def test_grafana_exprs_parse_as_promql(tmp_path: Path, promtool: str) -> None:
    """promtool parses every panel's expression (template variables given their "All" value)."""
    dashboard = json.loads((DASHBOARDS / "grafana.json").read_text())
    rules = [
        {
            "record": f"otel_ofu:grafana_panel_{panel['id']}_{target['refId']}",
            "expr": re.sub(r"\$\w+", ".*", target["expr"]),
        }
        for panel in dashboard["panels"]
        for target in panel["targets"]
    ]
    path = tmp_path / "grafana-exprs.yaml"
    path.write_text(json.dumps({"groups": [{"name": "grafana", "rules": rules}]}))  # JSON is YAML
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


# --- Grafana: what each panel shows, as a reader needs it ----------------------------------------------


def _grafana() -> Any:
    return json.loads((DASHBOARDS / "grafana.json").read_text())


def _metrics_in(expr: str) -> set[str]:
    return set(re.findall(r"[a-z][a-z0-9_]*(?=\{)", expr))


OFU_SERIES = {
    generate.prometheus_name(spec.name) for spec in (names.FLEET_OFU_QUANTILE, names.JOB_OFU, names.JOB_OFU_LOSS)
}


def test_every_grafana_panel_has_a_unit_and_ofu_reads_as_a_percentage() -> None:
    for panel in _grafana()["panels"]:
        unit = panel["fieldConfig"]["defaults"]["unit"]
        assert unit, panel["title"]
        metrics = set().union(*(_metrics_in(target["expr"]) for target in panel["targets"]))
        if metrics and metrics <= OFU_SERIES | {generate.prometheus_name(names.JOB_OFU_MFU_GAP.name)}:
            # OFU is a fraction: 0.45 must read 45%, not 0.45.
            assert unit == "percentunit", panel["title"]
    by_title = {panel["title"]: panel for panel in _grafana()["panels"]}
    # The MAE beside the correlation is a difference of OFUs: a percentage too, r a plain number.
    stat = by_title["Fleet OFU-MFU correlation and MAE"]
    (override,) = stat["fieldConfig"]["overrides"]
    assert override["matcher"] == {"id": "byFrameRefID", "options": "B"}
    assert stat["targets"][1]["refId"] == "B"
    assert generate.prometheus_name(names.FLEET_OFU_MFU_MAE.name) in stat["targets"][1]["expr"]
    assert {"id": "unit", "value": "percentunit"} in override["properties"]


def test_grafana_tables_are_instant_queries_and_the_dashboard_refreshes() -> None:
    dashboard = _grafana()
    tables = [panel for panel in dashboard["panels"] if panel["type"] == "table"]
    assert len(tables) == 4  # flagged jobs, straggler GPUs, idle GPUs, hung jobs
    for panel in tables:
        for target in panel["targets"]:
            # One row per series at its latest value, not every sample of the time range.
            assert target["instant"] is True, panel["title"]
            assert target["range"] is False, panel["title"]
            assert target["format"] == "table", panel["title"]
    assert re.fullmatch(r"\d+[smh]", dashboard["refresh"])


def test_grafana_energy_and_flops_per_joule_have_their_own_axes_and_units() -> None:
    energy = generate.prometheus_name(names.FLEET_ENERGY.name)
    flops_per_joule = generate.prometheus_name(names.JOB_FLOPS_PER_JOULE.name)
    (panel,) = [p for p in _grafana()["panels"] if any(flops_per_joule in t["expr"] for t in p["targets"])]
    kwh, per_joule = panel["targets"]
    assert energy in kwh["expr"]
    assert flops_per_joule in per_joule["expr"]
    assert panel["fieldConfig"]["defaults"]["unit"] == "kwatth"
    (override,) = panel["fieldConfig"]["overrides"]
    assert override["matcher"] == {"id": "byFrameRefID", "options": per_joule["refId"]}
    properties = {item["id"]: item["value"] for item in override["properties"]}
    assert properties == {"unit": "suffix: GFLOP/J", "custom.axisPlacement": "right"}
    # An H100 at 400 TFLOP/s for 700 W does 5.7e11 FLOP/J: shown as 571 GFLOP/J, so the query divides by 1e9.
    assert per_joule["expr"].endswith("/ 1000000000")


@pytest.fixture(scope="module")
def demo_series() -> dict[str, list[set[str]]]:
    """Each output metric's series label names, as the collector's Prometheus endpoint shows the demo fleet
    (every flag raised, priced, with energy): what a Grafana selector can filter on."""
    from otel_ofu_collector.demo.command import run_demo
    from otel_ofu_collector.outputs.prometheus import window_series

    found: dict[str, list[set[str]]] = {}
    for series in (found for report in run_demo(start_ns=1_800_000_000 * 10**9) for found in window_series(report)):
        found.setdefault(series.name, []).append({label for label, _ in series.labels})
    return found


def test_grafana_panels_filter_only_on_labels_their_series_have(demo_series: dict[str, list[set[str]]]) -> None:
    """A variable's matcher on a label its series lack empties the panel as soon as a value is chosen (the
    straggler panel did, filtering GPU series on the job's model)."""
    checked = 0
    for panel in _grafana()["panels"]:
        for target in panel["targets"]:
            for metric, selector in re.findall(r"([a-z][a-z0-9_]*)\{([^}]*)\}", target["expr"]):
                assert demo_series.get(metric), f"the demo fleet shows no {metric}"
                filtered = set(re.findall(r'([a-z_]+)=~"\$\w+"', selector))
                for labels in demo_series[metric]:
                    assert filtered <= labels, (panel["title"], metric, filtered - labels)
                checked += 1
    assert checked >= 14


@pytest.mark.parametrize("file_name", ["datadog.json", "honeycomb-queries.json", "grafana.json"])
def test_every_dashboard_splits_the_tensor_pipes_loss_beside_dram_and_links(file_name: str) -> None:
    text = (DASHBOARDS / file_name).read_text()
    metric = generate.prometheus_name if file_name == "grafana.json" else str
    for part in names.OfuLossCause.TENSOR_PARTS:
        assert part in text, (file_name, part)
    for spec in (names.JOB_DRAM_ACTIVE, names.JOB_NVLINK_THROUGHPUT, names.JOB_PCIE_THROUGHPUT):
        assert metric(spec.name) in text, (file_name, spec.name)


def test_grafana_shows_link_throughput_in_bytes_per_second_on_its_own_axis() -> None:
    dashboard = json.loads((DASHBOARDS / "grafana.json").read_text())
    (panel,) = [p for p in dashboard["panels"] if any("nvlink" in t["expr"] for t in p["targets"])]
    assert panel["fieldConfig"]["defaults"]["unit"] == "percentunit"  # DRAM: a fraction of cycles
    overrides = {o["matcher"]["options"]: o["properties"] for o in panel["fieldConfig"]["overrides"]}
    for ref in ("B", "C"):
        assert {"id": "unit", "value": "Bps"} in overrides[ref]
        assert {"id": "custom.axisPlacement", "value": "right"} in overrides[ref]
