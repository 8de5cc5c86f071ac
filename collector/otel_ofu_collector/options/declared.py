"""Every option of ``otel-ofu collector``, in its section, in the order ``--help`` and the reference show them.

Each range is generous: it refuses unit mistakes and values that cannot work. The detectors declare their own
settings beside their flags (``detectors/*.py``, ``FlagOption``); they are offered here, in the ``flags`` section,
as they are declared there. A default that a part of the collector owns as a library (the decoder's attribute
length, the HTTP receiver's body deadline) is taken from that part.
"""

from __future__ import annotations

import argparse
import math
from typing import Any, Final

from otel_ofu import names, ports
from otel_ofu.cli_support import address_or_off, parse_bool, port_number, url_or_host_port
from otel_ofu.gpu_values import CalibrationTable
from otel_ofu_collector.detectors import FLAG_OPTIONS, FlagOption
from otel_ofu_collector.option_bounds import Bound, N
from otel_ofu_collector.options.option import Option, Section, optional_text
from otel_ofu_collector.otlp.decode import DEFAULT_MAX_ATTRIBUTE_LENGTH
from otel_ofu_collector.outputs.feed_server import DEFAULT_FEED_MAX_BYTES
from otel_ofu_collector.outputs.split import DEFAULT_MAX_EXPORT_BYTES
from otel_ofu_collector.receivers.http_framing import BODY_DEADLINE_S, BODY_GRACE_S, BODY_MIN_RATE

DAY_S: Final = 86400.0
MODES: Final = ("process", "shard", "merge")
PROTOCOLS: Final = ("grpc", "http/protobuf")
# The price-table entry that prices every GPU model without one of its own.
DEFAULT_PRICE_KEY: Final = "default"
# Per GPU-hour in the configured currency: a million leaves room for currencies with small units (VND, IDR).
PRICE: Final = Bound(float, 0.0, 1e6)

RECEIVING: Final = Section("receiving", "receiving (OTLP in)")
TLS: Final = Section("tls", "TLS and auth")
WINDOWS: Final = Section("windows", "windows")
FLAGS: Final = Section("flags", "flags (each detector's own settings)")
COST: Final = Section("cost", "loss & cost")
DCGM: Final = Section("dcgm", "dcgm-exporter scrapes (from an OpenTelemetry Collector's Prometheus receiver)")
OUTPUTS: Final = Section("outputs", "outputs")
PROMETHEUS: Final = Section("prometheus", "Prometheus endpoint (the outputs and the collector's self-telemetry)")
STATE: Final = Section("state", "state & durability")
SECTIONS: Final = (RECEIVING, TLS, WINDOWS, FLAGS, COST, DCGM, OUTPUTS, PROMETHEUS, STATE)


def number(name: str, section: Section, bound: Bound[N], default: N, *, metavar: str, help: str) -> Option[N]:
    """A numeric option: read and checked by its bound, whose range the help shows."""
    return Option(name, section, default, help, bound.parse, metavar=metavar, bound=bound)


def text(name: str, section: Section, *, metavar: str, help: str, default: str | None = None) -> Option[str | None]:
    """A free text (a file, an address, an id); nothing given (an empty text) is none."""
    return Option(name, section, default, help, optional_text, metavar=metavar)


def switch(name: str, section: Section, *, help: str, default: bool = False) -> Option[bool]:
    return Option(name, section, default, help, parse_bool, switch=True)


def _flag(option: FlagOption[Any]) -> Option[Any]:
    """A detector's setting, as its detector declares it."""
    return number(option.key, FLAGS, option.bound, option.default, metavar=option.metavar, help=option.help)


# --- parsers of the options that are neither numbers nor free text ------------------------------------------


def group_by(text: str) -> tuple[str, ...]:
    return tuple(key.strip() for key in text.split(",") if key.strip())


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


