"""Which job a pod works for, from the pod's own metadata: its workload's standard labels and owners.

PodResources says which pod holds a GPU; this module says which job that pod belongs to, with no change
to the pod: the labels and ``ownerReferences`` that the workload controllers themselves write. They are
read from the node's own pods, listed by the API server (``/api/v1/pods?fieldSelector=spec.nodeName=N``)
or by the kubelet (``/pods``), both answering a ``v1.PodList``.

The job of a pod is, first match wins (the most specific owner of the training run first):

1. the label named by ``--k8s-job-label`` (a site's own convention);
2. JobSet: ``jobset.sigs.k8s.io/jobset-name`` (its pods also carry the labels of the child Job, which
   is one replica of the set, so the set must win over the Job);
3. Kubeflow training jobs (PyTorchJob, TFJob, MPIJob, ...): ``training.kubeflow.org/job-name``;
4. LeaderWorkerSet: ``leaderworkerset.sigs.k8s.io/name``;
5. Volcano: ``volcano.sh/job-name``;
6. Ray: ``ray.io/cluster`` (a RayJob runs on a RayCluster of its own);
7. a Kubernetes Job: ``batch.kubernetes.io/job-name`` or the legacy unprefixed ``job-name``;
8. the controlling owner reference when the labels are missing: ``Job`` (batch), ``JobSet``, a Kubeflow
   kind, ``LeaderWorkerSet``, ``RayCluster``/``RayJob``, Volcano's ``Job``.

Label keys, each from the upstream source that defines it:
- ``batch.kubernetes.io/job-name``, ``batch.kubernetes.io/controller-uid`` (and the unprefixed legacy
  ``job-name``, ``controller-uid``): kubernetes/api batch/v1/types.go, ``JobNameLabel``,
  ``ControllerUidLabel`` ("Historically the job controller uses unprefixed labels for job-name and
  controller-uid").
- ``jobset.sigs.k8s.io/jobset-name``, ``jobset.sigs.k8s.io/jobset-uid``: kubernetes-sigs/jobset
  api/jobset/v1alpha2/jobset_types.go, ``JobSetNameKey``, ``JobSetUIDKey``.
- ``training.kubeflow.org/job-name``: kubeflow/training-operator pkg/apis/kubeflow.org/v1/common_types.go,
  ``JobNameLabel``; the kinds from the same package (``PyTorchJobKind`` ... ``JAXJobKind``).
- ``leaderworkerset.sigs.k8s.io/name``: kubernetes-sigs/lws api/leaderworkerset/v1/leaderworkerset_types.go,
  ``SetNameLabelKey``.
- ``volcano.sh/job-name``: volcano-sh/apis pkg/apis/batch/v1alpha1/labels.go, ``JobNameKey`` ("job name key
  used in pod annotation / labels").
- ``ray.io/cluster``: ray-project/kuberay ray-operator/controllers/ray/utils/constant.go, ``RayClusterLabelKey``.

``job.id`` is ``<namespace>/<workload name>`` (``kubernetes_job_id``): names are unique per namespace and
per kind, and it is what a training script knows of itself, so the MFU reporter of that job reports the
same ``job.id`` (``MfuReporter("ml/llama-pretrain", ...)``). ``job.name`` is the workload's name.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from otel_ofu import names
from otel_ofu.attribution.base import AttributionError
from otel_ofu.model import Clock

log = logging.getLogger(__name__)

SCHEDULER: Final = "kubernetes"
SERVICE_ACCOUNT_DIR: Final = "/var/run/secrets/kubernetes.io/serviceaccount"
DEFAULT_TOKEN_FILE: Final = f"{SERVICE_ACCOUNT_DIR}/token"
DEFAULT_CA_FILE: Final = f"{SERVICE_ACCOUNT_DIR}/ca.crt"
# A node's PodList is small, but a pathological answer must not eat the producer's memory.
MAX_RESPONSE_BYTES: Final = 64 * 1024 * 1024

# (label key, workload kind) in precedence order; see the module docstring for each key's source.
WORKLOAD_LABELS: Final = (
    ("jobset.sigs.k8s.io/jobset-name", "JobSet"),
    ("training.kubeflow.org/job-name", "KubeflowJob"),
    ("leaderworkerset.sigs.k8s.io/name", "LeaderWorkerSet"),
    ("volcano.sh/job-name", "VolcanoJob"),
    ("ray.io/cluster", "RayCluster"),
    ("batch.kubernetes.io/job-name", "Job"),
    ("job-name", "Job"),
)
# Controlling owners that are a job themselves: (API group, kind). An empty group matches any.
KUBEFLOW_KINDS: Final = ("PyTorchJob", "TFJob", "MPIJob", "XGBoostJob", "PaddleJob", "JAXJob", "MXJob")
OWNER_KINDS: Final[Mapping[tuple[str, str], str]] = {
    ("batch", "Job"): "Job",
    ("jobset.x-k8s.io", "JobSet"): "JobSet",
    ("leaderworkerset.x-k8s.io", "LeaderWorkerSet"): "LeaderWorkerSet",
    ("batch.volcano.sh", "Job"): "VolcanoJob",
    ("ray.io", "RayCluster"): "RayCluster",
    ("ray.io", "RayJob"): "RayJob",
    **{("kubeflow.org", kind): kind for kind in KUBEFLOW_KINDS},
}


def kubernetes_job_id(namespace: str, name: str) -> str:
    """The ``job.id`` of a Kubernetes workload: ``<namespace>/<name>``."""
    return f"{namespace}/{name}" if namespace else name


@attrs.frozen
class Workload:
    """The job a pod belongs to."""

    kind: str
    name: str
    namespace: str

    @property
    def job_id(self) -> str:
        return kubernetes_job_id(self.namespace, self.name)

    def attributes(self) -> dict[str, str]:
        return {names.JOB_ID: self.job_id, names.JOB_NAME: self.name, names.JOB_SCHEDULER: SCHEDULER}


@attrs.frozen
class PodMeta:
    """The parts of a pod's metadata that attribution uses."""

    name: str
    namespace: str
    uid: str
    labels: Mapping[str, str]
    owners: tuple[tuple[str, str, str, bool], ...]  # (apiVersion, kind, name, controller)

    def workload(self, job_label: str | None = None) -> Workload | None:
        """The job this pod works for (module docstring), or None for a pod of no known workload."""
        keys = ((job_label, "label"),) if job_label else ()
        for key, kind in (*keys, *WORKLOAD_LABELS):
            value = self.labels.get(key, "").strip()
            if value:
                return Workload(kind=kind, name=value, namespace=self.namespace)
        # A pod has at most one controller; plain owners only count when none is marked controller.
        ordered = sorted(self.owners, key=lambda owner: not owner[3])
        for api_version, kind, name, _controller in ordered:
            group = api_version.rpartition("/")[0] if "/" in api_version else ""
            workload_kind = OWNER_KINDS.get((group, kind))
            if workload_kind is not None and name:
                return Workload(kind=workload_kind, name=name, namespace=self.namespace)
        return None


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def parse_pod(item: object) -> PodMeta | None:
    """One PodList item; None when it has no name (nothing could refer to it)."""
    if not isinstance(item, dict):
        return None
    metadata = item.get("metadata")
    if not isinstance(metadata, dict) or not _text(metadata.get("name")):
        return None
    raw_labels = metadata.get("labels")
    labels = (
        {key: value for key, value in raw_labels.items() if isinstance(key, str) and isinstance(value, str)}
        if isinstance(raw_labels, dict)
        else {}
    )
    owners: list[tuple[str, str, str, bool]] = []
    raw_owners = metadata.get("ownerReferences")
    for owner in raw_owners if isinstance(raw_owners, list) else ():
        if isinstance(owner, dict):
            owners.append(
                (
                    _text(owner.get("apiVersion")),
                    _text(owner.get("kind")),
                    _text(owner.get("name")),
                    owner.get("controller") is True,
                )
            )
    return PodMeta(
        name=_text(metadata.get("name")),
        namespace=_text(metadata.get("namespace")),
        uid=_text(metadata.get("uid")),
        labels=labels,
        owners=tuple(owners),
    )


