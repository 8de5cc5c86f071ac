"""Fakes of the Kubernetes parts the attribution reads: an API server (real HTTP(S) on 127.0.0.1) serving
``v1.PodList`` JSON, and pods shaped as the workload controllers label them. TLS comes from ``otel_ofu.testing.pki``.
The server can also misbehave (``Fault``: drip, silent, slow; a raw ``body``), for the tests of a pods server
that must never stall the producer and for chaos tests.

Pod JSON follows the Kubernetes API schema (k8s.io/api core/v1 ``Pod``, ``PodList``; apimachinery
meta/v1 ``ObjectMeta``, ``OwnerReference``): ``metadata.{name,namespace,uid,labels,ownerReferences}``,
``spec.{nodeName,containers[].resources.limits}``, ``status.phase``. The labels are those each controller
writes (see otel_ofu/attribution/kubernetes_pods.py for where each key is defined upstream).
"""

from __future__ import annotations

import enum
import http
import http.server
import json
import ssl
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import attrs

from otel_ofu.testing.pki import Pki


def owner(api_version: str, kind: str, name: str, uid: str, *, controller: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": controller,
        "blockOwnerDeletion": True,
    }


def pod(
    name: str,
    namespace: str,
    *,
    node: str = "node-a",
    uid: str | None = None,
    labels: dict[str, str] | None = None,
    owners: list[dict[str, Any]] | None = None,
    gpus: int = 1,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": uid or f"uid-{namespace}-{name}",
        "resourceVersion": "4751",
        "creationTimestamp": "2026-11-30T17:53:53Z",
    }
    if labels:
        metadata["labels"] = labels
    if owners:
        metadata["ownerReferences"] = owners
    return {
        "metadata": metadata,
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": "trainer", "image": "trainer:1", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
            ],
        },
        "status": {"phase": "Running"},
    }


def jobset_pod(
    jobset: str, replicated_job: str, job_index: int, pod_index: int, namespace: str = "ml", **kwargs: Any
) -> dict[str, Any]:
    """A pod of a JobSet's child Job: the JobSet's labels plus the Job controller's own."""
    job = f"{jobset}-{replicated_job}-{job_index}"
    job_uid = f"job-uid-{job}"
    labels = {
        "jobset.sigs.k8s.io/jobset-name": jobset,
        "jobset.sigs.k8s.io/jobset-uid": f"jobset-uid-{jobset}",
        "jobset.sigs.k8s.io/replicatedjob-name": replicated_job,
        "jobset.sigs.k8s.io/job-index": str(job_index),
        "batch.kubernetes.io/job-name": job,
        "batch.kubernetes.io/controller-uid": job_uid,
        "job-name": job,
        "controller-uid": job_uid,
        "batch.kubernetes.io/job-completion-index": str(pod_index),
    }
    return pod(
        f"{job}-{pod_index}-x7k2p",
        namespace,
        labels=labels,
        owners=[owner("batch/v1", "Job", job, job_uid)],
        **kwargs,
    )


def pod_list(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "9001"}, "items": items}


