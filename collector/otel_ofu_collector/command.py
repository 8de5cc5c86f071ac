"""``otel-ofu collector``: the fleet-side processor, run until SIGTERM/SIGINT, flushing on the way out."""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
import threading
from types import FrameType
from typing import Any

from opentelemetry.sdk.resources import OTELResourceDetector

from otel_ofu import names, ports
from otel_ofu.attribution import AttributionChain, build_chain
from otel_ofu.attribution.kubernetes_pods import cluster_pods_url
from otel_ofu.cli_support import CommandOptions, address_or_off, port_number, url_or_host_port
from otel_ofu.gpu_values import CalibrationTable
from otel_ofu.health import HealthEndpoint, Heartbeat, loop_bound_s
from otel_ofu_collector.config import (
    DAY_S,
    DEFAULT_MAX_STATE_BYTES,
    GRID_INTENSITY,
    HORIZON,
    LATENESS,
    PRICE,
    PUE,
    STALE_AFTER,
    WINDOW,
    AggregatorConfig,
    parse_prices,
)
from otel_ofu_collector.detectors import FLAG_OPTIONS
from otel_ofu_collector.option_bounds import Bound
from otel_ofu_collector.otlp.decode import DEFAULT_MAX_ATTRIBUTE_LENGTH
from otel_ofu_collector.outputs.feed_server import ReportFeed
from otel_ofu_collector.outputs.recorder import ReportRecorder
from otel_ofu_collector.outputs.split import DEFAULT_MAX_EXPORT_BYTES
from otel_ofu_collector.prefixes import COLLECTOR_PREFIX
from otel_ofu_collector.receivers.auth import TlsFiles, bearer_auth
from otel_ofu_collector.receivers.otlp_http import BODY_DEADLINE_S, BODY_GRACE_S
from otel_ofu_collector.receivers.otlp_http import BODY_MIN_RATE as BODY_MIN_RATE_DEFAULT
from otel_ofu_collector.service import (
    DEFAULT_PROMETHEUS_EXPIRATION_WINDOWS,
    DEFAULT_SHUTDOWN_GRACE_S,
    MODES,
    CollectorOptions,
    CollectorService,
)

logger = logging.getLogger(__name__)


DESCRIPTION = """\
Receive OTLP metrics from the producers (gRPC and/or HTTP), aggregate fleet OFU per window,
correlate it with the MFU each job reports, flag suspicious jobs and GPUs, and export the results
over OTLP and on a Prometheus endpoint.

The standard OpenTelemetry variables work as usual: OTEL_EXPORTER_OTLP_ENDPOINT, _PROTOCOL,
_HEADERS, _TIMEOUT, _COMPRESSION, _CERTIFICATE (and their _METRICS_ forms) for the downstream, and
OTEL_RESOURCE_ATTRIBUTES for the outputs' resource. Every option below also has its own
OTEL_OFU_COLLECTOR_* variable. A number outside its option's [range] is refused before anything
starts."""

EPILOG = f"""\
examples:
  otel-ofu collector --export-endpoint http://otelcol:4317 --prometheus-port {ports.COLLECTOR_PROMETHEUS}
  otel-ofu collector --listen off --http-listen 0.0.0.0:4318 --window 30 --lateness 10
  otel-ofu collector --price-per-gpu-hour 'NVIDIA H100 80GB HBM3=2.5,default=2.0' --pue 1.3 \\
      --grid-intensity 0.4 --straggler-factor 1.25 --idle-windows 3
  otel-ofu collector --spool /var/lib/otel-ofu/spool.sqlite --report-feed-port {ports.COLLECTOR_REPORT_FEED}

SIGTERM or SIGINT closes the open windows, exports them and exits 0."""

