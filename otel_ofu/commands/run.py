"""``otel-ofu run``: the long-running node producer (DaemonSet, systemd unit, or by hand)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from typing import Any

from opentelemetry.sdk.metrics.export import MetricExporter

from otel_ofu import names, ports
from otel_ofu.attribution.kubernetes_pods import DEFAULT_CA_FILE, DEFAULT_TOKEN_FILE, resolve_pods_url
from otel_ofu.cli_support import (
    CommandOptions,
    add_deprecated_alias,
    env_name,
    export_interval_s,
    output_path,
    port_number,
    positive_float,
    positive_int,
    url_or_host_port,
)
from otel_ofu.clock import ScaledClock, wall_clock
from otel_ofu.gpu_values import CalibrationTable
from otel_ofu.health import HealthEndpoint, Heartbeat, loop_bound_s
from otel_ofu.model import Clock, Source, SourceUnavailable
from otel_ofu.producer.exporters import EXPORTER_KINDS, PROTOCOLS, ExporterConfigError, build_exporter
from otel_ofu.producer.loop import Producer, Recorder, open_recorder
from otel_ofu.producer.metrics_data import MetricsDataBuilder, env_resource
from otel_ofu.producer.prometheus import PrometheusEndpoint
from otel_ofu.sources import ListsProcesses
from otel_ofu.sources.factory import add_source_options, open_from_args

log = logging.getLogger(__name__)

DESCRIPTION = """\
Read GPU counters once per interval, compute OFU per GPU, attribute each GPU to its job and export
the contract's gauges as OTLP, one Resource per GPU, one request per interval for the whole host.

The standard OpenTelemetry variables work as usual: OTEL_EXPORTER_OTLP_ENDPOINT, _HEADERS,
_PROTOCOL, _TIMEOUT, _COMPRESSION, _CERTIFICATE (and their _METRICS_ forms),
OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE, OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME and
OTEL_METRIC_EXPORT_INTERVAL (milliseconds). Every option below also has its own OTEL_OFU_* variable."""

EPILOG = """\
examples:
  otel-ofu run                                   # NVML or DCGM, OTLP/gRPC to localhost:4317
  otel-ofu run --source dcgm-exporter --url http://localhost:9400/metrics --prometheus-port 9464
  otel-ofu run --source sim --sim-speed 60 --exporter console --duration 600
  OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318 otel-ofu run

