"""Job identity from pod metadata: workload labels and owners, the node's pod list over real HTTP(S)."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_ofu.attribution import AttributionError
from otel_ofu.attribution.kubernetes_pods import (
    PodDirectory,
    in_cluster_api_url,
    kubernetes_job_id,
    parse_pod,
    parse_pod_list,
    pods_url,
    resolve_pods_url,
)
from otel_ofu.testing.fake_kubernetes import FakeApiServer, jobset_pod, owner, pod, pod_list, serve
from otel_ofu.testing.pki import Pki
from tests.k8s_helpers import FakeClock, S


def workload_of(item: dict[str, object], job_label: str | None = None) -> tuple[str, str, str] | None:
    meta = parse_pod(item)
    assert meta is not None
    found = meta.workload(job_label)
    return None if found is None else (found.kind, found.name, found.job_id)


def test_a_jobset_pod_is_its_jobset_not_its_child_job() -> None:
    assert workload_of(jobset_pod("llama", "workers", 1, 3)) == ("JobSet", "llama", "ml/llama")


@pytest.mark.parametrize(
    ("labels", "owners", "expected"),
    [
        (  # Kubeflow training-operator: PyTorchJob pods
            {"training.kubeflow.org/job-name": "bert", "training.kubeflow.org/replica-type": "worker",
             "training.kubeflow.org/operator-name": "pytorchjob-controller"},
            [owner("kubeflow.org/v1", "PyTorchJob", "bert", "u1")],
            ("KubeflowJob", "bert"),
        ),
        (
            {"leaderworkerset.sigs.k8s.io/name": "serve", "leaderworkerset.sigs.k8s.io/group-index": "0"},
            [owner("apps/v1", "StatefulSet", "serve-0", "u2")],
            ("LeaderWorkerSet", "serve"),
        ),
        ({"volcano.sh/job-name": "vj", "volcano.sh/task-spec": "worker"},
         [owner("batch.volcano.sh/v1alpha1", "Job", "vj", "u3")], ("VolcanoJob", "vj")),
        ({"ray.io/cluster": "rc-abc", "ray.io/node-type": "worker"},
         [owner("ray.io/v1", "RayCluster", "rc-abc", "u4")], ("RayCluster", "rc-abc")),
        ({"batch.kubernetes.io/job-name": "pi", "batch.kubernetes.io/controller-uid": "u5"}, [], ("Job", "pi")),
        ({"job-name": "old-pi", "controller-uid": "u6"}, [], ("Job", "old-pi")),  # a pre-1.27 Job controller
        # No labels: the controlling owner decides; a non-controller owner only when none is the controller.
        (None, [owner("batch/v1", "Job", "bare", "u7")], ("Job", "bare")),
        (None, [owner("kubeflow.org/v1", "MPIJob", "mpi", "u8")], ("MPIJob", "mpi")),
        (None, [owner("jobset.x-k8s.io/v1alpha2", "JobSet", "js", "u9")], ("JobSet", "js")),
        (None, [owner("batch/v1", "Job", "other", "x", controller=False),
                owner("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "lws", "y")], ("LeaderWorkerSet", "lws")),
    ],
)  # fmt: skip
def test_each_controllers_labels_and_owners_name_the_job(
    labels: dict[str, str] | None, owners: list[dict[str, object]], expected: tuple[str, str]
) -> None:
    found = workload_of(pod("p-0", "team", labels=labels, owners=owners))
    assert found == (*expected, f"team/{expected[1]}")


def test_pods_of_no_job_have_none_and_the_sites_label_comes_first() -> None:
    deployment_pod = pod("web-7d9f-abc", "web", owners=[owner("apps/v1", "ReplicaSet", "web-7d9f", "r")])
    assert workload_of(deployment_pod) is None
    assert workload_of(pod("bare", "x")) is None
    labelled = jobset_pod("llama", "workers", 0, 0)
    labelled["metadata"]["labels"]["example.com/experiment"] = "exp-42"
    assert workload_of(labelled, "example.com/experiment") == ("label", "exp-42", "ml/exp-42")
    assert workload_of(labelled, "example.com/absent")[1] == "llama"  # type: ignore[index]
    assert kubernetes_job_id("", "x") == "x"


def test_a_pod_list_skips_malformed_items_and_refuses_what_is_not_a_pod_list() -> None:
    items: list[Any] = [pod("a", "n"), {"metadata": {}}, "junk", {"metadata": {"name": "b", "labels": {"k": 1}}}]
    document = pod_list(items)
    pods = parse_pod_list(document)
    assert set(pods) == {("n", "a"), ("", "b")}
    assert pods[("", "b")].labels == {}
    with pytest.raises(AttributionError, match="not a PodList"):
        parse_pod_list({"kind": "Status", "code": 403})


def test_urls_for_the_api_server_the_kubelet_and_in_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    assert pods_url("https://10.0.0.1:6443", "node-a") == (
        "https://10.0.0.1:6443/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a"
    )
    assert pods_url("https://node-a:10250/pods", None) == "https://node-a:10250/pods"
    with pytest.raises(ValueError, match="node name"):
        pods_url("https://10.0.0.1:6443", None)
    with pytest.raises(ValueError, match="http"):
        pods_url("10.0.0.1:6443", "n")
    assert in_cluster_api_url({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}) == (
        "https://10.96.0.1:443"
    )
    assert in_cluster_api_url({"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}) == (
        "https://[fd00::1]:443"
    )
    assert in_cluster_api_url({}) is None
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert resolve_pods_url("auto") is None
    assert resolve_pods_url("off") is None
    assert resolve_pods_url(None) is None
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    assert resolve_pods_url("auto") == "https://10.96.0.1:443"


@pytest.fixture
def api(pki: Pki) -> Iterator[FakeApiServer]:
    fake = FakeApiServer(
        pods=[jobset_pod("llama", "workers", 0, 0), pod("elsewhere", "ml", node="node-b")], token="t-1"
    )
    with serve(fake, pki) as served:
        yield served


def directory(api: FakeApiServer, pki: Pki, token_file: Path, clock: FakeClock, **kwargs: float) -> PodDirectory:
    return PodDirectory(
        url=pods_url(api.url, "node-a"), token_file=str(token_file), ca_file=str(pki.ca), clock=clock, **kwargs
    )


def test_the_api_server_lists_the_nodes_pods_over_https_with_the_token(
    api: FakeApiServer, pki: Pki, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("t-1\n")
    clock = FakeClock()
    pods = directory(api, pki, token, clock, refresh_s=30.0, min_relist_s=5.0)
    llama = pods.get("ml", "llama-workers-0-0-x7k2p")
    assert llama is not None
    assert llama.uid == "uid-ml-llama-workers-0-0-x7k2p"
    workload = llama.workload()
    assert workload is not None
    assert workload.job_id == "ml/llama"
    assert pods.get("ml", "elsewhere") is None  # another node's pod is not listed (field selector)
    assert api.requests[0] == ("/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a", "Bearer t-1")
    # The unknown pod asked for again within min_relist_s does not list again; after it, it does.
    assert pods.get("ml", "elsewhere") is None
    assert pods.lists == 1
    clock.now += 6 * S
    pods.get("ml", "elsewhere")
    assert pods.lists == 2
    # A known pod is served from the list until it is stale; the rotated token is read on the next list.
    api.token = "t-2"
    token.write_text("t-2")
    clock.now += 10 * S
    pods.get("ml", "llama-workers-0-0-x7k2p")
    assert pods.lists == 2
    clock.now += 30 * S
    assert pods.get("ml", "llama-workers-0-0-x7k2p") is not None
    assert pods.lists == 3
    assert api.requests[-1][1] == "Bearer t-2"


def test_the_kubelets_pods_endpoint_works_too(api: FakeApiServer, pki: Pki, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t-1")
    pods = PodDirectory(url=f"{api.url}/pods", token_file=str(token), ca_file=str(pki.ca), clock=FakeClock())
    assert pods.get("ml", "llama-workers-0-0-x7k2p") is not None
    assert api.requests[-1][0] == "/pods"


def test_an_untrusted_server_forbidden_or_unreachable_is_one_line_and_a_good_list_is_kept(
    api: FakeApiServer, pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    token = tmp_path / "token"
    token.write_text("t-1")
    untrusted = PodDirectory(url=pods_url(api.url, "node-a"), token_file=str(token), ca_file=None, clock=FakeClock())
    with pytest.raises(AttributionError, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        untrusted.get("ml", "x")
    clock = FakeClock()
    pods = directory(api, pki, token, clock)
    assert pods.get("ml", "llama-workers-0-0-x7k2p") is not None
    api.status = 403
    clock.now += 31 * S
    with caplog.at_level(logging.WARNING, logger="otel_ofu.attribution"):
        assert pods.get("ml", "llama-workers-0-0-x7k2p") is not None  # the last good list still answers
    assert "HTTP 403" in caplog.text
    assert "keeping the last list" in caplog.text
    clock.now += 10 * 31 * S
    with pytest.raises(AttributionError, match=r"HTTP 403 \(may the service account list pods") as raised:
        pods.get("ml", "llama-workers-0-0-x7k2p")
    assert "\n" not in str(raised.value)
    gone = PodDirectory(url="http://127.0.0.1:9/api/v1/pods", token_file=None, ca_file=None, timeout_s=2.0)
    with pytest.raises(AttributionError, match=re.escape("127.0.0.1:9")):
        gone.get("ml", "x")
