"""The Helm chart's mode for fleets that already run dcgm-exporter (``dcgmExporter.scrape.enabled``): no DaemonSet of
ours, an OpenTelemetry Collector scraping the dcgm-exporter Service's endpoints into the collector. Linted and
rendered by the real helm (tests/test_helm_chart.py's helpers); tests/e2e/test_dcgm_exporter_scrape.py validates the
rendered Collector configuration with otelcol-ofu."""

from __future__ import annotations

import functools
import subprocess
from typing import Any

import pytest
import yaml

from tests.test_helm_chart import (
    CHART,
    NAMESPACE,
    _UniqueKeyLoader,
    collector_configs,
    collector_release,
    env_of,
    helm,  # noqa: F401  (the fixture)
    of_kind,
    pod_spec,
    resolve,
    workloads,
)

SCRAPE = ["--set", "dcgmExporter.scrape.enabled=true"]
SECURED = [*SCRAPE, "--set", "tls.enabled=true", "--set", "tls.secretName=ofu-tls", "--set", "auth.enabled=true",
           "--set", "auth.token=s3cret"]  # fmt: skip
OWN_CHART = [*SCRAPE, "--set", "dcgmExporter.scrape.namespace=monitoring", "--set",
             "dcgmExporter.scrape.service=dcgm-exporter", "--set", "dcgmExporter.scrape.portName=metrics"]  # fmt: skip
LABELS_ONLY = [*SCRAPE, "--set", "dcgmExporter.scrape.podsUrl=off"]
CONFIGURATIONS = {
    "scrape": SCRAPE,
    "scrape-tls-auth": SECURED,
    "scrape-own-chart": OWN_CHART,
    "scrape-pod-labels-only": LABELS_ONLY,
}


@functools.cache
def render(binary: str, configuration: str) -> tuple[dict[str, Any], ...]:
    argv = [binary, "template", "otel-ofu", str(CHART), "--namespace", NAMESPACE, *CONFIGURATIONS[configuration]]
    text = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    return tuple(doc for doc in yaml.load_all(text, Loader=_UniqueKeyLoader) if doc)


