"""``otel-ofu run``: the long-running node producer (DaemonSet, systemd unit, or by hand)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Mapping
from typing import Any, cast

import attrs
from opentelemetry.sdk.environment_variables import OTEL_METRIC_EXPORT_INTERVAL

from otel_ofu import names
from otel_ofu.cli_support import add_flag, add_option
from otel_ofu.gpu_values import CalibrationTable
from otel_ofu.model import Clock, Source, SourceUnavailable
from otel_ofu.producer.exporters import EXPORTER_KINDS, PROTOCOLS, ExporterConfigError, build_exporter
from otel_ofu.producer.loop import Observer, Producer, open_recorder, wall_clock
from otel_ofu.producer.metrics_data import MetricsDataBuilder, env_resource
from otel_ofu.producer.prometheus import PrometheusEndpoint

log = logging.getLogger(__name__)

SOURCE_KINDS = ("auto", "nvml", "dcgm", "dcgm-exporter", "replay", "sim")
DEFAULT_INTERVAL_S = 10.0

DESCRIPTION = """\
Read GPU counters once per interval, compute OFU per GPU, attribute each GPU to its job and export
the contract's gauges as OTLP, one Resource per GPU, one request per interval for the whole host.

The standard OpenTelemetry variables work as usual: OTEL_EXPORTER_OTLP_ENDPOINT, _HEADERS,
_PROTOCOL, _TIMEOUT, _COMPRESSION, _CERTIFICATE (and their _METRICS_ forms),
OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE, OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME and
OTEL_METRIC_EXPORT_INTERVAL (milliseconds). Every option below also has its own variable."""

EPILOG = """\
examples:
  otel-ofu run                                   # NVML or DCGM, OTLP/gRPC to localhost:4317
  otel-ofu run --source dcgm-exporter --url http://localhost:9400/metrics --prometheus-port 9464
  otel-ofu run --source sim --sim-speed 60 --exporter console --duration 600
  OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318 otel-ofu run

