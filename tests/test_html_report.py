"""The HTML fleet report: what the page holds (plots' data, identity line, flagged jobs in words), escaping,
and the ``otel-ofu report`` command over records, a live feed and a producer capture."""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path
from typing import Any

import attrs
import pytest

from otel_ofu import cli, names
from otel_ofu.model import GpuIdentity, GpuReading, Snapshot
from otel_ofu.sources.capture import CaptureWriter
from otel_ofu_collector.outputs.feed_server import ReportFeed
from otel_ofu_collector.outputs.recorder import ReportRecorder
from otel_ofu_collector.report.html_page import build_report, write_report
from otel_ofu_collector.report.reasons import flags_of, reasons_of
from otel_ofu_collector.report.summary import format_time, model_name, summarize
from otel_ofu_collector.results import FleetReport, GroupReport, JobReport, WindowReport
from otel_ofu_collector.stats.comoments import CoMoments
from otel_ofu_collector.stats.exphist import ExpHistogram
from otel_ofu_collector.stats.quantiles import percentile_of_sorted

S = 1_000_000_000
T0 = 1_800_000_000 * S
WINDOW = 60 * S
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
EVIL = '</script><script>alert("owned")</script><img src=x onerror=alert(1)>'


def _group(model: str, values: list[float]) -> GroupReport:
    ordered = sorted(values)
    return GroupReport(
        attributes={names.HW_MODEL: model, names.GPU_PRECISION: "bf16"},
        gpus=len(ordered),
        quantiles={q: percentile_of_sorted(ordered, q) for q in names.QUANTILES},
        histogram=ExpHistogram.from_values(ordered, max_buckets=640),
        ofu_sum=sum(ordered),
        ofu_min=ordered[0],
        ofu_max=ordered[-1],
    )


def _job(job_id: str, name: str, model: str, ofu: float, mfu: float | None, **flags: int) -> JobReport:
    return JobReport(
        job_id=job_id,
        attributes={names.JOB_NAME: name, names.HW_MODEL: model, names.GPU_PRECISION: "bf16"},
        ofu=ofu,
        mfu=mfu,
        gap=None if mfu is None else mfu - ofu,
        correlation=0.9 if mfu is not None else None,
        flags={
            names.JOB_FLOPS_MISCOUNT.name: flags.get("miscount", 0),
            names.JOB_OFU_REGRESSION.name: flags.get("regression", 0),
        },
        status="ok" if mfu is not None else "no_mfu",
        gpus=4,
    )


def synthetic_reports(windows: int = 20) -> list[WindowReport]:
    """A healthy job, one over-counting its FLOPs 2x (flag from window 3), one regressing 2.5x at window 10
    (flag from window 11), and an idle job with a hostile name and no MFU."""
    reports = []
    for w in range(windows):
        healthy = 0.45 + 0.002 * (w % 3)
        regressing = 0.40 if w < 10 else 0.16
        jobs = (
            _job("job-1", "llama3-70b", H100, healthy, healthy * 0.96),
            _job("job-2", "moe-16b", H100, 0.25, 0.50, miscount=int(w >= 3)),
            _job("job-3", "gpt-13b", A100, regressing, regressing * 0.95, regression=int(w >= 11)),
            _job("job-4", EVIL, A100, 0.0, None),
        )
        groups = (
            _group(A100, [regressing - 0.01, regressing, regressing + 0.01, 0.0]),
            _group(H100, [healthy - 0.02, healthy, 0.25, 0.26]),
        )
        fleet = FleetReport(correlation=0.35, mae=0.09, jobs=3, comoments=CoMoments(), abs_diff_sum=0.27)
        start = T0 + w * WINDOW
        reports.append(WindowReport(start, start + WINDOW, groups, jobs, fleet))
    return reports


def _figure_data(page: str, div_id: str) -> list[dict[str, Any]]:
    """The traces plotly will draw in the figure ``div_id``, decoded from the page's script block."""
    match = re.search(r'Plotly\.newPlot\(\s*"' + re.escape(div_id) + r'",\s*(\[.*?\]),\s*\{', page, re.DOTALL)
    assert match is not None, f"no figure {div_id} in the page"
    data: list[dict[str, Any]] = json.loads(match.group(1))
    return data


