"""``pip install otel-ofu`` as a user gets it: the sdist and the wheel built from the image's own build context,
installed into a clean virtual environment, every command run from there.

What the Dockerfile's build stage copies (``examples/deploy/Dockerfile``: its ``COPY`` lines, read here) is the
source tree; setuptools' PEP 517 hooks (the ones ``python -m build`` and ``pip wheel`` call) build the sdist from
it, and the wheel from the unpacked sdist, so a file the sdist leaves out fails the wheel. No Docker engine is
needed and no package index is reached: the clean environment takes its dependencies from wheels packed from
this environment's installed distributions (their RECORDs), offline. The image's last stage runs the same
``pip install`` of the wheel, as a non-root user, with ``otel-ofu`` as its entrypoint; that is checked too.
"""

from __future__ import annotations

import email
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import uuid
import zipfile
from collections.abc import Callable, Iterator
from email.message import Message
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from otel_ofu.testing.otlp_sink import unused_port

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "examples" / "deploy" / "Dockerfile"
NAME = "otel-ofu"
COMMANDS = ("run", "snapshot", "collector", "mfu-from-log", "demo", "report", "top")
BOUND_S = 120.0


def dockerfile_copies() -> list[tuple[list[str], str]]:
    """The build stage's ``COPY src... dest`` instructions (not those ``--from`` another stage)."""
    copies = []
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    stage = 0
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0].upper() == "FROM":
            stage += 1
        if words[0].upper() == "COPY" and stage == 1 and not any(w.startswith("--from") for w in words):
            *sources, destination = words[1:]
            copies.append((sources, destination))
    return copies


def build_context(target: Path) -> Path:
    """The build stage's /src, laid out as its COPY lines lay it out (WORKDIR /src): a folder's contents into
    its destination, files into a destination folder (one that ends with a slash)."""
    for sources, destination in dockerfile_copies():
        into = target / destination
        for source in sources:
            origin = ROOT / source
            if origin.is_dir():
                ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.pyc")
                shutil.copytree(origin, into, dirs_exist_ok=True, ignore=ignore)
            else:
                into.mkdir(parents=True, exist_ok=True)
                shutil.copy2(origin, into / origin.name)
    return target


