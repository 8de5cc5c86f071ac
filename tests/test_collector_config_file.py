"""``otel-ofu collector --config FILE``: a YAML file of the collector's options, under the flags and the variables.

Every option is declared once (``otel_ofu_collector.options``); its key in the file is its name under its section
(``windows: {window: 30}`` is ``--window 30`` and ``OTEL_OFU_COLLECTOR_WINDOW=30``). A flag wins over its variable,
the variable over the file, the file over the default. The cases below are worked by hand from the defaults the
reference lists (a 60 s window, 15 s of lateness, 600 s before a silent stream is evicted).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

from otel_ofu import cli
from otel_ofu_collector import command
from otel_ofu_collector.service import CollectorOptions

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("OTEL_"):
            monkeypatch.delenv(key)


def config_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "collector.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


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


WINDOWS = """\
windows:
  window: 30
  lateness: 10
"""


# --- precedence: flag > variable > file > default ----------------------------------------------------------


def test_a_file_sets_the_window_and_its_lateness(tmp_path: Path) -> None:
    config = built("--config", config_file(tmp_path, WINDOWS)).aggregator
    assert (config.window_s, config.lateness_s) == (30.0, 10.0)
    # The rest keep their defaults: stale-after 600 s covers 30 + 10 s already; a day's horizon.
    assert (config.stale_after_s, config.horizon_s, config.max_streams) == (600.0, 86_400.0, 200_000)


def test_a_flag_wins_over_the_file_wherever_it_stands(tmp_path: Path) -> None:
    path = config_file(tmp_path, WINDOWS)
    after = built("--config", path, "--window", "20").aggregator
    before = built("--window", "20", "--config", path).aggregator
    for config in (after, before):
        assert (config.window_s, config.lateness_s) == (20.0, 10.0)  # the lateness still from the file


def test_a_variable_stands_between_the_file_and_the_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = config_file(tmp_path, WINDOWS)
    monkeypatch.setenv("OTEL_OFU_COLLECTOR_WINDOW", "45")
    config = built("--config", path).aggregator
    assert (config.window_s, config.lateness_s) == (45.0, 10.0)  # the variable over the file
    assert built("--config", path, "--window", "20").aggregator.window_s == 20.0  # the flag over the variable
    assert built().aggregator.window_s == 45.0  # no file: the variable over the default


def test_the_file_may_be_named_by_its_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_OFU_COLLECTOR_CONFIG", config_file(tmp_path, WINDOWS))
    assert built().aggregator.window_s == 30.0


def test_without_a_file_the_defaults_hold() -> None:
    config = built().aggregator
    assert (config.window_s, config.lateness_s, config.stale_after_s) == (60.0, 15.0, 600.0)


# --- the values a file can hold --------------------------------------------------------------------------


def test_every_kind_of_value_reads_as_its_flag_would(tmp_path: Path) -> None:
    path = config_file(
        tmp_path,
        """\
receiving:
  listen: off            # YAML reads off as false: a listener is turned off by it, as by --listen off
  http_listen: 127.0.0.1:4318
windows:
  group_by: [hw.model, k8s.namespace.name]
  mode: shard
flags:
  straggler_factor: 1.5
  idle_windows: 5
cost:
  price_per_gpu_hour:
    NVIDIA H100 80GB HBM3: 2.5
    default: 2
  currency: eur
outputs:
  pass_through: no
  forward_inputs: true
state:
  max_streams: 1000
  stale_after: 30        # raised to cover the default 60 s window and 15 s lateness: 75 s
  spool:                 # empty: not given, the default (no spool) holds