SIGTERM or SIGINT exports the last (partial) interval, then exits 0."""


LEGACY_PROMETHEUS_VARIABLE = env_name("--prometheus-addr")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run the node producer: GPU counters -> OFU -> OTLP (and Prometheus)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_run_options(parser)
    parser.set_defaults(handler=run_command)


def add_run_options(parser: argparse.ArgumentParser) -> None:
    # Plain OTEL_OFU_<FLAG> variables: the deploy kit sets them, and snapshot shares the source ones.
    options = CommandOptions(parser)
    source = options.group("source")
    add_source_options(source)
    source.option(
        "--sim-speed",
        metavar="N",
        type=positive_float,
        default=1.0,
        help="simulated time runs this many times faster than wall time; --interval and --duration are "
        "simulated seconds (--source sim)",
    )
    source.option(
        "--record", metavar="FILE", type=output_path, help="also append every snapshot to this JSON-lines capture file"
    )

    attribution = options.group("job attribution")
    attribution.option("--job-id", metavar="ID", help="job.id for every GPU when nothing better is known")
    attribution.option("--job-name", metavar="NAME", help="job.name for every GPU when nothing better is known")
    attribution.option("--precision", choices=names.PRECISIONS, help="gpu.precision when the job does not say")
    attribution.option("--slurm-mapping-dir", metavar="DIR", help="HPC job-mapping directory (one file per GPU index)")
    attribution.option(
        "--kubelet-socket",
        metavar="PATH",
        help="kubelet pod-resources socket, e.g. /var/lib/kubelet/pod-resources/kubelet.sock",
    )
    attribution.option(
        "--k8s-pods-url",
        metavar="URL",
        help="where the node's pods are listed, for each pod's job (its workload's labels and owners): an API "
        "server URL, a kubelet .../pods URL, or auto (the in-cluster API server); off by default. Without "
        "--kubelet-socket it serves the pods the source names (dcgm-exporter's pod labels)",
    )
    attribution.option(
        "--k8s-node-name", metavar="NAME", help="this node's Kubernetes name (default: NODE_NAME, else --host)"
    )
    attribution.option("--k8s-token-file", metavar="FILE", default=DEFAULT_TOKEN_FILE, help="bearer token file")
    attribution.option("--k8s-ca-file", metavar="FILE", default=DEFAULT_CA_FILE, help="CA file of the pods URL")
    attribution.option("--k8s-job-label", metavar="KEY", help="pod label naming the job, before the standard ones")
    attribution.option("--proc-root", metavar="DIR", default="/proc", help="where the host's /proc is mounted")
    attribution.option(
        "--attribution-refresh",
        metavar="SECONDS",
        type=positive_float,
        default=30.0,
        help="seconds a GPU's attribution is reused before it is looked up again",
    )

    export = options.group("export")
    export.option("--exporter", default="otlp", choices=EXPORTER_KINDS, help="push exporter")
    export.option(
        "--export-endpoint",
        metavar="URL",
        type=url_or_host_port,
        help="OTLP endpoint URL (default: the OTEL_EXPORTER_OTLP_[METRICS_]ENDPOINT the SDK reads)",
    )
    export.option(
        "--protocol",
        choices=PROTOCOLS,
        help="OTLP transport (default: OTEL_EXPORTER_OTLP_[METRICS_]PROTOCOL, else grpc)",
    )
    export.option(
        "--placement",
        default="resource",
        choices=names.PLACEMENTS,
        help="where identity attributes go: resource, datapoint (Datadog) or both",
    )
    export.option(
        "--prometheus-port",
        metavar="PORT",
        type=port_number,
        help="also serve Prometheus /metrics on this port; off (or none) for no endpoint (default off)",
    )
    # --prometheus-host as the collector spells it; --prometheus-addr was run's own name, kept working.
    export.option(
        "--prometheus-host",
        metavar="HOST",
        default="127.0.0.1",
        help="address of the Prometheus endpoint (loopback by default, as the collector's: it has no TLS or "
        "token; 0.0.0.0 exposes it)",
    )
    add_deprecated_alias(export.parser, "--prometheus-addr", "--prometheus-host", dest="prometheus_host")
    # ... and its variable: a unit file that set it must not silently fall back to every address.
    legacy = os.environ.get(LEGACY_PROMETHEUS_VARIABLE, "").strip()
    if legacy and not os.environ.get(env_name("--prometheus-host")):
        parser.set_defaults(prometheus_host=legacy)
    export.option(
        "--health-port",
        metavar="PORT",
        type=port_number,
        help=f"serve /healthz on this port: 200 while the sampling loop reads, 503 once it has not for "
        f"three intervals (a liveness probe's; conventionally {ports.PRODUCER_HEALTH}); default off",
    )
    export.option(
        "--health-host",
        metavar="HOST",
        default="127.0.0.1",
        help="address of /healthz (loopback by default, as every endpoint without TLS; 0.0.0.0 for a probe "
        "from outside the host or pod)",
    )
    export.option(
        "--max-queue",
        metavar="N",
        type=positive_int,
        default=4,
        help="intervals kept while the backend is down; oldest dropped",
    )
    export.option(
        "--calibration",
        metavar="SPEC",
        help="tile-quantization factors: job:ID=F,model:KEY=F (e.g. model:H100-SXM=0.93)",
    )

    timing = options.group("timing")
    timing.option(
        "--interval",
        metavar="SECONDS",
        type=positive_float,
        help="seconds between reads (default: OTEL_METRIC_EXPORT_INTERVAL in ms, else 10)",
    )
    timing.option(
        "--duration",
        metavar="SECONDS",
        type=positive_float,
        help="stop cleanly after this many seconds (default: run on)",
    )
    timing.flag("--quiet", help="no startup lines on stderr")


def _attribution(args: argparse.Namespace, source: Source) -> Any:
    from otel_ofu.attribution import build_chain

    return build_chain(
        static_job_id=args.job_id,
        static_job_name=args.job_name,
        static_precision=args.precision,
        proc_root=args.proc_root,
        # Only a source that can list a GPU's processes (NVML) makes process attribution possible.
        pids_for=source.compute_pids if isinstance(source, ListsProcesses) else None,
        slurm_mapping_dir=args.slurm_mapping_dir,
        kubelet_socket=args.kubelet_socket,
        k8s_pods_url=resolve_pods_url(args.k8s_pods_url),
        k8s_node_name=args.k8s_node_name or os.environ.get("NODE_NAME") or args.host,
        k8s_token_file=args.k8s_token_file or None,
        k8s_ca_file=args.k8s_ca_file or None,
        k8s_job_label=args.k8s_job_label,
        refresh_s=args.attribution_refresh,
    )


def _say(args: argparse.Namespace, line: str) -> None:
    if not args.quiet:
        print(f"otel-ofu run: {line}", file=sys.stderr, flush=True)


def run_command(args: argparse.Namespace) -> int:
    if os.environ.get(LEGACY_PROMETHEUS_VARIABLE, "").strip():
        print(
            f"otel-ofu run: {LEGACY_PROMETHEUS_VARIABLE} is deprecated, use {env_name('--prometheus-host')}",
            file=sys.stderr,
        )
    try:
        calibration = CalibrationTable.parse(args.calibration or "")
    except ValueError as error:
        print(f"otel-ofu run: --calibration: {error}", file=sys.stderr)
        return 2
    interval = args.interval if args.interval is not None else export_interval_s()
    speed = float(args.sim_speed) if args.source == "sim" else 1.0
    clock: Clock = ScaledClock(speed) if speed != 1.0 else wall_clock
    try:
        exporter = build_exporter(args.exporter, protocol=args.protocol, endpoint=args.export_endpoint)
    except (ExporterConfigError, ValueError) as error:
        print(f"otel-ofu run: {error}", file=sys.stderr)
        return 2
    source: Source | None = None
    chain: Any = None
    endpoint: PrometheusEndpoint | None = None
    health: HealthEndpoint | None = None
    recorder: Recorder | None = None
    producer: Producer | None = None
    try:
        try:
            source, why = open_from_args(args, clock)
            _say(args, why)
            chain = _attribution(args, source)
            endpoint = _prometheus(args)
            heart = Heartbeat(loop_bound_s(interval / speed), "the sampling loop")
            health = _health(args, heart)
            recorder = open_recorder(args.record) if args.record else None
        except (SourceUnavailable, OSError, ValueError) as error:  # ValueError: a bad --k8s-pods-url
            print(f"otel-ofu run: {error}", file=sys.stderr)
            return 2
        # From here the producer owns the source, the exporter and the recorder, and closes them.
        producer = Producer(
            source=source,
            attribution=chain,
            exporter=exporter,
            interval_s=interval,
            clock=clock,
            calibration=calibration,
            builder=MetricsDataBuilder(placement=args.placement, base=env_resource(args.host)),
            observers=[heart.beat, *([endpoint.update] if endpoint is not None else [])],
            recorder=recorder,
            max_queue=args.max_queue,
            time_scale=speed,
        )
        target = args.exporter if args.exporter != "otlp" else f"otlp ({_describe_otlp(args)})"
        _say(args, f"exporting every {interval:g} s to {target}, placement {args.placement}")
        producer.run(args.duration)
        worker = producer.worker
        if args.duration is not None and worker is not None and producer.cycles and not worker.exported:
            # A bounded run is a check (a prolog, a smoke test): one that exported nothing failed.
            where = _describe_otlp(args).partition(" ")[2] if args.exporter == "otlp" else args.exporter
            print(
                f"otel-ofu run: no export got through to {where} in {producer.cycles} intervals "
                "(the warnings above say why); exit status 1",
                file=sys.stderr,
            )
            return 1
    finally:
        if producer is None:
            _close_unowned(source, exporter, recorder)
        if endpoint is not None:
            endpoint.close()
        if health is not None:
            health.close()
        close = getattr(chain, "close", None)
        if callable(close):
            close()
    return 0


def _prometheus(args: argparse.Namespace) -> PrometheusEndpoint | None:
    if args.prometheus_port is None:
        return None
    try:
        endpoint = PrometheusEndpoint(port=args.prometheus_port, addr=args.prometheus_host)
    except OSError as error:  # the port is taken, or the address is not this host's
        raise OSError(
            f"cannot serve Prometheus on {args.prometheus_host}:{args.prometheus_port}: {error.strerror or error}"
        ) from error
    _say(args, f"Prometheus /metrics on {args.prometheus_host}:{endpoint.port}")
    return endpoint


def _health(args: argparse.Namespace, heart: Heartbeat) -> HealthEndpoint | None:
    if args.health_port is None:
        return None
    health = HealthEndpoint(heart.check, port=args.health_port, host=args.health_host)
    try:
        health.start()
    except OSError as error:
        raise OSError(
            f"cannot serve /healthz on {args.health_host}:{args.health_port}: {error.strerror or error}"
        ) from error
    _say(args, f"/healthz on {args.health_host}:{health.port}")
    return health


def _close_unowned(source: Source | None, exporter: MetricExporter | None, recorder: Recorder | None) -> None:
    """What a producer that was never built would have closed: each one, even when closing another fails."""
    with contextlib.ExitStack() as closing:
        if exporter is not None:
            closing.callback(exporter.shutdown)
        if source is not None:
            closing.callback(source.close)
        if recorder is not None:
            closing.callback(recorder.close)


def _describe_otlp(args: argparse.Namespace) -> str:
    """The protocol and endpoint the exporter really uses (its defaults and the standard variables applied)."""
    from otel_ofu.otlp_client import OtlpSettings

    settings = OtlpSettings.resolve(protocol=args.protocol, endpoint=args.export_endpoint)
    return f"{settings.protocol} {settings.endpoint}"
