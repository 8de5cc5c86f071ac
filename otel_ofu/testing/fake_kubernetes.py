"""Fakes of the Kubernetes parts the attribution reads: an API server (real HTTP(S) on 127.0.0.1) serving
``v1.PodList`` JSON, and pods shaped as the workload controllers label them. TLS comes from ``otel_ofu.testing.pki``.

Pod JSON follows the Kubernetes API schema (k8s.io/api core/v1 ``Pod``, ``PodList``; apimachinery
meta/v1 ``ObjectMeta``, ``OwnerReference``): ``metadata.{name,namespace,uid,labels,ownerReferences}``,
``spec.{nodeName,containers[].resources.limits}``, ``status.phase``. The labels are those each controller
writes (see otel_ofu/attribution/kubernetes_pods.py for where each key is defined upstream).
"""

from __future__ import annotations

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


@attrs.define
class FakeApiServer:
    """Serves GET /api/v1/pods (honouring fieldSelector=spec.nodeName=...) and the kubelet's GET /pods."""

    pods: list[dict[str, Any]] = attrs.field(factory=list)
    token: str | None = None  # when set, requests must carry 'Authorization: Bearer <token>'
    kubelet_node: str = "node-a"  # the node the /pods endpoint belongs to
    status: int = 200
    requests: list[tuple[str, str | None]] = attrs.field(factory=list)  # (path with query, Authorization)
    url: str = ""

    def answer(self, path: str, authorization: str | None) -> tuple[int, dict[str, Any]]:
        self.requests.append((path, authorization))
        if self.token is not None and authorization != f"Bearer {self.token}":
            unauthorized = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Unauthorized"}
            return 401, {**unauthorized, "code": 401}
        if self.status != 200:
            return self.status, {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "message": 'pods is forbidden: User "system:serviceaccount:x:y" cannot list resource "pods"',
                "reason": "Forbidden",
                "code": self.status,
            }
        parsed = urllib.parse.urlsplit(path)
        if parsed.path == "/pods":
            node: str | None = self.kubelet_node
        elif parsed.path == "/api/v1/pods":
            selector = urllib.parse.parse_qs(parsed.query).get("fieldSelector", [""])[0]
            node = selector.removeprefix("spec.nodeName=") if selector.startswith("spec.nodeName=") else None
        else:
            return 404, {"kind": "Status", "code": 404}
        items = [item for item in self.pods if node is None or item["spec"]["nodeName"] == node]
        return 200, pod_list(items)


@contextmanager
def serve(api: FakeApiServer, tls: Pki | None = None) -> Iterator[FakeApiServer]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            code, body = api.answer(self.path, self.headers.get("Authorization"))
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

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
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()
