"""Job attribution: which job, pod and precision each GPU works for, as the contract's attributes.

``build_chain(...)`` gives the ``AttributionChain`` the producer consults per GPU (``chain.attribute(gpu)``);
each link is an ``Attributor`` of its own module.
"""

from __future__ import annotations

from otel_ofu.attribution.base import (
    ATTRIBUTE_KEYS,
    AttributionError,
    Attributor,
    normalise_precision,
)
from otel_ofu.attribution.chain import (
    DEFAULT_ORDER,
    DEFAULT_REFRESH_S,
    LINK_NAMES,
    AttributionChain,
    build_chain,
    merge,
)
from otel_ofu.attribution.hints import HintsAttributor
from otel_ofu.attribution.kubernetes import DEFAULT_KUBELET_SOCKET, KubernetesAttributor
from otel_ofu.attribution.process_env import ProcessEnvAttributor
from otel_ofu.attribution.slurm_mapping import SlurmMappingAttributor
from otel_ofu.attribution.static import StaticAttributor

__all__ = [
    "ATTRIBUTE_KEYS",
    "DEFAULT_KUBELET_SOCKET",
    "DEFAULT_ORDER",
    "DEFAULT_REFRESH_S",
    "LINK_NAMES",
    "AttributionChain",
    "AttributionError",
    "Attributor",
    "HintsAttributor",
    "KubernetesAttributor",
    "ProcessEnvAttributor",
    "SlurmMappingAttributor",
    "StaticAttributor",
    "build_chain",
    "merge",
    "normalise_precision",
]
