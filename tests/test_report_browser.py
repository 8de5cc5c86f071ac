"""The HTML report in a real headless Chromium: every figure draws (plotly's SVG is in the live DOM), no
script error, and the screenshot shows the plots' colours, not a blank page. A broken page is caught too."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from otel_ofu import names
from otel_ofu_collector.aggregation.windows import Aggregator
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.report.html_page import write_report
from otel_ofu_collector.report.plots import COLOUR_HEALTHY, COLOUR_MISCOUNT
from otel_ofu_collector.report.summary import FLAG_KINDS
from otel_ofu_collector.results import WindowReport

S = 1_000_000_000
T0 = 1_800_000_000 * S
FIGURES = ("ofu-mfu-scatter", "ofu-distribution", "ofu-percentiles", "job-timelines")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--enable-logging=stderr",
    "--v=0",
    # Let plotly finish its (promise-based) drawing before the DOM is dumped or the picture taken.
    "--virtual-time-budget=10000",
)


def fleet_reports() -> list[WindowReport]:
    """Through the real aggregator: healthy jobs, a 2x FLOP over-count, a 2.5x regression, a hostile name."""
    aggregator = Aggregator(AggregatorConfig(window_s=60, lateness_s=0, flag_settings={"baseline_windows": 4}))
    jobs = {
        "job-1": ("llama3-70b", "NVIDIA H100 80GB HBM3", 0.46, 0.96),
        "job-2": ("moe-16b", "NVIDIA H100 80GB HBM3", 0.26, 1.95),
        "job-3": ("gpt-13b", "NVIDIA A100-SXM4-80GB", 0.40, 0.95),
        "job-4": ('<img src=x onerror=alert("x")>', "NVIDIA A100-SXM4-80GB", 0.33, 0.97),
    }
    reports: list[WindowReport] = []
    for w in range(24):
        end = T0 + (w + 1) * 60 * S
        for job_id, (name, model, ofu, ratio) in jobs.items():
            level = ofu / 2.5 if job_id == "job-3" and w >= 12 else ofu
            identity = {names.JOB_ID: job_id, names.JOB_NAME: name, names.HW_MODEL: model, names.GPU_PRECISION: "bf16"}
            for gpu in range(4):
                value = level * (1 + 0.03 * ((gpu + w) % 3 - 1))
                aggregator.add_ofu(f"{job_id}/{gpu}", value, end - 60 * S, end, identity)
            aggregator.add_mfu(job_id, level * ratio * (1 + 0.01 * (w % 2)), end, {})
        reports.extend(aggregator.flush(end))
    return reports


def _chromium(page: Path, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    command = [str(shutil.which("chromium")), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *extra, page.as_uri()]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


class _Dom(HTMLParser):
    """Which figures hold a plotly ``svg.main-svg``, and the text of the page's render-error box."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[tuple[str, str | None]] = []  # (tag, figure id it opens)
        self.figures_with_svg: set[str] = set()
        self.errors_hidden: bool | None = None
        self.error_text = ""
        self._in_errors = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        element_id = found.get("id")
        if element_id == "render-errors":
            self.errors_hidden = "hidden" in found
            self._in_errors = len(self.stack) + 1
        figure = element_id if element_id in FIGURES else None
        classes = (found.get("class") or "").split()
        if tag == "svg" and "main-svg" in classes:
            self.figures_with_svg.update(f for _, f in self.stack if f is not None)
        if tag not in ("br", "img", "input", "meta", "link", "hr", "path", "rect", "line", "circle", "use"):
            self.stack.append((tag, figure))

    def handle_endtag(self, tag: str) -> None:
        while self.stack:
            opened, _ = self.stack.pop()
            if len(self.stack) < self._in_errors:
                self._in_errors = 0
            if opened == tag:
                break

    def handle_data(self, data: str) -> None:
        if self._in_errors:
            self.error_text += data


