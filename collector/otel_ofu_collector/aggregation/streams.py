"""The GPU streams the windows know, and what their identities cost: admission, bounds, staleness.

A stream is a GPU (or partition) as its points name it (the decoder's stream key). The table keeps, per stream, the
end of its latest point (``last_seen``: what staleness and the inference of intervals go by), the start of its first
point here (which tells a counter series begun with it from one begun before), and the interned identities
(``profile_of``). It decides whether a new stream may start (``refusal``): under ``max_streams`` and
``max_state_bytes``, of which a tenth is kept for streams that reported before (evicted since as silent) and their
jobs, so that a flood of new identities cannot lock the fleet's own GPUs out. The decoder's identity cache counts in
the bytes (``cache_budget``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from otel_ofu import names
from otel_ofu_collector.aggregation.cells import Profile
from otel_ofu_collector.aggregation.jobs import JOB_STATE_BYTES, RESERVED_SHARE, JobLedger, open_places
from otel_ofu_collector.config import AggregatorConfig

R = names.RejectReason
# What ``max_state_bytes`` counts per GPU stream besides the identity values it keeps: its cells, loss inputs and
# stream and energy entries (the benchmarks measure about 1.8 KB in all).
STREAM_STATE_BYTES = 2048
# What a new stream's identity may add besides its values: an interned tuple's slots.
_IDENTITY_BYTES = 64


def profile_bytes(profile: Profile) -> int:
    """An interned profile's size, roughly: its values and a tuple's slots."""
    return _IDENTITY_BYTES + 8 * len(profile) + sum(len(value) for value in profile if value is not None)


@attrs.define
class StreamTable:
    config: AggregatorConfig
    ledger: JobLedger  # the jobs' state counts in the same bound
    profile_keys: tuple[str, ...]  # the identity keys a profile keeps, in order
    last_seen: dict[str, int] = attrs.field(factory=dict)  # key -> end of its latest point
    first_starts: dict[str, int] = attrs.field(factory=dict)  # key -> start of its first point here
    # key -> (end, start) of the latest interval inferred for a point without one (``inferred_start``)
    instant_starts: dict[str, tuple[int, int]] = attrs.field(factory=dict)
    # Hashes of evicted streams' keys, oldest first (at most max_streams): they find a place kept for them.
    returning: dict[int, None] = attrs.field(factory=dict)
    profiles: dict[Profile, Profile] = attrs.field(factory=dict)
    rejected_streams: int = 0  # new streams refused over max_streams (counted here and by the counters)
    rejected_state: int = 0  # new streams refused at max_state_bytes
    evicted: int = 0
    _bytes: int = 0  # the streams' own (``STREAM_STATE_BYTES`` and their keys)
    _profiles_bytes: int = 0
    _cache_bytes: int = 0  # the decoder's identity cache (``cache_budget``)

    @property
    def state_bytes(self) -> int:
        """The windows' state in bytes, as bounded by ``max_state_bytes``: a fixed part per GPU stream and job and the
        identity values the windows keep."""
        return self._bytes + self.ledger.state_bytes + self._profiles_bytes

    def cache_budget(self, cache_bytes: int) -> int:
        """The decoder's identity cache now holds ``cache_bytes``: counted in the state bound from now on; what it may
        hold at most is what the bound leaves the windows' own state."""
        self._cache_bytes = cache_bytes
        return max(0, self.config.max_state_bytes - self.state_bytes)

    def profile_of(self, identity: Mapping[str, str]) -> Profile:
        """What the windows keep of an identity (job, group, job attribute and partition values), interned; at the
        state bound an identity is not kept (its points are refused anyway)."""
        raw = tuple(map(identity.get, self.profile_keys))
        found = self.profiles.get(raw)
        if found is None:
            size = profile_bytes(raw)
            if self.state_bytes + self._cache_bytes + size > self.config.max_state_bytes:
                return raw
            found = self.profiles[raw] = raw
            self._profiles_bytes += size
        return found

    def refusal(self, stream_key: str, identity: Mapping[str, str]) -> str | None:
        """Why a stream not in the table cannot start (a ``names.RejectReason``, not yet counted: a late point is
        counted as late only), None when it can.

        A tenth of ``max_streams`` and of ``max_state_bytes`` is kept for streams that reported before: a flood of
        new identities fills the rest and is refused there, while the fleet's own GPUs coming back still find room."""
        config = self.config
        returning = hash(stream_key) in self.returning
        cap = config.max_streams if returning else open_places(config.max_streams)
        if len(self.last_seen) >= cap:
            return R.MAX_STREAMS
        # What the stream may bring: its entry, its identity values (interned as a profile, and the job's id) and a
        # job's state if the job is new.
        brings = STREAM_STATE_BYTES + 2 * len(stream_key) + _IDENTITY_BYTES + 2 * sum(map(len, identity.values()))
        job_id = identity.get(names.JOB_ID)
        if job_id and job_id not in self.ledger.jobs:
            brings += JOB_STATE_BYTES
        share = 1.0 if returning else 1.0 - RESERVED_SHARE
        if self.state_bytes + self._cache_bytes + brings > config.max_state_bytes * share:
            return R.MAX_STATE
        return None

    def count_refusal(self, reason: str) -> None:
        if reason == R.MAX_STREAMS:
            self.rejected_streams += 1
        else:
            self.rejected_state += 1

    def start(self, stream_key: str, start_ns: int, end_ns: int) -> None:
        """A new stream, its first point over (start, end]."""
        self.last_seen[stream_key] = end_ns
        self.first_starts[stream_key] = start_ns
        self._bytes += STREAM_STATE_BYTES + 2 * len(stream_key)

    def inferred_start(self, stream_key: str, end_ns: int, last_seen: int | None) -> int:
        """Where the interval of a point without one begins: the stream's previous time (its latest end before this
        point's), if within ``stale_after_s``; the point's own end (no time) for a stream's first. Every point of one
        interval (its OFU, its gauges) gets the same start, in whatever order they come: scrapes without start times
        (the SDK's encoder and Prometheus leave gauges without one) are weighed alike."""
        found = self.instant_starts.get(stream_key)
        if found is not None and found[0] == end_ns:
            return found[1]
        start_ns = end_ns
        if last_seen is not None and 0 < end_ns - last_seen <= self.config.stale_after_ns:
            start_ns = last_seen
        self.instant_starts[stream_key] = (end_ns, start_ns)
        return start_ns

    def evict(self, cutoff_ns: int, in_use: Iterable[Profile]) -> None:
        """Let go of the streams unseen since ``cutoff_ns`` (remembered as returning), and of the profiles no open
        window uses (``in_use``) once the intern table has far outgrown the streams."""
        stale = [key for key, seen in self.last_seen.items() if seen <= cutoff_ns]
        for key in stale:
            self.returning[hash(key)] = None
            del self.last_seen[key]
            self.first_starts.pop(key, None)
            self.instant_starts.pop(key, None)
            self._bytes -= STREAM_STATE_BYTES + 2 * len(key)
        self.evicted += len(stale)
        while len(self.returning) > self.config.max_streams:  # the longest gone are forgotten first
            del self.returning[next(iter(self.returning))]
        for key in [key for key, (seen, _start) in self.instant_starts.items() if seen <= cutoff_ns]:
            del self.instant_starts[key]
        if len(self.profiles) > 2 * len(self.last_seen) + 1024:
            used = {profile: profile for profile in in_use}
            self.profiles = used
            self._profiles_bytes = sum(map(profile_bytes, used))
