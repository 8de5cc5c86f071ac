"""Goodput and hangs, worked by hand: a hung job flagged and its time hang badput, busy jobs never flagged, a
restart's rework and recovery, checkpoint time, and the same through a merge tier as in one collector.

Every case: 60 s windows, 4 GPUs reporting every 10 s. The numbers are the arithmetic in each docstring, never the
code's output.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from otel_ofu import names
from otel_ofu_collector.aggregation.goodput import Progress, counter_badput
from otel_ofu_collector.aggregation.merge import MergeAggregator
from otel_ofu_collector.aggregation.windows import Aggregator
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.otlp.encode import encode_request, reports_to_metrics_data
from otel_ofu_collector.otlp.partials import partials_from_request
from otel_ofu_collector.results import JobReport, WindowReport

S = 1_000_000_000
W = 60 * S
T0 = 30_000_000 * W  # a window boundary
G = names.GoodputCause
CONFIG = AggregatorConfig(window_s=60.0, lateness_s=10.0)

# Window means of what a GPU does, as the producer reports them.
HEALTHY = {"ofu": 0.40, "tensor": 0.45, "engine": 0.97, "sm": 0.85, "dram": 0.35, "nvlink": 60e9}
HUNG = {"ofu": 0.0, "tensor": 0.0, "engine": 0.99, "sm": 0.02, "dram": 0.0, "nvlink": 0.0}
IDLE = {"ofu": 0.0, "tensor": 0.0, "engine": 0.0, "sm": 0.0, "dram": 0.0, "nvlink": 0.0}
MEMORY_BOUND = {"ofu": 0.15, "tensor": 0.16, "engine": 0.96, "sm": 0.88, "dram": 0.70, "nvlink": 40e9}
COMMUNICATION_BOUND = {"ofu": 0.18, "tensor": 0.20, "engine": 0.96, "sm": 0.80, "dram": 0.22, "nvlink": 330e9}
# A job stalled by its input pipeline: the engine waits on the data loader (no kernel), SMs and memory quiet.
INPUT_STALLED = {"ofu": 0.0, "tensor": 0.0, "engine": 0.3, "sm": 0.02, "dram": 0.0, "nvlink": 0.0}


@attrs.define
class Fleet:
    """Points as the producer and the training side send them, fed to any number of aggregators. Times are given in
    seconds of a 60 s window; ``scale`` ns make one of them (a faster clock for a test through a real process) from
    ``t0``."""

    points: list[tuple[int, str, tuple[object, ...]]] = attrs.field(factory=list)  # (time, method, args)
    scale: int = S
    t0: int = T0
    _links: dict[str, float] = attrs.field(factory=dict)  # a GPU's NVLink counter, bytes each way

    def at(self, t_s: float) -> int:
        return self.t0 + round(t_s * self.scale)

    def gpu(self, job: str, gpu: int, start_s: float, end_s: float, means: Mapping[str, float]) -> None:
        """One GPU of ``job`` over (start, end], every 10 s, doing ``means``."""
        key = f"{job}-{gpu}"
        identity = {
            names.HOST_NAME: f"host-{job}",
            names.HW_ID: f"GPU-{key}",
            names.JOB_ID: job,
            names.HW_MODEL: "NVIDIA H100 80GB HBM3",
            names.GPU_PRECISION: "bf16",
        }
        t = start_s
        while t < end_s:
            start, end = self.at(t), self.at(t + 10)
            values = {
                names.GPU_TENSOR_ACTIVE.name: means["tensor"],
                names.GPU_ENGINE_ACTIVE.name: means["engine"],
                names.GPU_SM_ACTIVE.name: means["sm"],
                names.GPU_DRAM_ACTIVE.name: means["dram"],
            }
            self.points.append((end, "add_ofu", (key, means["ofu"], start, end, identity)))
            self.points.append((end, "add_gpu_inputs", (key, start, end, identity, values, {})))
            self._links[key] = self._links.get(key, 0.0) + means["nvlink"] * (end - start) / S  # bytes/s as given
            link = self._links[key]
            counters = {f"{names.GPU_NVLINK_IO.name}|{d}": link for d in names.IoDirection.ALL}
            self.points.append((end, "add_gpu_counters", (key, self.t0, end, identity, counters)))
            t += 10

    def job(self, job: str, windows: Sequence[Mapping[str, float]], gpus: int = 4) -> None:
        """``job`` on ``gpus`` GPUs, window after window doing each of ``windows``."""
        for index, means in enumerate(windows):
            for gpu in range(gpus):
                self.gpu(job, gpu, index * 60, index * 60 + 60, means)

    def step(self, job: str, at_s: float, step: int) -> None:
        args: tuple[object, ...] = (job, float(step), self.at(at_s), {})
        self.points.append((self.at(at_s), "add_progress", args))

    def checkpoint(self, job: str, operation: str, series_start_s: float, at_s: float, seconds: float) -> None:
        at = self.at(at_s)
        args: tuple[object, ...] = (job, seconds * self.scale / S, at, {}, operation, self.at(series_start_s))
        self.points.append((at, "add_progress", args))

    def run(self, aggregator: Aggregator | None = None, until_s: float = 300.0) -> list[WindowReport]:
        """Every point into ``aggregator`` in time order, the windows closed as a collector's flush would."""
        aggregator = aggregator or Aggregator(CONFIG)
        reports: list[WindowReport] = []
        for at, method, args in sorted(self.points, key=lambda p: p[0]):
            refused = getattr(aggregator, method)(*args)
            assert refused is None, (method, args, refused)
            reports += aggregator.flush(at)
        reports += aggregator.flush(T0 + round(until_s * S) + CONFIG.lateness_ns)
        return reports