def test_page_is_self_contained_with_plotly_inlined_once() -> None:
    page = build_report(synthetic_reports(), title="Fleet <week 48>")
    assert page.startswith("<!DOCTYPE html>")
    assert "<title>Fleet &lt;week 48&gt;</title>" in page
    assert page.count("Plotly.newPlot(") == 4
    assert len(page) > 3_000_000  # plotly.js itself, inline
    assert page.count("plotly.js v") <= 2  # its banner, once (not once per figure)
    assert not re.search(r"<script[^>]+src=", page), "no external scripts: the page opens offline"
    assert "cdn.plot.ly" not in page.replace("https://cdn.plot.ly/", "")  # only inside plotly.js' own text


def test_scatter_has_one_point_per_job_with_mfu_and_the_identity_line() -> None:
    page = build_report(synthetic_reports())
    traces = _figure_data(page, "ofu-mfu-scatter")
    identity = next(t for t in traces if t["name"] == "MFU = OFU")
    assert identity["x"] == identity["y"]
    assert identity["x"][0] == 0
    points = {t["name"]: t for t in traces if t["name"] != "MFU = OFU"}
    assert set(points) == {"healthy", "suspected FLOP miscount", "OFU regression"}
    miscount = points["suspected FLOP miscount"]
    assert miscount["x"] == [pytest.approx(0.25)]
    assert miscount["y"] == [pytest.approx(0.50)]
    assert miscount["text"] == ["moe-16b"]  # labelled, and coloured apart from the healthy ones
    assert miscount["marker"]["color"] != points["healthy"]["marker"]["color"]
    assert miscount["y"][0] > 1.5 * miscount["x"][0]  # far above the line
    assert len(points["healthy"]["x"]) == 1
    assert points["OFU regression"]["text"] == ["gpt-13b"]
    assert "1 job without reported MFU not shown" in page


def test_distribution_boxes_per_gpu_model_from_the_windows_histograms() -> None:
    traces = _figure_data(build_report(synthetic_reports()), "ofu-distribution")
    assert [t["type"] for t in traces] == ["box", "box"]
    boxes = {t["name"]: t for t in traces}
    assert set(boxes) == {model_name(A100), model_name(H100)}  # each model's one name
    h100 = boxes[model_name(H100)]
    assert h100["lowerfence"][0] <= h100["q1"][0] <= h100["median"][0] <= h100["q3"][0] <= h100["upperfence"][0]
    # Over capacity: the smallest OFU at or below which half of the 80 GPUs sat, the 40th: 0.26.
    assert h100["median"][0] == pytest.approx(0.26, rel=0.01)


def test_distribution_uses_raw_samples_when_a_capture_gives_them() -> None:
    samples = {H100: [0.1 * (i % 10) for i in range(10_000)]}
    traces = _figure_data(build_report(synthetic_reports(), ofu_samples=samples), "ofu-distribution")
    assert [t["type"] for t in traces] == ["violin"]
    assert 100 < len(traces[0]["y"]) <= 4000  # thinned, keeping the shape
    assert min(traces[0]["y"]) == 0.0
    assert max(traces[0]["y"]) == pytest.approx(0.9)


def test_percentiles_over_time_per_model() -> None:
    traces = _figure_data(build_report(synthetic_reports()), "ofu-percentiles")
    medians = {t["name"]: t for t in traces if t.get("name", "").endswith(" median")}
    assert set(medians) == {f"{model_name(A100)} median", f"{model_name(H100)} median"}
    a100 = medians[f"{model_name(A100)} median"]["y"]
    assert len(a100) == 20
    assert a100[0] > a100[-1]  # the regressing job drags its model down


def test_timelines_per_job_mark_flag_windows() -> None:
    page = build_report(synthetic_reports())
    traces = _figure_data(page, "job-timelines")
    ofu = [t for t in traces if t.get("legendgroup") == "ofu"]
    mfu = [t for t in traces if t.get("legendgroup") == "mfu"]
    assert len(ofu) == 4  # every job
    assert len(mfu) == 3  # the idle job reports no MFU: no line, not a line at zero
    assert {t["name"] for t in traces} >= {"FLOP-miscount flag up", "OFU-regression flag up"}
    layout = re.search(r'Plotly\.newPlot\(\s*"job-timelines",\s*\[.*?\],\s*(\{.*?\}),\s*\{"displaylogo"', page, re.S)
    assert layout is not None
    shapes = json.loads(layout.group(1))["shapes"]
    assert len(shapes) == 2  # one stretch per flag
    miscount = next(s for s in shapes if "214, 39, 40" in s["fillcolor"])
    assert miscount["x0"].startswith(format_time(T0 + 3 * WINDOW)[:19])
    assert miscount["x1"].startswith(format_time(T0 + 20 * WINDOW)[:19])


