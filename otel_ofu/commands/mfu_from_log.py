"""``otel-ofu mfu-from-log``: tail a training log and export the MFU it prints as ``job.mfu``.

For frameworks that log their MFU but cannot host the reporter library: the line
``[rank0] step 120 | ... | MFU 32.5% | ...`` becomes a ``job.mfu`` point of 0.325 with ``job.id``.
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
from otel_ofu.cli_support import add_flag, add_option
from otel_ofu.mfu.log_follower import DEFAULT_PATTERN, LogFollower, MfuPattern
from otel_ofu.mfu.reporter import DEFAULT_STALE_AFTER_S, MfuReporter

log = logging.getLogger(__name__)

ENV_FILE = "OTEL_OFU_MFU_LOG_FILE"
ENV_JOB_ID = "OTEL_OFU_JOB_ID"
DEFAULT_INTERVAL_S = 10.0


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def default_interval_s() -> float:
    """``OTEL_METRIC_EXPORT_INTERVAL`` (milliseconds) in seconds, else 10 s."""
    raw = os.environ.get("OTEL_METRIC_EXPORT_INTERVAL", "").strip()
    try:
        value = float(raw) / 1000.0 if raw else DEFAULT_INTERVAL_S
    except ValueError:
        return DEFAULT_INTERVAL_S
    return value if value > 0 else DEFAULT_INTERVAL_S


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "mfu-from-log",
        help="tail a training log and export the MFU it prints as job.mfu",
        description=(
            "Follow a training log like tail -F (appends, rotation, truncation, junk lines) and export the MFU "
            "found in it as the OpenTelemetry gauge job.mfu with job.id, over OTLP as the standard "
            "OTEL_EXPORTER_OTLP_* variables say. The default pattern reads 'MFU 32.5%', 'mfu: 0.325', "
            "'mfu=0.325' and 'MFU: 41%': a % sign means percent, none means a fraction."
        ),
    )
    add_option(parser, "--file", env=ENV_FILE, required=not os.environ.get(ENV_FILE), help="the training log")
    add_option(parser, "--job-id", env=ENV_JOB_ID, required=not os.environ.get(ENV_JOB_ID), help="job.id of the job")
    add_option(parser, "--job-name", help="job.name of the job")
    add_option(parser, "--precision", default="bf16", choices=names.PRECISIONS, help="gpu.precision the job trains in")
    add_option(
        parser,
        "--pattern",
        env="OTEL_OFU_MFU_PATTERN",
        help="regex with a named group (?P<mfu>...) instead of the default pattern",
    )
    add_flag(parser, "--percent", env="OTEL_OFU_MFU_PERCENT", help="the pattern's value is a percent (32.5 = 0.325)")
    add_flag(parser, "--fraction", env="OTEL_OFU_MFU_FRACTION", help="the pattern's value is a fraction (0.325)")
    add_option(
        parser,
        "--interval",
        type=_positive_float,
        help=f"export interval in seconds (default: OTEL_METRIC_EXPORT_INTERVAL, else {DEFAULT_INTERVAL_S:g})",
    )
    add_option(
        parser,
        "--poll-interval",
        env="OTEL_OFU_MFU_POLL_INTERVAL",
        type=_positive_float,
        default=1.0,
        help="seconds between reads of the log",
    )
    add_option(
        parser,
        "--stale-after",
        env="OTEL_OFU_MFU_STALE_AFTER",
        type=_positive_float,
        default=DEFAULT_STALE_AFTER_S,
        help="stop exporting the last MFU when the log has printed none for this many seconds",
    )
    add_option(
        parser,
        "--duration",
        type=_non_negative_float,
        help="stop cleanly after this many seconds, flushing (default: until SIGTERM/SIGINT)",
    )
    add_flag(
        parser,
        "--from-start",
        env="OTEL_OFU_MFU_FROM_START",
        help="read the lines already in the file too (default: only lines appended from now on)",
    )
    parser.set_defaults(handler=run)


def pattern_from_args(args: argparse.Namespace) -> MfuPattern:
    if args.percent and args.fraction:
        raise ValueError("--percent and --fraction exclude each other")
    percent: bool | None = True if args.percent else (False if args.fraction else None)
    if args.pattern:
        return MfuPattern.compile(args.pattern, percent=percent)
    if percent is None:
        return DEFAULT_PATTERN
    return MfuPattern(DEFAULT_PATTERN.regex, "percent" if percent else "fraction")


def run(args: argparse.Namespace) -> int:
    try:
        pattern = pattern_from_args(args)
        reporter = MfuReporter(
            args.job_id,
            job_name=args.job_name,
            precision=args.precision,
            stale_after_s=args.stale_after,
            export_interval_s=args.interval or default_interval_s(),
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
