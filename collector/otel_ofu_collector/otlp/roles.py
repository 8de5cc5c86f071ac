"""What the decoder does with each metric it receives, by name: one lookup per metric.

A point of ``gpu.ofu`` goes to the windows' OFU, ``gpu.ofu.unmeasured`` to the GPU's time without OFU, ``job.mfu`` to
the job's MFU, ``job.step`` and ``job.checkpoint.time`` to the job's progress, a loss input (``gpu.tensor.active``,
clocks, power, energy, throttle shares...) to the GPU's loss split; the producer's other metrics are only
consumed. A name not here is foreign: forwarded on pass-through.
"""

from __future__ import annotations

from typing import Final

from otel_ofu import names

CONSUMED, OFU, MFU, INPUT, UNMEASURED, STEP, CHECKPOINT = range(7)

# The per-GPU inputs of the loss split (what ``Aggregator.add_gpu_inputs`` takes), beside gpu.ofu.
GPU_INPUT_NAMES: Final = frozenset(spec.name for spec in names.LOSS_SPLIT_INPUTS)
# Everything the producer and the MFU reporter send us: consumed here, forwarded only on request.
INPUT_METRIC_NAMES: Final = frozenset(
    {spec.name for spec in names.PRODUCER_METRICS} | {spec.name for spec in (names.JOB_MFU, *names.TRAINING_METRICS)}
)

ROLES: Final[dict[str, int]] = {
    **dict.fromkeys(INPUT_METRIC_NAMES, CONSUMED),
    **dict.fromkeys(GPU_INPUT_NAMES, INPUT),
    names.GPU_OFU.name: OFU,
    names.GPU_OFU_UNMEASURED.name: UNMEASURED,
    names.JOB_MFU.name: MFU,
    names.JOB_STEP.name: STEP,
    names.JOB_CHECKPOINT_TIME.name: CHECKPOINT,
}

# Loss inputs whose points are told apart by one attribute of theirs (a point's other attributes are identity): the
# attribute and its known values. A throttle point's reason names the share it carries; an NVLink or PCIe counter's
# direction names its series (``keyed_field``).
KEYED: Final[dict[str, tuple[str, frozenset[str]]]] = {
    names.GPU_THROTTLE.name: (names.GPU_THROTTLE_REASON, frozenset(names.ThrottleReason.ALL)),
    names.GPU_NVLINK_IO.name: (names.NETWORK_IO_DIRECTION, frozenset(names.IoDirection.ALL)),
    names.GPU_PCIE_IO.name: (names.NETWORK_IO_DIRECTION, frozenset(names.IoDirection.ALL)),
}
THROTTLE: Final = names.GPU_THROTTLE.name
# The loss inputs that are cumulative counters (start = their series start), taken apart from the interval's gauges.
COUNTERS: Final = frozenset({names.GPU_ENERGY.name, names.GPU_NVLINK_IO.name, names.GPU_PCIE_IO.name})


def keyed_field(metric: str, value: str) -> str:
    """The field a keyed point feeds: a throttle share's reason, a counter's ``metric|direction``."""
    return value if metric == THROTTLE else f"{metric}|{value}"
