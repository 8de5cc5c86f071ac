"""MFU from training code: a reporter library and a log follower, emitting ``job.mfu`` over OpenTelemetry."""

from otel_ofu.mfu.log_follower import DEFAULT_PATTERN, FollowerStats, LogFollower, MfuPattern, parse_mfu
from otel_ofu.mfu.reporter import MfuReporter, otlp_meter_provider, otlp_metric_exporter
from otel_ofu.mfu.values import MFU_MAX, InvalidMfu, check_mfu

__all__ = [
    "DEFAULT_PATTERN",
    "MFU_MAX",
    "FollowerStats",
    "InvalidMfu",
    "LogFollower",
    "MfuPattern",
    "MfuReporter",
    "check_mfu",
    "otlp_meter_provider",
    "otlp_metric_exporter",
    "parse_mfu",
]
