"""The Kubernetes link against a real gRPC PodResources server on a unix socket."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from pathlib import Path

import attrs
import grpc
import pytest
from google.protobuf import descriptor_pb2

from otel_ofu import names
from otel_ofu.attribution import AttributionError, KubernetesAttributor, build_chain, podresources_pb2
from otel_ofu.attribution import podresources_pb2_grpc as pb_grpc
from otel_ofu.attribution.podresources_pb2 import (
    ContainerDevices,
    ContainerResources,
    ListPodResourcesRequest,
    ListPodResourcesResponse,
    PodResources,
)
from otel_ofu.model import GpuIdentity

GPU0 = "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52"
GPU1 = "GPU-1b2c3d4e-0000-1111-2222-333344445555"
GPU2 = "GPU-99999999-8888-7777-6666-555544443333"
MIG_A = "MIG-5a8cdc4a-0e6b-5f39-8e5c-5d52d8ec4a2f"
S = 1_000_000_000


def gpu(uuid: str, index: int, *, mig: int | None = None, mig_uuid: str | None = None) -> GpuIdentity:
    hints = {} if mig_uuid is None else {names.HINT_MIG_UUID: mig_uuid}
    return GpuIdentity(
        uuid=uuid, model="NVIDIA H100 80GB HBM3", index=index, host="n", mig_instance_id=mig, hints=hints
    )


def pod(name: str, namespace: str, container: str, resource: str, device_ids: Sequence[str]) -> PodResources:
    devices = ContainerDevices(resource_name=resource, device_ids=list(device_ids))
    return PodResources(
        name=name, namespace=namespace, containers=[ContainerResources(name=container, devices=[devices])]
    )


@attrs.define
class FakeClock:
    now: int = 0

    def __call__(self) -> int:
        return self.now


@attrs.define
class FakeKubelet(pb_grpc.PodResourcesListerServicer):
    """Answers List with whatever the test set; can fail on demand."""

    response: ListPodResourcesResponse = attrs.field(factory=ListPodResourcesResponse)
    fail_with: grpc.StatusCode | None = None
    calls: int = 0
    # A slow kubelet: each call moves this clock on by call_ns.
    clock: FakeClock | None = None
    call_ns: int = 0

    def List(self, request: ListPodResourcesRequest, context: grpc.ServicerContext) -> ListPodResourcesResponse:  # noqa: N802
        self.calls += 1
        if self.clock is not None:
            self.clock.now += self.call_ns
        if self.fail_with is not None:
            context.abort(self.fail_with, "kubelet says no")
        return self.response


@pytest.fixture
def socket_path(tmp_path: Path) -> Iterator[Path]:
    # AF_UNIX paths are limited to 107 bytes; pytest's tmp_path can be longer than that.
    if len(str(tmp_path / "kubelet.sock")) < 100:
        yield tmp_path / "kubelet.sock"
        return
    short = Path(tempfile.mkdtemp(prefix="ofu-k8s-"))
    try:
        yield short / "kubelet.sock"
    finally:
        shutil.rmtree(short, ignore_errors=True)


@pytest.fixture
def kubelet(socket_path: Path) -> Iterator[FakeKubelet]:
    fake = FakeKubelet()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_PodResourcesListerServicer_to_server(fake, server)
    server.add_insecure_port(f"unix://{socket_path}")
    server.start()
    try:
        yield fake
    finally:
        server.stop(grace=None).wait()


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
            pod("trainer-0", "ml", "pytorch", "nvidia.com/gpu", [GPU0, GPU1]),
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
            pod("mig-new", "a", "c", "nvidia.com/mig-1g.10gb", [MIG_A]),
            pod("mig-old", "b", "c", "nvidia.com/mig-1g.10gb", [f"MIG-{GPU1}/3/0"]),
            pod("sliced-1", "c", "c", "nvidia.com/gpu", [f"{GPU2}::0"]),
            pod("sliced-2", "c", "c", "nvidia.com/gpu", [f"{GPU2}::1"]),
            pod("by-index", "d", "c", "nvidia.com/gpu", ["5"]),
            pod("not-a-gpu", "e", "c", "example.com/fpga", ["6"]),
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
    kubelet.response = ListPodResourcesResponse(pod_resources=[pod("p", "n", "c", "nvidia.com/gpu", [GPU0])])
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
        kubelet.response = ListPodResourcesResponse(pod_resources=[pod("back", "n", "c", "nvidia.com/gpu", [GPU0])])
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
    kubelet.response = ListPodResourcesResponse(pod_resources=[pod("p", "n", "c", "nvidia.com/gpu", [GPU0])])
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
