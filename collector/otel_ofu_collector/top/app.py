"""The screen of ``otel-ofu top``: a textual application that draws ``model.FleetModel`` and takes the keys.

Textual rather than rich's ``Live``: a live table needs keys (sort, filter, Enter into a job, pause, quit),
a cursor, a text field, resizing and a terminal put back as it was however the program ends; textual has
them all, tested, and draws with rich, which the project already uses. ``NO_COLOR`` turns every colour off
(textual's own filter, with the terminal's default colours); the bars tell causes apart by glyph as well, and
the cursor row is in reverse video.

Data arrives on a source's thread as ``feeds.Update``s in a queue; the screen takes them a few times a
second, so a slow or dead source never blocks a key.
"""

from __future__ import annotations

import logging
import os
import queue
from collections.abc import Mapping, Sequence
from typing import ClassVar, Final

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Static

from otel_ofu_collector.report.ranking import BOTTLENECK_TIERS, FLAG_TIERS, RANK_RULE
from otel_ofu_collector.top import cells
from otel_ofu_collector.top.feeds import Update, clock_time
from otel_ofu_collector.top.model import HISTORY, NO_JOB, FleetModel, GpuRow, JobRow, Sort

logger = logging.getLogger(__name__)

_DRAIN_S: Final = 0.2
# The table shows this many jobs at most (the first in the sort): a fleet of thousands stays quick to redraw,
# and the filter finds any other.
MAX_ROWS: Final = 500
_CLOCK_NOTE: Final = "MHz: SM clock / the clock OFU divides by (tensor clock, else board max)"
_FLAG_STYLE: Final = "bold red"
_BOTTLENECK_STYLE: Final = "bold yellow"
_PROBLEM_STYLE: Final = "bold reverse"
_PAUSED: Final = " PAUSED "  # first on the status line, so no width cuts it


def _cell(text: str | Text, width: int, *, right: bool = False) -> Text:
    """A cell of ``width`` columns after one space of gutter; longer text is cut with an ellipsis."""
    body = text if isinstance(text, Text) else Text(text)
    if body.cell_len > width:
        body.truncate(width, overflow="ellipsis")
    else:
        pad = width - body.cell_len
        body = Text(" " * pad) + body if right else body + Text(" " * pad)
    return Text(" ") + body


def _bar(shares: Mapping[str, float], causes: Sequence[str], width: int) -> Text:
    bar = Text()
    for cause, count in cells.bar_cells(shares, causes, width):
        glyph, colour = cells.cause_style(cause, causes)
        bar.append(glyph * count, style=colour)
    return bar


def _flag(flags: Sequence[str], bottleneck: str | None = None) -> Text:
    """The flags up (the first, +N for the others), else the job's bottleneck (input-, comm-, memory-bound)."""
    if flags:
        return Text(flags[0] + (f"+{len(flags) - 1}" if len(flags) > 1 else ""), style=_FLAG_STYLE)
    return Text(bottleneck or "", style=_BOTTLENECK_STYLE)