def job_windows(reports: Sequence[WindowReport], job_id: str) -> list[JobReport]:
    return [job for report in reports for job in report.jobs if job.job_id == job_id]


def badput(job: JobReport) -> dict[str, float]:
    assert job.goodput is not None
    return dict(job.goodput.badput_s)


# --- the counters: a hang, busy jobs, an idle allocation --------------------------------------------------------------


def test_a_hung_job_is_flagged_after_the_hang_windows_and_its_time_is_hang_badput_from_the_first() -> None:
    """4 GPUs, healthy in window 1, hung (engine 0.99, SM 0.02, no tensor, DRAM or NVLink traffic) in windows 2-4,
    healthy in window 5. Flag (3 windows): 0, 0, 0, 1 (rises in window 4), 0 (falls in window 5). Hang badput: 4 x 60
    = 240 GPU-s in each of windows 2, 3 and 4 (counted from the first hung window, not only once the flag is up):
    720 in all. Over the job: (5 x 240 - 720) / 1200 = 0.4 goodput, on the counters' basis."""
    fleet = Fleet()
    fleet.job("hung", [HEALTHY, HUNG, HUNG, HUNG, HEALTHY])
    windows = job_windows(fleet.run(), "hung")
    assert [w.flag(names.JOB_HANG) for w in windows] == [0, 0, 0, 1, 0]
    assert [badput(w)[G.HANG] for w in windows] == [0.0, 240.0, 240.0, 240.0, 0.0]
    assert [w.flag_changes.get(names.JOB_HANG.name) for w in windows] == [None, None, None, True, False]
    last = windows[-1].goodput
    assert last is not None
    assert last.goodput == pytest.approx(0.4)
    assert last.basis == names.GoodputBasis.COUNTERS
    assert set(last.badput_s) == {G.IDLE, G.HANG, G.CHECKPOINT}  # no progress input: no progress causes


def test_a_hung_job_is_not_an_idle_allocation() -> None:
    """The hung GPUs have no tensor activity all window, as idle ones do; but they run kernels. job.gpus.idle stays 0
    in every window (idle would count 4 GPUs from the third idle window), and none of their time is idle badput."""
    fleet = Fleet()
    fleet.job("hung", [HUNG] * 4)
    windows = job_windows(fleet.run(until_s=240), "hung")
    assert [w.flag(names.JOB_GPUS_IDLE) for w in windows] == [0, 0, 0, 0]
    assert [badput(w)[G.IDLE] for w in windows] == [0.0] * 4
    assert [w.flag(names.JOB_HANG) for w in windows] == [0, 0, 1, 1]


