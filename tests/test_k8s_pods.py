"""Job identity from pod metadata: workload labels and owners, the node's pod list over real HTTP(S),
looked up off the sampling path with a deadline, bounded, backed off."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from otel_ofu.attribution import AttributionError
from otel_ofu.attribution.kubernetes_pods import (
    PodDirectory,
    in_cluster_api_url,
    kubernetes_job_id,
    parse_pod_list,
    pods_url,
    resolve_pods_url,
)
from otel_ofu.attribution.kubernetes_workloads import ObjectMeta, workload_of
from otel_ofu.testing.fake_kubernetes import (
    FakeApiServer,
    Fault,
    jobset_pod,
    owner,
    pod,
    pod_list,
    ray_cluster,
    serve,
)
from otel_ofu.testing.pki import Pki
from tests.k8s_helpers import FakeClock, S

LOGGER = "otel_ofu.attribution"


def workload_tuple(item: dict[str, Any], job_label: str | None = None) -> tuple[str, str, str] | None:
    """The (kind, name, job.id) the rules give a pod written as the API returns it."""
    meta = msgspec.json.decode(json.dumps(item["metadata"]), type=ObjectMeta)
    found = workload_of(meta, job_label)
    return None if found is None else (found.kind, found.name, found.job_id)


def test_a_jobset_pod_is_its_jobset_not_its_child_job() -> None:
    assert workload_tuple(jobset_pod("llama", "workers", 1, 3)) == ("JobSet", "llama", "ml/llama")


@pytest.mark.parametrize(
    ("labels", "owners", "expected"),
    [
        (  # Kubeflow training-operator: PyTorchJob pods
            {"training.kubeflow.org/job-name": "bert", "training.kubeflow.org/replica-type": "worker",
             "training.kubeflow.org/operator-name": "pytorchjob-controller"},
            [owner("kubeflow.org/v1", "PyTorchJob", "bert", "u1")],
            ("KubeflowJob", "bert"),
        ),
        (  # LeaderWorkerSet pods are owned by a StatefulSet; the set's label wins
            {"leaderworkerset.sigs.k8s.io/name": "serve", "leaderworkerset.sigs.k8s.io/group-index": "0"},
            [owner("apps/v1", "StatefulSet", "serve-0", "u2")],
            ("LeaderWorkerSet", "serve"),
        ),
        ({"volcano.sh/job-name": "vj", "volcano.sh/task-spec": "worker"},
         [owner("batch.volcano.sh/v1alpha1", "Job", "vj", "u3")], ("VolcanoJob", "vj")),
        # A RayCluster of its own: the cluster is the job.
        ({"ray.io/cluster": "rc-abc", "ray.io/node-type": "worker", "ray.io/group": "gpu-group",
          "ray.io/is-ray-node": "yes"},
         [owner("ray.io/v1", "RayCluster", "rc-abc", "u4")], ("RayCluster", "rc-abc")),
        # KubeRay's RayJob submitter pod (K8sJobMode): the submitter Job is named as the RayJob, and the
        # pod template carries the RayJob's originated-from labels (rayjob_controller.go getSubmitterTemplate).
        ({"ray.io/originated-from-cr-name": "train", "ray.io/originated-from-crd": "RayJob",
          "app.kubernetes.io/created-by": "kuberay-operator", "batch.kubernetes.io/job-name": "train",
          "job-name": "train", "batch.kubernetes.io/controller-uid": "u5", "controller-uid": "u5"},
         [owner("batch/v1", "Job", "train", "u5")], ("RayJob", "train")),
        # Argo Workflows: every step's pod carries the workflow label and has the Workflow as controller.
        ({"workflows.argoproj.io/workflow": "etl-7xk2q", "workflows.argoproj.io/completed": "false"},
         [owner("argoproj.io/v1alpha1", "Workflow", "etl-7xk2q", "u6")], ("Workflow", "etl-7xk2q")),
        (None, [owner("argoproj.io/v1alpha1", "Workflow", "etl-7xk2q", "u6")], ("Workflow", "etl-7xk2q")),
        # A Deployment's pod: its ReplicaSet is "<deployment>-<pod-template-hash>", the hash also a pod label.
        ({"app": "vllm", "pod-template-hash": "5d8f7c9b6"},
         [owner("apps/v1", "ReplicaSet", "vllm-5d8f7c9b6", "u7")], ("Deployment", "vllm")),
        ({"app": "llama", "pod-template-hash": "7c6d9f8b5"},
         [owner("apps/v1", "ReplicaSet", "llama-serve-7c6d9f8b5", "u8")], ("Deployment", "llama-serve")),
        # A ReplicaSet not named for the pod's hash (created by hand) is its own workload.
        ({"app": "web"}, [owner("apps/v1", "ReplicaSet", "web-7d9f", "u9")], ("ReplicaSet", "web-7d9f")),
        ({"app.kubernetes.io/name": "db", "apps.kubernetes.io/pod-index": "0", "controller-revision-hash": "db-6b8f",
          "statefulset.kubernetes.io/pod-name": "db-0"},
         [owner("apps/v1", "StatefulSet", "db", "u10")], ("StatefulSet", "db")),
        ({"controller-revision-hash": "5f7d8c", "pod-template-generation": "1"},
         [owner("apps/v1", "DaemonSet", "gpu-burn", "u11")], ("DaemonSet", "gpu-burn")),
        ({"batch.kubernetes.io/job-name": "pi", "batch.kubernetes.io/controller-uid": "u12"}, [], ("Job", "pi")),
        ({"job-name": "old-pi", "controller-uid": "u13"}, [], ("Job", "old-pi")),  # a pre-1.27 Job controller
        # No labels: the controlling owner decides; a non-controller owner only when none is the controller.
        (None, [owner("batch/v1", "Job", "bare", "u14")], ("Job", "bare")),
        (None, [owner("kubeflow.org/v1", "MPIJob", "mpi", "u15")], ("MPIJob", "mpi")),
        (None, [owner("jobset.x-k8s.io/v1alpha2", "JobSet", "js", "u16")], ("JobSet", "js")),
        (None, [owner("batch/v1", "Job", "other", "x", controller=False),
                owner("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "lws", "y")], ("LeaderWorkerSet", "lws")),
    ],
)  # fmt: skip
def test_each_controllers_labels_and_owners_name_the_job(
    labels: dict[str, str] | None, owners: list[dict[str, Any]], expected: tuple[str, str]
) -> None:
    found = workload_tuple(pod("p-0", "team", labels=labels, owners=owners))
    assert found == (*expected, f"team/{expected[1]}")


def test_pods_of_no_job_have_none_and_the_sites_label_comes_first() -> None:
    assert workload_tuple(pod("bare", "x")) is None
    assert workload_tuple(pod("static", "x", owners=[owner("v1", "Node", "node-a", "n")])) is None  # a mirror pod
    labelled = jobset_pod("llama", "workers", 0, 0)
    labelled["metadata"]["labels"]["example.com/experiment"] = "exp-42"
    assert workload_tuple(labelled, "example.com/experiment") == ("label", "exp-42", "ml/exp-42")
    assert workload_tuple(labelled, "example.com/absent")[1] == "llama"  # type: ignore[index]
    assert kubernetes_job_id("", "x") == "x"


def test_a_pod_list_skips_malformed_items_and_refuses_what_is_not_a_pod_list() -> None:
    items: list[Any] = [pod("a", "n"), {"metadata": {}}, "junk", {"metadata": {"name": "b", "labels": {"k": 1}}}]
    index = parse_pod_list(json.dumps(pod_list(items)).encode())
    assert set(index.pods) == {("n", "a")}
    assert index.skipped == 3  # no name, not an object, a label that is not a string
    with pytest.raises(AttributionError, match="not a PodList"):
        parse_pod_list(b'{"kind": "Status", "code": 403}')
    with pytest.raises(AttributionError, match="not JSON"):
        parse_pod_list(b"<html>")


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


LLAMA = "llama-workers-0-0-x7k2p"


@pytest.fixture
def api(pki: Pki) -> Iterator[FakeApiServer]:
    fake = FakeApiServer(
        pods=[jobset_pod("llama", "workers", 0, 0), pod("elsewhere", "ml", node="node-b")], token="t-1"
    )
    with serve(fake, pki) as served:
        yield served


@pytest.fixture
def token(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("t-1\n")
    return path


def directory(api: FakeApiServer, pki: Pki, token_file: Path, clock: FakeClock, **kwargs: Any) -> PodDirectory:
    return PodDirectory(
        url=pods_url(api.url, "node-a"), token_file=str(token_file), ca_file=str(pki.ca), clock=clock, **kwargs
    )


def test_the_api_server_lists_the_nodes_pods_metadata_over_https_with_the_token(
    api: FakeApiServer, pki: Pki, token: Path
) -> None:
    clock = FakeClock()
    pods = directory(api, pki, token, clock)
    with pytest.raises(AttributionError, match="not listed yet"):
        pods.get("ml", LLAMA)  # sampling never waits for a list: before the first one there is none
    assert pods.poll()
    llama = pods.get("ml", LLAMA)
    assert llama is not None
    assert llama.uid == f"uid-ml-{LLAMA}"
    assert llama.workload is not None
    assert llama.workload.job_id == "ml/llama"
    assert api.requests[0] == ("/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a", "Bearer t-1")
    assert "as=PartialObjectMetadataList" in api.accepts[0]  # metadata only: no spec, no status
    # Another node's pod is not listed (field selector); asking for it wants a new list, at most once
    # per min_relist_s.
    assert pods.get("ml", "elsewhere") is None
    assert not pods.poll()
    clock.now += 5 * S
    assert pods.poll()
    assert pods.lists == 2
    # A known pod is served from the list until it is stale; the rotated token is read on the next list.
    api.token = "t-2"
    token.write_text("t-2")
    clock.now += 10 * S
    assert pods.get("ml", LLAMA) is not None
    assert not pods.poll()
    clock.now += 20 * S
    assert pods.poll()
    assert pods.get("ml", LLAMA) is not None
    assert api.requests[-1][1] == "Bearer t-2"


def test_the_kubelets_pods_endpoint_works_too(api: FakeApiServer, pki: Pki, token: Path) -> None:
    pods = PodDirectory(url=f"{api.url}/pods", token_file=str(token), ca_file=str(pki.ca), clock=FakeClock())
    pods.poll()
    assert pods.get("ml", LLAMA) is not None  # the full PodList the kubelet always sends reads the same
    assert api.requests[-1][0] == "/pods"


def test_an_untrusted_server_forbidden_or_unreachable_is_one_line_and_the_last_list_is_kept_with_its_age(
    api: FakeApiServer, pki: Pki, token: Path, caplog: pytest.LogCaptureFixture
) -> None:
    untrusted = PodDirectory(url=pods_url(api.url, "node-a"), token_file=str(token), ca_file=None, clock=FakeClock())
    untrusted.poll()
    with pytest.raises(AttributionError, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        untrusted.get("ml", "x")
    clock = FakeClock()
    pods = directory(api, pki, token, clock)
    pods.poll()
    api.status = 403
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        # Hours of failures: the list is kept (a pod's job never changes), its age said when it goes stale.
        for _ in range(12):
            clock.now += 300 * S
            pods.poll()
    assert pods.get("ml", LLAMA) is not None
    lines = [record.getMessage() for record in caplog.records]
    assert "HTTP 403 (may the service account list pods? see the chart's ClusterRole): pods is forbidden" in lines[0]
    assert lines[0].endswith("keeping the list from 300 s ago")
    assert "\n" not in lines[0]
    # Logged on the 1st, 2nd, 4th and 8th failure in a row, not at every one.
    assert len(lines) == 4
    assert "(8th time in a row)" in lines[-1]
    assert lines[-1].endswith(f"keeping the list from {8 * 300} s ago")
    api.status = 200
    clock.now += 300 * S
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        pods.poll()
    assert "works again, after 12 failed lookups" in caplog.records[-1].getMessage()
    gone = PodDirectory(url="http://127.0.0.1:9/api/v1/pods", token_file=None, ca_file=None, deadline_s=2.0)
    gone.poll()
    with pytest.raises(AttributionError, match=re.escape("127.0.0.1:9")):
        gone.get("ml", "x")


def test_failed_lookups_back_off_from_the_refresh_period_doubling(api: FakeApiServer, pki: Pki, token: Path) -> None:
    clock = FakeClock()
    pods = directory(api, pki, token, clock, refresh_s=30.0, max_backoff_s=100.0)
    api.status = 500
    looked_up_at = []
    for second in range(400):
        clock.now = second * S
        if pods.poll():
            looked_up_at.append(second)
    # Failure n waits 30 x 2^(n-1) s, at most 100 s: 0, 30, 90, 190, 290, 390.
    assert looked_up_at == [0, 30, 90, 190, 290, 390]


def test_deeply_nested_json_is_one_failed_lookup_then_backed_off(
    api: FakeApiServer, pki: Pki, token: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Before: a RecursionError escaped the failure cache, so each GPU's refresh asked again (20 GETs in 14 s).
    depth = 100_000
    api.body = b'{"kind": "PodList", "items": [' + b"[" * depth + b"]" * depth + b"]}"
    clock = FakeClock()
    pods = directory(api, pki, token, clock)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(20):
            clock.now += 700_000_000  # 0.7 s: 20 asks in 14 s
            pods.poll()
            with pytest.raises(AttributionError, match="nested too deeply"):
                pods.get("ml", LLAMA)
    assert len(api.requests) == 1
    assert pods.failures == 1
    assert [record.getMessage() for record in caplog.records] == [
        "listing the node's pods failed: the pod list is nested too deeply to decode; no list yet: GPUs in pods "
        "get no job"
    ]


def test_an_answer_over_the_size_bound_is_refused(api: FakeApiServer, pki: Pki, token: Path) -> None:
    api.pods = [pod(f"p-{index}", "ml", labels={"volcano.sh/job-name": "big"}) for index in range(100)]
    pods = directory(api, pki, token, FakeClock(), max_response_bytes=10_000)
    pods.poll()
    with pytest.raises(AttributionError, match="larger than 10000"):
        pods.get("ml", "p-0")


@pytest.mark.parametrize("fault", [Fault.DRIP, Fault.SILENT, Fault.SLOW])
def test_a_dripping_silent_or_slow_server_costs_one_deadline_and_the_list_is_kept(
    api: FakeApiServer, pki: Pki, token: Path, fault: Fault, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    pods = directory(api, pki, token, clock, deadline_s=0.5)
    pods.poll()
    api.fault, api.drip_s, api.delay_s = fault, 0.1, 30.0
    clock.now += 31 * S
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert pods.poll()  # returns at the deadline, not when the server is done
    assert api.answered == 1  # the first list only: the second was cut while the server still held it
    assert pods.failures == 1
    assert pods.get("ml", LLAMA) is not None
    assert "no complete answer within 0.5 s; keeping the list from 31 s ago" in caplog.text


def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return False


def test_sampling_reads_the_list_while_a_lookup_hangs_and_close_cuts_the_lookup(
    api: FakeApiServer, pki: Pki, token: Path
) -> None:
    clock = FakeClock()
    pods = directory(api, pki, token, clock, deadline_s=60.0, startup_wait_s=0.0)
    pods.poll()
    api.fault = Fault.SILENT
    clock.now += 6 * S
    pods.start()
    try:
        assert pods.get("ml", "just-scheduled") is None  # a pod the list lacks wakes the refresher
        assert wait_until(lambda: api.in_flight == 1)
        # The refresher is held by the server; sampling is not.
        assert pods.get("ml", LLAMA) is not None
        assert api.in_flight == 1
    finally:
        pods.close()
    threads = [thread for thread in threading.enumerate() if thread.name == "otel-ofu-k8s-pods"]
    assert threads == []  # close cut the lookup and the thread ended, well before the 60 s deadline
    assert pods.failures == 1


def test_a_token_sent_over_http_is_warned_about_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    token = tmp_path / "token"
    token.write_text("secret")
    with serve(FakeApiServer(pods=[jobset_pod("llama", "workers", 0, 0)], token="secret")) as api:
        clock = FakeClock()
        pods = PodDirectory(url=pods_url(api.url, "node-a"), token_file=str(token), ca_file=None, clock=clock)
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            for _ in range(3):
                pods.poll()
                clock.now += 31 * S
    assert pods.get("ml", LLAMA) is not None
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 1
    assert "in clear text" in warnings[0]
    assert api.url in warnings[0]
    assert "secret" not in warnings[0]


def ray_pods(cluster: str, namespace: str = "ml") -> list[dict[str, Any]]:
    """A RayCluster's head and worker pods as KubeRay writes them (common/pod.go labelPod)."""
    made = []
    for node_type, group in (("head", "headgroup"), ("worker", "gpu-group")):
        labels = {
            "ray.io/cluster": cluster,
            "ray.io/node-type": node_type,
            "ray.io/group": group,
            "ray.io/is-ray-node": "yes",
            "ray.io/identifier": f"{cluster}-{node_type}",
            "app.kubernetes.io/name": "kuberay",
            "app.kubernetes.io/created-by": "kuberay-operator",
        }
        owners = [owner("ray.io/v1", "RayCluster", cluster, f"uid-rc-{cluster}")]
        made.append(pod(f"{cluster}-{node_type}-x2k9d", namespace, labels=labels, owners=owners))
    return made