def test_flagged_jobs_table_says_why_in_words() -> None:
    page = build_report(synthetic_reports())
    table = page[page.index('<table id="flagged-jobs"') : page.index("</table>", page.index('id="flagged-jobs"'))]
    assert "suspected FLOP miscount: reported MFU 2.0x its OFU for 17 windows" in table
    regression_from = format_time(T0 + 11 * WINDOW)
    assert f"regression: OFU fell 2.5x below its own baseline from {regression_from}" in table
    assert "llama3-70b" not in table  # the healthy job is not flagged
    assert table.index("moe-16b") < table.index("gpt-13b")  # miscounts first


def test_flags_described_per_job() -> None:
    jobs = {job.job_id: job for job in summarize(synthetic_reports()).jobs}
    assert flags_of(jobs["job-1"]) == []
    (miscount,) = flags_of(jobs["job-2"])
    assert (miscount.kind, miscount.windows, miscount.active) == ("miscount", 17, True)
    (regression,) = flags_of(jobs["job-3"])
    assert regression.first_ns == T0 + 11 * WINDOW
    assert "(40.0% -> 16.0%, 9 windows)" in regression.reason


def test_the_page_says_what_the_summary_says() -> None:
    """One wording for both reports: every reason the summary gives is in the page's flagged-jobs table."""
    reports = synthetic_reports()
    page = build_report(reports)
    table = page[page.index('<table id="flagged-jobs"') : page.index("</table>", page.index('id="flagged-jobs"'))]
    reasons = [reason for job in summarize(reports).jobs for reason in reasons_of(job)]
    assert len(reasons) == 2
    for reason in reasons:
        assert html.escape(reason) in table


def test_summary_numbers() -> None:
    page = build_report(synthetic_reports())
    summary = page[page.index('<section class="summary">') : page.index("<h2>Flagged jobs</h2>")]
    assert ">8</div>" in summary  # GPUs in the last window
    assert '<div class="value">4</div><div class="label">jobs (3 report MFU)</div>' in summary
    # The fleet's r over 3 jobs is no finding: it reads "not enough jobs" with how many it had.
    assert (
        '<div class="stat" id="fleet-r"><div class="value">not enough jobs</div>'
        '<div class="label">fleet r(OFU, MFU): 3 jobs with both; it needs 4 or more</div></div>'
    ) in summary
    assert ">0.35</div>" not in summary
    assert ">9.0%</div>" in summary  # fleet MAE
    assert "OFU percentiles of the last window" in summary
    # header, then one row per group (model, precision): the rows the terminal report prints
    assert summary.count("<tr>") == 1 + 2


def test_the_fleet_r_is_a_headline_from_four_jobs() -> None:
    reports = [attrs.evolve(r, fleet=attrs.evolve(r.fleet, jobs=4)) for r in synthetic_reports()]
    page = build_report(reports)
    assert (
        '<div class="stat" id="fleet-r"><div class="value">0.35</div>'
        '<div class="label">fleet r(OFU, MFU) over 4 jobs</div></div>'
    ) in page


def test_the_last_windows_percentiles_are_the_terminals_rows() -> None:
    reports = synthetic_reports()
    summary = _summary_section(build_report(reports))
    last = max(reports, key=lambda r: r.end_ns)
    assert last.groups
    for group in last.groups:
        cells = "".join(f'<td class="num">{group.quantiles[q]:.1%}</td>' for q in names.QUANTILES)
        row = (
            f"<tr><td>{html.escape(group.attributes[names.HW_MODEL])}</td>"
            f"<td>{html.escape(group.attributes[names.GPU_PRECISION])}</td>"
            f'<td class="num">{group.gpus}</td>{cells}</tr>'
        )
        assert row in summary


def _summary_section(page: str) -> str:
    return page[page.index('<section class="summary">') : page.index("<h2>Flagged jobs</h2>")]


