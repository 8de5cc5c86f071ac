"""``otel-ofu collector``: the fleet-side processor, run until SIGTERM/SIGINT, flushing on the way out."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from types import FrameType

from otel_ofu import names
from otel_ofu.cli_support import add_flag, add_option
from otel_ofu_collector.auth import TlsFiles, bearer_auth
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.records import ReportFeed, ReportRecorder
from otel_ofu_collector.service import MODES, CollectorOptions, CollectorService

logger = logging.getLogger(__name__)


def _group_by(text: str) -> tuple[str, ...]:
    return tuple(key.strip() for key in text.split(",") if key.strip())


def _bool(text: str) -> bool:
    return text.strip().lower() in ("1", "true", "yes", "on")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "collector",
        help="run the fleet OFU collector processor (OTLP in, fleet percentiles and OFU-vs-MFU out)",
        description="Receives OTLP metrics, aggregates fleet OFU per window, correlates it with reported MFU "
        "per job, flags suspicious jobs and exports the results over OTLP and Prometheus.",
    )
    add_option(parser, "--listen", default="0.0.0.0:4317", help="OTLP/gRPC listen address HOST:PORT ('' disables)")
    add_option(parser, "--http-listen", default=None, help="OTLP/HTTP listen address HOST:PORT (off unless given)")
    add_option(
        parser,
        "--export-endpoint",
        default=None,
        help="downstream OTLP endpoint; unset: OTEL_EXPORTER_OTLP_[METRICS_]ENDPOINT, else no downstream",
    )
    add_option(
        parser,
        "--export-protocol",
        default=None,
        choices=["grpc", "http/protobuf"],
        help="downstream protocol; unset: OTEL_EXPORTER_OTLP_PROTOCOL, else grpc",
    )
    add_option(parser, "--prometheus-port", default=None, type=int, help="serve Prometheus /metrics on this port")
    add_option(parser, "--prometheus-host", default="0.0.0.0", help="address of the Prometheus endpoint")
    add_option(parser, "--window", default=60.0, type=float, help="window length in seconds")
    add_option(parser, "--lateness", default=15.0, type=float, help="allowed lateness of points in seconds")
    add_option(parser, "--horizon", default=86400.0, type=float, help="correlation horizon in seconds")
    add_option(parser, "--miscount-ratio", default=1.5, type=float, help="MFU/OFU ratio that counts as a miscount")
    add_option(
        parser, "--miscount-windows", default=3, type=int, help="consecutive windows before job.flops_miscount rises"
    )
    add_option(parser, "--regression-factor", default=2.0, type=float, help="OFU drop below baseline that flags")
    add_option(parser, "--baseline-windows", default=10, type=int, help="windows in a job's trailing OFU baseline")
    add_option(
        parser,
        "--regression-min-baseline",
        default=0.05,
        type=float,
        help="baseline OFU under which a job is idle, not regressing",
    )
    add_option(
        parser,
        "--mode",
        default="process",
        choices=list(MODES),
        help="process: one collector; shard: also export mergeable partials; merge: merge the shards' partials",
    )
    add_option(
        parser,
        "--group-by",
        default=f"{names.HW_MODEL},{names.GPU_PRECISION}",
        type=_group_by,
        help="comma-separated attribute keys that group fleet percentiles",
    )
    add_option(parser, "--max-streams", default=200_000, type=int, help="most GPU streams held at once")
    add_option(parser, "--max-jobs", default=50_000, type=int, help="most jobs held at once")
    add_option(parser, "--stale-after", default=600.0, type=float, help="evict a GPU or job silent this long (s)")
    add_option(parser, "--spool", default=None, help="SQLite file that keeps undelivered window outputs")
    add_option(parser, "--spool-max-bytes", default=256 * 1024 * 1024, type=int, help="bound of the spool")
    add_option(
        parser,
        "--pass-through",
        default=True,
        type=_bool,
        help="forward metrics that are not ours downstream untouched (true/false)",
    )
    parser.add_argument(
        "--no-pass-through", dest="pass_through", action="store_false", help="same as --pass-through false"
    )
    add_flag(parser, "--forward-inputs", help="also forward our inputs (gpu.*, job.mfu) downstream")
    add_option(parser, "--tls-cert", default=None, help="server certificate (PEM) for TLS")
    add_option(parser, "--tls-key", default=None, help="server private key (PEM) for TLS")
    add_option(parser, "--tls-client-ca", default=None, help="CA (PEM) client certificates must chain to (mTLS)")
    add_option(parser, "--bearer-token", default=None, help="require 'authorization: Bearer <token>'")
    add_option(parser, "--bearer-token-file", default=None, help="read the bearer token from this file")
    add_option(parser, "--max-in-flight", default=64, type=int, help="requests processed at once before UNAVAILABLE")
    add_option(
        parser,
        "--instance-id",
        default=None,
        help="service.instance.id of the outputs (unique per shard replica); default HOSTNAME-PID",
    )
    add_option(parser, "--record-outputs", default=None, help="append every closed window to this JSON-lines file")
    add_option(
        parser,
        "--report-feed-port",
        default=None,
        type=int,
        help="serve recent windows at /reports.jsonl on this port (for otel-ofu report --live)",
    )
    add_option(parser, "--report-feed-host", default="0.0.0.0", help="address of the report feed")
    add_option(parser, "--shutdown-grace", default=10.0, type=float, help="seconds to finish up on SIGTERM")
    parser.set_defaults(handler=run)


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
    )
    if bool(args.tls_cert) != bool(args.tls_key):
        raise ValueError("--tls-cert and --tls-key go together")
    if args.tls_client_ca and not args.tls_cert:
        raise ValueError("--tls-client-ca (mTLS) needs --tls-cert and --tls-key")
    tls = TlsFiles(args.tls_cert, args.tls_key, args.tls_client_ca) if args.tls_cert else None
    auth = bearer_auth(args.bearer_token, args.bearer_token_file)
    extra = {"instance_id": args.instance_id} if args.instance_id else {}
    return CollectorOptions(
        **extra,
        aggregator=aggregator,
        mode=args.mode,
        grpc_listen=args.listen or None,
        http_listen=args.http_listen or None,
        export_endpoint=args.export_endpoint or None,
        export_protocol=args.export_protocol or None,
        prometheus_port=args.prometheus_port,
        prometheus_host=args.prometheus_host,
        pass_through=bool(args.pass_through),
        forward_inputs=bool(args.forward_inputs),
        spool_path=args.spool or None,
        spool_max_bytes=int(args.spool_max_bytes),
        tls=tls,
        bearer_token=auth.token if auth else None,
        max_in_flight=int(args.max_in_flight),
    )


def run(args: argparse.Namespace) -> int:
    recorder: ReportRecorder | None = None
    feed: ReportFeed | None = None
    try:
        options = options_from_args(args)
        service = CollectorService(options)
        if args.record_outputs:
            recorder = ReportRecorder(args.record_outputs)
            service.report_listeners.append(recorder)
        if args.report_feed_port is not None:
            feed = ReportFeed(host=args.report_feed_host, port=int(args.report_feed_port))
            feed.start()
            logger.info("otel-ofu collector: report feed on %s", feed.url)
            service.report_listeners.append(feed)
        service.start()
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
    if recorder is not None:
        recorder.close()
    if feed is not None:
        feed.stop()
    logger.info("otel-ofu collector stopped (%d window(s) flushed on the way out)", len(reports))
    return 0
