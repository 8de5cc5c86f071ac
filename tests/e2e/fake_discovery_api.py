"""A Kubernetes API server just real enough for Prometheus' ``endpointslice`` service discovery (client-go informers),
on 127.0.0.1: the EndpointSlices, Services and Pods of namespaces, by list, by watch, and by watch-list.

client-go (v0.37, inside the Collector's Prometheus receiver) lists and watches each kind of a namespace; with its
``WatchListClient`` feature (on by default since 1.35) it asks for a watch with ``sendInitialEvents=true`` and reads
the objects as ADDED events until a BOOKMARK annotated ``k8s.io/initial-events-end``. Objects are JSON
(``kind``/``apiVersion`` set, as the API server writes them), whatever content type the client prefers; a watch stays
open (chunked) until its ``timeoutSeconds`` or the server's close. Shapes per the Kubernetes API: core/v1 ``Pod``,
``Service``, discovery.k8s.io/v1 ``EndpointSlice`` (``kubernetes.io/service-name`` label, endpoints with addresses,
``nodeName`` and ``targetRef``, named ports).
"""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
import urllib.parse
from collections.abc import Iterator
from typing import Any

import attrs

RESOURCE_VERSION = "1000"
INITIAL_EVENTS_END = "k8s.io/initial-events-end"
_KINDS = {
    "pods": ("Pod", "v1"),
    "services": ("Service", "v1"),
    "endpointslices": ("EndpointSlice", "discovery.k8s.io/v1"),
}


def dcgm_exporter_objects(
    namespace: str, service: str, port_name: str, address: str, port: int, node: str
) -> dict[str, list[dict[str, Any]]]:
    """The GPU Operator's dcgm-exporter as the API server shows it: its Service, one pod on ``node`` and the
    EndpointSlice that points the Service's port at the pod's ``address``:``port``."""
    pod_name = f"{service}-x7k2p"
    labels = {"app": service}
    pod = {
        "metadata": {"name": pod_name, "namespace": namespace, "uid": "uid-pod-1", "labels": labels},
        "spec": {
            "nodeName": node,
            "containers": [{"name": service, "ports": [{"name": port_name, "containerPort": port, "protocol": "TCP"}]}],
        },
        "status": {"phase": "Running", "podIP": address, "hostIP": address},
    }
    svc = {
        "metadata": {"name": service, "namespace": namespace, "uid": "uid-service-1", "labels": labels},
        "spec": {
            "selector": labels,
            "ports": [{"name": port_name, "port": 9400, "targetPort": port, "protocol": "TCP"}],
            "type": "ClusterIP",
            "clusterIP": "10.96.0.42",
        },
    }
    endpoints = {
        "metadata": {
            "name": f"{service}-abcde",
            "namespace": namespace,
            "uid": "uid-slice-1",
            "labels": {"kubernetes.io/service-name": service, "endpointslice.kubernetes.io/managed-by": "test"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": service, "uid": "uid-service-1"}],
        },
        "addressType": "IPv4",
        "endpoints": [
            {
                "addresses": [address],
                "conditions": {"ready": True, "serving": True, "terminating": False},
                "nodeName": node,
                "targetRef": {"kind": "Pod", "name": pod_name, "namespace": namespace, "uid": "uid-pod-1"},
            }
        ],
        "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
    }
    return {"pods": [pod], "services": [svc], "endpointslices": [endpoints]}


@attrs.define
class DiscoveryApi:
    """Objects by namespace and resource (``pods``, ``services``, ``endpointslices``); what was asked, in order."""

    objects: dict[str, dict[str, list[dict[str, Any]]]] = attrs.field(factory=dict)
    requests: list[str] = attrs.field(factory=list)
    url: str = ""
    closing: threading.Event = attrs.field(factory=threading.Event)

    def items(self, namespace: str, resource: str) -> list[dict[str, Any]]:
        kind, api_version = _KINDS[resource]
        found = []
        for item in self.objects.get(namespace, {}).get(resource, []):
            metadata = {**item["metadata"], "resourceVersion": RESOURCE_VERSION}
            found.append({"kind": kind, "apiVersion": api_version, **item, "metadata": metadata})
        return found


def _route(path: str) -> tuple[str, str] | None:
    """(namespace, resource) of a namespaced list or watch path, else None."""
    parts = path.strip("/").split("/")
    if len(parts) == 5 and parts[:2] == ["api", "v1"] and parts[2] == "namespaces" and parts[4] in ("pods", "services"):
        return parts[3], parts[4]
    if len(parts) == 6 and parts[:3] == ["apis", "discovery.k8s.io", "v1"] and parts[5] == "endpointslices":
        return parts[4], parts[5]
    return None


@contextlib.contextmanager
def serve(api: DiscoveryApi) -> Iterator[DiscoveryApi]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            api.requests.append(self.path)
            parsed = urllib.parse.urlsplit(self.path)
            query = urllib.parse.parse_qs(parsed.query)
            route = _route(parsed.path)
            if route is None:
                self._json(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404})
                return
            namespace, resource = route
            items = api.items(namespace, resource)
            if query.get("watch", ["false"])[0] in ("true", "1"):
                self._watch(resource, items if query.get("sendInitialEvents") == ["true"] else None, query)
                return
            kind, api_version = _KINDS[resource]
            listing = {
                "kind": f"{kind}List",
                "apiVersion": api_version,
                "metadata": {"resourceVersion": RESOURCE_VERSION},
            }
            self._json(200, {**listing, "items": items})

        def _json(self, code: int, document: dict[str, Any]) -> None:
            data = json.dumps(document).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _chunk(self, event: dict[str, Any]) -> None:
            data = json.dumps(event).encode() + b"\n"
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def _watch(self, resource: str, initial: list[dict[str, Any]] | None, query: dict[str, list[str]]) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                if initial is not None:  # watch-list: the objects as ADDED, then the bookmark that ends them
                    for item in initial:
                        self._chunk({"type": "ADDED", "object": item})
                    kind, api_version = _KINDS[resource]
                    bookmark = {
                        "kind": kind,
                        "apiVersion": api_version,
                        "metadata": {"resourceVersion": RESOURCE_VERSION, "annotations": {INITIAL_EVENTS_END: "true"}},
                    }
                    self._chunk({"type": "BOOKMARK", "object": bookmark})
                api.closing.wait(float(query.get("timeoutSeconds", ["30"])[0]))
                self.wfile.write(b"0\r\n\r\n")
            except OSError:
                pass  # the client went away
            self.close_connection = True

        def log_message(self, *_: object) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    api.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield api
    finally:
        api.closing.set()
        server.shutdown()
        server.server_close()
