"""The attribution chain the producer consults per GPU: links in order, results cached per GPU.

Merge (earlier links win):
- the job: the first link that gives ``job.id`` decides ``job.id``, ``job.name`` and ``job.scheduler``
  together, so a name or scheduler from one source is never paired with another source's id; when no
  link knows a job id, ``job.name`` and ``job.scheduler`` each come from the first link that has one;
- the pod: likewise, the first link that gives ``k8s.pod.name`` decides the ``k8s.*`` attributes;
- ``gpu.precision``: the first link with a known precision; ``unknown`` only when no link knows better.

The default order goes from the most specific evidence to the least: what the source itself saw on the
GPU (hints), what the processes on the GPU say about themselves (process_env), the scheduler's per-GPU
records (slurm_mapping, kubernetes), and last the node-wide default that applies to every GPU alike
(static).

Results are cached per GPU (its key and hints) and refreshed every ``refresh_s`` of the injected clock,
not per sample: links read files, /proc and a gRPC socket. A link whose evidence is refreshed apart (the
kubernetes link's pod list, on a thread of its own) says so with a ``generation`` that changes with it;
a GPU is asked about again as soon as any link's generation moves. A link that raises is skipped for
that GPU, logged at most once per ``refresh_s``, and never stops the other links or GPUs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Final

import attrs

from otel_ofu import names
from otel_ofu.attribution import hints, kubernetes, kubernetes_pods, process_env, slurm_mapping, static
from otel_ofu.attribution.base import ATTRIBUTE_KEYS, UNKNOWN_PRECISION, Attributor
from otel_ofu.model import Clock, GpuIdentity

log = logging.getLogger(__name__)

LINK_NAMES: Final = (
    hints.LINK_NAME,
    process_env.LINK_NAME,
    slurm_mapping.LINK_NAME,
    kubernetes.LINK_NAME,
    static.LINK_NAME,
)
DEFAULT_ORDER: Final = LINK_NAMES
DEFAULT_REFRESH_S: Final = 30.0

_JOB_GROUP: Final = (names.JOB_ID, names.JOB_NAME, names.JOB_SCHEDULER)
_POD_GROUP: Final = (names.K8S_POD_NAME, names.K8S_NAMESPACE_NAME, names.K8S_CONTAINER_NAME, names.K8S_POD_UID)
_EMPTY: Final[Mapping[str, str]] = MappingProxyType({})


def merge(results: Sequence[Mapping[str, str]]) -> dict[str, str]:
    """Merge link results given in chain order (see the module docstring for the rules)."""
    merged: dict[str, str] = {}
    for group, leader in ((_JOB_GROUP, names.JOB_ID), (_POD_GROUP, names.K8S_POD_NAME)):
        decider = next((result for result in results if result.get(leader)), None)
        if decider is not None:
            merged.update({key: decider[key] for key in group if decider.get(key)})
            continue
        for key in group:
            value = next((result[key] for result in results if result.get(key)), None)
            if value is not None:
                merged[key] = value
    precisions = [result[names.GPU_PRECISION] for result in results if result.get(names.GPU_PRECISION)]
    known = [precision for precision in precisions if precision != UNKNOWN_PRECISION]
    if known or precisions:
        merged[names.GPU_PRECISION] = (known or precisions)[0]
    return merged


def _as_links(links: Iterable[Attributor]) -> tuple[Attributor, ...]:
    return tuple(links)


@attrs.frozen
class _Entry:
    hints: tuple[tuple[str, str], ...]
    generations: tuple[int, ...]
    attributes: Mapping[str, str]
    computed_ns: int


@attrs.define
class AttributionChain:
    """Consulted per GPU by the producer; itself an ``Attributor`` (``attribute``/``close``)."""

    links: Sequence[Attributor] = attrs.field(converter=_as_links)
    refresh_s: float = attrs.field(default=DEFAULT_REFRESH_S)
    clock: Clock = time.monotonic_ns  # nanoseconds; the producer may pass its own (simulated) clock
    name: str = attrs.field(default="chain", init=False)
    _cache: dict[str, _Entry] = attrs.field(factory=dict, init=False, repr=False)
    _last_logged_ns: dict[str, int] = attrs.field(factory=dict, init=False, repr=False)
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False, repr=False)

    @refresh_s.validator
    def _check_refresh(self, _attribute: object, value: float) -> None:
        if not value > 0:
            raise ValueError(f"attribution refresh period must be positive, got {value}")

    def attribute(self, gpu: GpuIdentity) -> Mapping[str, str]:
        """The merged attributes of ``gpu`` (read-only), from the cache while it is fresh."""
        now = self.clock()
        gpu_hints = tuple(sorted(gpu.hints.items()))
        generations = tuple(getattr(link, "generation", 0) for link in self.links)
        with self._lock:
            entry = self._cache.get(gpu.key)
            # New hints (a pod came or went in dcgm-exporter's labels) or a link's new evidence (a new pod
            # list) are news: no waiting for the period.
            if (
                entry is not None
                and (entry.hints, entry.generations) == (gpu_hints, generations)
                and 0 <= now - entry.computed_ns < self._period_ns
            ):
                return entry.attributes
            attributes = self._consult(gpu, now)
            self._cache[gpu.key] = _Entry(gpu_hints, generations, attributes, now)
            self._evict_stale(now)
            return attributes

    def forget(self, gpu: GpuIdentity) -> None:
        """Drop ``gpu``'s cached result so that the next call asks the links again."""
        with self._lock:
            self._cache.pop(gpu.key, None)

    def close(self) -> None:
        for link in self.links:
            try:
                link.close()
            except Exception as error:
                log.warning("attribution link %s failed to close: %s", link.name, _describe(error))

    @property
    def _period_ns(self) -> int:
        return int(self.refresh_s * 1e9)

    def _consult(self, gpu: GpuIdentity, now: int) -> Mapping[str, str]:
        results: list[Mapping[str, str]] = []
        for link in self.links:
            try:
                result = link.attribute(gpu)
            except Exception as error:
                self._log_failure(link.name, error, now)
                continue
            results.append({key: value for key, value in result.items() if key in ATTRIBUTE_KEYS and value})
        merged = merge(results)
        return MappingProxyType(merged) if merged else _EMPTY

    def _log_failure(self, link_name: str, error: Exception, now: int) -> None:
        last = self._last_logged_ns.get(link_name)
        if last is not None and 0 <= now - last < self._period_ns:
            return
        self._last_logged_ns[link_name] = now
        log.warning("attribution link %s failed, skipped: %s", link_name, _describe(error))

    def _evict_stale(self, now: int) -> None:
        # GPUs that stopped being asked about (MIG reconfigured, a GPU lost for good) must not pile up.
        horizon = 10 * self._period_ns
        stale = [key for key, entry in self._cache.items() if not 0 <= now - entry.computed_ns < horizon]
        for key in stale:
            del self._cache[key]


