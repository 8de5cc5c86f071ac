"""Flag events: each flag's rise and fall as an OTLP log record, sent to the downstream beside the window's metrics.

A recovery controller, a pager or a chat webhook acts on a change, not on a gauge it would have to poll: when a flag
rises in a window (``JobReport.flag_changes``, ``GpuFlagReport.raised``) or falls, one log record says so, with

* ``event_name`` ``otel_ofu.flag.raised`` or ``otel_ofu.flag.cleared`` (``names.FlagEventName``), the window's end as
  its time, severity WARN for a rise (ERROR for a hang: every GPU of the job is held doing nothing) and INFO for a
  fall;
* a body of one sentence, in the words the reports use (``job llama-70b: hang: every one of its 8 GPUs ran kernels
  with nothing moving (...)``);
* the job's identity (``job.id``, ``job.name``), the GPU's for a GPU flag (``host.name``, ``hw.id``, and the flag's
  own labels such as ``gpu.throttle.reason``), the flag (``otel_ofu.flag``, ``otel_ofu.flag.kind``,
  ``otel_ofu.flag.value``, ``otel_ofu.flag.state``) and its figures under the names of the metrics they are values
  of (``job.ofu``, ``job.mfu``, ``job.gpus``, ``job.badput`` with its ``goodput.cause``, ``gpu.ofu`` and
  ``otel_ofu.peer_ofu``).

The OpenTelemetry Collector routes them like any logs: to Datadog's or Honeycomb's event intake, a webhook, a
controller (``examples/events/otelcol-flag-events.yaml``). A shard sends its GPU flags' events only: its merge tier
closes the jobs and sends theirs. The records go through a ``Delivery`` of their own on the downstream's logs endpoint
(``events_transport``: the same endpoint over gRPC, ``/v1/logs`` beside ``/v1/metrics`` over HTTP, or
``OTEL_EXPORTER_OTLP_LOGS_ENDPOINT``), queued, retried and counted as the window export is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Final, Protocol
from urllib.parse import urlparse

import attrs
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs, SeverityNumber
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from otel_ofu import names
from otel_ofu.otlp_client import OtlpClient, OtlpSettings, Transport
from otel_ofu.otlp_client.retry import Attempt
from otel_ofu.otlp_client.settings import GRPC, LOGS
from otel_ofu_collector.detectors import DETECTORS, GPU_DETECTORS
from otel_ofu_collector.outputs.delivery import Delivery
from otel_ofu_collector.results import GpuFlagReport, JobReport, WindowReport

logger = logging.getLogger(__name__)

# Records per request: a window in which thousands of flags change still goes in requests far under 4 MiB.
MAX_RECORDS_PER_REQUEST: Final = 1000

_KINDS: Final = {d.metric.name: d.kind for d in DETECTORS} | {d.metric.name: d.kind for d in GPU_DETECTORS}
# The goodput cause a job flag's time is booked under (its figure beside the flag).
_CAUSES: Final = {names.JOB_HANG.name: names.GoodputCause.HANG, names.JOB_GPUS_IDLE.name: names.GoodputCause.IDLE}

Value = str | float | int


@attrs.frozen
class FlagEvent:
    """One flag's rise or fall in one window, as its log record will say it."""

    time_ns: int
    name: str  # names.FlagEventName
    severity: int  # an OTLP SeverityNumber
    severity_text: str
    body: str
    attributes: Mapping[str, Value]


def _severity(metric: str, raised: bool) -> tuple[int, str]:
    if not raised:
        return SeverityNumber.SEVERITY_NUMBER_INFO, "INFO"
    if metric == names.JOB_HANG.name:
        return SeverityNumber.SEVERITY_NUMBER_ERROR, "ERROR"
    return SeverityNumber.SEVERITY_NUMBER_WARN, "WARN"


def _job_figures(job: JobReport, metric: str) -> dict[str, Value]:
    figures: dict[str, Value] = {names.JOB_GPUS.name: job.gpus}
    if job.ofu is not None:
        figures[names.JOB_OFU.name] = job.ofu
    if job.mfu is not None:
        figures[names.JOB_MFU.name] = job.mfu
    cause = _CAUSES.get(metric)
    if cause is not None and job.goodput is not None and cause in job.goodput.badput_s:
        figures[names.JOB_BADPUT.name] = job.goodput.badput_s[cause]
        figures[names.GOODPUT_CAUSE] = cause
    return figures


