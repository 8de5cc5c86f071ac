"""``otel-ofu top`` in a real terminal: tmux runs it, send-keys types, capture-pane reads the screen.

Against the demo fleet (``--demo``), a node's own source (``--source sim``) and a real collector's report feed
(``CollectorService`` on 127.0.0.1 port 0 with its ``ReportFeed``): the job table appears within one window,
sorting, filtering and drilling into a job work, pausing holds the screen, q quits at once, a feed that is
unreachable or goes away is said on the screen (and the last data kept), NO_COLOR turns colours off, and the
screen fits 80x24 and a resize. Waits are bounds for slow machines, never assertions on time.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import pytest

from otel_ofu.clock import ManualClock
from otel_ofu.sources.simulated import SimulatedFleet
from otel_ofu.testing.otlp_sink import unused_port
from otel_ofu_collector.demo.command import demo_pipeline
from otel_ofu_collector.demo.loopback import LoopbackPipeline
from otel_ofu_collector.outputs.feed_server import ReportFeed

BOUND_S = 90.0  # the longest any screen may take to show up on a loaded 2-core machine
EXITED = "top exited with status"
JOB_ROW = re.compile(r"^ (job-\d+)\s")
_SGR = re.compile(r"\x1b\[([0-9;]*)m")
WINDOW_S = 60
# The demo fleet's jobs (otel_ofu.sources.simulated: SimulatedFleet.demo)
DEMO_JOBS = {f"job-{1001 + i}" for i in range(11)}


@attrs.define
class Terminal:
    """One tmux server of its own with one pane running ``top``; the pane stays after it exits."""

    socket: str
    last: str = ""

    def tmux(self, *args: str) -> str:
        done = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise AssertionError(f"tmux {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    @classmethod
    def start(
        cls, arguments: list[str], *, width: int = 80, height: int = 24, env: dict[str, str] | None = None
    ) -> Terminal:
        terminal = cls(f"otel-ofu-top-{uuid.uuid4().hex[:12]}")
        variables = " ".join(f"{key}={shlex.quote(value)}" for key, value in (env or {}).items())
        command = " ".join(shlex.quote(part) for part in (sys.executable, "-m", "otel_ofu.cli", "top", *arguments))
        # COLUMNS and LINES (pytest exports them) would pin the size a program reads: the pane's own counts.
        script = f"cd {shlex.quote(os.getcwd())} && env -u COLUMNS -u LINES {variables} {command}"
        script += f"; echo {EXITED} $?; sleep 3600"
        terminal.tmux("-f", "/dev/null", "new-session", "-d", "-x", str(width), "-y", str(height), "-s", "top", script)
        return terminal

    def screen(self, *, escapes: bool = False) -> str:
        self.last = self.tmux("capture-pane", "-p", *(["-e"] if escapes else []), "-t", "top")
        return self.last

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "top", *keys)

    def wait_for(self, what: str, test: Callable[[str], bool], bound_s: float = BOUND_S) -> str:
        deadline = time.monotonic() + bound_s
        while time.monotonic() < deadline:
            screen = self.screen()
            if test(screen):
                return screen
            time.sleep(0.1)
        raise AssertionError(f"no {what} on the screen within {bound_s:.0f} s; it shows:\n{self.last}")

    def resize(self, width: int, height: int) -> None:
        self.tmux("resize-window", "-t", "top", "-x", str(width), "-y", str(height))

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=30)


@pytest.fixture
def terminal(require: Callable[[bool, str], None]) -> Iterator[Callable[..., Terminal]]:
    require(shutil.which("tmux") is not None, "tmux (Debian package tmux) is not installed")
    started: list[Terminal] = []

    def start(arguments: list[str], **kwargs: object) -> Terminal:
        found = Terminal.start(arguments, **kwargs)  # type: ignore[arg-type]
        started.append(found)
        return found

    yield start
    for found in started:
        found.close()


def job_rows(screen: str) -> list[list[str]]:
    """The job table's rows, split into their columns on runs of spaces (the bar never holds one)."""
    return [line.split() for line in screen.splitlines() if JOB_ROW.match(line)]


def name_of(job_id: str, screen: str) -> str:
    return next(row[1] for row in job_rows(screen) if row[0] == job_id)


def ids(screen: str) -> list[str]:
    return [row[0] for row in job_rows(screen)]


def status_times(screen: str) -> tuple[str, str]:
    """(fleet time, end of the newest window) from the demo's status line."""
    found = re.search(r"fleet time (\d\d:\d\d:\d\d) · window to (\d\d:\d\d:\d\d)", screen)
    assert found, screen
    return found.group(1), found.group(2)


