"""What each GPU of a source will export, and for each output it will not, why and the exact line that gives it.

The outputs a GPU can have (``OUTPUTS``): OFU, raw OFU (against the board's own max clock), the finer loss split
(engine and SM activity beside tensor activity), energy, throttle reasons, link traffic and its job. Each one missing
is named with the reason and the fix in the source's own terms: a line of dcgm-exporter's counters file, an entry of
the AMD Device Metrics Exporter's config, a DCGM field, a ``dcgmi dmon -e`` list or an otel-ofu option. Pure: the
snapshot a source read (and what its kind is) in, the findings out; ``otel_ofu.commands.doctor`` reads and prints.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from otel_ofu import catalog, names
from otel_ofu.gpu_samples import AttributeValue, compute_snapshot
from otel_ofu.gpu_values import GpuValues, max_clock_hint
from otel_ofu.model import GpuError, GpuIdentity, GpuReading, Snapshot

OUTPUTS = ("ofu", "ofu_raw", "loss_split", "energy", "throttle", "links", "job")
LABELS: Mapping[str, str] = {
    "ofu": "OFU",
    "ofu_raw": "raw OFU",
    "loss_split": "finer loss split",
    "energy": "energy",
    "throttle": "throttle",
    "links": "links",
    "job": "job attribution",
}

# dcgm-exporter's counters file: "DCGM FIELD, Prometheus metric type, help message", one per field. The old tags are
# the ones every dcgm-exporter accepts (DCGM 4.6.1 kept them as aliases of the new ones).
_CSV = {
    "tensor": "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge, Ratio of cycles any tensor pipe is active.",
    "sm_clock": "DCGM_FI_DEV_SM_CLOCK, gauge, SM clock frequency (in MHz).",
    "max_clock": "DCGM_FI_DEV_MAX_SM_CLOCK, gauge, Maximum SM clock frequency (in MHz).",
    "engine": "DCGM_FI_PROF_GR_ENGINE_ACTIVE, gauge, Ratio of time the graphics engine is active.",
    "sm_active": "DCGM_FI_PROF_SM_ACTIVE, gauge, The ratio of cycles an SM has at least 1 warp assigned.",
    "energy": "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, counter, Total energy consumption since boot (in mJ).",
    "throttle": "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS, gauge, Current clock throttle reasons.",
    "links": "\n".join(
        f"{field}, gauge, {what} (in B/s)."
        for field, what in (
            ("DCGM_FI_PROF_PCIE_TX_BYTES", "PCIe bytes transmitted per second"),
            ("DCGM_FI_PROF_PCIE_RX_BYTES", "PCIe bytes received per second"),
            ("DCGM_FI_PROF_NVLINK_TX_BYTES", "NVLink bytes transmitted per second"),
            ("DCGM_FI_PROF_NVLINK_RX_BYTES", "NVLink bytes received per second"),
        )
    ),
}
_CSV_WHERE = "add to dcgm-exporter's counters file (its -f / DCGM_EXPORTER_COLLECTORS file):"
# The AMD Device Metrics Exporter's config.json: GPUConfig.Fields lists the fields; the profiler's (GPU_PROF_*) need
# GPUConfig.ProfilerMetrics on.
_AMD_PROFILER = '"ProfilerMetrics": {"all": true}'
_AMD_FIELDS = {
    "tensor": "GPU_PROF_TENSOR_ACTIVE_PERCENT",
    "gpu_active": "GPU_PROF_GUI_UTIL_PERCENT",
    "sm_clock": "GPU_CLOCK",
    "max_clock": "GPU_MAX_CLOCK",
    "energy": "GPU_ENERGY_CONSUMED",
}
# DCGM field ids per input, oldest generation first (what a host engine of any version knows).
_DCGM_FIELDS = {
    "tensor": (names.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE,),
    "sm_clock": (names.DCGM_FI_DEV_SM_CLOCK,),
    "max_clock": (names.DCGM_FI_DEV_MAX_SM_CLOCK,),
    "engine": (names.DCGM_FI_PROF_GR_ENGINE_ACTIVE,),
    "sm_active": (names.DCGM_FI_PROF_SM_ACTIVE,),
    "links": (
        names.DCGM_FI_PROF_PCIE_TX_BYTES,
        names.DCGM_FI_PROF_PCIE_RX_BYTES,
        names.DCGM_FI_PROF_NVLINK_TX_BYTES,
        names.DCGM_FI_PROF_NVLINK_RX_BYTES,
    ),
}


@attrs.frozen
class Finding:
    """One output of one GPU: whether it will be exported, what it is, and if not, why and the line that gives it."""

    output: str  # one of OUTPUTS
    present: bool
    value: float | None = None  # the OFU or raw OFU of this read
    note: str = ""  # what it is or where it came from
    why: str = ""  # why it is missing
    fix: str = ""  # the exact line or option that gives it (or, with a note, a better one)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"present": self.present}
        for key in ("value", "note", "why", "fix"):
            if getattr(self, key) not in (None, ""):
                out[key] = getattr(self, key)
        return out


@attrs.frozen
class GpuDiagnosis:
    gpu: GpuIdentity
    attributes: Mapping[str, AttributeValue]
    findings: tuple[Finding, ...]

    @property
    def gives_ofu(self) -> bool:
        return any(finding.output == "ofu" and finding.present for finding in self.findings)

    def as_json(self) -> dict[str, Any]:
        line: dict[str, Any] = dict(self.gpu.resource_attributes())
        line["outputs"] = {finding.output: finding.as_json() for finding in self.findings}
        return line


@attrs.frozen
class SourceFacts:
    """What the doctor knows of the source beside its snapshot: its kind (``--source``), and for a ``dcgmi dmon``
    capture its ``-e`` list, for the AMD exporter which field gave each GPU's active share."""

    kind: str
    dmon_fields: Sequence[int] | None = None
    activity_basis: Mapping[str, str] = attrs.field(factory=dict)


