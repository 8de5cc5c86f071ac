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

from otel_ofu import names
from otel_ofu.cli_support import (
    CommandOptions,
    address_or_off,
    non_negative_float,
    port_number,
    positive_float,
    positive_int,
    url_or_host_port,
)
from otel_ofu_collector.config import AggregatorConfig, parse_prices
from otel_ofu_collector.otlp.decode import DEFAULT_MAX_ATTRIBUTE_LENGTH
from otel_ofu_collector.outputs.feed_server import ReportFeed
from otel_ofu_collector.outputs.recorder import ReportRecorder
from otel_ofu_collector.outputs.split import DEFAULT_MAX_EXPORT_BYTES
from otel_ofu_collector.prefixes import COLLECTOR_PREFIX
from otel_ofu_collector.receivers.auth import TlsFiles, bearer_auth
from otel_ofu_collector.receivers.otlp_http import BODY_DEADLINE_S, BODY_GRACE_S, BODY_MIN_RATE
from otel_ofu_collector.service import (
    DEFAULT_PROMETHEUS_EXPIRATION_WINDOWS,
    DEFAULT_SHUTDOWN_GRACE_S,
    MODES,
    CollectorOptions,
    CollectorService,
)

logger = logging.getLogger(__name__)


def _group_by(text: str) -> tuple[str, ...]:
    return tuple(key.strip() for key in text.split(",") if key.strip())


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "collector",
        help="run the fleet OFU collector processor (OTLP in, fleet percentiles and OFU-vs-MFU out)",
        description="Receives OTLP metrics, aggregates fleet OFU per window, correlates it with reported MFU "
        "per job, flags suspicious jobs and exports the results over OTLP and Prometheus.",
    )
    # OTEL_OFU_COLLECTOR_<FLAG>: a node that runs a producer too must not have its settings read as ours.
    options = CommandOptions(parser, COLLECTOR_PREFIX)
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
    options.option(
        "--export-endpoint",
        default=None,
        type=url_or_host_port,
        help="downstream OTLP endpoint; unset: OTEL_EXPORTER_OTLP_[METRICS_]ENDPOINT, else no downstream",
    )
    options.option(
        "--export-protocol",
        default=None,
        choices=["grpc", "http/protobuf"],
        help="downstream protocol; unset: OTEL_EXPORTER_OTLP_PROTOCOL, else grpc",
    )
    options.option("--prometheus-port", default=None, type=port_number, help="serve Prometheus /metrics on this port")
    options.option(
        "--prometheus-host",
        default="127.0.0.1",
        help="address of the Prometheus endpoint (loopback by default: it has no TLS or token; 0.0.0.0 exposes it)",
    )
    options.option(
        "--prometheus-expiration-windows",
        default=DEFAULT_PROMETHEUS_EXPIRATION_WINDOWS,
        type=positive_int,
        metavar="N",
        help="windows a series stays on the Prometheus endpoint without a new value (1: the latest window only)",
    )
    options.option("--window", default=60.0, type=positive_float, help="window length in seconds")
    options.option("--lateness", default=15.0, type=non_negative_float, help="allowed lateness of points in seconds")
    options.option("--horizon", default=86400.0, type=positive_float, help="correlation horizon in seconds")
    options.option("--miscount-ratio", default=1.5, type=positive_float, help="MFU/OFU ratio that counts as a miscount")
    options.option(
        "--miscount-windows",
        default=3,
        type=positive_int,
        help="consecutive windows before job.flops_miscount rises",
    )
    options.option("--regression-factor", default=2.0, type=positive_float, help="OFU drop below baseline that flags")
    options.option("--baseline-windows", default=10, type=positive_int, help="windows in a job's trailing OFU baseline")
    options.option(
        "--regression-min-baseline",
        default=0.05,
        type=non_negative_float,
        help="baseline OFU under which a job is idle, not regressing",
    )
    _loss_options(options)
    options.option(
        "--mode",
        default="process",
        choices=list(MODES),
        help="process: one collector; shard: also export mergeable partials; merge: merge the shards' partials",
    )
    options.option(
        "--group-by",
        default=f"{names.HW_MODEL},{names.GPU_PRECISION}",
        type=_group_by,
        help="comma-separated attribute keys that group fleet percentiles",
    )
    options.option("--max-streams", default=200_000, type=positive_int, help="most GPU streams held at once")
    options.option("--max-jobs", default=50_000, type=positive_int, help="most jobs held at once")
    options.option("--stale-after", default=600.0, type=positive_float, help="evict a GPU or job silent this long (s)")
    options.option(
        "--spool",
        default=None,
        help="SQLite file that keeps undelivered window outputs across restarts; beside it FILE.accepted writes "
        "ahead the accepted points of the open windows, replayed after a SIGKILL or crash (without a spool "
        "those, about one window, are lost)",
    )
    options.option("--spool-max-bytes", default=256 * 1024 * 1024, type=positive_int, help="bound of the spool")
    options.flag("--pass-through", default=True, help="forward metrics that are not ours downstream untouched")
    options.flag("--forward-inputs", help="also forward our inputs (gpu.*, job.mfu) downstream")
    options.option("--tls-cert", default=None, help="server certificate (PEM) for TLS")
    options.option("--tls-key", default=None, help="server private key (PEM) for TLS")
    options.option("--tls-client-ca", default=None, help="CA (PEM) client certificates must chain to (mTLS)")
    options.option(
        "--bearer-token",
        default=None,
        help="require 'authorization: Bearer <token>' (on the command line it shows in the process table: "
        "prefer --bearer-token-file or the environment variable)",
    )
    options.option("--bearer-token-file", default=None, help="read the bearer token from this file")
    options.option(
        "--max-in-flight", default=64, type=positive_int, help="requests processed at once before UNAVAILABLE"
    )
    options.option(
        "--export-max-request-bytes",
        default=DEFAULT_MAX_EXPORT_BYTES,
        type=positive_int,
        metavar="BYTES",
        help="split requests sent downstream to at most this size (gRPC receivers refuse over 4 MiB by default)",
    )
    options.option(
        "--max-attribute-length",
        default=DEFAULT_MAX_ATTRIBUTE_LENGTH,
        type=positive_int,
        metavar="CHARS",
        help="reject points whose identity attribute value (job.id, host.name, ...) is longer than this",
    )
    options.option(
        "--http-body-deadline",
        default=BODY_DEADLINE_S,
        type=positive_float,
        metavar="SECONDS",
        help="an OTLP/HTTP body not received within this is answered 408 and its connection closed",
    )
    options.option(
        "--http-body-min-rate",
        default=BODY_MIN_RATE,
        type=non_negative_float,
        metavar="BYTES_PER_S",
        help=f"an OTLP/HTTP body slower than this on average after its first {BODY_GRACE_S:g} s is answered 408 "
        "and its connection closed (0: no minimum)",
    )
    options.option(
        "--instance-id",
        default=None,
        help="service.instance.id of the outputs (unique per shard replica); default HOSTNAME-PID",
    )
    options.option("--record-outputs", default=None, help="append every closed window to this JSON-lines file")
    options.option(
        "--report-feed-port",
        default=None,
        type=port_number,
        help="serve recent windows at /reports.jsonl on this port (for otel-ofu report --live)",
    )
    options.option(
        "--report-feed-host",
        default="127.0.0.1",
        help="address of the report feed (loopback by default: it has no TLS or token; 0.0.0.0 exposes it)",
    )
    options.option(
        "--shutdown-grace",
        default=DEFAULT_SHUTDOWN_GRACE_S,
        type=non_negative_float,
        help="seconds to finish up on SIGTERM",
    )
    parser.set_defaults(handler=run, usage_error=parser.error)


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
    """Where OFU is lost and what it costs: the straggler and idle flags, prices, PUE and grid intensity."""
    options.option(
        "--straggler-factor",
        default=1.25,
        type=positive_float,
        help="a GPU straggles while its OFU x this stays below its job's median OFU",
    )
    options.option(
        "--straggler-windows", default=3, type=positive_int, help="consecutive windows before gpu.straggler rises"
    )
    options.option(
        "--idle-windows",
        default=3,
        type=positive_int,
        help="windows without tensor activity before a GPU counts in job.gpus.idle",
    )
    options.option(
        "--price-per-gpu-hour",
        metavar="MODEL=PRICE,...",
        default=None,
        type=_prices,
        help="price per GPU-hour by hw.model, 'default' for the others (e.g. 'NVIDIA H100 80GB HBM3=2.5,default=2.0');"
        " job.cost and the lost cost are absent without it",
    )
    options.option("--currency", default="USD", type=_currency, help="currency code of the prices (the cost unit)")
    options.option(
        "--pue", default=1.0, type=positive_float, help="power usage effectiveness: facility energy / GPU energy"
    )
    options.option(
        "--grid-intensity",
        metavar="KG_PER_KWH",
        default=None,
        type=non_negative_float,
        help="grid carbon intensity in kg CO2e per kWh; job.emissions is absent without it",
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
        miscount_ratio=float(args.miscount_ratio),
        miscount_windows=int(args.miscount_windows),
        regression_factor=float(args.regression_factor),
        baseline_windows=int(args.baseline_windows),
        regression_min_baseline=float(args.regression_min_baseline),
        group_keys=tuple(args.group_by),
        max_streams=int(args.max_streams),
        max_jobs=int(args.max_jobs),
        # Never evict what an open window still holds.
        stale_after_s=max(float(args.stale_after), window + lateness),
        straggler_factor=float(args.straggler_factor),
        straggler_windows=int(args.straggler_windows),
        idle_windows=int(args.idle_windows),
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
        if args.record_outputs:
            service.consumers.append(ReportRecorder(args.record_outputs))
        if args.report_feed_port is not None:
            feed = ReportFeed(host=args.report_feed_host, port=int(args.report_feed_port))
            service.consumers.append(feed)
        service.start()  # starts the consumers too, and shuts them down in stop
        if feed is not None:
            logger.info("otel-ofu collector: report feed on %s", feed.url)
    except (ValueError, OSError) as error:
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
    logger.info("otel-ofu collector stopped (%d window(s) flushed on the way out)", len(reports))
    return 0