class Sentences(Protocol):
    """The one-sentence bodies, in the reports' words (``report.flag_words.SENTENCES``: the reports' package imports
    the outputs, so the service hands them in)."""

    def job(self, job: JobReport, metric: str, raised: bool, end_ns: int) -> str: ...

    def gpu(self, flag: GpuFlagReport, job: JobReport | None) -> str: ...


def flag_events(
    report: WindowReport, sentences: Sentences, *, job_flags: bool = True, gpu_flags: bool = True
) -> list[FlagEvent]:
    """The window's flag changes as events: the jobs' (``job_flags``) in job order, then the GPUs' (``gpu_flags``)."""
    events: list[FlagEvent] = []
    jobs = {job.job_id: job for job in report.jobs}
    if job_flags:
        for job in report.jobs:
            for metric, raised in job.flag_changes.items():
                severity, text = _severity(metric, raised)
                attributes: dict[str, Value] = {
                    names.JOB_ID: job.job_id,
                    **{k: v for k, v in job.attributes.items() if k == names.JOB_NAME},
                    names.EVENT_FLAG: metric,
                    names.EVENT_FLAG_KIND: _KINDS.get(metric, metric),
                    names.EVENT_FLAG_VALUE: job.flags.get(metric) or 0,
                    names.EVENT_FLAG_STATE: names.FlagState.RAISED if raised else names.FlagState.CLEARED,
                    **_job_figures(job, metric),
                }
                event = names.FlagEventName.RAISED if raised else names.FlagEventName.CLEARED
                body = sentences.job(job, metric, raised, report.end_ns)
                events.append(FlagEvent(report.end_ns, event, severity, text, body, attributes))
    if gpu_flags:
        for flag in report.gpu_flags:
            if not (flag.raised or not flag.value):
                continue  # still up: said when it rose
            owner = jobs.get(flag.job_id)
            severity, text = _severity(flag.metric, flag.raised)
            name = owner.attributes.get(names.JOB_NAME) if owner is not None else None
            attributes = {
                names.JOB_ID: flag.job_id,
                **({names.JOB_NAME: name} if name else {}),
                **flag.attributes,
                names.EVENT_FLAG: flag.metric,
                names.EVENT_FLAG_KIND: _KINDS.get(flag.metric, flag.metric),
                names.EVENT_FLAG_VALUE: flag.value,
                names.EVENT_FLAG_STATE: names.FlagState.RAISED if flag.raised else names.FlagState.CLEARED,
                names.GPU_OFU.name: flag.ofu,
                names.EVENT_PEER_OFU: flag.job_median_ofu,
            }
            event = names.FlagEventName.RAISED if flag.raised else names.FlagEventName.CLEARED
            events.append(FlagEvent(report.end_ns, event, severity, text, sentences.gpu(flag, owner), attributes))
    return events


def _any_value(value: Value) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    return AnyValue(string_value=str(value))


def encode_events(
    events: Sequence[FlagEvent], resource_attributes: Mapping[str, str | int], observed_ns: int
) -> Iterator[bytes]:
    """ExportLogsServiceRequests of the events, ``MAX_RECORDS_PER_REQUEST`` at most each, serialized: the
    collector's resource (service.name its own), the collector's scope, the conventions' schema URL."""
    resource = Resource(
        attributes=[
            KeyValue(key=key, value=_any_value(value))
            for key, value in {**resource_attributes, names.SERVICE_NAME: names.COLLECTOR_SERVICE_NAME}.items()
        ]
    )
    scope = InstrumentationScope(name=names.COLLECTOR_INSTRUMENTATION_SCOPE)
    for first in range(0, len(events), MAX_RECORDS_PER_REQUEST):
        records = [
            LogRecord(
                time_unix_nano=event.time_ns,
                observed_time_unix_nano=observed_ns,
                severity_number=event.severity,  # type: ignore[arg-type]
                severity_text=event.severity_text,
                event_name=event.name,
                body=AnyValue(string_value=event.body),
                attributes=[KeyValue(key=key, value=_any_value(value)) for key, value in event.attributes.items()],
            )
            for event in events[first : first + MAX_RECORDS_PER_REQUEST]
        ]
        request = ExportLogsServiceRequest(
            resource_logs=[
                ResourceLogs(
                    resource=resource,
                    scope_logs=[ScopeLogs(scope=scope, log_records=records, schema_url=names.SCHEMA_URL)],
                    schema_url=names.SCHEMA_URL,
                )
            ]
        )
        yield request.SerializeToString()


