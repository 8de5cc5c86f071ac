"""OFU against measured MFU for controlled GEMMs of known FLOPs, on a real Hopper GPU (or a CPU dry run).

    python -m benchmarks.gpu.validate_ofu [--out DIR] [--seconds 1.5] [--quick] [--device 0]
    python -m benchmarks.gpu.validate_ofu --dry-run --out DIR      # no GPU: CPU stand-in + fake NVML

For every shape (aligned, unaligned, small) and precision (bf16, fp16, tf32, fp8 through
``torch._scaled_mm`` where the GPU and torch support it) one GEMM C = A B of M x K by K x N runs in a loop
of at least ``--seconds`` (GPM needs a second or so of signal), timed with CUDA events. MFU = 2MNK x
iterations / time / dense peak (the catalog's peak for the device and precision). OFU is read over the
same loop through ``otel_ofu.sources.nvml.NvmlSource``: one ``read()`` just before the loop starts and one
right after it ends, so the reading covers the loop (GPM tensor activity with the SM clock sub-sampled at
10 Hz, or the GPM cycle counters where the driver has them) and ``gpu_values.compute`` gives ``gpu.ofu``
(tensor clock domain) and ``gpu.ofu.raw``. Because that reading spans a little more than the CUDA-event
time (the read calls and the final synchronise), OFU is compared with MFU over the reading's interval:
MFU x event time / reading time (the table shows both MFUs; they differ by well under 1% for 1.5 s loops).

Tile correction: the kernel cuBLAS picks is not observable from here, so the correction assumes, per
precision, the candidate tile that pads the shape least (``benchmarks.studies.tile_quantization
.estimated_tile``: BF16/FP16 from 128x128x64, 128x256x64, 256x128x64, 64x64x32; TF32 from 128x128x32,
128x256x32, 64x64x16; FP8 from 128x128x128, 128x256x128, 64x64x64), and OFU_corrected = OFU x 2MNK /
FLOPs_hw for that tile. DESIGN.md target: within 2 pp of MFU after correction for >= 95% of shapes.

``--dry-run`` runs the whole pipeline without a GPU: each "GEMM" is a numpy matmul on the CPU (smaller
shapes), the peak is the CPU's own best measured FLOP/s / 0.25 (so the
implied tensor activity of padded tiles stays below 1), and a fake NVML GPU (H100 SXM, GPM with
cycle counters; ``otel_ofu.testing.fake_nvml``) is scripted with the tensor activity the run implies
(MFU / the true tile factor of a modelled kernel tile) so that the same NvmlSource path reads it back.
Its numbers test the script, not a GPU. Writes ``validate_ofu.json`` and ``validate_ofu.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import attrs

from benchmarks.studies.tile_quantization import PRECISION_TILES, TILES, estimated_tile, kernel_tile
from otel_ofu import catalog, gpu_values, ofu_math
from otel_ofu.model import GpuReading

Shape = tuple[int, int, int]
PRECISIONS = ("bf16", "fp16", "tf32", "fp8")
TARGET_PP = 2.0
TARGET_SHARE = 0.95
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "results" / "gpu"

GPU_SHAPES: dict[str, tuple[Shape, ...]] = {
    "aligned": ((8192, 8192, 8192), (4096, 4096, 4096), (8192, 14336, 4096), (16384, 4096, 4096)),
    # multiples of 16 (fp8 needs them) but not of the tiles, and one not even of 16
    "unaligned": ((4000, 4000, 4000), (6000, 5008, 4112), (8192, 11008, 4096), (2512, 8208, 3088), (3001, 5003, 7001)),
    "small": ((256, 256, 256), (320, 320, 320), (384, 384, 384), (448, 448, 448)),
}
QUICK_GPU_SHAPES: dict[str, tuple[Shape, ...]] = {
    "aligned": ((8192, 8192, 8192),),
    "unaligned": ((4000, 4000, 4000), (3001, 5003, 7001)),
    "small": ((384, 384, 384),),
}
CPU_SHAPES: dict[str, tuple[Shape, ...]] = {
    "aligned": ((256, 256, 256), (512, 256, 256)),
    "unaligned": ((200, 300, 250), (250, 250, 250)),
    "small": ((64, 64, 64), (96, 96, 96)),
}


class GemmBackend(Protocol):
    """Runs one GEMM shape in a precision and times loops of it."""

    device_name: str
    description: str

    def unsupported(self, precision: str, shape: Shape) -> str | None: ...

    def prepare(self, precision: str, shape: Shape) -> Callable[[], None]: ...

    def timed_loop(self, gemm: Callable[[], None], iterations: int, around: Callable[[], None]) -> float:
        """Seconds for ``iterations`` GEMMs; ``around`` is called right before the first and after the last."""
        ...

    def peak(self, precision: str) -> float | None: ...


class OfuMeter(Protocol):
    """Reads the GPU's OFU over an interval through the project's NVML source."""

    description: str

    def begin(self) -> None: ...

    def end(self, implied_tensor_active: float, seconds: float) -> GpuReading | None: ...

    def close(self) -> None: ...


# --- the real GPU ------------------------------------------------------------------------------------


@attrs.define
class TorchBackend:
    torch: Any
    device: Any
    device_name: str
    description: str

    @classmethod
    def open(cls, index: int) -> TorchBackend:
        try:
            torch = importlib.import_module("torch")
        except ImportError:
            raise SystemExit("PyTorch is not installed: use --dry-run for the CPU stand-in") from None
        if not torch.cuda.is_available():
            raise SystemExit("torch sees no CUDA device: use --dry-run for the CPU stand-in")
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 matmuls run on the TF32 tensor-core path
        name = torch.cuda.get_device_name(device)
        description = f"{name}, torch {torch.__version__}, CUDA {torch.version.cuda}"
        return cls(torch, device, name, description)

    def unsupported(self, precision: str, shape: Shape) -> str | None:
        if precision != "fp8":
            return None
        if not hasattr(self.torch, "_scaled_mm") or not hasattr(self.torch, "float8_e4m3fn"):
            return "this torch has no torch._scaled_mm / float8"
        if self.torch.cuda.get_device_capability(self.device) < (8, 9):
            return "fp8 needs compute capability 8.9+"
        if any(size % 16 for size in shape):
            return "torch._scaled_mm needs every dimension a multiple of 16"
        return None

    def prepare(self, precision: str, shape: Shape) -> Callable[[], None]:
        torch, device = self.torch, self.device
        m, n, k = shape
        if precision == "fp8":
            a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
            b = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants
            one = torch.tensor(1.0, device=device)

            def gemm_fp8() -> None:
                torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

            return gemm_fp8
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32}[precision]
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        c = torch.empty(m, n, device=device, dtype=dtype)

        def gemm() -> None:
            torch.mm(a, b, out=c)

        return gemm

    def timed_loop(self, gemm: Callable[[], None], iterations: int, around: Callable[[], None]) -> float:
        torch = self.torch
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(self.device)
        around()
        start.record()
        for _ in range(iterations):
            gemm()
        stop.record()
        stop.synchronize()
        around()
        return float(start.elapsed_time(stop)) / 1e3

    def peak(self, precision: str) -> float | None:
        spec = catalog.lookup(self.device_name)
        return spec.peak(precision) if spec is not None else None

    def release(self) -> None:
        self.torch.cuda.empty_cache()


@attrs.define
class NvmlMeter:
    """The real NvmlSource (GPM, clocks sub-sampled at 10 Hz by its thread); the reading of our device."""

    source: Any
    device_uuid: str | None
    device_index: int
    description: str = "otel_ofu.sources.nvml.NvmlSource (real NVML)"
    _pending: bool = False

    @classmethod
    def open(cls, backend: TorchBackend, index: int) -> NvmlMeter:
        from otel_ofu.sources.nvml import NvmlSource

        source = NvmlSource(clock_sample_hz=10.0)
        uuid = getattr(backend.torch.cuda.get_device_properties(backend.device), "uuid", None)
        return cls(source, str(uuid) if uuid is not None else None, index)

    def begin(self) -> None:
        self.source.read()  # the interval of the next read starts now

    def end(self, implied_tensor_active: float, seconds: float) -> GpuReading | None:
        snapshot = self.source.read()
        readings: list[GpuReading] = [r for r in snapshot.readings if r.gpu.mig_instance_id is None]
        for reading in readings:
            if self.device_uuid and self.device_uuid in reading.gpu.uuid:
                return reading
        if len(readings) == 1:
            return readings[0]
        by_index = [r for r in readings if r.gpu.index == self.device_index]
        return by_index[0] if by_index else None

    def close(self) -> None:
        self.source.close()


# --- the CPU dry run ---------------------------------------------------------------------------------


@attrs.define
class NumpyBackend:
    """numpy matmuls as stand-in GEMMs; the "peak" is the CPU's best measured FLOP/s / 0.25."""

    np: Any
    cpu_peak: float
    device_name: str = "CPU stand-in (dry run)"
    description: str = "numpy on the CPU (dry run: no GPU numbers)"

    @classmethod
    def open(cls) -> NumpyBackend:
        np = importlib.import_module("numpy")
        a = np.ones((256, 256), dtype=np.float32)
        best = 0.0
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(10):
                a @ a
            best = max(best, 10 * 2 * 256**3 / max(time.perf_counter() - t0, 1e-9))
        return cls(np, best / 0.25)

    def unsupported(self, precision: str, shape: Shape) -> str | None:
        return None

    def prepare(self, precision: str, shape: Shape) -> Callable[[], None]:
        m, n, k = shape
        a = self.np.ones((m, k), dtype=self.np.float32)
        b = self.np.ones((k, n), dtype=self.np.float32)

        def gemm() -> None:
            a @ b

        return gemm

    def timed_loop(self, gemm: Callable[[], None], iterations: int, around: Callable[[], None]) -> float:
        around()
        t0 = time.perf_counter()
        for _ in range(iterations):
            gemm()
        seconds = time.perf_counter() - t0
        around()
        return seconds

    def peak(self, precision: str) -> float | None:
        return self.cpu_peak

    def release(self) -> None:
        return None