class _Table(DataTable[Text]):
    """A table whose Enter says what it does in the footer."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("enter", "select_cursor", "open")]


class _Widths:
    """The job table's columns at a terminal width: the numbers' fixed, the room left to the ids and names first
    (as long as the longest), then to the sparkline (up to ``HISTORY`` windows), then to the bar (up to 30)."""

    COLUMNS: Final = 9
    MAX_BAR: Final = 30

    def __init__(self, total: int, rows: Sequence[JobRow] = ()) -> None:
        self.job, self.gpus, self.ofu, self.mfu, self.lost, self.flag = 8, 4, 6, 6, 8, 12
        self.spark, self.bar = 6, 10
        fixed = sum((self.job, self.gpus, self.ofu, self.mfu, self.lost, self.flag, self.spark, self.bar))
        room = max(0, total - 2 - self.COLUMNS - fixed)  # 2: the scroll bar; a space of gutter before each column
        longest_name = max((len(row.name or "") for row in rows), default=0)
        self.name = min(max(6, longest_name), max(6, room))
        room -= self.name
        longest_id = max((len(row.job_id) for row in rows), default=0)
        grow = max(0, min(longest_id - self.job, room))
        self.job += grow
        room -= grow
        grow = max(0, min(HISTORY - self.spark, room))
        self.spark += grow
        room -= grow
        self.bar += max(0, min(self.MAX_BAR - self.bar, room))


class JobsScreen(Screen[None]):
    """The fleet line, the status line, the job table and what the keys do."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "sort", "sort"),
        Binding("slash", "filter", "filter"),
        Binding("p", "pause", "pause"),
        Binding("question_mark", "help", "help"),
        Binding("escape", "clear_filter", "clear", show=False),
    ]

    def compose(self) -> ComposeResult:
        yield Static(id="fleet")
        yield Static(id="status")
        yield _Table(id="jobs", cursor_type="row", cell_padding=0)
        yield Input(placeholder="filter jobs: type, Enter to keep, Esc to clear", id="filter")
        yield Static(id="legend")
        yield Footer()

    def on_mount(self) -> None:
        self.set_class(self.top.no_colour, "no-color")  # the cursor row is shown by reverse video then
        self.query_one("#filter", Input).display = False
        self.query_one("#jobs", DataTable).focus()
        self.redraw()

    def on_screen_resume(self) -> None:
        self.redraw()  # back from a job's GPUs: the data went on meanwhile

    @property
    def top(self) -> TopApp:
        app = self.app
        assert isinstance(app, TopApp)
        return app

    def redraw(self) -> None:
        app = self.top
        rows = app.model.jobs(app.sort, app.filter_text)
        self._fleet_line()
        self._status_line()
        self._table(rows[:MAX_ROWS])
        self._legend(rows)

    def _fleet_line(self) -> None:
        fleet = self.top.model.fleet()
        text = Text()
        text.append(f"{cells.gpus(fleet.gpus)} GPUs", style="bold")
        text.append(f"  OFU p50 {cells.percent(fleet.ofu_p50)} p95 {cells.percent(fleet.ofu_p95)}")
        text.append(f"  lost 1h {cells.gpu_hours(fleet.lost_gpu_s)} GPU-h")
        if fleet.cost_lost is not None:
            text.append(f" {cells.money(fleet.cost_lost)} {fleet.currency or ''}".rstrip())
        text.append("  ")
        text.append(f"{fleet.flags_up} flags up", style=_FLAG_STYLE if fleet.flags_up else "")
        if fleet.goodput is not None:  # last: at 80 columns the flags come first
            text.append(f"  goodput {cells.percent(fleet.goodput)}")
        self.query_one("#fleet", Static).update(text)

    def _status_line(self) -> None:
        """The source and its state; a fault in full (it may take three lines) with what the screen still shows."""
        app = self.top
        newest = app.model.newest
        line = Text()
        if app.paused:  # first: whatever the width, it is seen
            line.append(_PAUSED, style="bold reverse")
            line.append(" ")
        line.append(app.status or app.source_title, style=_PROBLEM_STYLE if app.problem else "dim")
        if app.problem and newest is not None:
            line.append(f" · showing the data of the window to {clock_time(newest.end_ns)}")
        elif newest is not None:
            line.append(f" · window to {clock_time(newest.end_ns)}", style="dim")
        if not app.problem:
            line.truncate(max(1, self.size.width), overflow="ellipsis")
        self.query_one("#status", Static).update(line)

    def _legend(self, rows: Sequence[JobRow]) -> None:
        """What the filter and the sort are, then what the bar's glyphs and the lost column mean: the line is cut
        at the screen's width, so what the keys changed comes first."""
        app = self.top
        causes = app.model.causes()
        legend = Text()
        if app.filter_text:
            legend.append(f"filter: {app.filter_text}", style="bold")
            legend.append(" · ")
        if len(rows) > MAX_ROWS:
            legend.append(f"the first {MAX_ROWS} of {len(rows)} jobs · ", style="bold")
        legend.append(f"sort: {app.sort} · ")
        currency = next((row.currency for row in rows if row.cost_lost is not None and row.currency), None)
        legend.append(f"lost: {currency or 'GPU-h'}/1h")
        # The glyphs last: with the finer causes (five or six of them) they are what the width may cut.
        if causes:
            legend.append(" ·")
            for cause in causes:
                glyph, colour = cells.cause_style(cause, causes)
                legend.append(" ")
                legend.append(glyph, style=colour)
                legend.append(cause)
        legend.truncate(max(1, self.size.width), overflow="ellipsis")
        self.query_one("#legend", Static).update(legend)

    def _table(self, rows: Sequence[JobRow]) -> None:
        table = self.query_one("#jobs", DataTable)
        widths = _Widths(self.size.width, rows)
        causes = self.top.model.causes()
        priced = any(row.cost_lost is not None for row in rows)
        selected = self._selected(table)
        table.clear(columns=True)
        for label, width, right in (
            ("job", widths.job, False),
            ("name", widths.name, False),
            ("GPUs", widths.gpus, True),
            ("OFU", widths.ofu, True),
            ("recent", widths.spark, False),
            ("MFU", widths.mfu, True),
            ("loss", widths.bar, False),  # by cause: the legend names each glyph
            ("lost", widths.lost, True),  # the unit is in the legend: the currency, or GPU-hours
            ("flag", widths.flag, False),
        ):
            table.add_column(_cell(label, width, right=right), key=label, width=width + 1)
        for row in rows:
            lost = cells.money(row.cost_lost) if priced else cells.gpu_hours(row.lost_gpu_s)
            table.add_row(
                _cell(row.job_id, widths.job),
                _cell(row.name or cells.MISSING, widths.name),
                _cell(cells.gpus(row.gpus), widths.gpus, right=True),
                _cell(cells.percent(row.ofu), widths.ofu, right=True),
                _cell(cells.sparkline(row.history, widths.spark), widths.spark),
                _cell(cells.percent(row.mfu), widths.mfu, right=True),
                _cell(_bar(row.shares, causes, widths.bar), widths.bar),
                _cell(lost if row.job_id != NO_JOB else cells.MISSING, widths.lost, right=True),
                _cell(_flag(row.flags, row.bottleneck), widths.flag),
                key=row.job_id,
            )
        if selected is not None and selected in {row.job_id for row in rows}:
            table.move_cursor(row=table.get_row_index(selected), animate=False)

    @staticmethod
    def _selected(table: DataTable[Text]) -> str | None:
        if not table.row_count:
            return None
        try:
            key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key
        except Exception:  # no row under the cursor (the table was empty)
            return None
        return str(key.value) if key.value is not None else None

    def on_resize(self) -> None:
        self.redraw()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is not None:
            self.top.open_job(str(event.row_key.value))

    def action_sort(self) -> None:
        app = self.top
        app.sort = Sort.ALL[(Sort.ALL.index(app.sort) + 1) % len(Sort.ALL)]
        self.redraw()

    def action_filter(self) -> None:
        field = self.query_one("#filter", Input)
        field.display = True
        field.value = self.top.filter_text
        field.focus()

    def action_pause(self) -> None:
        self.top.toggle_pause()

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen())

    def action_clear_filter(self) -> None:
        self._close_filter(keep=False)

    def on_input_changed(self, event: Input.Changed) -> None:
        self.top.filter_text = event.value
        self.redraw()

    def on_input_submitted(self, _event: Input.Submitted) -> None:
        self._close_filter(keep=True)

    def _close_filter(self, *, keep: bool) -> None:
        field = self.query_one("#filter", Input)
        if not keep:
            self.top.filter_text = ""
        field.display = False
        self.query_one("#jobs", DataTable).focus()
        self.redraw()