def window_end(screen: str) -> str:
    found = re.search(r"window to (\d\d:\d\d:\d\d)", screen)
    assert found, screen
    return found.group(1)


def seconds(clock: str) -> int:
    hours, minutes, secs = map(int, clock.split(":"))
    return hours * 3600 + minutes * 60 + secs


def percent_column(screen: str, title: str) -> list[float | None]:
    """The values of one numeric column, read at its header's position (a missing value is None)."""
    lines = screen.splitlines()
    header = next(line for line in lines if line.startswith(" job ") and title in line)
    end = header.index(title) + len(title)
    values: list[float | None] = []
    for line in lines:
        if JOB_ROW.match(line):
            cell = line[:end].split()[-1]
            values.append(None if cell == "-" else float(cell.rstrip("%")))
    return values


def quits_at_once(terminal: Terminal) -> str:
    terminal.keys("q")
    screen = terminal.wait_for("exit after q", lambda text: EXITED in text, bound_s=15)
    assert f"{EXITED} 0" in screen
    assert "Traceback" not in screen
    return screen


# --- the demo fleet -----------------------------------------------------------------------------------------


def test_the_demo_in_a_terminal_sorts_filters_opens_a_job_pauses_and_quits(terminal: Callable[..., Terminal]) -> None:
    term = terminal(["--demo", "--speed", "10"])
    screen = term.wait_for("job table", lambda text: set(ids(text)) == DEMO_JOBS)
    # The table appears with the first window: the fleet time is within a window of that window's end
    fleet_time, window_end = status_times(screen)
    assert 0 <= (seconds(fleet_time) - seconds(window_end)) % 86400 < WINDOW_S, screen
    lines = screen.splitlines()
    assert lines[0].startswith("40 GPUs  OFU p50 ")
    assert " GPU-h " in lines[0]
    assert "USD" in lines[0]  # the demo prices its GPUs
    assert all(len(line) <= 80 for line in lines)
    # The demo's GPUs carry engine and SM activity: the tensor cause comes split, and the legend fits 80 columns.
    assert "sort: to act on · lost: USD/1h · ░idle ▒clock ▚no_kernel ▞sm_idle ▙non_tensor" in screen

    term.keys("s")
    screen = term.wait_for("sort by lost", lambda text: "sort: lost cost" in text and len(ids(text)) == len(DEMO_JOBS))
    lost = percent_column(screen, "lost")
    assert lost == sorted(lost, key=lambda value: value or 0.0, reverse=True)  # most lost first

    term.keys("s")
    screen = term.wait_for("sort by OFU", lambda text: "sort: OFU" in text and len(ids(text)) == len(DEMO_JOBS))
    ofus = percent_column(screen, "OFU")
    assert ofus == sorted(ofus, key=lambda value: value if value is not None else 2.0)
    assert ids(screen)[0] == "job-1006"  # the idle notebook: lowest OFU
    term.keys("s")
    screen = term.wait_for("sort by GPUs", lambda text: "sort: GPUs" in text and len(ids(text)) == len(DEMO_JOBS))
    assert ids(screen)[0] == "job-1001"  # the only 8-GPU job

    # Enter on the first row opens job-1001's GPUs; its power-capped GPU is flagged after 3 windows (the cursor
    # stays on the job it was on across sorts: up to the first row)
    term.keys(*["Up"] * len(DEMO_JOBS))
    term.keys("Enter")
    screen = term.wait_for(
        "job-1001's straggler",
        lambda text: re.search(r"dgx-h100-01/3 .* power \d+%\s+yes", text) is not None,
    )
    assert screen.splitlines()[0].startswith("job-1001 llama3-70b-pretrain  8 H100-SXM GPUs  OFU ")
    gpus = [line for line in screen.splitlines() if line.startswith(" dgx-h100-01/")]
    assert len(gpus) == 8
    assert re.search(r"\d+/1830 ", gpus[0])  # SM clock against the H100 SXM's tensor clock
    assert re.search(r"\d+ W ", gpus[0])
    term.keys("Escape")
    screen = term.wait_for("job table again", lambda text: len(ids(text)) == len(DEMO_JOBS))

    term.keys("/")
    term.wait_for("the filter field", lambda text: "filter jobs: type" in text)
    term.keys("deepseek")
    term.keys("Enter")
    screen = term.wait_for("filtered table", lambda text: ids(text) == ["job-1003"] and "filter: deepseek" in text)
    assert "miscount" in job_rows(screen)[0]  # the MoE job over-counting its FLOPs
    term.keys("Escape")
    term.wait_for("unfiltered table", lambda text: len(ids(text)) == len(DEMO_JOBS) and "filter:" not in text)

    term.keys("p")
    paused = term.wait_for("PAUSED", lambda text: "PAUSED" in text)
    held = status_times(paused)
    time.sleep(3)  # at 10x, 30 s of fleet time: a screen that was not held would have moved
    assert status_times(term.screen()) == held
    term.keys("s")  # keys still work on the data held: re-sorted, not refreshed
    resorted = term.wait_for("sort by job", lambda text: "sort: job" in text)
    assert ids(resorted) == sorted(DEMO_JOBS)
    assert status_times(resorted) == held
    term.keys("p")
    term.wait_for("the screen moving again", lambda text: "PAUSED" not in text and status_times(text) != held)

    quits_at_once(term)


