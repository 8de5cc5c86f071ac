"""dcgm-exporter over HTTP: scrape its /metrics page and turn the Prometheus text into a snapshot.

dcgm-exporter publishes DCGM's own interval averages, so a reading covers ``[previous scrape, this
scrape]``. Both generations of its labels are accepted (``Hostname``/``hostname``, ``UUID``/``uuid``,
``pod``/``pod_name`` ...). A scrape that fails is an error of that scrape only: nothing from an
earlier scrape is ever re-emitted in its place.

``ExporterPages`` reads the parsed pages (no I/O): this source scrapes into it, and the collector feeds it the pages
an OpenTelemetry Collector's Prometheus receiver scraped, so a page gives the same readings either way.
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Mapping
from typing import Any

import attrs

from otel_ofu import gpu_share, io_counters, names, throttle
from otel_ofu.gpu_values import say_once
from otel_ofu.model import Clock, CycleCounters, GpuError, GpuIdentity, GpuReading, Snapshot
from otel_ofu.sources import keep_values, prometheus_text
from otel_ofu.sources.dcgm import LINKS, QUANTITY_OF_FIELD, CycleTracker, FieldValues, reading_or_error, split
from otel_ofu.sources.exporter_page import page_summary
from otel_ofu.sources.prometheus_text import ScrapeError
from otel_ofu.sources.prometheus_text import label as _label

# dcgm-exporter's labels, newest spelling first.
HOST_LABELS = ("hostname", "Hostname")
UUID_LABELS = ("UUID", "uuid")
MODEL_LABEL = "modelName"
GPU_LABEL = "gpu"
MIG_PROFILE_LABEL = "GPU_I_PROFILE"
MIG_ID_LABEL = "GPU_I_ID"
HINT_LABELS: Mapping[str, tuple[str, ...]] = {
    names.K8S_POD_NAME: ("pod", "pod_name"),
    names.K8S_NAMESPACE_NAME: ("namespace", "pod_namespace"),
    names.K8S_CONTAINER_NAME: ("container", "container_name"),
    names.K8S_POD_UID: ("pod_uid",),
    names.JOB_ID: ("hpc_job",),
}

# What the exporter's metric names are read as: names.DCGM_EXPORTER_FIELDS says which DCGM field each name is (every
# generation's tag), dcgm.QUANTITY_OF_FIELD which reading value that field feeds, in its base unit.
# The SM clock and its throttling belong to the physical GPU: a MIG instance without its own takes its
# parent's. So do power, energy and the PCIe and NVLink traffic, but as the board's: a MIG instance carries its share
# of them (otel_ofu.gpu_share), never the board's whole, which would be counted once per instance. A link rate printed
# on the instance's own series is taken as the board's too (PCIe and NVLink belong to the GPU), and shared the same way.
VIOLATIONS = tuple(QUANTITY_OF_FIELD[field_id] for field_id in names.DCGM_VIOLATION_FIELDS)
GPU_WIDE = ("sm_clock_hz", "max_sm_clock_hz", "clocks_event_reasons", *VIOLATIONS)
BOARD = ("power_w", "energy_j", *LINKS)


def normalize_url(url: str) -> str:
    """``host:9400`` -> ``http://host:9400/metrics``; anything but http(s) is refused in one line."""
    return prometheus_text.normalize_url(url, "dcgm-exporter", "http://HOST:9400/metrics")


def _int(text: str | None) -> int | None:
    try:
        return None if text is None else int(text)
    except ValueError:
        return None


@attrs.define
class PageEntry:
    """What one scrape says about one GPU or MIG instance."""

    labels: dict[str, str]
    got: FieldValues = attrs.field(factory=FieldValues)

    @property
    def values(self) -> dict[str, float]:
        return self.got.values


def parse_exposition(text: str) -> dict[tuple[str, str | None], PageEntry]:
    """Entries keyed by (UUID, MIG instance id) from exposition text; ScrapeError when it is not parseable."""
    return entries_of(prometheus_text.parse_samples(text))


