"""The Helm chart, linted and rendered by the real helm, and its manifests checked for what breaks a
deployment: ports that do not meet, selectors that select nothing, RBAC bound to another account, a
socket not mounted, a variable no command reads, an image no file builds."""

from __future__ import annotations

import argparse
import functools
import json
import re
import shutil
import subprocess
import tomllib
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from otel_ofu.cli_support import option_variables
from otel_ofu.commands import run
from otel_ofu_collector import command as collector_command

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "examples" / "deploy" / "helm" / "otel-ofu"
DOCKERFILE = ROOT / "examples" / "deploy" / "Dockerfile"
BUILD_SCRIPT = ROOT / "tests" / "setup" / "build-helm.sh"
MANIFEST = ROOT / "collector" / "otelcol" / "builder" / "manifest.yaml"
NAMESPACE = "gpu-monitoring"

CONFIGURATIONS: dict[str, list[str]] = {
    "default": [],
    "sharded-tls-auth": [
        "--set", "collector.shards.enabled=true", "--set", "tls.enabled=true", "--set", "tls.secretName=ofu-tls",
        "--set", "auth.enabled=true", "--set", "auth.token=s3cret",
    ],
    "monitoring-sharded": [
        "--set", "collector.shards.enabled=true", "--set", "metrics.serviceMonitor.enabled=true",
        "--set", "metrics.podMonitor.enabled=true", "--set", "metrics.prometheusRule.enabled=true",
        "--set", "grafana.dashboards.enabled=true",
    ],
    "monitoring": [
        "--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.podMonitor.enabled=true",
        "--set", "metrics.prometheusRule.enabled=true", "--set", "grafana.dashboards.enabled=true",
    ],
    "existing-secret-host-proc": [
        "--set", "auth.enabled=true", "--set", "auth.existingSecret=site-token", "--set", "auth.key=bearer",
        "--set", "producer.attribution.hostProc=true", "--set", "producer.attribution.jobLabel=example.com/job",
        "--set", "producer.prometheusPort=0", "--set", "collector.httpPort=0",
    ],
}  # fmt: skip


@functools.cache
def helm_binary() -> str | None:
    """helm from PATH, else build/helm/helm, built by tests/setup/build-helm.sh when it is missing."""
    found = shutil.which("helm")
    if found:
        return found
    built = ROOT / "build" / "helm" / "helm"
    if not built.exists() and shutil.which("go"):
        subprocess.run(["bash", str(BUILD_SCRIPT)], check=False, timeout=1800)
    return str(built) if built.exists() else None


@pytest.fixture
def helm(require: Callable[[bool, str], None]) -> str:
    binary = helm_binary()
    require(binary is not None, "helm is not on PATH and could not be built (make helm needs Go)")
    assert binary is not None
    return binary


class _UniqueKeyLoader(yaml.SafeLoader):
    """Refuses duplicate mapping keys: the API server rejects (or silently drops) them, PyYAML would not."""


def _mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    keys = [loader.construct_object(key, deep=deep) for key, _ in node.value]
    duplicates = {key for key in keys if keys.count(key) > 1}
    if duplicates:
        raise yaml.constructor.ConstructorError(None, None, f"duplicate keys {duplicates}", node.start_mark)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


@functools.cache
def _render(binary: str, configuration: str) -> tuple[dict[str, Any], ...]:
    argv = [binary, "template", "otel-ofu", str(CHART), "--namespace", NAMESPACE, *CONFIGURATIONS[configuration]]
    text = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    return tuple(doc for doc in yaml.load_all(text, Loader=_UniqueKeyLoader) if doc)


@pytest.fixture(params=sorted(CONFIGURATIONS))
def rendered(request: pytest.FixtureRequest, helm: str) -> tuple[dict[str, Any], ...]:
    return _render(helm, request.param)


def of_kind(documents: tuple[dict[str, Any], ...], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in documents if doc["kind"] == kind]