@attrs.define
class FakeNvmlMeter:
    """A fake NVML H100 scripted with the activity the stand-in run implies, read through NvmlSource."""

    fake: Any
    source: Any
    clock: Any
    gpu: int
    description: str = "otel_ofu.sources.nvml.NvmlSource over the fake NVML (dry run)"

    @classmethod
    @contextmanager
    def opened(cls) -> Iterator[FakeNvmlMeter]:
        from otel_ofu.clock import ManualClock
        from otel_ofu.sources.nvml import NvmlSource
        from otel_ofu.testing.fake_nvml import FakeNvml

        fake = FakeNvml.build()
        gpu = fake.add_gpu("NVIDIA H100 80GB HBM3", max_sm_clock_mhz=1980, sm_clock_mhz=1980)
        clock = ManualClock()
        with fake.installed():
            source = NvmlSource(host="dry-run", clock=clock, background=False, clock_sample_hz=0.0)
            try:
                yield cls(fake, source, clock, gpu)
            finally:
                source.close()

    def begin(self) -> None:
        self.source.read()

    def end(self, implied_tensor_active: float, seconds: float) -> GpuReading | None:
        tpa = min(1.0, max(0.0, implied_tensor_active))
        hz = 1980e6
        elapsed = round(hz * seconds)
        self.fake.set_tensor_util(self.gpu, tpa * 100.0)
        self.fake.advance_cycles(self.gpu, sm_cycles_elapsed=elapsed, mma_cycles_active=round(elapsed * tpa))
        self.clock.advance(seconds)
        readings: tuple[GpuReading, ...] = self.source.read().readings
        return readings[0] if readings else None

    def close(self) -> None:
        return None