def entries_of(samples: list[prometheus_text.Sample]) -> dict[tuple[str, str | None], PageEntry]:
    """Entries keyed by (UUID, MIG instance id) from a page's samples."""
    entries: dict[tuple[str, str | None], PageEntry] = {}
    for sample in samples:
        labels = sample.labels
        uuid = _label(labels, UUID_LABELS)
        if uuid is None:
            continue  # not a GPU series; without a UUID it has no identity to report under
        # Any GPU series makes the GPU known, so one without our fields is reported, not lost.
        entry = entries.setdefault((uuid, _label(labels, (MIG_ID_LABEL,))), PageEntry(dict(labels)))
        field_id = names.DCGM_EXPORTER_FIELDS.get(sample.name)
        if field_id is not None:
            entry.got.add(field_id, sample.value)
    return entries


@attrs.define
class ExporterPages:
    """One dcgm-exporter's pages, one after the other, as snapshots: everything the source does with a page once it
    is parsed, and the state kept between pages (the previous page's time, the counters' last values). No I/O:
    ``DcgmExporterSource`` feeds it the pages it scrapes, and the collector (``otel_ofu_collector.otlp.dcgm_series``)
    the pages an OpenTelemetry Collector's Prometheus receiver scraped, so both read a page with this one code.

    ``previous_ns`` None: the first page's interval is unknown, and its readings start where they end (a point in
    time, whose interval the collector's windows infer)."""

    host_fallback: str | None = None
    previous_ns: int | None = None
    _cycles: CycleTracker = attrs.field(init=False, factory=CycleTracker)
    _energy: throttle.EnergyTracker = attrs.field(init=False, factory=throttle.EnergyTracker)
    _violations: throttle.ViolationTracker = attrs.field(init=False, factory=throttle.ViolationTracker)
    _links: io_counters.IoIntegrator = attrs.field(init=False, factory=io_counters.IoIntegrator)

    def snapshot(self, entries: Mapping[tuple[str, str | None], PageEntry], now: int) -> Snapshot:
        """The readings (and errors) of one page's entries (``entries_of``), read at ``now``; the interval runs
        from the previous page."""
        start = now if self.previous_ns is None else self.previous_ns
        self.previous_ns = now
        parents = {uuid: entry for (uuid, mig_id), entry in entries.items() if mig_id is None}
        has_instances = {uuid for (uuid, mig_id) in entries if mig_id is not None}
        results: list[GpuReading | GpuError] = []
        for (uuid, mig_id), entry in entries.items():
            if mig_id is None and uuid in has_instances and "tensor_active" not in entry.values:
                continue  # a MIG parent's GPU-wide fields serve its instances; its TPA lives on them
            if mig_id is not None and uuid in parents:
                for field in (*GPU_WIDE, *BOARD):
                    if field in parents[uuid].values:
                        entry.values.setdefault(field, parents[uuid].values[field])
            # A MIG parent that reports a TPA of its own beside its instances leaves the board to them.
            board_share = None if mig_id is None and uuid in has_instances else self._share(entry)
            results.extend(self._reading(uuid, entry, start, now, board_share))
        for tracker in (self._cycles, self._energy, self._violations, self._links):
            tracker.forget(item.gpu.key for item in results if item.gpu is not None)
        return split(results)

    def _identity(self, uuid: str, labels: Mapping[str, str]) -> GpuIdentity:
        hints: dict[str, str] = {}
        for attribute, keys in HINT_LABELS.items():
            value = _label(labels, keys)
            if value is not None:
                hints[attribute] = value
        if names.K8S_POD_NAME in hints:
            hints[names.JOB_SCHEDULER] = "kubernetes"
        elif names.JOB_ID in hints:
            hints[names.JOB_SCHEDULER] = "slurm"  # hpc_job comes from the HPC job-mapping directory
        index = _int(labels.get(GPU_LABEL))
        return GpuIdentity(
            uuid=uuid,
            model=labels.get(MODEL_LABEL) or "unknown",
            index=-1 if index is None else index,
            host=_label(labels, HOST_LABELS) or self.host_fallback or "unknown",
            mig_profile=_label(labels, (MIG_PROFILE_LABEL,)),
            mig_instance_id=_int(_label(labels, (MIG_ID_LABEL,))),
            hints=hints,
        )

    @staticmethod
    def _share(entry: PageEntry) -> float | None:
        """A MIG instance's share of its board (1 for a whole GPU), said once when the slice count is assumed;
        None for an instance whose profile cannot be read (its power is left out, not counted whole per instance)."""
        if _label(entry.labels, (MIG_ID_LABEL,)) is None:
            return 1.0
        profile = _label(entry.labels, (MIG_PROFILE_LABEL,))
        if profile is None or gpu_share.mig_slices(profile) is None:
            return None
        model = entry.labels.get(MODEL_LABEL)
        if gpu_share.assumed_slices(model, profile):
            say_once(
                f"MIG profile {profile!r} of {model!r}: the catalog has no compute-slice count for the model, so its "
                f"power and energy are shared as {gpu_share.DEFAULT_MIG_SLICES} slices' (add the model to the catalog)"
            )
        return gpu_share.gpu_share(model, profile)

    def _reading(
        self, uuid: str, entry: PageEntry, start: int, now: int, board_share: float | None = 1.0
    ) -> tuple[GpuReading | GpuError, ...]:
        """The GPU's reading, and beside it the error when it gives no OFU (what it did give is kept)."""
        identity = self._identity(uuid, entry.labels)
        values = entry.values
        # The board's link rates times the device's share, over the scrape interval (before the cycle counters may
        # move the reading's start to their own span): scrape-to-scrape spans tile time.
        links = io_counters.LinkFields()
        if board_share is not None:
            rates = io_counters.link_rates(
                **{link: values[link] * board_share for link in LINKS if link in values},
            )
            links = self._links.add(identity.key, rates, start, now)
        cycles: CycleCounters | None = None
        if "sm_cycles_elapsed" in values and "mma_cycles_active" in values:
            # The exporter refreshes counters on its own period: the delta spans from when the previous
            # value was first seen here, which is as close to the counters' own span as a scrape gets.
            delta = self._cycles.update(
                identity.key, int(values["sm_cycles_elapsed"]), int(values["mma_cycles_active"]), now
            )
            if delta is not None:
                cycles, start = delta
        reading = GpuReading(
            gpu=identity,
            start_ns=start,
            end_ns=now,
            tensor_active=values.get("tensor_active"),
            sm_clock_hz=values.get("sm_clock_hz"),
            max_sm_clock_hz=values.get("max_sm_clock_hz"),
            sm_active=values.get("sm_active"),
            dram_active=values.get("dram_active"),
            engine_active=values.get("engine_active"),
            sm_occupancy=values.get("sm_occupancy"),
            cycles=cycles,
            **self._loss_inputs(identity.key, values, now, board_share=board_share),
            **links,
        )
        blank = " (blank sentinel or NaN)" if {"tensor_active", "sm_clock_hz"} & entry.got.blank else ""
        result = reading_or_error(reading)
        if isinstance(result, GpuError) and blank:
            result = attrs.evolve(result, message=result.message + blank)
        return keep_values(reading, result)

    def _loss_inputs(
        self, key: str, values: Mapping[str, float], now: int, *, board_share: float | None
    ) -> dict[str, Any]:
        """Power, energy and throttle shares of one scrape entry as GpuReading fields.

        dcgm-exporter refreshes its values on its own period (30 s by default) and prints no timestamps:
        a scrape whose energy counter has not moved repeats the previous refresh, so violation counters
        are not differenced on it (they would read as an unthrottled interval). Power and energy are the
        board's times ``board_share`` (a MIG instance's share of its GPU; None: left out), so that the instances
        of a GPU add up to the board and nothing is counted twice.
        """
        result: dict[str, Any] = {}
        observation = None
        # Left out or not, the counter is still followed: whether it moved says whether this scrape is fresh.
        share = 1.0 if board_share is None else board_share
        if "energy_j" in values:
            # The share of the board's counter is a counter of its own: its deltas are the board's times the share.
            observation = self._energy.update(key, values["energy_j"] * share, now)
            if board_share is not None:
                result["energy"] = observation.energy
        watts = values.get("power_w")
        power = throttle.interval_power(observation, None if watts is None else watts * share)
        result["power_w"] = power if board_share is not None else None
        counters = {
            field_id: values[quantity] * names.DCGM_VIOLATION_UNIT_NS
            for field_id in names.DCGM_VIOLATION_FIELDS
            if (quantity := QUANTITY_OF_FIELD[field_id]) in values
        }
        shares: dict[str, float] = {}
        if counters and not (observation is not None and observation.stale):
            by_reason = throttle.sum_by_reason(counters, names.DCGM_VIOLATION_FIELDS)
            shares = self._violations.update(key, by_reason, now)
        bitmask = values.get("clocks_event_reasons")
        sampled = throttle.bitmask_shares([] if bitmask is None else [int(bitmask)])
        result["throttle"] = throttle.merge_shares(shares, sampled)
        return result


