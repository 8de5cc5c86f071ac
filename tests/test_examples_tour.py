"""The tour of examples/README.md end to end: run as written, top to bottom (the last tests here), and its
first stop in detail: the simulated fleet and the example training loop meet in the collector.

    otel-ofu run --source sim ----------- gpu.* (40 GPUs, jobs job-1001..1011) --+
                                                                                 +--OTLP gRPC--> CollectorService
    python examples/train_with_mfu.py --job-id job-1001 ---------- job.mfu ------+

Both clients are real processes on the wall clock, exactly as the README runs them; the collector is the real
service on 127.0.0.1:0 with 2 s windows, 1 s lateness and its own flush timer, and nothing from the test's
environment (``environ={}``, and the clients get no inherited ``OTEL_*``).

Why this is not flaky although the windows are wall-clock windows: nothing waits for a fixed time. The test
(1) waits until the collector has taken OFU points from the producer, so the producer is demonstrably running
before the trainer starts; (2) runs the trainer to completion (it flushes its last ``job.mfu`` on exit); then
(3) waits on a condition, fed by the report listener, until a closed window holds job-1001 with both OFU and
MFU. The producer keeps exporting every 0.5 s until then, so whichever window the trainer's points fall in,
that window also holds OFU from every simulated GPU, and it closes at most window + lateness + one flush tick
after the trainer's last point. Each wait has a generous bound (a slow CI machine gets seconds to spare); the
usual run takes about four seconds, most of it the two processes importing NumPy and the SDK.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from otel_ofu_collector.aggregation.windows import Aggregator
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.results import STATUS_NO_MFU, STATUS_OK, WindowReport
from otel_ofu_collector.service import CollectorOptions, CollectorService

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_with_mfu.py"
SIM_JOBS = tuple(f"job-{number}" for number in range(1001, 1010))
TRAINED_JOB = "job-1001"
# Bounded by --duration in case the test dies before it can stop the producer.
PRODUCER_ARGS = ("run", "--source", "sim", "--interval", "0.5", "--duration", "60")
# A given peak, not the example's measured one: measured on a busy machine (the producer and the collector
# share its cores here) the peak can come out low enough for a step to "beat" it several times over, which the
# reporter rightly refuses as MFU > 4. tests/test_train_example.py covers the measured peak on its own.
TRAINER_ARGS = (
    *("--steps", "60", "--batch", "64", "--dim", "128", "--hidden", "512"),
    *("--peak-flops", "1e12", "--job-id", TRAINED_JOB),
)
WAIT_BOUND_S = 30.0  # generous: the condition is usually met in a few seconds


class WindowLog:
    """The collector's closed windows, in order, with a condition to wait on."""

    def __init__(self) -> None:
        self._windows: list[WindowReport] = []
        self._changed = threading.Condition()

    def start(self) -> None:
        return None  # a list in memory: nothing to take or let go

    def shutdown(self) -> None:
        return None

    def consume_windows(self, reports: Sequence[WindowReport]) -> None:
        with self._changed:
            self._windows.extend(reports)
            self._changed.notify_all()

    def wait_for(self, predicate: Callable[[WindowReport], bool], timeout_s: float) -> WindowReport | None:
        """The first closed window that satisfies ``predicate``, waiting up to ``timeout_s`` for it."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                found = next((window for window in self._windows if predicate(window)), None)
                left = deadline - time.monotonic()
                if found is not None or left <= 0:
                    return found
                self._changed.wait(left)


def client_environment(endpoint: str) -> dict[str, str]:
    environment = {key: value for key, value in os.environ.items() if not key.startswith(("OTEL_", "OFU_"))}
    environment["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
    return environment


def otel_ofu_command(*args: str) -> list[str]:
    """``otel-ofu ARGS`` with this interpreter, so the test runs the package under test wherever it is installed."""
    return [sys.executable, "-c", "import sys; from otel_ofu.cli import main; sys.exit(main(sys.argv[1:]))", *args]


@pytest.fixture
def collector() -> Iterator[tuple[CollectorService, WindowLog]]:
    windows = WindowLog()
    options = CollectorOptions(
        aggregator=AggregatorConfig(window_s=2.0, lateness_s=1.0, stale_after_s=60.0),
        grpc_listen="127.0.0.1:0",
        flush_interval_s=0.2,
        pass_through=False,
        instance_id="tour",
    )
    service = CollectorService(options, consumers=[windows], environ={})
    service.start()
    try:
        yield service, windows
    finally:
        service.stop(grace=2.0)


def wait_for_ofu_points(service: CollectorService, producer: subprocess.Popen[str], timeout_s: float) -> None:
    aggregator = service.aggregator
    assert isinstance(aggregator, Aggregator)  # process mode, not the merge tier
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with service.decoder.lock:
            if aggregator.stats.points_ofu > 0:
                return
        assert producer.poll() is None, f"the producer exited early: {producer.communicate()[1]}"
        time.sleep(0.05)
    pytest.fail(f"no OFU point reached the collector within {timeout_s} s")


def stop(process: subprocess.Popen[str]) -> tuple[int, str]:
    """SIGTERM (the producer exports its last interval and exits 0), bounded; the exit code and stderr."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        _, stderr = process.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        _, stderr = process.communicate()
    return process.returncode, stderr


