"""The collector's closed windows as JSON lines: a file recorder, a reader, and a small HTTP feed.

Format (version 1), one closed window per line, UTF-8, keys as below; optional numbers are ``null`` when
the collector had no value (never 0 or NaN). Readers skip and count lines they cannot use, and lines of a
newer version; a later version may add keys, which version-1 readers ignore.

    {"otel_ofu_report": 1, "start_ns": 1700000000000000000, "end_ns": 1700000060000000000,
     "groups": [{"attributes": {"hw.model": "NVIDIA H100 80GB HBM3", "gpu.precision": "bf16"}, "gpus": 8,
                 "quantiles": {"0.05": 0.31, "0.25": 0.38, "0.5": 0.41, "0.75": 0.44, "0.95": 0.47, "0.99": 0.48},
                 "histogram": {"scale": 6, "zero_count": 0, "offset": -80, "counts": [1, 0, 2],
                               "sum": 3.3, "min": 0.31, "max": 0.48},
                 "ofu_sum": 3.3, "ofu_min": 0.31, "ofu_max": 0.48}],
     "jobs": [{"job_id": "1234", "attributes": {"job.name": "llama-70b"}, "ofu": 0.41, "mfu": 0.39,
               "gap": -0.02, "correlation": 0.93, "flops_miscount": 0, "regression": 0, "status": "ok",
               "gpus": 8}],
     "fleet": {"correlation": 0.87, "mae": 0.05, "jobs": 4, "abs_diff_sum": 0.2,
               "comoments": {"n": 4, "mean_x": 0.4, "mean_y": 0.5, "m2_x": 0.1, "m2_y": 0.2, "c_xy": 0.1}}}

``ReportRecorder`` appends to a file and ``ReportFeed`` serves the last windows at ``GET /reports.jsonl``
(``?since=END_NS`` for only the windows that ended after it); both are collector report listeners.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final, TextIO

import attrs

from otel_ofu_collector.aggregation.comoments import CoMoments
from otel_ofu_collector.aggregation.exphist import ExpHistogram
from otel_ofu_collector.aggregation.windows import FleetReport, GroupReport, JobReport, WindowReport

logger = logging.getLogger(__name__)

FORMAT_KEY: Final = "otel_ofu_report"
FORMAT_VERSION: Final = 1
FEED_PATH: Final = "/reports.jsonl"
FEED_CONTENT_TYPE: Final = "application/jsonl; charset=utf-8"
DEFAULT_FEED_KEEP: Final = 1440  # a day of one-minute windows


class RecordFormatError(ValueError):
    """A line that is not a window record of a version this code reads."""


# --- encoding -----------------------------------------------------------------------------------------


def finite_or_none(value: float | None) -> float | None:
    """The value when it is a finite number; NaN and infinities are missing values, never numbers to show."""
    return value if value is not None and math.isfinite(value) else None


def _histogram_to_json(histogram: ExpHistogram) -> dict[str, Any]:
    return {
        "scale": histogram.scale,
        "zero_count": histogram.zero_count,
        "offset": histogram.offset,
        "counts": list(histogram.counts),
        "sum": histogram.sum,
        "min": histogram.min,
        "max": histogram.max,
    }


def _group_to_json(group: GroupReport) -> dict[str, Any]:
    return {
        "attributes": dict(group.attributes),
        "gpus": group.gpus,
        "quantiles": {repr(float(q)): value for q, value in group.quantiles.items()},
        "histogram": _histogram_to_json(group.histogram),
        "ofu_sum": group.ofu_sum,
        "ofu_min": group.ofu_min,
        "ofu_max": group.ofu_max,
    }


def _job_to_json(job: JobReport) -> dict[str, Any]:
    return {
        "job_id": job.job_id,
        "attributes": dict(job.attributes),
        "ofu": finite_or_none(job.ofu),
        "mfu": finite_or_none(job.mfu),
        "gap": finite_or_none(job.gap),
        "correlation": finite_or_none(job.correlation),
        "flops_miscount": job.flops_miscount,
        "regression": job.regression,
        "status": job.status,
        "gpus": job.gpus,
    }


def _fleet_to_json(fleet: FleetReport) -> dict[str, Any]:
    moments = fleet.comoments
    return {
        "correlation": finite_or_none(fleet.correlation),
        "mae": finite_or_none(fleet.mae),
        "jobs": fleet.jobs,
        "abs_diff_sum": fleet.abs_diff_sum,
        "comoments": {
            "n": moments.n,
            "mean_x": moments.mean_x,
            "mean_y": moments.mean_y,
            "m2_x": moments.m2_x,
            "m2_y": moments.m2_y,
            "c_xy": moments.c_xy,
        },
    }


def report_to_json(report: WindowReport) -> dict[str, Any]:
    return {
        FORMAT_KEY: FORMAT_VERSION,
        "start_ns": report.start_ns,
        "end_ns": report.end_ns,
        "groups": [_group_to_json(group) for group in report.groups],
        "jobs": [_job_to_json(job) for job in report.jobs],
        "fleet": _fleet_to_json(report.fleet),
    }


def report_to_line(report: WindowReport) -> str:
    """One JSON line (no newline); ValueError if a required number is not finite."""
    return json.dumps(report_to_json(report), separators=(",", ":"), allow_nan=False, ensure_ascii=False)


# --- decoding -----------------------------------------------------------------------------------------


def _get(data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], what: str) -> Any:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, kind):
        raise RecordFormatError(f"{what}.{key} is missing or not {getattr(kind, '__name__', 'a number')}")
    return value


def _number(data: Mapping[str, Any], key: str, what: str) -> float:
    value = float(_get(data, key, (int, float), what))
    if not math.isfinite(value):
        raise RecordFormatError(f"{what}.{key} is not finite")
    return value


def _optional_number(data: Mapping[str, Any], key: str, what: str) -> float | None:
    return None if data.get(key) is None else _number(data, key, what)


def _object(value: object, what: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise RecordFormatError(f"{what} is missing or not an object")
    return value


def _list(value: object, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise RecordFormatError(f"{what} is missing or not a list")
    return value


def _attributes(value: object, what: str) -> dict[str, str]:
    data = _object(value, what)
    if not all(isinstance(item, str) for item in data.values()):
        raise RecordFormatError(f"{what} must map names to strings")
    return dict(data)


def _histogram_from_json(value: object) -> ExpHistogram:
    data = _object(value, "histogram")
    counts = _list(data.get("counts"), "histogram.counts")
    if not all(isinstance(count, int) and not isinstance(count, bool) for count in counts):
        raise RecordFormatError("histogram.counts must be integers")
    return ExpHistogram(
        scale=_get(data, "scale", int, "histogram"),
        zero_count=_get(data, "zero_count", int, "histogram"),
        offset=_get(data, "offset", int, "histogram"),
        counts=tuple(counts),
        sum=_number(data, "sum", "histogram"),
        min=_optional_number(data, "min", "histogram"),
        max=_optional_number(data, "max", "histogram"),
    )


def _group_from_json(value: object) -> GroupReport:
    data = _object(value, "group")
    quantiles: dict[float, float] = {}
    for key, quantile_value in _object(data.get("quantiles"), "group.quantiles").items():
        try:
            quantile = float(key)
        except ValueError:
            raise RecordFormatError(f"group.quantiles key {key!r} is not a number") from None
        quantiles[quantile] = _number({"value": quantile_value}, "value", f"group.quantiles[{key}]")
    return GroupReport(
        attributes=_attributes(data.get("attributes"), "group.attributes"),
        gpus=_get(data, "gpus", int, "group"),
        quantiles=quantiles,
        histogram=_histogram_from_json(data.get("histogram")),
        ofu_sum=_number(data, "ofu_sum", "group"),
        ofu_min=_number(data, "ofu_min", "group"),
        ofu_max=_number(data, "ofu_max", "group"),
    )


def _job_from_json(value: object) -> JobReport:
    data = _object(value, "job")
    return JobReport(
        job_id=_get(data, "job_id", str, "job"),
        attributes=_attributes(data.get("attributes", {}), "job.attributes"),
        ofu=_optional_number(data, "ofu", "job"),
        mfu=_optional_number(data, "mfu", "job"),
        gap=_optional_number(data, "gap", "job"),
        correlation=_optional_number(data, "correlation", "job"),
        flops_miscount=_get(data, "flops_miscount", int, "job"),
        regression=_get(data, "regression", int, "job"),
        status=_get(data, "status", str, "job"),
        gpus=_get(data, "gpus", int, "job"),
    )


def _fleet_from_json(value: object) -> FleetReport:
    data = _object(value, "fleet")
    moments = _object(data.get("comoments"), "fleet.comoments")
    return FleetReport(
        correlation=_optional_number(data, "correlation", "fleet"),
        mae=_optional_number(data, "mae", "fleet"),
        jobs=_get(data, "jobs", int, "fleet"),
        comoments=CoMoments(
            n=_get(moments, "n", int, "fleet.comoments"),
            mean_x=_number(moments, "mean_x", "fleet.comoments"),
            mean_y=_number(moments, "mean_y", "fleet.comoments"),
            m2_x=_number(moments, "m2_x", "fleet.comoments"),
            m2_y=_number(moments, "m2_y", "fleet.comoments"),
            c_xy=_number(moments, "c_xy", "fleet.comoments"),
        ),
        abs_diff_sum=_number(data, "abs_diff_sum", "fleet"),
    )


def report_from_json(data: object) -> WindowReport:
    """One parsed line -> a window report; RecordFormatError when it is not one this version reads."""
    record = _object(data, "record")
    version = record.get(FORMAT_KEY)
    if isinstance(version, bool) or not isinstance(version, int):
        raise RecordFormatError(f"not an otel-ofu window record (no {FORMAT_KEY!r} version)")
    if version > FORMAT_VERSION:
        raise RecordFormatError(f"record format {version} is newer than this otel-ofu reads ({FORMAT_VERSION})")
    try:
        return WindowReport(
            start_ns=_get(record, "start_ns", int, "record"),
            end_ns=_get(record, "end_ns", int, "record"),
            groups=tuple(_group_from_json(group) for group in _list(record.get("groups"), "groups")),
            jobs=tuple(_job_from_json(job) for job in _list(record.get("jobs"), "jobs")),
            fleet=_fleet_from_json(record.get("fleet")),
        )
    except (TypeError, ValueError) as error:  # attrs validators (a negative count, say)
        if isinstance(error, RecordFormatError):
            raise
        raise RecordFormatError(str(error)) from None


def report_from_line(line: str) -> WindowReport:
    try:
        data = json.loads(line)
    except ValueError:
        raise RecordFormatError("not JSON") from None
    return report_from_json(data)


@attrs.frozen
class Records:
    """What a file or feed held: its windows in time order and the lines that were skipped."""

    reports: tuple[WindowReport, ...]
    bad_lines: int = 0
    first_error: str | None = None


def parse_lines(lines: Iterable[str], source: str = "records") -> Records:
    """Every usable window of ``lines`` in time order; blank lines are ignored, bad ones counted."""
    reports: list[WindowReport] = []
    bad = 0
    first_error: str | None = None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            reports.append(report_from_line(line))
        except RecordFormatError as error:
            bad += 1
            if first_error is None:
                first_error = f"{source}:{number}: {error}"
    reports.sort(key=lambda report: (report.end_ns, report.start_ns))
    return Records(tuple(reports), bad, first_error)


def load_records(path: str | Path) -> Records:
    """Read a recorded-outputs file; OSError when it cannot be opened."""
    with Path(path).open(encoding="utf-8", errors="replace") as file:
        return parse_lines(file, str(path))


def _warn_bad(records: Records) -> None:
    if records.bad_lines:
        logger.warning("skipped %d unusable line(s), the first: %s", records.bad_lines, records.first_error)


def read_records(path: str | Path) -> list[WindowReport]:
    """The windows of a recorded-outputs file in time order; unusable lines are skipped and logged."""
    records = load_records(path)
    _warn_bad(records)
    return list(records.reports)


# --- listeners ----------------------------------------------------------------------------------------


def _lines_of(reports: Sequence[WindowReport]) -> list[tuple[WindowReport, str]]:
    encoded = []
    for report in reports:
        try:
            encoded.append((report, report_to_line(report)))
        except ValueError as error:  # a non-finite required number: lose this window, not the batch
            logger.warning("window ending %d not recorded: %s", report.end_ns, error)
    return encoded


@attrs.define
class ReportRecorder:
    """A collector report listener appending each closed window to a JSON-lines file, flushed per batch."""

    path: Path = attrs.field(converter=Path)
    written: int = attrs.field(init=False, default=0)
    _file: TextIO = attrs.field(init=False)
    _lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)

    def __attrs_post_init__(self) -> None:
        self._file = self.path.open("a", encoding="utf-8")

    def __call__(self, reports: list[WindowReport]) -> None:
        encoded = _lines_of(reports)
        if not encoded:
            return
        with self._lock:
            self._file.write("".join(line + "\n" for _, line in encoded))
            self._file.flush()
            self.written += len(encoded)

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def __enter__(self) -> ReportRecorder:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


@attrs.define
class ReportFeed:
    """Serves the last ``keep`` closed windows as JSON lines at ``GET /reports.jsonl``; a report listener.

    ``?since=END_NS`` returns only the windows that ended after END_NS, so a poller fetches each once.
    """

    host: str = "127.0.0.1"
    port: int = 0
    keep: int = attrs.field(default=DEFAULT_FEED_KEEP)
    _lines: deque[tuple[int, str]] = attrs.field(init=False)
    _lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)
    _server: ThreadingHTTPServer | None = attrs.field(init=False, default=None)
    _thread: threading.Thread | None = attrs.field(init=False, default=None)

    @keep.validator
    def _check_keep(self, _attribute: object, value: int) -> None:
        if value < 1:
            raise ValueError(f"keep must be at least 1, got {value!r}")

    def __attrs_post_init__(self) -> None:
        self._lines = deque(maxlen=self.keep)

    def __call__(self, reports: list[WindowReport]) -> None:
        encoded = _lines_of(reports)
        with self._lock:
            self._lines.extend((report.end_ns, line) for report, line in encoded)

    def body(self, since_ns: int | None = None) -> bytes:
        with self._lock:
            lines = [line for end, line in self._lines if since_ns is None or end > since_ns]
        return "".join(line + "\n" for line in lines).encode("utf-8")

    def start(self) -> int:
        """Listen; returns the bound port."""
        feed = self

        class Handler(_FeedHandler):
            pass

        Handler.feed = feed
        host = self.host.strip("[]") or "0.0.0.0"
        try:
            server = ThreadingHTTPServer((host, self.port), Handler)
        except OSError as error:
            address = f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"
            raise OSError(f"cannot serve the report feed on {address} ({error.strerror or error})") from error
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="otel-ofu-report-feed", daemon=True)
        self._thread.start()
        return self.bound_port

    @property
    def bound_port(self) -> int:
        if self._server is None:
            raise RuntimeError("the report feed is not started")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = self.host if self.host not in ("", "0.0.0.0", "::") else "127.0.0.1"
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"http://{host}:{self.bound_port}{FEED_PATH}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


class _FeedHandler(BaseHTTPRequestHandler):
    feed: ReportFeed
    server_version = "otel-ofu-report-feed"

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        if url.path != FEED_PATH:
            self._reply(404, b"not found: the feed is at " + FEED_PATH.encode() + b"\n", "text/plain")
            return
        since: int | None = None
        values = urllib.parse.parse_qs(url.query).get("since")
        if values:
            try:
                since = int(values[-1])
            except ValueError:
                self._reply(400, b"since must be an integer (nanoseconds since the epoch)\n", "text/plain")
                return
        self._reply(200, self.feed.body(since), FEED_CONTENT_TYPE)

    def _reply(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("report feed: " + format, *args)


# --- live mode ----------------------------------------------------------------------------------------


class FeedError(RuntimeError):
    """A report feed that could not be read; the message says why in one line."""


def feed_url(url: str) -> str:
    """``http://host:port`` (or any path but the feed's) -> the feed's URL."""
    parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise FeedError(f"report feed URL {url!r} is not an http(s) URL")
    path = parts.path if parts.path.endswith(".jsonl") else parts.path.rstrip("/") + FEED_PATH
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def fetch_records(url: str, timeout: float = 10.0) -> Records:
    """Every window a running collector's feed holds; FeedError when it cannot be read."""
    target = feed_url(url)
    try:
        with urllib.request.urlopen(target, timeout=timeout) as response:
            text = response.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as error:
        raise FeedError(f"report feed {target} answered HTTP {error.code}") from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise FeedError(f"cannot read report feed {target}: {reason}") from None
    return parse_lines(text.splitlines(), target)


def fetch_feed(url: str, timeout: float = 10.0) -> list[WindowReport]:
    """The windows of a running collector's report feed in time order (unusable lines skipped, logged)."""
    records = fetch_records(url, timeout)
    _warn_bad(records)
    return list(records.reports)