# --- the measurement ---------------------------------------------------------------------------------


@attrs.frozen
class Row:
    precision: str
    shape_set: str
    shape: Shape
    iterations: int = 0
    event_s: float = 0.0
    interval_s: float | None = None
    mfu_events: float | None = None
    mfu: float | None = None  # over the OFU reading's interval
    ofu: float | None = None
    ofu_raw: float | None = None
    ofu_path: str | None = None  # "cycles" or "tpa x clock"
    tile: tuple[int, int, int] | None = None
    factor: float | None = None
    skipped: str | None = None

    @property
    def ofu_corrected(self) -> float | None:
        return None if self.ofu is None or self.factor is None else self.ofu * self.factor

    def error_pp(self, corrected: bool) -> float | None:
        value = self.ofu_corrected if corrected else self.ofu
        return None if value is None or self.mfu is None else abs(value - self.mfu) * 100

    def as_json(self) -> dict[str, Any]:
        data = attrs.asdict(self)
        data["ofu_corrected"] = self.ofu_corrected
        data["error_raw_pp"] = self.error_pp(False)
        data["error_corrected_pp"] = self.error_pp(True)
        return data


def measure(
    backend: GemmBackend, meter: OfuMeter, precision: str, shape_set: str, shape: Shape, seconds: float, dry_run: bool
) -> Row:
    reason = backend.unsupported(precision, shape)
    peak = backend.peak(precision)
    if reason is None and peak is None:
        reason = f"the catalog has no {precision} peak for {backend.device_name!r}"
    if reason is not None:
        return Row(precision, shape_set, shape, skipped=reason)
    assert peak is not None
    gemm = backend.prepare(precision, shape)
    m, n, k = shape
    flops = 2.0 * m * n * k
    for _ in range(3):  # warm-up: library heuristics, clocks ramping up
        gemm()
    probe = backend.timed_loop(gemm, 5, lambda: None)
    iterations = max(3, math.ceil(seconds / max(probe / 5, 1e-9)))
    event_s = backend.timed_loop(gemm, iterations, _Bracket(meter).next)
    mfu_events = flops * iterations / event_s / peak
    if dry_run:
        # The "GPU" of the dry run does the padded FLOPs of a modelled kernel tile at the measured rate.
        candidates = TILES[PRECISION_TILES[precision]]
        implied = mfu_events / ofu_math.tile_quantization(m, n, k, kernel_tile(shape, candidates)).factor
    else:
        implied = math.nan
    reading = meter.end(implied, event_s)
    tile = estimated_tile(shape, precision)
    factor = ofu_math.tile_quantization(m, n, k, tile).factor
    if reading is None:
        return Row(precision, shape_set, shape, iterations, event_s, None, mfu_events, None, skipped="no NVML reading")
    interval_s = (reading.end_ns - reading.start_ns) / 1e9
    mfu = mfu_events * event_s / interval_s if interval_s > 0 else None
    try:
        values = gpu_values.compute(reading, precision=precision)
    except ofu_math.InvalidReading as exc:
        return Row(precision, shape_set, shape, iterations, event_s, interval_s, mfu_events, mfu, skipped=str(exc))
    return Row(
        precision,
        shape_set,
        shape,
        iterations,
        event_s,
        interval_s,
        mfu_events,
        mfu,
        values.ofu,
        values.ofu_raw,
        "cycles" if reading.cycles is not None else "tpa x clock",
        tile,
        factor,
    )


