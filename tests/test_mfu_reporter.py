"""MfuReporter: the MFU math, the peak from the catalog, pass-through, and job.mfu as the SDK sees it."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, InMemoryMetricReader, NumberDataPoint

from otel_ofu import names
from otel_ofu.mfu import MFU_MAX, InvalidMfu, MfuReporter, otlp_metric_exporter
from otel_ofu.mfu.reporter import otlp_meter_provider
from otel_ofu.producer.exporters import OtlpMetricExporter
from otel_ofu.producer.metrics_data import env_resource

H100 = "NVIDIA H100 80GB HBM3"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def reader() -> InMemoryMetricReader:
    return InMemoryMetricReader()


@pytest.fixture
def provider(reader: InMemoryMetricReader) -> Iterator[MeterProvider]:
    meter_provider = MeterProvider(metric_readers=[reader])
    yield meter_provider
    meter_provider.shutdown()


def mfu_points(reader: InMemoryMetricReader) -> list[tuple[dict[str, Any], float, str]]:
    """(attributes, value, unit) of every job.mfu point the reader collects now."""
    points: list[tuple[dict[str, Any], float, str]] = []
    data = reader.get_metrics_data()
    if data is None:
        return points
    for resource_metrics in data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                if metric.name == names.JOB_MFU.name:
                    for point in metric.data.data_points:
                        assert isinstance(point, NumberDataPoint)
                        points.append((dict(point.attributes or {}), float(point.value), metric.unit or ""))
    return points


def test_six_n_per_token_against_a_hand_computed_value(provider: MeterProvider) -> None:
    # 1e9 params, 1M tokens in 2 s on 8 H100 in bf16: 6e9 x 5e5 / (8 x 989.4e12) = 3e15 / 7.9152e15.
    reporter = MfuReporter("job-1", n_params=1e9, num_gpus=8, gpu_model=H100, meter_provider=provider)
    assert reporter.model_flops_per_token == 6e9
    assert reporter.step(tokens=1_000_000, seconds=2.0) == pytest.approx(0.3790175864160097, rel=1e-12)


def test_explicit_flops_per_token_wins_over_six_n(provider: MeterProvider) -> None:
    # PaLM's fuller form adds attention FLOPs to 6N: the explicit figure is used as given.
    reporter = MfuReporter(
        "job-1", flops_per_token=8e9, n_params=1e9, peak_flops_per_gpu=1e15, num_gpus=2, meter_provider=provider
    )
    assert reporter.model_flops_per_token == 8e9
    # 8e9 x (3e5 / 1.5) / (2 x 1e15) = 1.6e15 / 2e15
    assert reporter.step(tokens=300_000, seconds=1.5) == pytest.approx(0.8)


@pytest.mark.parametrize(("precision", "peak"), [("bf16", 989.4e12), ("fp16", 989.4e12), ("fp8", 1979e12)])
def test_peak_comes_from_the_catalog(provider: MeterProvider, precision: str, peak: float) -> None:
    reporter = MfuReporter("j", n_params=1e9, gpu_model=H100, precision=precision, meter_provider=provider)
    assert reporter.peak_flops == pytest.approx(peak)


def test_explicit_peak_wins_over_the_catalog(provider: MeterProvider) -> None:
    reporter = MfuReporter("j", n_params=1e9, gpu_model=H100, peak_flops_per_gpu=5e14, meter_provider=provider)
    assert reporter.peak_flops == 5e14


@pytest.mark.parametrize(
    ("gpu_model", "precision", "message"),
    [
        ("Tesla K80", "bf16", "not in the catalog"),
        (None, "bf16", "peak FLOP/s"),
        (H100, "mixed", "no dense mixed peak"),
        (H100, "fp4", "no dense fp4 peak"),
    ],
)
def test_no_resolvable_peak_fails_at_construction(
    provider: MeterProvider, gpu_model: str | None, precision: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        MfuReporter("j", n_params=1e9, gpu_model=gpu_model, precision=precision, meter_provider=provider)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"job_id": ""},
        {"job_id": "j", "precision": "fp32"},
        {"job_id": "j", "num_gpus": 0},
        {"job_id": "j", "n_params": -1.0, "peak_flops_per_gpu": 1e15},
        {"job_id": "j", "flops_per_token": float("nan"), "peak_flops_per_gpu": 1e15},
        {"job_id": "j", "n_params": 1e9, "peak_flops_per_gpu": 0.0},
        {"job_id": "j", "stale_after_s": 0.0},
    ],
)
def test_bad_configuration_is_a_clear_error(provider: MeterProvider, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"\S"):
        MfuReporter(**kwargs, meter_provider=provider)


@pytest.mark.parametrize(("tokens", "seconds"), [(-1.0, 1.0), (100.0, 0.0), (100.0, float("inf")), (float("nan"), 1)])
def test_bad_step_input_is_rejected(provider: MeterProvider, tokens: float, seconds: float) -> None:
    reporter = MfuReporter("j", n_params=1e9, gpu_model=H100, meter_provider=provider)
    with pytest.raises(ValueError, match="must be"):
        reporter.step(tokens=tokens, seconds=seconds)
    assert reporter.last_mfu is None


def test_pass_through_needs_no_peak_and_step_says_why_it_cannot(
    provider: MeterProvider, reader: InMemoryMetricReader
) -> None:
    reporter = MfuReporter("j", meter_provider=provider)
    assert reporter.report(0.41) == 0.41
    assert [value for _, value, _ in mfu_points(reader)] == [0.41]
    with pytest.raises(ValueError, match="flops_per_token or n_params"):
        reporter.step(tokens=1, seconds=1)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -0.01, 32.5, MFU_MAX + 0.01])
def test_unusable_reported_values_are_rejected_and_lose_nothing(
    provider: MeterProvider, reader: InMemoryMetricReader, value: float
) -> None:
    reporter = MfuReporter("j", meter_provider=provider)
    reporter.report(0.3)
    with pytest.raises(InvalidMfu):
        reporter.report(value)
    assert [point for _, point, _ in mfu_points(reader)] == [0.3]


def test_above_one_is_reported_with_one_warning(
    provider: MeterProvider, reader: InMemoryMetricReader, caplog: pytest.LogCaptureFixture
) -> None:
    # A framework over-counting its FLOPs claims > 100%: exactly what the collector's miscount flag needs.
    reporter = MfuReporter("moe", meter_provider=provider)
    with caplog.at_level(logging.WARNING, logger="otel_ofu.mfu.reporter"):
        reporter.report(1.6)
        reporter.report(1.7)
    assert [value for _, value, _ in mfu_points(reader)] == [1.7]
    assert len([record for record in caplog.records if "above 1" in record.getMessage()]) == 1


def test_metric_name_unit_and_attributes_through_the_apps_provider(
    provider: MeterProvider, reader: InMemoryMetricReader
) -> None:
    reporter = MfuReporter(
        "slurm-4242",
        job_name="llama-70b",
        precision="fp8",
        n_params=7e9,
        gpu_model=H100,
        meter_provider=provider,
        attributes={"team": "pretrain", names.JOB_ID: "not-this-one"},
    )
    value = reporter.step(tokens=10_000, seconds=1.0)
    assert mfu_points(reader) == [
        (
            {names.JOB_ID: "slurm-4242", names.JOB_NAME: "llama-70b", names.GPU_PRECISION: "fp8", "team": "pretrain"},
            value,
            names.JOB_MFU.unit,
        )
    ]
    assert names.JOB_MFU.unit == "1"


def test_job_name_is_absent_when_not_given(provider: MeterProvider, reader: InMemoryMetricReader) -> None:
    MfuReporter("j", meter_provider=provider).report(0.5)
    [(attributes, _, _)] = mfu_points(reader)
    assert attributes == {names.JOB_ID: "j", names.GPU_PRECISION: "bf16"}


def test_nothing_is_exported_before_the_first_value(provider: MeterProvider, reader: InMemoryMetricReader) -> None:
    MfuReporter("j", meter_provider=provider)
    assert mfu_points(reader) == []


def test_a_stale_value_goes_absent_instead_of_repeating(provider: MeterProvider, reader: InMemoryMetricReader) -> None:
    clock = FakeClock()
    reporter = MfuReporter("j", meter_provider=provider, stale_after_s=60.0, clock=clock)
    reporter.report(0.4)
    clock.now += 30.0
    assert [value for _, value, _ in mfu_points(reader)] == [0.4]
    clock.now += 31.0  # a hung job: its last MFU must not keep claiming busy GPUs
    assert mfu_points(reader) == []
    reporter.report(0.2)
    assert [value for _, value, _ in mfu_points(reader)] == [0.2]


def test_shutdown_stops_reporting_but_leaves_the_apps_provider_running(
    provider: MeterProvider, reader: InMemoryMetricReader
) -> None:
    with MfuReporter("j", meter_provider=provider) as reporter:
        reporter.report(0.3)
    assert [value for _, value, _ in mfu_points(reader)] == [0.3]  # the flush on the way out
    assert mfu_points(reader) == []
    with pytest.raises(RuntimeError, match="shut down"):
        reporter.report(0.3)
    # The app's provider still serves its other instruments.
    provider.get_meter("app").create_counter("app.steps").add(1)
    data = reader.get_metrics_data()
    assert data is not None
    assert [m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics] == ["app.steps"]


def test_own_provider_resource_names_the_service(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
    provider = otlp_meter_provider(exporter=ConsoleMetricExporter(out=io.StringIO()))
    try:
        resource = provider._sdk_config.resource
    finally:
        provider.shutdown()
    assert resource.attributes[names.SERVICE_NAME] == names.MFU_SERVICE_NAME
    assert resource.attributes["deployment.environment"] == "test"
    assert names.HOST_NAME not in resource.attributes  # a training process is not the node's producer

    def mfu_resource_service() -> object:
        return env_resource(default_service_name=names.MFU_SERVICE_NAME, with_host=False).attributes[names.SERVICE_NAME]

    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attributes")
    assert mfu_resource_service() == "from-attributes"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "trainer")
    assert mfu_resource_service() == "trainer"


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        ({}, "grpc"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, "http/protobuf"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "grpc"}, "grpc"),
        # As for ``otel-ofu run``: any case, surrounding blanks ignored.
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "GRPC"}, "grpc"),
        ({"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": " HTTP/Protobuf "}, "http/protobuf"),
    ],
)
def test_exporter_follows_the_standard_protocol_variables(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], expected: str
) -> None:
    for name in ("OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    exporter = otlp_metric_exporter()
    try:
        assert isinstance(exporter, OtlpMetricExporter)
        assert exporter.settings.protocol == expected
    finally:
        exporter.shutdown()


def test_unsupported_protocol_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
    with pytest.raises(ValueError, match="http/json"):
        otlp_metric_exporter()