def scraper(documents: tuple[dict[str, Any], ...]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The scraper's Deployment and the Collector configuration it mounts."""
    (deployment,) = [w for w in workloads(documents) if w["metadata"]["name"].endswith("-dcgm-scraper")]
    (config_name,) = [v["configMap"]["name"] for v in pod_spec(deployment)["volumes"] if "configMap" in v]
    (text,) = [text for key, text in collector_configs(documents).items() if key.startswith(f"{config_name}/")]
    return deployment, yaml.safe_load(text)


@pytest.mark.parametrize("configuration", sorted(CONFIGURATIONS))
def test_the_scrape_mode_lints(helm: str, configuration: str) -> None:  # noqa: F811
    lint = subprocess.run(
        [helm, "lint", "--strict", str(CHART), *CONFIGURATIONS[configuration]], capture_output=True, text=True
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr


@pytest.mark.parametrize("configuration", sorted(CONFIGURATIONS))
def test_no_daemonset_of_ours_and_one_scraper_into_the_collector(helm: str, configuration: str) -> None:  # noqa: F811
    documents = render(helm, configuration)
    assert not of_kind(documents, "DaemonSet")
    deployment, config = scraper(documents)
    # One scraper, never two at once: a second would scrape every exporter again and count each GPU's time twice.
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    (container,) = pod_spec(deployment)["containers"]
    repository, _, tag = container["image"].rpartition(":")
    assert repository == "otel/opentelemetry-collector-contrib"  # it carries the Prometheus receiver
    assert tag == collector_release()
    assert container["args"] == ["--config=/etc/otelcol/dcgm-exporter.yaml"]
    # The scrapes go to the collector's Service, which reaches the collector Deployment's gRPC port.
    exporter = config["exporters"]["otlp/otel-ofu-collector"]
    host, _, port = exporter["endpoint"].rpartition(":")
    backend = resolve(documents, host, int(port))
    assert pod_spec(backend)["containers"][0]["args"] == ["collector"]
    assert config["service"]["pipelines"]["metrics"]["receivers"] == ["prometheus"]
    # No batch processor: it would split a scrape over requests (see collector/otelcol/dcgm-exporter.yaml).
    assert "batch" not in config.get("processors", {})


def test_it_scrapes_the_dcgm_exporter_services_endpoints(helm: str) -> None:  # noqa: F811
    for configuration, namespace, service, port in (
        ("scrape", "gpu-operator", "nvidia-dcgm-exporter", "gpu-metrics"),  # the GPU Operator's defaults
        ("scrape-own-chart", "monitoring", "dcgm-exporter", "metrics"),  # dcgm-exporter's own chart
    ):
        _, config = scraper(render(helm, configuration))
        (job,) = config["receivers"]["prometheus"]["config"]["scrape_configs"]
        (discovery,) = job["kubernetes_sd_configs"]
        assert discovery == {"role": "endpointslice", "namespaces": {"names": [namespace]}}
        (keep,) = job["relabel_configs"]
        assert keep["action"] == "keep"
        assert keep["source_labels"] == ["__meta_kubernetes_service_name", "__meta_kubernetes_endpointslice_port_name"]
        assert keep["regex"] == f"{service};{port}"


def test_the_scrapers_role_reads_the_exporters_namespace_only(helm: str) -> None:  # noqa: F811
    documents = render(helm, "scrape")
    deployment, _ = scraper(documents)
    account = pod_spec(deployment)["serviceAccountName"]
    assert [sa["metadata"]["name"] for sa in of_kind(documents, "ServiceAccount")] == [account]
    (role,) = of_kind(documents, "Role")
    (binding,) = of_kind(documents, "RoleBinding")
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "gpu-operator"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    granted = {(group, resource): set(rule["verbs"]) for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"]}  # fmt: skip
    assert granted == {
        ("discovery.k8s.io", "endpointslices"): {"get", "list", "watch"},
        ("", "services"): {"get", "list", "watch"},
        ("", "pods"): {"get", "list", "watch"},
    }


@pytest.mark.parametrize(("configuration", "pods_url"), [("scrape", "auto"), ("scrape-pod-labels-only", "off")])
def test_the_collector_reads_the_clusters_pods_for_the_jobs_where_asked(
    helm: str,  # noqa: F811
    configuration: str,
    pods_url: str,
) -> None:
    """The collector names each GPU's job from the pod dcgm-exporter labels it with, by the producer's workload rules,
    from the cluster's pods (``--k8s-pods-url auto``): it runs as the account the pod-reader ClusterRole is bound to.
    With ``podsUrl: off``, the pod labels alone, and no ClusterRole."""
    documents = render(helm, configuration)
    (collector,) = [w for w in workloads(documents) if pod_spec(w)["containers"][0]["args"] == ["collector"]]
    assert env_of(pod_spec(collector)["containers"][0])["OTEL_OFU_COLLECTOR_K8S_PODS_URL"] == pods_url
    roles = of_kind(documents, "ClusterRole")
    if pods_url == "off":
        assert not roles
        return
    (role,) = roles
    (binding,) = of_kind(documents, "ClusterRoleBinding")
    account = pod_spec(collector)["serviceAccountName"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    pods = role["rules"][0]
    assert (pods["resources"], set(pods["verbs"])) == (["pods"], {"get", "list"})


def test_the_scraper_sends_the_token_and_trusts_the_collectors_ca(helm: str) -> None:  # noqa: F811
    documents = render(helm, "scrape-tls-auth")
    deployment, config = scraper(documents)
    exporter = config["exporters"]["otlp/otel-ofu-collector"]
    assert exporter["headers"] == {"authorization": "Bearer ${env:OTEL_OFU_COLLECTOR_BEARER_TOKEN}"}
    assert exporter["tls"] == {"ca_file": "/etc/otel-ofu/tls/ca.crt"}
    (container,) = pod_spec(deployment)["containers"]
    token = env_of(container)["OTEL_OFU_COLLECTOR_BEARER_TOKEN"]["secretKeyRef"]
    (secret,) = of_kind(documents, "Secret")
    assert token["name"] == secret["metadata"]["name"]
    assert token["key"] in secret["stringData"]
    volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/etc/otel-ofu/tls"]
    assert volumes[mount["name"]]["secret"]["secretName"] == "ofu-tls"


def test_without_the_switch_the_chart_is_unchanged(helm: str) -> None:  # noqa: F811
    argv = [helm, "template", "otel-ofu", str(CHART), "--namespace", NAMESPACE]
    text = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    documents = [doc for doc in yaml.load_all(text, Loader=_UniqueKeyLoader) if doc]
    assert len([doc for doc in documents if doc["kind"] == "DaemonSet"]) == 1
    assert not [doc for doc in documents if doc["metadata"]["name"].endswith("-dcgm-scraper")]
