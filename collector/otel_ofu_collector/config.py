"""Settings of the window aggregator, validated once so the hot path never has to."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

import attrs

from otel_ofu import names
from otel_ofu.prometheus_names import label_name

NS_PER_S = 1_000_000_000

# 64 buckets per power of two (scale 6) keep a histogram quantile within 0.55% of exact (the target is 1%);
# 1280 buckets hold that scale over twenty powers of two, OFU from 1e-6 to 1: a fleet's lowest non-zero OFU
# (a GPU that ran one kernel in a window) reaches 1e-4, and 640 buckets (OFU down to 0.001) measured 1.08%
# on a heavy-tailed fleet. The histogram is per group and window, not per GPU, so the size costs little.
# Below that range the histogram downscales and the bound widens, by exphist.relative_error_bound.
DEFAULT_HISTOGRAM_MAX_BUCKETS = 1280

# The price-table entry that prices every GPU model without one of its own.
DEFAULT_PRICE_KEY = "default"


def _positive(_instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{attribute.name} must be a positive finite number, got {value!r}")


def _non_negative(_instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{attribute.name} must be a finite number >= 0, got {value!r}")


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
        if not model or not isinstance(price, int | float) or not math.isfinite(price) or price < 0:
            raise ValueError(f"{attribute.name}: {model!r}={price!r} is not a GPU model with a price >= 0")


def _currency(_instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not (isinstance(value, str) and value.isascii() and value.isalnum() and 1 <= len(value) <= 8):
        raise ValueError(f"{attribute.name} must be a currency code such as USD or EUR, got {value!r}")


def _optional_non_negative(_instance: object, attribute: attrs.Attribute[float | None], value: float | None) -> None:
    if value is not None:
        _non_negative(_instance, attribute, value)  # type: ignore[arg-type]


def parse_prices(text: str) -> dict[str, float]:
    """``MODEL=PRICE[,MODEL=PRICE...]`` (price per GPU-hour; ``default`` for every other model) as a table.

    Models are split at the last ``=`` of each entry, so a model name may hold anything but a comma.
    """
    prices: dict[str, float] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        model, sep, raw = item.rpartition("=")
        model = model.strip()
        try:
            price = float(raw)
        except ValueError:
            price = math.nan
        if not sep or not model or not math.isfinite(price) or price < 0:
            raise ValueError(f"price entry {item!r} is not MODEL=PRICE (a price per GPU-hour >= 0)")
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

    ``stale_after_s`` must cover a window plus its lateness, so a stream or job is never evicted while an
    open window still holds its data.
    """

    window_s: float = attrs.field(default=60.0, validator=_positive)
    lateness_s: float = attrs.field(default=15.0, validator=_non_negative)
    horizon_s: float = attrs.field(default=86400.0, validator=_positive)
    miscount_ratio: float = attrs.field(default=1.5, validator=_positive)
    miscount_windows: int = attrs.field(default=3, validator=_at_least(1))
    regression_factor: float = attrs.field(default=2.0, validator=_positive)
    baseline_windows: int = attrs.field(default=10, validator=_at_least(1))
    # A job whose baseline OFU is under this does no tensor work to regress from (an idle notebook,
    # a data-loading phase): its noise around zero must not read as a 2x drop.
    regression_min_baseline: float = attrs.field(default=0.05, validator=_non_negative)
    group_keys: tuple[str, ...] = attrs.field(
        default=(names.HW_MODEL, names.GPU_PRECISION), converter=_as_keys, validator=_group_keys
    )
    max_streams: int = attrs.field(default=200_000, validator=_at_least(1))
    max_jobs: int = attrs.field(default=50_000, validator=_at_least(1))
    # The windows' state in bytes (streams, jobs and the identity values they keep; see Aggregator.state_bytes):
    # new streams past it are refused, so identities far longer than real ones cannot grow the state unbounded.
    max_state_bytes: int = attrs.field(default=1024**3, validator=_at_least(1 << 20))
    stale_after_s: float = attrs.field(default=600.0, validator=_positive)
    histogram_max_buckets: int = attrs.field(default=DEFAULT_HISTOGRAM_MAX_BUCKETS, validator=_at_least(2))
    # Where OFU is lost and what it costs. A GPU straggles while its OFU x straggler_factor stays below its
    # job's median OFU for straggler_windows windows; a GPU is idle after idle_windows without tensor work.
    straggler_factor: float = attrs.field(default=1.25, validator=_positive)
    straggler_windows: int = attrs.field(default=3, validator=_at_least(1))
    idle_windows: int = attrs.field(default=3, validator=_at_least(1))
    # Price per GPU-hour by hw.model ("default": every other model); empty: no cost outputs.
    price_per_gpu_hour: dict[str, float] = attrs.field(
        factory=dict, converter=_prices, validator=_price_table, hash=False
    )
    currency: str = attrs.field(default="USD", validator=_currency)
    pue: float = attrs.field(default=1.0, validator=_positive)
    # kg CO2e per kWh of facility energy; None: no emissions output.
    grid_intensity: float | None = attrs.field(default=None, validator=_optional_non_negative)
    # Each GPU's own window means in WindowReport.gpus, for a live screen that opens a job (the report feed's
    # `otel-ofu top`); off by default: a 100k-GPU window would carry 100k of them.
    per_gpu_reports: bool = False

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

    def price_of(self, model: str | None) -> float | None:
        """The price per GPU-hour of a GPU of ``model``: its own, else the default, else None (not priced)."""
        prices = self.price_per_gpu_hour
        if model is not None and model in prices:
            return prices[model]
        return prices.get(DEFAULT_PRICE_KEY)

    @property
    def baseline_min_windows(self) -> int:
        """Unflagged windows a job needs before its regression flag may rise: half the baseline, at least 1."""
        return max(1, (self.baseline_windows + 1) // 2)