def test_a_rayjobs_cluster_pods_are_the_rayjobs_read_from_the_rayclusters_own_metadata(
    api: FakeApiServer, pki: Pki, token: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rayjob_labels = {"ray.io/originated-from-cr-name": "train", "ray.io/originated-from-crd": "RayJob",
                     "ray.io/job-submission-mode": "K8sJobMode"}  # fmt: skip
    api.pods = [*ray_pods("gone-rc"), *ray_pods("train-raycluster-x7k2p"), *ray_pods("train2-b7x4q"),
                *ray_pods("notebook-rc"), *ray_pods("serve-raycluster-9zt4w")]  # fmt: skip
    api.ray_clusters = [
        # A RayJob's cluster before KubeRay 1.7: controller owner and labels, both from the RayJob controller.
        ray_cluster("train-raycluster-x7k2p", "ml", labels=rayjob_labels,
                    owners=[owner("ray.io/v1", "RayJob", "train", "uid-rj")]),
        # Since 1.7 the name is "<rayjob>-xxxxx"; here the labels alone say it.
        ray_cluster("train2-b7x4q", "ml", labels={**rayjob_labels, "ray.io/originated-from-cr-name": "train2"}),
        ray_cluster("notebook-rc", "ml"),  # a RayCluster of its own
        ray_cluster("serve-raycluster-9zt4w", "ml", owners=[owner("ray.io/v1", "RayService", "serve", "uid-rs")]),
    ]  # fmt: skip
    clock = FakeClock()
    pods = directory(api, pki, token, clock)
    pods.poll()

    def job(name: str) -> str:
        entry = pods.get("ml", name)
        assert entry is not None
        assert entry.workload is not None
        return entry.workload.job_id

    assert job("train-raycluster-x7k2p-head-x2k9d") == "ml/train"
    assert job("train-raycluster-x7k2p-worker-x2k9d") == "ml/train"
    assert job("train2-b7x4q-worker-x2k9d") == "ml/train2"
    assert job("notebook-rc-worker-x2k9d") == "ml/notebook-rc"
    assert job("serve-raycluster-9zt4w-worker-x2k9d") == "ml/serve"
    assert job("gone-rc-worker-x2k9d") == "ml/gone-rc"  # deleted (404) while its pods terminate
    ray_gets = [path for path, _auth in api.requests if "/rayclusters/" in path]
    assert ray_gets[1] == "/apis/ray.io/v1/namespaces/ml/rayclusters/train-raycluster-x7k2p"
    assert len(ray_gets) == 5
    assert all("as=PartialObjectMetadata" in accept for accept in api.accepts[1:])
    # A RayCluster's owner never changes: the next list reads no RayCluster again.
    clock.now += 31 * S
    pods.poll()
    assert len([path for path, _auth in api.requests if "/rayclusters/" in path]) == 5
    # Without the right to read RayClusters (or from the kubelet, which has none), the pods read as their
    # RayCluster, said once.
    api.ray_status = 403
    denied = directory(api, pki, token, FakeClock())
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        denied.poll()
        denied.poll()
    entry = denied.get("ml", "train-raycluster-x7k2p-head-x2k9d")
    assert entry is not None
    assert entry.workload is not None
    assert entry.workload.job_id == "ml/train-raycluster-x7k2p"
    assert len(caplog.records) == 1
    assert "get rayclusters.ray.io" in caplog.records[0].getMessage()
    kubelet = PodDirectory(url=f"{api.url}/pods", token_file=str(token), ca_file=str(pki.ca), clock=FakeClock())
    kubelet.poll()
    entry = kubelet.get("ml", "train-raycluster-x7k2p-head-x2k9d")
    assert entry is not None
    assert entry.workload is not None
    assert entry.workload.name == "train-raycluster-x7k2p"


def test_a_large_pod_list_is_kept_in_a_few_hundred_bytes_a_pod(api: FakeApiServer, pki: Pki, token: Path) -> None:
    # 20k pods of JobSets, 8 to a set, as the kubelet's full PodList (spec and status included).
    count = 20_000
    api.body = json.dumps(pod_list([jobset_pod(f"js-{i // 8}", "w", i % 8, 0) for i in range(count)])).encode()
    pods = directory(api, pki, token, FakeClock(), max_response_bytes=len(api.body) + 1)
    tracemalloc.start()
    try:
        pods.poll()
        retained, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert pods.failures == 0
    assert pods.get("ml", "js-0-w-0-0-x7k2p") is not None
    # Kept per pod: the (namespace, name) key, the UID and a share of its JobSet's Workload. Before, the
    # whole document was decoded (about 4.3 KB a pod at the peak) and each pod's labels kept (1.4 KB).
    assert retained / count < 500
    assert peak < len(api.body) + 600 * count  # the body itself, then at most one pod decoded at a time
