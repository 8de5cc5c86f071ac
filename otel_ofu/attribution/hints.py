"""What the source itself knows about a GPU's job: ``GpuIdentity.hints``.

dcgm-exporter labels its series with the pod (Kubernetes) or ``hpc_job`` (its Slurm job mapping), and the
simulator knows the job it simulates; the sources put those into ``hints`` under the contract's attribute
names. When a hint carries no ``job.scheduler`` it is inferred from what is there: a job id can only have
come from dcgm-exporter's HPC job mapping (Slurm), a pod only from Kubernetes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import attrs

from otel_ofu import names
from otel_ofu.attribution.base import ATTRIBUTE_KEYS, normalise_precision
from otel_ofu.model import GpuIdentity

LINK_NAME: Final = "hints"


@attrs.define
class HintsAttributor:
    """Passes on the source's own hints, restricted to the attribution attributes."""

    name: str = attrs.field(default=LINK_NAME, init=False)

    def attribute(self, gpu: GpuIdentity) -> Mapping[str, str]:
        found = {key: value.strip() for key in ATTRIBUTE_KEYS if (value := gpu.hints.get(key)) and value.strip()}
        if not found:
            return {}
        if names.GPU_PRECISION in found:
            found[names.GPU_PRECISION] = normalise_precision(found[names.GPU_PRECISION])
        if found.get(names.JOB_SCHEDULER) not in names.SCHEDULERS:
            found.pop(names.JOB_SCHEDULER, None)
            if names.JOB_ID in found:
                found[names.JOB_SCHEDULER] = "slurm"
            elif names.K8S_POD_NAME in found:
                found[names.JOB_SCHEDULER] = "kubernetes"
        return found

    def close(self) -> None:
        return None
