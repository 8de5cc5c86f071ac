"""One place that turns ``--source KIND`` (and its options) into an open source and a line saying why.

Each kind's module is imported only in its own branch: NVML and DCGM bindings stay optional, and a
missing one costs a one-line ``SourceUnavailable``, never an ImportError at start-up.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from otel_ofu.cli_support import CommandOptions, positive_float, url_or_host_port
from otel_ofu.model import Clock, Source, SourceUnavailable
from otel_ofu.sources.max_clock import max_clock_option, with_max_clocks

SOURCE_KINDS = ("auto", "nvml", "dcgm", "dcgm-exporter", "amd-exporter", "replay", "sim")


def add_source_options(options: CommandOptions) -> None:
    """The options that choose and open a source, declared once for every command that reads one.

    Their variables are the plain ``OTEL_OFU_*`` ones whatever the command: one node's settings serve
    ``run`` and ``snapshot`` alike.
    """
    options.option(
        "--source",
        default="auto",
        choices=SOURCE_KINDS,
        help="where the counters come from; auto picks NVML, then DCGM, and says which and why",
    )
    options.option(
        "--url",
        metavar="URL",
        type=url_or_host_port,
        help="the exporter's /metrics URL (--source dcgm-exporter, e.g. http://HOST:9400/metrics; --source "
        "amd-exporter, the AMD Device Metrics Exporter, e.g. http://HOST:5000/metrics)",
    )
    options.option(
        "--file", metavar="FILE", help="capture to replay: otel-ofu JSON lines or dcgmi dmon text (--source replay)"
    )
    options.option("--host", metavar="NAME", help="host.name of this node (default: the hostname or the source's own)")
    options.option("--seed", metavar="N", type=int, help="seed of the simulated fleet (--source sim)")
    options.option(
        "--clock-sample-hz",
        type=positive_float,
        default=10.0,
        metavar="HZ",
        help="SM clock samples per second averaged over each interval (--source nvml)",
    )
    options.option(
        "--nvml-library",
        metavar="PATH",
        help="NVML shared library to load instead of libnvidia-ml.so.1 (--source nvml)",
    )
    options.option("--dcgm-address", metavar="HOST", default="localhost", help="DCGM host engine (--source dcgm)")
    options.option(
        "--model",
        metavar="NAME",
        help="hw.model of a dcgmi dmon replay, which prints no device names (e.g. 'NVIDIA H100 80GB HBM3')",
    )
    options.option(
        "--max-sm-clock",
        metavar="MODEL=MHZ,...",
        type=max_clock_option,
        help="max SM clock in MHz of models whose source reports none (e.g. 'NVIDIA A800 80GB PCIe=1410'); "
        "never overrides the device's own",
    )


def open_from_args(args: argparse.Namespace, clock: Clock | None = None) -> tuple[Source, str]:
    """``open_source`` with the options ``add_source_options`` declared."""
    options: dict[str, Any] = {"clock_sample_hz": args.clock_sample_hz, "address": args.dcgm_address}
    if args.nvml_library:
        options["library"] = args.nvml_library
    if args.model:
        options["model"] = args.model
    source, why = open_source(
        args.source, url=args.url, file=args.file, host=args.host, seed=args.seed, clock=clock, **options
    )
    return with_max_clocks(source, args.max_sm_clock), why


NVML_OPTIONS = ("clock_sample_hz", "background", "library")


def _nvml(host: str | None, clock: Clock | None, options: dict[str, Any]) -> Source:
    try:
        from otel_ofu.sources.nvml import NvmlSource
    except ImportError as error:
        raise SourceUnavailable(f"NVML source cannot load: {error}") from None
    kwargs: dict[str, Any] = {key: options[key] for key in NVML_OPTIONS if options.get(key) is not None}
    if clock is not None:
        kwargs["clock"] = clock
    source: Source = NvmlSource(host, **kwargs)
    return source


def _dcgm(host: str | None, clock: Clock | None, options: dict[str, Any]) -> Source:
    from otel_ofu.clock import wall_clock
    from otel_ofu.sources.dcgm import DcgmSource

    return DcgmSource.open(
        options.get("address", "localhost"),
        host=host,
        update_interval_s=float(options.get("update_interval_s", 1.0)),
        clock=clock or wall_clock,
    )


def _replay(file: str | Path | None, host: str | None, clock: Clock | None, options: dict[str, Any]) -> Source:
    from otel_ofu.clock import wall_clock
    from otel_ofu.sources.capture import ReplaySource, is_capture
    from otel_ofu.sources.dcgmi_dmon import DcgmiDmonSource, is_dmon_text

    if file is None:
        raise SourceUnavailable("--source replay needs --file CAPTURE (our JSON lines or dcgmi dmon text)")
    path = Path(file)
    try:
        with path.open(encoding="utf-8", errors="replace") as handle:
            head = [line for line in (handle.readline() for _ in range(64)) if line.strip()]
    except OSError as error:
        raise SourceUnavailable(f"cannot open capture {path}: {error.strerror}") from None
    if head and is_capture(head[0]):
        return ReplaySource(path)
    if is_dmon_text(head):
        return DcgmiDmonSource(path, host=host, model=str(options.get("model", "unknown")), clock=clock or wall_clock)
    if head and head[0].lstrip().startswith("{"):
        return ReplaySource(path)  # ours with a damaged first line: its bad lines are counted, not fatal
    raise SourceUnavailable(f"{path} is neither an otel-ofu capture (JSON lines) nor dcgmi dmon output")


def describe(source: Source) -> str:
    """What a replayed file is, in words (never a class name)."""
    from otel_ofu.sources.dcgmi_dmon import DcgmiDmonSource

    return "dcgmi dmon output" if isinstance(source, DcgmiDmonSource) else "the otel-ofu capture"


def open_source(
    kind: str,
    *,
    url: str | None = None,
    file: str | Path | None = None,
    host: str | None = None,
    seed: int | None = None,
    clock: Clock | None = None,
    **options: Any,
) -> tuple[Source, str]:
    """Open the source of ``kind``; returns it with a one-line "why this source", or raises SourceUnavailable.

    ``auto`` tries NVML, then DCGM, and when neither is there says so, with each one's reason.
    Options each kind takes (others are ignored): nvml ``clock_sample_hz``, ``background``, ``library``;
    dcgm ``address`` (None: embedded host engine), ``update_interval_s``; dcgm-exporter and amd-exporter ``timeout_s``;
    replay of dcgmi text ``model`` (dmon prints no device names).
    """
    if kind == "auto":
        reasons = []
        for candidate, opener in (("NVML", _nvml), ("DCGM", _dcgm)):
            try:
                source = opener(host, clock, options)
            except SourceUnavailable as error:
                reasons.append(f"{candidate}: {error}")
                continue
            tried = f" ({'; '.join(reasons)})" if reasons else ""
            return source, f"auto: using {candidate}{tried}"
        raise SourceUnavailable(
            "auto found no GPU source (" + "; ".join(reasons) + "); use --source dcgm-exporter --url URL, "
            "--source replay --file FILE or --source sim"
        )
    if kind == "nvml":
        return _nvml(host, clock, options), "nvml: reading the local GPUs through NVML"
    if kind == "dcgm":
        return _dcgm(host, clock, options), f"dcgm: reading DCGM at {options.get('address', 'localhost')}"
    if kind == "dcgm-exporter":
        from otel_ofu.clock import wall_clock
        from otel_ofu.sources.dcgm_exporter import DcgmExporterSource

        if not url:
            raise SourceUnavailable("--source dcgm-exporter needs --url http://HOST:9400/metrics")
        exporter = DcgmExporterSource(
            url, timeout_s=float(options.get("timeout_s", 5.0)), host_fallback=host, clock=clock or wall_clock
        )
        return exporter, f"dcgm-exporter: scraping {exporter.url}"
    if kind == "amd-exporter":
        from otel_ofu.clock import wall_clock
        from otel_ofu.sources.amd_exporter import AmdExporterSource

        if not url:
            raise SourceUnavailable("--source amd-exporter needs --url http://HOST:5000/metrics")
        amd = AmdExporterSource(
            url, timeout_s=float(options.get("timeout_s", 5.0)), host_fallback=host, clock=clock or wall_clock
        )
        return amd, f"amd-exporter: scraping the AMD Device Metrics Exporter at {amd.url}"
    if kind == "replay":
        source = _replay(file, host, clock, options)
        return source, f"replay: {describe(source)} {file}"
    if kind == "sim":
        from otel_ofu.clock import wall_clock
        from otel_ofu.sources.simulated import SimulatedFleet

        # Without a clock the fleet runs on wall time, like a real source under `run`.
        fleet = SimulatedFleet.demo(seed=7 if seed is None else seed, clock=clock or wall_clock)
        return fleet, f"sim: the simulated demo fleet (seed {7 if seed is None else seed})"
    raise SourceUnavailable(f"unknown source {kind!r}; choose one of {', '.join(SOURCE_KINDS)}")
