"""Every shipped OpenTelemetry Collector configuration passes the real Collector's ``validate``.

``build/otelcol/otelcol-ofu validate --config FILE`` builds every component of the file from its
configuration (unknown types, bad fields, bad OTTL statements, pipeline wiring), as the Collector
does at start-up, with the environment variables the file references set to test values. A
component otelcol-ofu does not build (collector/otelcol/README.md says which and why) is swapped
for an ``otlphttp`` exporter of the same pipelines, so the rest of that file is still validated;
tests/test_otelcol_configs.py checks the structure of the swapped part.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.test_helm_chart import CONFIGURATIONS, _render, collector_configs, helm_binary

OTELCOL = Path(__file__).resolve().parents[2] / "collector" / "otelcol"
CONFIGS = sorted(path for path in OTELCOL.rglob("*.yaml") if "builder" not in path.relative_to(OTELCOL).parts)
ENV_REFERENCE = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)")
# Exporters otelcol-ofu leaves out (collector/otelcol/README.md): anything else missing is a build bug.
NOT_BUILT = {"datadog"}


def referenced_env(text: str) -> set[str]:
    return set(ENV_REFERENCE.findall(text))


def swap_missing_exporters(config: dict[str, Any], built: set[str], endpoint: str) -> list[str]:
    """Replace every exporter whose type is not built by an ``otlphttp`` one; returns the swapped names."""
    exporters: dict[str, Any] = config.get("exporters") or {}
    renamed = {
        name: f"otlphttp/{name.replace('/', '-')}-standin" for name in exporters if name.split("/")[0] not in built
    }
    for old, new in renamed.items():
        del exporters[old]
        exporters[new] = {"endpoint": endpoint}
    for pipeline in config["service"]["pipelines"].values():
        pipeline["exporters"] = [renamed.get(name, name) for name in pipeline["exporters"]]
    return sorted(renamed)


def test_otelcol_ofu_builds_the_components_the_tests_and_configurations_need(
    otelcol_components: dict[str, set[str]],
) -> None:
    assert {"otlp", "prometheus"} <= otelcol_components["receivers"]
    assert {"otlp", "otlphttp", "debug", "loadbalancing", "prometheus"} <= otelcol_components["exporters"]
    assert {"batch", "memory_limiter", "filter", "transform", "cumulativetodelta"} <= otelcol_components["processors"]
    assert {"signaltometrics"} <= otelcol_components["connectors"]
    named: set[str] = set()
    for path in CONFIGS:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
        for kind in ("receivers", "processors", "exporters", "connectors"):
            for name in config.get(kind) or {}:
                if name.split("/")[0] not in otelcol_components[kind]:
                    named.add(name.split("/")[0])
    assert named <= NOT_BUILT, f"shipped configurations name components otelcol-ofu does not build: {named}"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.relative_to(OTELCOL).as_posix())
def test_shipped_configuration_validates(
    path: Path, otelcol_binary: Path, otelcol_components: dict[str, set[str]], tmp_path: Path
) -> None:
    text = path.read_text(encoding="utf-8")
    env = {**os.environ, **{name: f"test-{name.lower()}" for name in referenced_env(text)}}
    config = yaml.safe_load(text)
    swapped = swap_missing_exporters(config, otelcol_components["exporters"], "http://127.0.0.1:4318")
    assert {name.split("/")[0] for name in swapped} <= NOT_BUILT
    if swapped:
        target = tmp_path / path.name
        target.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    else:
        target = path  # validated exactly as shipped
    result = subprocess.run(
        [str(otelcol_binary), "validate", f"--config={target}"], capture_output=True, env=env, timeout=60
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-3000:]


@pytest.mark.parametrize("name", ["backend-gateway.yaml", "sharded/gateway.yaml"])
def test_the_gateways_to_datadog_validate_exactly_as_shipped(
    name: str, otelcol_binary: Path, otelcol_components: dict[str, set[str]]
) -> None:
    """Datadog through its OTLP intake (otlphttp + cumulativetodelta), so no component needs a stand-in:
    the project's own Collector build runs the gateways as they are. contrib/ keeps the datadog exporter."""
    path = OTELCOL / name
    text = path.read_text(encoding="utf-8")
    assert swap_missing_exporters(yaml.safe_load(text), otelcol_components["exporters"], "http://127.0.0.1:1") == []
    env = {**os.environ, **{variable: f"test-{variable.lower()}" for variable in referenced_env(text)}}
    env["DD_SITE"] = "datadoghq.com"
    result = subprocess.run(
        [str(otelcol_binary), "validate", f"--config={path}"], capture_output=True, env=env, timeout=60
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-3000:]


def test_every_collector_configuration_the_helm_chart_renders_validates(
    otelcol_binary: Path, require: Callable[[bool, str], None], tmp_path: Path
) -> None:
    """The chart's own Collector configurations (the sharded agent's, rendered by the real helm in every
    configuration the chart tests use, TLS and the bearer token included) pass the project's own build."""
    helm = helm_binary()
    require(helm is not None, "helm is not on PATH and could not be built (make helm needs Go)")
    assert helm is not None
    rendered = {
        f"{configuration}:{name}": text
        for configuration in sorted(CONFIGURATIONS)
        for name, text in collector_configs(_render(helm, configuration)).items()
    }
    assert rendered, "no Collector configuration in any render"
    for index, (where, text) in enumerate(sorted(rendered.items())):
        target = tmp_path / f"chart-{index}.yaml"
        target.write_text(text, encoding="utf-8")
        env = {**os.environ, **{name: f"test-{name.lower()}" for name in referenced_env(text)}}
        result = subprocess.run(
            [str(otelcol_binary), "validate", f"--config={target}"], capture_output=True, env=env, timeout=60
        )
        assert result.returncode == 0, f"{where}: " + result.stderr.decode(errors="replace")[-3000:]


def test_validate_rejects_a_broken_configuration(otelcol_binary: Path, tmp_path: Path) -> None:
    """The check above can fail: a pipeline naming an undefined processor does not validate."""
    config = yaml.safe_load((OTELCOL / "agent.yaml").read_text(encoding="utf-8"))
    config["service"]["pipelines"]["metrics"]["processors"].append("transform/undefined")
    target = tmp_path / "broken.yaml"
    target.write_text(yaml.safe_dump(config), encoding="utf-8")
    env = {**os.environ, "OTEL_OFU_COLLECTOR_BEARER_TOKEN": "t"}
    result = subprocess.run(
        [str(otelcol_binary), "validate", f"--config={target}"], capture_output=True, env=env, timeout=60
    )
    assert result.returncode != 0
    assert b"transform/undefined" in result.stderr