@attrs.define
class _Bracket:
    """Called right before the loop (starts the OFU interval) and right after it (nothing: ``end`` reads)."""

    meter: OfuMeter
    calls: int = 0

    def next(self) -> None:
        if self.calls == 0:
            self.meter.begin()
        self.calls += 1


def summarise(rows: Sequence[Row]) -> dict[str, Any]:
    ran = [r for r in rows if r.skipped is None]
    measured = [r for r in ran if r.error_pp(True) is not None]
    by_precision: dict[str, dict[str, float | int | None]] = {}
    for precision in PRECISIONS:
        subset = [r for r in ran if r.precision == precision]
        if subset:
            by_precision[precision] = _stats(subset)
    return {
        "shapes_measured": len(measured),
        "shapes_skipped": len(rows) - len(measured),
        "all": _stats(ran),
        "by_precision": by_precision,
    }


def _stats(rows: Sequence[Row]) -> dict[str, float | int | None]:
    """Over the shapes that ran: ``n`` of them, ``n_raw``/``n_corrected`` with an error, the MAE and shares."""
    if not rows:
        return {"n": 0}
    # A shape without an error (no OFU or no MFU) is left out, never counted as inside the target; the counts
    # say how many shapes each MAE and share is over.
    raw = [error for r in rows if (error := r.error_pp(False)) is not None]
    corrected = [error for r in rows if (error := r.error_pp(True)) is not None]
    return {
        "n": len(rows),
        "n_raw": len(raw),
        "n_corrected": len(corrected),
        "mae_raw_pp": statistics.fmean(raw) if raw else None,
        "mae_corrected_pp": statistics.fmean(corrected) if corrected else None,
        "within_2pp_raw": _within(raw),
        "within_2pp_corrected": _within(corrected),
    }


