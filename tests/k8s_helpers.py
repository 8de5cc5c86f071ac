"""What the Kubernetes attribution tests share: GPU ids, a hand clock, a fake kubelet and its allocations.

The fixtures that serve the fake kubelet on a unix socket are in tests/conftest.py.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import grpc

from otel_ofu import names
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


@attrs.define
class FakeClock:
    """Nanoseconds that move only when a test sets ``now``."""

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


def allocation(
    name: str, namespace: str, resource: str, device_ids: Sequence[str], container: str = "trainer"
) -> PodResources:
    """A pod as PodResources lists it: one container holding ``device_ids`` of ``resource``."""
    devices = ContainerDevices(resource_name=resource, device_ids=list(device_ids))
    return PodResources(
        name=name, namespace=namespace, containers=[ContainerResources(name=container, devices=[devices])]
    )


def gpu(uuid: str, index: int, *, mig: int | None = None, mig_uuid: str | None = None) -> GpuIdentity:
    hints = {} if mig_uuid is None else {names.HINT_MIG_UUID: mig_uuid}
    return GpuIdentity(
        uuid=uuid, model="NVIDIA H100 80GB HBM3", index=index, host="node-a", mig_instance_id=mig, hints=hints
    )
