"""``otel-ofu collector``'s options: the detectors declare their own, the help reads in groups at 100 columns,
and every number has a range whose violation is argparse's one-line usage error (exit 2) naming the option."""

from __future__ import annotations

import argparse
import os

import pytest

from otel_ofu import cli
from otel_ofu_collector import command
from otel_ofu_collector.config import AggregatorConfig, parse_prices
from otel_ofu_collector.detectors import FLAG_OPTIONS
from otel_ofu_collector.detectors import regression as regression_module
from otel_ofu_collector.detectors import straggler as straggler_module
from otel_ofu_collector.service import CollectorOptions


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("OTEL_"):
            monkeypatch.delenv(key)


def built(*argv: str) -> CollectorOptions:
    """The service options a command line builds (the parser is built now: its defaults read the variables)."""
    return command.options_from_args(cli.build_parser().parse_args(["collector", *argv]))


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Runs ``otel-ofu collector ARGV``, which must be a usage error: exit 2, one line on stderr (returned)."""
    with pytest.raises(SystemExit) as exited:
        cli.main(["collector", *argv])
    assert exited.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    (line,) = err.strip().splitlines()
    return line


# --- the detectors own their options -----------------------------------------------------------------------


def test_every_detector_setting_is_declared_once_with_the_defaults_the_docs_name() -> None:
    defaults = {option.flag: option.default for option in FLAG_OPTIONS}
    assert defaults == {
        "--miscount-ratio": 1.5,
        "--miscount-windows": 3,
        "--regression-factor": 2.0,
        "--baseline-windows": 10,
        "--regression-min-baseline": 0.05,
        "--idle-windows": 3,
        "--straggler-factor": 1.25,
        "--straggler-windows": 3,
        "--hang-windows": 3,
        "--hang-engine-active": 0.5,
        "--hang-sm-active": 0.25,
        "--hang-activity": 0.01,
        "--hang-link-throughput": 1e9,
    }
    # The settings object and the command line take the same defaults from the declarations.
    assert AggregatorConfig().flag_settings == {option.key: option.default for option in FLAG_OPTIONS}
    assert built().aggregator.flag_settings == AggregatorConfig().flag_settings


def test_the_command_line_sets_each_detector_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_OFU_COLLECTOR_IDLE_WINDOWS", "7")
    config = built("--straggler-factor", "1.5", "--baseline-windows", "4").aggregator
    assert config.flag(straggler_module.FACTOR) == 1.5
    assert config.flag(regression_module.BASELINE_WINDOWS) == 4
    assert config.flag_settings["idle_windows"] == 7  # from its variable
    assert config.flag_settings["miscount_ratio"] == 1.5  # the default
    # A baseline of 4 windows judges after half of them: (4 + 1) // 2 = 2.
    flag = regression_module.DETECTOR.start(config)
    assert flag.min_windows == 2
    assert flag.baseline.maxlen == 4


def test_the_state_byte_bound_reaches_the_windows() -> None:
    assert built().aggregator.max_state_bytes == 1024**3  # 1 GiB by default
    assert built("--max-state-bytes", str(64 << 20)).aggregator.max_state_bytes == 64 * 1024 * 1024


def test_the_settings_object_checks_flag_settings_against_their_declarations() -> None:
    with pytest.raises(ValueError, match="miscount_windows must be a whole number from 1 to 10,000, got 0"):
        AggregatorConfig(flag_settings={"miscount_windows": 0})
    with pytest.raises(ValueError, match="miscount_windows"):
        AggregatorConfig(flag_settings={"miscount_windows": 2.5})  # a count of windows is whole
    with pytest.raises(ValueError, match="miscount_ratio"):
        AggregatorConfig(flag_settings={"miscount_ratio": 0.9})  # under 1: honest jobs would be flagged
    with pytest.raises(ValueError, match="unknown flag setting"):
        AggregatorConfig(flag_settings={"miscount_ration": 2.0})  # a typo must not leave the default unnoticed
    assert AggregatorConfig(flag_settings={"straggler_windows": 1}).flag(straggler_module.WINDOWS) == 1


# --- --help: groups, units, examples, 100 columns -------------------------------------------------------


def test_the_help_is_in_groups_with_units_and_examples_within_100_columns(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as exited:
        cli.main(["collector", "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100
    for group in (
        "receiving (OTLP in):",
        "TLS and auth:",
        "windows:",
        "flags (each detector's own settings):",
        "loss & cost:",
        "outputs:",
        "Prometheus endpoint (the outputs and the collector's self-telemetry):",
        "state & durability:",
    ):
        assert group in lines, group
    # Each detector option sits in the flags group, between its title and the next group's.
    flags = text[text.index("flags (each detector's own settings):") : text.index("loss & cost:")]
    assert all(f"{option.flag} {option.metavar}" in flags for option in FLAG_OPTIONS)
    for unit in ("--window SECONDS", "--lateness SECONDS", "--horizon SECONDS", "--stale-after SECONDS",
                 "--shutdown-grace SECONDS", "--spool-max-bytes BYTES", "--grid-intensity KG_PER_KWH"):  # fmt: skip
        assert unit in text, unit
    examples = lines[lines.index("examples:") + 1 :]
    assert sum(line.startswith("  otel-ofu collector ") for line in examples) >= 3
    # The ranges are in the help: the window's, a detector's.
    assert "window length [1 to 86,400 s]" in " ".join(text.split())
    assert "[1 to 10,000] (env OTEL_OFU_COLLECTOR_MISCOUNT_WINDOWS; default 3)" in " ".join(text.split())


# --- every number has a range ----------------------------------------------------------------------------

# (option, a value at the edge that is taken, values beyond it that are refused), worked from the ranges:
# a window from 1 s to a day (86,400 s), lateness up to a day, a horizon up to 30 days (2,592,000 s), streams
# silent for up to a week (604,800 s), a spool of 1 MiB (1,048,576 bytes) or more, export requests from
# 64 KiB (65,536) to 64 MiB (67,108,864), a PUE from 1 to 3, a grid intensity up to 2 kg/kWh.
BOUNDS = [
    ("--window", "86400", ["86401", "0.5", "1e30", "inf", "nan"]),
    ("--window", "1", ["0.999"]),
    ("--lateness", "86400", ["86400.5", "-1"]),
    ("--lateness", "0", ["-0.001"]),
    ("--horizon", "2592000", ["2592001", "0.5"]),
    ("--stale-after", "604800", ["604801", "0", "inf"]),
    ("--max-streams", "10000000", ["10000001", "0"]),
    ("--max-jobs", "1000000", ["1000001", "0"]),
    # The state's bytes: 1 MiB (1,048,576) to 1 TiB (1,099,511,627,776).
    ("--max-state-bytes", "1048576", ["1048575", "1099511627777"]),
    ("--spool-max-bytes", "1048576", ["1048575"]),
    ("--report-feed-max-bytes", "1048576", ["1048575"]),
    ("--max-in-flight", "1024", ["1025", "0"]),
    ("--export-max-request-bytes", "65536", ["65535", "67108865"]),
    ("--max-attribute-length", "65536", ["65537", "0"]),
    ("--http-body-deadline", "0.1", ["0.05", "3601"]),
    ("--http-body-min-rate", "0", ["-1", "1e10"]),
    ("--shutdown-grace", "3600", ["3601", "-1"]),
    ("--prometheus-expiration-windows", "10000", ["10001", "0"]),
    ("--pue", "1", ["0.99", "3.01"]),
    ("--grid-intensity", "2", ["2.1", "-0.1"]),
    # The detectors' own: a ratio or factor from 1 to 100, runs of 1 to 10,000 windows, a baseline of 1 to 100
    # windows, a minimum baseline OFU from 0 to 1.
    ("--miscount-ratio", "100", ["100.5", "0.99"]),
    ("--miscount-windows", "10000", ["10001", "0", "2.5"]),
    ("--regression-factor", "1", ["0.5", "101"]),
    ("--baseline-windows", "100", ["101", "0"]),
    ("--regression-min-baseline", "1", ["1.01", "-0.01"]),
    ("--idle-windows", "1", ["0", "10001"]),
    ("--straggler-factor", "100", ["100.01", "0.8"]),
    ("--straggler-windows", "10000", ["10001", "0"]),
    # The hang's: a run of windows, three fractions, a link throughput up to 10 TB/s.
    ("--hang-windows", "1", ["0", "10001"]),
    ("--hang-engine-active", "1", ["1.01", "-0.01"]),
    ("--hang-sm-active", "0", ["-0.01", "1.5"]),
    ("--hang-activity", "0.5", ["2", "-1"]),
    ("--hang-link-throughput", "0", ["-1", "1e14"]),
]


@pytest.mark.parametrize(("option", "taken", "refused"), BOUNDS)
def test_a_number_outside_its_range_is_a_one_line_usage_error_naming_the_option(
    option: str, taken: str, refused: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    built(option, taken)  # at the edge: the whole configuration builds
    for value in refused:
        line = usage_error([option, value], capsys)
        assert line.startswith(f"otel-ofu collector: error: argument {option}: "), line
        # The range, or for a count given as a fraction: not a whole number.
        assert " from " in line or "not a whole number" in line, line
        assert f"'{value}'" in line
        assert line.endswith("(see otel-ofu collector --help)")


def test_every_numeric_option_has_a_range_test() -> None:
    parser = next(
        action.choices["collector"]
        for action in cli.build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    numeric = {
        action.option_strings[0]
        for action in parser._actions
        if action.option_strings and getattr(action.type, "__name__", "") == "parse"  # a Bound's parse
    }
    assert numeric == {option for option, _, _ in BOUNDS}


def test_a_variable_outside_its_range_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OTEL_OFU_COLLECTOR_WINDOW", "1e30")
    line = usage_error([], capsys)
    assert "argument --window: must be a number from 1 to 86,400 s, got '1e30' (from OTEL_OFU_COLLECTOR_WINDOW)" in line


def test_the_settings_object_holds_times_to_the_same_maxima() -> None:
    # Shorter windows stay possible for a library caller (a local screen), but never past a day: 1e30 s of
    # window would overflow every export's nanosecond timestamps.
    assert AggregatorConfig(window_s=0.5, lateness_s=0).window_ns == 500_000_000
    with pytest.raises(ValueError, match="window_s"):
        AggregatorConfig(window_s=1e30)
    with pytest.raises(ValueError, match="lateness_s"):
        AggregatorConfig(lateness_s=86401)
    with pytest.raises(ValueError, match="horizon_s"):
        AggregatorConfig(horizon_s=31 * 86400)
    with pytest.raises(ValueError, match="pue"):
        AggregatorConfig(pue=0.5)
    with pytest.raises(ValueError, match="grid_intensity"):
        AggregatorConfig(grid_intensity=400.0)  # g/kWh given as kg/kWh


def test_the_clamped_staleness_of_the_largest_window_still_builds() -> None:
    # A day's window with a day's lateness: stale-after is raised to 86,400 + 86,400 = 172,800 s.
    config = built("--window", "86400", "--lateness", "86400", "--stale-after", "600").aggregator
    assert config.stale_after_s == 172_800.0
    assert config.horizon_s == 86_400.0


# --- prices: each model once, no empty entries -----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("A100=1.0,A100=2.0", "the price of 'A100' is given twice"),
        (" H100 =2.5,default=2,H100=3", "the price of 'H100' is given twice"),  # the same model once stripped
        ("A100=1.0,,H100=2.0", "an empty price entry"),
        ("A100=1.0,", "an empty price entry"),
        ("=2.0", "price entry '=2.0' is not MODEL=PRICE"),
        ("A100=", "price entry 'A100=' is not MODEL=PRICE"),
        ("A100", "price entry 'A100' is not MODEL=PRICE"),
        ("A100=2000000", "from 0 to 1,000,000"),
        ("A100=-1", "is not MODEL=PRICE"),
    ],
)
def test_a_price_table_with_a_duplicate_or_an_empty_entry_is_refused(
    text: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    line = usage_error(["--price-per-gpu-hour", text], capsys)
    assert line.startswith("otel-ofu collector: error: argument --price-per-gpu-hour: "), line
    assert says in line


def test_a_good_price_table_is_taken_as_given() -> None:
    assert parse_prices("NVIDIA H100 80GB HBM3=2.5, default=2") == {"NVIDIA H100 80GB HBM3": 2.5, "default": 2.0}
    assert built("--price-per-gpu-hour", "A=1,B=0").aggregator.price_per_gpu_hour == {"A": 1.0, "B": 0.0}


def test_the_reference_lists_every_option_with_its_range() -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "reference.md").read_text()
    table = text[text.index("## Collector options") :]
    assert "| `--window SECONDS` | 1 to 86,400 s | `60.0` | `OTEL_OFU_COLLECTOR_WINDOW` | window length |" in table
    for option, _, _ in BOUNDS:
        assert f"| `{option} " in table, option


@pytest.mark.parametrize("name", ["demo", "top", "report"])
def test_the_other_commands_windows_have_the_collectors_range(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    # A window past a day used to reach the settings object and end in a traceback; now a usage error.
    with pytest.raises(SystemExit) as exited:
        cli.main([name, "--window", "1e30"])
    assert exited.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        f"otel-ofu {name}: error: argument --window: must be a number from 1 to 86,400 s, got '1e30' "
        f"(see otel-ofu {name} --help)"
    )