def _help_section(title: str, rows: Sequence[tuple[str, str]]) -> Table:
    """A titled section of two columns; a long line wraps inside its own column, under its own start."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True, min_width=13)
    grid.add_column(ratio=1)
    for key, what in rows:
        grid.add_row(key, what)
    grid.title = title
    grid.title_justify = "left"
    grid.title_style = "bold"
    return grid


def help_text() -> Group:
    """What the screen shows, what each key does and what each rank means (the reports' tiers)."""
    keys = (
        ("arrows, mouse", "move the cursor"),
        ("Enter", "open the job under the cursor: its GPUs, and why it ranks where it does"),
        ("Esc", "back (and clears a filter)"),
        ("s", "next sort: " + ", ".join(Sort.ALL)),
        ("/", "filter by job id, name, flag or bottleneck; Enter keeps it, Esc clears it"),
        ("p", "pause the screen (data keeps arriving, shown when it resumes)"),
        ("?", "this help; Esc or ? goes back"),
        ("q, Ctrl-C", "quit"),
    )
    columns = (
        ("GPUs", "GPU equivalents (a MIG slice counts as its share of its GPU)"),
        ("OFU, recent", "the newest window's OFU, and its last windows (drawn from 0 to their top)"),
        ("MFU", "as the job's framework reports it; - where it reports none"),
        ("loss", "where the last hour's GPU time went, by cause (the legend under the table)"),
        ("lost", "cost (or GPU-hours where no price is set) lost over the last hour"),
        ("flag", "the flags up (+N: more), else the job's bottleneck"),
    )
    ranks = (
        *((tier.label, tier.meaning) for tier in (*FLAG_TIERS.values(), *BOTTLENECK_TIERS.values())),
        ("then the rest", "by GPU-hours short of the best OFU a job on the same GPU model reaches here"),
    )
    return Group(
        Text("otel-ofu top: the fleet live, most to act on first", style="bold"),
        Text(""),
        _help_section("Keys", keys),
        Text(""),
        _help_section("Columns", columns),
        Text(""),
        _help_section(f"Ranks (sort '{Sort.RANK}', as the reports rank): {RANK_RULE}", ranks),
    )


class HelpScreen(Screen[None]):
    """The keys, the columns and the ranks; Esc or ? goes back."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "back"),
        Binding("question_mark", "back", "back", show=False),
    ]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-scroll"):
            yield Static(help_text(), id="help")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#help-scroll", VerticalScroll).focus()

    def action_back(self) -> None:
        self.app.pop_screen()


class GpusScreen(Screen[None]):
    """One job's GPUs, and why it ranks where it does; Esc goes back."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "back"),
        Binding("backspace", "back", "back", show=False),
        Binding("p", "pause", "pause"),
        Binding("question_mark", "help", "help"),
    ]

    def __init__(self, job_id: str) -> None:
        super().__init__()
        self.job_id = job_id

    def compose(self) -> ComposeResult:
        yield Static(id="job")
        yield Static(id="why")
        yield DataTable(id="gpus", cursor_type="row", cell_padding=0)
        yield Static(id="note")
        yield Footer()

    def on_mount(self) -> None:
        self.set_class(self.top.no_colour, "no-color")
        self.query_one("#gpus", DataTable).focus()
        self.redraw()

    @property
    def top(self) -> TopApp:
        app = self.app
        assert isinstance(app, TopApp)
        return app

    def on_resize(self) -> None:
        self.redraw()

    def action_back(self) -> None:
        self.app.pop_screen()

    def action_pause(self) -> None:
        self.top.toggle_pause()

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen())

    def redraw(self) -> None:
        app = self.top
        job = next((row for row in app.model.jobs(Sort.JOB) if row.job_id == self.job_id), None)
        gpus = app.model.gpus(self.job_id)
        header = Text()
        if app.paused:  # first: whatever the width, it is seen
            header.append(_PAUSED, style="bold reverse")
            header.append(" ")
        header.append(f"{self.job_id} ", style="bold")
        if job is None:
            header.append("is not in the newest window")
        else:
            what = f"{job.model} GPUs" if job.model else "GPUs"
            header.append(
                f"{job.name or ''}  {cells.gpus(job.gpus)} {what}  "
                f"OFU {cells.percent(job.ofu)}  MFU {cells.percent(job.mfu)}  "
            )
            if job.flags or job.bottleneck:
                header.append_text(_flag(job.flags, job.bottleneck))
                header.append("  ")
            if job.cost_lost is not None:
                header.append(f"lost 1h {cells.money(job.cost_lost)} {job.currency or ''}".rstrip())
            elif job.job_id != NO_JOB:
                header.append(f"lost 1h {cells.gpu_hours(job.lost_gpu_s)} GPU-h")
        self.query_one("#job", Static).update(header)
        why = Text("\n".join(job.why) if job is not None else "", style="italic")
        self.query_one("#why", Static).update(why)
        self._table(gpus)
        note = _CLOCK_NOTE
        if not gpus:
            note = "no GPU of this job in the newest data"
        elif not app.model.has_gpu_values:
            note = "this feed carries no per-GPU values: only the job's flagged GPUs are listed"
        self.query_one("#note", Static).update(Text(note, style="dim"))

    def _table(self, rows: Sequence[GpuRow]) -> None:
        table = self.query_one("#gpus", DataTable)
        fixed = (6, 10, 6, 12, 9)
        gpu_width = min(30, max(10, self.size.width - 2 - 6 - sum(fixed)))
        table.clear(columns=True)
        for label, width, right in (
            ("GPU", gpu_width, False),
            ("OFU", fixed[0], True),
            ("SM/ref MHz", fixed[1], True),
            ("power", fixed[2], True),
            ("throttle", fixed[3], False),
            ("straggler", fixed[4], False),
        ):
            table.add_column(_cell(label, width, right=right), key=label, width=width + 1)
        for row in rows:
            clock = f"{cells.mhz(row.sm_clock_hz)}/{cells.mhz(row.reference_clock_hz)}"
            throttle = row.throttle_reason or cells.MISSING
            if row.throttle_reason and row.throttle_share is not None:
                throttle += f" {row.throttle_share:.0%}"
            straggler = {1: Text("yes", style=_FLAG_STYLE), 0: Text("cleared")}.get(
                row.straggler if row.straggler is not None else -1, Text("")
            )
            table.add_row(
                _cell(row.gpu, gpu_width),
                _cell(cells.percent(row.ofu), fixed[0], right=True),
                _cell(clock, fixed[1], right=True),
                _cell(cells.watts(row.power_w), fixed[2], right=True),
                _cell(throttle, fixed[3]),
                _cell(straggler, fixed[4]),
                key=f"{row.hw_id}:{row.mig}",
            )