def diagnose(snapshot: Snapshot, facts: SourceFacts) -> tuple[tuple[GpuDiagnosis, ...], tuple[GpuError, ...]]:
    """Every GPU's findings, in the source's order, and the errors of the source as a whole (a page that is not
    the exporter's, a scrape that failed)."""
    computed = compute_snapshot(snapshot)
    values = {sample.gpu.key: sample for sample in computed.samples}
    partial = {item.gpu.key: item for item in computed.partial}
    out: list[GpuDiagnosis] = []
    for reading in snapshot.readings:
        key = reading.gpu.key
        sample = values.get(key)
        attributes = sample.attributes if sample is not None else partial[key].attributes
        why = "; ".join(error.message for error in computed.errors_of(key))
        out.append(_diagnosis(reading, sample.values if sample is not None else None, attributes, why, facts))
    whole = tuple(error for error in computed.errors if error.gpu is None)
    return tuple(out), whole


def _diagnosis(
    reading: GpuReading,
    values: GpuValues | None,
    attributes: Mapping[str, AttributeValue],
    why_no_ofu: str,
    facts: SourceFacts,
) -> GpuDiagnosis:
    fixes = _Fixes(facts, reading)
    findings = (
        _ofu(reading, values, why_no_ofu, fixes),
        _raw(reading, values, fixes),
        _loss_split(reading, fixes),
        Finding("energy", True, note="the board's energy counter")
        if reading.energy is not None
        else Finding("energy", False, why="the source gives no energy counter for it", fix=fixes.of("energy")),
        Finding("throttle", True, note=_throttle(reading.throttle))
        if reading.throttle
        else Finding("throttle", False, why="the source gives no throttle reasons for it", fix=fixes.of("throttle")),
        Finding("links", True, note=", ".join(_links(reading)))
        if reading.pcie_io or reading.nvlink_io
        else Finding("links", False, why="the source gives no PCIe or NVLink traffic for it", fix=fixes.of("links")),
        _job(reading, attributes, fixes),
    )
    return GpuDiagnosis(reading.gpu, attributes, findings)


def _throttle(shares: Mapping[str, float]) -> str:
    held = [f"{reason} {share:.0%}" for reason, share in sorted(shares.items()) if share > 0]
    return "held down: " + ", ".join(held) if held else "not held down in this read (reasons known)"


def _links(reading: GpuReading) -> list[str]:
    return [name for name, counters in (("PCIe", reading.pcie_io), ("NVLink", reading.nvlink_io)) if counters]


