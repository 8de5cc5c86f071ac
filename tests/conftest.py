"""Shared test helpers."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from otel_ofu.attribution import podresources_pb2_grpc as pb_grpc
from otel_ofu.gpu_values import say_once
from otel_ofu.sources.nvml import NvmlSource
from otel_ofu.testing import fake_nvml
from otel_ofu.testing.fake_nvml import FakeNvml
from otel_ofu.testing.pki import Pki, make_pki
from tests.k8s_helpers import FakeKubelet
from tests.nvml_helpers import ManualClock


def _require(available: bool, reason: str) -> None:
    """Skip with a reason when something a test needs is missing; under CI=true that is a failure."""
    if available:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but {reason}: .ci/run must install it")
    pytest.skip(reason)


@pytest.fixture(autouse=True)
def _each_test_says_its_warnings() -> None:
    """What the producer says once per process is said once per test: a test that checks a warning does not depend
    on whether an earlier one in the same process already said it."""
    say_once.forget()


@pytest.fixture
def require() -> Callable[[bool, str], None]:
    return _require


@pytest.fixture
def promtool(require: Callable[[bool, str], None]) -> str:
    """The real promtool (Debian package prometheus: tests/setup installs it)."""
    found = shutil.which("promtool")
    require(found is not None, "promtool (Debian package prometheus) is not installed")
    assert found is not None
    return found


@pytest.fixture
def shared_fixtures() -> Path:
    """The real dcgm-exporter and dcgmi output in tests/data."""
    return Path(__file__).parent / "data"


# --- the NVML source against the fake NVML library (real pynvml, no Python-level mocking) -------------


@pytest.fixture
def fake_library(require: Callable[[bool, str], None]) -> Iterator[FakeNvml]:
    """The fake NVML library built from C source, not installed (a test may pass its path), reset after."""
    require(fake_nvml.compiler() is not None, "gcc not found: the fake NVML library is built from C source")
    fake = FakeNvml.build()
    yield fake
    fake.uninstall()  # what the test ran may have pointed pynvml at it
    fake.reset()


@pytest.fixture
def fake(fake_library: FakeNvml) -> Iterator[FakeNvml]:
    """The fake NVML library installed for pynvml for the whole test."""
    with fake_library.installed():
        yield fake_library


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def open_source(fake: FakeNvml, clock: ManualClock) -> Iterator[Callable[[], NvmlSource]]:
    """``open_source()``: an NvmlSource on the fake library and the test's clock, closed when the test ends."""
    opened: list[NvmlSource] = []

    def open_() -> NvmlSource:
        source = NvmlSource(host="node-1", clock=clock, background=False)
        opened.append(source)
        return source

    yield open_
    for source in opened:
        source.close()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA with server and client certificates for 127.0.0.1, once per module."""
    return make_pki(tmp_path_factory.mktemp("pki"))


# --- Kubernetes: a fake kubelet's PodResources over real gRPC on a unix socket ----------------------


@pytest.fixture
def socket_path(tmp_path: Path) -> Iterator[Path]:
    # AF_UNIX paths are limited to 107 bytes; pytest's tmp_path can be longer than that.
    if len(str(tmp_path / "kubelet.sock")) < 100:
        yield tmp_path / "kubelet.sock"
        return
    short = Path(tempfile.mkdtemp(prefix="ofu-k8s-"))
    try:
        yield short / "kubelet.sock"
    finally:
        shutil.rmtree(short, ignore_errors=True)


@pytest.fixture
def kubelet(socket_path: Path) -> Iterator[FakeKubelet]:
    fake = FakeKubelet()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_PodResourcesListerServicer_to_server(fake, server)
    server.add_insecure_port(f"unix://{socket_path}")
    server.start()
    try:
        yield fake
    finally:
        server.stop(grace=None).wait()
