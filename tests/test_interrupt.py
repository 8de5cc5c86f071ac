"""Ctrl-C at any moment of any command is one line, never a traceback.

The installed ``otel-ofu`` console script (what a user types) runs each command and gets SIGINT, as a terminal's
Ctrl-C sends it, at moments chosen to fall in its imports (the first second or two: grpc, the SDK, numpy), and
for the commands that run on, while they run. Commands that stop cleanly on SIGINT (``run``, ``collector``,
``mfu-from-log``) may still do so; whatever the moment, stderr holds no traceback and at most one line about the
interrupt, and an interrupted command exits 130 (128 + SIGINT), as shells expect.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(sys.executable).parent / "otel-ofu"
INTERRUPTED = "otel-ofu: interrupted"
EXIT_S = 30.0  # bound for a process to end after SIGINT on a loaded machine


def commands(tmp_path: Path) -> dict[str, list[str]]:
    log = tmp_path / "train.log"
    log.write_text("step 1 | MFU 41.0%\n")
    records = tmp_path / "windows.jsonl"
    records.write_text("")
    return {
        "run": ["run", "--source", "sim", "--interval", "1", "--exporter", "none"],
        "collector": ["collector", "--listen", "127.0.0.1:0"],
        "demo": ["demo"],
        "snapshot": ["snapshot", "--source", "sim"],
        "mfu-from-log": [
            "mfu-from-log",
            "--file",
            str(log),
            "--job-id",
            "j",
            "--export-endpoint",
            "http://127.0.0.1:9",
        ],
        "report": ["report", "--records", str(records), "--out", str(tmp_path / "r.html")],
        "top": ["top", "--demo"],
    }


def interrupt(argv: list[str], after_s: float) -> tuple[int, str]:
    """Start the command, send SIGINT after ``after_s``, and return its exit status and stderr."""
    env = {key: value for key, value in os.environ.items() if key not in ("COLUMNS", "LINES")}
    process = subprocess.Popen(
        [str(SCRIPT), *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    time.sleep(after_s)
    return interrupted(process, f"{argv[0]}, SIGINT at {after_s} s")


def interrupted(process: subprocess.Popen[str], what: str) -> tuple[int, str]:
    """Send SIGINT to the process's group (as a terminal does to its foreground job) unless it has ended; its exit
    status and stderr once it ends, within ``EXIT_S`` (killed and failed past it)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
    try:
        _, stderr = process.communicate(timeout=EXIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        _, stderr = process.communicate()
        pytest.fail(f"{what}: did not end within {EXIT_S:g} s of SIGINT:\n{stderr[-2000:]}")
    return process.returncode, stderr


def check(command: str, after_s: float, status: int, stderr: str) -> None:
    where = f"{command}, SIGINT at {after_s} s (exit {status}):\n{stderr[-3000:]}"
    assert "Traceback" not in stderr, where
    assert "KeyboardInterrupt" not in stderr, where
    lines = stderr.splitlines()
    assert sum(INTERRUPTED in line for line in lines) <= 1, where
    if status == 130:
        assert lines[-1] == INTERRUPTED, where


@pytest.fixture
def script(require: object) -> Path:
    assert callable(require)
    require(SCRIPT.exists(), f"the otel-ofu console script is not installed beside {sys.executable}")
    return SCRIPT


@pytest.mark.parametrize("after_s", [0.15, 0.6, 1.2])
@pytest.mark.parametrize("command", ["run", "collector", "demo", "snapshot", "mfu-from-log", "report", "top"])
def test_ctrl_c_while_a_command_starts_is_one_line(script: Path, tmp_path: Path, command: str, after_s: float) -> None:
    status, stderr = interrupt(commands(tmp_path)[command], after_s)
    check(command, after_s, status, stderr)


def test_ctrl_c_in_the_first_moments_is_exactly_the_one_line(script: Path, tmp_path: Path) -> None:
    """Within the imports nothing else has been said yet: the line is all there is."""
    status, stderr = interrupt(commands(tmp_path)["demo"], 0.15)
    assert (status, stderr) == (130, INTERRUPTED + "\n")


@pytest.mark.parametrize("command", ["demo", "run", "collector", "mfu-from-log"])
def test_ctrl_c_while_a_command_runs_is_one_line_at_most(script: Path, tmp_path: Path, command: str) -> None:
    after_s = 2.0 if command == "demo" else 4.0  # the demo's fleet runs from about 1 s to about 3.5 s in
    status, stderr = interrupt(commands(tmp_path)[command], after_s)
    check(command, after_s, status, stderr)
    if command == "demo":
        assert status in (0, 130, -signal.SIGINT), stderr  # 0: it had finished; -2: it was on its way out
    else:
        assert status == 0, stderr  # these stop cleanly on SIGINT, as on SIGTERM


def test_ctrl_c_inside_a_weakref_callback_still_ends_the_command() -> None:
    """Python prints a KeyboardInterrupt raised while a weakref callback runs ("Exception ignored in ...") and
    swallows it: the demo, interrupted there, printed a traceback and ran on to the end. A command that spends nearly
    all its time in such callbacks is interrupted 0.5 s after it started: it ends at once, 130, with the one line and
    nothing else."""
    busy = (
        "import weakref, sys\n"
        "from otel_ofu import cli, entry\n"
        "class Thing: pass\n"
        "def slow(_ref): sum(range(200_000))\n"
        "def command(argv):\n"
        "    print('started', flush=True)\n"
        "    kept = []\n"
        "    for _ in range(100_000):\n"
        "        kept.append(weakref.ref(Thing(), slow))\n"  # the Thing dies at once: its callback runs here
        "    return 0\n"
        "cli.main = command\n"
        "sys.exit(entry.main([]))\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", busy],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline() == "started\n"  # the command runs: the interrupt lands in it, not in the imports
    time.sleep(0.5)
    assert interrupted(process, "a command inside weakref callbacks") == (130, INTERRUPTED + "\n")