# Ranges of the options that are not a detector's own (those are declared beside their flags) nor a time the
# settings hold (config). Each is generous: it refuses unit mistakes and values that cannot work.
EXPIRATION_WINDOWS = Bound(int, 1, 10_000)
MAX_STREAMS = Bound(int, 1, 10_000_000)  # --max-state-bytes bounds their bytes besides
MAX_JOBS = Bound(int, 1, 1_000_000)
# The windows' state: at least a few thousand streams' worth, at most what one host's memory could hold.
STATE_BYTES = Bound(int, 1 << 20, 1 << 40, "bytes")  # 1 MiB to 1 TiB
SPOOL_BYTES = Bound(int, 1 << 20, 1 << 40, "bytes")  # 1 MiB to 1 TiB
MAX_IN_FLIGHT = Bound(int, 1, 1024)  # one gRPC worker thread each
# At least one large data point with its resource must fit; beyond 64 MiB no OTLP receiver takes a request.
EXPORT_BYTES = Bound(int, 64 * 1024, 64 * 1024 * 1024, "bytes")
ATTRIBUTE_LENGTH = Bound(int, 1, 65_536, "characters")
BODY_DEADLINE = Bound(float, 0.1, 3600.0, "s")
BODY_MIN_RATE = Bound(float, 0.0, 1e9, "bytes/s")
SHUTDOWN_GRACE = Bound(float, 0.0, 3600.0, "s")


def _group_by(text: str) -> tuple[str, ...]:
    return tuple(key.strip() for key in text.split(",") if key.strip())


def _bounded(options: CommandOptions, flag: str, bound: Bound[Any], *, help: str, **kwargs: Any) -> None:
    """An option whose value must lie in ``bound``: its help says the range, a value outside is a usage error."""
    options.option(flag, type=bound.parse, help=f"{help} [{bound.describe()}]", **kwargs)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "collector",
        help="run the fleet OFU collector processor (OTLP in, fleet percentiles and OFU-vs-MFU out)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # OTEL_OFU_COLLECTOR_<FLAG>: a node that runs a producer too must not have its settings read as ours.
    options = CommandOptions(parser, COLLECTOR_PREFIX)
    _receiving_options(options.group("receiving (OTLP in)"))
    _auth_options(options.group("TLS and auth"))
    _window_options(options.group("windows"))
    _flag_options(options.group("flags (each detector's own settings)"))
    _loss_options(options.group("loss & cost"))
    _dcgm_series_options(options.group("dcgm-exporter scrapes (from an OpenTelemetry Collector's Prometheus receiver)"))
    _output_options(options.group("outputs"))
    _prometheus_options(options.group("Prometheus endpoint (the outputs and the collector's self-telemetry)"))
    _state_options(options.group("state & durability"))
    parser.set_defaults(handler=run, usage_error=parser.error)


def _receiving_options(options: CommandOptions) -> None:
    options.option(
        "--listen",
        default="0.0.0.0:4317",
        type=address_or_off,
        metavar="HOST:PORT",
        help="OTLP/gRPC listen address; off (or none) turns the gRPC receiver off (then --http-listen is needed)",
    )
    options.option(
        "--http-listen",
        default=None,
        type=address_or_off,
        metavar="HOST:PORT",
        help="OTLP/HTTP listen address (no HTTP receiver unless given; off or none also says so)",
    )
    _bounded(
        options,
        "--max-in-flight",
        MAX_IN_FLIGHT,
        default=64,
        metavar="REQUESTS",
        help="requests processed at once before UNAVAILABLE",
    )
    _bounded(
        options,
        "--max-attribute-length",
        ATTRIBUTE_LENGTH,
        default=DEFAULT_MAX_ATTRIBUTE_LENGTH,
        metavar="CHARS",
        help="reject points whose identity attribute value (job.id, host.name, ...) is longer than this",
    )
    _bounded(
        options,
        "--http-body-deadline",
        BODY_DEADLINE,
        default=BODY_DEADLINE_S,
        metavar="SECONDS",
        help="an OTLP/HTTP body not received within this is answered 408 and its connection closed",
    )
    _bounded(
        options,
        "--http-body-min-rate",
        BODY_MIN_RATE,
        default=BODY_MIN_RATE_DEFAULT,
        metavar="BYTES_PER_S",
        help=f"an OTLP/HTTP body slower than this on average after its first {BODY_GRACE_S:g} s is answered 408 "
        "and its connection closed (0: no minimum)",
    )


