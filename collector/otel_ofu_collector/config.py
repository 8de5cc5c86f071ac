"""Settings of the window aggregator, validated once so the hot path never has to."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs

from otel_ofu import names
from otel_ofu.prometheus_names import label_name
from otel_ofu_collector.detectors import FLAG_OPTIONS, FlagOption
from otel_ofu_collector.option_bounds import Bound, N
from otel_ofu_collector.options import declared as option
from otel_ofu_collector.options.declared import DAY_S as DAY_S
from otel_ofu_collector.options.declared import DEFAULT_PRICE_KEY as DEFAULT_PRICE_KEY
from otel_ofu_collector.options.declared import PRICE
from otel_ofu_collector.options.declared import parse_prices as parse_prices  # re-exported: its home was here

NS_PER_S = 1_000_000_000

# 64 buckets per power of two (scale 6) keep a histogram quantile within 0.55% of exact (the target is 1%);
# 1280 buckets hold that scale over twenty powers of two, OFU from 1e-6 to 1: a fleet's lowest non-zero OFU
# (a GPU that ran one kernel in a window) reaches 1e-4, and 640 buckets (OFU down to 0.001) measured 1.08%
# on a heavy-tailed fleet. The histogram is per group and window, not per GPU, so the size costs little.
# Below that range the histogram downscales and the bound widens, by exphist.relative_error_bound.
DEFAULT_HISTOGRAM_MAX_BUCKETS = 1280
# At least two buckets; 65,536 (a quarter of a MiB of counts per group and window) is far past any use.
HISTOGRAM_BUCKETS: Final = Bound(int, 2, 1 << 16)
# The settings take times down to a nanosecond (a local screen's sub-second windows), where the command line
# takes a second; the maxima are the command line's.
NANOSECOND_S: Final = 1e-9
# The command raises the staleness to cover a window and its lateness, so the settings take up to all three.
_STALE_AFTER_MAX_S: Final = sum(
    bound.maximum for bound in (option.STALE_AFTER_RANGE, option.WINDOW_RANGE, option.LATENESS_RANGE)
)


def _as_keys(value: Any) -> tuple[str, ...]:
    return tuple(value)


def _prices(value: Mapping[str, float] | None) -> dict[str, float]:
    return dict(value or {})


def _price_table(_instance: object, attribute: attrs.Attribute[dict[str, float]], value: dict[str, float]) -> None:
    for model, price in value.items():
        if not (isinstance(model, str) and model.strip()) or PRICE.problem(price) is not None:
            raise ValueError(
                f"{attribute.name}: {model!r}={price!r} is not a GPU model with a price from {PRICE.describe()}"
            )


def _currency(_instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not (isinstance(value, str) and value.isascii() and value.isalnum() and 1 <= len(value) <= 8):
        raise ValueError(f"{attribute.name} must be a currency code such as USD or EUR, got {value!r}")


_FLAG_OPTIONS: Final = {flag.key: flag for flag in FLAG_OPTIONS}


def _flag_settings(given: Mapping[str, float]) -> dict[str, float]:
    """Every detector's setting: the given values, each checked against its option's bound, the others' defaults.

    An unknown key is a ValueError: a misspelt threshold must not leave its flag at the default unnoticed."""
    unknown = sorted(set(given) - set(_FLAG_OPTIONS))
    if unknown:
        raise ValueError(f"unknown flag setting(s) {', '.join(unknown)} (known: {', '.join(_FLAG_OPTIONS)})")
    for key, value in given.items():
        _FLAG_OPTIONS[key].bound.check(key, value)
    return {key: given.get(key, flag.default) for key, flag in _FLAG_OPTIONS.items()}


def _group_keys(_instance: object, attribute: attrs.Attribute[tuple[str, ...]], value: tuple[str, ...]) -> None:
    if not all(isinstance(key, str) and key for key in value):
        raise ValueError(f"{attribute.name} must be non-empty attribute keys, got {value!r}")
    if len(set(value)) != len(value):
        raise ValueError(f"{attribute.name} has a key twice: {value!r}")
    if names.QUANTILE in value:
        raise ValueError(f"{attribute.name} may not use {names.QUANTILE!r}: the quantile gauge owns it")
    if any(label_name(key) == names.PROMETHEUS_QUANTILE_LABEL for key in value):
        raise ValueError(
            f"{attribute.name} may not use {names.PROMETHEUS_QUANTILE_LABEL!r}: the quantile gauge owns it"
        )


@attrs.frozen
class AggregatorConfig:
    """Windows, correlation and flag settings; seconds as floats, counts as ints.

    ``AggregatorConfig(flag_settings={"miscount_windows": 2})`` sets one detector setting, the others keep the
    defaults their detectors declare.

    ``stale_after_s`` must cover a window plus its lateness, so a stream or job is never evicted while an
    open window still holds its data.
    """

    # The fields an option fills take its default and range (options/declared.py): OPTION.field().
    window_s: float = option.WINDOW.field(minimum=NANOSECOND_S)
    lateness_s: float = option.LATENESS.field()
    horizon_s: float = option.HORIZON.field(minimum=NANOSECOND_S)
    # Each detector's settings by FlagOption key (detectors/*.py declare them, their defaults and bounds);
    # the ones not given take their defaults. Read them with flag(option).
    flag_settings: dict[str, float] = attrs.field(factory=dict, converter=_flag_settings, hash=False)
    group_keys: tuple[str, ...] = option.GROUP_BY.field(converter=_as_keys, validator=_group_keys)
    max_streams: int = option.MAX_STREAMS.field()
    max_jobs: int = option.MAX_JOBS.field()
    # The windows' state in bytes (streams, jobs and the identity values they keep; see Aggregator.state_bytes):
    # new streams past it are refused, so identities far longer than real ones cannot grow the state unbounded.
    max_state_bytes: int = option.MAX_STATE_BYTES.field()
    stale_after_s: float = option.STALE_AFTER.field(minimum=NANOSECOND_S, maximum=_STALE_AFTER_MAX_S)
    histogram_max_buckets: int = attrs.field(
        default=DEFAULT_HISTOGRAM_MAX_BUCKETS, validator=HISTOGRAM_BUCKETS.validate
    )
    # Price per GPU-hour by hw.model ("default": every other model); empty (or None): no cost outputs.
    price_per_gpu_hour: dict[str, float] = option.PRICE_PER_GPU_HOUR.field(  # noqa: RUF009 - an attrs field
        converter=_prices, validator=_price_table, hash=False
    )
    currency: str = option.CURRENCY.field(validator=_currency)
    pue: float = option.PUE.field()
    # kg CO2e per kWh of facility energy; None: no emissions output.
    grid_intensity: float | None = option.GRID_INTENSITY.field()
    # Each GPU's own window means in WindowReport.gpus, for a live screen that opens a job (the report feed's
    # `otel-ofu top`); off by default: a 100k-GPU window would carry 100k of them.
    per_gpu_reports: bool = False
    # What a shard sends its merge tier: each group's capacity histogram (GroupReport.capacity), which the fleet's
    # percentiles over GPU capacity are read from, and each job's window sums (WindowReport.job_parts), which add up a
    # job that was on several shards in one window; a collector that merges with no one leaves them out.
    partials: bool = False

    def __attrs_post_init__(self) -> None:
        if self.horizon_s < self.window_s:
            raise ValueError(f"horizon_s {self.horizon_s!r} is shorter than window_s {self.window_s!r}")
        if self.stale_after_s < self.window_s + self.lateness_s:
            raise ValueError(
                f"stale_after_s {self.stale_after_s!r} must be at least window_s + lateness_s "
                f"({self.window_s + self.lateness_s!r}): open windows would lose their streams"
            )

    @property
    def window_ns(self) -> int:
        return round(self.window_s * NS_PER_S)

    @property
    def lateness_ns(self) -> int:
        return round(self.lateness_s * NS_PER_S)

    @property
    def horizon_ns(self) -> int:
        return round(self.horizon_s * NS_PER_S)

    @property
    def stale_after_ns(self) -> int:
        return round(self.stale_after_s * NS_PER_S)

    def flag(self, option: FlagOption[N]) -> N:
        """The value of one detector setting (its default unless ``flag_settings`` gave one)."""
        return option.bound.kind(self.flag_settings[option.key])

    def price_of(self, model: str | None) -> float | None:
        """The price per GPU-hour of a GPU of ``model``: its own, else the default, else None (not priced)."""
        prices = self.price_per_gpu_hour
        if model is not None and model in prices:
            return prices[model]
        return prices.get(DEFAULT_PRICE_KEY)
