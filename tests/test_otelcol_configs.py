"""The shipped OpenTelemetry Collector configurations: well-formed and wired as the topology needs."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from otel_ofu import names
from tests.test_helm_chart import collector_release

OTELCOL = Path(__file__).resolve().parents[1] / "collector" / "otelcol"
# builder/ holds the Collector Builder manifest, not a Collector configuration.
CONFIGS = sorted(path for path in OTELCOL.rglob("*.yaml") if "builder" not in path.relative_to(OTELCOL).parts)
KINDS = ("receivers", "processors", "exporters", "connectors")


def load(path: Path) -> dict[str, Any]:
    loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def test_the_expected_configurations_ship() -> None:
    shipped = {path.relative_to(OTELCOL).as_posix() for path in CONFIGS}
    assert {
        "agent.yaml",
        "backend-gateway.yaml",
        "dcgm-exporter.yaml",
        "sharded/agent.yaml",
        "sharded/gateway.yaml",
    } <= shipped


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.relative_to(OTELCOL).as_posix())
def test_pipelines_reference_defined_components(path: Path) -> None:
    config = load(path)
    pipelines = config["service"]["pipelines"]
    assert pipelines
    used: set[tuple[str, str]] = set()
    for name, pipeline in pipelines.items():
        assert name.split("/")[0] == "metrics", f"{name}: otel-ofu only moves metrics"
        assert pipeline["receivers"], name
        assert pipeline["exporters"], name
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline.get(kind, []):
                defined = set(config.get(kind) or {}) | set(config.get("connectors") or {})
                assert component in defined, f"{path.name}: pipeline {name} uses undefined {kind[:-1]} {component}"
                used.add((kind, component))
        processors = pipeline.get("processors", [])
        if "memory_limiter" in processors:
            assert processors[0] == "memory_limiter", f"{name}: memory_limiter must come first"
        if "batch" in processors:
            assert processors[-1] == "batch", f"{name}: batch must come last"
    for kind in ("receivers", "exporters"):
        for component in config.get(kind) or {}:
            assert (kind, component) in used, f"{path.name}: {kind[:-1]} {component} defined but unused"


def test_sharding_routes_by_job_id() -> None:
    config = load(OTELCOL / "sharded" / "agent.yaml")
    [balancer] = [spec for name, spec in config["exporters"].items() if name.split("/")[0] == "loadbalancing"]
    assert balancer["routing_key"] == "attributes"
    assert balancer["routing_attributes"] == [names.JOB_ID]
    assert balancer["resolver"]


GATEWAYS = {  # the shipped gateway -> its otelcol-contrib variant with the datadog exporter
    OTELCOL / "backend-gateway.yaml": OTELCOL / "contrib" / "backend-gateway.yaml",
    OTELCOL / "sharded" / "gateway.yaml": OTELCOL / "contrib" / "sharded-gateway.yaml",
}


def test_the_gateways_send_datadog_its_otlp_intake_with_deltas_and_the_api_key() -> None:
    for path in GATEWAYS:
        config = load(path)
        assert "datadog" not in config["exporters"]  # otel-ofu's own Collector build has no datadog exporter
        datadog = config["exporters"]["otlphttp/datadog"]
        assert datadog["metrics_endpoint"] == "https://otlp.${env:DD_SITE}/v1/metrics"
        assert datadog["headers"]["dd-api-key"] == "${env:DD_API_KEY}"
        translator = yaml.safe_load(datadog["headers"]["dd-otel-metric-config"])  # a JSON object
        assert translator == {"resource_attributes_as_tags": True}
        to_datadog = [p for p in config["service"]["pipelines"].values() if "otlphttp/datadog" in p["exporters"]]
        assert to_datadog
        for pipeline in to_datadog:
            # The intake takes delta temporality only: cumulative sums (gpu.energy passed through) converted.
            assert "cumulativetodelta" in pipeline["processors"], pipeline
            assert pipeline["processors"].index("cumulativetodelta") < pipeline["processors"].index("batch")


def test_the_contrib_variants_differ_only_by_the_datadog_exporter() -> None:
    for path, variant in GATEWAYS.items():
        shipped, contrib = load(path), load(variant)
        exporter = contrib["exporters"].pop("datadog")
        assert exporter["api"] == {"key": "${env:DD_API_KEY}", "site": "${env:DD_SITE}"}
        assert exporter["metrics"]["resource_attributes_as_tags"] is True
        assert exporter["metrics"]["sums"]["cumulative_monotonic_mode"] == "to_delta"
        del shipped["exporters"]["otlphttp/datadog"]
        for pipeline in contrib["service"]["pipelines"].values():
            pipeline["exporters"] = ["otlphttp/datadog" if e == "datadog" else e for e in pipeline["exporters"]]
        assert contrib == shipped, f"{variant.name} drifted from {path.name}"


def test_backends_are_configured_as_they_need() -> None:
    for path in GATEWAYS:
        exporters = load(path)["exporters"]
        honeycomb = exporters["otlp/honeycomb"]["headers"]
        assert {"x-honeycomb-team", "x-honeycomb-dataset"} <= set(honeycomb)
        assert "prometheus" in exporters
        pipelines = load(path)["service"]["pipelines"]
        # Prometheus text has no exponential histogram: fleet.ofu must not reach it
        for pipeline in pipelines.values():
            if "prometheus" in pipeline["exporters"]:
                processors = set(pipeline.get("processors", []))
                assert processors & {"filter/drop-exponential-histograms", "filter/no-merge-inputs"}, pipeline


def test_merge_tier_gets_every_fleet_metric_and_nothing_loops() -> None:
    config = load(OTELCOL / "sharded" / "gateway.yaml")
    pipelines = config["service"]["pipelines"]
    to_merge = [p for p in pipelines.values() if "otlp/merge-tier" in p["exporters"]]
    assert len(to_merge) == 1
    assert "filter/only-merge-inputs" in to_merge[0]["processors"]
    assert "otlp/merged" not in to_merge[0]["receivers"]  # merged outputs never go back to the merge tier
    assert all(spec.name.startswith(("fleet.", "job.")) for spec in names.COLLECTOR_PARTIAL_METRICS)
    assert names.FLEET_OFU.name.startswith("fleet.")


# How the project's files name an OpenTelemetry Collector release: an image tag, otelcol-contrib's version, the
# tested version in collector/otelcol/README.md, telemetrygen's in build.sh.
_RELEASE = re.compile(
    r"(?:opentelemetry-collector-contrib[:@]v?|otelcol-contrib v|otelcol-contrib:|"
    r"Tested Collector version: \*\*v|OTELCOL_VERSION=v|tag: \"?)(\d+\.\d+\.\d+)"
)


def test_every_collector_release_the_project_names_is_the_one_it_builds() -> None:
    """One Collector version across the chart, the configurations' docs and the build: the builder manifest's."""
    root = OTELCOL.parents[1]
    files = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout.split()
    named: dict[str, set[str]] = {}
    for name in files:
        path = root / name
        if path.suffix not in (".md", ".yaml", ".yml", ".sh", ".tpl", ".txt") and path.name != "Dockerfile":
            continue
        if path.name == "Chart.yaml" or "builder" in path.parts:
            continue
        for found in _RELEASE.findall(path.read_text(encoding="utf-8", errors="replace")):
            named.setdefault(found, set()).add(name)
    release = collector_release()
    assert release in named, "no file names the Collector release"
    assert set(named) == {release}, {version: sorted(where) for version, where in named.items() if version != release}


def test_the_hw_semconv_agent_is_the_agent_plus_its_copies() -> None:
    """The opt-in agent with the conventions' hw.energy and hw.power differs from agent.yaml by its transform only."""
    agent, variant = load(OTELCOL / "agent.yaml"), load(OTELCOL / "hw-semconv-agent.yaml")
    transform = variant["processors"].pop("transform/hw-semconv")
    statements = [s for group in transform["metric_statements"] for s in group["statements"]]
    assert statements == [
        f'copy_metric(name="hw.energy") where metric.name == "{names.GPU_ENERGY.name}"',
        f'copy_metric(name="hw.power") where metric.name == "{names.GPU_POWER.name}"',
    ]
    variant["service"]["pipelines"]["metrics"]["processors"].remove("transform/hw-semconv")
    assert variant == agent
