"""Which job a pod works for, from its own metadata: the labels and owners its workload controller writes.

Pure: a pod's metadata in, a ``Workload`` (kind, name, namespace) out, or None for a pod of no known
workload. The job of a pod is, first match wins (the most specific owner of the training run first):

1. the label named by ``--k8s-job-label`` (a site's own convention);
2. JobSet: ``jobset.sigs.k8s.io/jobset-name`` (its pods also carry the labels of the child Job, which
   is one replica of the set, so the set must win over the Job);
3. Kubeflow training jobs (PyTorchJob, TFJob, MPIJob, ...): ``training.kubeflow.org/job-name``;
4. LeaderWorkerSet: ``leaderworkerset.sigs.k8s.io/name`` (its pods are owned by a StatefulSet);
5. Volcano: ``volcano.sh/job-name``;
6. KubeRay: a pod stamped ``ray.io/originated-from-crd=RayJob`` (or ``RayService``) is that custom
   resource's, named by ``ray.io/originated-from-cr-name``; else ``ray.io/cluster`` names its RayCluster.
   A RayJob's head and worker pods carry only ``ray.io/cluster`` (the generated ``<rayjob>-xxxxx``, or
   ``<rayjob>-raycluster-xxxxx`` before KubeRay 1.7), so the pod directory reads that RayCluster's own
   metadata from the API server and names the RayJob (or RayService) it was generated for
   (``root_of_ray_cluster``);
7. Argo Workflows: ``workflows.argoproj.io/workflow``;
8. a Kubernetes Job: ``batch.kubernetes.io/job-name`` or the legacy unprefixed ``job-name``;
9. the controlling owner reference when the labels are missing: ``Job`` (batch), ``JobSet``, a Kubeflow
   kind, ``LeaderWorkerSet``, ``RayCluster``/``RayJob``, Volcano's ``Job``, Argo's ``Workflow``, then
   the generic controllers: ``StatefulSet``, ``DaemonSet``, and ``ReplicaSet``, which is a Deployment's
   when the pod's ``pod-template-hash`` ends the ReplicaSet's name (the Deployment is that name less
   ``-<pod-template-hash>``).

Label keys and owner kinds, each from the upstream source that defines it:
- ``batch.kubernetes.io/job-name``, ``batch.kubernetes.io/controller-uid`` (and the unprefixed legacy
  ``job-name``, ``controller-uid``): kubernetes/api batch/v1/types.go, ``JobNameLabel``,
  ``ControllerUidLabel`` ("Historically the job controller uses unprefixed labels for job-name and
  controller-uid").
- ``jobset.sigs.k8s.io/jobset-name``: kubernetes-sigs/jobset api/jobset/v1alpha2/jobset_types.go,
  ``JobSetNameKey``.
- ``training.kubeflow.org/job-name``: kubeflow/training-operator pkg/apis/kubeflow.org/v1/common_types.go,
  ``JobNameLabel``; the kinds from the same package (``PyTorchJobKind`` ... ``JAXJobKind``).
- ``leaderworkerset.sigs.k8s.io/name``: kubernetes-sigs/lws api/leaderworkerset/v1/leaderworkerset_types.go,
  ``SetNameLabelKey``.
- ``volcano.sh/job-name``: volcano-sh/apis pkg/apis/batch/v1alpha1/labels.go, ``JobNameKey``.
- ``ray.io/cluster``, ``ray.io/originated-from-cr-name``, ``ray.io/originated-from-crd``:
  ray-project/kuberay ray-operator/controllers/ray/utils/constant.go, ``RayClusterLabelKey``,
  ``RayOriginatedFromCRNameLabelKey``, ``RayOriginatedFromCRDLabelKey`` (values ``RayJob``,
  ``RayService``: utils/util.go ``RayJobCRD``, ``RayServiceCRD``). Pods get ``ray.io/cluster`` from
  common/pod.go ``labelPod`` and their RayCluster as controller (raycluster_controller.go
  ``SetControllerReference``); the RayJob controller stamps the originated-from labels on the RayCluster
  it generates and on the submitter Job's pod template, and makes the RayJob the RayCluster's controller
  (rayjob_controller.go ``constructRayClusterForRayJob``, ``getSubmitterTemplate``); the cluster's name
  is ``utils.GenerateRayClusterName(rayJob.Name)``.
- ``workflows.argoproj.io/workflow``: argoproj/argo-workflows workflow/common/common.go,
  ``LabelKeyWorkflow``; set on every workflow pod with the Workflow (``argoproj.io/v1alpha1``,
  pkg/apis/workflow/register.go ``WorkflowKind``) as its controller (workflow/controller/workflowpod.go,
  ``metav1.NewControllerRef(woc.wf, ...)``).
- ``pod-template-hash``: kubernetes/api apps/v1/types.go, ``DefaultDeploymentUniqueLabelKey``; the
  Deployment controller names its ReplicaSets ``d.Name + "-" + podTemplateSpecHash`` and adds the hash to
  their pod template's labels (kubernetes/kubernetes pkg/controller/deployment/sync.go,
  ``getNewReplicaSet``).
- StatefulSet and DaemonSet pods have their set as controller (kubernetes/kubernetes
  pkg/controller/statefulset/stateful_set_utils.go ``newStatefulSetPod``, pkg/controller/daemon/
  daemon_controller.go ``syncNodes``: ``metav1.NewControllerRef(set, controllerKind)``, group ``apps``).

``job.id`` is ``<namespace>/<workload name>`` (``kubernetes_job_id``): names are unique per namespace and
per kind, and it is what a training script knows of itself, so the MFU reporter of that job reports the
same ``job.id`` (``MfuReporter("ml/llama-pretrain", ...)``). ``job.name`` is the workload's name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import attrs
import msgspec

from otel_ofu import names

SCHEDULER: Final = "kubernetes"

RAY_CLUSTER_LABEL: Final = "ray.io/cluster"
RAY_ORIGIN_NAME_LABEL: Final = "ray.io/originated-from-cr-name"
RAY_ORIGIN_KIND_LABEL: Final = "ray.io/originated-from-crd"
# The custom resources a RayCluster is generated for; each is the job of the cluster's pods.
RAY_ROOT_KINDS: Final = ("RayJob", "RayService")
RAY_GROUP: Final = "ray.io"
RAY_DEFAULT_API_VERSION: Final = "ray.io/v1"  # KubeRay's API since 1.0
POD_TEMPLATE_HASH_LABEL: Final = "pod-template-hash"

# (label key, workload kind) in precedence order; KubeRay's rule sits between Volcano and Argo.
LABELS_BEFORE_RAY: Final = (
    ("jobset.sigs.k8s.io/jobset-name", "JobSet"),
    ("training.kubeflow.org/job-name", "KubeflowJob"),
    ("leaderworkerset.sigs.k8s.io/name", "LeaderWorkerSet"),
    ("volcano.sh/job-name", "VolcanoJob"),
)
LABELS_AFTER_RAY: Final = (
    ("workflows.argoproj.io/workflow", "Workflow"),
    ("batch.kubernetes.io/job-name", "Job"),
    ("job-name", "Job"),
)
KUBEFLOW_KINDS: Final = ("PyTorchJob", "TFJob", "MPIJob", "XGBoostJob", "PaddleJob", "JAXJob", "MXJob")
# Controlling owners that name a job: (API group, kind) -> workload kind, the job-specific kinds before the
# generic controllers. A ReplicaSet is looked at apart (``_replica_set_workload``).
OWNER_KINDS: Final[Mapping[tuple[str, str], str]] = {
    ("batch", "Job"): "Job",
    ("jobset.x-k8s.io", "JobSet"): "JobSet",
    ("leaderworkerset.x-k8s.io", "LeaderWorkerSet"): "LeaderWorkerSet",
    ("batch.volcano.sh", "Job"): "VolcanoJob",
    (RAY_GROUP, "RayCluster"): "RayCluster",
    (RAY_GROUP, "RayJob"): "RayJob",
    ("argoproj.io", "Workflow"): "Workflow",
    **{("kubeflow.org", kind): kind for kind in KUBEFLOW_KINDS},
    ("apps", "StatefulSet"): "StatefulSet",
    ("apps", "DaemonSet"): "DaemonSet",
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


class OwnerReference(msgspec.Struct, rename="camel"):
    """meta/v1 ``OwnerReference``: the fields the rules read (the rest of the JSON is skipped unread)."""

    api_version: str | None = None
    kind: str | None = None
    name: str | None = None
    controller: bool | None = None

    @property
    def group(self) -> str:
        version = self.api_version or ""
        return version.rpartition("/")[0] if "/" in version else ""


class ObjectMeta(msgspec.Struct, rename="camel"):
    """meta/v1 ``ObjectMeta``: the fields attribution reads."""

    name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    labels: dict[str, str] | None = None
    owner_references: list[OwnerReference] | None = None

    def label(self, key: str) -> str:
        return (self.labels or {}).get(key, "").strip()

    def controllers_first(self) -> list[OwnerReference]:
        # A pod has at most one controller; plain owners only count when the controller names no job.
        return sorted(self.owner_references or (), key=lambda owner: owner.controller is not True)


def workload_of(meta: ObjectMeta, job_label: str | None = None) -> Workload | None:
    """The job this pod works for (the module docstring's rules), or None for a pod of no known workload."""
    namespace = meta.namespace or ""
    if job_label and (value := meta.label(job_label)):
        return Workload("label", value, namespace)
    for key, kind in LABELS_BEFORE_RAY:
        if value := meta.label(key):
            return Workload(kind, value, namespace)
    ray = _ray_workload(meta, namespace)
    if ray is not None:
        return ray
    for key, kind in LABELS_AFTER_RAY:
        if value := meta.label(key):
            return Workload(kind, value, namespace)
    for owner in meta.controllers_first():
        if not owner.name:
            continue
        if (owner.group, owner.kind) == ("apps", "ReplicaSet"):
            return _replica_set_workload(owner.name, meta.label(POD_TEMPLATE_HASH_LABEL), namespace)
        owner_kind = OWNER_KINDS.get((owner.group, owner.kind or ""))
        if owner_kind is not None:
            return Workload(owner_kind, owner.name, namespace)
    return None


def _ray_workload(meta: ObjectMeta, namespace: str) -> Workload | None:
    origin_kind, origin_name = meta.label(RAY_ORIGIN_KIND_LABEL), meta.label(RAY_ORIGIN_NAME_LABEL)
    if origin_kind in RAY_ROOT_KINDS and origin_name:
        return Workload(origin_kind, origin_name, namespace)
    if cluster := meta.label(RAY_CLUSTER_LABEL):
        return Workload("RayCluster", cluster, namespace)
    return None


def _replica_set_workload(name: str, template_hash: str, namespace: str) -> Workload:
    suffix = f"-{template_hash}"
    if template_hash and name.endswith(suffix) and len(name) > len(suffix):
        return Workload("Deployment", name.removesuffix(suffix), namespace)
    return Workload("ReplicaSet", name, namespace)  # a ReplicaSet of its own, no Deployment above it


def ray_cluster_api_version(meta: ObjectMeta) -> str:
    """The API version to read the pod's RayCluster at: its owner reference's, else KubeRay's current one."""
    for owner in meta.controllers_first():
        if owner.group == RAY_GROUP and owner.kind == "RayCluster" and owner.api_version:
            return owner.api_version
    return RAY_DEFAULT_API_VERSION


def root_of_ray_cluster(cluster: ObjectMeta) -> Workload | None:
    """The RayJob or RayService a RayCluster was generated for, from the RayCluster's own metadata.

    Its controller owner first (the RayJob controller sets it), else the originated-from labels; None for
    a RayCluster of its own (one created by hand, or that a RayJob only selects with ``clusterSelector``).
    """
    namespace = cluster.namespace or ""
    for owner in cluster.controllers_first():
        if owner.group == RAY_GROUP and owner.kind in RAY_ROOT_KINDS and owner.name and owner.controller:
            return Workload(owner.kind, owner.name, namespace)
    origin_kind, origin_name = cluster.label(RAY_ORIGIN_KIND_LABEL), cluster.label(RAY_ORIGIN_NAME_LABEL)
    if origin_kind in RAY_ROOT_KINDS and origin_name:
        return Workload(origin_kind, origin_name, namespace)
    return None
