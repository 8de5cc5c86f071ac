"""The log follower: parsing MFU out of log lines, and tailing a file through rotation, truncation and junk."""

from __future__ import annotations

import argparse
import logging
import logging.handlers
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_ofu import names
from otel_ofu.commands import mfu_from_log
from otel_ofu.mfu import DEFAULT_PATTERN, InvalidMfu, LogFollower, MfuPattern, parse_mfu
from otel_ofu.testing.otlp_sink import OtlpSink

PAPER_LINE = "[rank0] step 120 | loss 3.112 | 1.02 s/step | 128.4k tok/s | MFU 32.5% | dataloader wait"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (PAPER_LINE, 0.325),
        ("step 7 | mfu: 0.325 | loss 2.0", 0.325),
        ("mfu=0.325", 0.325),
        ("MFU: 41%", 0.41),
        ("iteration 10 MFU 32.5 % tflops 300", 0.325),
        ("\x1b[32mmfu: 32.45%\x1b[39m  \x1b[34mtflops: 321.0\x1b[39m", 0.3245),  # torchtitan colours its metrics
        ("train/mfu 0.4", 0.4),
        ("model_flops_utilization=0.52", 0.52),
        ("mfu: 1.2e-1", 0.12),
        ("MFU 0%", 0.0),
        ("MFU 150%", 1.5),  # an over-counting framework: passed on for the collector to flag
        ("step 3 | loss 2.9 | 130k tok/s", None),
        ("mfu_target: 0.5", None),
        ("avg_mfu: 0.5", None),
        ("", None),
    ],
)
def test_default_pattern(line: str, expected: float | None) -> None:
    value = parse_mfu(line)
    if expected is None:
        assert value is None
    else:
        assert value == pytest.approx(expected)


@pytest.mark.parametrize("line", ["MFU nan%", "mfu: inf", "mfu: -0.2", "mfu: 32.5", "MFU 900%"])
def test_unusable_mfu_in_a_line_is_an_error_not_a_value(line: str) -> None:
    # "mfu: 32.5" has no % sign, so it is read as a fraction: 3250% is no miscount but a unit mistake.
    with pytest.raises(InvalidMfu):
        parse_mfu(line)


def test_custom_pattern_with_its_unit() -> None:
    percent = MfuPattern.compile(r"util=(?P<mfu>[\d.]+)", percent=True)
    fraction = MfuPattern.compile(r"util=(?P<mfu>[\d.]+)", percent=False)
    auto = MfuPattern.compile(r"util=(?P<mfu>[\d.]+)")
    assert parse_mfu("gpu util=40 done", percent) == pytest.approx(0.4)
    assert parse_mfu("gpu util=0.4 done", fraction) == pytest.approx(0.4)
    assert parse_mfu("gpu util=40% done", auto) == pytest.approx(0.4)
    assert parse_mfu("gpu util=0.4 done", auto) == pytest.approx(0.4)
    assert parse_mfu("MFU 32.5%", percent) is None  # the custom pattern replaces the default


def test_custom_pattern_capturing_text_that_is_no_number() -> None:
    with pytest.raises(InvalidMfu, match="not a number"):
        parse_mfu("util=abc", MfuPattern.compile(r"util=(?P<mfu>\w+)"))


