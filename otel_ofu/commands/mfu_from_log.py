"""``otel-ofu mfu-from-log``: tail a training log and export the MFU it prints as ``job.mfu``, its progress as
``job.step`` and the checkpoint time it logs as ``job.checkpoint.time``.

For frameworks that log their MFU but cannot host the reporter library: the line
``[rank0] step 120 | ... | MFU 32.5% | ...`` becomes a ``job.mfu`` point of 0.325 and a ``job.step`` point of 120 with
``job.id``; ``Finished saving the checkpoint in 5.2 seconds`` adds 5.2 s of saving (``otel_ofu.mfu.progress_lines``).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from types import FrameType
from typing import Any

from otel_ofu import names
from otel_ofu.cli_support import (
    DEFAULT_EXPORT_INTERVAL_S,
    MFU_PREFIX,
    CommandOptions,
    export_interval_s,
    non_negative_float,
    positive_float,
    url_or_host_port,
)
from otel_ofu.mfu.log_follower import DEFAULT_PATTERN, UNITS, FollowerStats, LogFollower, MfuPattern
from otel_ofu.mfu.progress_lines import ProgressLine
from otel_ofu.mfu.reporter import DEFAULT_STALE_AFTER_S, MfuReporter, otlp_meter_provider
from otel_ofu.producer.exporters import GRPC, PROTOCOLS, http_metrics_url, otlp_exporter, resolve_protocol

log = logging.getLogger(__name__)

# Every variable is OTEL_OFU_MFU_<FLAG> (the log file's OTEL_OFU_MFU_FILE); the file's was
# OTEL_OFU_MFU_LOG_FILE, still read when the new one is unset, with a deprecation line.
OLD_ENV_FILE = "OTEL_OFU_MFU_LOG_FILE"
# Where the SDK's exporters send when no endpoint is configured.
SDK_DEFAULT_ENDPOINTS = {GRPC: "localhost:4317", "http/protobuf": "http://localhost:4318/v1/metrics"}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "mfu-from-log",
        help="tail a training log and export the MFU it prints as job.mfu",
        description=(
            "Follow a training log like tail -F (appends, rotation, truncation, junk lines) and export the MFU "
            "found in it as the OpenTelemetry gauge job.mfu with job.id, over OTLP as the standard "
            "OTEL_EXPORTER_OTLP_* variables say. The default pattern reads 'MFU 32.5%', 'mfu: 0.325', "
            "'mfu=0.325' and 'MFU: 41%': a % sign means percent, none means a fraction (see --unit). The step a "
            "line names ('step 120', 'iteration 100/1000') goes out as job.step, and a timed checkpoint save or "
            "load ('Finished saving the checkpoint ... in 5.2 seconds', Megatron-LM's save-checkpoint timer) as "
            "job.checkpoint.time: what the collector's goodput reads progress and restarts from."
        ),
    )
    options = CommandOptions(parser, MFU_PREFIX)
    options.option("--file", metavar="FILE", required=True, old_env=OLD_ENV_FILE, help="the training log")
    options.option("--job-id", metavar="ID", required=True, help="job.id of the job")
    options.option("--job-name", metavar="NAME", help="job.name of the job")
    options.option("--precision", default="bf16", choices=names.PRECISIONS, help="gpu.precision the job trains in")
    options.option(
        "--pattern", metavar="REGEX", help="regex with a named group (?P<mfu>...) instead of the default pattern"
    )
    options.option(
        "--unit",
        default="auto",
        choices=UNITS,
        help="what the matched value is: percent (32.5 = 0.325), fraction (0.325), or auto: percent when a %% "
        "sign follows it",
    )
    options.option(
        "--interval",
        metavar="SECONDS",
        type=positive_float,
        help="export interval in seconds "
        f"(default: OTEL_METRIC_EXPORT_INTERVAL in ms, else {DEFAULT_EXPORT_INTERVAL_S:g})",
    )
    options.option(
        "--export-endpoint",
        metavar="URL",
        type=url_or_host_port,
        help="OTLP endpoint URL (default: the OTEL_EXPORTER_OTLP_[METRICS_]ENDPOINT the SDK reads)",
    )
    options.option(
        "--protocol",
        choices=PROTOCOLS,
        help="OTLP transport (default: OTEL_EXPORTER_OTLP_[METRICS_]PROTOCOL, else grpc)",
    )
    options.option(
        "--poll-interval", metavar="SECONDS", type=positive_float, default=1.0, help="seconds between reads of the log"
    )
    options.option(
        "--stale-after",
        metavar="SECONDS",
        type=positive_float,
        default=DEFAULT_STALE_AFTER_S,
        help="stop exporting the last MFU when the log has printed none for this many seconds",
    )
    options.option(
        "--duration",
        metavar="SECONDS",
        type=non_negative_float,
        help="stop cleanly after this many seconds, flushing (default: until SIGTERM/SIGINT)",
    )
    options.flag(
        "--from-start", help="read the lines already in the file too (default: only lines appended from now on)"
    )
    parser.set_defaults(handler=run)


def pattern_from_args(args: argparse.Namespace) -> MfuPattern:
    unit: str = args.unit
    if args.pattern:
        return MfuPattern(MfuPattern.compile(args.pattern).regex, unit)
    return DEFAULT_PATTERN if unit == DEFAULT_PATTERN.unit else MfuPattern(DEFAULT_PATTERN.regex, unit)


def export_target(protocol: str | None, endpoint: str | None) -> str:
    """Where the OTLP exporter sends, as the SDK resolves it: ``grpc http://collector:4317``."""
    chosen = resolve_protocol(protocol)
    given = (
        endpoint
        or os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )
    if not given:
        return f"{chosen} {SDK_DEFAULT_ENDPOINTS[chosen]} (the SDK's default)"
    # OTLP/HTTP adds /v1/metrics to a base URL (a --export-endpoint or OTEL_EXPORTER_OTLP_ENDPOINT).
    if chosen != GRPC and given != os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"):
        given = http_metrics_url(given)
    return f"{chosen} {given}"


