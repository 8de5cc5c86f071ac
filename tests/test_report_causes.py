"""Where the tensor pipes' time went, in the reports: the finer causes summed over a run, each job's context (DRAM,
NVLink, PCIe) weighted by its GPU time, and the one sentence that names a job's bottleneck only where it stands out.

Every case is one or two windows of a job whose shares were chosen by hand; the expected figures are worked in the
comments."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from otel_ofu import names
from otel_ofu_collector.report.causes import Kind, bottleneck_of
from otel_ofu_collector.report.html_page import build_report
from otel_ofu_collector.report.plots import LOSS_COLOURS
from otel_ofu_collector.report.summary import CAUSE_WORDS, CAUSES, JobSummary, JobWindow, summarize
from otel_ofu_collector.report.terminal import print_report
from otel_ofu_collector.results import FleetLoss, FleetReport, JobLoss, JobReport, WindowReport
from otel_ofu_collector.stats.comoments import CoMoments

C = names.OfuLossCause
S = 1_000_000_000
T0 = 1_800_000_000 * S
WINDOW = 60 * S
GPU_TIME = 600.0  # 10 GPUs for a 60 s window


def _loss(
    shares: dict[str, float],
    *,
    gpu_time_s: float = GPU_TIME,
    dram: float | None = None,
    nvlink: float | None = None,
    pcie: float | None = None,
) -> JobLoss:
    return JobLoss(
        gpu_time_s=gpu_time_s,
        shares=shares,
        lost_s={cause: share * gpu_time_s for cause, share in shares.items()},
        dram_active=dram,
        nvlink_bytes_per_s=nvlink,
        pcie_bytes_per_s=pcie,
    )


def _job(*losses: JobLoss, ofu: float = 0.2) -> JobSummary:
    windows = tuple(
        JobWindow(T0 + i * WINDOW, T0 + (i + 1) * WINDOW, ofu, None, None, frozenset(), 10.0, loss)
        for i, loss in enumerate(losses)
    )
    return JobSummary("job-1", {names.JOB_NAME: "trainer"}, windows)


def _finer(no_kernel: float, sm_idle: float, non_tensor: float, clock: float = 0.01) -> dict[str, float]:
    return {C.IDLE: 0.0, C.CLOCK: clock, C.NO_KERNEL: no_kernel, C.SM_IDLE: sm_idle, C.NON_TENSOR: non_tensor}


# A healthy dense training step: OFU 0.40, clock 0.01, no kernel 0.06, SMs empty 0.12, off the tensor pipes 0.41
# (its biggest finer cause, as in every healthy training), DRAM a third busy, a gradient all-reduce's 116 GB/s.
HEALTHY = _finer(0.06, 0.12, 0.41)


def test_the_finer_causes_count_in_the_runs_shares() -> None:
    # OFU = 1 - 0.01 - 0.06 - 0.12 - 0.41 = 0.40; tensor folded = 0.06 + 0.12 + 0.41 = 0.59.
    job = _job(_loss(HEALTHY, dram=0.34, nvlink=116e9))
    shares = job.loss.shares
    assert shares is not None
    assert shares["ofu"] == pytest.approx(0.40)
    assert shares[C.NON_TENSOR] == pytest.approx(0.41)
    assert job.loss.causes == (C.IDLE, C.CLOCK, C.NO_KERNEL, C.SM_IDLE, C.NON_TENSOR)


def test_every_cause_has_words_and_a_colour() -> None:
    assert set(CAUSES) == set(C.ALL)
    assert set(CAUSE_WORDS) == set(C.ALL)
    assert set(C.ALL) <= set(LOSS_COLOURS)


def test_context_is_weighted_by_each_windows_gpu_time() -> None:
    # 600 GPU-s at DRAM 0.80 and 200 GPU-s at 0.00: (480 + 0) / 800 = 0.60; NVLink only in the first: 500 GB/s;
    # PCIe in neither: absent, never 0.
    job = _job(
        _loss(HEALTHY, dram=0.80, nvlink=500e9),
        _loss(HEALTHY, gpu_time_s=200.0, dram=0.0),
    )
    assert job.loss.dram_active == pytest.approx(0.60)
    assert job.loss.nvlink_bytes_per_s == pytest.approx(500e9)
    assert job.loss.pcie_bytes_per_s is None


def test_a_healthy_training_gets_no_bottleneck() -> None:
    assert bottleneck_of(_job(_loss(HEALTHY, dram=0.34, nvlink=116e9, pcie=0.6e9))) is None


def test_memory_bound_kernels_are_named_by_dram() -> None:
    # 0.71 of GPU time off the tensor pipes, DRAM 0.70 busy.
    found = bottleneck_of(_job(_loss(_finer(0.04, 0.08, 0.71), dram=0.70, nvlink=80e9)))
    assert found is not None
    assert (found.kind, found.cause) == (Kind.MEMORY, C.NON_TENSOR)
    assert found.share == pytest.approx(0.71)
    assert found.sentence == (
        "71.0% of GPU time the SMs were busy off the tensor pipes; DRAM 70.0% busy: memory-bound kernels"
    )


def test_exposed_communication_is_named_by_nvlink_with_dram_quiet() -> None:
    found = bottleneck_of(_job(_loss(_finer(0.07, 0.15, 0.58), dram=0.21, nvlink=637e9, pcie=0.6e9)))
    assert found is not None
    assert found.kind == Kind.COMMUNICATION
    assert "DRAM 21.0% busy, NVLink 637 GB/s, PCIe 0.6 GB/s: communication-bound" in found.sentence


def test_communication_over_pcie_on_a_board_without_nvlink() -> None:
    found = bottleneck_of(_job(_loss(_finer(0.05, 0.10, 0.60), dram=0.20, pcie=50e9)))
    assert found is not None
    assert found.kind == Kind.COMMUNICATION


def test_sms_busy_off_the_tensor_pipes_with_nothing_else_busy_names_nothing() -> None:
    # 0.58 stands out, but DRAM 0.30 and 100 GB/s of NVLink do not say what the SMs were doing.
    assert bottleneck_of(_job(_loss(_finer(0.05, 0.10, 0.58), dram=0.30, nvlink=100e9))) is None
    # Nor do counters that were never reported.
    assert bottleneck_of(_job(_loss(_finer(0.05, 0.10, 0.58)))) is None


def test_a_stalled_input_pipeline_is_the_host_side() -> None:
    found = bottleneck_of(_job(_loss(_finer(0.44, 0.07, 0.21), dram=0.20, nvlink=70e9, pcie=6e9)))
    assert found is not None
    assert (found.kind, found.cause) == (Kind.HOST, C.NO_KERNEL)
    assert found.sentence.startswith("44.0% of GPU time no kernel ran; PCIe 6.0 GB/s: the host side")


def test_the_biggest_cause_that_stands_out_is_the_one_named() -> None:
    # no_kernel 0.30 and non_tensor 0.52 both past their bars: with DRAM busy, the bigger (memory) is named;
    # without context non_tensor names nothing, so the host side is.
    both = _finer(0.30, 0.02, 0.52)
    with_dram = bottleneck_of(_job(_loss(both, dram=0.60)))
    assert with_dram is not None
    assert with_dram.kind == Kind.MEMORY
    without = bottleneck_of(_job(_loss(both)))
    assert without is not None
    assert without.kind == Kind.HOST


def test_kernels_too_small_to_fill_the_sms() -> None:
    found = bottleneck_of(_job(_loss(_finer(0.05, 0.55, 0.20), dram=0.2)))
    assert found is not None
    assert found.kind == Kind.SM_IDLE
    assert bottleneck_of(_job(_loss(_finer(0.05, 0.45, 0.30), dram=0.2))) is None


def test_a_job_without_the_finer_split_is_never_named() -> None:
    # Tensor pipes idle 0.90 of the time, but the source gave no engine or SM activity to say why.
    assert bottleneck_of(_job(_loss({C.IDLE: 0.0, C.CLOCK: 0.0, C.TENSOR: 0.90}, dram=0.9, nvlink=800e9))) is None


# --- the terminal and HTML reports -----------------------------------------------------------------------


def _job_report(job_id: str, name: str, loss: JobLoss) -> JobReport:
    ofu = 1.0 - sum(loss.shares.values())
    return JobReport(
        job_id=job_id,
        attributes={names.JOB_NAME: name, names.HW_MODEL: "NVIDIA H100 80GB HBM3", names.GPU_PRECISION: "bf16"},
        ofu=ofu,
        mfu=ofu * 0.95,
        gap=-0.05 * ofu,
        correlation=None,
        flags={},
        status="ok",
        gpus=10,
        loss=loss,
    )


def _reports() -> list[WindowReport]:
    jobs = (
        _job_report("job-1", "healthy", _loss(HEALTHY, dram=0.34, nvlink=116e9, pcie=0.6e9)),
        _job_report("job-2", "embeddings", _loss(_finer(0.04, 0.08, 0.71), dram=0.70, nvlink=80e9, pcie=0.6e9)),
        _job_report("job-3", "legacy-source", _loss({C.IDLE: 0.0, C.CLOCK: 0.0, C.TENSOR: 0.60})),
    )
    lost: dict[str, float] = {}
    for job in jobs:
        assert job.loss is not None
        for cause, seconds in job.loss.lost_s.items():
            lost[cause] = lost.get(cause, 0.0) + seconds
    fleet = FleetReport(None, None, 0, CoMoments(), 0.0, FleetLoss(lost))
    return [WindowReport(T0, T0 + WINDOW, (), jobs, fleet)]


def test_the_terminal_report_names_the_bottleneck_and_fits_80_columns() -> None:
    console = Console(width=80, file=io.StringIO(), force_terminal=False)
    print_report(summarize(_reports()), console)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert max(len(line) for line in text.splitlines()) <= 80
    # The coarse table folds the finer parts into tensor: job-2's 0.04 + 0.08 + 0.71 = 83.0%.
    assert re.search(r"job-2 .* 83\.0% ", text)
    assert "Where the tensor pipes' time went" in text
    words = " ".join(text.split())  # the sentences as read, wherever they wrap
    assert "job-2 (embeddings): 71.0% of GPU time the SMs were busy off the tensor pipes; DRAM 70.0%" in words
    # Only job-2 is named; job-3 has no finer split and is not in the finer table.
    assert "job-1 (healthy):" not in words
    assert not re.search(r"^job-3 .*%.*GB/s", text, re.MULTILINE)


def test_the_html_waterfall_shows_the_finer_causes_and_the_bottleneck() -> None:
    page = build_report(_reports())
    for cause in (C.NO_KERNEL, C.SM_IDLE, C.NON_TENSOR, C.TENSOR):
        assert f"{cause}: {CAUSE_WORDS[cause]}" in page
    assert '<li data-kind="memory"><b>embeddings</b>' in page
    assert page.count("<li data-kind=") == 1
    assert '<th class="num">DRAM</th>' in page
