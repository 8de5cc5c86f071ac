"""``otel-ofu report``: the HTML fleet report from a recorded run or a running collector.

Inputs, any combination of at least one:

- ``--records FILE``: the collector's recorded outputs (``otel-ofu collector --record-outputs FILE``);
- ``--live URL``: a running collector's report feed (``--report-feed-port``), read once;
- ``--capture FILE``: a producer capture (``otel-ofu run --record FILE``). Alone, it is replayed through the
  collector's own window aggregator in this process - OFU only, since a capture holds no MFU. With
  ``--records`` or ``--live`` the windows come from those and the capture adds its raw per-GPU OFU samples
  to the fleet distribution.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import attrs

from otel_ofu import ports
from otel_ofu.cli_support import CommandOptions, output_path, positive_float, url_or_host_port
from otel_ofu.control_chars import escaped
from otel_ofu.gpu_samples import compute_snapshot
from otel_ofu.model import SourceUnavailable
from otel_ofu.sources.capture import ReplaySource
from otel_ofu_collector.aggregation.windows import Aggregator
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.options.declared import WINDOW_RANGE
from otel_ofu_collector.outputs.feed_client import FeedError, fetch_records
from otel_ofu_collector.outputs.record_codec import NotWindowRecords, Records, load_records
from otel_ofu_collector.prefixes import REPORT_PREFIX
from otel_ofu_collector.report.reasons import fleet_flags
from otel_ofu_collector.report.summary import summarize
from otel_ofu_collector.results import WindowReport

logger = logging.getLogger(__name__)

DEFAULT_OUT = "ofu-report.html"
DEFAULT_WINDOW_S = 60.0
# A replay reads reads in order; a window of lateness only absorbs GPUs whose reads end a little apart.
_STALE_FLOOR_S = 600.0


@attrs.frozen
class CaptureReplay:
    """What a producer capture gives the report: OFU-only windows and the raw per-GPU OFU per model."""

    reports: tuple[WindowReport, ...]
    ofu_samples: Mapping[str, tuple[float, ...]]
    readings: int
    skipped: int  # readings without a usable OFU (invalid values), and lines the replay could not read


def replay_capture(path: str | Path, window_s: float = DEFAULT_WINDOW_S) -> CaptureReplay:
    """Replay a capture through the collector's aggregator; SourceUnavailable when it cannot be opened."""
    config = AggregatorConfig(
        window_s=window_s,
        lateness_s=window_s,
        horizon_s=max(86400.0, window_s),
        stale_after_s=max(_STALE_FLOOR_S, 3 * window_s),
    )
    aggregator = Aggregator(config)
    samples: dict[str, list[float]] = {}
    reports: list[WindowReport] = []
    readings = skipped = 0
    source = ReplaySource(Path(path))
    try:
        while True:
            snapshot = source.read()
            if source.exhausted:
                break
            computed = compute_snapshot(snapshot)  # the producer's own rule: hints, identity, calibration
            skipped += len(computed.partial)
            for sample in computed.samples:
                readings += 1
                gpu, ofu = sample.gpu, sample.values.ofu
                identity = {key: str(value) for key, value in sample.attributes.items()}
                aggregator.add_ofu(gpu.key, ofu, sample.start_ns, sample.end_ns, identity)
                samples.setdefault(gpu.model, []).append(ofu)
            reports.extend(aggregator.flush(aggregator.watermark_ns))
        reports.extend(aggregator.close_all())
        skipped += source.bad_lines
    finally:
        source.close()
    return CaptureReplay(tuple(reports), {model: tuple(values) for model, values in samples.items()}, readings, skipped)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "report",
        help="write a self-contained HTML fleet report (OFU vs MFU, distribution, timelines, flagged jobs)",
        description=(
            "Write one HTML page that opens offline: the OFU-vs-MFU scatter per job, the fleet OFU distribution "
            "per GPU model, per-job timelines with flags marked, and the flagged jobs with the reason in words. "
            "Give at least one of --records, --live, --capture."
        ),
    )
    options = CommandOptions(parser, REPORT_PREFIX)
    options.option(
        "--records",
        metavar="FILE",
        help="the collector's recorded outputs (JSON lines, otel-ofu collector --record-outputs)",
    )
    options.option(
        "--capture",
        metavar="FILE",
        help="a producer capture (otel-ofu run --record); alone it gives OFU only, no MFU",
    )
    options.option(
        "--live",
        metavar="URL",
        type=url_or_host_port,
        help=f"a running collector's report feed, e.g. http://collector:{ports.COLLECTOR_REPORT_FEED} "
        "(otel-ofu collector --report-feed-port)",
    )
    options.option("--out", metavar="PATH", default=DEFAULT_OUT, type=output_path, help="where to write the HTML page")
    options.option("--title", help="the page title (default: otel-ofu fleet report)")
    options.option(
        "--window",
        type=WINDOW_RANGE.parse,
        default=DEFAULT_WINDOW_S,
        metavar="SECONDS",
        help="window length when replaying a --capture",
    )
    options.option(
        "--timeout",
        type=positive_float,
        default=10.0,
        metavar="SECONDS",
        help="how long to wait for --live",
    )
    parser.set_defaults(handler=run)


def _fail(message: str) -> int:
    print(f"otel-ofu report: {message}", file=sys.stderr)
    return 1


def _note_bad(what: str, records: Records) -> None:
    if records.bad_lines:
        logger.warning("%s: skipped %d unusable line(s), the first: %s", what, records.bad_lines, records.first_error)


def run(args: argparse.Namespace) -> int:
    if not (args.records or args.capture or args.live):
        return _fail("nothing to report on: give --records FILE, --live URL or --capture FILE")
    reports: list[WindowReport] = []
    samples: Mapping[str, tuple[float, ...]] | None = None
    for kind, target in (("records", args.records), ("live", args.live)):
        if not target:
            continue
        try:
            records = load_records(target) if kind == "records" else fetch_records(target, args.timeout)
        except OSError as error:
            return _fail(f"cannot read records {target}: {error.strerror or error}")
        except (FeedError, NotWindowRecords) as error:
            return _fail(str(error))
        _note_bad(target, records)
        if not records.reports and records.bad_lines:
            return _fail(f"{target} holds no window records ({records.first_error})")
        reports.extend(records.reports)
    if args.capture:
        try:
            replay = replay_capture(args.capture, args.window)
        except SourceUnavailable as error:
            return _fail(str(error))
        if replay.skipped:
            logger.warning("%s: skipped %d reading(s) or line(s) without a usable OFU", args.capture, replay.skipped)
        if not replay.readings:
            return _fail(f"{args.capture} holds no GPU reading with a usable OFU")
        samples = replay.ofu_samples
        if not (args.records or args.live):
            reports = list(replay.reports)
    if not reports:
        logger.warning("no closed windows yet: the report says so and shows nothing else")
    # plotly takes ~0.1 s to import: only the command that draws pays for it.
    from otel_ofu_collector.report.html_page import write_report

    titled = {"title": args.title} if args.title else {}
    summary = summarize(reports)
    path = write_report(args.out, reports, ofu_samples=samples, generated_ns=time.time_ns(), summary=summary, **titled)
    jobs = summary.jobs
    flagged = sorted({flag.job.name for flag in fleet_flags(summary)})
    print(
        f"wrote {path} ({len(reports)} windows, {len(jobs)} jobs"
        + (f", flagged: {escaped(', '.join(flagged))}" if flagged else ", none flagged")  # names as a feed said
        + ")"
    )
    return 0
