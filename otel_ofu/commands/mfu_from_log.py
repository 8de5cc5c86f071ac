"""``otel-ofu mfu-from-log``: tail a training log and export the MFU it prints as ``job.mfu``.

For frameworks that log their MFU but cannot host the reporter library: the line
``[rank0] step 120 | ... | MFU 32.5% | ...`` becomes a ``job.mfu`` point of 0.325 with ``job.id``.
"""

from __future__ import annotations

import argparse
import logging
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
)
from otel_ofu.mfu.log_follower import DEFAULT_PATTERN, UNITS, LogFollower, MfuPattern
from otel_ofu.mfu.reporter import DEFAULT_STALE_AFTER_S, MfuReporter

log = logging.getLogger(__name__)

# The log file's variable says what it is; every other variable is OTEL_OFU_MFU_<FLAG>.
ENV_FILE = "OTEL_OFU_MFU_LOG_FILE"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "mfu-from-log",
        help="tail a training log and export the MFU it prints as job.mfu",
        description=(
            "Follow a training log like tail -F (appends, rotation, truncation, junk lines) and export the MFU "
            "found in it as the OpenTelemetry gauge job.mfu with job.id, over OTLP as the standard "
            "OTEL_EXPORTER_OTLP_* variables say. The default pattern reads 'MFU 32.5%', 'mfu: 0.325', "
            "'mfu=0.325' and 'MFU: 41%': a % sign means percent, none means a fraction (see --unit)."
        ),
    )
    options = CommandOptions(parser, MFU_PREFIX)
    options.option("--file", metavar="FILE", env=ENV_FILE, required=True, help="the training log")
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


def run(args: argparse.Namespace) -> int:
    try:
        pattern = pattern_from_args(args)
        reporter = MfuReporter(
            args.job_id,
            job_name=args.job_name,
            precision=args.precision,
            stale_after_s=args.stale_after,
            export_interval_s=args.interval or export_interval_s(),
        )
    except ValueError as error:
        log.error("mfu-from-log: %s", error)
        return 2
    stop = threading.Event()
    try:
        follower = LogFollower(args.file, pattern=pattern, from_start=args.from_start, sleep=stop.wait)
    except OSError as error:
        log.error("mfu-from-log: cannot read %s: %s", args.file, error.strerror or error)
        reporter.shutdown()
        return 1
    previous = _install_stop_handlers(stop)
    if not follower.path.exists():
        log.info("waiting for %s to appear", follower.path)
    log.info("following %s for job %s: exporting %s", follower.path, args.job_id, names.JOB_MFU.name)
    try:
        follower.run(reporter.report, poll_interval=args.poll_interval, duration=args.duration, should_stop=stop.is_set)
    except OSError as error:  # a directory, no permission: say so in one line, not a traceback
        log.error("mfu-from-log: cannot read %s: %s", follower.path, error.strerror or error)
        return 1
    finally:
        follower.close()
        reporter.shutdown()
        _restore_handlers(previous)
    stats = follower.stats
    log.info(
        "stopped: %d lines, %d MFU values, %d rejected, %d junk lines skipped, %d rotations, %d truncations",
        stats.lines,
        stats.values,
        stats.rejected,
        stats.skipped,
        stats.reopens,
        stats.truncations,
    )
    return 0


def _install_stop_handlers(stop: threading.Event) -> dict[int, Any]:
    if threading.current_thread() is not threading.main_thread():
        return {}  # signal handlers can only be set from the main thread; the caller stops us otherwise

    def handle(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous: dict[int, Any] = {}
    for signum in (signal.SIGTERM, signal.SIGINT):
        previous[signum] = signal.signal(signum, handle)
    return previous


def _restore_handlers(previous: dict[int, Any]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)
