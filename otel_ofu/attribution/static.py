"""The node-wide default: a job id, name and precision given as options (or their environment variables).

Right for a node that runs one job at a time and is told so at start-up (a dedicated training VM, a
container started per job); wrong for a shared node, which is why it comes last in the chain.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import attrs

from otel_ofu import names
from otel_ofu.attribution.base import normalise_precision
from otel_ofu.model import GpuIdentity

LINK_NAME: Final = "static"


def _blank_to_none(value: str | None) -> str | None:
    if value is None or not value.strip():
        return None
    return value.strip()


@attrs.define
class StaticAttributor:
    """The same job attributes for every GPU."""

    job_id: str | None = attrs.field(default=None, converter=_blank_to_none)
    job_name: str | None = attrs.field(default=None, converter=_blank_to_none)
    precision: str | None = attrs.field(default=None, converter=_blank_to_none)
    name: str = attrs.field(default=LINK_NAME, init=False)
    _attributes: Mapping[str, str] = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        attributes: dict[str, str] = {}
        if self.job_id is not None:
            attributes[names.JOB_ID] = self.job_id
        if self.job_name is not None:
            attributes[names.JOB_NAME] = self.job_name
        if attributes:
            attributes[names.JOB_SCHEDULER] = "static"
        if self.precision is not None:
            attributes[names.GPU_PRECISION] = normalise_precision(self.precision)
        self._attributes = attributes

    def attribute(self, gpu: GpuIdentity) -> Mapping[str, str]:
        return dict(self._attributes)

    def close(self) -> None:
        return None
