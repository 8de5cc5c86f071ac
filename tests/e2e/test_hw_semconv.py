"""The opt-in hw.* copies (collector/otelcol/hw-semconv-agent.yaml) in the real Collector: a producer's export of
the simulated fleet through the agent reaches the next hop with hw.energy and hw.power beside gpu.energy and
gpu.power, the same points (values, times, the GPU's resource with hw.type=gpu), and nothing else renamed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from otel_ofu import names
from otel_ofu.clock import ManualClock
from otel_ofu.producer.exporters import otlp_exporter
from otel_ofu.producer.loop import Producer
from otel_ofu.sources.simulated import SimulatedFleet
from otel_ofu.testing.otlp_sink import OtlpSink, unused_port
from tests.e2e.helpers import StartProcess, attributes
from tests.e2e.test_otelcol_topologies import Parts, load

S = 1_000_000_000


def test_the_agent_copies_gpu_energy_and_power_to_the_conventions_names(
    otelcol_binary: Path, start_process: StartProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_OFU_COLLECTOR_BEARER_TOKEN", "t")
    with OtlpSink.start() as sink:
        config = load("hw-semconv-agent.yaml")
        port = unused_port()
        config["receivers"]["otlp"]["protocols"] = {"grpc": {"endpoint": f"127.0.0.1:{port}"}}
        config["exporters"]["otlp/otel-ofu-collector"]["endpoint"] = f"127.0.0.1:{sink.grpc_port}"
        Parts(start_process, otelcol_binary, tmp_path).otelcol_process(config, "agent", port)
        clock = ManualClock(start_ns=1_800_000_000 * S)
        producer = Producer(source=SimulatedFleet.demo(seed=3, clock=clock), clock=clock)
        exporter = otlp_exporter(protocol="grpc", endpoint=f"http://127.0.0.1:{port}")
        for _ in range(2):  # the energy counter's first read has no delta: power from the second on
            clock.advance(10)
            assert exporter.export(producer.run_once()).name == "SUCCESS"
        exporter.shutdown()

        def points(name: str) -> dict[tuple[str, int], tuple[float, str]]:
            found = {}
            for rm, _sm, metric in sink.metrics(name):
                resource = attributes(rm.resource.attributes)
                data = metric.sum if metric.WhichOneof("data") == "sum" else metric.gauge
                for point in data.data_points:
                    value = point.as_double if point.WhichOneof("value") == "as_double" else float(point.as_int)
                    found[resource[names.HW_ID], point.time_unix_nano] = (value, resource[names.HW_TYPE])
            return found

        deadline = time.monotonic() + 60
        while not points("hw.power") and time.monotonic() < deadline:
            time.sleep(0.2)
        for ours, theirs in ((names.GPU_ENERGY.name, "hw.energy"), (names.GPU_POWER.name, "hw.power")):
            copied = points(theirs)
            assert copied, theirs
            assert copied == points(ours)
            assert {hw_type for _, hw_type in copied.values()} == {names.HW_TYPE_GPU}
        kinds = {metric.name: metric.WhichOneof("data") for _rm, _sm, metric in sink.metrics()}
        assert kinds["hw.energy"] == kinds[names.GPU_ENERGY.name] == "sum"
        assert kinds["hw.power"] == kinds[names.GPU_POWER.name] == "gauge"
        assert names.GPU_OFU.name in kinds  # the rest as sent
