"""``otel-ofu top``: the command line of the live terminal view (``app.TopApp``).

One of three sources: ``--feed URL`` (a collector's report feed), ``--demo`` (the simulated demo fleet, live)
or, by default, ``--source ...`` (one node's GPUs through the producer's own source options, with the
collector's windows computed in this process). What could stop it from starting (a bad option, a source that
cannot open, an unreadable token file) is one line and exit status 2 before the screen opens; once it is
open, faults are shown on the screen.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from otel_ofu import ports
from otel_ofu.cli_support import CommandOptions, positive_float, url_or_host_port
from otel_ofu.clock import ManualClock, wall_clock
from otel_ofu.gpu_values import CalibrationTable
from otel_ofu.model import SourceUnavailable
from otel_ofu.sources.factory import add_source_options, open_from_args
from otel_ofu.sources.simulated import SimulatedFleet
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.demo.loopback import LoopbackPipeline
from otel_ofu_collector.options.declared import WINDOW_RANGE
from otel_ofu_collector.outputs.feed_client import FeedAccess
from otel_ofu_collector.prefixes import TOP_PREFIX
from otel_ofu_collector.top.feeds import PipelineRunner, ReportFeedPoller, Source, start_thread

DESCRIPTION = """\
The fleet live in a terminal: GPUs, fleet OFU p50/p95, GPU-hours and cost lost in the last hour and the
flags up; a table of jobs ranked by what their owner can act on (as the reports rank them: flags, then
bottlenecks, then GPU-hours short of the best OFU of the same GPU model), with each job's OFU and its recent
windows, MFU, where its GPU time went (ofu.loss.cause) and its flags or bottleneck; Enter opens a job's GPUs
(OFU, SM clock against the clock OFU is measured against, power, throttle reason, straggler) and says why it
ranks where it does.

Keys: arrows move, Enter opens a job, Esc goes back, s changes the sort, / filters by text, p pauses, ? shows
the help, q quits.