def _describe(error: BaseException) -> str:
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


LinkFactory = Callable[[], Attributor | None]


def build_chain(
    *,
    static_job_id: str | None = None,
    static_job_name: str | None = None,
    static_precision: str | None = None,
    proc_root: str | Path = "/proc",
    pids_for: process_env.PidsFor | None = None,
    slurm_mapping_dir: str | Path | None = None,
    kubelet_socket: str | Path | None = None,
    k8s_pods_url: str | None = None,
    k8s_node_name: str | None = None,
    k8s_token_file: str | None = kubernetes_pods.DEFAULT_TOKEN_FILE,
    k8s_ca_file: str | None = kubernetes_pods.DEFAULT_CA_FILE,
    k8s_job_label: str | None = None,
    order: Sequence[str] = DEFAULT_ORDER,
    refresh_s: float = DEFAULT_REFRESH_S,
    clock: Clock = time.monotonic_ns,
) -> AttributionChain:
    """The chain of the links that are configured, in ``order`` (names from ``LINK_NAMES``).

    A link without its configuration is left out: process_env without ``pids_for``, slurm_mapping without
    a directory, kubernetes without a socket or a pod list, static without any value. hints is always there.
    ``k8s_pods_url`` (an API server base URL or a kubelet ``.../pods`` URL) adds the pods' UIDs and jobs
    to the kubernetes link (without a socket, for the pods the source names: dcgm-exporter's pod labels); the pod
    list is refreshed every ``refresh_s`` on a thread of its own, started here (the first list may take up to
    ``kubernetes_pods.STARTUP_WAIT_S``), stopped by ``close``.
    """
    unknown = [name for name in order if name not in LINK_NAMES]
    if unknown:
        raise ValueError(f"unknown attribution link(s) {', '.join(unknown)}; known: {', '.join(LINK_NAMES)}")
    if len(set(order)) != len(order):
        raise ValueError(f"attribution order names a link twice: {', '.join(order)}")

    pods = (
        None
        if k8s_pods_url is None
        else kubernetes_pods.PodDirectory(
            url=kubernetes_pods.pods_url(k8s_pods_url, k8s_node_name),
            token_file=k8s_token_file,
            ca_file=k8s_ca_file,
            job_label=k8s_job_label,
            refresh_s=refresh_s,
            clock=clock,
        )
    )

    def make_static() -> Attributor | None:
        link = static.StaticAttributor(job_id=static_job_id, job_name=static_job_name, precision=static_precision)
        return link if (link.job_id, link.job_name, link.precision) != (None, None, None) else None

    factories: dict[str, LinkFactory] = {
        hints.LINK_NAME: hints.HintsAttributor,
        process_env.LINK_NAME: lambda: (
            None if pids_for is None else process_env.ProcessEnvAttributor(pids_for=pids_for, proc_root=Path(proc_root))
        ),
        slurm_mapping.LINK_NAME: lambda: (
            None if slurm_mapping_dir is None else slurm_mapping.SlurmMappingAttributor(Path(slurm_mapping_dir))
        ),
        # Without the kubelet socket, the pod list serves the pods the source itself names (dcgm-exporter's labels).
        kubernetes.LINK_NAME: lambda: (
            None
            if kubelet_socket is None and pods is None
            else kubernetes.KubernetesAttributor(
                socket_path=None if kubelet_socket is None else str(kubelet_socket), clock=clock, pods=pods
            )
        ),
        static.LINK_NAME: make_static,
    }
    links = [link for name in order if (link := factories[name]()) is not None]
    chain = AttributionChain(links, refresh_s=refresh_s, clock=clock)
    if pods is not None and kubernetes.LINK_NAME in order:  # else no link owns it: never started
        pods.start()
    return chain