def test_an_idle_allocation_is_idle_not_hung() -> None:
    """Engine 0 (no kernel): idle, flagged after 3 windows with its 4 GPUs; never hung (judged and moving: 0, not
    absent); 240 GPU-s of idle badput a window."""
    fleet = Fleet()
    fleet.job("idle", [IDLE] * 3)
    windows = job_windows(fleet.run(until_s=180), "idle")
    assert [w.flag(names.JOB_GPUS_IDLE) for w in windows] == [0, 0, 4]
    assert [w.flag(names.JOB_HANG) for w in windows] == [0, 0, 0]
    assert [badput(w)[G.IDLE] for w in windows] == [240.0] * 3
    assert windows[-1].goodput is not None
    assert windows[-1].goodput.goodput == 0.0


@pytest.mark.parametrize("means", [MEMORY_BOUND, COMMUNICATION_BOUND, INPUT_STALLED], ids=["memory", "comm", "input"])
def test_a_busy_or_waiting_job_is_never_hung(means: Mapping[str, float]) -> None:
    """A memory-bound job (SMs 0.88, DRAM 0.70), a communication-bound one (NVLink 330 GB/s) and one waiting on its
    input pipeline (engine 0.3: no kernel most of the time) for 5 windows: job.hang 0 in every window, no hang
    badput."""
    fleet = Fleet()
    fleet.job("busy", [means] * 5)
    windows = job_windows(fleet.run(), "busy")
    assert [w.flag(names.JOB_HANG) for w in windows] == [0] * 5
    assert sum(badput(w)[G.HANG] for w in windows) == 0.0


def test_a_job_without_engine_and_sm_activity_has_no_hang_verdict() -> None:
    """GPUs that send only gpu.ofu with zero tensor work cannot be judged: job.hang is absent, not 0."""
    aggregator = Aggregator(CONFIG)
    identity = {names.HW_ID: "GPU-x", names.JOB_ID: "plain", names.HOST_NAME: "h"}
    for tick in range(6):
        aggregator.add_ofu("x", 0.0, T0 + tick * 10 * S, T0 + (tick + 1) * 10 * S, identity)
    [report] = aggregator.flush(T0 + W + CONFIG.lateness_ns)
    [job] = report.jobs
    assert job.flag(names.JOB_HANG) is None
    assert names.JOB_HANG.name in job.flags


# --- progress: startup, a restart's rework and recovery, checkpoints --------------------------------------------------


def restarted_job(fleet: Fleet | None = None) -> Fleet:
    """4 healthy GPUs for 5 windows (0-300 s). Steps: 1 at 30 s, then one every 10 s to 13 at 150 s; a checkpoint at
    step 7 (90 s); the job dies after 150 s and its GPUs stay allocated; it resumes from step 7, which its reporter says
    at 210 s, then 8 at 220 s ... 15 at 290 s."""
    fleet = fleet if fleet is not None else Fleet()
    fleet.job("restarted", [HEALTHY] * 5)
    for step in range(1, 14):
        fleet.step("restarted", 20 + 10 * step, step)
    for step in range(7, 16):
        fleet.step("restarted", 210 + 10 * (step - 7), step)
    return fleet