def _ofu(reading: GpuReading, values: GpuValues | None, why_no_ofu: str, fixes: _Fixes) -> Finding:
    if values is not None:
        note = f"tensor activity {values.tensor_active:.3f}"
        if values.sm_clock_hz is not None:
            spec = catalog.lookup(reading.gpu.model)
            reference = spec.tensor_clock_hz if spec is not None and spec.tensor_clock_hz else values.max_sm_clock_hz
            if reference is not None and values.tensor_active > 0:
                note += f" x SM clock {values.sm_clock_hz / 1e6:.0f} MHz / {reference / 1e6:.0f} MHz"
        basis = fixes.facts.activity_basis.get(reading.gpu.key)
        if basis == names.AMD_EXPORTER_GFX_ACTIVITY:
            note += (
                f"; the GPU's active share is {names.AMD_EXPORTER_GFX_ACTIVITY} (the SMI's GFX busy share), "
                f"standing in for {names.AMD_EXPORTER_GPU_ACTIVE}"
            )
            return Finding("ofu", True, values.ofu, note=note, fix=fixes.of("gpu_active"))
        return Finding("ofu", True, values.ofu, note=note)
    wanted = []
    amd = fixes.facts.kind == "amd-exporter"
    if (
        reading.cycles is None
        and reading.tensor_active is None
        and (not amd or names.AMD_EXPORTER_MFMA_ACTIVE in why_no_ofu)
    ):
        wanted.append("tensor")
    if amd and "GPU activity" in why_no_ofu:
        wanted.append("gpu_active")
    if reading.cycles is None and reading.sm_clock_hz is None:
        wanted.append("sm_clock")
    no_max = "no max SM clock" in why_no_ofu
    if reading.max_sm_clock_hz is None and ("sm_clock" in wanted or no_max):
        wanted.append("max_clock")  # the device's own max, recorded beside the clock, gives raw OFU too
    fix = fixes.of(*wanted) if wanted else ""
    if no_max:  # neither the source nor the catalog has the model's max clock: the option gives it
        fix = "\n".join(part for part in (fix, f"or give otel-ofu {max_clock_hint(reading.gpu.model)}") if part)
    return Finding("ofu", False, why=why_no_ofu or "no OFU from this read", fix=fix)


def _raw(reading: GpuReading, values: GpuValues | None, fixes: _Fixes) -> Finding:
    if values is not None and values.ofu_raw is not None and values.max_sm_clock_hz is not None:
        where = "the catalog's rating" if values.max_clock_from_catalog else "the source"
        note = f"against the board's max SM clock {values.max_sm_clock_hz / 1e6:.0f} MHz, from {where}"
        fix = fixes.of("max_clock") if values.max_clock_from_catalog else ""
        return Finding("ofu_raw", True, values.ofu_raw, note=note, fix=fix)
    if values is None:
        return Finding("ofu_raw", False, why="no OFU (above)")
    why = "no board max SM clock from the source or the catalog (OFU is taken against the tensor clock)"
    fix = "\n".join(
        part for part in (fixes.of("max_clock"), f"or give otel-ofu {max_clock_hint(reading.gpu.model)}") if part
    )
    return Finding("ofu_raw", False, why=why, fix=fix)


def _loss_split(reading: GpuReading, fixes: _Fixes) -> Finding:
    missing = [
        (what, label)
        for what, label, value in (
            ("engine", "engine activity", reading.engine_active),
            ("sm_active", "SM activity", reading.sm_active),
        )
        if value is None
    ]
    if not missing:
        note = f"engine {reading.engine_active:.3f}, SM {reading.sm_active:.3f}"
        return Finding("loss_split", True, note=note)
    why = "no " + " and no ".join(label for _, label in missing) + " (the loss beyond the clock stays one cause)"
    if fixes.facts.kind == "amd-exporter" and any(what == "sm_active" for what, _ in missing):
        why += "; the AMD exporter has no SM activity in NVIDIA's sense (its gpu_prof_sm_active is VALU busy time)"
    return Finding("loss_split", False, why=why, fix=fixes.of(*(what for what, _ in missing)))


def _job(reading: GpuReading, attributes: Mapping[str, AttributeValue], fixes: _Fixes) -> Finding:
    job = attributes.get(names.JOB_ID)
    if job is not None:
        scheduler = attributes.get(names.JOB_SCHEDULER, "")
        return Finding("job", True, note=f"job.id {job} ({scheduler})" if scheduler else f"job.id {job}")
    pod = attributes.get(names.K8S_POD_NAME)
    if pod is not None:
        namespace = attributes.get(names.K8S_NAMESPACE_NAME, "")
        where = f"{namespace}/{pod}" if namespace else str(pod)
        why = f"the source names its pod, {where}, but not the pod's job"
        fix = "give otel-ofu run --k8s-pods-url auto (in the cluster, or an API server URL): its workload is its job"
        return Finding("job", False, why=why, fix=fix)
    return Finding("job", False, why="the source names no pod or job for it", fix=fixes.of("job"))