@pytest.mark.parametrize(("regex", "message"), [(r"mfu (\d+)", "named group 'mfu'"), (r"(?P<mfu>[", "not a valid")])
def test_bad_custom_pattern_is_a_clear_error(regex: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MfuPattern.compile(regex)


# --- following a file -------------------------------------------------------------------------------

Follow = Callable[..., LogFollower]


@pytest.fixture
def follow() -> Iterator[Follow]:
    """Makes followers and closes them after the test, passed or not."""
    made: list[LogFollower] = []

    def make(path: Path, **kwargs: Any) -> LogFollower:
        made.append(LogFollower(path, **kwargs))
        return made[-1]

    yield make
    for follower in made:
        follower.close()


def append(path: Path, data: str | bytes) -> None:
    with open(path, "ab") as handle:
        handle.write(data.encode() if isinstance(data, str) else data)


def test_reads_appends_from_the_end_of_an_existing_file(tmp_path: Path, follow: Follow) -> None:
    log = tmp_path / "train.log"
    log.write_text("mfu: 0.1\nMFU 20% | unfinished li")
    follower = follow(log)
    assert follower.poll() == []  # history is not news
    append(log, "ne\nmfu: 0.3\n")
    assert follower.poll() == [pytest.approx(0.3)]  # the cut line's tail is not a line
    append(log, PAPER_LINE + "\n")
    assert follower.poll() == [pytest.approx(0.325)]
    assert follower.stats.dropped_partials == 1


def test_from_start_reads_what_is_there(tmp_path: Path, follow: Follow) -> None:
    log = tmp_path / "train.log"
    log.write_text("mfu: 0.1\nnoise\nMFU 20%\n")
    follower = follow(log, from_start=True)
    assert follower.poll() == [pytest.approx(0.1), pytest.approx(0.2)]
    assert (follower.stats.lines, follower.stats.values) == (3, 2)


def test_a_file_that_appears_later_is_read_from_its_start(tmp_path: Path, follow: Follow) -> None:
    log = tmp_path / "train.log"
    follower = follow(log)
    assert follower.poll() == []
    log.write_text("mfu: 0.25\n")
    assert follower.poll() == [pytest.approx(0.25)]


def test_partial_lines_wait_for_their_newline(tmp_path: Path, follow: Follow) -> None:
    log = tmp_path / "train.log"
    log.write_text("")
    follower = follow(log)
    for piece in ("step 1 | M", "FU 3", "2.", "5%"):
        append(log, piece)
        assert follower.poll() == []  # "MFU 3" must not be read as 3%
    append(log, " | x\r\nmfu: 0.4")
    assert follower.poll() == [pytest.approx(0.325)]
    append(log, "\n")
    assert follower.poll() == [pytest.approx(0.4)]


def test_rotation_by_rename_and_a_new_file(tmp_path: Path, follow: Follow) -> None:
    log = tmp_path / "train.log"
    log.write_text("")
    follower = follow(log)
    append(log, "mfu: 0.1\n")
    assert follower.poll() == [pytest.approx(0.1)]
    append(log, "mfu: 0.2\nhalf a li")  # written just before the rotation, not yet read
    os.rename(log, tmp_path / "train.log.1")
    assert follower.poll() == [pytest.approx(0.2)]  # the old file is still followed until a new one appears
    log.write_text("mfu: 0.3\n")
    append(tmp_path / "train.log.1", "ne\nmfu: 0.25\nMFU 9")  # a writer that has not reopened yet
    assert follower.poll() == [pytest.approx(0.25), pytest.approx(0.3)]  # old file to its end, then the new
    append(log, "mfu: 0.4\n")
    assert follower.poll() == [pytest.approx(0.4)]
    assert (follower.stats.reopens, follower.stats.dropped_partials) == (1, 1)  # "MFU 9" is no line


def test_rotation_by_copytruncate(tmp_path: Path, follow: Follow) -> None:
    log = tmp_path / "train.log"
    log.write_text("")
    follower = follow(log)
    append(log, "mfu: 0.1\nmfu: 0.15\n")
    assert follower.poll() == [pytest.approx(0.1), pytest.approx(0.15)]
    with open(log, "r+b") as handle:
        handle.truncate(0)
    append(log, "mfu: 0.5\n")
    assert follower.poll() == [pytest.approx(0.5)]
    assert follower.stats.truncations == 1


def test_junk_binary_and_undecodable_lines_are_skipped_and_counted(tmp_path: Path, follow: Follow) -> None:
    log = tmp_path / "train.log"
    log.write_text("")
    follower = follow(log, max_line_bytes=256)
    append(log, b"\x00\x01\x02 MFU 50%\n")  # binary
    append(log, b"\xff\xfe mfu: 0.9 \xc3\n")  # not UTF-8
    append(log, b"MFU nan%\n")  # names an MFU that is not one
    append(log, b"x" * 1000 + b" mfu: 0.7\n")  # over-long
    append(log, b"random noise \xe2\x9c\x93 without any number\n")
    append(log, b"mfu: 0.33\n")
    assert follower.poll() == [pytest.approx(0.33)]
    stats = follower.stats
    assert (stats.skipped, stats.rejected, stats.values) == (3, 1, 1)


def test_a_runaway_line_without_newlines_keeps_memory_bounded(tmp_path: Path, follow: Follow) -> None:
    log = tmp_path / "train.log"
    log.write_text("")
    follower = follow(log, max_line_bytes=1024, chunk_bytes=256)
    for _ in range(20):
        append(log, os.urandom(512).replace(b"\n", b"."))
        follower.poll()
        assert len(follower._buffer) <= 1024 + 256
    append(log, b" MFU 60% tail of the blob\nmfu: 0.31\n")
    assert follower.poll() == [pytest.approx(0.31)]
    assert follower.stats.skipped == 1


def test_a_logging_rotating_handler_with_junk_loses_no_value(tmp_path: Path, follow: Follow) -> None:
    log = tmp_path / "train.log"
    handler = logging.handlers.RotatingFileHandler(log, maxBytes=300, backupCount=2, encoding="utf-8")
    logger = logging.getLogger("test_log_follower.trainer")
    logger.propagate = False
    logger.addHandler(handler)
    follower = follow(log)
    seen: list[float] = []
    try:
        for step in range(60):
            if step % 3 == 0:
                logger.warning("step %d | loss 2.1 | MFU %.1f%% | ok", step, step / 2)
            elif step % 3 == 1:
                logger.warning("\x00\x07 junk \x1b[31m%d", step)
            else:
                logger.warning("MFU nan%% at step %d", step)
            seen += follower.poll()
    finally:
        logger.removeHandler(handler)
        handler.close()
    assert seen == [pytest.approx(step / 200) for step in range(0, 60, 3)]
    assert follower.stats.reopens >= 3
    assert (follower.stats.skipped, follower.stats.rejected) == (20, 20)


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_run_polls_on_the_injected_clock_until_the_duration(tmp_path: Path, follow: Follow) -> None:
    log = tmp_path / "train.log"
    log.write_text("")
    fake = FakeTime()
    lines = iter(["mfu: 0.1\n", "noise\n", "MFU 30%\n"])

    def sleep(seconds: float) -> None:
        append(log, next(lines, ""))  # the training job writes while we wait
        fake.sleep(seconds)

    follower = follow(log, clock=fake.clock, sleep=sleep)
    seen: list[float] = []
    follower.run(seen.append, poll_interval=2.0, duration=5.0)
    assert seen == [pytest.approx(0.1), pytest.approx(0.3)]
    assert fake.sleeps == [2.0, 2.0, 1.0]  # never past the deadline


def test_run_stops_when_asked(tmp_path: Path, follow: Follow) -> None:
    fake = FakeTime()
    follower = follow(tmp_path / "missing.log", clock=fake.clock, sleep=fake.sleep)
    follower.run(lambda value: None, poll_interval=1.0, should_stop=lambda: fake.now >= 3.0)
    assert fake.sleeps == [1.0, 1.0, 1.0]


# --- the command ------------------------------------------------------------------------------------


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="otel-ofu")
    subparsers = parser.add_subparsers(dest="command", required=True)
    mfu_from_log.register(subparsers)
    return parser.parse_args(argv)