def workloads(documents: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    return [doc for doc in documents if doc["kind"] in ("Deployment", "DaemonSet", "StatefulSet")]


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container.get("env", [])}


def container_ports(workload: dict[str, Any]) -> dict[str, int]:
    return {
        port["name"]: port["containerPort"]
        for container in pod_spec(workload)["containers"]
        for port in container.get("ports", [])
    }


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def service_backends(documents: tuple[dict[str, Any], ...], service: dict[str, Any]) -> list[dict[str, Any]]:
    selector = service["spec"]["selector"]
    return [w for w in workloads(documents) if selects(selector, w["spec"]["template"]["metadata"]["labels"])]


def resolve(documents: tuple[dict[str, Any], ...], host: str, port: int) -> dict[str, Any]:
    """The workload behind ``host:port`` (a Service's DNS name): the port must reach a container port."""
    name, _, rest = host.partition(".")
    assert rest in ("", NAMESPACE, f"{NAMESPACE}.svc", f"{NAMESPACE}.svc.cluster.local"), host
    (service,) = [s for s in of_kind(documents, "Service") if s["metadata"]["name"] == name]
    (service_port,) = [p for p in service["spec"]["ports"] if p["port"] == port]
    (backend,) = service_backends(documents, service)
    target = service_port.get("targetPort", port)
    ports = container_ports(backend)
    assert target in ports or target in ports.values(), (name, target, ports)
    return backend


def command_variables(register: Callable[[Any], None], command: str) -> set[str]:
    parser = argparse.ArgumentParser(prog="otel-ofu")
    action = parser.add_subparsers(dest="command", required=True)
    register(action)
    return set(option_variables(action.choices[command]).values())


def test_helm_lint_passes_in_every_configuration(helm: str) -> None:
    for configuration, values in CONFIGURATIONS.items():
        lint = subprocess.run([helm, "lint", "--strict", str(CHART), *values], capture_output=True, text=True)
        assert lint.returncode == 0, f"{configuration}: {lint.stdout}{lint.stderr}"
        assert "0 chart(s) failed" in lint.stdout


def test_missing_required_values_fail_with_a_clear_message(helm: str) -> None:
    for values, message in (
        (["--set", "tls.enabled=true"], "tls.secretName is required"),
        (["--set", "auth.enabled=true"], "auth.token (or auth.existingSecret) is required"),
    ):
        result = subprocess.run([helm, "template", "x", str(CHART), *values], capture_output=True, text=True)
        assert result.returncode != 0
        assert message in result.stderr