def hook(hook_name: str, source: Path, out: Path) -> Path:
    """setuptools' PEP 517 hook run in ``source``, as a front end runs it (a process of its own)."""
    out.mkdir(parents=True, exist_ok=True)
    code = f"import setuptools.build_meta as b; print(b.{hook_name}({str(out)!r}))"
    done = subprocess.run([sys.executable, "-c", code], cwd=source, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return out / done.stdout.strip().splitlines()[-1]


def runtime_requirements() -> set[str]:
    """The distributions otel-ofu needs at run time, its dependencies' dependencies (and the extras they ask
    for) included; not otel-ofu's own extras."""
    seen: set[tuple[str, str]] = set()
    todo = [(NAME, "")]
    names: set[str] = set()
    while todo:
        name, extra = todo.pop()
        if (name, extra) in seen:
            continue
        seen.add((name, extra))
        if name != NAME:
            names.add(name)
        for line in metadata.requires(name) or []:
            requirement = Requirement(line)
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": extra}):
                continue
            wanted = requirement.name.lower().replace("_", "-")
            todo.extend((wanted, asked) for asked in ("", *requirement.extras))
    return names


def pack_installed(name: str, wheelhouse: Path, work: Path) -> None:
    """A wheel of an installed distribution, from the files its RECORD lists (offline: no index, no sdist)."""
    dist = metadata.distribution(name)
    files = dist.files or []
    info = next(Path(str(file)).parent for file in files if file.name == "METADATA")
    unpacked = work / info.name.removesuffix(".dist-info")
    site = Path(str(dist.locate_file("")))
    for file in files:
        path = Path(str(file))
        if path.parts[0] == ".." or path.suffix == ".pyc" or path.name in ("RECORD", "INSTALLER", "direct_url.json"):
            continue
        origin = site / path
        if origin.is_file():
            (unpacked / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, unpacked / path)
    (unpacked / info / "RECORD").write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "wheel", "pack", str(unpacked), "-d", str(wheelhouse)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, (name, done.stderr[-2000:])


def _built(tmp: Path) -> tuple[Path, Path, Path]:
    """(sdist, wheel, clean environment with the wheel installed): built once for this module's tests."""
    context = build_context(tmp / "src")
    sdist = hook("build_sdist", context, tmp / "dist")
    unpacked = tmp / "sdist"
    with tarfile.open(sdist) as archive:
        archive.extractall(unpacked, filter="data")
    (root,) = unpacked.iterdir()
    wheel = hook("build_wheel", root, tmp / "dist")
    wheelhouse = tmp / "wheelhouse"
    wheelhouse.mkdir()
    for name in sorted(runtime_requirements()):
        pack_installed(name, wheelhouse, tmp / "packing")
    venv = tmp / "clean"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--no-index",
         "--find-links", str(wheelhouse), "--no-cache-dir", "--no-compile", "--quiet", str(wheel)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr[-3000:]
    return sdist, wheel, venv


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    return _built(tmp_path_factory.mktemp("packaging"))


def wheel_metadata(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return email.message_from_bytes(archive.read(name))


def test_the_wheel_carries_the_metadata_pypi_shows(built: tuple[Path, Path, Path]) -> None:
    _, wheel, _ = built
    meta = wheel_metadata(wheel)
    assert meta["Name"] == NAME
    assert meta["Requires-Python"] == ">=3.11"
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    assert meta["Description-Content-Type"] == "text/markdown"
    assert "OFU, Overall FLOP Utilization" in str(meta.get_payload())  # the README is the long description
    keywords = {word.strip() for word in meta["Keywords"].split(",")}
    assert {"gpu", "opentelemetry", "mfu", "ofu"} <= keywords
    classifiers = set(meta.get_all("Classifier") or [])
    assert "Programming Language :: Python :: 3.11" in classifiers
    assert "Topic :: System :: Monitoring" in classifiers
    assert "Typing :: Typed" in classifiers
    urls = dict(line.split(", ", 1) for line in meta.get_all("Project-URL") or [])
    assert {"Homepage", "Documentation", "Source", "Issues", "Changelog"} <= set(urls)
    assert all(url.startswith("https://") for url in urls.values())


def test_the_wheel_holds_the_two_packages_their_data_and_the_console_script(built: tuple[Path, Path, Path]) -> None:
    sdist, wheel, _ = built
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        entry_text = archive.read(entry_points).decode()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"otel_ofu", "otel_ofu_collector"}  # no generic top-level name
    for data in ("otel_ofu/py.typed", "otel_ofu_collector/py.typed", "otel_ofu/fake_nvml/fake_nvml.c",
                 "otel_ofu/attribution/podresources.proto"):  # fmt: skip
        assert data in names
    assert "otel-ofu = otel_ofu.entry:main" in entry_text
    for command in ("collector", "demo", "report", "top"):
        assert re.search(rf"^{command} = otel_ofu_collector\.", entry_text, re.MULTILINE), command
    with tarfile.open(sdist) as archive:
        members = {Path(member).relative_to(Path(member).parts[0]).as_posix() for member in archive.getnames()
                   if len(Path(member).parts) > 1}  # fmt: skip
    assert {"pyproject.toml", "README.md", "LICENSE"} <= members


def run(venv: Path, *args: str, cwd: Path, timeout: float = BOUND_S) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "COLUMNS", "LINES")}
    return subprocess.run(
        [str(venv / "bin" / "otel-ofu"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_the_clean_install_imports_from_itself_and_every_command_answers(
    built: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    _, _, venv = built
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import otel_ofu, otel_ofu_collector; print(otel_ofu.__file__); "
         "print(otel_ofu_collector.__file__)"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True,
    ).stdout.split()  # fmt: skip
    assert all(path.startswith(str(venv)) for path in where), where  # not the repository's sources
    version = run(venv, "--version", cwd=tmp_path)
    assert (version.returncode, version.stdout.strip()) == (0, "otel-ofu 0.1.0")
    for command in COMMANDS:
        helped = run(venv, command, "--help", cwd=tmp_path)
        assert helped.returncode == 0, (command, helped.stderr)
        assert f"usage: otel-ofu {command}" in helped.stdout


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)


def wait_for(what: str, test: Callable[[], bool]) -> None:
    deadline = time.monotonic() + BOUND_S
    while not test():
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {BOUND_S:g} s")
        time.sleep(0.1)


def test_every_command_runs_from_the_clean_install(
    built: tuple[Path, Path, Path], tmp_path: Path, processes: list[subprocess.Popen[str]],
    require: Callable[[bool, str], None],
) -> None:  # fmt: skip
    """The demo with its HTML report; a collector that a producer and a log follower export to, its records made
    into a report; one snapshot; and top on the demo fleet in a terminal."""
    _, _, venv = built
    demo = run(venv, "demo", "--duration", "600", "--html", str(tmp_path / "demo.html"), cwd=tmp_path)
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert "otel-ofu demo: fleet report" in demo.stdout
    assert (tmp_path / "demo.html").stat().st_size > 100_000  # plotly inlined: the page opens offline

    snapshot = run(venv, "snapshot", "--source", "sim", "--format", "json", cwd=tmp_path)
    assert snapshot.returncode == 0, snapshot.stderr
    assert len([json.loads(line) for line in snapshot.stdout.splitlines()]) == 40

    port = unused_port()
    records = tmp_path / "windows.jsonl"
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    collector = subprocess.Popen(
        [str(venv / "bin" / "otel-ofu"), "collector", "--listen", f"127.0.0.1:{port}", "--window", "1",
         "--lateness", "0.5", "--record-outputs", str(records)],
        cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    processes.append(collector)
    endpoint = f"http://127.0.0.1:{port}"
    producer = run(venv, "run", "--source", "sim", "--interval", "0.5", "--duration", "4", "--quiet",
                   "--export-endpoint", endpoint, cwd=tmp_path)  # fmt: skip
    assert producer.returncode == 0, producer.stderr[-3000:]
    log = tmp_path / "train.log"
    log.write_text("".join(f"step {i} | MFU 41.{i}%\n" for i in range(5)))
    follower = run(venv, "mfu-from-log", "--file", str(log), "--job-id", "job-1001", "--from-start", "--duration",
                   "2", "--interval", "0.5", "--export-endpoint", endpoint, cwd=tmp_path)  # fmt: skip
    assert follower.returncode == 0, follower.stderr[-3000:]
    wait_for("a closed window in the records", lambda: records.exists() and records.stat().st_size > 0)
    collector.send_signal(signal.SIGTERM)
    _, stderr = collector.communicate(timeout=BOUND_S)
    assert collector.returncode == 0, stderr[-3000:]
    report = run(venv, "report", "--records", str(records), "--out", str(tmp_path / "report.html"), cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert report.stdout.startswith(f"wrote {tmp_path / 'report.html'} (")

    require(shutil.which("tmux") is not None, "tmux (Debian package tmux) is not installed")
    socket_name = f"otel-ofu-packaging-{uuid.uuid4().hex[:8]}"
    command = f"cd {shlex.quote(str(tmp_path))} && env -u COLUMNS -u LINES -u PYTHONPATH " + shlex.join(
        [str(venv / "bin" / "otel-ofu"), "top", "--demo", "--speed", "60"]
    )
    tmux = ["tmux", "-L", socket_name]
    subprocess.run([*tmux, "-f", "/dev/null", "new-session", "-d", "-x", "80", "-y", "24", "-s", "top",
                    command + "; echo top exited $?; sleep 600"], check=True, timeout=30)  # fmt: skip
    try:

        def screen() -> str:
            return subprocess.run([*tmux, "capture-pane", "-p", "-t", "top"], capture_output=True, text=True,
                                  timeout=30).stdout  # fmt: skip

        wait_for("top's job table", lambda: "job-1001" in screen() and "sort: to act on" in screen())
        subprocess.run([*tmux, "send-keys", "-t", "top", "q"], check=True, timeout=30)
        wait_for("top's exit", lambda: "top exited 0" in screen())
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True, timeout=30)


def test_the_image_runs_the_wheel_as_a_non_root_user_with_the_console_script() -> None:
    """What the image's last stage does, read from the Dockerfile: the wheel the build stage made, installed; a
    non-root user; ``otel-ofu`` as the entrypoint (the chart's args pick the command)."""
    text = DOCKERFILE.read_text()
    stages = re.split(r"(?m)^FROM ", text)[1:]
    assert len(stages) == 2
    build_stage, image = stages
    assert "pip wheel" in build_stage
    assert re.search(r"pip install [^\n]*/wheels/\*\.whl", image)
    assert re.search(r"(?m)^USER 65532:65532$", image)
    assert '["otel-ofu"]' in image
    copied = {source for sources, _ in dockerfile_copies() for source in sources}
    assert {"pyproject.toml", "README.md", "LICENSE", "otel_ofu", "collector/otel_ofu_collector"} <= copied