def mfu_points(sink: OtlpSink) -> list[tuple[dict[str, Any], float, str]]:
    points: list[tuple[dict[str, Any], float, str]] = []
    for request in sink.requests():
        for resource_metrics in request.resource_metrics:
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    if metric.name == names.JOB_MFU.name:
                        for point in metric.gauge.data_points:
                            attributes = {kv.key: kv.value.string_value for kv in point.attributes}
                            points.append((attributes, point.as_double, metric.unit))
    return points


def test_mfu_from_log_exports_job_mfu_over_otlp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "train.log"
    log.write_text("junk\n" + PAPER_LINE + "\n")
    with OtlpSink.start() as sink:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", sink.grpc_endpoint)
        monkeypatch.delenv("OTEL_EXPORTER_OTLP_PROTOCOL", raising=False)
        monkeypatch.setenv("OTEL_OFU_MFU_JOB_NAME", "from-env")
        args = parse(["mfu-from-log", "--file", str(log), "--job-id", "job-7", "--from-start", "--duration", "0"])
        assert args.handler(args) == 0
        assert sink.wait_for(lambda s: bool(mfu_points(s)), timeout=10.0)
        assert mfu_points(sink) == [
            ({names.JOB_ID: "job-7", names.JOB_NAME: "from-env", names.GPU_PRECISION: "bf16"}, 0.325, "1")
        ]
        resource = {kv.key: kv.value.string_value for kv in sink.requests()[0].resource_metrics[0].resource.attributes}
        assert resource[names.SERVICE_NAME] == names.MFU_SERVICE_NAME