def test_the_screen_follows_a_resize_and_no_color_turns_colours_off(terminal: Callable[..., Terminal]) -> None:
    term = terminal(["--demo", "--speed", "30"], env={"NO_COLOR": "1"})
    screen = term.wait_for("job table", lambda text: set(ids(text)) == DEMO_JOBS)
    assert name_of("job-1001", screen).endswith("…")  # at 80 columns llama3-70b-pretrain is cut short
    term.resize(120, 30)
    wide = term.wait_for(
        "the wide table", lambda text: "llama3-70b-pretrain" in text and len(ids(text)) == len(DEMO_JOBS)
    )
    assert max(len(line) for line in wide.splitlines()) > 80  # the table took the room
    term.resize(80, 24)
    narrow = term.wait_for(
        "the narrow table", lambda text: len(ids(text)) == len(DEMO_JOBS) and name_of("job-1001", text).endswith("…")
    )
    assert all(len(line) <= 80 for line in narrow.splitlines())
    assert all(len(row) >= 8 for row in job_rows(narrow))  # every row whole on its line: none wrapped

    coloured = term.screen(escapes=True)
    parameters = [part for group in _SGR.findall(coloured) for part in group.split(";") if part]
    colours = [p for p in parameters if p not in {"0", "1", "2", "3", "4", "7", "22", "23", "24", "27", "39", "49"}]
    assert colours == [], f"colour codes under NO_COLOR: {sorted(set(colours))}"
    assert "7" in parameters  # the cursor row is shown in reverse video instead
    quits_at_once(term)


def test_a_nodes_own_source_in_a_terminal(terminal: Callable[..., Terminal]) -> None:
    """``--source sim``: the simulated fleet read on the wall clock, windows computed in the process."""
    term = terminal(["--source", "sim", "--interval", "1", "--window", "3"])
    screen = term.wait_for("job table", lambda text: set(ids(text)) == DEMO_JOBS)
    assert "sim: the simulated demo fleet (seed 7)" in screen
    assert "lost: GPU-h/1h" in screen  # no price configured: lost GPU time instead of cost
    quits_at_once(term)


# --- a real collector's report feed -------------------------------------------------------------------------


