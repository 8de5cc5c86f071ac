"""The job as the GPU's own compute processes declare it in their environment.

For each process on the GPU (NVML's compute processes, via ``pids_for``) we read
``<proc_root>/<pid>/environ`` and keep ONLY the keys in ``names.PROCESS_ENV_KEYS``. A process
environment holds secrets (tokens, passwords, keys), so every other entry is dropped as it is parsed:
it is never stored, logged, put in an exception or exported.

Two facts of Linux shape this link:
- ``/proc/<pid>/environ`` is the environment the process was started with; a variable set later from
  inside (``os.environ[...] = ...``) is not there. Set ``OFU_JOB_ID`` in the launcher or batch script.
- Reading another user's ``environ`` needs the same uid or CAP_SYS_PTRACE, and the pids NVML reports are
  host pids, so a containerised producer needs the host pid namespace. A process we may not read, or
  that exited meanwhile, is skipped; the other processes still count.

Precedence: ``OFU_JOB_ID`` (scheduler ``process``), else ``SLURM_JOB_ID`` (``slurm``), else
``TORCHELASTIC_RUN_ID`` (``process``: torchrun knows the run, not the scheduler). The first process, in
the order ``pids_for`` gives them, that yields a job id decides the job; precision comes from the first
process with ``OFU_PRECISION``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final

import attrs

from otel_ofu import names
from otel_ofu.attribution.base import normalise_precision
from otel_ofu.model import GpuIdentity

LINK_NAME: Final = "process_env"

log = logging.getLogger(__name__)

PidsFor = Callable[[GpuIdentity], Sequence[int]]

# Matched on the raw bytes so that no other entry is ever decoded into a string.
_WANTED: Final[Mapping[bytes, str]] = {key.encode("ascii"): key for key in names.PROCESS_ENV_KEYS}

# (job id key, job name keys, scheduler), in precedence order.
_JOB_SOURCES: Final = (
    (names.ENV_OFU_JOB_ID, (names.ENV_OFU_JOB_NAME, "SLURM_JOB_NAME"), "process"),
    ("SLURM_JOB_ID", ("SLURM_JOB_NAME", names.ENV_OFU_JOB_NAME), "slurm"),
    ("TORCHELASTIC_RUN_ID", (names.ENV_OFU_JOB_NAME,), "process"),
)


def parse_environ(raw: bytes) -> dict[str, str]:
    """The ``PROCESS_ENV_KEYS`` entries of a NUL-separated environment block, nothing else.

    Like getenv, the first occurrence of a key wins; empty values count as absent.
    """
    kept: dict[str, str] = {}
    for entry in raw.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        name = _WANTED.get(key) if sep else None
        if name is None or name in kept:
            continue
        text = value.decode("utf-8", "replace").strip()
        if text:
            kept[name] = text
    return kept


def read_process_environment(proc_root: Path, pid: int) -> dict[str, str] | None:
    """The wanted keys of one process's environment, or None when it cannot be read."""
    try:
        raw = (proc_root / str(int(pid)) / "environ").read_bytes()
    except OSError as error:
        # Only the class: the path is harmless, but nothing of a process environment goes into logs.
        log.debug("process %d: environment not readable (%s), skipped", pid, type(error).__name__)
        return None
    return parse_environ(raw)


def job_attributes(environment: Mapping[str, str]) -> dict[str, str]:
    """The contract attributes one process's (already filtered) environment gives."""
    attributes: dict[str, str] = {}
    for id_key, name_keys, scheduler in _JOB_SOURCES:
        job_id = environment.get(id_key)
        if job_id is None:
            continue
        attributes[names.JOB_ID] = job_id
        attributes[names.JOB_SCHEDULER] = scheduler
        job_name = next((environment[key] for key in name_keys if key in environment), None)
        if job_name is not None:
            attributes[names.JOB_NAME] = job_name
        break
    precision = environment.get(names.ENV_OFU_PRECISION)
    if precision is not None:
        attributes[names.GPU_PRECISION] = normalise_precision(precision)
    return attributes


@attrs.define
class ProcessEnvAttributor:
    """Attributes a GPU from the environment of the processes running on it."""

    pids_for: PidsFor
    proc_root: Path = attrs.field(default=Path("/proc"), converter=Path)
    name: str = attrs.field(default=LINK_NAME, init=False)

    def attribute(self, gpu: GpuIdentity) -> Mapping[str, str]:
        result: dict[str, str] = {}
        for pid in self.pids_for(gpu):
            if pid <= 0:
                continue
            environment = read_process_environment(self.proc_root, pid)
            if not environment:
                continue
            found = job_attributes(environment)
            if names.JOB_ID in found and names.JOB_ID not in result:
                result.update({key: value for key, value in found.items() if key != names.GPU_PRECISION})
            if names.GPU_PRECISION in found and names.GPU_PRECISION not in result:
                result[names.GPU_PRECISION] = found[names.GPU_PRECISION]
            if names.JOB_ID in result and names.GPU_PRECISION in result:
                break
        return result

    def close(self) -> None:
        return None
