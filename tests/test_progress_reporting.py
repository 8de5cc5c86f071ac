"""Training progress as input: the MFU reporter's job.step and job.checkpoint.time, as the SDK exports them, read by
the collector's decoder into a job's goodput (a restart's rework counted from the step the reporter says it resumed
from)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint

from otel_ofu import names
from otel_ofu.mfu import MfuReporter
from otel_ofu_collector.aggregation.windows import Aggregator
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.otlp.decode import Decoder
from otel_ofu_collector.otlp.roles import INPUT_METRIC_NAMES

SAVE, LOAD = names.CheckpointOperation.SAVE, names.CheckpointOperation.LOAD


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


def points(reader: InMemoryMetricReader, name: str) -> list[NumberDataPoint]:
    data = reader.get_metrics_data()
    found: list[NumberDataPoint] = []
    for rm in data.resource_metrics if data is not None else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == name:
                    found += [p for p in metric.data.data_points if isinstance(p, NumberDataPoint)]
    return found


def test_the_reporter_says_the_last_step_and_the_checkpoint_seconds(
    provider: MeterProvider, reader: InMemoryMetricReader
) -> None:
    clock = FakeClock()
    reporter = MfuReporter("job-7", meter_provider=provider, clock=clock, stale_after_s=60.0)
    assert points(reader, names.JOB_STEP.name) == []  # nothing reported yet: absent, never 0
    assert points(reader, names.JOB_CHECKPOINT_TIME.name) == []
    reporter.report_step(120)
    with reporter.checkpoint(SAVE):
        clock.now += 12.5
    reporter.report_checkpoint(SAVE, 2.5)
    [step] = points(reader, names.JOB_STEP.name)
    assert step.value == 120
    assert dict(step.attributes or {})[names.JOB_ID] == "job-7"
    [saved] = points(reader, names.JOB_CHECKPOINT_TIME.name)
    assert saved.value == 15.0
    assert dict(saved.attributes or {})[names.CHECKPOINT_OPERATION] == SAVE
    assert saved.start_time_unix_nano
    assert saved.start_time_unix_nano < saved.time_unix_nano
    clock.now += 61.0
    assert points(reader, names.JOB_STEP.name) == []  # a job that stopped progressing goes absent


def test_a_checkpoint_load_names_the_step_the_job_resumes_from(provider: MeterProvider) -> None:
    reporter = MfuReporter("job-7", meter_provider=provider, clock=FakeClock())
    reporter.report_step(130)
    assert reporter.report_checkpoint(LOAD, 4.0, step=70) == 4.0
    assert reporter.last_step == 70
    assert reporter.checkpoint_seconds(LOAD) == 4.0


@pytest.mark.parametrize(
    ("call", "args"),
    [("report_step", (-1,)), ("report_step", (1.5,)), ("report_checkpoint", ("flush", 1.0))],
)
def test_bad_progress_is_refused_in_one_line(provider: MeterProvider, call: str, args: tuple[object, ...]) -> None:
    reporter = MfuReporter("job-7", meter_provider=provider)
    with pytest.raises(ValueError, match="must be"):
        getattr(reporter, call)(*args)


def test_the_collector_takes_progress_as_it_takes_mfu(provider: MeterProvider, reader: InMemoryMetricReader) -> None:
    """The reporter's points, encoded as the SDK exports them, through the decoder into the windows: job.step points
    and the checkpoint seconds' delta arrive in the job's window (nothing refused)."""
    assert {names.JOB_STEP.name, names.JOB_CHECKPOINT_TIME.name} <= INPUT_METRIC_NAMES  # never forwarded as foreign
    reporter = MfuReporter("job-7", meter_provider=provider, clock=FakeClock())
    reporter.report(0.4)
    reporter.report_step(10)
    reporter.report_checkpoint(SAVE, 3.0)
    data = reader.get_metrics_data()
    assert data is not None
    aggregator = Aggregator(AggregatorConfig(window_s=60.0, lateness_s=0.0))
    outcome = Decoder(aggregator).decode(encode_metrics(data))
    assert outcome.rejected == 0, outcome.error_message
    assert outcome.accepted == 3
    [window] = list(aggregator._windows.values())
    assert list(window.steps["job-7"].values()) == [10.0]
    assert window.checkpoints["job-7"] == pytest.approx(3.0)


def test_progress_points_without_a_job_or_an_operation_are_refused_by_reason(
    provider: MeterProvider, reader: InMemoryMetricReader
) -> None:
    reporter = MfuReporter("job-7", meter_provider=provider, clock=FakeClock())
    reporter.report_step(10)
    reporter.report_checkpoint(SAVE, 1.0)
    data = reader.get_metrics_data()
    assert data is not None
    request = encode_metrics(data)
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for point in (metric.gauge.data_points, metric.sum.data_points)[metric.name != names.JOB_STEP.name]:
                    kept = [kv for kv in point.attributes if kv.key not in (names.JOB_ID, names.CHECKPOINT_OPERATION)]
                    del point.attributes[:]
                    point.attributes.extend(kept)
    outcome = Decoder(Aggregator(AggregatorConfig())).decode(request)
    assert outcome.accepted == 0
    assert outcome.rejected == 2
    assert f"{names.JOB_STEP.name} without {names.JOB_ID}" in outcome.error_message


# --- from a training log ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "step", "checkpoint"),
    [
        ("[rank0] step 120 | loss 3.1 | MFU 32.5%", 120, None),
        (" iteration      100/    1000 | consumed samples: 3200 | elapsed time per iteration (ms): 812.3", 100, None),
        ("\x1b[31mstep: \x1b[39m 5  \x1b[32mloss:  9.1", 5, None),
        ("global_step 40 train.step 41 warmup steps: 2000", None, None),  # other counters
        ("Finished saving the checkpoint (or staging if async is enabled)in 5.23 seconds.", None, (SAVE, 5.23)),
        ("Finished loading the checkpoint in 2.11 seconds.", None, (LOAD, 2.11)),
        ("Loading the checkpoint from ./outputs/checkpoint/step-80.", 80, None),
        ("    save-checkpoint ................................: (3210.55, 3213.61)", None, (SAVE, 3.21361)),
        ("  load-checkpoint ...: (900.0, 1200.5)", None, (LOAD, 1.2005)),
        ("checkpoint saved in 800 ms at step 300", 300, (SAVE, 0.8)),
        (" successfully loaded checkpoint from /ckpt [ t 1/1, p 1/1 ] at iteration 80", 80, None),
        ("epoch 3 done", None, None),
    ],
)
def test_a_log_line_states_its_step_and_its_timed_checkpoint(
    line: str, step: int | None, checkpoint: tuple[str, float] | None
) -> None:
    from otel_ofu.mfu.progress_lines import parse_progress

    found = parse_progress(line)
    assert found.step == step
    if checkpoint is None:
        assert found.checkpoint is None
    else:
        assert found.checkpoint is not None
        assert found.checkpoint[0] == checkpoint[0]
        assert found.checkpoint[1] == pytest.approx(checkpoint[1])


def test_mfu_from_log_exports_the_steps_and_the_checkpoint_seconds(tmp_path: Path) -> None:
    """A log of a restart: steps 1-3, a 4 s save, step 4, then the job is back from its checkpoint at step 3 (a load
    of 2.5 s): job.step 3 (its last state) and 4 s of saving, 2.5 of loading, through real OTLP."""
    from otel_ofu import cli
    from otel_ofu.testing.otlp_sink import OtlpSink

    log = tmp_path / "train.log"
    log.write_text(
        "step 1 | MFU 30%\nstep 2 | MFU 31%\nstep 3 | MFU 30%\n"
        "Finished saving the checkpoint in 4.0 seconds.\nstep 4 | MFU 30%\n"
        "Loading the checkpoint from ./ckpt/step-3.\nFinished loading the checkpoint in 2.5 seconds.\n"
    )
    with OtlpSink.start() as sink:
        args = cli.build_parser().parse_args(
            [
                "mfu-from-log",
                "--file",
                str(log),
                "--job-id",
                "j",
                "--from-start",
                "--duration",
                "0",
                "--interval",
                "60",
                "--export-endpoint",
                sink.grpc_endpoint,
            ]
        )
        assert args.handler(args) == 0
        steps = [
            p.as_double or p.as_int for _rm, _sm, m in sink.metrics(names.JOB_STEP.name) for p in m.gauge.data_points
        ]
        seconds = {
            next(kv.value.string_value for kv in p.attributes if kv.key == names.CHECKPOINT_OPERATION): p.as_double
            for _rm, _sm, m in sink.metrics(names.JOB_CHECKPOINT_TIME.name)
            for p in m.sum.data_points
        }
    assert steps == [3]
    assert seconds == {SAVE: 4.0, LOAD: 2.5}