def run(args: argparse.Namespace) -> int:
    interval = args.interval or export_interval_s()
    try:
        pattern = pattern_from_args(args)
        target = export_target(args.protocol, args.export_endpoint)
        provider = otlp_meter_provider(
            export_interval_s=interval,
            exporter=otlp_exporter(protocol=args.protocol, endpoint=args.export_endpoint),
        )
    except ValueError as error:
        log.error("mfu-from-log: %s", error)
        return 2
    try:
        reporter = MfuReporter(
            args.job_id,
            job_name=args.job_name,
            precision=args.precision,
            stale_after_s=args.stale_after,
            meter_provider=provider,
        )
    except ValueError as error:
        provider.shutdown()
        log.error("mfu-from-log: %s", error)
        return 2
    stop = threading.Event()
    try:
        follower = LogFollower(
            args.file,
            pattern=pattern,
            from_start=args.from_start,
            sleep=stop.wait,
            on_progress=lambda progress: report_progress(reporter, progress),
        )
    except OSError as error:
        log.error("mfu-from-log: cannot read %s: %s", args.file, error.strerror or error)
        reporter.shutdown()
        provider.shutdown()
        return 1
    previous = _install_stop_handlers(stop)
    if not follower.path.exists():
        log.info("waiting for %s to appear", follower.path)
    log.info(
        "following %s for job %s: exporting %s every %g s to otlp %s",
        follower.path,
        args.job_id,
        names.JOB_MFU.name,
        interval,
        target,
    )
    try:
        follower.run(reporter.report, poll_interval=args.poll_interval, duration=args.duration, should_stop=stop.is_set)
    except OSError as error:  # a directory, no permission: say so in one line, not a traceback
        log.error("mfu-from-log: cannot read %s: %s", follower.path, error.strerror or error)
        return 1
    finally:
        follower.close()
        reporter.shutdown()  # flushes the last value through the provider, which is ours to close
        provider.shutdown()
        _restore_handlers(previous)
    log.info("stopped: %s", summary(follower.stats))
    return 0


def report_progress(reporter: MfuReporter, progress: ProgressLine) -> None:
    """A line's progress to the reporter: its timed checkpoint, then its step. A value the reporter refuses (a
    negative step cannot come from the patterns) is said at DEBUG and loses nothing else."""
    try:
        if progress.checkpoint is not None:
            reporter.report_checkpoint(*progress.checkpoint)
        if progress.step is not None:
            reporter.report_step(progress.step)
    except ValueError as error:
        log.debug("progress line not reported: %s", error)


def summary(stats: FollowerStats) -> str:
    """The follower's counts in words. Junk is every line that gave neither an MFU, a refused one nor progress: lines
    without either in them (the log's other lines) and unreadable ones (binary, not UTF-8, over-long)."""
    junk = stats.without_mfu + stats.skipped
    return (
        f"{stats.lines} lines, {stats.values} MFU values, {stats.progress} progress lines, {stats.rejected} rejected, "
        f"{junk} junk lines skipped "
        f"({stats.without_mfu} without an MFU or progress, {stats.skipped} unreadable), "
        f"{stats.reopens} rotations, {stats.truncations} truncations"
    )


def _install_stop_handlers(stop: threading.Event) -> dict[int, Any]:
    if threading.current_thread() is not threading.main_thread():
        return {}  # signal handlers can only be set from the main thread; the caller stops us otherwise

    def handle(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    previous: dict[int, Any] = {}
    for signum in (signal.SIGTERM, signal.SIGINT):
        previous[signum] = signal.signal(signum, handle)
    return previous


def _restore_handlers(previous: dict[int, Any]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)
