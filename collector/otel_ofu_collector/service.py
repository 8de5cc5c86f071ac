"""The collector processor as one service: receivers -> decoder -> windows -> exporters.

``CollectorService(options).start()`` starts every window consumer (``consumer.WindowConsumer``), in order: the
given ``consumers``, then the Prometheus endpoint and the OTLP export to the downstream receiver, whichever are
on; then the receivers, which listen, then the senders downstream. A timer closes due windows every ``flush_interval_s``
(tests set it to 0 and call ``flush(now_ns)``); each batch of closed windows goes to every consumer in that
order. ``stop`` refuses new requests (UNAVAILABLE with RetryInfo), closes every open window, exports it, shuts
the consumers down in the reverse order (one failing costs none of the others), then the senders and the
receivers.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import attrs
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from otel_ofu import names
from otel_ofu.gpu_values import CalibrationTable
from otel_ofu.health import Heartbeat
from otel_ofu.otlp_client import OtlpClient, OtlpSettings, Transport, configured_endpoint
from otel_ofu_collector.aggregation.merge import MergeAggregator
from otel_ofu_collector.aggregation.windows import Aggregator
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.lifecycle import shutdown_in_reverse, start_in_order
from otel_ofu_collector.options import declared as option
from otel_ofu_collector.otlp.dcgm_series import DcgmSeries, Translation, carries_dcgm_series
from otel_ofu_collector.otlp.decode import DEFAULT_MAX_MFU, DecodeOutcome, Decoder, DecoderStats, parse_request
from otel_ofu_collector.outputs.consumer import WindowConsumer
from otel_ofu_collector.outputs.delivery import Delivery, DownstreamLog
from otel_ofu_collector.outputs.flag_events import EventsTransport, OtlpEventExport, events_transport
from otel_ofu_collector.outputs.otlp_export import OtlpWindowExport
from otel_ofu_collector.outputs.queues import MemoryQueue, Queue, SqliteSpool
from otel_ofu_collector.outputs.self_telemetry import SelfMetrics, SelfTelemetry, gathered
from otel_ofu_collector.receivers.admission import MAX_REQUEST_BYTES, BodyBudget, Gate
from otel_ofu_collector.receivers.auth import BearerAuth, TlsFiles
from otel_ofu_collector.receivers.base import Receiver
from otel_ofu_collector.receivers.otlp_grpc import GrpcReceiver
from otel_ofu_collector.receivers.otlp_http import HttpReceiver
from otel_ofu_collector.report import flag_words
from otel_ofu_collector.results import WindowReport
from otel_ofu_collector.storage.spool_lock import SpoolLock
from otel_ofu_collector.storage.write_ahead import WriteAhead

if TYPE_CHECKING:  # the endpoint module (and prometheus_client) loads only when the endpoint is on
    from otel_ofu_collector.outputs.prometheus import PrometheusEndpoint

logger = logging.getLogger(__name__)

DEFAULT_SHUTDOWN_GRACE_S: Final = option.SHUTDOWN_GRACE.default  # stop's, as the command's
REJECTION_LOG_INTERVAL_S = 60.0  # at most one summary line of rejected points this often
# How far past this run's clock the write-ahead's close time may lie (a clock stepped back between runs);
# further, the value is damaged.
_CLOCK_SLACK_NS = 86_400 * 1_000_000_000


@attrs.frozen
class CollectorOptions:
    """Everything ``otel-ofu collector`` can be told; a field an option fills takes its default and range
    (``OPTION.field()``, options/declared.py), the rest are the library's and the tests' own.

    ``export_endpoint`` None means: the standard ``OTEL_EXPORTER_OTLP_[METRICS_]ENDPOINT`` if set, else no
    downstream at all (outputs go to the other window consumers and Prometheus only) - never a guessed
    localhost:4317, which would be this collector itself.
    """

    aggregator: AggregatorConfig = attrs.field(factory=AggregatorConfig)
    mode: str = option.MODE.field()  # process | shard | merge
    grpc_listen: str | None = option.LISTEN.field()
    http_listen: str | None = option.HTTP_LISTEN.field()
    export_endpoint: str | None = option.EXPORT_ENDPOINT.field()
    # grpc | http/protobuf; None: OTEL_EXPORTER_OTLP_PROTOCOL, else grpc
    export_protocol: str | None = option.EXPORT_PROTOCOL.field()
    prometheus_port: int | None = option.PROMETHEUS_PORT.field()
    # Loopback by default: the endpoint shows job names and values with neither TLS nor a token, whatever
    # the receivers require. Exposing it is a choice (--prometheus-host 0.0.0.0), as for the producer.
    prometheus_host: str = option.PROMETHEUS_HOST.field()
    prometheus_expiration_windows: int = option.PROMETHEUS_EXPIRATION_WINDOWS.field()
    pass_through: bool = option.PASS_THROUGH.field()
    forward_inputs: bool = option.FORWARD_INPUTS.field()
    spool_path: str | None = option.SPOOL.field()
    spool_max_bytes: int = option.SPOOL_MAX_BYTES.field()
    queue_max_requests: int = 1024
    pass_through_queue_max_requests: int = 1024
    tls: TlsFiles | None = None
    bearer_token: str | None = None
    max_in_flight: int = option.MAX_IN_FLIGHT.field()
    http_body_deadline_s: float = option.HTTP_BODY_DEADLINE.field()
    http_body_min_rate: float = option.HTTP_BODY_MIN_RATE.field()  # bytes/s after the grace; 0: none
    retry_after_s: float = 1.0
    flush_interval_s: float = 1.0  # 0: no timer, the caller calls flush()
    max_request_bytes: int = MAX_REQUEST_BYTES
    # The largest request sent downstream: bigger window outputs and pass-through are split to fit.
    export_max_request_bytes: int = option.EXPORT_MAX_REQUEST_BYTES.field()
    max_attribute_length: int = option.MAX_ATTRIBUTE_LENGTH.field()
    max_mfu: float = DEFAULT_MAX_MFU
    rejection_log_interval_s: float = REJECTION_LOG_INTERVAL_S
    # With a spool, the open windows' accepted requests are written ahead in batches this often (a kill loses
    # at most one batch); 0 writes each request at once.
    write_ahead_batch_s: float = 0.2
    # The self-metrics go downstream with every batch of closed windows (as the OpenTelemetry Collector's
    # internal telemetry does), not only to the Prometheus endpoint.
    self_telemetry: bool = True
    # Each flag's rise and fall as an OTLP log record to the downstream's logs endpoint (outputs.flag_events).
    flag_events: bool = option.FLAG_EVENTS.field()
    # The outputs' resource beyond service.name and service.instance.id (which stay ours): where this
    # collector runs, from OTEL_RESOURCE_ATTRIBUTES (k8s.*, deployment.environment, ...).
    resource_attributes: Mapping[str, str] = attrs.field(factory=dict)
    # service.instance.id of the outputs: how the merge tier tells shards apart (and a retried export
    # of one shard's window from a second copy). Unique per replica; a stable pod name is ideal.
    instance_id: str = attrs.field(factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    max_future_skew_s: float | None = 300.0  # reject points stamped further ahead of the clock; None: off
    # dcgm-exporter scrapes (from an OpenTelemetry Collector's Prometheus receiver) read as the producer reads a page
    # (``otlp.dcgm_series``), with the producer's calibration factors (``--calibration``).
    calibration: CalibrationTable = attrs.field(factory=CalibrationTable)
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 30.0

    @property
    def include_partials(self) -> bool:
        return self.mode == "shard"


@attrs.define
class CollectorService:
    """One collector process. ``transport`` overrides the downstream client (tests inject fakes).

    The window export and pass-through share the one transport; the service owns it and closes it once
    both have stopped, so neither can close it under the other's send.
    """

    options: CollectorOptions = attrs.field(factory=CollectorOptions)
    clock: Callable[[], int] = time.time_ns
    # The records file, the live feed, a test's list: given before start, which starts them.
    consumers: list[WindowConsumer] = attrs.field(factory=list)
    transport: Transport | None = None
    # The flag events' client (logs); None: derived from the downstream's configuration (tests inject fakes).
    event_transport: Transport | None = None
    environ: Mapping[str, str] = attrs.field(factory=lambda: dict(os.environ))
    # Beaten after every timer flush: what /healthz answers from (``otel_ofu.health``); None: not kept.
    heartbeat: Heartbeat | None = None
    gate: Gate = attrs.field(init=False)
    decoder: Decoder = attrs.field(init=False)
    # In front of the decoder: dcgm-exporter scrapes into the producer's per-GPU requests (None in merge mode).
    dcgm_series: DcgmSeries | None = attrs.field(init=False, default=None)
    aggregator: Aggregator | MergeAggregator = attrs.field(init=False)
    exports: Delivery | None = attrs.field(init=False, default=None)
    pass_through: Delivery | None = attrs.field(init=False, default=None)
    _window_export: OtlpWindowExport | None = attrs.field(init=False, default=None)
    events: Delivery | None = attrs.field(init=False, default=None)  # the flag events' sender
    _event_export: OtlpEventExport | None = attrs.field(init=False, default=None)
    _receivers: list[Receiver] = attrs.field(init=False, factory=list)
    _prometheus: PrometheusEndpoint | None = attrs.field(init=False, default=None)
    _started_outputs: list[WindowConsumer] = attrs.field(init=False, factory=list)  # to shut down, in reverse
    _timer: threading.Thread | None = attrs.field(init=False, default=None)
    _stop_timer: threading.Event = attrs.field(init=False, factory=threading.Event)
    _publish_lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)
    _stopped: bool = attrs.field(init=False, default=False)
    _self_telemetry: SelfTelemetry | None = attrs.field(init=False, default=None)
    _self_metrics_sent_at: float | None = attrs.field(init=False, default=None)
    _write_ahead: WriteAhead | None = attrs.field(init=False, default=None)
    # The lock on --spool (None without one); a test that plays a kill releases it, as the kernel would.
    spool_lock: SpoolLock | None = attrs.field(init=False, default=None)
    _write_ahead_flushed: int = attrs.field(init=False, default=0)
    # The parts that count what they did, as they are made (self_metrics asks them, and the consumers that count).
    _counting: list[SelfMetrics] = attrs.field(init=False, factory=list)
    _rejections_logged: dict[str, int] = attrs.field(init=False, factory=dict)
    _rejections_logged_at: float | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        # One collector per spool, taken before either of its files is opened (``spool_lock``).
        self.spool_lock = SpoolLock.take(self.options.spool_path) if self.options.spool_path else None
        try:
            self._build()
        except BaseException:
            if self.spool_lock is not None:
                self.spool_lock.release()
            raise

    def _build(self) -> None:
        options = self.options
        self.gate = Gate(max_in_flight=options.max_in_flight, retry_after_s=options.retry_after_s)
        if options.mode == "merge":
            merger = MergeAggregator(options.aggregator)
            self.aggregator = merger
            self.decoder = Decoder(
                None,
                pass_through=options.pass_through,
                forward_inputs=options.forward_inputs,
                partial_sink=merger,
                max_attribute_length=options.max_attribute_length,
            )
        else:
            windows = options.aggregator
            if options.include_partials and not windows.partials:
                windows = attrs.evolve(windows, partials=True)  # what the merge tier adds the shards' windows from
            aggregator = Aggregator(windows)
            self.aggregator = aggregator
            self.decoder = Decoder(
                aggregator,
                pass_through=options.pass_through,
                forward_inputs=options.forward_inputs,
                max_mfu=options.max_mfu,
                clock=self.clock,
                max_future_ns=None if options.max_future_skew_s is None else int(options.max_future_skew_s * 1e9),
                max_attribute_length=options.max_attribute_length,
            )
            self.dcgm_series = DcgmSeries(
                calibration=options.calibration, stale_after_s=options.aggregator.stale_after_s
            )
            self._counting.append(_WindowState(aggregator, self.decoder))
        self._counting += [_Ingest(self.decoder), self.gate]
        transport = self.transport
        if transport is None and configured_endpoint(options.export_endpoint, self.environ) is not None:
            settings = OtlpSettings.resolve(
                protocol=options.export_protocol,
                endpoint=options.export_endpoint,
                environ=self.environ,
                protocol_option="--export-protocol",
            )
            transport = OtlpClient(
                settings, names.COLLECTOR_EXPORT_REJECTED.name, where=f"downstream {settings.endpoint}"
            )
            self.transport = transport
            if options.flag_events and self.event_transport is None:
                self.event_transport = events_transport(settings, self.environ)
        if transport is not None:
            # The streams below share the one downstream: its failures are said once for all of them.
            where = getattr(transport, "endpoint", type(transport).__name__)
            streams = ("window export", *(("pass-through",) if options.pass_through else ()))
            streams += ("self-metrics",) if options.self_telemetry else ()
            streams += ("flag events",) if options.flag_events and self.event_transport is not None else ()
            downstream = DownstreamLog(str(where), streams)
            spool = SqliteSpool(options.spool_path, options.spool_max_bytes) if options.spool_path else None
            queue: Queue = spool if spool is not None else MemoryQueue(max_items=options.queue_max_requests)
            self.exports = Delivery(
                transport,
                queue,
                name="window export",
                initial_backoff_s=options.initial_backoff_s,
                max_backoff_s=options.max_backoff_s,
                owns_transport=False,
                max_request_bytes=options.export_max_request_bytes,
                downstream=downstream,
            )
            self._counting.append(_Sender("windows", self.exports, spool))
            self._window_export = OtlpWindowExport(
                self.exports,
                self._resource_attributes(),
                include_partials=options.include_partials,
                started_ns=self.clock(),
            )
            if options.flag_events and self.event_transport is not None:
                # A transport of its own (the logs service), closed by its delivery; the same downstream's log.
                self.events = Delivery(
                    self.event_transport,
                    MemoryQueue(max_items=options.queue_max_requests),
                    name="flag events",
                    initial_backoff_s=options.initial_backoff_s,
                    max_backoff_s=options.max_backoff_s,
                    max_request_bytes=options.export_max_request_bytes,
                    downstream=downstream,
                )
                self._counting.append(_Sender("events", self.events))
                if isinstance(self.event_transport, EventsTransport):  # what a downstream without logs dropped
                    self._counting.append(self.event_transport)
                self._event_export = OtlpEventExport(
                    self.events,
                    self._resource_attributes(),
                    flag_words.SENTENCES,
                    self.clock,
                    job_flags=not options.include_partials,
                )
            if options.pass_through:
                self.pass_through = Delivery(
                    transport,
                    MemoryQueue(max_items=options.pass_through_queue_max_requests),
                    name="pass-through",
                    initial_backoff_s=options.initial_backoff_s,
                    max_backoff_s=options.max_backoff_s,
                    owns_transport=False,
                    max_request_bytes=options.export_max_request_bytes,
                    downstream=downstream,
                )
                self._counting.append(_Sender("pass_through", self.pass_through))
            if options.self_telemetry:
                # Its own small memory queue: the counters are cumulative, so a newer snapshot supersedes
                # a waiting one, and none belongs in the spool of window outputs.
                self._self_telemetry = SelfTelemetry(
                    Delivery(
                        transport,
                        MemoryQueue(max_items=1),
                        name="self-metrics",
                        initial_backoff_s=options.initial_backoff_s,
                        max_backoff_s=options.max_backoff_s,
                        owns_transport=False,
                        max_request_bytes=options.export_max_request_bytes,
                        downstream=downstream,
                    ),
                    self._resource_attributes(),
                    self.clock,
                )
            if options.spool_path and options.mode != "merge":
                self._write_ahead = WriteAhead(f"{options.spool_path}.accepted", batch_s=options.write_ahead_batch_s)
                self._counting.append(self._write_ahead)
                self._replay()
            if spool is not None:
                self._counting.append(spool)
        if options.prometheus_port is not None:
            from otel_ofu_collector.outputs.prometheus import PrometheusEndpoint

            self._prometheus = PrometheusEndpoint(
                self.self_metrics,
                host=options.prometheus_host,
                port=options.prometheus_port,
                expiration_windows=options.prometheus_expiration_windows,
            )

    # --- receiving ----------------------------------------------------------------------------------

    def ingest_bytes(self, raw: bytes) -> DecodeOutcome:
        """What both receivers call per request, with its bytes as received: parsed only where the decoder needs the
        message (``Decoder.decode_bytes``). MalformedRequest, with nothing taken, when the bytes are not one."""
        if self.dcgm_series is not None and carries_dcgm_series(raw):
            return self.ingest(parse_request(raw), raw)
        return self._after(self.decoder.decode_bytes(raw), raw)

    def ingest(self, request: ExportMetricsServiceRequest, raw: bytes | None = None) -> DecodeOutcome:
        """A parsed request (the write-ahead's replay, tests and the demo)."""
        # The one seam in front of the decoder: a dcgm-exporter scrape gains its GPUs as the producer sends them.
        translated = self.dcgm_series.translate(request, raw) if self.dcgm_series is not None else None
        if translated is not None:
            request, raw = translated.request, translated.raw
        outcome = self.decoder.decode(request, raw)
        if translated is not None and translated.refusals:
            outcome = self._refused_scrapes(outcome, translated)
        return self._after(outcome, raw if raw is not None else request)

    def _after(self, outcome: DecodeOutcome, sent: bytes | ExportMetricsServiceRequest) -> DecodeOutcome:
        """What follows the decoder: the write-ahead keeps a request that was taken, and what is not ours goes on."""
        if outcome.accepted and self._write_ahead is not None:
            self._write_ahead.append(sent if isinstance(sent, bytes) else sent.SerializeToString(), self.clock())
        if outcome.forward is not None and self.pass_through is not None:
            self.pass_through.submit(outcome.forward)
        return outcome

    def _refused_scrapes(self, outcome: DecodeOutcome, translated: Translation) -> DecodeOutcome:
        """The outcome with the scrapes the stage refused counted as the decoder counts its refusals (and said in
        ``partial_success``)."""
        refused = sum(refusal.points for refusal in translated.refusals)
        stats = self.decoder.stats
        with self.decoder.lock:
            stats.rejected += refused
            for refusal in translated.refusals:
                stats.rejected_by_reason[refusal.code] = stats.rejected_by_reason.get(refusal.code, 0) + refusal.points
                stats.rejected_by_message[refusal.message] = (
                    stats.rejected_by_message.get(refusal.message, 0) + refusal.points
                )
        words = "; ".join(f"{refusal.points} {refusal.message}" for refusal in translated.refusals)
        message = "; ".join(part for part in (outcome.error_message, f"refused {words}") if part)
        return attrs.evolve(outcome, rejected=outcome.rejected + refused, error_message=message)

    def _replay(self) -> None:
        """Rebuild the open windows a killed run left in the write-ahead (see ``write_ahead``). A record
        that is damaged, or whose replay raises, costs only itself: skipped and counted."""
        assert self._write_ahead is not None
        flushed_ns, payloads = self._write_ahead.pending()
        damaged = self._write_ahead.damaged_records  # bytes that fail their CRC: never in ``payloads``
        config = self.options.aggregator
        # A clean stop keeps up to a window and the lateness ahead of its clock (``restart_close_time``).
        ahead_ns = _CLOCK_SLACK_NS + config.window_ns + config.lateness_ns
        if flushed_ns is not None and not 0 < flushed_ns <= self.clock() + ahead_ns:
            # A damaged value: closing through it could mark every window to come as closed already.
            logger.warning("write-ahead: ignored its damaged close time %d", flushed_ns)
            flushed_ns = None
        if flushed_ns is not None:
            # Nothing to close yet: marks what was exported as closed, also after a clean stop (which closed
            # the window it stopped in early: later points for it are late, never its second export).
            self.aggregator.flush(flushed_ns)
            self._write_ahead_flushed = flushed_ns
        if not payloads and not damaged:
            return
        unparsed = failed = 0
        for payload in payloads:
            try:
                request = ExportMetricsServiceRequest.FromString(payload)
            except DecodeError:
                unparsed += 1
                continue
            try:
                self.decoder.decode(request, payload)  # forwarded already
            except Exception:
                failed += 1
                if failed == 1:
                    logger.exception("write-ahead: replaying a record failed; it is skipped")
        accepted = self.decoder.stats.accepted
        self.decoder.stats = DecoderStats()  # this run's counters count this run's requests
        self._write_ahead.skipped["damaged"] += damaged + unparsed
        self._write_ahead.skipped["failed"] += failed
        logger.warning(
            "replayed %d request(s) (%d point(s) of windows still open) that a previous run accepted but "
            "never closed (it was killed or crashed); %d damaged record(s) skipped, %d failed",
            len(payloads) - unparsed - failed,
            accepted,
            damaged + unparsed,
            failed,
        )

    # --- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the window consumers, listen, start the sender threads and the flush timer; OSError (or a
        consumer's ValueError) when a port or a file cannot be had: then nothing is left started."""
        outputs = self._outputs()
        try:
            start_in_order(outputs, _start_consumer, _shutdown_consumer)  # ready before the first point comes
            try:
                parts = self._listen()
            except BaseException:
                shutdown_in_reverse(outputs, _shutdown_consumer)
                raise
        except BaseException:
            for delivery in self._deliveries():
                delivery.stop(0)  # closes the spool file; nothing was sent yet
            if self._write_ahead is not None:
                self._write_ahead.close()  # kept: what it holds is replayed by the next start
            self._close_transport()
            if self.spool_lock is not None:
                self.spool_lock.release()
            raise
        self._started_outputs = outputs
        options = self.options
        for delivery in self._deliveries():
            delivery.start()
        if options.flush_interval_s > 0:
            # Closed through the clock from the start, not from the first tick: until a window has closed every
            # point is on time, and one stamped at the epoch (a node booted with its clock unset) would be taken.
            # (The first self-metrics go with the first tick, as ever.)
            self.flush(health=False)
            self._timer = threading.Thread(target=self._tick, name="otel-ofu-flush", daemon=True)
            self._timer.start()
        downstream = "none"
        if self.exports is not None:
            downstream = getattr(self.transport, "endpoint", type(self.transport).__name__)
        logger.info(
            "otel-ofu collector ready: %s (mode %s, export %s%s)",
            " ".join(parts) or "no receivers",
            options.mode,
            downstream,
            f", spool {options.spool_path}" if options.spool_path else "",
        )

    def _listen(self) -> list[str]:
        options = self.options
        auth = BearerAuth(options.bearer_token) if options.bearer_token else None
        # One budget for the bytes both receivers hold and inflate: many bombs at once fit in it together, whichever
        # way they come (``admission.BodyBudget``).
        limit = options.max_request_bytes
        bodies = BodyBudget(max_bytes=4 * limit, max_peer_bytes=2 * limit)
        if options.grpc_listen:
            self._receivers.append(
                GrpcReceiver(
                    self.ingest_bytes,
                    self.gate,
                    options.grpc_listen,
                    options.tls,
                    auth,
                    limit,
                    message_deadline_s=options.http_body_deadline_s,
                    bodies=bodies,
                    inline_when=self._windows_free,
                )
            )
        if options.http_listen:
            self._receivers.append(
                HttpReceiver(
                    self.ingest_bytes,
                    self.gate,
                    options.http_listen,
                    options.tls,
                    auth,
                    limit,
                    body_deadline_s=options.http_body_deadline_s,
                    body_min_rate=options.http_body_min_rate,
                    bodies=bodies,
                    inline_when=self._windows_free,
                )
            )
        # A failure stops the rest from starting and stops the started again.
        start_in_order(self._receivers, _start_receiver, _stop_receiver)
        parts = [
            f"{receiver.kind} {receiver.listen.rpartition(':')[0]}:{receiver.port}" for receiver in self._receivers
        ]
        if self._prometheus is not None:
            parts.append(f"prometheus {self._prometheus.host}:{self._prometheus.port}")
        return parts

    def _windows_free(self) -> bool:
        """Whether an ingest now would find the windows' lock free (a receiver then skips its thread hop)."""
        return not self.aggregator.lock.locked()

    @property
    def ports(self) -> dict[str, int]:
        """Bound ports by name (``grpc``, ``http``, ``prometheus``), for whichever are on."""
        found = {receiver.kind: receiver.port for receiver in self._receivers}
        if self._prometheus is not None and any(output is self._prometheus for output in self._started_outputs):
            found["prometheus"] = self._prometheus.port
        return found

    def _tick(self) -> None:
        while not self._stop_timer.wait(self.options.flush_interval_s):
            try:
                self.flush()
            except Exception:  # the timer must outlive one bad flush
                logger.exception("window flush failed")
            if self.heartbeat is not None:
                self.heartbeat.beat()

    def health(self) -> tuple[bool, str]:
        """(healthy, why) for a liveness probe: the receivers are listening and the flush timer keeps flushing."""
        if self._stopped:
            return False, "the collector is stopping"
        if not self._receivers:
            return False, "no receiver is listening"
        if self.heartbeat is None:
            return True, "ok: listening"
        if self._timer is None or not self._timer.is_alive():
            return False, "the window flush timer is not running"
        return self.heartbeat.check()

    def flush(self, now_ns: int | None = None, *, health: bool = True) -> list[WindowReport]:
        """Close and publish every window due at ``now_ns`` (default: the collector's clock).

        Never the data's watermark: one producer whose clock runs a minute ahead would close the current
        window for the whole fleet. Closing and publishing share one lock, so a timer flush and an
        explicit one cannot publish window N after N+1. ``health`` False: no self-metrics without a window.
        """
        with self._publish_lock:
            now = self.clock() if now_ns is None else now_ns
            with self.aggregator.lock:
                reports = self.aggregator.flush(now)
            if reports or health:
                self._publish(reports)
            if self._write_ahead is not None and now > self._write_ahead_flushed:
                self._write_ahead_flushed = now
                self._write_ahead.closed_through(now, now - self._write_ahead_needed_ns())
        self._log_rejections()
        return reports

    def _write_ahead_needed_ns(self) -> int:
        """How long a request stays in the write-ahead: the window its latest point can be in closes at most a
        window, the lateness and the future bound after it came."""
        config = self.options.aggregator
        skew = self.options.max_future_skew_s or 0.0
        return round((config.window_s + config.lateness_s + skew) * 1e9)

    def _log_rejections(self, force: bool = False) -> None:
        """One warning line summing the points rejected since the last one, by reason, at most once per
        ``rejection_log_interval_s`` (partial_success tells the sender; this tells whoever runs us)."""
        now = time.monotonic()
        last = self._rejections_logged_at
        if not force and last is not None and now - last < self.options.rejection_log_interval_s:
            return
        with self.aggregator.lock:
            totals = dict(self.decoder.stats.rejected_by_message)
        fresh = {reason: count - self._rejections_logged.get(reason, 0) for reason, count in totals.items()}
        fresh = {reason: count for reason, count in fresh.items() if count > 0}
        if not fresh:
            return
        self._rejections_logged = totals
        self._rejections_logged_at = now
        since = "" if last is None else f" in the last {now - last:.0f} s"
        logger.warning(
            "rejected %d data point(s)%s: %s",
            sum(fresh.values()),
            since,
            "; ".join(f"{count} {reason}" for reason, count in sorted(fresh.items())),
        )

    def stop(self, grace: float = DEFAULT_SHUTDOWN_GRACE_S) -> list[WindowReport]:
        """Refuse new requests, let in-flight ones finish, close and export every open window, shut down."""
        if self._stopped:
            return []
        self._stopped = True
        self.gate.close()
        deadline = time.monotonic() + grace
        while self.gate.in_flight and time.monotonic() < deadline:
            time.sleep(0.01)
        self._stop_timer.set()
        if self._timer is not None:
            self._timer.join(timeout=max(0.0, deadline - time.monotonic()))
        with self._publish_lock:
            now = self.clock()
            reports = []
            ahead = self._write_ahead
            if ahead is not None and ahead.intact:
                # The windows still open stay open: their requests are in the write-ahead, which the next start
                # replays, so a window a restart falls in is closed once, whole, and bills each GPU-second once.
                with self.aggregator.lock:
                    reports = self.aggregator.flush(now)
                self._publish(reports, final=True)
                ahead.closed_through(now, now - self._write_ahead_needed_ns())  # writes what is left
            if ahead is not None and ahead.intact:
                ahead.close()
            else:
                # Nothing keeps the open windows (no write-ahead, or one the disk refused requests to): they are
                # closed early and exported now, marked so (``WindowReport.closed_at_ns``).
                with self.aggregator.lock:
                    closed_early = self.aggregator.close_all(now)
                self._publish(closed_early, final=True)
                reports += closed_early
                if ahead is not None:  # every window is closed and in the spool
                    aggregator = self.aggregator
                    closed = aggregator.restart_close_time(now) if isinstance(aggregator, Aggregator) else None
                    ahead.clear(closed)
                    ahead.close()
        self._log_rejections(force=True)
        shutdown_in_reverse(self._started_outputs, _shutdown_consumer)  # after their last windows
        self._started_outputs = []
        for delivery in self._deliveries():
            # One deadline for all: each gets what the others left of the grace, not a grace of its own.
            left = delivery.stop(max(0.0, deadline - time.monotonic()))
            if left and delivery is not self.telemetry:
                logger.warning(
                    "%s: %d request(s) not delivered at shutdown%s",
                    delivery.name,
                    left,
                    " (kept in the spool)" if isinstance(delivery.queue, SqliteSpool) else "",
                )
        self._close_transport()  # only now: until both deliveries stopped, either may be mid-send
        # Last: until now they answered UNAVAILABLE (the gate is closed), which tells a client to retry elsewhere.
        shutdown_in_reverse(self._receivers, _stop_receiver)
        if self.spool_lock is not None:  # the spool's files are closed
            self.spool_lock.release()
        return reports

    @property
    def telemetry(self) -> Delivery | None:
        """The sender of the self-metrics downstream (None without a downstream or with them off)."""
        return None if self._self_telemetry is None else self._self_telemetry.delivery

    def _deliveries(self) -> list[Delivery]:
        """The senders to the downstream: window outputs first, then pass-through, then self-metrics (on the shared
        transport), then the flag events (on a logs transport of their own)."""
        found = (self.exports, self.pass_through, self.telemetry, self.events)
        return [delivery for delivery in found if delivery is not None]

    def _close_transport(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # --- publishing ---------------------------------------------------------------------------------

    def _resource_attributes(self) -> dict[str, str]:
        # service.instance.id stays ours whatever OTEL_RESOURCE_ATTRIBUTES says: the merge tier tells
        # shards apart by it. (encode sets service.name, the collector's, the same way.)
        return {**self.options.resource_attributes, names.SERVICE_INSTANCE_ID: self.options.instance_id}

    def _publish(self, reports: list[WindowReport], final: bool = False) -> None:
        """Hand closed windows to every consumer, then the self-metrics downstream; the caller holds
        _publish_lock. Without a window to publish the self-metrics still go once a window's length (a
        collector that receives nothing is what its health must show), and at shutdown (``final``)."""
        if not reports:
            last = self._self_metrics_sent_at
            if final or last is None or time.monotonic() - last >= self.options.aggregator.window_s:
                self._send_self_metrics()
            return
        for consumer in self._outputs():  # as started (a service driven by flush alone starts none)
            try:
                consumer.consume_windows(reports)
            except Exception:  # one broken output must not cost the others
                logger.exception("window consumer %s failed", type(consumer).__name__)
        self._send_self_metrics()

    def _outputs(self) -> list[WindowConsumer]:
        """Every window consumer, in the order they start and take windows (and shut down in reverse)."""
        outputs: list[WindowConsumer] = list(self.consumers)
        if self._prometheus is not None:
            outputs.append(self._prometheus)
        if self._window_export is not None:
            outputs.append(self._window_export)
        if self._event_export is not None:
            outputs.append(self._event_export)
        return outputs

    def _send_self_metrics(self) -> None:
        if self._self_telemetry is None:
            return
        self._self_metrics_sent_at = time.monotonic()
        try:
            self._self_telemetry.send(self.self_metrics())
        except Exception:
            logger.exception("sending the self-metrics downstream failed")

    def self_metrics(self) -> dict[str, Any]:
        """Counters for the Prometheus endpoint and tests, keyed by the names in ``otel_ofu.names``: what each part
        counted (``SelfMetrics``), a window consumer that counts something included. The queue and drop counts
        are there without a downstream too, empty."""
        consumers = [consumer for consumer in self.consumers if isinstance(consumer, SelfMetrics)]
        return gathered([*self._counting, *consumers], shown=(_QUEUED, _DROPPED))


# --- the self-metrics of the parts that do not say their own ----------------------------------------------------

_QUEUED: Final = names.COLLECTOR_EXPORT_QUEUED.name
_DROPPED: Final = names.COLLECTOR_DROPPED.name


@attrs.frozen
class _Ingest:
    """What the decoder took, refused and forwarded (read through it: a replay gives it fresh stats)."""

    decoder: Decoder

    def self_metrics(self) -> dict[str, Any]:
        stats = self.decoder.stats
        return {
            names.COLLECTOR_POINTS_ACCEPTED.name: stats.accepted,
            names.COLLECTOR_POINTS_REJECTED.name: dict(stats.rejected_by_reason),
            names.COLLECTOR_REQUESTS_FORWARDED.name: stats.forwarded_requests,
        }


@attrs.frozen
class _WindowState:
    """The windows' state: evictions, points over a cap, the bytes held (the decoder's resource cache's beside
    them) and windows or parts of them that failed to close."""

    aggregator: Aggregator
    decoder: Decoder

    def self_metrics(self) -> dict[str, Any]:
        stats = self.aggregator.stats
        return {
            names.COLLECTOR_EVICTED.name: {"stream": stats.evicted_streams, "job": stats.evicted_jobs},
            names.COLLECTOR_POINTS_OVER_CAP.name: {
                "max_streams": stats.rejected_stream_cap,
                "max_jobs": stats.rejected_job_cap,
                "max_state_bytes": stats.rejected_state_cap,
            },
            names.COLLECTOR_STATE_SIZE.name: {
                "windows": self.aggregator.state_bytes,
                "resource_cache": self.decoder.cache_bytes,
            },
            names.COLLECTOR_CLOSE_FAILURES.name: {
                **dict.fromkeys(("group", "job", "fleet"), 0),
                **stats.close_failures,
                "window": stats.windows_failed,
            },
        }


@attrs.frozen
class _Sender:
    """A sender downstream, under its stream's name: requests queued, dropped (with what its spool could not keep)
    and failed."""

    stream: str
    delivery: Delivery
    spool: SqliteSpool | None = None

    def self_metrics(self) -> dict[str, Any]:
        stats, stream = self.delivery.stats, self.stream
        dropped = {
            f"{stream}_overflow": stats.dropped_overflow,
            f"{stream}_rejected": stats.dropped_rejected,
            f"{stream}_oversized": stats.dropped_oversized,
        }
        if self.spool is not None:
            dropped[f"{stream}_spool_failed"] = self.spool.unstored_dropped
        return {
            _QUEUED: {stream: len(self.delivery.queue)},
            _DROPPED: dropped,
            names.COLLECTOR_EXPORT_FAILURES.name: {stream: stats.failures},
            names.COLLECTOR_EXPORT_REJECTED.name: {stream: stats.rejected_points},
        }


def _start_consumer(consumer: WindowConsumer) -> None:
    consumer.start()


def _shutdown_consumer(consumer: WindowConsumer) -> None:
    consumer.shutdown()


def _start_receiver(receiver: Receiver) -> None:
    receiver.start()


def _stop_receiver(receiver: Receiver) -> None:
    receiver.stop()
