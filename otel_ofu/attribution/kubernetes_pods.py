"""The node's pods and the job of each, looked up in the background, never on the sampling path.

PodResources says which pod holds a GPU; this module says which job that pod belongs to, with no change
to the pod: the labels and ``ownerReferences`` that the workload controllers write (the rules and their
sources are in ``kubernetes_workloads``). They are read from the node's own pods, listed by the API server
(``/api/v1/pods?fieldSelector=spec.nodeName=N``, asked for metadata only: a ``PartialObjectMetadataList``)
or by the kubelet (``/pods``, a full ``v1.PodList``).

``PodDirectory`` keeps the last good list as a small index (per pod only its UID and its workload) and
refreshes it on a thread of its own: sampling reads the index and never waits on the network. Each lookup
has an overall deadline (``kubernetes_http``); one that fails, however it fails (unreachable, refused, a
server that drips or never answers, an answer too large or nested too deeply to decode), is counted,
logged with the age of the list kept, and retried after a backoff. ``close`` cuts a lookup in flight.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import threading
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final

import attrs
import msgspec

from otel_ofu.attribution import kubernetes_http
from otel_ofu.attribution.base import AttributionError
from otel_ofu.attribution.kubernetes_workloads import (
    SCHEDULER,
    ObjectMeta,
    Workload,
    kubernetes_job_id,
    ray_cluster_api_version,
    root_of_ray_cluster,
    workload_of,
)
from otel_ofu.model import Clock

__all__ = [
    "SCHEDULER",
    "PodDirectory",
    "PodEntry",
    "Workload",
    "in_cluster_api_url",
    "kubernetes_job_id",
    "parse_pod_list",
    "pods_url",
    "resolve_pods_url",
    "shared_workload",
]

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR: Final = "/var/run/secrets/kubernetes.io/serviceaccount"
DEFAULT_TOKEN_FILE: Final = f"{SERVICE_ACCOUNT_DIR}/token"
DEFAULT_CA_FILE: Final = f"{SERVICE_ACCOUNT_DIR}/ca.crt"
# A node's pod list is a few MiB at most (110 pods by default, a few hundred on dense nodes); a
# pathological answer must not eat the producer's memory.
MAX_RESPONSE_BYTES: Final = 64 * 1024 * 1024
MAX_OBJECT_BYTES: Final = 4 * 1024 * 1024  # one RayCluster's metadata
LOOKUP_DEADLINE_S: Final = 10.0  # connect, TLS, headers and body of one GET
MAX_BACKOFF_S: Final = 300.0
STARTUP_WAIT_S: Final = 2.0  # how long the first list may hold up the producer's start
# The API server answers metadata only when asked (as client-go's metadata client asks); the kubelet's
# /pods ignores it and sends the full PodList, which the same decoding reads.
LIST_ACCEPT: Final = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1, application/json"
OBJECT_ACCEPT: Final = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1, application/json"

PodKey = tuple[str, str]  # (namespace, name)


@attrs.frozen
class PodEntry:
    """What attribution needs of a pod, and nothing else: a 100k-pod list costs a few hundred bytes a pod."""

    uid: str
    workload: Workload | None


class _Item(msgspec.Struct):
    metadata: ObjectMeta | None = None


class _List(msgspec.Struct):
    kind: str | None = None
    items: list[msgspec.Raw] | None = None  # each item decoded on its own: a malformed one costs only itself


_LIST: Final = msgspec.json.Decoder(_List)
_ITEM: Final = msgspec.json.Decoder(_Item)


def _decode_error(what: str, error: Exception) -> AttributionError:
    if isinstance(error, RecursionError):  # msgspec's guard: nesting deeper than ~1000 levels
        return AttributionError(f"{what} is nested too deeply to decode")
    return AttributionError(f"{what} is not JSON of the expected shape: {kubernetes_http.first_line(str(error))}")


@attrs.frozen
class PodIndex:
    """A decoded pod list: each pod by (namespace, name), and the RayClusters its pods name."""

    pods: Mapping[PodKey, PodEntry]
    ray_clusters: Mapping[PodKey, str]  # (namespace, RayCluster) -> the API version to read it at
    skipped: int  # malformed items


def parse_pod_list(body: bytes | bytearray, job_label: str | None = None) -> PodIndex:
    """A ``v1.PodList`` or ``PartialObjectMetadataList`` body, item by item, keeping only what attribution needs.

    Items without a name (nothing could refer to them) or of the wrong shape are skipped and counted; an
    answer that is not a list of items is an ``AttributionError``.
    """
    try:
        document = _LIST.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as error:
        raise _decode_error("the pod list", error) from None
    if document.items is None:
        raise AttributionError(f"pod list answer is not a PodList (kind {document.kind!r})")
    pods: dict[PodKey, PodEntry] = {}
    ray_clusters: dict[PodKey, str] = {}
    shared: dict[Workload, Workload] = {}  # one Workload object per workload, however many pods it has
    skipped = 0
    for raw in document.items:
        try:
            meta = _ITEM.decode(raw).metadata
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            meta = None
        if meta is None or not meta.name:
            skipped += 1
            continue
        workload = workload_of(meta, job_label)
        if workload is not None:
            workload = shared.setdefault(workload, workload)
            if workload.kind == "RayCluster":
                ray_clusters[(workload.namespace, workload.name)] = ray_cluster_api_version(meta)
        pods[(meta.namespace or "", meta.name)] = PodEntry(uid=meta.uid or "", workload=workload)
    return PodIndex(pods=pods, ray_clusters=ray_clusters, skipped=skipped)


def pods_url(endpoint: str, node_name: str | None) -> str:
    """The URL that lists the node's pods: a kubelet ``.../pods`` as given, else the API server's list."""
    parsed = urllib.parse.urlsplit(endpoint)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError(f"Kubernetes pods endpoint must be an http(s) URL, got {endpoint!r}")
    if parsed.path.rstrip("/").endswith("/pods"):
        return endpoint  # the kubelet's /pods lists this node's pods only
    if not node_name:
        raise ValueError("listing pods from the API server needs the node name (--k8s-node-name or NODE_NAME)")
    query = urllib.parse.urlencode({"fieldSelector": f"spec.nodeName={node_name}"})
    return f"{endpoint.rstrip('/')}/api/v1/pods?{query}"


def api_server_of(list_url: str) -> str | None:
    """The API server base of a pod-list URL from ``pods_url``; None for a kubelet ``/pods``."""
    parsed = urllib.parse.urlsplit(list_url)
    path = parsed.path.rstrip("/")
    if not path.endswith("/api/v1/pods"):
        return None
    return urllib.parse.urlunsplit((parsed.scheme, parsed.netloc, path.removesuffix("/api/v1/pods"), "", ""))


def in_cluster_api_url(environ: Mapping[str, str] | None = None) -> str | None:
    """The API server as every pod sees it (the variables the kubelet sets), or None outside a cluster."""
    environ = os.environ if environ is None else environ
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return None
    host = f"[{host}]" if ":" in host else host  # IPv6 service address
    return f"https://{host}:{port}"


def resolve_pods_url(value: str | None) -> str | None:
    """``--k8s-pods-url``: None or ``off`` is off, ``auto`` the in-cluster API server (off outside one)."""
    if value is None or value.strip().lower() in ("", "off", "none"):
        return None
    if value.strip().lower() == "auto":
        url = in_cluster_api_url()
        if url is None:
            log.warning("--k8s-pods-url auto: not in a Kubernetes pod (no KUBERNETES_SERVICE_HOST), pods not read")
        return url
    return value.strip()


def cluster_pods_url(value: str | None) -> str | None:
    """The URL that lists every pod of the cluster (no node's field selector), for a reader of many nodes' GPUs (the
    collector reading dcgm-exporter scrapes): None or ``off`` is off, ``auto`` the in-cluster API server's
    ``/api/v1/pods``, an API server base URL gains it, a URL ending in ``/pods`` is taken as given."""
    resolved = resolve_pods_url(value)
    if resolved is None or urllib.parse.urlsplit(resolved).path.rstrip("/").endswith("/pods"):
        return resolved
    return f"{resolved.rstrip('/')}/api/v1/pods"


class _HttpStatusError(AttributionError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _status_message(body: bytes | bytearray) -> str:
    """The ``message`` of a ``v1.Status`` answer, else the body's first line."""
    try:
        status = json.loads(body)
    except ValueError:
        status = None
    if isinstance(status, dict) and isinstance(status.get("message"), str):
        return kubernetes_http.first_line(status["message"])
    return kubernetes_http.first_line(body.decode("utf-8", "replace"))


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


@attrs.define
class PodDirectory:
    """The node's pods by (namespace, name), refreshed every ``refresh_s`` on a background thread.

    ``get`` answers from the last good list at once. A pod it lacks (one just scheduled) asks for a new
    list, at most once per ``min_relist_s``. A failed lookup keeps the last good list, however old, and
    is retried after ``refresh_s``, doubling to ``max_backoff_s`` while it keeps failing. The bearer
    token is read again on every lookup (projected service-account tokens rotate). Where the list comes
    from the API server, the RayClusters its pods name are read too (metadata only) to name the RayJob or
    RayService each was generated for. ``generation`` changes whenever the list's content does, so that
    the attribution chain need not wait its refresh period to use a new pod's job.

    ``poll`` does one due lookup in the calling thread (the tests drive it with a hand clock); ``start``
    runs it on a daemon thread, ``close`` stops that thread and cuts its lookup in flight.
    """

    url: str
    token_file: str | None = DEFAULT_TOKEN_FILE
    ca_file: str | None = DEFAULT_CA_FILE
    job_label: str | None = None  # --k8s-job-label: a label naming the job, before the standard ones
    refresh_s: float = 30.0
    min_relist_s: float = 5.0
    deadline_s: float = LOOKUP_DEADLINE_S
    max_backoff_s: float = MAX_BACKOFF_S
    max_response_bytes: int = MAX_RESPONSE_BYTES
    startup_wait_s: float = STARTUP_WAIT_S
    clock: Clock = time.monotonic_ns
    api_url: str | None = attrs.field(init=False)
    lists: int = attrs.field(default=0, init=False)  # lookups of the pod list, good or failed
    failures: int = attrs.field(default=0, init=False)  # failed lookups in a row
    generation: int = attrs.field(default=0, init=False)
    _index: Mapping[PodKey, PodEntry] | None = attrs.field(default=None, init=False, repr=False)
    _roots: dict[PodKey, Workload | None] = attrs.field(factory=dict, init=False, repr=False)
    _good_ns: int | None = attrs.field(default=None, init=False, repr=False)  # when the kept list was listed
    _attempt_ns: int | None = attrs.field(default=None, init=False, repr=False)  # when the last lookup ended
    _failure: str | None = attrs.field(default=None, init=False, repr=False)
    _relist_wanted: bool = attrs.field(default=False, init=False, repr=False)
    _ray_warned: bool = attrs.field(default=False, init=False, repr=False)
    _plaintext_warned: bool = attrs.field(default=False, init=False, repr=False)
    _ssl: ssl.SSLContext | None = attrs.field(default=None, init=False, repr=False)
    _wake: threading.Condition = attrs.field(factory=threading.Condition, init=False, repr=False)
    _stopping: bool = attrs.field(default=False, init=False, repr=False)
    _in_flight: kubernetes_http.Cancel | None = attrs.field(default=None, init=False, repr=False)
    _thread: threading.Thread | None = attrs.field(default=None, init=False, repr=False)
    _first_done: threading.Event = attrs.field(factory=threading.Event, init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if not (self.refresh_s > 0 and self.deadline_s > 0 and self.min_relist_s > 0):
            raise ValueError("the pod directory's refresh period, relist period and deadline must be positive")
        self.api_url = api_server_of(self.url)

    # --- what sampling calls: never waits on the network ------------------------------------------------

    def get(self, namespace: str, name: str) -> PodEntry | None:
        """The pod from the last good list; None when the list lacks it. AttributionError before any list."""
        with self._wake:
            if self._index is None:
                raise AttributionError(self._failure or "the node's pods are not listed yet")
            entry = self._index.get((namespace, name))
            if entry is None and not self._relist_wanted:
                self._relist_wanted = True
                self._wake.notify_all()
            return entry

    # --- the refresher ------------------------------------------------------------------------------------

    def start(self) -> None:
        """Refresh on a daemon thread; wait up to ``startup_wait_s`` for the first lookup to end."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="otel-ofu-k8s-pods", daemon=True)
        self._thread.start()
        self._first_done.wait(self.startup_wait_s)

    def close(self) -> None:
        with self._wake:
            self._stopping = True
            in_flight = self._in_flight
            self._wake.notify_all()
        if in_flight is not None:
            in_flight.cancel("the producer is stopping")
        if self._thread is not None:
            self._thread.join(timeout=1.0)

    def poll(self) -> bool:
        """Do the lookup that is due, if one is; True when it looked up."""
        with self._wake:
            if self._stopping or self.clock() < self._due_ns():
                return False
            self._relist_wanted = False
        try:
            index = self._lookup()
        except Exception as error:  # every failure alike: counted, logged, backed off, never raised
            self._failed(error)
        else:
            self._listed(index)
        finally:
            with self._wake:
                self.lists += 1
                self._attempt_ns = self.clock()
            self._first_done.set()
        return True

    def _due_ns(self) -> int:
        if self._attempt_ns is None:
            return 0
        if self.failures:
            backoff = min(self.refresh_s * 2 ** (self.failures - 1), max(self.max_backoff_s, self.refresh_s))
            return self._attempt_ns + int(backoff * 1e9)
        wait = min(self.refresh_s, self.min_relist_s) if self._relist_wanted else self.refresh_s
        return self._attempt_ns + int(wait * 1e9)

    def _run(self) -> None:
        while True:
            try:
                self.poll()
            except Exception:  # poll raises nothing by design; the thread must outlive a bug all the same
                log.exception("the pod directory's refresh failed")
            with self._wake:
                if self._stopping:
                    return
                wait_s = (self._due_ns() - self.clock()) / 1e9
                if wait_s > 0:
                    self._wake.wait(min(wait_s, self.max_backoff_s))
                if self._stopping:
                    return

    def _listed(self, index: Mapping[PodKey, PodEntry]) -> None:
        with self._wake:
            recovered = self.failures
            changed = index != self._index
            self._index, self._good_ns, self._failure, self.failures = index, self.clock(), None, 0
            if changed:
                self.generation += 1
        if recovered:
            log.warning("listing the node's pods works again, after %d failed lookups", recovered)

    def _failed(self, error: Exception) -> None:
        text = str(error) if isinstance(error, AttributionError) else f"{type(error).__name__}: {error}"
        text = kubernetes_http.first_line(text)[:400]
        with self._wake:
            self.failures += 1
            self._failure = text
            failures, good_ns, now, stopping = self.failures, self._good_ns, self.clock(), self._stopping
        if stopping:
            log.debug("pod lookup cut at shutdown: %s", text)
            return
        if failures & (failures - 1):
            log.debug("listing the node's pods failed again: %s", text)  # logged on the 1st, 2nd, 4th, 8th...
            return
        if good_ns is None:
            kept = "; no list yet: GPUs in pods get no job"
        else:
            kept = f"; keeping the list from {max(0.0, (now - good_ns) / 1e9):.0f} s ago"
        again = "" if failures == 1 else f" ({_ordinal(failures)} time in a row)"
        log.warning("listing the node's pods failed%s: %s%s", again, text, kept)

    # --- one lookup: the pod list, then the RayClusters it names --------------------------------------------

    def _lookup(self) -> Mapping[PodKey, PodEntry]:
        body = self._get(self.url, LIST_ACCEPT, self.max_response_bytes)
        index = parse_pod_list(body, self.job_label)
        if index.skipped:
            log.debug("pods at %s: %d malformed items skipped", self.url, index.skipped)
        if not index.ray_clusters or self.api_url is None:
            return index.pods
        roots = self._ray_roots(index.ray_clusters)
        pods = dict(index.pods)
        for key, entry in index.pods.items():
            cluster = entry.workload
            if cluster is not None and cluster.kind == "RayCluster":
                root = roots.get((cluster.namespace, cluster.name))
                if root is not None:
                    pods[key] = PodEntry(uid=entry.uid, workload=root)
        return pods

    def _ray_roots(self, clusters: Mapping[PodKey, str]) -> Mapping[PodKey, Workload | None]:
        """The RayJob or RayService of each RayCluster (None: a cluster of its own), kept while pods name it."""
        self._roots = {key: root for key, root in self._roots.items() if key in clusters}
        for (namespace, name), api_version in clusters.items():
            if (namespace, name) in self._roots:
                continue  # a RayCluster's owner never changes
            url = (
                f"{self.api_url}/apis/{api_version}/namespaces/{urllib.parse.quote(namespace, safe='')}"
                f"/rayclusters/{urllib.parse.quote(name, safe='')}"
            )
            try:
                metadata = _ITEM.decode(self._get(url, OBJECT_ACCEPT, MAX_OBJECT_BYTES)).metadata
            except _HttpStatusError as error:
                if error.status != 404:
                    self._warn_ray(name, error)
                    break
                metadata = None  # deleted while its pods terminate: they stay the RayCluster's
            except (AttributionError, msgspec.DecodeError, msgspec.ValidationError, RecursionError) as error:
                # Its pods read as the RayCluster until it can be read; the rest of this list's are not
                # tried (they would most likely fail alike), they are at the next lookup.
                self._warn_ray(name, error)
                break
            self._roots[(namespace, name)] = None if metadata is None else root_of_ray_cluster(metadata)
        else:
            self._ray_warned = False
        return self._roots

    def _warn_ray(self, cluster: str, error: Exception) -> None:
        text = kubernetes_http.first_line(str(error))
        if self._ray_warned:
            log.debug("RayCluster %s not read: %s", cluster, text)
            return
        self._ray_warned = True
        log.warning("RayCluster %s not read, its pods read as the RayCluster for now: %s", cluster, text)

    def _get(self, url: str, accept: str, max_bytes: int) -> bytes | bytearray:
        headers = {"Accept": accept}
        token = self._token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        cancel = kubernetes_http.Cancel()
        with self._wake:
            if self._stopping:
                raise AttributionError("the producer is stopping")
            self._in_flight = cancel
        try:
            answer = kubernetes_http.get(
                url,
                headers=headers,
                deadline_s=self.deadline_s,
                max_bytes=max_bytes,
                tls=self._context(),
                cancel=cancel,
            )
        finally:
            with self._wake:
                self._in_flight = None
        if answer.status != 200:
            where = url.partition("?")[0]
            asked = "get rayclusters.ray.io" if "/rayclusters/" in where else "list pods"
            hint = f" (may the service account {asked}? see the chart's ClusterRole)" if answer.status == 403 else ""
            raise _HttpStatusError(
                answer.status, f"{where}: HTTP {answer.status}{hint}: {_status_message(answer.body)}"[:400]
            )
        return answer.body

    def _token(self) -> str | None:
        if not self.token_file:
            return None
        try:
            token = Path(self.token_file).read_text(encoding="utf-8").strip() or None
        except OSError as error:
            if self.url.startswith("https:"):
                log.debug("no service-account token at %s (%s)", self.token_file, error.strerror)
            return None
        if token and not self.url.startswith("https:") and not self._plaintext_warned:
            self._plaintext_warned = True
            log.warning(
                "sending the service-account token to %s in clear text: anyone on the path can use it as this "
                "producer's identity; use the https:// URL the API server and the kubelet serve, or "
                "--k8s-token-file '' for a server that needs no token",
                urllib.parse.urlsplit(self.url)._replace(query="").geturl(),
            )
        return token

    def _context(self) -> ssl.SSLContext | None:
        if not self.url.startswith("https:"):
            return None
        if self._ssl is None:
            try:
                self._ssl = ssl.create_default_context(cafile=self.ca_file if self.ca_file else None)
            except (OSError, ssl.SSLError) as error:
                raise AttributionError(f"cannot load the CA file {self.ca_file}: {error}") from None
        return self._ssl


def shared_workload(pods: Iterable[PodEntry | None]) -> Workload | None:
    """The workload of pods sharing a device (time-slicing): only when they all agree.

    Pods of different jobs on one GPU leave the job unknown: its OFU belongs to neither alone, and
    naming one of them would be a guess.
    """
    workloads = {pod.workload if pod is not None else None for pod in pods}
    return workloads.pop() if len(workloads) == 1 else None