def has_both_values_for(job_id: str) -> Callable[[WindowReport], bool]:
    def check(window: WindowReport) -> bool:
        return any(job.job_id == job_id and job.ofu is not None and job.mfu is not None for job in window.jobs)

    return check


def test_training_mfu_joins_the_simulated_fleet_ofu_in_the_collector(
    collector: tuple[CollectorService, WindowLog],
) -> None:
    service, windows = collector
    endpoint = f"http://127.0.0.1:{service.ports['grpc']}"
    producer = subprocess.Popen(
        otel_ofu_command(*PRODUCER_ARGS, "--export-endpoint", endpoint),
        env=client_environment(endpoint),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_ofu_points(service, producer, WAIT_BOUND_S)
        trainer_env = client_environment(endpoint) | {"OTEL_METRIC_EXPORT_INTERVAL": "200"}
        trainer = subprocess.run(
            [sys.executable, str(EXAMPLE), *TRAINER_ARGS],
            env=trainer_env,
            capture_output=True,
            text=True,
            timeout=WAIT_BOUND_S,
            check=False,
        )
        assert trainer.returncode == 0, trainer.stderr
        window = windows.wait_for(has_both_values_for(TRAINED_JOB), WAIT_BOUND_S)
    finally:
        producer_rc, producer_err = stop(producer)
    assert producer_rc == 0, producer_err
    assert window is not None, f"no closed window held both OFU and MFU of {TRAINED_JOB}"

    jobs = {job.job_id: job for job in window.jobs}
    trained = jobs[TRAINED_JOB]
    assert trained.status == STATUS_OK
    # The simulated job's eight GPUs, in GPU equivalents on average over the window: eight where the fleet ran
    # all of it, fewer in the window it started in.
    assert 0 < trained.gpus <= 8
    assert trained.ofu is not None
    assert 0.3 < trained.ofu < 0.7  # the simulated dense job runs at ~0.48 tensor activity
    assert trained.mfu is not None
    assert trained.gap == pytest.approx(trained.mfu - trained.ofu)
    # The window's MFU is a mean of per-step MFUs the example printed (to the print's 0.1% rounding).
    printed = [float(value) / 100 for value in re.findall(r"\| MFU ([\d.]+)%", trainer.stdout)]
    assert len(printed) == 60
    assert min(printed) - 0.0005 <= trained.mfu <= max(printed) + 0.0005

    # The rest of the simulated fleet reports OFU only: no framework sends their MFU in this tour.
    for job_id in SIM_JOBS[1:]:
        assert jobs[job_id].ofu is not None, job_id
        assert jobs[job_id].mfu is None, job_id
        assert jobs[job_id].status == STATUS_NO_MFU, job_id
    assert jobs["job-1006"].ofu == 0.0  # the allocated but idle GPU: a measured zero, not a missing value
    # Every simulated GPU observed (the histograms count GPUs), less the flaky one when an outage of it happens to
    # cover the window; their GPU equivalents at most the 40 GPUs.
    assert sum(group.histogram.count for group in window.groups) in (39, 40)
    assert 0 < sum(group.gpus for group in window.groups) <= 40


def test_systemd_unit_passes_systemd_analyze_verify(tmp_path: Path, require: Callable[[bool, str], None]) -> None:
    """systemd's own parser reads the unit: a misspelt directive is only a warning to systemd, so the test
    fails on any complaint about the unit at all. ExecStart points at this environment's ``otel-ofu``, since
    verify also checks that the command exists."""
    analyze = shutil.which("systemd-analyze")
    require(analyze is not None, "systemd-analyze (Debian package systemd) is needed to verify the unit")
    assert analyze is not None
    executable = Path(sys.executable).with_name("otel-ofu")
    require(executable.exists(), f"the otel-ofu console script is not installed next to {sys.executable}")
    text = (ROOT / "examples" / "deploy" / "otel-ofu.service").read_text(encoding="utf-8")
    assert "ExecStart=/opt/otel-ofu/venv/bin/otel-ofu run" in text
    unit = tmp_path / "otel-ofu.service"
    unit.write_text(text.replace("/opt/otel-ofu/venv/bin/otel-ofu", str(executable)), encoding="utf-8")
    result = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60, check=False)
    complaints = [line for line in (result.stdout + result.stderr).splitlines() if unit.name in line]
    assert result.returncode == 0, result.stderr
    assert complaints == []