@attrs.frozen
class _Fixes:
    """The fix lines in the terms of one source kind."""

    facts: SourceFacts
    reading: GpuReading

    def of(self, *wanted: str) -> str:
        kind = self.facts.kind
        if kind == "dcgm-exporter":
            return self._dcgm_exporter(wanted)
        if kind == "amd-exporter":
            return self._amd(wanted)
        if kind == "dcgm":
            return self._dcgm(wanted)
        if kind in ("nvml", "auto"):
            return self._nvml(wanted)
        if kind == "replay":
            return self._replay(wanted)
        return ""

    def _dcgm_exporter(self, wanted: Sequence[str]) -> str:
        if "job" in wanted:
            return (
                "run dcgm-exporter with --kubernetes (each GPU's pod, as labels) or --hpc-job-mapping-dir DIR (Slurm "
                "jobs), or give otel-ofu run --kubelet-socket, --slurm-mapping-dir or --job-id"
            )
        if "throttle" in wanted:
            violations = "DCGM_FI_DEV_POWER_VIOLATION, counter, Throttling duration due to power constraints (in ns)."
            return f"{_CSV_WHERE}\n{_CSV['throttle']}\n(and for shares of time, the violation counters: {violations})"
        lines = [_CSV[what] for what in wanted if what in _CSV]
        return "\n".join([_CSV_WHERE, *lines]) if lines else ""

    def _amd(self, wanted: Sequence[str]) -> str:
        if "job" in wanted:
            return 'add to its config\'s GPUConfig "Labels": "POD", "NAMESPACE", "CONTAINER" (and "JOB_ID" with Slurm)'
        fields = [_AMD_FIELDS[what] for what in wanted if what in _AMD_FIELDS]
        if "engine" in wanted:
            fields.append(_AMD_FIELDS["gpu_active"])
        if not fields:
            return ""  # what the exporter has no field for (SM activity, throttle, links): nothing to turn on
        quoted = ", ".join(f'"{field}"' for field in dict.fromkeys(fields))
        profiler = any(field.startswith("GPU_PROF_") for field in fields)
        tail = f", with {_AMD_PROFILER}" if profiler else ""
        return f'add to the AMD Device Metrics Exporter config\'s GPUConfig "Fields": {quoted}{tail}'

    def _dcgm(self, wanted: Sequence[str]) -> str:
        if "job" in wanted:
            return "give otel-ofu run --kubelet-socket, --slurm-mapping-dir or --job-id"
        ids = [field for what in wanted for field in _DCGM_FIELDS.get(what, ())]
        if not ids:
            return ""
        profiling = {names.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, names.DCGM_FI_PROF_GR_ENGINE_ACTIVE}
        extra = (
            ": profiling fields need nv-hostengine run as root and no other profiler (Nsight) holding the counters"
            if profiling & set(ids) or names.DCGM_FI_PROF_SM_ACTIVE in ids
            else ""
        )
        return f"DCGM field{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))}{extra}"

    def _nvml(self, wanted: Sequence[str]) -> str:
        if "job" in wanted:
            return "give otel-ofu run --kubelet-socket, --slurm-mapping-dir or --job-id"
        if {"tensor", "engine", "sm_active", "links"} & set(wanted):
            return "NVML's GPM metrics need a Hopper or newer GPU: on an older one use --source dcgm"
        return ""  # NVML gives the clocks, energy and throttle reasons of every GPU it supports

    def _replay(self, wanted: Sequence[str]) -> str:
        fields = self.facts.dmon_fields
        if fields is None:
            return "the capture lacks it: record one (otel-ofu run --record) from a source that has it"
        ids = [field for what in wanted for field in _DCGM_FIELDS.get(what, ()) if field not in fields]
        if not ids:
            return "dcgmi dmon captures give otel-ofu no energy or throttle reasons" if wanted else ""
        return f"record it with dcgmi dmon -e {','.join(map(str, [*fields, *ids]))}"


def summary(diagnoses: Sequence[GpuDiagnosis]) -> str:
    giving = sum(diagnosis.gives_ofu for diagnosis in diagnoses)
    return f"{giving} of {len(diagnoses)} GPUs give OFU"