def test_summary_shows_an_undefined_fleet_correlation_as_absent_not_nan() -> None:
    reports = synthetic_reports(4)
    nan_fleet = FleetReport(correlation=math.nan, mae=math.inf, jobs=0, comoments=CoMoments(), abs_diff_sum=0.0)
    last = attrs.evolve(reports[-1], fleet=nan_fleet)
    page = build_report([*reports[:-1], last])
    summary = _summary_section(page)
    assert "nan" not in summary.lower()
    assert "inf" not in summary.lower()
    assert '<div class="value">not enough jobs</div><div class="label">fleet r(OFU, MFU): 0 jobs with' in summary
    assert '<div class="value">-</div><div class="label">fleet MAE |OFU - MFU|</div>' in summary
    # Over enough jobs but undefined (every job's MFU the same, say): absent, never "nan".
    enough = attrs.evolve(last, fleet=attrs.evolve(nan_fleet, jobs=5))
    summary = _summary_section(build_report([*reports[:-1], enough]))
    assert '<div class="value">-</div><div class="label">fleet r(OFU, MFU) over 5 jobs</div>' in summary
    assert "nan" not in summary.lower()


def test_summary_takes_the_fleet_figures_from_the_fleet_summary() -> None:
    # The peak is over every window, the rest is the last window's: a fleet that shrank says both.
    reports = synthetic_reports(3)
    shrunk = attrs.evolve(reports[-1], groups=reports[-1].groups[:1])
    reports = [*reports[:-1], shrunk]
    summary = _summary_section(build_report(list(reversed(reports))))  # any order
    assert '<div class="value">4</div><div class="label">GPUs in the last window (peak 8)</div>' in summary
    assert "fleet r(OFU, MFU): 3 jobs with both" in summary  # the last window's count
    assert f"3 windows of 60 s, from {format_time(T0)} to {format_time(T0 + 3 * WINDOW)}" in summary


def test_a_given_summary_is_the_one_the_page_uses() -> None:
    reports = synthetic_reports(5)
    summary = summarize(reports)
    page = build_report(reports, summary=summary, generated_ns=T0)
    assert page == build_report(reports, generated_ns=T0)
    other = build_report(reports, summary=summarize(reports[:2]), generated_ns=T0)
    assert "2 windows of 60 s" in _summary_section(other)  # not computed again behind the caller's back


def test_hostile_job_names_are_escaped_everywhere() -> None:
    page = build_report(synthetic_reports())
    assert EVIL not in page
    assert "<img src=x" not in page
    assert "<script>alert" not in page
    assert "onerror=alert(1)>" not in page
    assert html.escape(EVIL) in page  # the tables show it literally
    # In plot labels: escaped text, which plotly shows literally (it decodes entities, not tags).
    assert "&lt;\\u002fscript&gt;&lt;script&gt;alert" in page
    assert page.count("<script") == page.count("</script>")


def test_empty_record_still_makes_a_page() -> None:
    page = build_report([])
    assert 'id="empty"' in page
    assert "Plotly.newPlot(" not in page


def test_write_report_replaces_the_file_whole(tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    target.write_text("old", encoding="utf-8")
    assert write_report(target, synthetic_reports(3)) == target
    assert target.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]


# --- the command ------------------------------------------------------------------------------------------