SIGTERM or SIGINT exports the last (partial) interval, then exits 0."""


def default_interval_s(environ: Mapping[str, str] | None = None) -> float:
    """``OTEL_METRIC_EXPORT_INTERVAL`` (milliseconds, as the SDK reads it) in seconds, else 10."""
    raw = (environ if environ is not None else os.environ).get(OTEL_METRIC_EXPORT_INTERVAL, "").strip()
    if raw:
        try:
            value = float(raw) / 1000.0
        except ValueError:
            log.warning("ignoring %s=%r: not a number of milliseconds", OTEL_METRIC_EXPORT_INTERVAL, raw)
        else:
            if value > 0:
                return value
            log.warning("ignoring %s=%r: not positive", OTEL_METRIC_EXPORT_INTERVAL, raw)
    return DEFAULT_INTERVAL_S


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


# argparse checks choices on the command line only; a value from an environment variable is the default.
_CHOICES: Mapping[str, tuple[str, ...]] = {
    "source": SOURCE_KINDS,
    "exporter": EXPORTER_KINDS,
    "protocol": PROTOCOLS,
    "placement": names.PLACEMENTS,
    "precision": names.PRECISIONS,
}


def _check_choices(args: argparse.Namespace) -> str | None:
    for key, allowed in _CHOICES.items():
        value = getattr(args, key)
        if value is not None and value not in allowed:
            return f"--{key} {value!r} (from its environment variable?) is not one of {', '.join(allowed)}"
    return None


@attrs.frozen
class ScaledClock:
    """Simulated time that runs ``speed`` times faster than the wall clock, from now on."""

    speed: float
    origin_ns: int = attrs.field(factory=time.time_ns)

    def __call__(self) -> int:
        return self.origin_ns + int((time.time_ns() - self.origin_ns) * self.speed)


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


def _group(parser: argparse.ArgumentParser, title: str) -> argparse.ArgumentParser:
    # Argument groups take add_argument like a parser; cli_support only needs that.
    return cast(argparse.ArgumentParser, parser.add_argument_group(title))


def add_run_options(parser: argparse.ArgumentParser) -> None:
    source = _group(parser, "source")
    add_option(
        source,
        "--source",
        default="auto",
        choices=SOURCE_KINDS,
        help="where the counters come from; auto picks NVML, then DCGM, and says which and why",
    )
    add_option(source, "--url", metavar="URL", help="dcgm-exporter /metrics URL (--source dcgm-exporter)")
    add_option(source, "--file", metavar="FILE", help="capture or dcgmi dmon file to replay (--source replay)")
    add_option(
        source, "--host", metavar="NAME", help="host.name of this node (default: the hostname or the source's own)"
    )
    add_option(source, "--seed", metavar="N", type=int, help="seed of the simulated fleet (--source sim)")
    add_option(
        source,
        "--sim-speed",
        metavar="N",
        type=_positive,
        default=1.0,
        help="simulated time runs this many times faster than wall time; --interval and --duration are "
        "simulated seconds (--source sim)",
    )
    add_option(source, "--record", metavar="FILE", help="also append every snapshot to this JSON-lines capture file")
    add_option(
        source,
        "--clock-sample-hz",
        type=_positive,
        default=10.0,
        metavar="HZ",
        help="SM clock samples per second averaged over each interval (--source nvml)",
    )
    add_option(
        source,
        "--nvml-library",
        metavar="PATH",
        help="NVML shared library to load instead of libnvidia-ml.so.1 (--source nvml)",
    )
    add_option(source, "--dcgm-address", metavar="HOST", default="localhost", help="DCGM host engine (--source dcgm)")

    attribution = _group(parser, "job attribution")
    add_option(attribution, "--job-id", metavar="ID", help="job.id for every GPU when nothing better is known")
    add_option(attribution, "--job-name", metavar="NAME", help="job.name for every GPU when nothing better is known")
    add_option(attribution, "--precision", choices=names.PRECISIONS, help="gpu.precision when the job does not say")
    add_option(
        attribution, "--slurm-mapping-dir", metavar="DIR", help="HPC job-mapping directory (one file per GPU index)"
    )
    add_option(
        attribution,
        "--kubelet-socket",
        metavar="PATH",
        help="kubelet pod-resources socket, e.g. /var/lib/kubelet/pod-resources/kubelet.sock",
    )
    add_option(attribution, "--proc-root", metavar="DIR", default="/proc", help="where the host's /proc is mounted")
    add_option(
        attribution,
        "--attribution-refresh",
        metavar="SECONDS",
        type=_positive,
        default=30.0,
        help="seconds a GPU's attribution is reused before it is looked up again",
    )

    export = _group(parser, "export")
    add_option(export, "--exporter", default="otlp", choices=EXPORTER_KINDS, help="push exporter")
    add_option(
        export,
        "--export-endpoint",
        metavar="URL",
        help="OTLP endpoint URL (default: the OTEL_EXPORTER_OTLP_[METRICS_]ENDPOINT the SDK reads)",
    )
    add_option(
        export,
        "--protocol",
        choices=PROTOCOLS,
        help="OTLP transport (default: OTEL_EXPORTER_OTLP_[METRICS_]PROTOCOL, else grpc)",
    )
    add_option(
        export,
        "--placement",
        default="resource",
        choices=names.PLACEMENTS,
        help="where identity attributes go: resource, datapoint (Datadog) or both",
    )
    add_option(
        export, "--prometheus-port", metavar="PORT", type=int, help="also serve Prometheus /metrics on this port (off)"
    )
    add_option(
        export, "--prometheus-addr", metavar="ADDR", default="0.0.0.0", help="address of the Prometheus endpoint"
    )
    add_option(
        export,
        "--max-queue",
        metavar="N",
        type=_positive_int,
        default=4,
        help="intervals kept while the backend is down; oldest dropped",
    )
    add_option(
        export,
        "--calibration",
        metavar="SPEC",
        help="tile-quantization factors: job:ID=F,model:KEY=F (e.g. model:H100-SXM=0.93)",
    )

    timing = _group(parser, "timing")
    add_option(
        timing,
        "--interval",
        metavar="SECONDS",
        type=_positive,
        default=default_interval_s(),
        help="seconds between reads (default from OTEL_METRIC_EXPORT_INTERVAL in ms, else 10)",
    )
    add_option(
        timing,
        "--duration",
        metavar="SECONDS",
        type=_positive,
        help="stop cleanly after this many seconds (default: run on)",
    )
    add_flag(timing, "--quiet", help="no startup lines on stderr")


def _open_source(args: argparse.Namespace, clock: Clock) -> tuple[Source, str]:
    from otel_ofu.sources.factory import open_source

    options: dict[str, Any] = {"clock_sample_hz": args.clock_sample_hz, "address": args.dcgm_address}
    if args.nvml_library:
        options["library"] = args.nvml_library
    return open_source(
        args.source, url=args.url, file=args.file, host=args.host, seed=args.seed, clock=clock, **options
    )


def _attribution(args: argparse.Namespace, source: Source) -> Any:
    from otel_ofu.attribution import build_chain

    pids_for = getattr(source, "compute_pids", None)  # sources that can list a GPU's processes (NVML)
    return build_chain(
        static_job_id=args.job_id,
        static_job_name=args.job_name,
        static_precision=args.precision,
        proc_root=args.proc_root,
        pids_for=pids_for if callable(pids_for) else None,
        slurm_mapping_dir=args.slurm_mapping_dir,
        kubelet_socket=args.kubelet_socket,
        refresh_s=args.attribution_refresh,
    )


def _say(args: argparse.Namespace, line: str) -> None:
    if not args.quiet:
        print(f"otel-ofu run: {line}", file=sys.stderr, flush=True)


def run_command(args: argparse.Namespace) -> int:
    problem = _check_choices(args)
    if problem:
        print(f"otel-ofu run: {problem}", file=sys.stderr)
        return 2
    try:
        calibration = CalibrationTable.parse(args.calibration or "")
    except ValueError as error:
        print(f"otel-ofu run: --calibration: {error}", file=sys.stderr)
        return 2
    speed = float(args.sim_speed) if args.source == "sim" else 1.0
    clock: Clock = ScaledClock(speed) if speed != 1.0 else wall_clock
    try:
        exporter = build_exporter(args.exporter, protocol=args.protocol, endpoint=args.export_endpoint)
    except (ExporterConfigError, ValueError) as error:
        print(f"otel-ofu run: {error}", file=sys.stderr)
        return 2
    try:
        source, why = _open_source(args, clock)
    except SourceUnavailable as error:
        print(f"otel-ofu run: {error}", file=sys.stderr)
        return 2
    _say(args, why)
    chain = _attribution(args, source)
    endpoint: PrometheusEndpoint | None = None
    observers: list[Observer] = []
    if args.prometheus_port is not None:
        endpoint = PrometheusEndpoint(port=args.prometheus_port, addr=args.prometheus_addr)
        observers.append(endpoint.update)
        _say(args, f"Prometheus /metrics on {args.prometheus_addr}:{endpoint.port}")

    try:
        producer = Producer(
            source=source,
            attribution=chain,
            exporter=exporter,
            interval_s=args.interval,
            clock=clock,
            calibration=calibration,
            builder=MetricsDataBuilder(placement=args.placement, base=env_resource(args.host)),
            observers=observers,
            recorder=open_recorder(args.record) if args.record else None,
            max_queue=args.max_queue,
            time_scale=speed,
        )
        target = args.exporter if args.exporter != "otlp" else f"otlp ({_describe_otlp(args)})"
        _say(args, f"exporting every {args.interval:g} s to {target}, placement {args.placement}")
        producer.run(args.duration)
    finally:
        if endpoint is not None:
            endpoint.close()
        close = getattr(chain, "close", None)
        if callable(close):
            close()
    return 0


def _describe_otlp(args: argparse.Namespace) -> str:
    from otel_ofu.producer.exporters import resolve_protocol

    protocol = resolve_protocol(args.protocol)
    endpoint = (
        args.export_endpoint
        or os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "the SDK default")
    )
    return f"{protocol} {endpoint}"