def _rgb(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


def _pixels_near(counts: dict[tuple[int, ...], int], colour: tuple[int, int, int], tolerance: int = 24) -> int:
    return sum(n for rgb, n in counts.items() if all(abs(a - b) <= tolerance for a, b in zip(rgb, colour, strict=True)))


@pytest.fixture
def chromium(require: Callable[[bool, str], None]) -> None:
    require(shutil.which("chromium") is not None, "chromium is not installed (Debian package chromium)")


@pytest.mark.usefixtures("chromium")
def test_report_renders_every_figure_without_script_errors(tmp_path: Path) -> None:
    page = write_report(tmp_path / "report.html", fleet_reports(), title="browser check")
    result = _chromium(page, tmp_path, "--dump-dom")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Uncaught" not in result.stderr, result.stderr[-2000:]
    dom = _Dom()
    dom.feed(result.stdout)
    assert dom.figures_with_svg == set(FIGURES), f"figures that drew no SVG: {set(FIGURES) - dom.figures_with_svg}"
    assert dom.errors_hidden is True
    assert dom.error_text.strip() == ""
    assert result.stdout.count('class="main-svg"') >= len(FIGURES)
    assert "moe-16b" in result.stdout  # plotly drew the flagged job's label as SVG text
    assert "<img src=x" not in result.stdout  # the hostile name stayed text


@pytest.mark.usefixtures("chromium")
def test_screenshot_shows_the_plots(tmp_path: Path) -> None:
    page = write_report(tmp_path / "report.html", fleet_reports())
    shot = tmp_path / "report.png"
    result = _chromium(page, tmp_path, f"--screenshot={shot}", "--window-size=1400,2000")
    assert result.returncode == 0, result.stderr[-2000:]
    with Image.open(shot) as image:
        assert image.size == (1400, 2000)
        colours = image.convert("RGB").getcolors(maxcolors=1 << 24)
    assert colours is not None
    counts = {rgb: n for n, rgb in colours if isinstance(rgb, tuple)}
    background = max(counts.values())
    assert background < 0.9 * 1400 * 2000, "one colour fills the page: blank"
    assert len(counts) > 500  # anti-aliased lines, markers, fills and text
    assert _pixels_near(counts, _rgb(COLOUR_HEALTHY)) > 300  # healthy points, OFU lines, percentile lines
    assert _pixels_near(counts, _rgb(COLOUR_MISCOUNT)) > 100  # the over-counting job's marker and badge


@pytest.mark.usefixtures("chromium")
def test_a_broken_page_is_caught(tmp_path: Path) -> None:
    """The checks above are not vacuous: a figure whose script fails shows up in all of them."""
    good = write_report(tmp_path / "report.html", fleet_reports()).read_text(encoding="utf-8")
    broken = tmp_path / "broken.html"
    text, replaced = re.subn(r'Plotly\.newPlot\((\s*"ofu-distribution")', r"Plotly.noSuchCall(\1", good)
    assert replaced == 1
    broken.write_text(text, encoding="utf-8")
    result = _chromium(broken, tmp_path, "--dump-dom")
    dom = _Dom()
    dom.feed(result.stdout)
    assert "Uncaught" in result.stderr
    assert dom.errors_hidden is False
    assert "A plot could not be drawn" in dom.error_text
    assert dom.figures_with_svg == set(FIGURES) - {"ofu-distribution"}


# --- what a reader sees: flags that stand out, no legend on a title, no sideways scroll -------------------

# Run in the page once plotly has drawn: what the checks below read, as JSON in <pre id="probe">.
PROBE = """
<script>
window.addEventListener("load", function () { setTimeout(function () {
  function rgb(text) { var m = text.match(/[\\d.]+/g) || []; return m.slice(0, 4).map(Number); }
  function backdrop(el) {  // the colour behind an element: its nearest ancestor with an opaque background
    for (var up = el.parentElement; up; up = up.parentElement) {
      var c = rgb(getComputedStyle(up).backgroundColor);
      if (c.length === 3 || c[3] > 0) { return c.slice(0, 3); }
    }
    return [255, 255, 255];
  }
  function box(el) { var r = el.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; }
  var badges = [].map.call(document.querySelectorAll("span.flag"), function (el) {
    var s = getComputedStyle(el);
    return {kind: el.className.replace("flag", "").trim(), background: rgb(s.backgroundColor),
            color: rgb(s.color), behind: backdrop(el)};
  });
  var figures = [].map.call(document.querySelectorAll(".js-plotly-plot"), function (plot) {
    var legend = plot.querySelector("g.legend");
    var titles = plot.querySelectorAll(".gtitle, .g-xtitle, .g-ytitle, g.annotation");
    return {id: plot.id, legend: legend ? box(legend) : null,
            titles: [].map.call(titles, function (t) { return {text: t.textContent, box: box(t)}; })};
  });
  var pre = document.createElement("pre");
  pre.id = "probe";
  pre.textContent = JSON.stringify({badges: badges, figures: figures,
    scrollWidth: document.documentElement.scrollWidth, clientWidth: document.documentElement.clientWidth});
  document.body.appendChild(pre);
}, 500); });
</script>
"""


@pytest.fixture(scope="module")
def demo_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo fleet's report (every flag kind raised), with the probe."""
    from otel_ofu_collector.demo.command import run_demo

    folder = tmp_path_factory.mktemp("demo-page")
    page = write_report(folder / "report.html", run_demo(start_ns=T0), title="the demo fleet")
    probed = folder / "probed.html"
    probed.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
    return probed


def probe(page: Path, tmp_path: Path, width: int) -> dict[str, Any]:
    result = _chromium(page, tmp_path, "--dump-dom", f"--window-size={width},1200")
    assert result.returncode == 0, result.stderr[-2000:]
    match = re.search(r'<pre id="probe">(.*?)</pre>', result.stdout, re.DOTALL)
    assert match is not None, "the probe did not run"
    found: dict[str, Any] = json.loads(html.unescape(match.group(1)))
    return found


def luminance(rgb: Sequence[float]) -> float:
    """WCAG relative luminance of an sRGB colour (0-255 per channel)."""
    linear = [c / 255 / 12.92 if c / 255 <= 0.03928 else ((c / 255 + 0.055) / 1.055) ** 2.4 for c in rgb[:3]]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast(a: Sequence[float], b: Sequence[float]) -> float:
    light, dark = sorted((luminance(a), luminance(b)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


def test_contrast_is_wcags() -> None:
    # Worked by hand: white on black is (1 + 0.05) / (0 + 0.05) = 21; a colour on itself 1.
    assert contrast((255, 255, 255), (0, 0, 0)) == pytest.approx(21.0)
    assert contrast((214, 39, 40), (214, 39, 40)) == pytest.approx(1.0)


@pytest.mark.usefixtures("chromium")
def test_every_flag_badge_stands_out_from_its_background(demo_page: Path, tmp_path: Path) -> None:
    found = probe(demo_page, tmp_path, 1400)
    kinds = {badge["kind"] for badge in found["badges"]}
    assert kinds == set(FLAG_KINDS)  # the demo raises every flag the detectors define
    for badge in found["badges"]:
        background = badge["background"]
        # Painted (not transparent: the straggler and idle badges were white text on the white table)...
        assert len(background) == 3 or background[3] == 1, badge
        assert background[:3] != badge["behind"], badge
        # ...and readable: white bold text on the colour, at least 3:1 (WCAG's bar for large or bold UI text).
        assert contrast(badge["color"], background) >= 3.0, badge
        assert contrast(background, badge["behind"]) >= 2.0, badge


@pytest.mark.usefixtures("chromium")
@pytest.mark.parametrize("width", [800, 1400])
def test_no_legend_sits_on_a_title(demo_page: Path, tmp_path: Path, width: int) -> None:
    found = probe(demo_page, tmp_path, width)
    figures = {figure["id"]: figure for figure in found["figures"]}
    assert "job-timelines" in figures
    for figure in figures.values():
        if figure["legend"] is None:
            continue
        left, top, right, bottom = figure["legend"]
        for title in figure["titles"]:
            t_left, t_top, t_right, t_bottom = title["box"]
            apart = right <= t_left or t_right <= left or bottom <= t_top or t_bottom <= top
            assert apart, (figure["id"], width, title["text"])


@pytest.mark.usefixtures("chromium")
def test_the_page_does_not_scroll_sideways_at_800_px(demo_page: Path, tmp_path: Path) -> None:
    found = probe(demo_page, tmp_path, 800)
    assert found["clientWidth"] <= 800
    assert found["scrollWidth"] <= found["clientWidth"], found["scrollWidth"]
