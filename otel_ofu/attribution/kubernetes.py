"""Pods from the kubelet's PodResources API: which pod, namespace and container holds each GPU.

``v1.PodResourcesLister/List`` on the kubelet's unix socket lists every container's allocated devices.
The NVIDIA device plugin names them by GPU UUID (``GPU-...``), MIG UUID (``MIG-...``, or the old
``MIG-GPU-<uuid>/<gi>/<ci>``), with a ``::<n>`` replica suffix under time-slicing, or by index when it
runs with ``deviceIDStrategy=index``. Where several pods share a GPU (time-slicing), the first listed
gives the ``k8s.*`` attributes.

PodResources gives no pod UID and no job. With a ``PodDirectory`` (the node's pods from the API server
or the kubelet, ``kubernetes_pods``), the pod's UID and its job (from its workload's standard labels and
owners) are added: ``job.id`` ``<namespace>/<workload>``, ``job.name``, ``job.scheduler=kubernetes``.
Pods of different jobs sharing one GPU leave its job unknown. When the pod list cannot be had, the
pod attributes still come, without the job.

One List answers for every GPU of the node, so a result is reused for ``reuse_s`` while the chain
refreshes the GPUs one by one.

The messages are our own subset of k8s.io/kubelet/pkg/apis/podresources/v1/api.proto (same field
numbers; fields we do not declare are skipped as unknown), in ``podresources.proto``. The committed
``podresources_pb2*.py`` are generated with an old protoc on purpose: code from protoc 25 carries no
runtime version check, so it loads with every protobuf (>=5.26) and grpcio this package allows, while
newer generators pin the runtime to at least their own version. Regenerate from the repository root:

    python3 -m venv /tmp/protoc-venv
    /tmp/protoc-venv/bin/pip install grpcio-tools==1.62.3 mypy-protobuf==3.6.0
    PATH=/tmp/protoc-venv/bin:$PATH /tmp/protoc-venv/bin/python -m grpc_tools.protoc -I . \\
        --python_out=. --pyi_out=. --grpc_python_out=. --mypy_grpc_out=. \\
        otel_ofu/attribution/podresources.proto

tests/test_kubernetes_attribution.py checks that the committed descriptor matches the .proto.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Mapping
from typing import Any, Final

import attrs
import grpc

from otel_ofu import names
from otel_ofu.attribution import podresources_pb2, podresources_pb2_grpc
from otel_ofu.attribution.base import AttributionError
from otel_ofu.attribution.kubernetes_pods import PodDirectory, PodEntry, shared_workload
from otel_ofu.model import Clock, GpuIdentity

log = logging.getLogger(__name__)

LINK_NAME: Final = "kubernetes"
DEFAULT_KUBELET_SOCKET: Final = "/var/lib/kubelet/pod-resources/kubelet.sock"
# The kubelet's own PodResources client allows 16 MiB; a dense node's answer can pass gRPC's 4 MiB default.
MAX_MESSAGE_BYTES: Final = 16 * 1024 * 1024
# Index-style device ids ("0") are only trusted for NVIDIA's resources; other plugins number their own devices.
NVIDIA_RESOURCE_PREFIX: Final = "nvidia.com/"

_LEGACY_MIG = re.compile(r"^MIG-(GPU-[0-9a-fA-F-]+)/(\d+)/(\d+)$")
_REPLICA_SUFFIX = re.compile(r"::\d+$")


@attrs.frozen
class PodContainer:
    """Where a device is allocated."""

    pod: str
    namespace: str
    container: str

    def attributes(self) -> dict[str, str]:
        attributes = {names.JOB_SCHEDULER: "kubernetes"}
        if self.pod:
            attributes[names.K8S_POD_NAME] = self.pod
        if self.namespace:
            attributes[names.K8S_NAMESPACE_NAME] = self.namespace
        if self.container:
            attributes[names.K8S_CONTAINER_NAME] = self.container
        return attributes


Owners = tuple[PodContainer, ...]  # every pod holding a device, in listing order


@attrs.frozen
class DeviceOwners:
    """A List answer indexed the ways a GPU can be looked up."""

    by_id: Mapping[str, Owners]  # lower-case GPU or MIG UUID
    by_legacy_mig: Mapping[tuple[str, int], Owners]  # (lower-case GPU UUID, GPU instance id)
    by_index: Mapping[int, Owners]  # whole GPUs under deviceIDStrategy=index

    def owners_of(self, gpu: GpuIdentity) -> Owners:
        """The pods holding ``gpu``, first listed first; empty when none does."""
        if gpu.mig_instance_id is not None:
            mig_uuid = gpu.hints.get(names.HINT_MIG_UUID)
            if mig_uuid and (owners := self.by_id.get(mig_uuid.lower())):
                return owners
            if owners := self.by_legacy_mig.get((gpu.uuid.lower(), gpu.mig_instance_id)):
                return owners
        # A whole-GPU allocation also owns every MIG instance on it.
        if owners := self.by_id.get(gpu.uuid.lower()):
            return owners
        return self.by_index.get(gpu.index, ())


def _add(index: dict[Any, list[PodContainer]], key: object, owner: PodContainer) -> None:
    owners = index.setdefault(key, [])
    if owner not in owners:
        owners.append(owner)


def index_devices(response: podresources_pb2.ListPodResourcesResponse) -> DeviceOwners:
    """Index every allocated device of a List answer, keeping every pod that holds it, in listing order."""
    by_id: dict[Any, list[PodContainer]] = {}
    by_legacy_mig: dict[Any, list[PodContainer]] = {}
    by_index: dict[Any, list[PodContainer]] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            owner = PodContainer(pod=pod.name, namespace=pod.namespace, container=container.name)
            for devices in container.devices:
                nvidia = devices.resource_name.startswith(NVIDIA_RESOURCE_PREFIX)
                for raw_id in devices.device_ids:
                    device_id = _REPLICA_SUFFIX.sub("", raw_id.strip())
                    if nvidia and device_id.isdigit():
                        _add(by_index, int(device_id), owner)
                        continue
                    _add(by_id, device_id.lower(), owner)
                    if (legacy := _LEGACY_MIG.match(device_id)) is not None:
                        _add(by_legacy_mig, (legacy.group(1).lower(), int(legacy.group(2))), owner)

    def frozen(index: dict[Any, list[PodContainer]]) -> dict[Any, Owners]:
        return {key: tuple(owners) for key, owners in index.items()}

    return DeviceOwners(by_id=frozen(by_id), by_legacy_mig=frozen(by_legacy_mig), by_index=frozen(by_index))


def _path_text(path: str | os.PathLike[str]) -> str:
    return os.fspath(path)


def _named_pod(gpu: GpuIdentity) -> Owners:
    """The pod the source itself names for the GPU (dcgm-exporter's pod labels), as PodResources would list it."""
    pod, namespace = gpu.hints.get(names.K8S_POD_NAME), gpu.hints.get(names.K8S_NAMESPACE_NAME)
    if not pod or not namespace:
        return ()
    return (PodContainer(pod=pod, namespace=namespace, container=gpu.hints.get(names.K8S_CONTAINER_NAME, "")),)


@attrs.define
class KubernetesAttributor:
    """Attributes GPUs to pods through the kubelet PodResources API on its unix socket."""

    # None: no kubelet socket; the pods are the ones the source names in the GPU's hints (dcgm-exporter's pod
    # labels), and ``pods`` gives their jobs.
    socket_path: str | None = attrs.field(
        default=DEFAULT_KUBELET_SOCKET, converter=attrs.converters.optional(_path_text)
    )
    timeout_s: float = 2.0
    reuse_s: float = 1.0
    clock: Clock = time.monotonic_ns
    # The node's pods (API server or kubelet) for the pod UID and job; None: pod attributes only. The
    # link owns it: closing the link stops its refresher.
    pods: PodDirectory | None = None
    name: str = attrs.field(default=LINK_NAME, init=False)
    _channel: grpc.Channel | None = attrs.field(default=None, init=False, repr=False)
    _owners: DeviceOwners | None = attrs.field(default=None, init=False, repr=False)
    _failure: AttributionError | None = attrs.field(default=None, init=False, repr=False)
    _listed_ns: int | None = attrs.field(default=None, init=False, repr=False)

    def attribute(self, gpu: GpuIdentity) -> Mapping[str, str]:
        owners = self._current_owners().owners_of(gpu) if self.socket_path is not None else _named_pod(gpu)
        if not owners:
            return {}
        attributes = owners[0].attributes()
        if self.pods is None:
            return attributes
        try:
            entries = [self.pods.get(owner.namespace, owner.pod) for owner in owners]
        except AttributionError as error:
            # Logged by the directory when the list fails; the pod attributes still hold.
            log.debug("GPU %s: no pod metadata (%s), job unknown", gpu.key, error)
            return attributes
        first: PodEntry | None = entries[0]
        if first is not None and first.uid:
            attributes[names.K8S_POD_UID] = first.uid
        workload = shared_workload(entries)
        if workload is not None:
            attributes.update(workload.attributes())
        return attributes

    def list_pod_resources(self) -> podresources_pb2.ListPodResourcesResponse:
        """One List call; a clear one-line AttributionError when the kubelet does not answer."""
        if self.socket_path is None:
            raise AttributionError("no kubelet PodResources socket configured")
        if not os.path.exists(self.socket_path):
            raise AttributionError(f"kubelet PodResources socket {self.socket_path} does not exist")
        stub = podresources_pb2_grpc.PodResourcesListerStub(self._open_channel())
        try:
            return stub.List(podresources_pb2.ListPodResourcesRequest(), timeout=self.timeout_s)
        except grpc.RpcError as error:
            code = error.code() if isinstance(error, grpc.Call) else None
            details = (error.details() if isinstance(error, grpc.Call) else str(error)) or ""
            status = code.name if code is not None else "error"
            first_line = details.splitlines()[0] if details else ""
            raise AttributionError(f"kubelet PodResources List at {self.socket_path}: {status}: {first_line}") from None

    @property
    def generation(self) -> int:
        """Changes when the pod list does: the chain then asks again without waiting its refresh period."""
        return 0 if self.pods is None else self.pods.generation

    def close(self) -> None:
        if self.pods is not None:
            self.pods.close()
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def _current_owners(self) -> DeviceOwners:
        now = self.clock()
        fresh = self._listed_ns is not None and 0 <= now - self._listed_ns < self.reuse_s * 1e9
        if not fresh:
            # A failure is reused like an answer, and both age from when the call ended: a hung kubelet
            # costs one timeout per reuse_s, not one per GPU.
            self._owners, self._failure = None, None
            try:
                self._owners = index_devices(self.list_pod_resources())
            except AttributionError as error:
                self._failure = error
            self._listed_ns = self.clock()
        if self._failure is not None:
            raise AttributionError(str(self._failure))
        assert self._owners is not None
        return self._owners

    def _open_channel(self) -> grpc.Channel:
        assert self.socket_path is not None  # list_pod_resources checked it
        if self._channel is None:
            self._channel = grpc.insecure_channel(
                "unix://" + os.path.abspath(self.socket_path),
                options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)],
            )
        return self._channel
