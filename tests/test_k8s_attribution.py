"""A GPU in a pod joins its job with no change to the pod: PodResources (real gRPC on a unix socket) says
which pod holds the GPU, the node's pods (a real HTTPS API server on 127.0.0.1) say which job the pod is."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_ofu import names
from otel_ofu.attribution import AttributionChain, build_chain
from otel_ofu.attribution.kubernetes import KubernetesAttributor
from otel_ofu.attribution.kubernetes_pods import PodDirectory, pods_url
from otel_ofu.attribution.podresources_pb2 import (
    ListPodResourcesResponse,
)
from otel_ofu.commands import run
from otel_ofu.mfu import MfuReporter
from otel_ofu.model import GpuIdentity, GpuReading, Snapshot
from otel_ofu.sources.capture import CaptureWriter
from otel_ofu.testing.fake_kubernetes import FakeApiServer, Fault, jobset_pod, owner, pod, serve
from otel_ofu.testing.otlp_sink import OtlpSink
from otel_ofu.testing.pki import Pki
from tests.k8s_helpers import GPU0, GPU1, GPU2, MIG_A, FakeClock, FakeKubelet, S, allocation, gpu

MIG_B = "MIG-7f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"


@pytest.fixture
def service_account(tmp_path: Path) -> Path:
    """The files /var/run/secrets/kubernetes.io/serviceaccount holds (token, CA), at a test path."""
    directory = tmp_path / "serviceaccount"
    directory.mkdir()
    (directory / "token").write_text("sa-token")
    return directory


@pytest.fixture
def api(pki: Pki, service_account: Path) -> Iterator[FakeApiServer]:
    shutil.copy(pki.ca, service_account / "ca.crt")
    with serve(FakeApiServer(token="sa-token"), pki) as served:
        yield served


def directory(api: FakeApiServer, service_account: Path, clock: FakeClock | None = None) -> PodDirectory:
    return PodDirectory(
        url=pods_url(api.url, "node-a"),
        token_file=str(service_account / "token"),
        ca_file=str(service_account / "ca.crt"),
        clock=clock or FakeClock(),
    )


def link(socket_path: Path, api: FakeApiServer, service_account: Path, **kwargs: Any) -> KubernetesAttributor:
    pods = directory(api, service_account)
    pods.poll()  # the list its refresher thread would have made
    return KubernetesAttributor(socket_path=socket_path, clock=FakeClock(), pods=pods, **kwargs)


def test_mig_instances_and_time_sliced_gpus_get_their_pods_jobs(
    kubelet: FakeKubelet, api: FakeApiServer, socket_path: Path, service_account: Path
) -> None:
    worker = jobset_pod("llama", "workers", 0, 0)
    api.pods = [
        worker,
        pod("bert-worker-0", "nlp", labels={"training.kubeflow.org/job-name": "bert"},
            owners=[owner("kubeflow.org/v1", "PyTorchJob", "bert", "pt-1")]),
        pod("eval-a", "ml", labels={"batch.kubernetes.io/job-name": "eval-a"}),
        pod("eval-b", "ml", labels={"batch.kubernetes.io/job-name": "eval-b"}),
        pod("sweep-1", "ml", labels={"volcano.sh/job-name": "sweep"}),
        pod("sweep-2", "ml", labels={"volcano.sh/job-name": "sweep"}),
        pod("notebook", "ml"),
    ]  # fmt: skip
    kubelet.response = ListPodResourcesResponse(
        pod_resources=[
            allocation(worker["metadata"]["name"], "ml", "nvidia.com/gpu", [GPU0]),
            allocation("bert-worker-0", "nlp", "nvidia.com/mig-1g.10gb", [MIG_A]),
            allocation("notebook", "ml", "nvidia.com/mig-1g.10gb", [MIG_B]),
            # Time-slicing: two pods of different jobs on GPU1, two pods of one job on GPU2.
            allocation("eval-a", "ml", "nvidia.com/gpu", [f"{GPU1}::0"]),
            allocation("eval-b", "ml", "nvidia.com/gpu", [f"{GPU1}::1"]),
            allocation("sweep-1", "ml", "nvidia.com/gpu", [f"{GPU2}::0"]),
            allocation("sweep-2", "ml", "nvidia.com/gpu", [f"{GPU2}::3"]),
        ]
    )
    attributor = link(socket_path, api, service_account)
    try:
        assert attributor.attribute(gpu(GPU0, 0)) == {
            names.JOB_ID: "ml/llama",
            names.JOB_NAME: "llama",
            names.JOB_SCHEDULER: "kubernetes",
            names.K8S_POD_NAME: worker["metadata"]["name"],
            names.K8S_NAMESPACE_NAME: "ml",
            names.K8S_CONTAINER_NAME: "trainer",
            names.K8S_POD_UID: worker["metadata"]["uid"],
        }
        bert = attributor.attribute(gpu("GPU-host-of-mig", 3, mig=1, mig_uuid=MIG_A))
        assert (bert[names.JOB_ID], bert[names.K8S_POD_NAME]) == ("nlp/bert", "bert-worker-0")
        notebook = attributor.attribute(gpu("GPU-host-of-mig", 3, mig=2, mig_uuid=MIG_B))
        assert notebook[names.K8S_POD_NAME] == "notebook"
        assert names.JOB_ID not in notebook
        shared = attributor.attribute(gpu(GPU1, 1))
        assert shared[names.K8S_POD_NAME] == "eval-a"  # first listed gives the pod
        assert names.JOB_ID not in shared  # two jobs on one GPU: neither is its job
        assert attributor.attribute(gpu(GPU2, 2))[names.JOB_ID] == "ml/sweep"  # one job on both slices
        assert api.requests
        assert all(auth == "Bearer sa-token" for _path, auth in api.requests)
    finally:
        attributor.close()


def test_without_the_pod_list_the_pod_still_comes_and_the_chain_falls_back(
    kubelet: FakeKubelet, api: FakeApiServer, socket_path: Path, service_account: Path
) -> None:
    kubelet.response = ListPodResourcesResponse(pod_resources=[allocation("p", "n", "nvidia.com/gpu", [GPU0])])
    api.status = 403
    chain = build_chain(
        kubelet_socket=socket_path,
        k8s_pods_url=api.url,
        k8s_node_name="node-a",
        k8s_token_file=str(service_account / "token"),
        k8s_ca_file=str(service_account / "ca.crt"),
        static_job_id="node-default",
    )
    try:
        attributes = chain.attribute(gpu(GPU0, 0))
        assert attributes[names.K8S_POD_NAME] == "p"
        assert (attributes[names.JOB_ID], attributes[names.JOB_SCHEDULER]) == ("node-default", "static")
    finally:
        chain.close()


def mfu_reporters_job_id(job_id: str) -> str:
    """The job.id the MFU reporter of that job exports (read back from its real SDK pipeline)."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    reporter = MfuReporter(job_id, meter_provider=provider)
    reporter.report(0.41)
    data = reader.get_metrics_data()
    assert data is not None
    points = [
        point
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        if metric.name == names.JOB_MFU.name
        for point in metric.data.data_points
    ]
    reporter.shutdown()
    provider.shutdown()
    attributes = points[0].attributes
    assert attributes is not None
    return str(attributes[names.JOB_ID])


