"""The link protocol of job attribution and the few rules every link shares.

A link answers one question for one GPU: which job, pod and precision does the evidence it reads point
to? It answers with the contract's attribute names (``names.JOB_ID``, ``names.K8S_POD_NAME``, ...) and
an empty mapping when it knows nothing. Links never guess: an attribute they have no evidence for is
absent, so the chain can ask the next link.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Protocol, runtime_checkable

from otel_ofu import names
from otel_ofu.model import GpuIdentity

# Every attribute a link may return; anything else is dropped by the chain.
ATTRIBUTE_KEYS: Final = (
    names.JOB_ID,
    names.JOB_NAME,
    names.JOB_SCHEDULER,
    names.GPU_PRECISION,
    names.K8S_POD_NAME,
    names.K8S_NAMESPACE_NAME,
    names.K8S_CONTAINER_NAME,
    names.K8S_POD_UID,
)

UNKNOWN_PRECISION: Final = "unknown"


class AttributionError(RuntimeError):
    """A link that could not read its evidence this time (socket down, directory unreadable).

    The message is one line and never carries process-environment content.
    """


@runtime_checkable
class Attributor(Protocol):
    """One link of the attribution chain.

    A link whose evidence is refreshed apart from the chain's calls may also have an ``int`` attribute
    ``generation`` that changes with that evidence; the chain then asks it again at once.
    """

    name: str

    def attribute(self, gpu: GpuIdentity) -> Mapping[str, str]:
        """The attributes this link's evidence gives ``gpu``; empty when it knows nothing.

        May raise (``AttributionError`` or anything else): the chain logs it and asks the other links.
        """
        ...

    def close(self) -> None: ...


# Spellings seen in frameworks, launch scripts and configs, lower-cased with '-' and ' ' as '_'.
_PRECISION_ALIASES: Final[Mapping[str, str]] = {
    "fp64": "fp64",
    "float64": "fp64",
    "f64": "fp64",
    "double": "fp64",
    "tf32": "tf32",
    "tensorfloat32": "tf32",
    "tensorfloat_32": "tf32",
    "fp16": "fp16",
    "float16": "fp16",
    "f16": "fp16",
    "half": "fp16",
    "16": "fp16",
    "16_mixed": "fp16",  # Lightning's AMP with fp16: the matmuls run in fp16
    "bf16": "bf16",
    "bfloat16": "bf16",
    "bf16_mixed": "bf16",
    "bf16_true": "bf16",
    "fp8": "fp8",
    "float8": "fp8",
    "e4m3": "fp8",
    "e5m2": "fp8",
    "fp4": "fp4",
    "float4": "fp4",
    "e2m1": "fp4",
    "int8": "int8",
    "i8": "int8",
    "mixed": "mixed",
    "amp": "mixed",
}

# Families with many suffixes (fp8_e4m3, float8_e4m3fn, mxfp8, nvfp4, mxfp4_e2m1, ...).
_PRECISION_PREFIXES: Final = (
    ("fp8", "fp8"),
    ("float8", "fp8"),
    ("mxfp8", "fp8"),
    ("fp4", "fp4"),
    ("float4", "fp4"),
    ("nvfp4", "fp4"),
    ("mxfp4", "fp4"),
)


def normalise_precision(value: str) -> str:
    """Map a precision as people write it onto ``names.PRECISIONS``; anything unrecognised is ``unknown``."""
    key = value.strip().lower().replace("-", "_").replace(" ", "_")
    key = key.removeprefix("torch.")
    if key in names.PRECISIONS:
        return key
    alias = _PRECISION_ALIASES.get(key)
    if alias is not None:
        return alias
    for prefix, precision in _PRECISION_PREFIXES:
        if key.startswith(prefix):
            return precision
    return UNKNOWN_PRECISION