def _within(errors: Sequence[float]) -> float | None:
    return sum(e <= TARGET_PP for e in errors) / len(errors) if errors else None


def _cell(value: float | None, scale: float = 100.0, digits: int = 2) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def _share_cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def markdown(rows: Sequence[Row], summary: dict[str, Any], header: dict[str, Any]) -> str:
    lines = [
        f"# OFU vs MFU on controlled GEMMs ({header['mode']})",
        "",
        f"Device: {header['device']}. OFU source: {header['meter']}. Host: {header['host']}. "
        f"{header['seconds']} s per shape. Percentages are of the dense peak; errors in pp.",
        "",
        "| precision | shapes | M x N x K | iters | MFU (events) % | MFU (interval) % | OFU raw % | OFU % | path "
        "| tile | factor | OFU corrected % | raw err pp | corrected err pp |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        shape = "x".join(map(str, r.shape))
        if r.skipped is not None:
            lines.append(f"| {r.precision} | {r.shape_set} | {shape} | skipped: {r.skipped} |" + " |" * 10)
            continue
        lines.append(
            f"| {r.precision} | {r.shape_set} | {shape} | {r.iterations} | {_cell(r.mfu_events)} | {_cell(r.mfu)} "
            f"| {_cell(r.ofu_raw)} | {_cell(r.ofu)} | {r.ofu_path} | {'x'.join(map(str, r.tile or ()))} "
            f"| {_cell(r.factor, 1, 3)} | {_cell(r.ofu_corrected)} | {_cell(r.error_pp(False), 1)} "
            f"| {_cell(r.error_pp(True), 1)} |"
        )
    lines += [
        "",
        f"{summary['shapes_measured']} shapes measured, {summary['shapes_skipped']} without a corrected error "
        "(skipped, or no OFU, MFU or tile factor). n: shapes run; n raw, n corrected: the shapes each MAE and "
        "share is over.",
        "",
        "| precision | n | n raw | n corrected | MAE raw pp | MAE corrected pp | within 2 pp raw "
        "| within 2 pp corrected |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, s in [*summary["by_precision"].items(), ("all", summary["all"])]:
        if not s.get("n"):
            continue
        lines.append(
            f"| {label} | {s['n']} | {s['n_raw']} | {s['n_corrected']} | {_cell(s['mae_raw_pp'], 1)} "
            f"| {_cell(s['mae_corrected_pp'], 1)} | {_share_cell(s['within_2pp_raw'])} "
            f"| {_share_cell(s['within_2pp_corrected'])} |"
        )
    share = summary["all"].get("within_2pp_corrected")
    verdict = "not measured" if share is None else ("met" if share >= TARGET_SHARE else "**missed**")
    lines += [
        "",
        f"DESIGN.md target: OFU within {TARGET_PP:g} pp of MFU after tile correction for >= {TARGET_SHARE:.0%} "
        f"of shapes: {verdict}"
        + (f" ({share:.0%} of {summary['all']['n_corrected']})" if share is not None else "")
        + (" - dry run: this tests the script, it is not a GPU measurement." if header["dry_run"] else "."),
    ]
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu.validate_ofu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    parser.add_argument("--seconds", type=float, default=None, help="minimum loop time per shape (GPU 1.5, dry 0.02)")
    parser.add_argument("--quick", action="store_true", help="a few shapes only")
    parser.add_argument("--device", type=int, default=0, help="CUDA device index")
    parser.add_argument(
        "--precisions", default=",".join(PRECISIONS), help="comma-separated subset of bf16,fp16,tf32,fp8"
    )
    parser.add_argument("--dry-run", action="store_true", help="no GPU: numpy stand-in GEMMs and the fake NVML")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    precisions = [p for p in args.precisions.split(",") if p]
    unknown = sorted(set(precisions) - set(PRECISIONS))
    if unknown:
        print(f"unknown precisions {unknown}; choose from {', '.join(PRECISIONS)}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    if args.dry_run:
        seconds = args.seconds if args.seconds is not None else 0.02
        backend: Any = NumpyBackend.open()
        shapes = CPU_SHAPES
        with FakeNvmlMeter.opened() as meter:
            meter_description = meter.description
            rows = _run_all(backend, meter, precisions, shapes, seconds, dry_run=True)
    else:
        seconds = args.seconds if args.seconds is not None else 1.5
        backend = TorchBackend.open(args.device)
        shapes = QUICK_GPU_SHAPES if args.quick else GPU_SHAPES
        try:
            nvml_meter = NvmlMeter.open(backend, args.device)
        except Exception as exc:  # the MFU side still says something useful
            print(f"NVML source unavailable ({exc}); OFU columns will be empty", file=sys.stderr)
            nvml_meter = None
        meter_any: Any = nvml_meter if nvml_meter is not None else _NoMeter()
        meter_description = str(meter_any.description)
        try:
            rows = _run_all(backend, meter_any, precisions, shapes, seconds, dry_run=False)
        finally:
            meter_any.close()
    summary = summarise(rows)
    header = {
        "mode": "dry run: CPU stand-in, fake NVML" if args.dry_run else "GPU",
        "dry_run": bool(args.dry_run),
        "device": backend.description,
        "meter": meter_description,
        "host": f"{platform.node()} ({platform.platform()}, Python {platform.python_version()})",
        "seconds": seconds,
        "wall_s": round(time.perf_counter() - started, 1),
        "target": {"within_pp": TARGET_PP, "share": TARGET_SHARE},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    payload = {"header": header, "summary": summary, "rows": [r.as_json() for r in rows]}
    (args.out / "validate_ofu.json").write_text(json.dumps(payload, indent=2) + "\n")
    text = markdown(rows, summary, header)
    (args.out / "validate_ofu.md").write_text(text)
    print(text)
    print(f"wrote {args.out / 'validate_ofu.json'} and validate_ofu.md in {header['wall_s']} s")
    return 0


@attrs.define
class _NoMeter:
    description: str = "none (NVML unavailable)"

    def begin(self) -> None:
        return None

    def end(self, implied_tensor_active: float, seconds: float) -> GpuReading | None:
        return None

    def close(self) -> None:
        return None


def _run_all(
    backend: Any,
    meter: OfuMeter,
    precisions: Sequence[str],
    shapes: dict[str, tuple[Shape, ...]],
    seconds: float,
    *,
    dry_run: bool,
) -> list[Row]:
    rows: list[Row] = []
    for precision in precisions:
        for shape_set, group in shapes.items():
            for shape in group:
                try:
                    row = measure(backend, meter, precision, shape_set, shape, seconds, dry_run)
                except Exception as exc:  # one failing shape (out of memory, unsupported kernel) skips only itself
                    row = Row(precision, shape_set, shape, skipped=f"{type(exc).__name__}: {exc}"[:200])
                rows.append(row)
                print(
                    f"  {precision:5} {shape_set:9} {'x'.join(map(str, shape)):>16}  "
                    + (
                        f"skipped: {row.skipped}"
                        if row.skipped
                        else f"MFU {_cell(row.mfu)}%  OFU {_cell(row.ofu)}%  corrected {_cell(row.ofu_corrected)}%"
                    ),
                    flush=True,
                )
                backend.release()
    return rows


if __name__ == "__main__":
    sys.exit(main())