def test_every_manifest_is_well_formed_and_selectors_select(rendered: tuple[dict[str, Any], ...]) -> None:
    for doc in rendered:
        assert {"apiVersion", "kind", "metadata"} <= doc.keys()
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"]), doc["metadata"]["name"]
        if doc["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert doc["metadata"]["namespace"] == NAMESPACE
    for workload in workloads(rendered):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert selects(workload["spec"]["selector"]["matchLabels"], labels), workload["metadata"]["name"]
        for other in workloads(rendered):  # selectors must not overlap another workload's pods
            if other is not workload:
                other_labels = other["spec"]["template"]["metadata"]["labels"]
                assert not selects(workload["spec"]["selector"]["matchLabels"], other_labels)
    for service in of_kind(rendered, "Service"):
        assert len(service_backends(rendered, service)) == 1, service["metadata"]["name"]
        (backend,) = service_backends(rendered, service)
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in container_ports(backend), (service["metadata"]["name"], port)


def test_the_producer_reaches_the_collector_and_mounts_the_pod_resources_socket(
    rendered: tuple[dict[str, Any], ...],
) -> None:
    (daemonset,) = of_kind(rendered, "DaemonSet")
    (container,) = pod_spec(daemonset)["containers"]
    env = env_of(container)
    assert container["args"] == ["run"]
    endpoint = urllib.parse.urlsplit(env["OTEL_EXPORTER_OTLP_ENDPOINT"])
    assert endpoint.hostname is not None
    assert endpoint.port is not None
    backend = resolve(rendered, endpoint.hostname, endpoint.port)
    assert backend["kind"] == "Deployment"
    # The socket: the hostPath directory is mounted where OTEL_OFU_KUBELET_SOCKET points.
    socket = Path(env["OTEL_OFU_KUBELET_SOCKET"])
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(daemonset)["volumes"]}
    (mount,) = [m for m in mounts.values() if m["mountPath"] == str(socket.parent)]
    assert mount["readOnly"] is True
    assert volumes[mount["name"]]["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    # The node name from the downward API feeds the pod list's field selector.
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["OTEL_OFU_K8S_NODE_NAME"] == "$(NODE_NAME)"
    assert env["OTEL_OFU_K8S_PODS_URL"] == "auto"
    # Every OTEL_OFU_* variable is one `otel-ofu run` reads.
    ours = {key for key in env if key.startswith("OTEL_OFU_")}
    assert ours <= command_variables(run.register, "run")
    # Prometheus annotations-free scraping: the port the producer serves is the one it declares.
    if "OTEL_OFU_PROMETHEUS_PORT" in env:
        assert container_ports(daemonset)["metrics"] == int(env["OTEL_OFU_PROMETHEUS_PORT"])
        # The producer listens on loopback unless told otherwise: the declared port must be opened.
        assert env["OTEL_OFU_PROMETHEUS_HOST"] == "0.0.0.0"
    else:
        assert "metrics" not in container_ports(daemonset)


def test_collectors_read_their_variables_and_listen_where_their_ports_say(
    rendered: tuple[dict[str, Any], ...],
) -> None:
    collector_variables = command_variables(collector_command.register, "collector")
    ours = [w for w in of_kind(rendered, "Deployment") if pod_spec(w)["containers"][0]["args"] == ["collector"]]
    assert ours
    for deployment in ours:
        (container,) = pod_spec(deployment)["containers"]
        env = env_of(container)
        assert {key for key in env if key.startswith("OTEL_OFU_")} <= collector_variables
        ports = container_ports(deployment)
        assert env["OTEL_OFU_COLLECTOR_LISTEN"] == f"0.0.0.0:{ports['otlp-grpc']}"
        assert int(env["OTEL_OFU_COLLECTOR_PROMETHEUS_PORT"]) == ports["metrics"]
        if "otlp-http" in ports:
            assert env["OTEL_OFU_COLLECTOR_HTTP_LISTEN"] == f"0.0.0.0:{ports['otlp-http']}"


def test_rbac_binds_the_account_the_producer_runs_as(rendered: tuple[dict[str, Any], ...]) -> None:
    (daemonset,) = of_kind(rendered, "DaemonSet")
    account = pod_spec(daemonset)["serviceAccountName"]
    assert [sa["metadata"]["name"] for sa in of_kind(rendered, "ServiceAccount")] == [account]
    (binding,) = of_kind(rendered, "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]
    (role,) = of_kind(rendered, "ClusterRole")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}  # fmt: skip
    pods, ray_clusters = role["rules"]
    assert pods["apiGroups"] == [""]
    assert pods["resources"] == ["pods"]
    assert set(pods["verbs"]) == {"get", "list"}  # read only
    # A RayJob's cluster is read for the RayJob that owns it, one by name: get, never list.
    assert (ray_clusters["apiGroups"], ray_clusters["resources"], ray_clusters["verbs"]) == (
        ["ray.io"],
        ["rayclusters"],
        ["get"],
    )


def test_secrets_and_tls_are_wired_to_what_exists(rendered: tuple[dict[str, Any], ...]) -> None:
    secrets = {s["metadata"]["name"]: s for s in of_kind(rendered, "Secret")}
    for workload in workloads(rendered):
        spec = pod_spec(workload)
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        for container in spec["containers"]:
            for value in env_of(container).values():
                if isinstance(value, dict) and "secretKeyRef" in value:
                    ref = value["secretKeyRef"]
                    if ref["name"] in secrets:
                        assert ref["key"] in secrets[ref["name"]]["stringData"]
                    else:
                        assert ref["name"] == "site-token"
                        assert ref["key"] == "bearer"
            for mount in container.get("volumeMounts") or []:
                assert mount["name"] in volumes, (workload["metadata"]["name"], mount["name"])
            env = env_of(container)
            for key in ("OTEL_OFU_COLLECTOR_TLS_CERT", "OTEL_OFU_COLLECTOR_TLS_KEY", "OTEL_EXPORTER_OTLP_CERTIFICATE"):
                if key in env:
                    (mount,) = [m for m in container["volumeMounts"] if env[key].startswith(m["mountPath"] + "/")]
                    assert volumes[mount["name"]]["secret"]["secretName"] == "ofu-tls"
            if "OTEL_EXPORTER_OTLP_CERTIFICATE" in env:
                assert env["OTEL_EXPORTER_OTLP_ENDPOINT"].startswith("https://")
            if "OTEL_EXPORTER_OTLP_HEADERS" in env:
                # $(VAR) is only expanded from variables defined earlier in the list.
                names_in_order = [item["name"] for item in container["env"]]
                referenced = re.findall(r"\$\((\w+)\)", env["OTEL_EXPORTER_OTLP_HEADERS"])
                for name in referenced:
                    assert names_in_order.index(name) < names_in_order.index("OTEL_EXPORTER_OTLP_HEADERS")


def test_the_sharded_agent_routes_to_the_headless_shards(helm: str) -> None:
    documents = _render(helm, "sharded-tls-auth")
    (config_map,) = of_kind(documents, "ConfigMap")
    agent = yaml.safe_load(config_map["data"]["agent.yaml"])
    exporter = agent["exporters"]["loadbalancing/otel-ofu-shards"]
    assert exporter["routing_attributes"] == ["job.id"]
    dns = exporter["resolver"]["dns"]
    shards = resolve(documents, dns["hostname"], int(dns["port"]))
    shard_service = [s for s in of_kind(documents, "Service") if s["metadata"]["name"] == dns["hostname"].split(".")[0]]
    assert shard_service[0]["spec"]["clusterIP"] == "None"  # one A record per shard
    assert env_of(pod_spec(shards)["containers"][0])["OTEL_OFU_COLLECTOR_MODE"] == "shard"
    assert shards["spec"]["replicas"] == 3
    assert agent["service"]["pipelines"]["metrics"]["exporters"] == ["loadbalancing/otel-ofu-shards"]
    # The agent routes by job.id on the data points: the producers put it there too.
    (daemonset,) = of_kind(documents, "DaemonSet")
    assert env_of(pod_spec(daemonset)["containers"][0])["OTEL_OFU_PLACEMENT"] == "both"
    (agent_deployment,) = [w for w in workloads(documents) if w["metadata"]["name"].endswith("-agent")]
    mounted = pod_spec(agent_deployment)["volumes"][0]["configMap"]["name"]
    assert mounted == config_map["metadata"]["name"]
    assert "merge" in {
        env_of(pod_spec(w)["containers"][0]).get("OTEL_OFU_COLLECTOR_MODE") for w in workloads(documents)
    }


def collector_release() -> str:
    """The OpenTelemetry Collector release the project builds and tests every shipped configuration on: the
    version of the contrib modules its builder manifest pins (``0.161.0``), the one place that says it."""
    manifest = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
    versions = {
        entry["gomod"].split()[-1]
        for kind in ("receivers", "exporters", "processors", "connectors", "extensions")
        for entry in manifest.get(kind) or []
        if "opentelemetry-collector-contrib" in entry["gomod"]
    }
    (version,) = versions
    return str(version).removeprefix("v")


def collector_configs(documents: tuple[dict[str, Any], ...]) -> dict[str, str]:
    """Every OpenTelemetry Collector configuration the manifests hold (ConfigMap entries with a ``service`` and
    its pipelines), by ``<configmap>/<key>``."""
    found = {}
    for config_map in of_kind(documents, "ConfigMap"):
        for key, text in (config_map.get("data") or {}).items():
            parsed = yaml.safe_load(text) if key.endswith((".yaml", ".yml")) else None
            if isinstance(parsed, dict) and "pipelines" in (parsed.get("service") or {}):
                found[f"{config_map['metadata']['name']}/{key}"] = text
    return found


def test_the_sharded_agent_runs_the_collector_release_the_project_builds_and_tests(helm: str) -> None:
    """The agent's loadbalancing exporter routes by ``routing_attributes: [job.id]``, which 0.115.0 did not have:
    an agent on an older image would not start. It runs the release every shipped configuration is tested on."""
    documents = _render(helm, "sharded-tls-auth")
    (agent,) = [w for w in workloads(documents) if w["metadata"]["name"].endswith("-agent")]
    (container,) = pod_spec(agent)["containers"]
    repository, _, tag = container["image"].rpartition(":")
    assert repository == "otel/opentelemetry-collector-contrib"
    assert tag == collector_release()
    assert collector_configs(documents), "the sharded render holds the agent's Collector configuration"


def ours(documents: tuple[dict[str, Any], ...]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, container) of every otel-ofu container: the producer and the collectors."""
    return [
        (workload, container)
        for workload in workloads(documents)
        for container in pod_spec(workload)["containers"]
        if container["args"][:1] in (["run"], ["collector"])
    ]


def test_every_otel_ofu_container_has_a_liveness_probe_on_its_health_endpoint(
    rendered: tuple[dict[str, Any], ...],
) -> None:
    """The kubelet restarts a producer whose sampling loop is stuck, or a collector whose windows stop closing:
    the probe asks /healthz on the port the process serves it on, opened to the pod's address."""
    found = ours(rendered)
    assert found
    for workload, container in found:
        env = env_of(container)
        prefix = "OTEL_OFU_" if container["args"] == ["run"] else "OTEL_OFU_COLLECTOR_"
        probe = container["livenessProbe"]["httpGet"]
        assert probe["path"] == "/healthz", workload["metadata"]["name"]
        port = container_ports(workload)[probe["port"]]
        assert int(env[f"{prefix}HEALTH_PORT"]) == port
        assert env[f"{prefix}HEALTH_HOST"] == "0.0.0.0"
        assert container["livenessProbe"]["periodSeconds"] * container["livenessProbe"]["failureThreshold"] >= 30


@pytest.mark.parametrize("configuration", ["monitoring", "monitoring-sharded"])
def test_the_service_monitor_scrapes_every_collector_under_the_job_the_alert_rules_name(
    helm: str, configuration: str
) -> None:
    documents = _render(helm, configuration)
    (monitor,) = of_kind(documents, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    selector = monitor["spec"]["selector"]
    scraped = [s for s in of_kind(documents, "Service") if selects(selector["matchLabels"], s["metadata"]["labels"])]
    expressions = selector.get("matchExpressions", [])
    for expression in expressions:
        assert expression["operator"] == "In"
        scraped = [s for s in scraped if s["metadata"]["labels"].get(expression["key"]) in expression["values"]]
    collectors = {
        w["metadata"]["name"] for w in workloads(documents) if pod_spec(w)["containers"][0]["args"] == ["collector"]
    }
    backends = {service_backends(documents, s)[0]["metadata"]["name"] for s in scraped}
    assert backends == collectors, "every collector (shards and merge tier included) and nothing else"
    (endpoint,) = monitor["spec"]["endpoints"]
    for service in scraped:
        assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}, service["metadata"]["name"]
    rules = yaml.safe_load((ROOT / "examples" / "alerts" / "prometheus-rules.yaml").read_text())
    jobs = set(re.findall(r'up\{job="([^"]+)"\}', yaml.safe_dump(rules)))
    (job,) = jobs
    assert {"targetLabel": "job", "replacement": job, "action": "replace"} in endpoint["relabelings"]


def test_the_pod_monitor_scrapes_the_producers(helm: str) -> None:
    documents = _render(helm, "monitoring")
    (monitor,) = of_kind(documents, "PodMonitor")
    (daemonset,) = of_kind(documents, "DaemonSet")
    assert selects(monitor["spec"]["selector"]["matchLabels"], daemonset["spec"]["template"]["metadata"]["labels"])
    selector = monitor["spec"]["selector"]["matchLabels"]
    for other in workloads(documents):
        if other is not daemonset:
            assert not selects(selector, other["spec"]["template"]["metadata"]["labels"])
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in container_ports(daemonset)


def test_the_prometheus_rule_holds_the_shipped_alert_rules(helm: str) -> None:
    documents = _render(helm, "monitoring")
    (rule,) = of_kind(documents, "PrometheusRule")
    shipped = yaml.safe_load((ROOT / "examples" / "alerts" / "prometheus-rules.yaml").read_text())
    assert rule["spec"]["groups"] == shipped["groups"]


def test_the_grafana_dashboard_is_a_config_map_the_grafana_sidecar_loads(helm: str) -> None:
    documents = _render(helm, "monitoring")
    (config_map,) = [c for c in of_kind(documents, "ConfigMap") if c["metadata"]["labels"].get("grafana_dashboard")]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    (name, text) = next(iter(config_map["data"].items()))
    assert name.endswith(".json")
    shipped = json.loads((ROOT / "examples" / "dashboards" / "grafana.json").read_text())
    assert json.loads(text) == shipped


def test_monitoring_objects_are_off_by_default(helm: str) -> None:
    """A cluster without the Prometheus Operator's CRDs must install the chart as it is."""
    documents = _render(helm, "default")
    assert not {"ServiceMonitor", "PodMonitor", "PrometheusRule"} & {doc["kind"] for doc in documents}


def dockerfile_instructions() -> Iterator[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            yield word.upper(), rest.strip()


def test_the_image_the_chart_names_is_the_one_the_dockerfile_builds() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"]  # the image tag defaults to appVersion
    image = f"{values['image']['repository']}:{chart['appVersion']}"
    assert f"-t {image} ." in DOCKERFILE.read_text()  # the build command the Dockerfile documents
    instructions = list(dockerfile_instructions())
    for word, rest in instructions:
        if word == "COPY" and "--from" not in rest:
            *sources, _destination = rest.split()
            for source in sources:
                assert (ROOT / source).exists(), f"Dockerfile copies {source}, which does not exist"
    (entrypoint,) = [rest for word, rest in instructions if word == "ENTRYPOINT"]
    assert yaml.safe_load(entrypoint) == ["otel-ofu"]
    assert "otel-ofu" in project["scripts"]
    # Every package the wheel needs is copied: setuptools finds them under the directories it searches.
    copied = {rest.split()[0] for word, rest in instructions if word == "COPY"}
    for package in ("otel_ofu", "collector/otel_ofu_collector"):
        assert package in copied


def test_the_plain_manifest_is_the_charts_current_render(helm: str) -> None:
    committed = (ROOT / "examples" / "deploy" / "daemonset.yaml").read_text()
    header = "".join(
        line for line in committed.splitlines(keepends=True) if line.startswith("#") and not line.startswith("# Source")
    )
    argv = [helm, "template", "otel-ofu", str(CHART), "--namespace", "monitoring", "--set",
            "producer.attribution.hostProc=true"]  # fmt: skip
    fresh = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    assert "helm template otel-ofu examples/deploy/helm/otel-ofu --namespace monitoring" in header
    assert committed.removeprefix(committed[: committed.index("---")]) == fresh, "render daemonset.yaml again"