""",
    )
    options = built("--config", path)
    assert (options.grpc_listen, options.http_listen, options.mode) == (None, "127.0.0.1:4318", "shard")
    assert (options.pass_through, options.forward_inputs, options.spool_path) == (False, True, None)
    config = options.aggregator
    assert config.group_keys == ("hw.model", "k8s.namespace.name")
    assert config.flag_settings["straggler_factor"] == 1.5
    assert config.flag_settings["idle_windows"] == 5
    assert config.flag_settings["miscount_windows"] == 3  # not in the file: its default
    assert config.price_per_gpu_hour == {"NVIDIA H100 80GB HBM3": 2.5, "default": 2.0}
    assert config.currency == "EUR"
    assert config.max_streams == 1000
    assert config.stale_after_s == 75.0


# --- what the file may not say ---------------------------------------------------------------------------


def test_an_unknown_key_is_refused_naming_the_closest_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = config_file(tmp_path, "state:\n  max_stream: 1000\n")
    line = usage_error(["--config", path], capsys)
    assert line == (
        f"otel-ofu collector: error: {path}: unknown key state.max_stream (did you mean state.max_streams?) "
        "(see otel-ofu collector --help)"
    )


def test_a_key_outside_its_section_is_refused_naming_where_it_belongs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config_file(tmp_path, "max_streams: 1000\n")
    line = usage_error(["--config", path], capsys)
    assert f"{path}: unknown key max_streams (did you mean state.max_streams?)" in line
    path = config_file(tmp_path, "windows:\n  max_streams: 1000\n")
    assert f"{path}: unknown key windows.max_streams (did you mean state.max_streams?)" in usage_error(
        ["--config", path], capsys
    )


def test_a_value_out_of_range_is_the_flags_error_naming_the_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A window is 1 s to a day (86,400 s): 100,000 s is over it, from the file as from the flag.
    path = config_file(tmp_path, "windows:\n  window: 100000\n")
    from_flag = usage_error(["--window", "100000"], capsys)
    from_file = usage_error(["--config", path], capsys)
    assert from_flag == (
        "otel-ofu collector: error: argument --window: must be a number from 1 to 86,400 s, got '100000' "
        "(see otel-ofu collector --help)"
    )
    assert from_file == from_flag.replace(" (see", f" (from {path}: windows.window) (see")


def test_a_bad_choice_or_switch_in_the_file_names_the_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config_file(tmp_path, "windows:\n  mode: shards\n")
    line = usage_error(["--config", path], capsys)
    assert f"invalid choice: 'shards' (from {path}: windows.mode)" in line
    assert line.endswith("did you mean shard? (see otel-ofu collector --help)")
    path = config_file(tmp_path, "outputs:\n  pass_through: maybe\n")
    assert f"got 'maybe' (from {path}: outputs.pass_through)" in usage_error(["--config", path], capsys)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("windows: [1, 2]\n", "windows must be a mapping of its options"),
        ("- window: 30\n", "expected sections of options"),
        ("windows:\n  window: 30\n   lateness: 1\n", "not YAML"),
    ],
)
def test_a_file_that_is_not_sections_of_options_is_one_line(
    text: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config_file(tmp_path, text)
    line = usage_error(["--config", path], capsys)
    assert line.startswith(f"otel-ofu collector: error: {path}: "), line
    assert says in line


def test_a_missing_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(tmp_path / "absent.yaml")
    line = usage_error(["--config", path], capsys)
    assert line.startswith(f"otel-ofu collector: error: cannot read {path}: "), line


# --- --print-config --------------------------------------------------------------------------------------


def printed(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert cli.main(["collector", *argv, "--print-config"]) == 0
    out, _ = capsys.readouterr()
    return out


def test_print_config_shows_the_effective_values_and_reads_back_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OTEL_OFU_COLLECTOR_LATENESS", "5")
    path = config_file(tmp_path, WINDOWS + "state:\n  max_jobs: 7\n")
    text = printed(["--config", path, "--window", "20", "--bearer-token", "s3cret"], capsys)
    shown = yaml.safe_load(text)
    # The flag's window, the variable's lateness, the file's job cap, the default stream cap.
    assert shown["windows"]["window"] == 20.0
    assert shown["windows"]["lateness"] == 5.0
    assert shown["state"]["max_jobs"] == 7
    assert shown["state"]["max_streams"] == 200_000
    assert shown["windows"]["group_by"] == ["hw.model", "gpu.precision"]
    assert shown["receiving"]["listen"] == "0.0.0.0:4317"
    assert "s3cret" not in text  # a secret is never printed
    assert shown["tls"]["bearer_token"] == "[REDACTED]"
    # Printed, then read back (without the redacted token): the same configuration.
    del shown["tls"]["bearer_token"]
    monkeypatch.delenv("OTEL_OFU_COLLECTOR_LATENESS")
    again = config_file(tmp_path, yaml.safe_dump(shown))
    expected = {**shown, "tls": {**shown["tls"], "bearer_token": None}}
    assert yaml.safe_load(printed(["--config", again], capsys)) == expected


def test_print_config_says_off_for_a_listener_turned_off(capsys: pytest.CaptureFixture[str]) -> None:
    shown = yaml.safe_load(printed(["--listen", "off", "--http-listen", "127.0.0.1:0"], capsys))
    assert shown["receiving"]["listen"] == "off"  # not null, which would read back as the default 0.0.0.0:4317
    assert shown["receiving"]["http_listen"] == "127.0.0.1:0"


def test_print_config_writes_a_calibration_table_as_its_flag_takes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shown = yaml.safe_load(printed(["--calibration", "job:train-7=0.5,model:H100-SXM=0.93"], capsys))
    assert shown["dcgm"]["calibration"] == "job:train-7=0.5,model:H100-SXM=0.93"
    again = config_file(tmp_path, yaml.safe_dump(shown))
    assert yaml.safe_load(printed(["--config", again], capsys)) == shown


# --- one declaration: the help, the reference -------------------------------------------------------------


def test_the_help_names_the_file_and_the_order(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit):
        cli.main(["collector", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--config FILE" in text
    assert "--print-config" in text
    assert "a flag wins over its variable, a variable over the file, the file over the default" in text


def test_the_reference_lists_every_declared_option_with_its_key_in_the_file() -> None:
    from otel_ofu_collector.options import OPTIONS

    text = (ROOT / "docs" / "reference.md").read_text(encoding="utf-8")
    table = text[text.index("## Collector options") :]
    rows = [line for line in table.splitlines() if line.startswith("| `--")]
    by_flag = {re.match(r"\| `(--[a-z0-9-]+)", row).group(1): row for row in rows}  # type: ignore[union-attr]
    assert set(by_flag) == {option.flag for option in OPTIONS}
    assert len(rows) == len(OPTIONS) >= 48
    for option in OPTIONS:
        row = by_flag[option.flag]
        assert f"`{option.section.key}.{option.name}`" in row, row
        assert f"`OTEL_OFU_COLLECTOR_{option.name.upper()}`" in row, row


def test_each_settings_field_takes_its_default_and_range_from_its_option() -> None:
    import attrs

    from otel_ofu_collector.config import AggregatorConfig
    from otel_ofu_collector.options import OPTIONS, option_of

    linked = {}
    for settings in (AggregatorConfig, CollectorOptions):
        for field in attrs.fields(settings):
            option = option_of(field)
            if option is not None:
                linked[option.name] = (settings, field)
    # The settings a command line fills, by their options; the others are the command's own (ports of its
    # endpoints, files, the grace) or build one setting together (TLS files, the token, the flags).
    assert set(linked) == {
        "listen", "http_listen", "max_in_flight", "max_attribute_length", "http_body_deadline",
        "http_body_min_rate", "window", "lateness", "horizon", "group_by", "mode", "price_per_gpu_hour",
        "currency", "pue", "grid_intensity", "export_endpoint", "export_protocol", "export_max_request_bytes",
        "pass_through", "flag_events", "forward_inputs", "prometheus_port", "prometheus_host",
        "prometheus_expiration_windows",
        "max_streams", "max_jobs", "max_state_bytes", "stale_after", "spool", "spool_max_bytes",
    }  # fmt: skip
    defaults = {**attrs.asdict(AggregatorConfig(), recurse=False), **attrs.asdict(CollectorOptions(), recurse=False)}
    for option in OPTIONS:
        if option.name in linked:
            _, field = linked[option.name]
            expected = {} if option.name == "price_per_gpu_hour" else option.default  # None: no prices
            assert defaults[field.name] == expected, option.name
    # One range for the command line and the settings: the job cap's 1,000,000 both ways.
    with pytest.raises(ValueError, match="max_jobs must be a whole number from 1 to 1,000,000, got 1000001"):
        AggregatorConfig(max_jobs=1_000_001)
    with pytest.raises(ValueError, match="max_in_flight must be a whole number from 1 to 1,024, got 0"):
        CollectorOptions(max_in_flight=0)