def _auth_options(options: CommandOptions) -> None:
    options.option("--tls-cert", default=None, metavar="FILE", help="server certificate (PEM) for TLS")
    options.option("--tls-key", default=None, metavar="FILE", help="server private key (PEM) for TLS")
    options.option(
        "--tls-client-ca", default=None, metavar="FILE", help="CA (PEM) client certificates must chain to (mTLS)"
    )
    options.option(
        "--bearer-token",
        default=None,
        metavar="TOKEN",
        help="require 'authorization: Bearer <token>' (on the command line it shows in the process table: "
        "prefer --bearer-token-file or the environment variable)",
    )
    options.option("--bearer-token-file", default=None, metavar="FILE", help="read the bearer token from this file")


def _window_options(options: CommandOptions) -> None:
    _bounded(options, "--window", WINDOW, default=60.0, metavar="SECONDS", help="window length")
    _bounded(
        options,
        "--lateness",
        LATENESS,
        default=15.0,
        metavar="SECONDS",
        help="how long after its end a window waits for late points",
    )
    _bounded(
        options,
        "--horizon",
        HORIZON,
        default=DAY_S,
        metavar="SECONDS",
        help="how far back the OFU-vs-MFU correlation looks (at least one window)",
    )
    options.option(
        "--group-by",
        default=f"{names.HW_MODEL},{names.GPU_PRECISION}",
        type=_group_by,
        metavar="KEY,...",
        help="comma-separated attribute keys that group fleet percentiles",
    )
    options.option(
        "--mode",
        default="process",
        choices=list(MODES),
        help="process: one collector; shard: also export mergeable partials; merge: merge the shards' partials",
    )


def _flag_options(options: CommandOptions) -> None:
    """One option per detector setting, as each detector declares it (its default and range included)."""
    for option in FLAG_OPTIONS:
        _bounded(options, option.flag, option.bound, default=option.default, metavar=option.metavar, help=option.help)