# --- the tour of examples/README.md as written, top to bottom -----------------------------------------

TOUR = ROOT / "examples" / "README.md"
FENCE = re.compile(r"^```(sh|text)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
# The ports the tour names, each given a free one here (other runs on this machine may hold the named ones).
TOUR_PORTS = ("4317", "4318", "4327", "4337", "9465")
TOUR_BOUND_S = 300  # the tour waits about 40 s of its own (the set-up, a window to close, 20 s of agent)


def tour_blocks() -> list[tuple[str, list[str]]]:
    """Each ``sh`` block of the tour with the lines of the ``text`` blocks that follow it (what it prints)."""
    blocks: list[tuple[str, list[str]]] = []
    for kind, body in FENCE.findall(TOUR.read_text(encoding="utf-8")):
        if kind == "sh":
            blocks.append((body, []))
        else:
            assert blocks, "a text block before any command"
            blocks[-1][1].extend(line for line in body.splitlines() if line.strip())
    return blocks


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for probe in sockets:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in sockets]
    finally:
        for probe in sockets:
            probe.close()


def pattern(line: str) -> re.Pattern[str]:
    """A documented output line as a regex: literal, except that ``...`` stands for anything."""
    return re.compile(".*".join(re.escape(part) for part in line.split("...")))


def test_the_tour_parses_into_commands_and_their_outputs() -> None:
    blocks = tour_blocks()
    assert len(blocks) >= 12
    assert blocks[0][0].startswith("otel-ofu collector --listen 127.0.0.1:4327")
    assert blocks[-1][0].strip().startswith("kill %2")  # the producer first: the collector still takes its last
    assert pattern("wrote /tmp/r.html (... windows, 6 jobs, flagged: ...b, c)").search(
        "wrote /tmp/r.html (12 windows, 6 jobs, flagged: a, b, c)"
    )
    assert not pattern("none flagged").search("wrote x (3 windows, 6 jobs, flagged: a)")


def test_the_tour_runs_top_to_bottom_exactly_as_written(tmp_path: Path, require: Callable[[bool, str], None]) -> None:
    """Every ``sh`` block in order in one bash, as a reader pastes them, with only the named ports and /tmp
    swapped for free ones; then every documented output line must have been printed after its command."""
    otelcol = ROOT / "build" / "otelcol" / "otelcol-ofu"
    require(otelcol.exists(), "build/otelcol/otelcol-ofu is not built (make otelcol)")
    require(shutil.which("promtool") is not None, "promtool (Debian package prometheus) is not installed")
    ports = dict(zip(TOUR_PORTS, (str(port) for port in free_ports(len(TOUR_PORTS))), strict=True))

    def here(text: str) -> str:
        text = re.sub(r"\b(" + "|".join(TOUR_PORTS) + r")\b", lambda m: ports[m.group(1)], text)
        return text.replace("/tmp/", f"{tmp_path}/")

    blocks = [(here(command), [here(line) for line in prints]) for command, prints in tour_blocks()]
    assert len(blocks) >= 12, "the tour's commands are its sh blocks"
    assert sum(len(prints) for _, prints in blocks) >= 12, "the tour's documented outputs are its text blocks"
    script = "set -e\n" + "".join(f"echo '@@tour {i}@@'\n{command}\n" for i, (command, _) in enumerate(blocks))
    (tmp_path / "tour.sh").write_text(script, encoding="utf-8")
    environment = {key: value for key, value in os.environ.items() if not key.startswith(("OTEL_", "OFU_"))}
    environment["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environment.get('PATH', '')}"
    environment["COLUMNS"] = "80"
    with (tmp_path / "tour.out").open("w", encoding="utf-8") as out:
        tour = subprocess.Popen(
            ["bash", str(tmp_path / "tour.sh")], cwd=ROOT, env=environment, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            code = tour.wait(timeout=TOUR_BOUND_S)
            # What the reader's jobs print as they stop shows in the reader's terminal too: wait for them.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    os.killpg(tour.pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
        finally:  # whatever the tour left running (it stops its own jobs when it gets to the end)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(tour.pid, signal.SIGKILL)
    output = (tmp_path / "tour.out").read_text(encoding="utf-8")
    assert code == 0, output[-4000:]
    # The clean-up stops the set-up's jobs without a warning: the producer's last interval reaches the collector.
    clean_up = output[output.index(f"@@tour {len(blocks) - 1}@@") :]
    assert " WARNING " not in clean_up, clean_up
    assert "Traceback" not in output
    for index, (command, prints) in enumerate(blocks):
        # What a command prints shows after it started (its background jobs may print a little later).
        after = output[output.index(f"@@tour {index}@@") :].splitlines()
        for line in prints:
            assert any(pattern(line).search(printed) for printed in after), (command, line, output[-4000:])