@attrs.define
class DcgmExporterSource:
    """Scrapes one dcgm-exporter endpoint per read."""

    url: str = attrs.field(converter=normalize_url)
    timeout_s: float = 5.0
    host_fallback: str | None = None
    clock: Clock = time.time_ns
    name: str = "dcgm-exporter"
    _pages: ExporterPages = attrs.field(init=False)
    _scrape: prometheus_text.Scrape = attrs.field(init=False, factory=prometheus_text.Scrape)

    def __attrs_post_init__(self) -> None:
        if self.host_fallback is None:
            self.host_fallback = urllib.parse.urlsplit(self.url).hostname
        # The first read covers the time since the source was opened.
        self._pages = ExporterPages(self.host_fallback, previous_ns=self.clock())

    def fetch(self) -> str:
        """The exposition text, or ScrapeError saying in one line why not (the scrape bounded: ``prometheus_text``)."""
        return self._scrape.fetch(self.url, self.timeout_s)

    def interrupt(self) -> None:
        """The producer is stopping: a scrape in flight ends now."""
        self._scrape.interrupt()

    def _not_dcgm_exporter(self, samples: list[prometheus_text.Sample]) -> str:
        """Why a page gave no GPU, in one line naming what it had: a wrong port or another exporter's page is
        otherwise an empty read that looks like a node without GPUs."""
        dcgm = [sample for sample in samples if sample.name.startswith("DCGM_")]
        if dcgm:
            return (
                f"{self.url}: {len(dcgm)} DCGM series but none with a GPU UUID label ({' or '.join(UUID_LABELS)}), "
                f"so no GPU to report them under; {page_summary(samples)}"
            )
        return (
            f"{self.url}: no dcgm-exporter metric on the page (no DCGM_FI_* series); {page_summary(samples)}. "
            "Is this dcgm-exporter's /metrics (port 9400 by default)?"
        )

    def read(self) -> Snapshot:
        now = self.clock()
        try:
            samples = prometheus_text.parse_samples(self.fetch())
        except ScrapeError as error:
            self._pages.previous_ns = now  # a failed scrape ends the interval too: nothing is re-emitted later
            return Snapshot(errors=(GpuError(names.ErrorReason.SCRAPE, str(error)),))
        entries = entries_of(samples)
        if not entries:
            self._pages.previous_ns = now
            return Snapshot(errors=(GpuError(names.ErrorReason.SCRAPE, self._not_dcgm_exporter(samples)),))
        return self._pages.snapshot(entries, now)

    def close(self) -> None:
        """Nothing to release: every scrape opens and closes its own connection."""