def metadata_list(items: list[dict[str, Any]]) -> dict[str, Any]:
    """What the API server answers a list asked for as ``PartialObjectMetadataList``: the items' metadata only."""
    partial = [
        {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": item["metadata"]}
        for item in items
    ]
    return {
        "kind": "PartialObjectMetadataList",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": "9001"},
        "items": partial,
    }


def ray_cluster(
    name: str, namespace: str, *, labels: dict[str, str] | None = None, owners: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A KubeRay ``RayCluster`` object (ray.io/v1), its metadata as the RayJob controller writes it."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-rc-{name}"}
    if labels:
        metadata["labels"] = labels
    if owners:
        metadata["ownerReferences"] = owners
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": metadata, "spec": {"rayVersion": "2.9.0"}}


class Fault(enum.Enum):
    """How a misbehaving pods server answers (a pod list or any other GET)."""

    NONE = "none"
    DRIP = "drip"  # the whole answer, status line and headers included, one byte every ``drip_s``
    SILENT = "silent"  # accepts the connection, reads the request and never answers
    SLOW = "slow"  # answers in full after ``delay_s``


@attrs.define
class FakeApiServer:
    """Serves GET /api/v1/pods (honouring fieldSelector=spec.nodeName=... and a metadata-only Accept),
    the kubelet's GET /pods, and GET /apis/ray.io/<version>/namespaces/<ns>/rayclusters/<name>.

    ``fault`` makes it misbehave (``Fault``); ``body`` replaces a 200 pod list's body with raw bytes
    (deeply nested JSON, a huge answer). ``in_flight`` and ``answered`` count requests being and done
    being answered, so tests can see that a lookup is still held by the server.
    """

    pods: list[dict[str, Any]] = attrs.field(factory=list)
    ray_clusters: list[dict[str, Any]] = attrs.field(factory=list)
    token: str | None = None  # when set, requests must carry 'Authorization: Bearer <token>'
    kubelet_node: str = "node-a"  # the node the /pods endpoint belongs to
    status: int = 200
    ray_status: int = 200  # the RayCluster GETs' own status (403: the ClusterRole lacks rayclusters)
    fault: Fault = Fault.NONE
    drip_s: float = 2.0
    delay_s: float = 5.0
    body: bytes | None = None
    requests: list[tuple[str, str | None]] = attrs.field(factory=list)  # (path with query, Authorization)
    accepts: list[str] = attrs.field(factory=list)  # each request's Accept header
    in_flight: int = 0
    answered: int = 0
    url: str = ""
    closing: threading.Event = attrs.field(factory=threading.Event)
    _lock: threading.Lock = attrs.field(factory=threading.Lock)

    def answer(self, path: str, authorization: str | None, accept: str = "") -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.requests.append((path, authorization))
            self.accepts.append(accept)
        if self.token is not None and authorization != f"Bearer {self.token}":
            unauthorized = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Unauthorized"}
            return 401, {**unauthorized, "code": 401}
        parsed = urllib.parse.urlsplit(path)
        parts = parsed.path.strip("/").split("/")
        if (
            len(parts) == 7
            and parts[:2] == ["apis", "ray.io"]
            and parts[3] == "namespaces"
            and parts[5] == "rayclusters"
        ):
            return self._ray_cluster(parts[4], parts[6])
        if self.status != 200:
            return self.status, _forbidden("pods", self.status)
        if parsed.path == "/pods":
            node: str | None = self.kubelet_node
        elif parsed.path == "/api/v1/pods":
            selector = urllib.parse.parse_qs(parsed.query).get("fieldSelector", [""])[0]
            node = selector.removeprefix("spec.nodeName=") if selector.startswith("spec.nodeName=") else None
        else:
            return 404, {"kind": "Status", "code": 404}
        items = [item for item in self.pods if node is None or item["spec"]["nodeName"] == node]
        # The API server honours a metadata-only Accept; the kubelet's /pods always sends the full PodList.
        if parsed.path != "/pods" and "as=PartialObjectMetadataList" in accept:
            return 200, metadata_list(items)
        return 200, pod_list(items)

    def _ray_cluster(self, namespace: str, name: str) -> tuple[int, dict[str, Any]]:
        if self.ray_status != 200:
            return self.ray_status, _forbidden("rayclusters.ray.io", self.ray_status)
        for cluster in self.ray_clusters:
            if (cluster["metadata"]["namespace"], cluster["metadata"]["name"]) == (namespace, name):
                return 200, cluster
        return 404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}


def _forbidden(resource: str, code: int) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": f'{resource} is forbidden: User "system:serviceaccount:x:y" cannot list resource "{resource}"',
        "reason": "Forbidden",
        "code": code,
    }


@contextmanager
def serve(api: FakeApiServer, tls: Pki | None = None) -> Iterator[FakeApiServer]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            code, document = api.answer(self.path, self.headers.get("Authorization"), self.headers.get("Accept", ""))
            data = api.body if code == 200 and api.body is not None and "/rayclusters/" not in self.path else None
            if data is None:
                data = json.dumps(document).encode()
            head = (
                f"HTTP/1.1 {code} {http.HTTPStatus(code).phrase}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
            ).encode()
            with api._lock:
                api.in_flight += 1
            try:
                self._send(head, data)
            except OSError:
                pass  # the client gave up (its deadline): nothing more to send
            finally:
                with api._lock:
                    api.in_flight -= 1
                    api.answered += 1
            self.close_connection = True

        def _send(self, head: bytes, data: bytes) -> None:
            if api.fault is Fault.SILENT:
                api.closing.wait()
                return
            if api.fault is Fault.SLOW and api.closing.wait(api.delay_s):
                return
            if api.fault is not Fault.DRIP:
                self.wfile.write(head)
                self.wfile.write(data)
                return
            answer = head + data
            for index in range(len(answer)):
                if api.closing.wait(api.drip_s if index else 0):
                    return
                self.wfile.write(answer[index : index + 1])
                self.wfile.flush()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    scheme = "http"
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(tls.server_cert), str(tls.server_key))
        server.socket = context.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    api.url = f"{scheme}://127.0.0.1:{server.server_address[1]}"
    api.closing.clear()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield api
    finally:
        api.closing.set()  # ends every drip and silence, so that the handler threads can be joined
        server.shutdown()
        server.server_close()