def test_mfu_from_log_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_OFU_MFU_LOG_FILE", "/var/log/train.log")
    monkeypatch.setenv("OTEL_OFU_MFU_JOB_ID", "env-job")
    args = parse(["mfu-from-log", "--pattern", r"u=(?P<mfu>\S+)", "--unit", "percent"])
    assert (args.file, args.job_id) == ("/var/log/train.log", "env-job")
    custom = mfu_from_log.pattern_from_args(args)
    assert (custom.regex.pattern, custom.unit) == (r"u=(?P<mfu>\S+)", "percent")
    assert parse_mfu("u=40", custom) == pytest.approx(0.4)
    assert mfu_from_log.pattern_from_args(parse(["mfu-from-log"])) is DEFAULT_PATTERN
    forced = mfu_from_log.pattern_from_args(parse(["mfu-from-log", "--unit", "fraction"]))
    assert (forced.regex, forced.unit) == (DEFAULT_PATTERN.regex, "fraction")
    assert parse_mfu("MFU 0.325%", forced) == pytest.approx(0.325)  # the % sign no longer decides
    monkeypatch.setenv("OTEL_OFU_MFU_UNIT", "percent")
    assert mfu_from_log.pattern_from_args(parse(["mfu-from-log", "--pattern", "(?P<mfu>x)"])).unit == "percent"
    assert parse(["mfu-from-log", "--unit", "auto"]).unit == "auto"  # the command line overrides the variable
    no_group = parse(["mfu-from-log", "--pattern", "mfu=(\\S+)", "--file", "t.log", "--job-id", "j"])
    assert no_group.handler(no_group) == 2  # a pattern without (?P<mfu>...) is a usage error, said in one line


def test_mfu_from_log_unit_is_one_of_three(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse(["mfu-from-log", "--unit", "percentage"])
    assert exited.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
    monkeypatch.setenv("OTEL_OFU_MFU_UNIT", "ratio")
    with pytest.raises(SystemExit):
        parse(["mfu-from-log", "--file", "t.log", "--job-id", "j"])
    assert "OTEL_OFU_MFU_UNIT" in capsys.readouterr().err


def test_mfu_from_log_needs_a_file_and_a_job_from_the_command_line_or_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for variable in ("OTEL_OFU_MFU_LOG_FILE", "OTEL_OFU_MFU_JOB_ID", "OTEL_OFU_MFU_FROM_START"):
        monkeypatch.delenv(variable, raising=False)
    with pytest.raises(SystemExit) as exited:
        parse(["mfu-from-log", "--file", "train.log"])
    assert exited.value.code == 2
    assert "--job-id" in capsys.readouterr().err
    monkeypatch.setenv("OTEL_OFU_MFU_JOB_ID", "env-job")
    assert parse(["mfu-from-log", "--file", "train.log"]).job_id == "env-job"
    monkeypatch.setenv("OTEL_OFU_MFU_FROM_START", "true")
    assert parse(["mfu-from-log", "--file", "t.log", "--no-from-start"]).from_start is False


def test_mfu_from_log_says_why_it_cannot_read(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    args = parse(["mfu-from-log", "--file", str(tmp_path), "--job-id", "j", "--duration", "0", "--interval", "60"])
    with caplog.at_level(logging.ERROR):
        assert args.handler(args) == 1
    assert "cannot read" in caplog.text
