"""Goodput, hangs and flag events through the real processes: the hand-worked cases sent over OTLP/gRPC to
``otel-ofu collector``, whose outputs go to the real Collector build running the shipped event routing
(examples/events/otelcol-flag-events.yaml), which sends the metrics and the flag events on to a receiver on loopback.

The cases of tests/test_goodput.py on a faster clock: 2 s windows (a 60 s window of the hand-worked cases is 2 s here,
their 10 s readings a third of a second), 4 GPUs per job:

* a job hung in windows 2-4 of 5 (engine 0.99, SMs 0.02, nothing moving): job.hang 0, 0, 0, 1, 0; hang badput
  4 x 2 = 8 GPU-s in each of windows 2, 3 and 4 (24 in all, counted from the first hung window), job.gpus.idle never up;
* a memory-bound job (SMs 0.88, DRAM 0.70): job.hang 0 in every window, no hang badput, no event;
* a job that restarts: steps from 1 s (1/30 of the 30 s of the hand case), up to step 13 at 5 s; it resumes from step 7
  at 7 s: startup 4 x 1 = 4 GPU-s, rework of steps 8-13 (3 s to 5 s) 4 x 2 = 8, recovery (5 s to 7 s) 8;
* the flag events: the hang's rise (window 4) and fall (window 5), to Honeycomb's and Datadog's stand-ins, and its rise
  alone to the recovery webhook, as OTLP/JSON.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from otel_ofu import names
from otel_ofu.otlp_client import OtlpClient, OtlpSettings
from otel_ofu.testing.otlp_requests import set_attribute
from otel_ofu.testing.otlp_sink import OtlpSink, unused_port
from otel_ofu_collector.outputs.record_codec import load_records
from otel_ofu_collector.results import JobReport, WindowReport
from tests.collector_helpers import CollectorProcess
from tests.e2e.helpers import StartProcess, attributes, port_open
from tests.e2e.test_otelcol_topologies import telemetry_on, write_config
from tests.test_goodput import HEALTHY, HUNG, MEMORY_BOUND, Fleet, S, restarted_job

EVENTS_CONFIG = Path(__file__).resolve().parents[2] / "examples" / "events" / "otelcol-flag-events.yaml"
WINDOW_S = 2
SCALE = S * WINDOW_S // 60  # ns of a second of the hand-worked cases' 60 s windows
G = names.GoodputCause


def requests_of(points: Sequence[tuple[int, str, tuple[Any, ...]]]) -> list[ExportMetricsServiceRequest]:
    """The fleet's points as the producer and the MFU reporter send them: one request per reading time, a Resource per
    GPU with its identity, job.step and job.checkpoint.time with job.id on the point."""
    by_time: dict[int, ExportMetricsServiceRequest] = {}
    resources: dict[tuple[int, str], Any] = {}

    def gpu_scope(at: int, key: str, identity: Mapping[str, str]) -> Any:
        request = by_time.setdefault(at, ExportMetricsServiceRequest())
        if (at, key) not in resources:
            rm = request.resource_metrics.add()
            for name, value in {names.SERVICE_NAME: names.PRODUCER_SERVICE_NAME, **identity}.items():
                set_attribute(rm.resource.attributes, name, value)
            resources[at, key] = rm.scope_metrics.add()
        return resources[at, key]

    for at, method, args in points:
        if method == "add_ofu":
            key, value, start, end, identity = args
            point = gpu_scope(at, key, identity).metrics.add(name=names.GPU_OFU.name).gauge.data_points.add()
            point.as_double, point.start_time_unix_nano, point.time_unix_nano = value, start, end
        elif method == "add_gpu_inputs":
            key, start, end, identity, values, _throttle = args
            scope = gpu_scope(at, key, identity)
            for name, value in values.items():
                point = scope.metrics.add(name=name).gauge.data_points.add()
                point.as_double, point.start_time_unix_nano, point.time_unix_nano = value, start, end
        elif method == "add_gpu_counters":
            key, series_start, end, identity, counters = args
            scope = gpu_scope(at, key, identity)
            for field, value in counters.items():
                name, direction = field.split("|")
                metric = scope.metrics.add(name=name)
                metric.sum.aggregation_temporality = 2  # cumulative
                metric.sum.is_monotonic = True
                point = metric.sum.data_points.add(as_double=value, start_time_unix_nano=series_start)
                point.time_unix_nano = end
                set_attribute(point.attributes, names.NETWORK_IO_DIRECTION, direction)
        elif method == "add_progress":
            job_id, step, when, _identity = args  # a step point: the cases send no checkpoint time
            request = by_time.setdefault(at, ExportMetricsServiceRequest())
            metric = request.resource_metrics.add().scope_metrics.add().metrics.add(name=names.JOB_STEP.name)
            point = metric.gauge.data_points.add(as_int=int(step), time_unix_nano=when)
            set_attribute(point.attributes, names.JOB_ID, job_id)
        else:
            raise AssertionError(method)
    return [by_time[at] for at in sorted(by_time)]


def job_windows(reports: Sequence[WindowReport], job_id: str) -> list[JobReport]:
    return [job for report in sorted(reports, key=lambda r: r.end_ns) for job in report.jobs if job.job_id == job_id]


def badput(job: JobReport, cause: str) -> float:
    assert job.goodput is not None
    return job.goodput.badput_s.get(cause, 0.0)


def test_the_hand_worked_cases_through_the_collector_and_the_real_collector_build(
    otelcol_binary: Path, start_process: StartProcess, tmp_path: Path
) -> None:
    with OtlpSink.start() as sink:
        # The shipped event routing, every destination pointed at the receiver on loopback.
        port = unused_port()
        telemetry = unused_port()
        config = yaml.safe_load(EVENTS_CONFIG.read_text(encoding="utf-8"))
        telemetry_on(config, telemetry)
        base = f"http://127.0.0.1:{sink.http_port}"
        start_process(
            [
                "env",
                f"OTEL_OFU_EVENTS_LISTEN=127.0.0.1:{port}",
                f"HONEYCOMB_OTLP_ENDPOINT={base}",
                "HONEYCOMB_API_KEY=hc-key",
                f"DD_OTLP_LOGS_ENDPOINT={base}/v1/logs",
                "DD_API_KEY=dd-key",
                f"OTEL_OFU_RECOVERY_WEBHOOK={base}/v1/logs",
                f"OTEL_OFU_METRICS_BACKEND=127.0.0.1:{sink.grpc_port}",
                str(otelcol_binary),
                f"--config={write_config(config, tmp_path / 'events.yaml')}",
            ],
            "otelcol-events",
            lambda: port_open(port) and port_open(telemetry),
        )
        records = tmp_path / "windows.jsonl"
        collector = CollectorProcess.start(
            "--listen=127.0.0.1:0",
            f"--window={WINDOW_S}",
            "--lateness=1",
            f"--export-endpoint=http://127.0.0.1:{port}",
            f"--record-outputs={records}",
        )
        try:
            window_ns = WINDOW_S * S
            t0 = (time.time_ns() // window_ns + 2) * window_ns  # the first window wholly ahead: nothing is late
            fleet = restarted_job(Fleet(scale=SCALE, t0=t0))
            fleet.job("hung", [HEALTHY, HUNG, HUNG, HUNG, HEALTHY])
            fleet.job("memory", [MEMORY_BOUND] * 5)
            settings = OtlpSettings.resolve(
                protocol="grpc", endpoint=f"http://127.0.0.1:{collector.grpc_port}", environ={}
            )
            transport = OtlpClient(settings, "rejected")
            for request in requests_of(sorted(fleet.points, key=lambda p: p[0])):
                outcome = transport.send(request.SerializeToString())
                assert outcome.delivered, outcome.cause
                assert not outcome.rejected_points, outcome.rejection
            transport.close()
            end = t0 + 5 * window_ns

            def closed() -> list[WindowReport]:
                if not records.exists():
                    return []
                return [r for r in load_records(records).reports if r.end_ns <= end]

            deadline = time.monotonic() + 60
            while len({r.end_ns for r in closed() if r.jobs}) < 5 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert sink.wait_for(lambda s: len(s.log_records()) >= 5, timeout=30)
        finally:
            assert collector.terminate() == 0, "\n".join(collector.lines)
        reports = closed()

        hung = job_windows(reports, "hung")
        assert [w.flag(names.JOB_HANG) for w in hung] == [0, 0, 0, 1, 0]
        assert [badput(w, G.HANG) for w in hung] == [0.0, 8.0, 8.0, 8.0, 0.0]
        assert [w.flag(names.JOB_GPUS_IDLE) for w in hung] == [0] * 5

        memory = job_windows(reports, "memory")
        assert [w.flag(names.JOB_HANG) for w in memory] == [0] * 5
        assert sum(badput(w, G.HANG) for w in memory) == 0.0

        restarted = job_windows(reports, "restarted")
        assert sum(badput(w, G.STARTUP) for w in restarted) == approx(4.0)
        assert sum(badput(w, G.REWORK) for w in restarted) == approx(8.0)
        assert sum(badput(w, G.RECOVERY) for w in restarted) == approx(8.0)
        last = restarted[-1].goodput
        assert last is not None
        assert last.goodput == approx(0.5)  # (5 x 8 - 20) / 40
        assert last.basis == names.GoodputBasis.PROGRESS

        # The metrics reached the backend through the Collector: job.hang and job.badput by cause.
        assert {names.JOB_HANG.name, names.JOB_BADPUT.name, names.FLEET_GOODPUT.name} <= {
            metric.name for _rm, _sm, metric in sink.metrics()
        }

        # The flag events, by destination.
        with sink._cond:
            received = list(sink.logs_received)
        by_destination: dict[str, list[dict[str, Any]]] = {"honeycomb": [], "datadog": [], "webhook": []}
        for item in received:
            if "x-honeycomb-dataset" in item.metadata:
                where = "honeycomb"
            elif "dd-api-key" in item.metadata:
                where = "datadog"
            else:
                assert "json" in item.metadata.get("content-type", "")
                where = "webhook"
            for rl in item.request.resource_logs:
                assert attributes(rl.resource.attributes)[names.SERVICE_NAME] == names.COLLECTOR_SERVICE_NAME
                for sl in rl.scope_logs:
                    for record in sl.log_records:
                        by_destination[where].append(
                            {
                                **attributes(record.attributes),
                                "event_name": record.event_name,
                                "severity": record.severity_text,
                                "body": record.body.string_value,
                                "time": record.time_unix_nano,
                            }
                        )
        for where in ("honeycomb", "datadog"):
            events = by_destination[where]
            assert [(e[names.JOB_ID], e[names.EVENT_FLAG], e["event_name"]) for e in events] == [
                ("hung", names.JOB_HANG.name, names.FlagEventName.RAISED),
                ("hung", names.JOB_HANG.name, names.FlagEventName.CLEARED),
            ], where
            raised = events[0]
            assert raised["severity"] == "ERROR"
            assert raised["time"] == t0 + 4 * window_ns
            assert raised["body"].startswith("job hung: hang: every one of its 4 GPUs ran kernels with nothing moving")
            assert raised[names.JOB_BADPUT.name] == 8.0
            assert raised[names.GOODPUT_CAUSE] == G.HANG
        [webhook] = by_destination["webhook"]
        assert webhook[names.EVENT_FLAG] == names.JOB_HANG.name
        assert webhook[names.EVENT_FLAG_STATE] == names.FlagState.RAISED


def approx(value: float) -> Any:
    import pytest

    return pytest.approx(value, rel=1e-6)
