"""Settings of the window aggregator, validated once so the hot path never has to."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Final

import attrs

from otel_ofu import names
from otel_ofu.prometheus_names import label_name
from otel_ofu_collector.detectors import FLAG_OPTIONS, FlagOption
from otel_ofu_collector.option_bounds import Bound, N

NS_PER_S = 1_000_000_000

# 64 buckets per power of two (scale 6) keep a histogram quantile within 0.55% of exact (the target is 1%);
# 1280 buckets hold that scale over twenty powers of two, OFU from 1e-6 to 1: a fleet's lowest non-zero OFU
# (a GPU that ran one kernel in a window) reaches 1e-4, and 640 buckets (OFU down to 0.001) measured 1.08%
# on a heavy-tailed fleet. The histogram is per group and window, not per GPU, so the size costs little.
# Below that range the histogram downscales and the bound widens, by exphist.relative_error_bound.
DEFAULT_HISTOGRAM_MAX_BUCKETS = 1280

# The price-table entry that prices every GPU model without one of its own.
DEFAULT_PRICE_KEY = "default"
# The windows' state in bytes (streams, jobs, their identity values): room for about 500k GPU streams.
DEFAULT_MAX_STATE_BYTES = 1024**3

DAY_S: Final = 86400.0
# The ranges of the time settings, in seconds. A window is at least a second on the command line (producers
# report every few seconds) and at most a day; the settings object takes shorter windows (a local screen's)
# but holds every time to the same maxima: a window of 1e30 s parses, yet no export can carry its timestamps.
# Lateness over a day would keep a day of windows open; the horizon's correlation keeps a fixed number of
# blocks, so a month costs no more than a day; a stream silent for a week is gone, not late.
WINDOW: Final = Bound(float, 1.0, DAY_S, "s")
LATENESS: Final = Bound(float, 0.0, DAY_S, "s")
HORIZON: Final = Bound(float, 1.0, 30 * DAY_S, "s")
STALE_AFTER: Final = Bound(float, 1.0, 7 * DAY_S, "s")
# Facility energy over IT energy is 1 or more by definition; the least efficient data centres report about 2.5.
PUE: Final = Bound(float, 1.0, 3.0)
# kg CO2e per kWh: a coal-only grid emits about 1.1; more is a unit mistake (g/kWh given as kg/kWh).
GRID_INTENSITY: Final = Bound(float, 0.0, 2.0, "kg/kWh")
# Per GPU-hour in the configured currency: a million leaves room for currencies with small units (VND, IDR).
PRICE: Final = Bound(float, 0.0, 1e6)


def _positive(_instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{attribute.name} must be a positive finite number, got {value!r}")


def _at_most(maximum: float) -> Callable[[object, attrs.Attribute[float], float], None]:
    def check(_instance: object, attribute: attrs.Attribute[float], value: float) -> None:
        if value > maximum:
            raise ValueError(f"{attribute.name} must be at most {maximum:g}, got {value!r}")

    return check


def _within(bound: Bound[float]) -> Callable[[object, attrs.Attribute[float], float], None]:
    def check(_instance: object, attribute: attrs.Attribute[float], value: float) -> None:
        bound.check(attribute.name, value)

    return check


def _at_least(minimum: int) -> Callable[[object, attrs.Attribute[int], int], None]:
    def check(_instance: object, attribute: attrs.Attribute[int], value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{attribute.name} must be an integer >= {minimum}, got {value!r}")

    return check


def _as_keys(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _prices(value: Mapping[str, float]) -> dict[str, float]:
    return dict(value)


def _price_table(_instance: object, attribute: attrs.Attribute[dict[str, float]], value: dict[str, float]) -> None:
    for model, price in value.items():
        if not (isinstance(model, str) and model.strip()) or PRICE.problem(price) is not None:
            raise ValueError(
                f"{attribute.name}: {model!r}={price!r} is not a GPU model with a price from {PRICE.describe()}"
            )


def _currency(_instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not (isinstance(value, str) and value.isascii() and value.isalnum() and 1 <= len(value) <= 8):
        raise ValueError(f"{attribute.name} must be a currency code such as USD or EUR, got {value!r}")


def _optional_grid_intensity(_instance: object, attribute: attrs.Attribute[float | None], value: float | None) -> None:
    if value is not None:
        GRID_INTENSITY.check(attribute.name, value)


_FLAG_OPTIONS: Final = {option.key: option for option in FLAG_OPTIONS}


def _flag_settings(given: Mapping[str, float]) -> dict[str, float]:
    """Every detector's setting: the given values, each checked against its option's bound, the others' defaults.

    An unknown key is a ValueError: a misspelt threshold must not leave its flag at the default unnoticed."""
    unknown = sorted(set(given) - set(_FLAG_OPTIONS))
    if unknown:
        raise ValueError(f"unknown flag setting(s) {', '.join(unknown)} (known: {', '.join(_FLAG_OPTIONS)})")
    for key, value in given.items():
        _FLAG_OPTIONS[key].bound.check(key, value)
    return {key: given.get(key, option.default) for key, option in _FLAG_OPTIONS.items()}


def parse_prices(text: str) -> dict[str, float]:
    """``MODEL=PRICE[,MODEL=PRICE...]`` (price per GPU-hour; ``default`` for every other model) as a table.

    Models are split at the last ``=`` of each entry, so a model name may hold anything but a comma. An empty
    entry (``a=1,,b=2``), an entry without a model or a price, and a model given twice are refused: each is a
    typo that would otherwise price GPUs silently at another entry's price, or not at all.
    """
    prices: dict[str, float] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            raise ValueError(f"an empty price entry in {text!r} (MODEL=PRICE,MODEL=PRICE,...)")
        model, sep, raw = item.rpartition("=")
        model = model.strip()
        try:
            price = float(raw)
        except ValueError:
            price = math.nan
        if not sep or not model or PRICE.problem(price) is not None:
            raise ValueError(f"price entry {item!r} is not MODEL=PRICE (a price per GPU-hour from {PRICE.describe()})")
        if model in prices:
            raise ValueError(f"the price of {model!r} is given twice in {text!r}")
        prices[model] = price
    return prices


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

    window_s: float = attrs.field(default=60.0, validator=[_positive, _at_most(WINDOW.maximum)])
    lateness_s: float = attrs.field(default=15.0, validator=_within(LATENESS))
    horizon_s: float = attrs.field(default=DAY_S, validator=[_positive, _at_most(HORIZON.maximum)])
    # Each detector's settings by FlagOption key (detectors/*.py declare them, their defaults and bounds);
    # the ones not given take their defaults. Read them with flag(option).
    flag_settings: dict[str, float] = attrs.field(factory=dict, converter=_flag_settings, hash=False)
    group_keys: tuple[str, ...] = attrs.field(
        default=(names.HW_MODEL, names.GPU_PRECISION), converter=_as_keys, validator=_group_keys
    )
    max_streams: int = attrs.field(default=200_000, validator=_at_least(1))
    max_jobs: int = attrs.field(default=50_000, validator=_at_least(1))
    # The windows' state in bytes (streams, jobs and the identity values they keep; see Aggregator.state_bytes):
    # new streams past it are refused, so identities far longer than real ones cannot grow the state unbounded.
    max_state_bytes: int = attrs.field(default=DEFAULT_MAX_STATE_BYTES, validator=_at_least(1 << 20))
    # At most the command line's maximum plus a window and its lateness: the command raises it to cover those.
    stale_after_s: float = attrs.field(
        default=600.0, validator=[_positive, _at_most(STALE_AFTER.maximum + WINDOW.maximum + LATENESS.maximum)]
    )
    histogram_max_buckets: int = attrs.field(default=DEFAULT_HISTOGRAM_MAX_BUCKETS, validator=_at_least(2))
    # Price per GPU-hour by hw.model ("default": every other model); empty: no cost outputs.
    price_per_gpu_hour: dict[str, float] = attrs.field(
        factory=dict, converter=_prices, validator=_price_table, hash=False
    )
    currency: str = attrs.field(default="USD", validator=_currency)
    pue: float = attrs.field(default=1.0, validator=_within(PUE))
    # kg CO2e per kWh of facility energy; None: no emissions output.
    grid_intensity: float | None = attrs.field(default=None, validator=_optional_grid_intensity)
    # Each GPU's own window means in WindowReport.gpus, for a live screen that opens a job (the report feed's
    # `otel-ofu top`); off by default: a 100k-GPU window would carry 100k of them.
    per_gpu_reports: bool = False
    # What a shard sends its merge tier: each group's capacity histogram (GroupReport.capacity), which the fleet's
    # percentiles over GPU capacity are read from, and each job's window sums (WindowReport.job_parts), which add up a
    # job that was on several shards in one window; a collector that merges with no one leaves them out.
    partials: bool = False

    def __attrs_post_init__(self) -> None:
        if self.window_ns <= 0:
            raise ValueError(f"window_s {self.window_s!r} is below one nanosecond")
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
