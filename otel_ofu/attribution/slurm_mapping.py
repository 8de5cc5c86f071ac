"""Slurm jobs from dcgm-exporter's HPC job-mapping directory.

The format (dcgm-exporter ``--hpc-job-mapping-dir``): one file per GPU, named by the GPU index (``0``,
``1``, ...) or ``GPU.MIG`` for a MIG instance (``0.1``: GPU instance 1 on GPU 0), whose lines are job ids.
Slurm prolog scripts write them when a job starts and epilog scripts remove them when it ends, so the
same directory serves both dcgm-exporter and us.

Several lines mean several jobs share the GPU. dcgm-exporter emits one series per line; we attribute a
GPU to exactly one job (its Resource carries one ``job.id``), and take the LAST non-empty line: prologs
append, so it is the most recently started job, and a line left behind by a failed epilog (a job that
is gone) sits above it. Joining the ids instead would invent a job id that no MFU report ever carries.

A MIG instance without its own file falls back to its GPU's file: a job given the whole GPU owns every
instance on it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import attrs

from otel_ofu import names
from otel_ofu.attribution.base import AttributionError
from otel_ofu.model import GpuIdentity

LINK_NAME: Final = "slurm_mapping"

log = logging.getLogger(__name__)


def mapping_file_names(gpu: GpuIdentity) -> tuple[str, ...]:
    """The file names that may hold ``gpu``'s job, most specific first."""
    if gpu.mig_instance_id is None:
        return (str(gpu.index),)
    return (f"{gpu.index}.{gpu.mig_instance_id}", str(gpu.index))


def last_job_id(text: str) -> str | None:
    """The job id a mapping file attributes its GPU to: its last non-empty line."""
    lines = [line.strip() for line in text.splitlines()]
    jobs = [line for line in lines if line]
    return jobs[-1] if jobs else None


@attrs.define
class SlurmMappingAttributor:
    """Reads the job of each GPU from the HPC job-mapping directory."""

    directory: Path = attrs.field(converter=Path)
    name: str = attrs.field(default=LINK_NAME, init=False)

    def attribute(self, gpu: GpuIdentity) -> Mapping[str, str]:
        if not self.directory.is_dir():
            # The prolog creates it with the first job: no directory, no job on this node yet.
            log.debug("HPC job-mapping directory %s does not exist (yet)", self.directory)
            return {}
        for file_name in mapping_file_names(gpu):
            path = self.directory / file_name
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                continue
            except OSError as error:
                raise AttributionError(f"cannot read HPC job-mapping file {path}: {error.strerror}") from None
            job_id = last_job_id(text)
            if job_id is not None:
                return {names.JOB_ID: job_id, names.JOB_SCHEDULER: "slurm"}
        return {}

    def close(self) -> None:
        return None
