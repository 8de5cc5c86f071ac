"""The Kubernetes link against a real gRPC PodResources server on a unix socket."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2

from otel_ofu import names
from otel_ofu.attribution import AttributionError, KubernetesAttributor, build_chain, podresources_pb2
from otel_ofu.attribution.podresources_pb2 import (
    ContainerDevices,
    ContainerResources,
    ListPodResourcesResponse,
    PodResources,
)
from tests.k8s_helpers import GPU0, GPU1, GPU2, MIG_A, FakeClock, FakeKubelet, S, allocation, gpu


@pytest.fixture
def link(socket_path: Path) -> Iterator[KubernetesAttributor]:
    attributor = KubernetesAttributor(socket_path=socket_path, clock=FakeClock())
    try:
        yield attributor
    finally:
        attributor.close()


def test_gpu_uuids_map_to_pod_namespace_and_container(kubelet: FakeKubelet, link: KubernetesAttributor) -> None:
    kubelet.response = ListPodResourcesResponse(
        pod_resources=[
            PodResources(name="no-gpu", namespace="kube-system", containers=[ContainerResources(name="dns")]),
            allocation("trainer-0", "ml", "nvidia.com/gpu", [GPU0, GPU1], container="pytorch"),
        ]
    )
    expected = {
        names.K8S_POD_NAME: "trainer-0",
        names.K8S_NAMESPACE_NAME: "ml",
        names.K8S_CONTAINER_NAME: "pytorch",
        names.JOB_SCHEDULER: "kubernetes",
    }
    assert link.attribute(gpu(GPU0, 0)) == expected
    assert link.attribute(gpu("GPU-" + GPU1.removeprefix("GPU-").upper(), 1)) == expected
    assert link.attribute(gpu(GPU2, 2)) == {}
    assert names.K8S_POD_UID not in link.attribute(gpu(GPU0, 0))  # v1 List carries no pod UID


def test_mig_devices_time_slicing_and_index_ids(kubelet: FakeKubelet, link: KubernetesAttributor) -> None:
    kubelet.response = ListPodResourcesResponse(
        pod_resources=[
            allocation("mig-new", "a", "nvidia.com/mig-1g.10gb", [MIG_A], container="c"),
            allocation("mig-old", "b", "nvidia.com/mig-1g.10gb", [f"MIG-{GPU1}/3/0"], container="c"),
            allocation("sliced-1", "c", "nvidia.com/gpu", [f"{GPU2}::0"], container="c"),
            allocation("sliced-2", "c", "nvidia.com/gpu", [f"{GPU2}::1"], container="c"),
            allocation("by-index", "d", "nvidia.com/gpu", ["5"], container="c"),
            allocation("not-a-gpu", "e", "example.com/fpga", ["6"], container="c"),
        ]
    )
    assert link.attribute(gpu(GPU0, 0, mig=1, mig_uuid=MIG_A))[names.K8S_POD_NAME] == "mig-new"
    assert link.attribute(gpu(GPU0, 0, mig=2)) == {}
    assert link.attribute(gpu(GPU1, 1, mig=3))[names.K8S_POD_NAME] == "mig-old"
    assert link.attribute(gpu(GPU1, 1, mig=4)) == {}
    assert link.attribute(gpu(GPU2, 2))[names.K8S_POD_NAME] == "sliced-1"  # first listed wins
    assert link.attribute(gpu("GPU-unknown", 5))[names.K8S_POD_NAME] == "by-index"
    assert link.attribute(gpu("GPU-unknown", 6)) == {}


def test_a_newer_kubelets_extra_fields_are_skipped(kubelet: FakeKubelet, link: KubernetesAttributor) -> None:
    # Field 5 of PodResources (memory) and 5 of ContainerResources (dynamic_resources) are not in our subset.
    container = ContainerResources(
        name="c", devices=[ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[GPU0])]
    )
    unknown_dynamic = b"\x2a\x04\x12\x02cl"  # field 5, length 4: DynamicResource{claim_name="cl"}
    container = ContainerResources.FromString(container.SerializeToString() + unknown_dynamic)
    unknown_memory = b"\x2a\x08\x0a\x06memory"  # field 5, length 8: ContainerMemory{memory_type="memory"}
    whole = PodResources(name="p", namespace="n", containers=[container]).SerializeToString() + unknown_memory
    kubelet.response = ListPodResourcesResponse(pod_resources=[PodResources.FromString(whole)])
    assert link.attribute(gpu(GPU0, 0))[names.K8S_POD_NAME] == "p"


def test_one_list_answers_all_gpus_until_it_is_stale(kubelet: FakeKubelet, socket_path: Path) -> None:
    clock = FakeClock()
    kubelet.response = ListPodResourcesResponse(
        pod_resources=[allocation("p", "n", "nvidia.com/gpu", [GPU0], container="c")]
    )
    attributor = KubernetesAttributor(socket_path=socket_path, reuse_s=1.0, clock=clock)
    try:
        for index, uuid in enumerate((GPU0, GPU1, GPU2)):
            attributor.attribute(gpu(uuid, index))
        assert kubelet.calls == 1
        kubelet.response = ListPodResourcesResponse()
        clock.now += 1 * S
        assert attributor.attribute(gpu(GPU0, 0)) == {}
        assert kubelet.calls == 2
    finally:
        attributor.close()


def test_a_slow_or_failing_kubelet_is_asked_once_for_all_gpus(kubelet: FakeKubelet, socket_path: Path) -> None:
    clock = FakeClock()
    kubelet.clock, kubelet.call_ns = clock, 3 * S  # each List takes longer than reuse_s
    kubelet.fail_with = grpc.StatusCode.DEADLINE_EXCEEDED
    attributor = KubernetesAttributor(socket_path=socket_path, reuse_s=1.0, clock=clock)
    try:
        for index, uuid in enumerate((GPU0, GPU1, GPU2)):
            with pytest.raises(AttributionError, match="DEADLINE_EXCEEDED"):
                attributor.attribute(gpu(uuid, index))
        assert kubelet.calls == 1
    finally:
        attributor.close()


def test_an_error_status_is_a_one_line_attribution_error_reused_until_stale(
    kubelet: FakeKubelet, socket_path: Path
) -> None:
    clock = FakeClock()
    kubelet.fail_with = grpc.StatusCode.UNAVAILABLE
    attributor = KubernetesAttributor(socket_path=socket_path, clock=clock)
    try:
        for _ in range(3):
            with pytest.raises(AttributionError, match=r"UNAVAILABLE: kubelet says no") as raised:
                attributor.attribute(gpu(GPU0, 0))
            assert "\n" not in str(raised.value)
        assert kubelet.calls == 1
        kubelet.fail_with = None
        kubelet.response = ListPodResourcesResponse(
            pod_resources=[allocation("back", "n", "nvidia.com/gpu", [GPU0], container="c")]
        )
        clock.now += 2 * S
        assert attributor.attribute(gpu(GPU0, 0))[names.K8S_POD_NAME] == "back"
    finally:
        attributor.close()


def test_no_socket_is_an_attribution_error(tmp_path: Path) -> None:
    attributor = KubernetesAttributor(socket_path=tmp_path / "absent.sock")
    with pytest.raises(AttributionError, match="does not exist"):
        attributor.attribute(gpu(GPU0, 0))
    attributor.close()


def test_chain_survives_the_kubelet_going_away(
    kubelet: FakeKubelet, socket_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    kubelet.response = ListPodResourcesResponse(
        pod_resources=[allocation("p", "n", "nvidia.com/gpu", [GPU0], container="c")]
    )
    chain = build_chain(kubelet_socket=socket_path, static_job_id="node-job", clock=clock)
    try:
        assert chain.attribute(gpu(GPU0, 0)) == {
            names.K8S_POD_NAME: "p",
            names.K8S_NAMESPACE_NAME: "n",
            names.K8S_CONTAINER_NAME: "c",
            names.JOB_ID: "node-job",
            names.JOB_SCHEDULER: "static",
        }
        kubelet.fail_with = grpc.StatusCode.UNAVAILABLE
        clock.now += 31 * S
        with caplog.at_level(logging.WARNING, logger="otel_ofu.attribution"):
            assert chain.attribute(gpu(GPU0, 0)) == {names.JOB_ID: "node-job", names.JOB_SCHEDULER: "static"}
        assert "kubernetes" in caplog.text
        assert "UNAVAILABLE" in caplog.text
    finally:
        chain.close()


def test_the_committed_code_matches_the_proto(tmp_path: Path, require: Callable[[bool, str], None]) -> None:
    try:
        from grpc_tools import protoc  # type: ignore[import-untyped]  # noqa: F401
    except ImportError:
        available = False
    else:
        available = True
    require(available, "grpcio-tools is not installed (dev extra)")
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "descriptor.pb"
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I", str(root), f"--descriptor_set_out={out}",
         "otel_ofu/attribution/podresources.proto"],
        check=True,
    )  # fmt: skip
    fresh = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    for message in fresh.message_type:
        for field in message.field:
            field.ClearField("json_name")  # protoc adds it to descriptor sets, not to generated code
    committed = descriptor_pb2.FileDescriptorProto.FromString(podresources_pb2.DESCRIPTOR.serialized_pb)
    assert fresh == committed
    assert podresources_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"].methods_by_name["List"].full_name == (
        "v1.PodResourcesLister.List"
    )