def _prices(text: str) -> dict[str, float]:
    try:
        return parse_prices(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _currency(text: str) -> str:
    code = text.strip().upper()
    if not (code.isascii() and code.isalnum() and 1 <= len(code) <= 8):
        raise argparse.ArgumentTypeError(f"{text!r} is not a currency code such as USD or EUR")
    return code


def _loss_options(options: CommandOptions) -> None:
    """What the lost OFU costs: prices, PUE and grid intensity."""
    options.option(
        "--price-per-gpu-hour",
        metavar="MODEL=PRICE,...",
        default=None,
        type=_prices,
        help="price per GPU-hour in --currency by hw.model, 'default' for the others (e.g. 'NVIDIA H100 80GB "
        f"HBM3=2.5,default=2.0'; each model once, each price {PRICE.describe()}); job.cost and the lost cost "
        "are absent without it",
    )
    options.option(
        "--currency", default="USD", type=_currency, metavar="CODE", help="currency of the prices (the cost unit)"
    )
    _bounded(
        options,
        "--pue",
        PUE,
        default=1.0,
        metavar="RATIO",
        help="power usage effectiveness: facility energy / GPU energy",
    )
    _bounded(
        options,
        "--grid-intensity",
        GRID_INTENSITY,
        default=None,
        metavar="KG_PER_KWH",
        help="grid carbon intensity in kg CO2e per kWh; job.emissions is absent without it",
    )


def _calibration(text: str) -> CalibrationTable:
    try:
        return CalibrationTable.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _dcgm_series_options(options: CommandOptions) -> None:
    """The producer's own settings for the GPUs the collector reads from dcgm-exporter scrapes."""
    options.option(
        "--calibration",
        metavar="SPEC",
        default=None,
        type=_calibration,
        help="tile-quantization factors for the GPUs read from dcgm-exporter scrapes, as otel-ofu run takes them: "
        "job:ID=F,model:KEY=F (e.g. model:H100-SXM=0.93)",
    )
    options.option(
        "--k8s-pods-url",
        metavar="URL",
        default=None,
        help="the cluster's pods (auto: the in-cluster API server's /api/v1/pods; off: none), read for the job of "
        "each pod dcgm-exporter labels a GPU with, by the producer's workload rules (needs list pods cluster-wide)",
    )
    options.option(
        "--k8s-job-label", metavar="KEY", default=None, help="pod label naming the job, before the standard ones"
    )


def dcgm_attribution(args: argparse.Namespace) -> AttributionChain | None:
    """The producer's attribution chain for the GPUs of dcgm-exporter scrapes, with the cluster's pod list when
    ``--k8s-pods-url`` asks for it (its refresher started; the caller closes it); None without one: the pod labels
    alone, as the producer reads them without one."""
    url = cluster_pods_url(args.k8s_pods_url)
    if url is None:
        return None
    return build_chain(k8s_pods_url=url, k8s_job_label=args.k8s_job_label)  # the producer's order of links


def _output_options(options: CommandOptions) -> None:
    options.option(
        "--export-endpoint",
        default=None,
        type=url_or_host_port,
        metavar="URL",
        help="downstream OTLP endpoint; unset: OTEL_EXPORTER_OTLP_[METRICS_]ENDPOINT, else no downstream",
    )
    options.option(
        "--export-protocol",
        default=None,
        choices=["grpc", "http/protobuf"],
        help="downstream protocol; unset: OTEL_EXPORTER_OTLP_PROTOCOL, else grpc",
    )
    _bounded(
        options,
        "--export-max-request-bytes",
        EXPORT_BYTES,
        default=DEFAULT_MAX_EXPORT_BYTES,
        metavar="BYTES",
        help="split requests sent downstream to at most this size (gRPC receivers refuse over 4 MiB by default)",
    )
    options.flag("--pass-through", default=True, help="forward metrics that are not ours downstream untouched")
    options.flag("--forward-inputs", help="also forward our inputs (gpu.*, job.mfu) downstream")
    options.option(
        "--instance-id",
        default=None,
        metavar="ID",
        help="service.instance.id of the outputs (unique per shard replica); default HOSTNAME-PID",
    )
    options.option(
        "--record-outputs", default=None, metavar="FILE", help="append every closed window to this JSON-lines file"
    )
    options.option(
        "--report-feed-port",
        default=None,
        type=port_number,
        metavar="PORT",
        help="serve recent windows at /reports.jsonl on this port (for otel-ofu report --live)",
    )
    options.option(
        "--health-port",
        default=None,
        type=port_number,
        metavar="PORT",
        help=f"serve /healthz on this port: 200 while the receivers listen and windows are flushed, 503 once "
        f"the flush has not run for 30 s (a liveness probe's; conventionally {ports.COLLECTOR_HEALTH})",
    )
    options.option(
        "--health-host",
        default="127.0.0.1",
        metavar="HOST",
        help="address of /healthz (loopback by default; 0.0.0.0 for a probe from outside the host or pod)",
    )
    options.option(
        "--report-feed-host",
        default="127.0.0.1",
        metavar="HOST",
        help="address of the report feed (loopback by default: it has no TLS or token; 0.0.0.0 exposes it)",
    )


def _prometheus_options(options: CommandOptions) -> None:
    options.option(
        "--prometheus-port",
        default=None,
        type=port_number,
        metavar="PORT",
        help="serve Prometheus /metrics on this port",
    )
    options.option(
        "--prometheus-host",
        default="127.0.0.1",
        metavar="HOST",
        help="address of the Prometheus endpoint (loopback by default: it has no TLS or token; 0.0.0.0 exposes it)",
    )
    _bounded(
        options,
        "--prometheus-expiration-windows",
        EXPIRATION_WINDOWS,
        default=DEFAULT_PROMETHEUS_EXPIRATION_WINDOWS,
        metavar="WINDOWS",
        help="windows a series stays on the Prometheus endpoint without a new value (1: the latest window only)",
    )


def _state_options(options: CommandOptions) -> None:
    _bounded(options, "--max-streams", MAX_STREAMS, default=200_000, metavar="N", help="most GPU streams held at once")
    _bounded(options, "--max-jobs", MAX_JOBS, default=50_000, metavar="N", help="most jobs held at once")
    _bounded(
        options,
        "--max-state-bytes",
        STATE_BYTES,
        default=DEFAULT_MAX_STATE_BYTES,
        metavar="BYTES",
        help="most bytes of window state (GPU streams, jobs and their identity values); new streams beyond are refused",
    )
    _bounded(
        options,
        "--stale-after",
        STALE_AFTER,
        default=600.0,
        metavar="SECONDS",
        help="evict a GPU or job silent this long (raised to cover a window and its lateness)",
    )
    options.option(
        "--spool",
        default=None,
        metavar="FILE",
        help="SQLite file that keeps undelivered window outputs across restarts; beside it FILE.accepted writes "
        "ahead the accepted points of the open windows, replayed after a SIGKILL or crash (without a spool "
        "those, about one window, are lost)",
    )
    _bounded(
        options,
        "--spool-max-bytes",
        SPOOL_BYTES,
        default=256 * 1024 * 1024,
        metavar="BYTES",
        help="bound of the spool",
    )
    _bounded(
        options,
        "--shutdown-grace",
        SHUTDOWN_GRACE,
        default=DEFAULT_SHUTDOWN_GRACE_S,
        metavar="SECONDS",
        help="time to finish up on SIGTERM",
    )


def environment_resource_attributes() -> dict[str, str]:
    """``OTEL_RESOURCE_ATTRIBUTES`` as the SDK reads it, less ``service.name``: the outputs are always the
    collector's own service (``OTEL_SERVICE_NAME`` does not rename it either)."""
    detected = OTELResourceDetector().detect().attributes
    return {key: str(value) for key, value in detected.items() if key != names.SERVICE_NAME}


def options_from_args(args: argparse.Namespace) -> CollectorOptions:
    """The service options an ``otel-ofu collector`` command line asks for (validated on construction)."""
    window = float(args.window)
    lateness = float(args.lateness)
    aggregator = AggregatorConfig(
        window_s=window,
        lateness_s=lateness,
        horizon_s=max(float(args.horizon), window),
        flag_settings={option.key: getattr(args, option.key) for option in FLAG_OPTIONS},
        group_keys=tuple(args.group_by),
        max_streams=int(args.max_streams),
        max_jobs=int(args.max_jobs),
        max_state_bytes=int(args.max_state_bytes),
        # Never evict what an open window still holds.
        stale_after_s=max(float(args.stale_after), window + lateness),
        price_per_gpu_hour=dict(args.price_per_gpu_hour or {}),
        currency=str(args.currency),
        pue=float(args.pue),
        grid_intensity=None if args.grid_intensity is None else float(args.grid_intensity),
        # The report feed is what a live screen reads a job's GPUs from.
        per_gpu_reports=args.report_feed_port is not None,
    )
    if bool(args.tls_cert) != bool(args.tls_key):
        raise ValueError("--tls-cert and --tls-key go together")
    if args.tls_client_ca and not args.tls_cert:
        raise ValueError("--tls-client-ca (mTLS) needs --tls-cert and --tls-key")
    tls = TlsFiles(args.tls_cert, args.tls_key, args.tls_client_ca) if args.tls_cert else None
    auth = bearer_auth(args.bearer_token, args.bearer_token_file)
    resource = environment_resource_attributes()
    # An instance id in OTEL_RESOURCE_ATTRIBUTES names this replica as well as --instance-id would.
    instance_id: str | None = args.instance_id or resource.pop(names.SERVICE_INSTANCE_ID, None)
    extra: dict[str, Any] = {"instance_id": instance_id} if instance_id else {}  # else the options' default
    return CollectorOptions(
        **extra,
        resource_attributes=resource,
        aggregator=aggregator,
        mode=args.mode,
        grpc_listen=args.listen or None,
        http_listen=args.http_listen or None,
        export_endpoint=args.export_endpoint or None,
        export_protocol=args.export_protocol or None,
        prometheus_port=args.prometheus_port,
        prometheus_host=args.prometheus_host,
        prometheus_expiration_windows=int(args.prometheus_expiration_windows),
        pass_through=bool(args.pass_through),
        forward_inputs=bool(args.forward_inputs),
        spool_path=args.spool or None,
        spool_max_bytes=int(args.spool_max_bytes),
        tls=tls,
        bearer_token=auth.token if auth else None,
        max_in_flight=int(args.max_in_flight),
        http_body_deadline_s=float(args.http_body_deadline),
        http_body_min_rate=float(args.http_body_min_rate),
        export_max_request_bytes=int(args.export_max_request_bytes),
        max_attribute_length=int(args.max_attribute_length),
        calibration=args.calibration or CalibrationTable(),
    )


def _token_on_command_line() -> bool:
    """Whether this process's own argv carries --bearer-token (set from the environment, it does not)."""
    return any(arg == "--bearer-token" or arg.startswith("--bearer-token=") for arg in sys.argv)


def check_grpc_address(address: str) -> None:
    """OSError, in one line, when the gRPC receiver could not bind ``address`` (taken, or not this host's).

    Asked before grpc is: grpc would print its own raw ``E... add_port.cc`` log line on stderr before raising.
    The receiver binds without SO_REUSEPORT, so a plain bind here gives the answer grpc would."""
    host, _, port = address.rpartition(":")
    if int(port) == 0:
        return  # the system picks a free one
    try:
        found = socket.getaddrinfo(
            host.strip("[]") or None, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except OSError as error:
        raise OSError(f"cannot listen for OTLP/gRPC on {address} ({error.strerror or error})") from None
    failure: OSError | None = None
    for family, kind, proto, _, where in found:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as grpc sets it
            try:
                probe.bind(where)
                return  # grpc binds every address it can and fails only when none binds
            except OSError as error:
                failure = error
    why = failure.strerror if failure is not None and failure.strerror else "not available"
    raise OSError(f"cannot listen for OTLP/gRPC on {address} ({why})")


def run(args: argparse.Namespace) -> int:
    if args.listen is None and args.http_listen is None:
        args.usage_error("--listen and --http-listen are both off: the collector would receive nothing")
    feed: ReportFeed | None = None
    health: HealthEndpoint | None = None
    attribution: AttributionChain | None = None
    try:
        if args.listen is not None:
            check_grpc_address(args.listen)
        options = options_from_args(args)
        if args.bearer_token and not args.bearer_token_file and _token_on_command_line():
            logger.warning(
                "--bearer-token on the command line is visible to every local user in the process table: "
                "use --bearer-token-file or %sBEARER_TOKEN",
                COLLECTOR_PREFIX,
            )
        service = CollectorService(options)
        attribution = dcgm_attribution(args)
        if attribution is not None and service.dcgm_series is not None:
            service.dcgm_series.attribution = attribution.attribute
        if args.health_port is not None:
            service.heartbeat = Heartbeat(loop_bound_s(options.flush_interval_s), "the window flush")
            health = HealthEndpoint(service.health, port=int(args.health_port), host=args.health_host)
        if args.record_outputs:
            service.consumers.append(ReportRecorder(args.record_outputs))
        if args.report_feed_port is not None:
            feed = ReportFeed(host=args.report_feed_host, port=int(args.report_feed_port))
            service.consumers.append(feed)
        service.start()  # starts the consumers too, and shuts them down in stop
        if feed is not None:
            logger.info("otel-ofu collector: report feed on %s", feed.url)
        if health is not None:
            try:
                health.start()
            except OSError as error:
                service.stop(grace=0)
                raise OSError(f"cannot serve /healthz on {args.health_host}:{args.health_port}: {error}") from None
            logger.info("otel-ofu collector: /healthz on %s:%d", args.health_host, health.port)
    except (ValueError, OSError) as error:
        if attribution is not None:
            attribution.close()
        logger.error("otel-ofu collector cannot start: %s", error)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        logger.info("otel-ofu collector: %s, closing open windows", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not stop.wait(0.5):
        pass
    reports = service.stop(grace=float(args.shutdown_grace))
    if health is not None:
        health.close()
    if attribution is not None:
        attribution.close()
    logger.info("otel-ofu collector stopped (%d window(s) flushed on the way out)", len(reports))
    return 0