Sources (one): --feed URL reads a running collector's report feed (otel-ofu collector --report-feed-port);
--demo runs the embedded simulated fleet live; otherwise the --source options (those of otel-ofu run and
snapshot, with their variables) read this node's GPUs and the collector's windows are computed here.
NO_COLOR=1 turns colours off."""

DEMO_INTERVAL_S: Final = 10.0
DEMO_WINDOW_S: Final = 60.0
SOURCE_INTERVAL_S: Final = 2.0
SOURCE_WINDOW_S: Final = 10.0
DEMO_DURATION_S: Final = 1800.0  # the demo fleet's scenario: the regressing job falls at 40% of it
_JOIN_S: Final = 5.0
_KEPT_LOG_LINES: Final = 200


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "top",
        help="the fleet live in a terminal: jobs ranked by what to act on, OFU, loss by cause, flags, a job's GPUs",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ours = CommandOptions(parser, TOP_PREFIX)
    ours.option(
        "--feed",
        metavar="URL",
        type=url_or_host_port,
        help=f"a running collector's report feed, e.g. http://collector:{ports.COLLECTOR_REPORT_FEED} "
        "(otel-ofu collector --report-feed-port; not its --prometheus-port)",
    )
    ours.flag("--demo", help="run the embedded simulated fleet live (no GPU, no collector needed)")
    feed = ours.group("reading a --feed")
    feed.option("--refresh", metavar="SECONDS", type=positive_float, default=2.0, help="how often the feed is read")
    feed.option(
        "--timeout", metavar="SECONDS", type=positive_float, default=5.0, help="how long one read of the feed may take"
    )
    feed.option(
        "--bearer-token",
        metavar="TOKEN",
        help="sent as 'authorization: Bearer <token>' (on the command line it shows in the process table: "
        "prefer --bearer-token-file or the environment variable)",
    )
    feed.option("--bearer-token-file", metavar="FILE", help="read the bearer token from this file")
    feed.option("--ca-file", metavar="FILE", help="CA (PEM) an https feed's certificate must chain to")
    feed.option("--client-cert", metavar="FILE", help="client certificate (PEM) for an https feed that asks for mTLS")
    feed.option("--client-key", metavar="FILE", help="the client certificate's private key (PEM)")
    live = ours.group("--demo and --source")
    live.option(
        "--interval",
        metavar="SECONDS",
        type=positive_float,
        help=f"seconds between reads (default {DEMO_INTERVAL_S:g} simulated seconds with --demo, "
        f"{SOURCE_INTERVAL_S:g} with --source)",
    )
    live.option(
        "--window",
        metavar="SECONDS",
        type=WINDOW_RANGE.parse,
        help=f"the windows' length (default {DEMO_WINDOW_S:g} simulated seconds with --demo, "
        f"{SOURCE_WINDOW_S:g} with --source)",
    )
    live.option(
        "--speed",
        metavar="FACTOR",
        type=positive_float,
        default=10.0,
        help="simulated seconds per second of the --demo fleet (1: real time)",
    )
    source = parser.add_argument_group("one node's GPUs (the options of otel-ofu run and snapshot)")
    add_source_options(CommandOptions(source))
    CommandOptions(source).option(
        "--calibration", metavar="SPEC", help="tile calibration factors, job:ID=F,model:KEY=F"
    )
    parser.set_defaults(handler=run)


class UsageError(ValueError):
    """A setting that stops ``top`` before its screen opens."""


def _token(args: argparse.Namespace) -> str | None:
    if args.bearer_token_file:
        try:
            return Path(args.bearer_token_file).read_text(encoding="utf-8").strip() or None
        except OSError as error:
            raise UsageError(f"cannot read --bearer-token-file {args.bearer_token_file}: {error.strerror}") from None
    if args.bearer_token and any(arg == "--bearer-token" or arg.startswith("--bearer-token=") for arg in sys.argv):
        logging.getLogger(__name__).warning(
            "--bearer-token on the command line is visible to every local user in the process table: "
            "use --bearer-token-file or %sBEARER_TOKEN",
            TOP_PREFIX,
        )
    return str(args.bearer_token) if args.bearer_token else None


def _feed_source(args: argparse.Namespace) -> Source:
    if bool(args.client_cert) != bool(args.client_key):
        raise UsageError("--client-cert and --client-key go together")
    for option, path in (
        ("--ca-file", args.ca_file),
        ("--client-cert", args.client_cert),
        ("--client-key", args.client_key),
    ):
        if path and not Path(path).is_file():
            raise UsageError(f"{option} {path}: no such file")
    access = FeedAccess(_token(args), args.ca_file, args.client_cert, args.client_key)
    return ReportFeedPoller(args.feed, refresh_s=args.refresh, timeout_s=args.timeout, access=access)


def _demo_source(args: argparse.Namespace) -> Source:
    # Imported here: the demo command's module is only needed for the demo.
    from otel_ofu_collector.demo.command import demo_pipeline

    interval = args.interval or DEMO_INTERVAL_S
    window = args.window or DEMO_WINDOW_S
    window_ns = int(window * 1e9)
    clock = ManualClock(start_ns=time.time_ns() // window_ns * window_ns)  # whole windows from the start
    seed = 7 if args.seed is None else args.seed
    fleet = SimulatedFleet.demo(seed=seed, clock=clock, duration_s=DEMO_DURATION_S)
    return PipelineRunner(
        pipeline=demo_pipeline(fleet, clock, interval_s=interval, window_s=window),
        title=f"demo fleet, simulated at {args.speed:g}x",
        pause_s=interval / args.speed,
        advance=lambda: clock.advance(interval),
        fleet_clock=clock,
    )


def _node_source(args: argparse.Namespace) -> Source:
    try:
        calibration = CalibrationTable.parse(args.calibration or "")
    except ValueError as error:
        raise UsageError(str(error)) from None
    interval = args.interval or SOURCE_INTERVAL_S
    window = args.window or SOURCE_WINDOW_S
    try:
        source, why = open_from_args(args)
    except SourceUnavailable as error:
        raise UsageError(f"{error} (otel-ofu top --demo shows the simulated fleet, --feed URL a collector's)") from None
    pipeline = LoopbackPipeline(
        source=source,
        clock=wall_clock,
        aggregator=AggregatorConfig(window_s=window, lateness_s=interval),
        interval_s=interval,
        calibration=calibration,
    )
    return PipelineRunner(pipeline=pipeline, title=why, pause_s=interval)


def build_source(args: argparse.Namespace) -> Source:
    """The source the options name; UsageError when they cannot give one."""
    if args.feed and args.demo:
        raise UsageError("give one of --feed URL or --demo (or neither, for this node's --source)")
    if args.feed:
        return _feed_source(args)
    if args.demo:
        return _demo_source(args)
    return _node_source(args)


@contextmanager
def _logs_held() -> Iterator[deque[str]]:
    """Log lines kept while the screen is up (written to the terminal they would tear it), then printed."""
    root = logging.getLogger()
    kept: deque[str] = deque(maxlen=_KEPT_LOG_LINES)
    formatter = next((handler.formatter for handler in root.handlers if handler.formatter), None)

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            kept.append((formatter or logging.Formatter()).format(record))

    handlers = root.handlers[:]
    keep = Keep(level=logging.WARNING)
    root.handlers = [keep]
    try:
        yield kept
    finally:
        root.handlers = handlers
        for line in kept:
            print(line, file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    try:
        source = build_source(args)
    except UsageError as error:
        print(f"otel-ofu top: {error}", file=sys.stderr)
        return 2
    # The screen's module loads textual: only a top that starts pays for it.
    from otel_ofu_collector.top.app import TopApp

    app = TopApp(source.title)
    stop = threading.Event()
    # The screen gives the terminal back on its way out: a SIGINT from outside (Ctrl-C itself is a key to it) must
    # unwind through it as a KeyboardInterrupt, not end the process where it stands (the entry point's handler).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with _logs_held():
        thread = start_thread(source, app.post, stop)
        try:
            app.run()
        finally:
            stop.set()
            thread.join(timeout=_JOIN_S)
    return 0
