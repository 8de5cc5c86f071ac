"""examples/train_with_mfu.py end to end: a real process exporting job.mfu to a real OTLP gRPC receiver."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from otel_ofu import names
from otel_ofu.mfu import MFU_MAX
from otel_ofu.testing.otlp_sink import OtlpSink

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_with_mfu.py"


def mfu_points(sink: OtlpSink) -> list[tuple[dict[str, Any], dict[str, Any], float, str]]:
    """(resource attributes, point attributes, value, unit) of every job.mfu point received."""
    points: list[tuple[dict[str, Any], dict[str, Any], float, str]] = []
    for request in sink.requests():
        for resource_metrics in request.resource_metrics:
            resource = {kv.key: kv.value.string_value for kv in resource_metrics.resource.attributes}
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    if metric.name != names.JOB_MFU.name:
                        continue
                    assert metric.WhichOneof("data") == "gauge"
                    for point in metric.gauge.data_points:
                        attributes = {kv.key: kv.value.string_value for kv in point.attributes}
                        points.append((resource, attributes, point.as_double, metric.unit))
    return points


def run_example(sink: OtlpSink, *args: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
    env.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=sink.grpc_endpoint,
        OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
        OTEL_SERVICE_NAME="numpy-trainer",
        OTEL_METRIC_EXPORT_INTERVAL="100",
    )
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("peak", [[], ["--peak-flops", "1e12"]], ids=["measured-peak", "given-peak"])
def test_example_reports_job_mfu_over_otlp(peak: list[str]) -> None:
    with OtlpSink.start() as sink:
        result = run_example(sink, "--steps", "5", "--job-id", "example-42", *peak)
        assert result.returncode == 0, result.stderr
        points = mfu_points(sink)  # the example flushes on exit: everything has arrived by now
    assert points, f"no job.mfu received; stderr: {result.stderr}"
    for resource, attributes, value, unit in points:
        assert resource[names.SERVICE_NAME] == "numpy-trainer"
        assert attributes == {names.JOB_ID: "example-42", names.JOB_NAME: "numpy-mlp", names.GPU_PRECISION: "fp64"}
        assert unit == "1"
        assert 0.0 < value <= MFU_MAX
    printed = [float(m) / 100 for m in re.findall(r"\| MFU ([\d.]+)%", result.stdout)]
    assert len(printed) == 5
    # The last point exported is the last step's MFU, as printed (to the print's rounding).
    assert points[-1][2] == pytest.approx(printed[-1], abs=0.0005)