def logs_endpoint(settings: OtlpSettings, environ: Mapping[str, str]) -> str:
    """Where the logs go: ``OTEL_EXPORTER_OTLP_LOGS_ENDPOINT`` where set; over gRPC the metrics' endpoint; over HTTP
    its ``/v1/metrics`` made ``/v1/logs`` (a custom path: ``/v1/logs`` beside it)."""
    explicit = (environ.get("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT") or "").strip()
    if explicit:
        return explicit
    endpoint = settings.endpoint
    if settings.protocol == GRPC:
        return endpoint
    path = urlparse(endpoint).path
    if path.endswith("/v1/metrics"):
        return endpoint[: len(endpoint) - len("/v1/metrics")] + "/v1/logs"
    return endpoint.rstrip("/") + "/v1/logs"


def events_transport(settings: OtlpSettings, environ: Mapping[str, str]) -> EventsTransport:
    """The downstream's logs client, as the window export's client is its metrics one (its settings, the logs'
    service and endpoint)."""
    logs = attrs.evolve(settings, endpoint=logs_endpoint(settings, environ), signal=LOGS)
    where = f"downstream {logs.endpoint} (logs)"
    return EventsTransport(OtlpClient(logs, names.COLLECTOR_EXPORT_REJECTED.name, where=where), logs.endpoint)


# How a receiver without a logs pipeline answers: the OpenTelemetry Collector's OTLP receiver registers only the
# services of its pipelines (gRPC UNIMPLEMENTED), an HTTP route that is not there (404); the client's cause quotes it.
_NO_LOGS: Final = ("(UNIMPLEMENTED", "(HTTP 404")


@attrs.define
class EventsTransport:
    """The logs client, which says once when the downstream takes no logs (a Collector with metrics pipelines only:
    the shipped agent and gateways) rather than an error per flag change: the first such refusal goes to the
    delivery as it is (dropped, counted, said), the later ones are dropped here and counted in ``unsupported``
    (the service adds them to ``otel_ofu_collector.dropped{reason="events_rejected"}``)."""

    inner: Transport
    where: str
    unsupported: int = 0
    _refused: bool = False

    def send(self, payload: bytes) -> Attempt:
        if self._refused:
            self.unsupported += 1
            return Attempt(True)
        attempt = self.inner.send(payload)
        if attempt.refused and any(answer in attempt.cause for answer in _NO_LOGS):
            self._refused = True
            logger.warning(
                "downstream %s takes no OTLP logs (%s): the flag events are dropped and counted from now on; give it a "
                "logs pipeline to route them (examples/events/otelcol-flag-events.yaml), and restart",
                self.where,
                attempt.cause,
            )
        return attempt

    def self_metrics(self) -> dict[str, dict[str, int]]:
        """The events dropped here, under the events stream's drops (``events_rejected``)."""
        return {names.COLLECTOR_DROPPED.name: {"events_rejected": self.unsupported}}

    def close(self) -> None:
        self.inner.close()


@attrs.frozen
class OtlpEventExport:
    """A window consumer: each batch's flag changes as log records, queued on ``delivery`` (which the service starts
    and stops with the other senders). ``job_flags`` False: a shard, whose merge tier says the jobs' changes."""

    delivery: Delivery
    resource_attributes: Mapping[str, str | int]
    sentences: Sentences
    clock: Callable[[], int] | None = None  # the service's (ns), for the records' observed time
    job_flags: bool = True

    def start(self) -> None:
        return None

    def consume_windows(self, windows: Sequence[WindowReport]) -> None:
        events = [
            event for report in windows for event in flag_events(report, self.sentences, job_flags=self.job_flags)
        ]
        if not events:
            return
        observed = self.clock() if self.clock is not None else max(event.time_ns for event in events)
        for payload in encode_events(events, self.resource_attributes, observed):
            self.delivery.submit(payload)

    def shutdown(self) -> None:
        return None


__all__ = [
    "EventsTransport",
    "FlagEvent",
    "OtlpEventExport",
    "Sentences",
    "encode_events",
    "events_transport",
    "flag_events",
    "logs_endpoint",
]
