"""What the collector tests share: the options of a collector a test drives by hand; loss inputs one by one;
``otel-ofu collector`` in its own process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from otel_ofu import names
from otel_ofu.testing.otlp_sink import OtlpSink
from otel_ofu_collector.aggregation import loss
from otel_ofu_collector.aggregation.windows import Aggregator
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.service import CollectorOptions

ROOT = Path(__file__).resolve().parent.parent


def collector_options(sink: OtlpSink | None, **overrides: Any) -> CollectorOptions:
    """60 s windows, no receiver, no timed flush (the test flushes), quick retries into ``sink`` if any."""
    settings: dict[str, Any] = {
        "aggregator": AggregatorConfig(window_s=60.0, lateness_s=10.0),
        "grpc_listen": None,
        "export_endpoint": sink.grpc_endpoint if sink else None,
        "flush_interval_s": 0.0,
        "initial_backoff_s": 0.01,
        "max_backoff_s": 0.05,
        "instance_id": "test-1",
    }
    settings.update(overrides)
    return CollectorOptions(**settings)


def add_gpu_input(
    aggregator: Aggregator,
    stream_key: str,
    metric: str,
    value: float,
    start_ns: int,
    end_ns: int,
    identity: Mapping[str, str],
    reason: str | None = None,
) -> str | None:
    """One loss-input point into the windows as the decoder groups it (a gpu.throttle share under its reason)."""
    if metric == names.GPU_THROTTLE.name:
        if reason is None:  # the decoder refuses a throttle share without its reason
            return names.RejectReason.BAD_ATTRIBUTE
        return aggregator.add_gpu_inputs(stream_key, start_ns, end_ns, identity, {}, {reason: value})
    if metric == names.GPU_ENERGY.name:  # a cumulative counter: start_ns is its series start
        return aggregator.add_gpu_counters(stream_key, start_ns, end_ns, identity, {metric: value})
    return aggregator.add_gpu_inputs(stream_key, start_ns, end_ns, identity, {metric: value}, {})


@attrs.frozen
class GpuLoss:
    """One GPU's split of 1 - OFU in one window, and its inputs to the job's sums."""

    ofu: float
    tensor_active: float  # T as used (O where T was not reported)
    idle: float
    clock: float
    tensor: float  # the coarse cause: 0 where the finer split applies
    seconds: float  # GPU-seconds in the window
    energy_j: float | None  # None: no energy counter nor power reading
    flops: float | None  # achieved FLOPs in the window (None where the dense peak is not known)
    price: float | None  # per GPU-hour, None: not priced
    no_kernel: float | None = None  # the finer split (None: no engine and SM activity)
    sm_idle: float | None = None
    non_tensor: float | None = None


def split_gpu(
    ofu: float,
    tensor_active: float | None,
    clock_ratio: float | None,
    *,
    seconds: float,
    engine_active: float | None = None,
    sm_active: float | None = None,
    energy_j: float | None = None,
    flops_per_s: float | None = None,
    price: float | None = None,
) -> GpuLoss:
    """One GPU's split, as the windows split each of a job's GPUs (``loss.split_columns`` of one GPU);
    ``clock_ratio`` is ``min(1, f / f_ref)`` or None."""
    split = loss.split_columns([ofu], [tensor_active], [clock_ratio], [engine_active], [sm_active])
    flops = None if flops_per_s is None else flops_per_s * seconds
    finer = split.finer is not None
    return GpuLoss(
        ofu,
        split.tensor_active[0],
        split.idle[0],
        split.clock[0],
        split.tensor[0],
        seconds,
        energy_j,
        flops,
        price,
        split.column(loss.NO_KERNEL)[0] if finer else None,
        split.column(loss.SM_IDLE)[0] if finer else None,
        split.column(loss.NON_TENSOR)[0] if finer else None,
    )


@attrs.define
class CollectorProcess:
    """``otel-ofu collector`` in its own process, its stderr read as it comes."""

    process: subprocess.Popen[str]
    lines: list[str] = attrs.field(factory=list)
    _reader: threading.Thread | None = None

    @classmethod
    def start(cls, *argv: str) -> CollectorProcess:
        env = {key: value for key, value in os.environ.items() if not key.startswith(("OTEL_EXPORTER", "OTEL_OFU"))}
        process = subprocess.Popen(
            [sys.executable, "-m", "otel_ofu.cli", "collector", *argv],
            cwd=ROOT,
            env=env,
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        started = cls(process)
        started._reader = threading.Thread(target=started._read, daemon=True)
        started._reader.start()
        return started

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, text: str, timeout_s: float = 30.0, between: Callable[[], object] | None = None) -> str:
        """The first stderr line holding ``text``; ``between`` runs while waiting (e.g. sends a request)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = [line for line in list(self.lines) if text in line]
            if found:
                return found[0]
            assert self.process.poll() is None, "\n".join(self.lines)
            if between is not None:
                between()
            time.sleep(0.05)
        raise AssertionError(f"no line with {text!r} in:\n" + "\n".join(self.lines))

    @property
    def grpc_port(self) -> int:
        ready = self.wait_for("otel-ofu collector ready")
        return int(ready.split("grpc 127.0.0.1:")[1].split()[0])

    def terminate(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=30)
        self._close()
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._close()

    def _close(self) -> None:
        if self._reader is not None:
            self._reader.join(timeout=10)
        if self.process.stderr is not None:
            self.process.stderr.close()


def self_metric(sink: OtlpSink, name: str) -> dict[str, int]:
    """The latest value of a self-metric counter the downstream received, by its attribute values joined with
    commas ('' unlabelled): the last collector run's, as each run counts from 0."""
    latest: dict[str, int] = {}
    for _rm, _sm, metric in sink.metrics(name):
        for point in metric.sum.data_points:
            latest[",".join(kv.value.string_value for kv in point.attributes)] = point.as_int
    return latest
