"""Flag changes in one sentence each: the bodies of the flag events (``outputs.flag_events``), in the words and with the
numbers the reports use (``reasons``: its reasons say a flag over a run, these one window's change)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from otel_ofu import names
from otel_ofu_collector.detectors import DETECTORS, GPU_DETECTORS
from otel_ofu_collector.report.reasons import THROTTLE_WORDS
from otel_ofu_collector.report.summary import format_time, hours, percent, plural
from otel_ofu_collector.results import GpuFlagReport, JobReport

_LABELS: Final = {d.metric.name: d.label for d in DETECTORS} | {d.metric.name: d.label for d in GPU_DETECTORS}


def _job_name(job_id: str, attributes: Mapping[str, str]) -> str:
    name = attributes.get(names.JOB_NAME)
    return f"{name} ({job_id})" if name and name != job_id else job_id


def job_sentence(job: JobReport, metric: str, raised: bool, end_ns: int) -> str:
    """The change of one job flag in the words of the reports' reasons."""
    who = f"job {_job_name(job.job_id, job.attributes)}"
    if not raised:
        return f"{who}: {_LABELS.get(metric, metric)} cleared (OFU {percent(job.ofu)}, MFU {percent(job.mfu)})"
    if metric == names.JOB_FLOPS_MISCOUNT.name:
        ratio = f"{job.mfu / job.ofu:.1f}x" if job.mfu is not None and job.ofu else "far above"
        return (
            f"{who}: suspected FLOP miscount: reported MFU {ratio} its OFU "
            f"({percent(job.mfu)} against {percent(job.ofu)})"
        )
    if metric == names.JOB_OFU_REGRESSION.name:
        return f"{who}: regression: OFU fell to {percent(job.ofu)}, below its own baseline"
    if metric == names.JOB_GPUS_IDLE.name:
        idle = job.flag(names.JOB_GPUS_IDLE) or 0.0
        return f"{who}: idle allocation: {plural(idle, 'GPU')} attributed with no tensor activity"
    if metric == names.JOB_HANG.name:
        hung = job.goodput.badput_s.get(names.GoodputCause.HANG, 0.0) if job.goodput is not None else 0.0
        return (
            f"{who}: hang: every one of its {plural(job.gpus, 'GPU')} ran kernels with nothing moving (no tensor, "
            f"memory or link traffic): {hours(hung)} hung in the window to {format_time(end_ns)}"
        )
    return f"{who}: {_LABELS.get(metric, metric)} raised"


def _gpu_name(flag: GpuFlagReport) -> str:
    host = flag.attributes.get(names.HOST_NAME)
    gpu = flag.attributes.get(names.HW_ID, "?")
    return f"{host}/{gpu}" if host else gpu


def gpu_sentence(flag: GpuFlagReport, job: JobReport | None) -> str:
    who = f"job {_job_name(flag.job_id, job.attributes if job is not None else {})}"
    gpu = f"GPU {_gpu_name(flag)}"
    if not flag.raised:
        return f"{who}: {_LABELS.get(flag.metric, flag.metric)} cleared on {gpu} (OFU {percent(flag.ofu)})"
    if flag.metric == names.GPU_STRAGGLER.name:
        ratio = f"{flag.ofu / flag.job_median_ofu:.2f}x" if flag.job_median_ofu else "far below"
        reason = flag.attributes.get(names.GPU_THROTTLE_REASON)
        cause = f", clock held down by {THROTTLE_WORDS.get(reason, reason)}" if reason else ""
        return (
            f"{who}: straggler: {gpu} at {ratio} the median OFU of its job's other GPUs "
            f"({percent(flag.ofu)} against {percent(flag.job_median_ofu)}){cause}"
        )
    return f"{who}: {_LABELS.get(flag.metric, flag.metric)} raised on {gpu}"


class _Sentences:
    """``outputs.flag_events.Sentences`` in these words."""

    def job(self, job: JobReport, metric: str, raised: bool, end_ns: int) -> str:
        return job_sentence(job, metric, raised, end_ns)

    def gpu(self, flag: GpuFlagReport, job: JobReport | None) -> str:
        return gpu_sentence(flag, job)


SENTENCES: Final = _Sentences()