def parse_pod_list(document: object) -> dict[tuple[str, str], PodMeta]:
    """A ``v1.PodList`` indexed by (namespace, name); malformed items are skipped, a non-list is an error."""
    if not isinstance(document, dict) or not isinstance(document.get("items"), list):
        kind = document.get("kind") if isinstance(document, dict) else type(document).__name__
        raise AttributionError(f"pod list answer is not a PodList (kind {kind!r})")
    pods: dict[tuple[str, str], PodMeta] = {}
    for item in document["items"]:
        pod = parse_pod(item)
        if pod is not None:
            pods[(pod.namespace, pod.name)] = pod
    return pods


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


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


@attrs.define
class PodDirectory:
    """The node's pods by (namespace, name), listed over HTTP(S) and reused for ``refresh_s``.

    A pod PodResources names that the cached list lacks (a pod just scheduled) triggers a new list, but
    at most once per ``min_relist_s``. The bearer token is read again on every list: projected
    service-account tokens rotate. A failed list keeps the last good one (for up to 10 refresh periods)
    and is raised as a one-line AttributionError otherwise.
    """

    url: str
    token_file: str | None = DEFAULT_TOKEN_FILE
    ca_file: str | None = DEFAULT_CA_FILE
    refresh_s: float = 30.0
    min_relist_s: float = 5.0
    timeout_s: float = 5.0
    clock: Clock = time.monotonic_ns
    lists: int = attrs.field(default=0, init=False)
    _pods: dict[tuple[str, str], PodMeta] | None = attrs.field(default=None, init=False, repr=False)
    _listed_ns: int | None = attrs.field(default=None, init=False, repr=False)
    _good_ns: int | None = attrs.field(default=None, init=False, repr=False)
    _failure: AttributionError | None = attrs.field(default=None, init=False, repr=False)
    _ssl: ssl.SSLContext | None = attrs.field(default=None, init=False, repr=False)

    def get(self, namespace: str, name: str) -> PodMeta | None:
        now = self.clock()
        age = None if self._listed_ns is None else now - self._listed_ns
        stale = age is None or not 0 <= age < self.refresh_s * 1e9
        missing = self._pods is not None and (namespace, name) not in self._pods
        if stale or (missing and age is not None and not 0 <= age < self.min_relist_s * 1e9):
            self._relist()
        if self._pods is None:
            assert self._failure is not None
            raise AttributionError(str(self._failure))
        return self._pods.get((namespace, name))

    def _relist(self) -> None:
        try:
            pods = parse_pod_list(self._fetch())
        except AttributionError as error:
            self._failure = error
            kept = self._good_ns is not None and 0 <= self.clock() - self._good_ns < 10 * self.refresh_s * 1e9
            if not kept:
                self._pods = None
            log.warning("listing the node's pods failed%s: %s", ", keeping the last list" if kept else "", error)
        else:
            self._pods, self._failure, self._good_ns = pods, None, self.clock()
        self.lists += 1
        self._listed_ns = self.clock()

    def _fetch(self) -> Any:
        request = urllib.request.Request(self.url, headers={"Accept": "application/json"})
        token = self._token()
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s, context=self._context()) as answer:
                body = answer.read(MAX_RESPONSE_BYTES + 1)
        except urllib.error.HTTPError as error:
            detail = _first_line(error.read(2048).decode("utf-8", "replace"))
            hint = " (may the service account list pods? see the chart's ClusterRole)" if error.code == 403 else ""
            raise AttributionError(f"pods at {self.url}: HTTP {error.code}{hint}: {detail}"[:400]) from None
        except (urllib.error.URLError, OSError, ValueError) as error:
            reason = getattr(error, "reason", error)
            raise AttributionError(f"pods at {self.url}: {_first_line(str(reason)) or type(error).__name__}") from None
        if len(body) > MAX_RESPONSE_BYTES:
            raise AttributionError(f"pods at {self.url}: answer larger than {MAX_RESPONSE_BYTES} bytes")
        try:
            return json.loads(body)
        except ValueError as error:
            raise AttributionError(f"pods at {self.url}: not JSON: {error}") from None

    def _token(self) -> str | None:
        if not self.token_file:
            return None
        try:
            return Path(self.token_file).read_text(encoding="utf-8").strip() or None
        except OSError as error:
            if self.url.startswith("https:"):
                log.debug("no service-account token at %s (%s)", self.token_file, error.strerror)
            return None

    def _context(self) -> ssl.SSLContext | None:
        if not self.url.startswith("https:"):
            return None
        if self._ssl is None:
            try:
                self._ssl = ssl.create_default_context(cafile=self.ca_file if self.ca_file else None)
            except (OSError, ssl.SSLError) as error:
                raise AttributionError(f"cannot load the CA file {self.ca_file}: {error}") from None
        return self._ssl


def shared_workload(pods: Sequence[PodMeta | None], job_label: str | None) -> Workload | None:
    """The workload of pods sharing a device (time-slicing): only when they all agree.

    Pods of different jobs on one GPU leave the job unknown: its OFU belongs to neither alone, and
    naming one of them would be a guess.
    """
    workloads = {pod.workload(job_label) if pod is not None else None for pod in pods}
    return workloads.pop() if len(workloads) == 1 else None
