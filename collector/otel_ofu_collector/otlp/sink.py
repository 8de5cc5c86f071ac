"""The one protocol between the decoder and what it feeds: ``PointSink`` (the windows) and ``PartialSink`` (the merge
tier). Each ``add_*`` returns None when it took the point and a ``names.RejectReason`` code when it did not; the sink
owns the lock that guards it, and the decoder takes that lock (once a request's parsing is done) for the sink's calls
and for its own caches and counters, which go with them. Both read paths of the decoder (``otlp.points``, point by
point, and ``otlp.shapes``, through a layout's template) feed it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Protocol

from otel_ofu_collector.results import PartialWindow


class PointSink(Protocol):
    """What the decoder feeds: the windows (``aggregation.windows.Aggregator``). Each ``add_*`` returns None when it
    took the point, else why not (a ``names.RejectReason`` code); ``lock`` guards the sink, and whoever calls it
    holds the lock."""

    lock: threading.Lock

    def profile_of(self, identity: Mapping[str, str]) -> Any:
        """What the sink keeps of an identity, derived once per Resource and passed with its points."""
        ...

    def add_ofu(
        self, stream_key: str, value: float, start_ns: int, end_ns: int, identity: Mapping[str, str], profile: Any
    ) -> str | None: ...

    def add_unmeasured(
        self, stream_key: str, start_ns: int, end_ns: int, identity: Mapping[str, str], profile: Any
    ) -> str | None:
        """A GPU's interval without OFU (``gpu.ofu.unmeasured``): billed, as neither work nor idleness."""
        ...

    def add_mfu(self, job_id: str, value: float, time_ns: int, identity: Mapping[str, str]) -> str | None: ...

    def add_progress(
        self,
        job_id: str,
        value: float,
        time_ns: int,
        identity: Mapping[str, str],
        operation: str | None = None,
        series_start_ns: int = 0,
    ) -> str | None:
        """A job's progress: a ``job.step`` point (``operation`` None: the last step it completed at ``time_ns``), or a
        ``job.checkpoint.time`` reading (seconds spent on ``operation`` since ``series_start_ns``, cumulative)."""
        ...

    def add_gpu_inputs(
        self,
        stream_key: str,
        start_ns: int,
        end_ns: int,
        identity: Mapping[str, str],
        values: Mapping[str, float],
        throttle: Mapping[str, float],
    ) -> str | None:
        """A GPU's gauges over one interval, and its throttle shares by reason."""
        ...

    def add_gpu_counters(
        self,
        stream_key: str,
        series_start_ns: int,
        end_ns: int,
        identity: Mapping[str, str],
        counters: Mapping[str, float],
    ) -> str | None:
        """A GPU's cumulative counters (energy, link bytes by direction) read at ``end_ns``."""
        ...

    def live_entries(self) -> int:
        """The GPU streams and jobs the sink keeps now: what the resource cache's bound follows."""
        ...

    def cache_budget(self, cache_bytes: int) -> int:
        """Tells the sink the decoder's identity cache holds ``cache_bytes`` (which count in its state bound); the
        most the cache may hold."""
        ...


class PartialSink(Protocol):
    """The merge tier's ingest surface (``aggregation.merge.MergeAggregator``), likewise."""

    lock: threading.Lock

    def add_partial(self, partial: PartialWindow) -> str | None: ...
