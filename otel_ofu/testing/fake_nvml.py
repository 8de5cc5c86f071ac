"""The fake NVML: build the C library of ``otel_ofu/fake_nvml``, script it, and point pynvml at it.

    fake = FakeNvml.build()          # gcc, cached by source hash; resets the fake's state
    gpu = fake.add_gpu("NVIDIA H100 80GB HBM3")
    fake.set_tensor_util(gpu, 42.0)
    with fake.installed():           # pynvml now calls the fake (in this process)
        source = NvmlSource(background=False)

The library holds one process-wide state (it is one loaded shared object): one ``FakeNvml`` at a time,
and building one resets it. pynvml is pointed at it with ``otel_ofu.sources.nvml.use_library``, which
sets pynvml's module-global ``nvmlLib`` (the ``CDLL("libnvidia-ml.so.1")`` it would otherwise load on
``nvmlInit``) and clears its function-pointer cache; ``uninstall`` puts pynvml back on the real library.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import uuid as uuidlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

import attrs

from otel_ofu import names
from otel_ofu.sources import nvml

SOURCE_NAME = "fake_nvml.c"
CFLAGS = ("-shared", "-fPIC", "-O2", "-std=c11", "-pthread", "-Wall")


class FakeNvmlUnavailable(RuntimeError):
    """The fake library cannot be built here (no C compiler, or the build failed)."""


def compiler() -> str | None:
    """Path of the C compiler the fake is built with (``$CC``, else gcc), or None when there is none."""
    return shutil.which(os.environ.get("CC", "gcc"))


def source_text() -> bytes:
    return resources.files("otel_ofu.fake_nvml").joinpath(SOURCE_NAME).read_bytes()


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/otel-ofu`` (``~/.cache/otel-ofu``), or a per-user temp dir when that is not writable."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    candidate = Path(base) / "otel-ofu"
    try:
        candidate.mkdir(parents=True, exist_ok=True)
        if os.access(candidate, os.W_OK):
            return candidate
    except OSError:
        pass
    return Path(tempfile.gettempdir()) / f"otel-ofu-{os.getuid()}"


def build_library(cache_dir: Path | None = None) -> Path:
    """The built fake library, compiled only when no build of this exact source exists yet."""
    source = source_text()
    digest = hashlib.sha256(source + " ".join(CFLAGS).encode()).hexdigest()[:16]
    directory = cache_dir if cache_dir is not None else default_cache_dir()
    target = directory / f"libfake-nvml-{digest}.so"
    if target.exists():
        return target
    cc = compiler()
    if cc is None:
        raise FakeNvmlUnavailable("no C compiler (gcc) found: the fake NVML library is built from C source")
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        source_path = Path(scratch) / SOURCE_NAME
        source_path.write_bytes(source)
        built = Path(scratch) / target.name
        result = subprocess.run(
            [cc, *CFLAGS, "-o", str(built), str(source_path)], capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            raise FakeNvmlUnavailable(f"building the fake NVML library failed: {result.stderr.strip()}")
        os.replace(built, target)  # atomic: concurrent builders race harmlessly
    return target


def _declare(lib: ctypes.CDLL) -> None:
    c_int, c_uint, c_long, c_double, c_char_p = (
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.c_long,
        ctypes.c_double,
        ctypes.c_char_p,
    )
    c_ulonglong = ctypes.c_ulonglong
    uint_array = ctypes.POINTER(c_uint)
    signatures: dict[str, tuple[type, list[type]]] = {
        "fake_reset": (c_int, []),
        "fake_add_device": (c_int, [c_char_p, c_char_p, c_uint, c_uint, c_int]),
        "fake_set_clock": (c_int, [c_int, c_uint, c_uint]),
        "fake_schedule_clocks": (c_int, [c_int, uint_array, c_int]),
        "fake_clock_calls": (c_long, [c_int]),
        "fake_set_gpm_supported": (c_int, [c_int, c_int]),
        "fake_set_power": (c_int, [c_int, c_uint]),
        "fake_advance_energy": (c_int, [c_int, c_ulonglong]),
        "fake_set_energy": (c_int, [c_int, c_ulonglong]),
        "fake_set_event_reasons": (c_int, [c_int, c_ulonglong]),
        "fake_advance_violation": (c_int, [c_int, c_int, c_ulonglong, c_ulonglong]),
        "fake_set_mig_mode": (c_int, [c_int, c_int]),
        "fake_add_mig": (c_int, [c_int, c_uint, c_char_p, c_char_p]),
        "fake_set_metric": (c_int, [c_int, c_int, c_uint, c_double]),
        "fake_advance_counter": (c_int, [c_int, c_int, c_uint, c_double]),
        "fake_fail_metric": (c_int, [c_int, c_int, c_uint, c_int]),
        "fake_set_processes": (c_int, [c_int, c_int, uint_array, c_int]),
        "fake_fail": (c_int, [c_char_p, c_int, c_int, c_int]),
        "fake_clear_failures": (c_int, []),
        "fake_init_count": (c_int, []),
        "fake_live_samples": (c_long, []),
        "fake_sizeof": (c_long, [c_int]),
    }
    for name, (restype, argtypes) in signatures.items():
        function = getattr(lib, name)
        function.restype = restype
        function.argtypes = argtypes


def _uints(values: Sequence[int]) -> ctypes.Array[ctypes.c_uint]:
    return (ctypes.c_uint * max(len(values), 1))(*values)


@attrs.define
class FakeNvml:
    """Controller of the fake NVML library. GPUs are addressed by the index ``add_gpu`` returned;
    ``gpu_instance_id`` addresses one MIG instance of it instead of the whole GPU."""

    path: Path
    _lib: ctypes.CDLL
    _gpus: int = 0

    @classmethod
    def build(cls, cache_dir: Path | None = None) -> FakeNvml:
        """Builds (or reuses) the library, loads it and resets its state."""
        path = build_library(cache_dir)
        lib = ctypes.CDLL(str(path))
        _declare(lib)
        fake = cls(path, lib)
        fake.reset()
        return fake

    # --- pynvml --------------------------------------------------------------------------------

    def install(self) -> None:
        """Points pynvml at this library (process-wide)."""
        nvml.use_library(self.path)

    def uninstall(self) -> None:
        """Points pynvml back at the real ``libnvidia-ml.so.1``."""
        nvml.use_library(None)

    @contextmanager
    def installed(self) -> Iterator[FakeNvml]:
        self.install()
        try:
            yield self
        finally:
            self.uninstall()

    # --- devices -------------------------------------------------------------------------------

    def reset(self) -> None:
        """No GPUs, no failures, NVML not initialised."""
        self._lib.fake_reset()
        self._gpus = 0

    def add_gpu(
        self,
        name: str = "NVIDIA H100 80GB HBM3",
        *,
        uuid: str | None = None,
        max_sm_clock_mhz: int = 1980,
        sm_clock_mhz: int = 1980,
        gpm: bool = True,
    ) -> int:
        """A GPU at the next index (its NVML index too); returns that index."""
        uuid = uuid if uuid is not None else f"GPU-{uuidlib.UUID(int=self._gpus + 1)}"
        index = self._lib.fake_add_device(uuid.encode(), name.encode(), max_sm_clock_mhz, sm_clock_mhz, int(gpm))
        if index < 0:
            raise ValueError("the fake NVML holds at most 16 GPUs")
        self._gpus += 1
        return int(index)

    def uuid_of(self, gpu: int) -> str:
        """The default UUID ``add_gpu`` gives the GPU at this index."""
        return f"GPU-{uuidlib.UUID(int=gpu + 1)}"

    def set_sm_clock(self, gpu: int, mhz: int, *, max_mhz: int | None = None) -> None:
        """The SM clock every read returns from now on (clears a schedule); optionally a new max clock."""
        self._check(self._lib.fake_set_clock(gpu, mhz, max_mhz or 0))

    def schedule_sm_clocks(self, gpu: int, mhz: Sequence[int]) -> None:
        """The next SM clock reads return these, one each; the last then stays."""
        self._check(self._lib.fake_schedule_clocks(gpu, _uints(mhz), len(mhz)))

    def clock_calls(self, gpu: int) -> int:
        """How many times the SM clock of the GPU has been read."""
        return int(self._lib.fake_clock_calls(gpu))

    def set_gpm_supported(self, gpu: int, supported: bool) -> None:
        self._check(self._lib.fake_set_gpm_supported(gpu, int(supported)))

    def set_mig_mode(self, gpu: int, enabled: bool | None) -> None:
        """MIG mode on or off; None: the GPU is not MIG capable (nvmlDeviceGetMigMode is not supported)."""
        self._check(self._lib.fake_set_mig_mode(gpu, -1 if enabled is None else int(enabled)))

    def add_mig_instance(
        self, gpu: int, gpu_instance_id: int, *, profile: str = "1g.10gb", uuid: str | None = None
    ) -> None:
        """A MIG GPU instance named ``<GPU name> MIG <profile>``; turns MIG mode on."""
        uuid = uuid if uuid is not None else f"MIG-{uuidlib.UUID(int=(gpu + 1) << 32 | gpu_instance_id)}"
        self._check(self._lib.fake_add_mig(gpu, gpu_instance_id, uuid.encode(), profile.encode()))

    def set_processes(self, gpu: int, pids: Sequence[int], *, gpu_instance_id: int | None = None) -> None:
        """The compute processes nvmlDeviceGetComputeRunningProcesses reports."""
        self._check(self._lib.fake_set_processes(gpu, _gi(gpu_instance_id), _uints(pids), len(pids)))

    # --- power, energy, clock events ------------------------------------------------------------

    def set_power(self, gpu: int, watts: float) -> None:
        """What nvmlDeviceGetPowerUsage reports from now on (NVML's unit is mW)."""
        self._check(self._lib.fake_set_power(gpu, round(watts * 1000)))

    def advance_energy(self, gpu: int, joules: float) -> None:
        """Advances nvmlDeviceGetTotalEnergyConsumption (NVML's unit is mJ)."""
        self._check(self._lib.fake_advance_energy(gpu, round(joules * 1000)))

    def set_energy(self, gpu: int, joules: float) -> None:
        """Sets the energy counter outright (0: as after a driver reload)."""
        self._check(self._lib.fake_set_energy(gpu, round(joules * 1000)))

    def set_event_reasons(self, gpu: int, bitmask: int) -> None:
        """The clocks event reasons bitmask (nvmlClocksEventReason* bits) from now on."""
        self._check(self._lib.fake_set_event_reasons(gpu, bitmask))

    def advance_violation(self, gpu: int, policy: int, seconds: float, *, reference_s: float = 0.0) -> None:
        """Advances nvmlDeviceGetViolationStatus(policy): violation time (ns) and reference time (us)."""
        self._check(self._lib.fake_advance_violation(gpu, policy, round(seconds * 1e9), round(reference_s * 1e6)))

    # --- GPM -----------------------------------------------------------------------------------

    def set_metric(self, gpu: int, metric: int, value: float, *, gpu_instance_id: int | None = None) -> None:
        """What nvmlGpmMetricsGet reports for a rate metric (the *_UTIL ones are 0..100)."""
        self._check(self._lib.fake_set_metric(gpu, _gi(gpu_instance_id), metric, value))

    def set_tensor_util(self, gpu: int, percent: float, *, gpu_instance_id: int | None = None) -> None:
        """NVML_GPM_METRIC_ANY_TENSOR_UTIL, in percent."""
        self.set_metric(gpu, names.NVML_GPM_METRIC_ANY_TENSOR_UTIL, percent, gpu_instance_id=gpu_instance_id)

    def set_activity(
        self,
        gpu: int,
        *,
        engine: float | None = None,
        sm: float | None = None,
        occupancy: float | None = None,
        dram: float | None = None,
        tensor: float | None = None,
        gpu_instance_id: int | None = None,
    ) -> None:
        """The GPM utilisation metrics given, in percent: GRAPHICS_UTIL (engine), SM_UTIL, SM_OCCUPANCY,
        DRAM_BW_UTIL and ANY_TENSOR_UTIL; the others stay as they were."""
        percents = {
            names.NVML_GPM_METRIC_GRAPHICS_UTIL: engine,
            names.NVML_GPM_METRIC_SM_UTIL: sm,
            names.NVML_GPM_METRIC_SM_OCCUPANCY: occupancy,
            names.NVML_GPM_METRIC_DRAM_BW_UTIL: dram,
            names.NVML_GPM_METRIC_ANY_TENSOR_UTIL: tensor,
        }
        for metric, percent in percents.items():
            if percent is not None:
                self.set_metric(gpu, metric, percent, gpu_instance_id=gpu_instance_id)

    def set_link_rates(
        self,
        gpu: int,
        *,
        pcie_tx: float | None = None,
        pcie_rx: float | None = None,
        nvlink_tx: float | None = None,
        nvlink_rx: float | None = None,
        gpu_instance_id: int | None = None,
    ) -> None:
        """The GPM link throughput given, in MiB/s as NVML reports it: PCIE_TX/RX_PER_SEC and
        NVLINK_TOTAL_TX/RX_PER_SEC (all links of the GPU); the others stay as they were."""
        rates = {
            names.NVML_GPM_METRIC_PCIE_TX_PER_SEC: pcie_tx,
            names.NVML_GPM_METRIC_PCIE_RX_PER_SEC: pcie_rx,
            names.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: nvlink_tx,
            names.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: nvlink_rx,
        }
        for metric, rate in rates.items():
            if rate is not None:
                self.set_metric(gpu, metric, rate, gpu_instance_id=gpu_instance_id)

    def advance_counter(self, gpu: int, metric: int, delta: float, *, gpu_instance_id: int | None = None) -> None:
        """Advances a cumulative counter metric; nvmlGpmMetricsGet reports its increase between two samples."""
        self._check(self._lib.fake_advance_counter(gpu, _gi(gpu_instance_id), metric, delta))

    def advance_cycles(
        self, gpu: int, *, sm_cycles_elapsed: int, mma_cycles_active: int, gpu_instance_id: int | None = None
    ) -> None:
        """Advances the SM-cycles-elapsed (248) and MMA-cycles-active (250) counters."""
        self.advance_counter(
            gpu, names.NVML_GPM_METRIC_SM_CYCLES_ELAPSED, sm_cycles_elapsed, gpu_instance_id=gpu_instance_id
        )
        self.advance_counter(
            gpu, names.NVML_GPM_METRIC_MMA_CYCLES_ACTIVE, mma_cycles_active, gpu_instance_id=gpu_instance_id
        )

    def fail_metric(self, gpu: int, metric: int, code: int, *, gpu_instance_id: int | None = None) -> None:
        """The metric's own nvmlReturn in nvmlGpmMetricsGet results from now on (0 clears it)."""
        self._check(self._lib.fake_fail_metric(gpu, _gi(gpu_instance_id), metric, code))

    # --- faults --------------------------------------------------------------------------------

    def fail(self, entry: str, code: int, *, gpu: int | None = None, times: int | None = None) -> None:
        """Makes an NVML entry point return ``code`` (a ``names.NvmlReturn`` value; 0 removes the failure).

        ``entry`` is the NVML symbol without its version suffix (``nvmlDeviceGetClockInfo``,
        ``nvmlGpmSampleGet``, ``nvmlInit`` for both init variants...) or ``*`` for every entry point.
        ``gpu`` None: every GPU and the calls that take none. ``times`` None: until removed.
        """
        self._check(
            self._lib.fake_fail(entry.encode(), -1 if gpu is None else gpu, code, -1 if times is None else times)
        )

    def clear_failures(self) -> None:
        self._lib.fake_clear_failures()

    # --- inspection ----------------------------------------------------------------------------

    @property
    def init_count(self) -> int:
        """nvmlInit calls not yet matched by nvmlShutdown."""
        return int(self._lib.fake_init_count())

    @property
    def live_samples(self) -> int:
        """GPM samples allocated and not freed, over the life of the process."""
        return int(self._lib.fake_live_samples())

    def struct_sizes(self) -> dict[str, int]:
        """Sizes and offsets of the fake's NVML structs, to compare with pynvml's declarations."""
        keys = (
            "nvmlGpmMetric_t",
            "nvmlGpmMetricsGet_t.metrics",
            "nvmlProcessInfo_t",
            "nvmlGpmSupport_t",
            "nvmlViolationTime_t",
        )
        return {key: int(self._lib.fake_sizeof(which)) for which, key in enumerate(keys)}

    @staticmethod
    def _check(result: int) -> None:
        if result != 0:
            raise ValueError("the fake NVML rejected the call: unknown GPU or MIG instance, or a value out of range")


def _gi(gpu_instance_id: int | None) -> int:
    return -1 if gpu_instance_id is None else gpu_instance_id