@attrs.define
class Collector:
    """The real collector service on 127.0.0.1 port 0 with its report feed, fed the demo fleet over OTLP on a
    clock the test moves."""

    feed: ReportFeed
    pipeline: LoopbackPipeline
    clock: ManualClock

    def run_windows(self, windows: int) -> None:
        for _ in range(windows * WINDOW_S // 10):
            self.clock.advance(10)
            self.pipeline.step()


@pytest.fixture
def collector() -> Iterator[Collector]:
    feed = ReportFeed(port=0)  # a consumer of the collector: its start starts the feed, its stop stops it
    clock = ManualClock(start_ns=time.time_ns() // (WINDOW_S * 10**9) * WINDOW_S * 10**9)
    fleet = SimulatedFleet.demo(seed=7, clock=clock)
    pipeline = attrs.evolve(demo_pipeline(fleet, clock, interval_s=10, window_s=WINDOW_S), consumers=[feed])
    pipeline.start()
    yield Collector(feed, pipeline, clock)
    pipeline.stop()


def test_a_collectors_feed_in_a_terminal_and_the_feed_going_away(
    terminal: Callable[..., Terminal], collector: Collector
) -> None:
    collector.run_windows(4)
    port = collector.feed.bound_port
    term = terminal(["--feed", f"http://127.0.0.1:{port}", "--refresh", "0.5"])
    screen = term.wait_for("job table", lambda text: set(ids(text)) == DEMO_JOBS)
    assert screen.splitlines()[0].startswith("40 GPUs  OFU p50 ")
    assert f"feed http://127.0.0.1:{port}/reports.jsonl · read " in screen
    assert "sort: to act on" in screen
    first_end = window_end(screen)

    collector.run_windows(1)  # the screen moves with the collector
    term.wait_for(
        "the next window", lambda text: f"window to {first_end}" not in text and len(ids(text)) == len(DEMO_JOBS)
    )

    # job-1001's GPUs: this collector's feed names only its flagged one, the power-capped straggler
    term.keys("/")
    term.wait_for("the filter field", lambda text: "filter jobs: type" in text)
    term.keys("1001")
    term.keys("Enter")
    term.wait_for("job-1001 alone", lambda text: ids(text) == ["job-1001"])
    term.keys("Enter")
    screen = term.wait_for(
        "the straggler", lambda text: re.search(r"dgx-h100-01/GPU-\S+ .*power\s+yes", text) is not None
    )
    assert "this feed carries no per-GPU values: only the job's flagged GPUs are listed" in screen
    term.keys("Escape")
    term.wait_for("job-1001 alone", lambda text: ids(text) == ["job-1001"])

    collector.feed.shutdown()  # the feed goes away: the screen says so and keeps what it had
    # (a read in flight as it stops may first see the connection dropped; then every read is refused)
    screen = term.wait_for("the feed gone", lambda text: "Connection refused" in " ".join(text.split()))
    assert ids(screen) == ["job-1001"]
    words = " ".join(screen.split())
    assert f"feed unreachable: cannot read report feed http://127.0.0.1:{port}/reports.jsonl: " in words
    assert "Connection refused · showing the data of the window to " in words
    quits_at_once(term)


def test_an_unreachable_feed_says_so_on_the_screen(terminal: Callable[..., Terminal]) -> None:
    port = unused_port()
    term = terminal(["--feed", f"http://127.0.0.1:{port}", "--refresh", "0.5"])
    screen = term.wait_for("the message", lambda text: "feed unreachable" in text)
    words = " ".join(screen.split())
    assert f"feed unreachable: cannot read report feed http://127.0.0.1:{port}/reports.jsonl: " in words
    assert "Connection refused" in words
    assert ids(screen) == []
    assert screen.splitlines()[0].startswith("0 GPUs  OFU p50 -")
    quits_at_once(term)


def test_the_default_order_is_what_to_act_on_and_a_job_says_why(terminal: Callable[..., Terminal]) -> None:
    """The reports' rank: the idle notebook, the straggler's job, the MoE miscount (all up from the third window),
    then the communication-, memory- and input-bound jobs, named in the flag column instead of nothing."""
    term = terminal(["--demo", "--speed", "30"])

    def flagged(text: str) -> bool:
        rows = {row[0]: row[-1] for row in job_rows(text)}
        return (rows.get("job-1006"), rows.get("job-1001"), rows.get("job-1003")) == ("idle", "straggler", "miscount")

    screen = term.wait_for("the three flags", flagged)
    assert ids(screen)[:3] == ["job-1006", "job-1001", "job-1003"]
    flags = {row[0]: row[-1] for row in job_rows(screen)}
    assert (flags["job-1008"], flags["job-1009"], flags["job-1007"]) == ("comm-bound", "memory-bound", "input-bound")
    # The bottlenecks next (the restarting job-1011, whose startup and checkpoint saves leave its engine idle, may be
    # named host side among them early in its run).
    assert {"job-1007", "job-1008", "job-1009"} <= set(ids(screen)[3:7])
    term.keys("p")  # hold the order while the cursor is on the first row
    term.wait_for("PAUSED", lambda text: "PAUSED" in text)
    term.keys(*["Up"] * len(DEMO_JOBS))  # the cursor follows the job it is on as the order changes: to the top
    term.keys("Enter")
    screen = term.wait_for("job-1006's reasons", lambda text: "idle allocation" in text)
    words = " ".join(screen.split())
    assert "job-1006 notebook-idle 1 H100-SXM GPUs" in words
    assert "idle allocation: 1 GPU attributed with no tensor activity for " in words
    assert "rank 1: idle: GPUs allocated that do no tensor work: release them" in words
    assert all(len(line) <= 80 for line in screen.splitlines())
    quits_at_once(term)


def test_the_help_screen_says_the_keys_and_what_each_rank_means(terminal: Callable[..., Terminal]) -> None:
    term = terminal(["--demo", "--speed", "30"])
    term.wait_for("job table", lambda text: set(ids(text)) == DEMO_JOBS)
    assert "? help" in term.screen()  # the footer offers it
    term.keys("?")
    screen = term.wait_for("the help", lambda text: "Keys" in text and "Columns" in text)
    words = " ".join(screen.split())
    for said in (
        "Enter open the job under the cursor",
        "s next sort: to act on, lost cost, OFU, GPUs, job",
        "q, Ctrl-C quit",
    ):
        assert said in words
    assert all(len(line) <= 80 for line in screen.splitlines())
    term.keys("End")  # the ranks are below the fold at 24 lines
    screen = term.wait_for("the ranks", lambda text: "then the rest" in text)
    words = " ".join(screen.split())
    assert "idle GPUs allocated that do no tensor work: release them" in words
    assert "then the rest by GPU-hours short of the best OFU" in words
    term.keys("Escape")
    term.wait_for("job table again", lambda text: set(ids(text)) == DEMO_JOBS)
    quits_at_once(term)


def test_names_take_the_room_of_a_wide_terminal(terminal: Callable[..., Terminal]) -> None:
    term = terminal(["--demo", "--speed", "30"], width=160, height=30)
    screen = term.wait_for("job table", lambda text: set(ids(text)) == DEMO_JOBS)
    assert name_of("job-1008", screen) == "gpt-30b-tp4-exposed-allreduce"  # 29 characters, whole
    assert "…" not in "".join(row[1] for row in job_rows(screen))
    quits_at_once(term)


def test_paused_and_a_fault_are_read_whole_at_80_columns(
    terminal: Callable[..., Terminal], collector: Collector
) -> None:
    """A feed's status line is long (its URL, the read time, the window): PAUSED goes first, not past the cut. A
    feed that is a Prometheus endpoint is a fault said in full, with the port to use."""
    collector.run_windows(4)
    port = collector.feed.bound_port
    term = terminal(["--feed", f"http://127.0.0.1:{port}", "--refresh", "0.5"])
    term.wait_for("job table", lambda text: set(ids(text)) == DEMO_JOBS)
    term.keys("p")
    screen = term.wait_for("PAUSED", lambda text: "PAUSED" in text)
    assert all(len(line) <= 80 for line in screen.splitlines())
    quits_at_once(term)

    from otel_ofu_collector.service import CollectorOptions, CollectorService

    service = CollectorService(
        CollectorOptions(grpc_listen="127.0.0.1:0", prometheus_port=0, flush_interval_s=0.0), environ={}
    )
    service.start()
    try:
        term = terminal(["--feed", f"http://127.0.0.1:{service.ports['prometheus']}", "--refresh", "0.5"])
        screen = term.wait_for("the fault", lambda text: "report-feed-port" in " ".join(text.split()))
        words = " ".join(screen.split())
        assert "is a Prometheus /metrics endpoint, not a report feed" in words
        assert (
            "give the collector's --report-feed-port (9466 by the port map), not its --prometheus-port (9465)" in words
        )
        assert all(len(line) <= 80 for line in screen.splitlines())
        quits_at_once(term)
    finally:
        service.stop(grace=1)


def test_a_setting_that_cannot_work_stops_before_the_screen(capsys: pytest.CaptureFixture[str]) -> None:
    from otel_ofu import cli

    assert cli.main(["top", "--demo", "--feed", "http://127.0.0.1:1"]) == 2
    assert (
        capsys.readouterr().err
        == "otel-ofu top: give one of --feed URL or --demo (or neither, for this node's --source)\n"
    )
    assert cli.main(["top", "--source", "nvml", "--nvml-library", "/nonexistent/libnvidia-ml.so"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("otel-ofu top: NVML unavailable: cannot load '/nonexistent/libnvidia-ml.so'")
    assert err.endswith("(otel-ofu top --demo shows the simulated fleet, --feed URL a collector's)\n")
    assert cli.main(["top", "--feed", "http://127.0.0.1:1", "--bearer-token-file", "/nonexistent/token"]) == 2
    assert "cannot read --bearer-token-file /nonexistent/token: No such file or directory" in capsys.readouterr().err


def test_tmux_is_among_the_packages_the_tests_install() -> None:
    packages = (Path(__file__).parent / "setup" / "debian-packages.txt").read_text().split()
    assert "tmux" in packages