def test_report_command_from_records(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = tmp_path / "outputs.jsonl"
    with ReportRecorder(records) as recorder:
        recorder.consume_windows(synthetic_reports())
    out = tmp_path / "fleet.html"
    assert cli.main(["report", "--records", str(records), "--out", str(out), "--title", "week 48"]) == 0
    page = out.read_text(encoding="utf-8")
    assert "<h1>week 48</h1>" in page
    assert "suspected FLOP miscount" in page
    said = capsys.readouterr().out
    assert "20 windows, 4 jobs" in said
    assert "moe-16b" in said


def test_report_command_from_a_live_feed(tmp_path: Path) -> None:
    feed = ReportFeed(port=0)
    feed.start()
    try:
        feed.consume_windows(synthetic_reports())
        out = tmp_path / "live.html"
        assert cli.main(["report", "--live", f"http://127.0.0.1:{feed.bound_port}", "--out", str(out)]) == 0
    finally:
        feed.shutdown()
    assert "Plotly.newPlot(" in out.read_text(encoding="utf-8")


def test_report_command_from_a_capture_gives_ofu_only(tmp_path: Path) -> None:
    capture = tmp_path / "capture.jsonl"
    with CaptureWriter(capture) as writer:
        for step in range(12):
            start, end = T0 + step * 10 * S, T0 + (step + 1) * 10 * S
            readings = tuple(
                GpuReading(
                    GpuIdentity(
                        f"GPU-{i}", H100, i, "node-1", hints={names.JOB_ID: "job-9", names.GPU_PRECISION: "bf16"}
                    ),
                    start,
                    end,
                    tensor_active=0.3 + 0.05 * i,
                    sm_clock_hz=1.98e9,
                    max_sm_clock_hz=1.98e9,
                )
                for i in range(4)
            )
            writer.write(Snapshot(readings=readings))
    out = tmp_path / "capture.html"
    assert cli.main(["report", "--capture", str(capture), "--window", "30", "--out", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert 'id="no-mfu"' in page  # no MFU in a capture, and the page says so instead of an empty plot
    violin = _figure_data(page, "ofu-distribution")
    assert violin[0]["type"] == "violin"
    assert len(violin[0]["y"]) == 48
    timelines = _figure_data(page, "job-timelines")
    ofu = next(t for t in timelines if t.get("legendgroup") == "ofu")
    assert len(ofu["y"]) == 4  # 120 s of reads in 30 s windows
    assert ofu["y"][0] == pytest.approx(0.375, abs=0.02)


def test_report_command_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["report", "--out", str(tmp_path / "x.html")]) == 1
    assert "nothing to report on" in capsys.readouterr().err
    assert cli.main(["report", "--records", str(tmp_path / "missing.jsonl")]) == 1
    assert "cannot read records" in capsys.readouterr().err
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text("not a record\n", encoding="utf-8")
    assert cli.main(["report", "--records", str(garbage), "--out", str(tmp_path / "y.html")]) == 1
    assert "holds no window records" in capsys.readouterr().err
    assert not (tmp_path / "x.html").exists()


def test_report_options_have_environment_variables(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = tmp_path / "outputs.jsonl"
    with ReportRecorder(records) as recorder:
        recorder.consume_windows(synthetic_reports(2))
    out = tmp_path / "env.html"
    monkeypatch.setenv("OTEL_OFU_REPORT_RECORDS", str(records))
    monkeypatch.setenv("OTEL_OFU_REPORT_OUT", str(out))
    monkeypatch.setenv("OTEL_OFU_REPORT_TITLE", "from the environment")
    assert cli.main(["report"]) == 0
    assert "<h1>from the environment</h1>" in out.read_text(encoding="utf-8")
    with pytest.raises(SystemExit):
        cli.main(["report", "--help"])
    help_text = capsys.readouterr().out
    for variable in ("RECORDS", "CAPTURE", "LIVE", "OUT", "TITLE", "WINDOW"):
        assert f"OTEL_OFU_REPORT_{variable}" in help_text


def test_every_flag_the_detectors_define_has_a_badge_style_and_a_new_one_gets_one() -> None:
    from otel_ofu_collector.report.html_page import flag_styles
    from otel_ofu_collector.report.plots import FLAG_PALETTE, flag_colour
    from otel_ofu_collector.report.summary import FLAG_KINDS

    page = build_report(synthetic_reports())
    for kind in FLAG_KINDS:  # miscount, regression, idle, straggler: each painted in its own colour
        assert f".flag.{kind} {{ background: {flag_colour(kind)}; }}" in page
    assert len({flag_colour(kind) for kind in FLAG_KINDS}) == len(FLAG_KINDS)
    # A flag no colour was chosen for takes the palette's next one, in the detectors' order.
    kinds = (*FLAG_KINDS, "thermal-drift", "nvlink-errors")
    styles = flag_styles(kinds)
    assert f".flag.thermal-drift {{ background: {FLAG_PALETTE[0]}; }}" in styles
    assert f".flag.nvlink-errors {{ background: {FLAG_PALETTE[1]}; }}" in styles


def test_each_gpu_model_has_one_name_in_the_page_the_text_report_and_top() -> None:
    """The catalog's name (H100-SXM), in the tables and the plots alike, with the device's full name on hover;
    the text report and top use the same one (report.summary.model_name)."""
    page = build_report(synthetic_reports())
    short = model_name(H100)
    assert short == "H100-SXM"
    boxes = {t["name"] for t in _figure_data(page, "ofu-distribution")}
    assert short in boxes
    medians = {t["name"] for t in _figure_data(page, "ofu-percentiles") if t.get("name", "").endswith(" median")}
    assert f"{short} median" in medians
    table = page[page.index('<table id="all-jobs">') :]
    table = table[: table.index("</table>")]
    assert f'<td title="{H100}">{short}</td>' in table
    assert f">{H100}<" not in table