class TopApp(App[None]):
    """``otel-ofu top``: updates from a source's thread (``post``), drawn a few times a second."""

    TITLE = "otel-ofu top"
    ENABLE_COMMAND_PALETTE = False
    CSS = """
    #fleet, #legend, #note { height: 1; }
    #job { height: auto; max-height: 2; }
    #why { height: auto; max-height: 9; color: $text-muted; }
    #status { height: auto; max-height: 4; }
    #help-scroll { height: 1fr; }
    #jobs, #gpus { height: 1fr; }
    #filter { height: 3; }
    .no-color DataTable > .datatable--cursor { text-style: reverse; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "quit"),
        Binding("ctrl+c", "quit", "quit", show=False, priority=True),
    ]

    def __init__(self, title: str) -> None:
        # With NO_COLOR, the terminal's own colours (ansi_color) make textual strip every colour, not grey them.
        self.no_colour = bool(os.environ.get("NO_COLOR"))
        super().__init__(ansi_color=True if self.no_colour else None)
        self.source_title = title
        self.model = FleetModel()
        self.sort = Sort.RANK
        self.filter_text = ""
        self.paused = False
        self.status: str | None = None
        self.problem = False
        self._updates: queue.SimpleQueue[Update] = queue.SimpleQueue()

    def post(self, update: Update) -> None:
        """Hand an update over from any thread."""
        self._updates.put(update)

    def on_mount(self) -> None:
        self.push_screen(JobsScreen())
        self.set_interval(_DRAIN_S, self._drain)

    def _drain(self) -> None:
        """Take the updates waiting (none while paused: the screen's data is held, keys work on it)."""
        if self.paused:
            return
        changed = False
        while True:
            try:
                update = self._updates.get_nowait()
            except queue.Empty:
                break
            try:
                changed = self.model.add_windows(update.windows) or changed
                if update.readings is not None:
                    self.model.set_readings(update.readings)
                    changed = True
            except Exception as error:  # an update the model cannot take costs that update, not the screen
                logger.warning("top: an update could not be shown: %s", error, exc_info=True)
                update = Update(status=f"an update could not be shown: {type(error).__name__}: {error}", problem=True)
            if update.status is not None and (update.status, update.problem) != (self.status, self.problem):
                self.status, self.problem = update.status, update.problem
                changed = True
        if changed:
            self._redraw()

    def _redraw(self) -> None:
        screen = self.screen
        if isinstance(screen, JobsScreen | GpusScreen):
            screen.redraw()

    def toggle_pause(self) -> None:
        self.paused = not self.paused
        self._redraw()
        if not self.paused:
            self._drain()  # what arrived meanwhile, at once

    def open_job(self, job_id: str) -> None:
        self.push_screen(GpusScreen(job_id))