def test_a_restart_books_startup_rework_and_recovery_exactly() -> None:
    """Productive time is 4 GPU-s per second throughout (no counter badput). Startup: 0-30 s, 4 x 30 = 120 GPU-s,
    booked in window 1. Rework: steps 8-13 done the first time from 90 s to 150 s, 4 x 60 = 240. Recovery: from the last
    progress (step 13 at 150 s) to the restart's step point (210 s), 4 x 60 = 240. Both booked in window 4, where the
    restart shows. Over the job: (1200 - 600) / 1200 = 0.5; the FLOP view at OFU 0.4: (480 - 0.4 x 600) / 1200 = 0.2."""
    windows = job_windows(restarted_job().run(), "restarted")
    assert [badput(w)[G.STARTUP] for w in windows] == [120.0, 0.0, 0.0, 0.0, 0.0]
    assert [badput(w)[G.REWORK] for w in windows] == [0.0, 0.0, 0.0, pytest.approx(240.0), 0.0]
    assert [badput(w)[G.RECOVERY] for w in windows] == [0.0, 0.0, 0.0, pytest.approx(240.0), 0.0]
    last = windows[-1].goodput
    assert last is not None
    assert last.basis == names.GoodputBasis.PROGRESS
    assert last.goodput == pytest.approx(0.5)
    assert last.goodput_flops == pytest.approx(0.2)
    first = windows[0].goodput
    assert first is not None
    assert first.goodput == pytest.approx(0.5)


def test_checkpoint_time_is_badput_over_the_jobs_gpus() -> None:
    """The framework reports 0 s of saving at 60 s and 30 s at 120 s (series from 0 s): a 30 s save in window 2,
    4 x 30 = 120 GPU-s of checkpoint badput there; a load of 6 s reported in window 3 (its own series): 24."""
    fleet = Fleet()
    fleet.job("saver", [HEALTHY] * 3)
    fleet.checkpoint("saver", names.CheckpointOperation.SAVE, 0, 60, 0.0)
    fleet.checkpoint("saver", names.CheckpointOperation.SAVE, 0, 120, 30.0)
    fleet.checkpoint("saver", names.CheckpointOperation.LOAD, 125, 130, 6.0)
    windows = job_windows(fleet.run(until_s=180), "saver")
    assert [badput(w)[G.CHECKPOINT] for w in windows] == [0.0, pytest.approx(120.0), pytest.approx(24.0)]


def test_a_checkpoint_reading_that_goes_back_is_refused() -> None:
    aggregator = Aggregator(CONFIG)
    save = names.CheckpointOperation.SAVE
    assert aggregator.add_progress("j", 10.0, T0 + 30 * S, {}, save, T0) is None
    assert aggregator.add_progress("j", 4.0, T0 + 40 * S, {}, save, T0) == names.RejectReason.IMPLAUSIBLE
    # more checkpoint seconds than passed since the last reading: a unit mistake
    assert aggregator.add_progress("j", 100.0, T0 + 50 * S, {}, save, T0) == names.RejectReason.IMPLAUSIBLE


def test_counter_badput_takes_each_second_once_by_precedence() -> None:
    """240 GPU-s in a 60 s window (4 GPUs): a 45 s checkpoint takes 180, idle GPUs' 240 get the 60 left."""
    assert counter_badput(240.0, False, 45.0, 60.0, 240.0) == {G.IDLE: 60.0, G.HANG: 0.0, G.CHECKPOINT: 180.0}
    assert counter_badput(240.0, True, 45.0, 60.0, 240.0) == {G.IDLE: 0.0, G.HANG: 240.0, G.CHECKPOINT: 0.0}


def test_progress_marks_interpolate_and_thin() -> None:
    progress = Progress()
    progress.add(10, 0.0, 0.0)
    progress.add(20, 100.0, 40.0)
    assert progress.at(15) == (50.0, 20.0)
    assert progress.at(5) == (0.0, 0.0)  # before the first step point: nothing
    for step in range(21, 21 + 200):
        progress.add(step, 100.0 + step, 0.0)
    assert len(progress.steps) <= 128
    assert progress.steps[-1] == 220
    assert progress.at(220) == (320.0, 0.0)


# --- through a merge tier ---------------------------------------------------------------------------------------------


