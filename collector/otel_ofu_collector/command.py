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
from otel_ofu.cli_support import CommandOptions
from otel_ofu.gpu_values import CalibrationTable
from otel_ofu.health import HealthEndpoint, Heartbeat, loop_bound_s
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.detectors import FLAG_OPTIONS
from otel_ofu_collector.options import OPTIONS, SECTIONS, in_section, settings_from
from otel_ofu_collector.options import file as config_file
from otel_ofu_collector.options.option import Option
from otel_ofu_collector.outputs.feed_server import ReportFeed
from otel_ofu_collector.outputs.recorder import ReportRecorder
from otel_ofu_collector.prefixes import COLLECTOR_PREFIX
from otel_ofu_collector.receivers.auth import TlsFiles, bearer_auth
from otel_ofu_collector.service import CollectorOptions, CollectorService

logger = logging.getLogger(__name__)


DESCRIPTION = """\
Receive OTLP metrics from the producers (gRPC and/or HTTP), aggregate fleet OFU per window,
correlate it with the MFU each job reports, flag suspicious jobs and GPUs, and export the results
over OTLP and on a Prometheus endpoint.

The standard OpenTelemetry variables work as usual: OTEL_EXPORTER_OTLP_ENDPOINT, _PROTOCOL,
_HEADERS, _TIMEOUT, _COMPRESSION, _CERTIFICATE (and their _METRICS_ forms) for the downstream, and
OTEL_RESOURCE_ATTRIBUTES for the outputs' resource. Every option below also has its own
OTEL_OFU_COLLECTOR_* variable and its key in a --config file (its name under its group's
section: windows: {window: 30}; --print-config shows them all). A flag wins over its variable,
a variable over the file, the file over the default. A number outside its option's [range] is
refused before anything starts."""

EPILOG = f"""\
examples:
  otel-ofu collector --export-endpoint http://otelcol:4317 --prometheus-port {ports.COLLECTOR_PROMETHEUS}
  otel-ofu collector --listen off --http-listen 0.0.0.0:4318 --window 30 --lateness 10
  otel-ofu collector --price-per-gpu-hour 'NVIDIA H100 80GB HBM3=2.5,default=2.0' --pue 1.3 \\
      --grid-intensity 0.4 --straggler-factor 1.25 --idle-windows 3
  otel-ofu collector --spool /var/lib/otel-ofu/spool.sqlite --report-feed-port {ports.COLLECTOR_REPORT_FEED}
  otel-ofu collector --config collector.yaml --window 30
  otel-ofu collector --print-config > collector.yaml

SIGTERM or SIGINT closes the open windows, exports them and exits 0."""


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
    options.option(
        "--config",
        default=None,
        metavar="FILE",
        help="YAML file of options, each under its section (windows: {window: 30}); a flag wins over its "
        "variable, a variable over the file, the file over the default",
    )
    options.flag("--print-config", help="print the configuration a run would use, as such a file, and exit")
    for section in SECTIONS:  # every option as declared (options/declared.py), in its help group
        group = options.group(section.title)
        for option in in_section(section):
            _add(group, option)
    config_file.read_before_parsing(parser)
    parser.set_defaults(handler=run, usage_error=parser.error)


def _add(options: CommandOptions, option: Option[Any]) -> None:
    if option.switch:
        options.flag(option.flag, default=bool(option.default), help=option.help)
        return
    options.option(
        option.flag,
        default=option.shown_default,  # as text: argparse reads it with the option's parser, as any value
        type=option.parse,
        metavar=option.metavar,
        choices=option.choices,
        help=option.described,
    )


def environment_resource_attributes() -> dict[str, str]:
    """``OTEL_RESOURCE_ATTRIBUTES`` as the SDK reads it, less ``service.name``: the outputs are always the
    collector's own service (``OTEL_SERVICE_NAME`` does not rename it either)."""
    detected = OTELResourceDetector().detect().attributes
    return {key: str(value) for key, value in detected.items() if key != names.SERVICE_NAME}


def options_from_args(args: argparse.Namespace) -> CollectorOptions:
    """The service options an ``otel-ofu collector`` command line asks for (validated on construction)."""
    values = {option.name: getattr(args, option.name) for option in OPTIONS}
    values["horizon"] = max(values["horizon"], values["window"])  # at least one window
    # Never evict what an open window still holds.
    values["stale_after"] = max(values["stale_after"], values["window"] + values["lateness"])
    aggregator = AggregatorConfig(
        **settings_from(AggregatorConfig, values),
        flag_settings={option.key: values[option.key] for option in FLAG_OPTIONS},
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
        **settings_from(CollectorOptions, values),
        **extra,
        calibration=values["calibration"] or CalibrationTable(),
        resource_attributes=resource,
        aggregator=aggregator,
        tls=tls,
        bearer_token=auth.token if auth else None,
    )


def dcgm_attribution(args: argparse.Namespace) -> AttributionChain | None:
    """The producer's attribution chain for the GPUs of dcgm-exporter scrapes, with the cluster's pod list when
    ``--k8s-pods-url`` asks for it (its refresher started; the caller closes it); None without one: the pod labels
    alone, as the producer reads them without one."""
    url = cluster_pods_url(args.k8s_pods_url)
    if url is None:
        return None
    return build_chain(k8s_pods_url=url, k8s_job_label=args.k8s_job_label)  # the producer's order of links


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


def print_config(args: argparse.Namespace) -> int:
    """``--print-config``: the options' values as a configuration file, once they make a collector's options."""
    try:
        options_from_args(args)
    except (ValueError, OSError) as error:
        logger.error("otel-ofu collector: %s", error)
        return 2
    sys.stdout.write(config_file.effective(vars(args)))
    return 0


def run(args: argparse.Namespace) -> int:
    if args.print_config:
        return print_config(args)
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
            feed = ReportFeed(
                host=args.report_feed_host, port=int(args.report_feed_port), max_bytes=int(args.report_feed_max_bytes)
            )
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