def test_a_jobset_worker_joins_its_jobs_mfu_with_no_environment_variable(
    kubelet: FakeKubelet,
    api: FakeApiServer,
    socket_path: Path,
    service_account: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key in list(os.environ):
        if key.startswith(("OTEL_", "OFU_")):
            monkeypatch.delenv(key)
    worker = jobset_pod("llama-pretrain", "workers", 1, 0, namespace="research")
    api.pods = [worker, pod("other-node", "research", node="node-b", labels={"volcano.sh/job-name": "x"})]
    kubelet.response = ListPodResourcesResponse(
        pod_resources=[allocation(worker["metadata"]["name"], "research", "nvidia.com/gpu", [GPU0])]
    )
    capture = tmp_path / "capture.jsonl"
    identity = GpuIdentity(uuid=GPU0, model="NVIDIA H100 80GB HBM3", index=0, host="node-a")
    with CaptureWriter(capture) as writer:
        for seq in range(2):
            start = (1_700_000_000 + seq * 10) * S
            writer.write(
                Snapshot(
                    readings=(
                        GpuReading(
                            gpu=identity,
                            start_ns=start,
                            end_ns=start + 10 * S,
                            tensor_active=0.5,
                            sm_clock_hz=1.755e9,
                            max_sm_clock_hz=1.98e9,
                        ),
                    )
                )
            )
    parser = argparse.ArgumentParser(prog="otel-ofu")
    run.register(parser.add_subparsers(dest="command", required=True))
    with OtlpSink.start() as sink:
        args = parser.parse_args(
            ["run", "--source", "replay", "--file", str(capture), "--interval", "0.01", "--quiet",
             "--export-endpoint", sink.grpc_endpoint, "--kubelet-socket", str(socket_path),
             "--k8s-pods-url", api.url, "--k8s-node-name", "node-a",
             "--k8s-token-file", str(service_account / "token"), "--k8s-ca-file", str(service_account / "ca.crt")]
        )  # fmt: skip
        assert args.handler(args) == 0
        assert sink.wait_for(lambda received: len(received.requests()) >= 1, timeout=10)
        resources = [
            {item.key: item.value.string_value for item in rm.resource.attributes}
            for request in sink.requests()
            for rm in request.resource_metrics
            if any(item.key == names.HW_ID for item in rm.resource.attributes)
        ]
    assert resources
    assert {attributes[names.JOB_ID] for attributes in resources} == {"research/llama-pretrain"}
    first = resources[0]
    assert first[names.JOB_NAME] == "llama-pretrain"
    assert first[names.JOB_SCHEDULER] == "kubernetes"
    assert first[names.K8S_POD_UID] == worker["metadata"]["uid"]
    # The training script names its job as its JobSet: <namespace>/<name>, and the two join.
    assert mfu_reporters_job_id("research/llama-pretrain") == first[names.JOB_ID]
    assert api.requests[0][0] == "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a"


def test_the_pod_list_without_the_kubelet_socket_joins_the_pods_dcgm_exporter_names(
    api: FakeApiServer, service_account: Path
) -> None:
    # dcgm-exporter already labels each GPU with its pod (pod, namespace, container): the node's pod list alone then
    # says which job each GPU's pod is, with no kubelet socket mounted.
    worker = jobset_pod("llama", "workers", 0, 0)
    api.pods = [worker]
    chain = build_chain(
        k8s_pods_url=api.url,
        k8s_node_name="node-a",
        k8s_token_file=str(service_account / "token"),
        k8s_ca_file=str(service_account / "ca.crt"),
    )
    try:
        labelled = GpuIdentity(
            uuid=GPU0,
            model="NVIDIA H100 80GB HBM3",
            index=0,
            host="node-a",
            hints={
                names.K8S_POD_NAME: worker["metadata"]["name"],
                names.K8S_NAMESPACE_NAME: "ml",
                names.K8S_CONTAINER_NAME: "trainer",
                names.JOB_SCHEDULER: "kubernetes",
            },
        )
        deadline = time.monotonic() + 10
        attributes = chain.attribute(labelled)
        while names.JOB_ID not in attributes and time.monotonic() < deadline:
            time.sleep(0.05)  # the pod list's first fetch runs on the directory's own thread
            chain.forget(labelled)
            attributes = chain.attribute(labelled)
        assert attributes[names.JOB_ID] == "ml/llama"
        assert attributes[names.JOB_NAME] == "llama"
        assert attributes[names.K8S_POD_NAME] == worker["metadata"]["name"]
        assert names.JOB_ID not in chain.attribute(gpu(GPU1, 1))  # no pod named for it: no job, no error
    finally:
        chain.close()


def test_a_pod_listed_after_its_gpu_was_seen_gets_its_job_at_the_next_sample(
    kubelet: FakeKubelet, api: FakeApiServer, socket_path: Path, service_account: Path
) -> None:
    clock = FakeClock()
    kubelet.response = ListPodResourcesResponse(pod_resources=[allocation("fresh-0", "ml", "nvidia.com/gpu", [GPU0])])
    pods = directory(api, service_account, clock)
    pods.poll()  # the pod was scheduled after this list
    chain = AttributionChain([KubernetesAttributor(socket_path=socket_path, clock=clock, pods=pods)], clock=clock)
    try:
        assert names.JOB_ID not in chain.attribute(gpu(GPU0, 0))
        api.pods = [pod("fresh-0", "ml", labels={"batch.kubernetes.io/job-name": "fresh"})]
        clock.now += 5 * S
        assert pods.poll()  # the pod the list lacked asked for a new list
        clock.now += 1 * S  # well within the chain's 30 s refresh period
        assert chain.attribute(gpu(GPU0, 0))[names.JOB_ID] == "ml/fresh"
    finally:
        chain.close()


def otel_ofu_command(*args: str) -> list[str]:
    """``otel-ofu ARGS`` with this interpreter, so the test runs the package under test wherever it is installed."""
    return [sys.executable, "-c", "import sys; from otel_ofu.cli import main; sys.exit(main(sys.argv[1:]))", *args]


def wait_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


@pytest.mark.parametrize("fault", [Fault.DRIP, Fault.SILENT])
def test_the_producer_exports_every_interval_and_stops_at_sigterm_whatever_the_pods_server_does(
    kubelet: FakeKubelet, socket_path: Path, fault: Fault
) -> None:
    # Before: a server dripping a byte every 2 s held the sampling loop in its read (a per-read timeout
    # only, under the chain's lock): no export at all, and SIGTERM ignored for as long as it dripped.
    kubelet.response = ListPodResourcesResponse(pod_resources=[allocation("trainer-0", "ml", "nvidia.com/gpu", ["0"])])
    api = FakeApiServer(pods=[pod("trainer-0", "ml", labels={"volcano.sh/job-name": "sweep"})], fault=fault)
    environment = {key: value for key, value in os.environ.items() if not key.startswith(("OTEL_", "OFU_"))}
    with serve(api) as served, OtlpSink.start() as sink:
        process = subprocess.Popen(
            otel_ofu_command(
                "run", "--source", "sim", "--interval", "0.2", "--quiet", "--export-endpoint", sink.grpc_endpoint,
                "--kubelet-socket", str(socket_path), "--k8s-pods-url", served.url, "--k8s-node-name", "node-a",
                "--k8s-token-file", "",
            ),
            env=environment,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            assert wait_until(lambda: served.in_flight == 1, timeout_s=20), "the producer never asked for its pods"
            exported = len(sink.requests())
            # Ten more intervals exported while the pods server holds the lookup.
            assert sink.wait_for(lambda received: len(received.requests()) >= exported + 10, timeout=30)
            assert (served.in_flight, served.answered) == (1, 0)
            # ... each covering its own 0.2 s: no interval stretched by a sampling loop waiting on the server.
            intervals = [
                (point.time_unix_nano - point.start_time_unix_nano) / 1e9
                for request in sink.requests()[1:]
                for rm in request.resource_metrics
                for sm in rm.scope_metrics
                for metric in sm.metrics
                if metric.name == names.GPU_OFU.name
                for point in metric.gauge.data_points
            ]
            assert intervals
            assert max(intervals) < 1.0
            started = time.monotonic()
            process.send_signal(signal.SIGTERM)
            _, stderr = process.communicate(timeout=20)
            took = time.monotonic() - started
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert process.returncode == 0, stderr
    # About a second: the last interval exported, the lookup in flight cut, never the server's pace.
    assert took < 5.0, f"SIGTERM to exit took {took:.1f} s"
    print(f"{fault.value}: SIGTERM to exit {took:.2f} s")