def merged(fleet: Fleet, shard_of: dict[str, int], until_s: float = 300.0) -> list[WindowReport]:
    """The fleet on two shards (each point by ``shard_of`` its first argument, a GPU's stream key or a job.id), their
    windows over OTLP partials into a merge tier, as ``--mode shard`` and ``--mode merge`` run them."""
    shards = [Aggregator(attrs.evolve(CONFIG, partials=True)) for _ in range(2)]
    reports: list[list[WindowReport]] = [[], []]
    for at, method, args in sorted(fleet.points, key=lambda p: p[0]):
        index = shard_of[str(args[0])]
        assert getattr(shards[index], method)(*args) is None
        reports[index] += shards[index].flush(at)
    for index, shard in enumerate(shards):
        reports[index] += shard.flush(T0 + round(until_s * S) + CONFIG.lateness_ns)
    merge = MergeAggregator(CONFIG)
    for index, shard_reports in enumerate(reports):
        data = reports_to_metrics_data(
            shard_reports, resource_attributes={names.SERVICE_INSTANCE_ID: f"shard-{index}"}, include_partials=True
        )
        request = ExportMetricsServiceRequest.FromString(encode_request(data))
        for partial in partials_from_request(request):
            assert merge.add_partial(partial) is None
    return merge.flush(T0 + round(until_s * S) + CONFIG.lateness_ns)


def test_goodput_and_hang_through_the_merge_tier_equal_one_collector() -> None:
    """The hung job and the restarted one, each split over two shards (GPUs 0-1 on one, 2-3 and the step points on the
    other: a load balancer's ring change), merged: the same flags, badput and goodput as one collector."""
    fleet = restarted_job()
    fleet.job("hung", [HEALTHY, HUNG, HUNG, HUNG, HEALTHY])
    fleet.checkpoint("restarted", names.CheckpointOperation.LOAD, 200, 210, 5.0)
    single = fleet.run()
    shard_of = {f"{job}-{gpu}": int(gpu >= 2) for job in ("hung", "restarted") for gpu in range(4)}
    shard_of |= {"restarted": 1, "hung": 0}
    together = merged(fleet, shard_of)
    for job_id in ("hung", "restarted"):
        one = job_windows(single, job_id)
        two = job_windows(together, job_id)
        assert [w.flags for w in two] == [w.flags for w in one]
        assert [w.flag_changes for w in two] == [w.flag_changes for w in one]
        for a, b in zip(one, two, strict=True):
            assert a.goodput is not None
            assert b.goodput is not None
            assert b.goodput.basis == a.goodput.basis
            assert b.goodput.badput_s == pytest.approx(a.goodput.badput_s)
            assert b.goodput.goodput == pytest.approx(a.goodput.goodput)
            assert b.goodput.goodput_flops == pytest.approx(a.goodput.goodput_flops)
    fleet_single = [r.fleet.goodput.goodput if r.fleet.goodput else None for r in single]
    fleet_merged = [r.fleet.goodput.goodput if r.fleet.goodput else None for r in together]
    assert fleet_merged == pytest.approx(fleet_single)


def test_a_relaunch_is_recovery_not_a_regression() -> None:
    """7 healthy windows (steps every 10 s: a baseline of OFU 0.40 from window 2 on, window 1 being its startup), the
    job dies at 420 s (window 8 idle), and comes back in window 9 at a quarter of its OFU (0.10, under half its
    baseline) as its reporter says it resumed at step 30 (it had reached 41). Window 9 books the recovery, and the
    regression flag keeps its value (0, as in windows 7 and 8) where a slower job's would rise: a relaunch is recovery,
    which goodput counts, not a regression."""
    fleet = Fleet()
    slow = {**HEALTHY, "ofu": 0.10, "tensor": 0.11}
    fleet.job("relaunched", [HEALTHY] * 7 + [IDLE] + [slow])
    for step in range(1, 42):
        fleet.step("relaunched", 10 * step, step)
    fleet.step("relaunched", 510, 30)
    windows = job_windows(fleet.run(until_s=540), "relaunched")
    assert [w.flag(names.JOB_OFU_REGRESSION) for w in windows][6:] == [0, 0, 0]
    assert badput(windows[8])[G.RECOVERY] > 0.0
    assert badput(windows[8])[G.REWORK] > 0.0