def prices(text: str) -> dict[str, float]:
    try:
        return parse_prices(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def currency(text: str) -> str:
    code = text.strip().upper()
    if not (code.isascii() and code.isalnum() and 1 <= len(code) <= 8):
        raise argparse.ArgumentTypeError(f"{text!r} is not a currency code such as USD or EUR")
    return code


# --- receiving (OTLP in) -----------------------------------------------------------------------------------

LISTEN: Final[Option[str | None]] = Option(
    "listen",
    RECEIVING,
    "0.0.0.0:4317",
    "OTLP/gRPC listen address; off (or none) turns the gRPC receiver off (then --http-listen is needed)",
    address_or_off,
    metavar="HOST:PORT",
)
HTTP_LISTEN: Final = Option(
    "http_listen",
    RECEIVING,
    None,
    "OTLP/HTTP listen address (no HTTP receiver unless given; off or none also says so)",
    address_or_off,
    metavar="HOST:PORT",
)
MAX_IN_FLIGHT: Final = number(
    "max_in_flight",
    RECEIVING,
    Bound(int, 1, 1024),  # each receiver's worker threads, at most one each (made as needed)
    64,
    metavar="REQUESTS",
    help="requests processed at once before UNAVAILABLE",
)
MAX_ATTRIBUTE_LENGTH: Final = number(
    "max_attribute_length",
    RECEIVING,
    Bound(int, 1, 65_536, "characters"),
    DEFAULT_MAX_ATTRIBUTE_LENGTH,
    metavar="CHARS",
    help="reject points whose identity attribute value (job.id, host.name, ...) is longer than this",
)
HTTP_BODY_DEADLINE: Final = number(
    "http_body_deadline",
    RECEIVING,
    Bound(float, 0.1, 3600.0, "s"),
    BODY_DEADLINE_S,
    metavar="SECONDS",
    help="an OTLP/HTTP body not received within this is answered 408 and its connection closed; an OTLP/gRPC "
    "request message, DEADLINE_EXCEEDED",
)
HTTP_BODY_MIN_RATE: Final = number(
    "http_body_min_rate",
    RECEIVING,
    Bound(float, 0.0, 1e9, "bytes/s"),
    BODY_MIN_RATE,
    metavar="BYTES_PER_S",
    help=f"an OTLP/HTTP body slower than this on average after its first {BODY_GRACE_S:g} s is answered 408 "
    "and its connection closed (0: no minimum)",
)

# --- TLS and auth ------------------------------------------------------------------------------------------

TLS_CERT: Final = text("tls_cert", TLS, metavar="FILE", help="server certificate (PEM) for TLS")
TLS_KEY: Final = text("tls_key", TLS, metavar="FILE", help="server private key (PEM) for TLS")
TLS_CLIENT_CA: Final = text(
    "tls_client_ca", TLS, metavar="FILE", help="CA (PEM) client certificates must chain to (mTLS)"
)
BEARER_TOKEN: Final = Option(
    "bearer_token",
    TLS,
    None,
    "require 'authorization: Bearer <token>' (on the command line it shows in the process table: "
    "prefer --bearer-token-file or the environment variable)",
    optional_text,
    metavar="TOKEN",
    secret=True,
)
BEARER_TOKEN_FILE: Final = text("bearer_token_file", TLS, metavar="FILE", help="read the bearer token from this file")

# --- windows -----------------------------------------------------------------------------------------------

# A window is at least a second on the command line (producers report every few seconds) and at most a day; the
# settings object takes shorter windows (a local screen's) but holds every time to the same maxima: a window of
# 1e30 s parses, yet no export can carry its timestamps. Lateness over a day would keep a day of windows open;
# the horizon's correlation keeps a fixed number of blocks, so a month costs no more than a day.
# (``otel-ofu demo``, ``top`` and ``report`` take windows of the same range.)
WINDOW_RANGE: Final = Bound(float, 1.0, DAY_S, "s")
LATENESS_RANGE: Final = Bound(float, 0.0, DAY_S, "s")
WINDOW: Final = number("window", WINDOWS, WINDOW_RANGE, 60.0, metavar="SECONDS", help="window length")
LATENESS: Final = number(
    "lateness",
    WINDOWS,
    LATENESS_RANGE,
    15.0,
    metavar="SECONDS",
    help="how long after its end a window waits for late points",
)
HORIZON: Final = number(
    "horizon",
    WINDOWS,
    Bound(float, 1.0, 30 * DAY_S, "s"),
    DAY_S,
    metavar="SECONDS",
    help="how far back the OFU-vs-MFU correlation looks (at least one window)",
)
GROUP_BY: Final[Option[tuple[str, ...]]] = Option(
    "group_by",
    WINDOWS,
    (names.HW_MODEL, names.GPU_PRECISION),
    "comma-separated attribute keys that group fleet percentiles",
    group_by,
    metavar="KEY,...",
)
MODE: Final = Option(
    "mode",
    WINDOWS,
    "process",
    "process: one collector; shard: also export mergeable partials; merge: merge the shards' partials",
    str,
    choices=MODES,
)

# --- loss & cost: what the lost OFU costs ------------------------------------------------------------------

PRICE_PER_GPU_HOUR: Final = Option(
    "price_per_gpu_hour",
    COST,
    None,
    "price per GPU-hour in --currency by hw.model, 'default' for the others (e.g. 'NVIDIA H100 80GB "
    f"HBM3=2.5,default=2.0'; each model once, each price {PRICE.describe()}); job.cost and the lost cost "
    "are absent without it",
    prices,
    metavar="MODEL=PRICE,...",
)
CURRENCY: Final = Option("currency", COST, "USD", "currency of the prices (the cost unit)", currency, metavar="CODE")
# Facility energy over IT energy is 1 or more by definition; the least efficient data centres report about 2.5.
PUE: Final = number(
    "pue",
    COST,
    Bound(float, 1.0, 3.0),
    1.0,
    metavar="RATIO",
    help="power usage effectiveness: facility energy / GPU energy",
)
# kg CO2e per kWh: a coal-only grid emits about 1.1; more is a unit mistake (g/kWh given as kg/kWh).
_KG_PER_KWH: Final = Bound(float, 0.0, 2.0, "kg/kWh")
GRID_INTENSITY: Final = Option(
    "grid_intensity",
    COST,
    None,
    "grid carbon intensity in kg CO2e per kWh; job.emissions is absent without it",
    _KG_PER_KWH.parse,
    metavar="KG_PER_KWH",
    bound=_KG_PER_KWH,
)

# --- dcgm-exporter scrapes: the producer's own settings for the GPUs read from them ---------------------------


def calibration(text: str) -> CalibrationTable | None:
    try:
        return CalibrationTable.parse(text) if text.strip() else None
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


CALIBRATION: Final = Option(
    "calibration",
    DCGM,
    None,
    "tile-quantization factors for the GPUs read from dcgm-exporter scrapes, as otel-ofu run takes them: "
    "job:ID=F,model:KEY=F (e.g. model:H100-SXM=0.93)",
    calibration,
    metavar="SPEC",
)
K8S_PODS_URL: Final = text(
    "k8s_pods_url",
    DCGM,
    metavar="URL",
    help="the cluster's pods (auto: the in-cluster API server's /api/v1/pods; off: none), read for the job of "
    "each pod dcgm-exporter labels a GPU with, by the producer's workload rules (needs list pods cluster-wide)",
)
K8S_JOB_LABEL: Final = text(
    "k8s_job_label", DCGM, metavar="KEY", help="pod label naming the job, before the standard ones"
)

# --- outputs -----------------------------------------------------------------------------------------------

EXPORT_ENDPOINT: Final = Option(
    "export_endpoint",
    OUTPUTS,
    None,
    "downstream OTLP endpoint; unset: OTEL_EXPORTER_OTLP_[METRICS_]ENDPOINT, else no downstream",
    url_or_host_port,
    metavar="URL",
)
EXPORT_PROTOCOL: Final = Option(
    "export_protocol",
    OUTPUTS,
    None,
    "downstream protocol; unset: OTEL_EXPORTER_OTLP_PROTOCOL, else grpc",
    str,
    choices=PROTOCOLS,
)
# At least one large data point with its resource must fit; beyond 64 MiB no OTLP receiver takes a request.
EXPORT_MAX_REQUEST_BYTES: Final = number(
    "export_max_request_bytes",
    OUTPUTS,
    Bound(int, 64 * 1024, 64 * 1024 * 1024, "bytes"),
    DEFAULT_MAX_EXPORT_BYTES,
    metavar="BYTES",
    help="split requests sent downstream to at most this size (gRPC receivers refuse over 4 MiB by default)",
)
PASS_THROUGH: Final = switch(
    "pass_through", OUTPUTS, default=True, help="forward metrics that are not ours downstream untouched"
)
FLAG_EVENTS: Final = switch(
    "flag_events",
    OUTPUTS,
    default=True,
    help="send each flag's rise and fall downstream as an OTLP log record (to its logs endpoint)",
)
FORWARD_INPUTS: Final = switch("forward_inputs", OUTPUTS, help="also forward our inputs (gpu.*, job.mfu) downstream")
INSTANCE_ID: Final = text(
    "instance_id",
    OUTPUTS,
    metavar="ID",
    help="service.instance.id of the outputs (unique per shard replica); default HOSTNAME-PID",
)
RECORD_OUTPUTS: Final = text(
    "record_outputs", OUTPUTS, metavar="FILE", help="append every closed window to this JSON-lines file"
)
REPORT_FEED_PORT: Final = Option(
    "report_feed_port",
    OUTPUTS,
    None,
    "serve recent windows at /reports.jsonl on this port (for otel-ofu report --live)",
    port_number,
    metavar="PORT",
)
HEALTH_PORT: Final = Option(
    "health_port",
    OUTPUTS,
    None,
    "serve /healthz on this port: 200 while the receivers listen and windows are flushed, 503 once the flush "
    f"has not run for 30 s (a liveness probe's; conventionally {ports.COLLECTOR_HEALTH})",
    port_number,
    metavar="PORT",
)
HEALTH_HOST: Final = Option(
    "health_host",
    OUTPUTS,
    "127.0.0.1",
    "address of /healthz (loopback by default; 0.0.0.0 for a probe from outside the host or pod)",
    str,
    metavar="HOST",
)
REPORT_FEED_HOST: Final = Option(
    "report_feed_host",
    OUTPUTS,
    "127.0.0.1",
    "address of the report feed (loopback by default: it has no TLS or token; 0.0.0.0 exposes it)",
    str,
    metavar="HOST",
)
REPORT_FEED_MAX_BYTES: Final = number(
    "report_feed_max_bytes",
    OUTPUTS,
    Bound(int, 1 << 20, 1 << 40, "bytes"),  # 1 MiB to 1 TiB
    DEFAULT_FEED_MAX_BYTES,
    metavar="BYTES",
    help="bound of the report feed's windows in memory (apart from --max-state-bytes); its oldest are dropped",
)

# --- the Prometheus endpoint -------------------------------------------------------------------------------

PROMETHEUS_PORT: Final = Option(
    "prometheus_port", PROMETHEUS, None, "serve Prometheus /metrics on this port", port_number, metavar="PORT"
)
PROMETHEUS_HOST: Final = Option(
    "prometheus_host",
    PROMETHEUS,
    "127.0.0.1",
    "address of the Prometheus endpoint (loopback by default: it has no TLS or token; 0.0.0.0 exposes it)",
    str,
    metavar="HOST",
)
# A series leaves /metrics after this many windows without it. The endpoint's own default
# (outputs.prometheus.DEFAULT_EXPIRATION_WINDOWS) is not imported: that module loads only when the endpoint is on.
PROMETHEUS_EXPIRATION_WINDOWS: Final = number(
    "prometheus_expiration_windows",
    PROMETHEUS,
    Bound(int, 1, 10_000),
    2,
    metavar="WINDOWS",
    help="windows a series stays on the Prometheus endpoint without a new value (1: the latest window only)",
)

# --- state & durability ------------------------------------------------------------------------------------

MAX_STREAMS: Final = number(
    "max_streams",
    STATE,
    Bound(int, 1, 10_000_000),  # --max-state-bytes bounds their bytes besides
    200_000,
    metavar="N",
    help="most GPU streams held at once",
)
MAX_JOBS: Final = number(
    "max_jobs", STATE, Bound(int, 1, 1_000_000), 50_000, metavar="N", help="most jobs held at once"
)
# The windows' state in bytes (streams, jobs, their identity values): room for about 500k GPU streams; at least a
# few thousand streams' worth, at most what one host's memory could hold.
MAX_STATE_BYTES: Final = number(
    "max_state_bytes",
    STATE,
    Bound(int, 1 << 20, 1 << 40, "bytes"),  # 1 MiB to 1 TiB
    1024**3,
    metavar="BYTES",
    help="most bytes of window state (GPU streams, jobs and their identity values); new streams beyond are refused",
)
# A stream silent for a week is gone, not late.
STALE_AFTER_RANGE: Final = Bound(float, 1.0, 7 * DAY_S, "s")
STALE_AFTER: Final = number(
    "stale_after",
    STATE,
    STALE_AFTER_RANGE,
    600.0,
    metavar="SECONDS",
    help="evict a GPU or job silent this long (raised to cover a window and its lateness)",
)
SPOOL: Final = text(
    "spool",
    STATE,
    metavar="FILE",
    help="SQLite file that keeps undelivered window outputs across restarts; beside it FILE.accepted writes "
    "ahead the accepted points of the open windows, replayed after a SIGKILL or crash (without a spool "
    "those, about one window, are lost)",
)
SPOOL_MAX_BYTES: Final = number(
    "spool_max_bytes",
    STATE,
    Bound(int, 1 << 20, 1 << 40, "bytes"),  # 1 MiB to 1 TiB
    256 * 1024 * 1024,
    metavar="BYTES",
    help="bound of the spool",
)
SHUTDOWN_GRACE: Final = number(
    "shutdown_grace",
    STATE,
    Bound(float, 0.0, 3600.0, "s"),
    10.0,
    metavar="SECONDS",
    help="time to finish up on SIGTERM",
)

OPTIONS: Final[tuple[Option[Any], ...]] = (
    LISTEN,
    HTTP_LISTEN,
    MAX_IN_FLIGHT,
    MAX_ATTRIBUTE_LENGTH,
    HTTP_BODY_DEADLINE,
    HTTP_BODY_MIN_RATE,
    TLS_CERT,
    TLS_KEY,
    TLS_CLIENT_CA,
    BEARER_TOKEN,
    BEARER_TOKEN_FILE,
    WINDOW,
    LATENESS,
    HORIZON,
    GROUP_BY,
    MODE,
    *(_flag(option) for option in FLAG_OPTIONS),
    PRICE_PER_GPU_HOUR,
    CURRENCY,
    PUE,
    GRID_INTENSITY,
    CALIBRATION,
    K8S_PODS_URL,
    K8S_JOB_LABEL,
    EXPORT_ENDPOINT,
    EXPORT_PROTOCOL,
    EXPORT_MAX_REQUEST_BYTES,
    PASS_THROUGH,
    FLAG_EVENTS,
    FORWARD_INPUTS,
    INSTANCE_ID,
    RECORD_OUTPUTS,
    REPORT_FEED_PORT,
    HEALTH_PORT,
    HEALTH_HOST,
    REPORT_FEED_HOST,
    REPORT_FEED_MAX_BYTES,
    PROMETHEUS_PORT,
    PROMETHEUS_HOST,
    PROMETHEUS_EXPIRATION_WINDOWS,
    MAX_STREAMS,
    MAX_JOBS,
    MAX_STATE_BYTES,
    STALE_AFTER,
    SPOOL,
    SPOOL_MAX_BYTES,
    SHUTDOWN_GRACE,
)


def in_section(section: Section) -> tuple[Option[Any], ...]:
    return tuple(option for option in OPTIONS if option.section is section)


def _check() -> None:
    """Each option once, in the order of its section (``--help`` groups them so, the reference too)."""
    seen = [option.name for option in OPTIONS]
    twice = sorted({name for name in seen if seen.count(name) > 1})
    if twice:
        raise ImportError(f"collector option(s) {', '.join(twice)} declared twice")
    order = [SECTIONS.index(option.section) for option in OPTIONS]
    if order != sorted(order):
        raise ImportError("collector options are declared out of their sections' order")


_check()
