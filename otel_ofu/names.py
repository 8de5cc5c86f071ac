"""The one vocabulary of otel-ofu: every metric name, unit, attribute key and counter id.

Everything that names a metric, an attribute or a hardware field imports it from here: the producer,
the collector, the dashboards, the docs checks and the tests. docs/reference.md is generated from it.
"""

from __future__ import annotations

from typing import Final

import attrs

# --- Services -------------------------------------------------------------------------------------

PRODUCER_SERVICE_NAME: Final = "otel-ofu"
COLLECTOR_SERVICE_NAME: Final = "otel-ofu-collector"
INSTRUMENTATION_SCOPE: Final = "otel_ofu"
COLLECTOR_INSTRUMENTATION_SCOPE: Final = "otel_ofu_collector"
MFU_SERVICE_NAME: Final = "otel-ofu-mfu"  # the MFU reporter's own MeterProvider, unless OTEL_SERVICE_NAME says


@attrs.frozen
class MetricSpec:
    """A metric of the contract: its name, unit, kind and one-line meaning."""

    name: str
    unit: str
    kind: str  # "gauge", "sum" or "exponential_histogram"
    description: str


# --- Producer metrics (one Resource per GPU; gauges, gpu.energy a sum) ------------------------------

GPU_OFU: Final = MetricSpec(
    "gpu.ofu",
    "1",
    "gauge",
    "Overall FLOP Utilization: tensor pipe activity x clock / max clock (tensor clock domain, calibrated)",
)
GPU_OFU_RAW: Final = MetricSpec(
    "gpu.ofu.raw", "1", "gauge", "Tensor pipe activity x SM clock / board max SM clock, nothing else applied"
)
# A GPU that reported an interval without OFU (its tensor activity blank, its clock unreadable): 1 over the interval,
# with ERROR_TYPE saying why. The GPU is still allocated and still draws power: the collector bills its time under
# the loss cause ``unmeasured``, neither as work nor as idleness.
GPU_OFU_UNMEASURED: Final = MetricSpec(
    "gpu.ofu.unmeasured",
    "1",
    "gauge",
    "1 over an interval the GPU reported without OFU, with error.type saying why (its time is billed, unmeasured)",
)
# OpenTelemetry's semantic convention for the class of an error: on gpu.ofu.unmeasured, an ErrorReason value.
ERROR_TYPE: Final = "error.type"
GPU_TENSOR_ACTIVE: Final = MetricSpec(
    "gpu.tensor.active", "1", "gauge", "Fraction of cycles any tensor pipe was active, interval average"
)
GPU_CLOCK_SM: Final = MetricSpec("gpu.clock.sm", "Hz", "gauge", "SM clock, interval average where available")
GPU_CLOCK_SM_MAX: Final = MetricSpec("gpu.clock.sm.max", "Hz", "gauge", "Maximum SM clock of the board")
GPU_FLOPS_ACHIEVED: Final = MetricSpec(
    "gpu.flops.achieved", "{flop}/s", "gauge", "OFU x dense peak FLOP/s for the job's precision"
)
GPU_SM_ACTIVE: Final = MetricSpec("gpu.sm.active", "1", "gauge", "Fraction of cycles an SM had a warp resident")
GPU_DRAM_ACTIVE: Final = MetricSpec("gpu.dram.active", "1", "gauge", "Fraction of cycles the DRAM interface was busy")
GPU_ENGINE_ACTIVE: Final = MetricSpec(
    "gpu.engine.active", "1", "gauge", "Fraction of time the graphics/compute engine had a kernel running"
)
GPU_SM_OCCUPANCY: Final = MetricSpec(
    "gpu.sm.occupancy", "1", "gauge", "Resident warps as a fraction of the maximum, averaged over SMs"
)
# Cumulative byte counters (monotonic sums) with NETWORK_IO_DIRECTION, after the OpenTelemetry hardware conventions'
# network.io; from sources that report rates (DCGM 1009-1012, GPM), the producer integrates the rate over time.
GPU_NVLINK_IO: Final = MetricSpec(
    "gpu.nvlink.io", "By", "sum", "NVLink bytes sent or received, by network.io.direction"
)
GPU_PCIE_IO: Final = MetricSpec("gpu.pcie.io", "By", "sum", "PCIe bytes sent or received, by network.io.direction")

PRODUCER_METRICS: tuple[MetricSpec, ...] = (  # extended by the power/throttle block below
    GPU_OFU,
    GPU_OFU_RAW,
    GPU_TENSOR_ACTIVE,
    GPU_CLOCK_SM,
    GPU_CLOCK_SM_MAX,
    GPU_FLOPS_ACHIEVED,
    GPU_SM_ACTIVE,
    GPU_DRAM_ACTIVE,
    GPU_ENGINE_ACTIVE,
    GPU_SM_OCCUPANCY,
    GPU_NVLINK_IO,
    GPU_PCIE_IO,
)

# Training side: reported by the MFU reporter or the log follower.
JOB_MFU: Final = MetricSpec("job.mfu", "1", "gauge", "Model FLOP Utilization as reported by the training framework")

# Producer self-metrics.
SOURCE_ERRORS: Final = MetricSpec("otel_ofu.source.errors", "{error}", "sum", "GPU readings skipped, by reason")
EXPORT_FAILURES: Final = MetricSpec("otel_ofu.export.failures", "{export}", "sum", "Exports that failed")
EXPORT_DURATION: Final = MetricSpec("otel_ofu.export.duration", "s", "gauge", "Duration of the last export")
EXPORT_REJECTED: Final = MetricSpec(
    "otel_ofu.export.rejected",
    "{point}",
    "sum",
    "Data points the OTLP receiver refused of delivered exports (partial_success)",
)

# --- Collector outputs (resource service.name=otel-ofu-collector) -----------------------------------

FLEET_OFU: Final = MetricSpec("fleet.ofu", "1", "exponential_histogram", "Per-GPU OFU of the window, per group")
FLEET_OFU_QUANTILE: Final = MetricSpec(
    "fleet.ofu.quantile", "1", "gauge", "Percentile of per-GPU OFU in the window, per group"
)
FLEET_GPUS: Final = MetricSpec(
    "fleet.gpus", "{gpu}", "gauge", "GPU equivalents that reported in the window, per group (a MIG slice its share)"
)
JOB_OFU: Final = MetricSpec("job.ofu", "1", "gauge", "The job's mean OFU over its GPUs in the window")
JOB_OFU_MFU_GAP: Final = MetricSpec("job.ofu_mfu.gap", "1", "gauge", "Reported MFU minus OFU")
JOB_OFU_MFU_CORRELATION: Final = MetricSpec(
    "job.ofu_mfu.correlation", "1", "gauge", "Pearson r of the job's OFU and MFU over the rolling horizon"
)
JOB_FLOPS_MISCOUNT: Final = MetricSpec(
    "job.flops_miscount", "1", "gauge", "1 while reported MFU exceeds OFU by the configured ratio, else 0"
)
JOB_OFU_REGRESSION: Final = MetricSpec(
    "job.ofu.regression", "1", "gauge", "1 while the job's OFU is below its own baseline by the factor, else 0"
)
FLEET_OFU_MFU_CORRELATION: Final = MetricSpec(
    "fleet.ofu_mfu.correlation", "1", "gauge", "Pearson r across jobs of mean OFU vs mean MFU over the horizon"
)
FLEET_OFU_MFU_MAE: Final = MetricSpec("fleet.ofu_mfu.mae", "1", "gauge", "Mean absolute OFU-MFU difference across jobs")

COLLECTOR_METRICS: Final = (
    FLEET_OFU,
    FLEET_OFU_QUANTILE,
    FLEET_GPUS,
    JOB_OFU,
    JOB_OFU_MFU_GAP,
    JOB_OFU_MFU_CORRELATION,
    JOB_FLOPS_MISCOUNT,
    JOB_OFU_REGRESSION,
    FLEET_OFU_MFU_CORRELATION,
    FLEET_OFU_MFU_MAE,
)

QUANTILES: Final = (0.05, 0.25, 0.5, 0.75, 0.95, 0.99)

# The percentile attribute (QUANTILE) as a Prometheus label: Prometheus reserves ``quantile`` for summaries (promtool
# refuses it on a gauge), so the collector's /metrics names it this; OTLP keeps QUANTILE.
PROMETHEUS_QUANTILE_LABEL: Final = "ofu_quantile"

# --- Collector outputs: where OFU is lost and what it costs ---------------------------------------
# Per job per closed window, with fleet totals per window; sums are deltas (one window's worth), so shards'
# outputs add. A job's loss splits 1 - OFU by cause: OFU + the causes of job.ofu.loss = 1. GPUs count as GPU
# equivalents (a whole GPU 1, a MIG slice or AMD partition its share of its GPU's compute slices); a point's interval
# is split over every window it overlaps, so over a run a GPU's GPU time is the wall time it reported.

JOB_GPUS: Final = MetricSpec(
    "job.gpus", "{gpu}", "gauge", "GPU equivalents attributed to the job in the window (a MIG slice its share)"
)
JOB_GPU_TIME: Final = MetricSpec(
    "job.gpu_time", "s", "sum", "GPU-seconds of the job in the window: each GPU's reported time in it x its share"
)
JOB_OFU_LOSS: Final = MetricSpec(
    "job.ofu.loss",
    "1",
    "gauge",
    "The job's 1 - OFU split by cause (idle, clock, no_kernel, sm_idle, non_tensor, tensor); OFU + the causes = 1",
)
JOB_GPU_TIME_LOST: Final = MetricSpec("job.gpu_time.lost", "s", "sum", "GPU-seconds lost in the window, by cause")
JOB_ENERGY: Final = MetricSpec(
    "job.energy", "J", "sum", "Energy of the job's GPUs in the window (a MIG slice: its share of the board's)"
)
JOB_FLOPS_PER_JOULE: Final = MetricSpec(
    "job.flops_per_joule", "{flop}/J", "gauge", "Achieved FLOPs per joule, where the dense peak is known"
)
# Cost is in the configured currency: the unit is its code as an annotation ({USD}, {EUR}); COST_UNIT stands
# for it in the vocabulary. The cost metrics are absent unless prices per GPU-hour are given.
COST_UNIT: Final = "{currency}"
JOB_COST: Final = MetricSpec("job.cost", COST_UNIT, "sum", "GPU-time x price per GPU-hour in the window")
JOB_COST_LOST: Final = MetricSpec(
    "job.cost.lost", COST_UNIT, "sum", "Cost of the lost GPU-time in the window, by cause"
)
JOB_EMISSIONS: Final = MetricSpec(
    "job.emissions", "kg", "sum", "Energy x PUE x grid intensity (kg CO2e) in the window, where intensity is given"
)
FLEET_GPU_TIME_LOST: Final = MetricSpec("fleet.gpu_time.lost", "s", "sum", "GPU-seconds the fleet lost, by cause")
FLEET_ENERGY: Final = MetricSpec("fleet.energy", "J", "sum", "Energy of the fleet's GPUs in the window")
FLEET_COST_LOST: Final = MetricSpec("fleet.cost.lost", COST_UNIT, "sum", "Cost of the fleet's lost GPU-time, by cause")
# Flags on the loss: absent when they cannot be assessed. gpu.straggler is on the GPU's identity with job.id,
# emitted only for GPUs flagged within the horizon (1 while flagged, one 0 when cleared).
GPU_STRAGGLER: Final = MetricSpec(
    "gpu.straggler", "1", "gauge", "1 while the GPU's OFU stays below its job's median by the straggler factor, else 0"
)
JOB_GPUS_IDLE: Final = MetricSpec(
    "job.gpus.idle", "{gpu}", "gauge", "GPUs attributed to the job with no tensor activity for the idle windows"
)

# What the job's GPUs were doing besides tensor work, beside its loss split: what tells a memory-bound job (DRAM
# busy) from a communication-bound one (NVLink or PCIe traffic, DRAM quiet). Means over the GPUs that report them.
JOB_DRAM_ACTIVE: Final = MetricSpec(
    "job.dram.active", "1", "gauge", "Mean DRAM activity of the job's GPUs in the window, where they report it"
)
JOB_NVLINK_THROUGHPUT: Final = MetricSpec(
    "job.nvlink.throughput", "By/s", "gauge", "Mean NVLink bytes per second per GPU (sent and received) in the window"
)
JOB_PCIE_THROUGHPUT: Final = MetricSpec(
    "job.pcie.throughput", "By/s", "gauge", "Mean PCIe bytes per second per GPU (sent and received) in the window"
)

COLLECTOR_LOSS_METRICS: Final = (
    JOB_GPUS,
    JOB_GPU_TIME,
    JOB_OFU_LOSS,
    JOB_GPU_TIME_LOST,
    JOB_ENERGY,
    JOB_FLOPS_PER_JOULE,
    JOB_COST,
    JOB_COST_LOST,
    JOB_EMISSIONS,
    FLEET_GPU_TIME_LOST,
    FLEET_ENERGY,
    FLEET_COST_LOST,
    GPU_STRAGGLER,
    JOB_GPUS_IDLE,
    JOB_DRAM_ACTIVE,
    JOB_NVLINK_THROUGHPUT,
    JOB_PCIE_THROUGHPUT,
)

OFU_LOSS_CAUSE: Final = "ofu.loss.cause"


class OfuLossCause:
    """Values of ``ofu.loss.cause``: where a job's 1 - OFU went.

    Per GPU, with OFU O, tensor pipe activity T and SM clock f: ``clock`` is T x (1 - r), r = min(1, f / f_ref)
    (f_ref the model's tensor clock where the catalog knows it, else the board's maximum SM clock), clamped to
    [0, T - O]. What is left of 1 - O is split by what the engine and SMs were doing, on GPUs whose source reports
    engine and SM activity (E, S, clamped so that T <= S <= E): ``no_kernel`` 1 - E, ``sm_idle`` E - S,
    ``non_tensor`` S - O - clock (the SMs' time off useful tensor work, tile padding included). A GPU without them
    keeps the coarse ``tensor``, 1 - O - clock; an idle GPU's whole 1 - O is ``idle``. A GPU's time without OFU
    (``gpu.ofu.unmeasured``) is ``unmeasured``: billed, but neither work nor idleness. So a job's causes always sum
    to 1 with its OFU, each a share of its GPU time (``otel_ofu_collector.aggregation.loss`` computes them).
    """

    IDLE = "idle"  # attributed GPUs with no tensor activity all window: 1 - O
    CLOCK = "clock"  # T x (1 - min(1, f / f_ref)), at most T - O: the SM clock held below the tensor clock
    NO_KERNEL = "no_kernel"  # 1 - E: no kernel running (input pipeline, host, synchronisation, checkpoints)
    SM_IDLE = "sm_idle"  # E - S: kernels running, SMs left empty (small grids, launch gaps, tails)
    NON_TENSOR = "non_tensor"  # S - O - clock: SMs busy off useful tensor work (memory-bound, element-wise, padding)
    TENSOR = "tensor"  # 1 - O - clock on working GPUs whose source lacks engine and SM activity
    UNMEASURED = "unmeasured"  # GPU time that gave no OFU (gpu.ofu.unmeasured): billed, neither work nor idleness

    ALL = (IDLE, CLOCK, NO_KERNEL, SM_IDLE, NON_TENSOR, TENSOR, UNMEASURED)
    TENSOR_PARTS = (NO_KERNEL, SM_IDLE, NON_TENSOR)  # the finer split of TENSOR, as E, S and T nest


# --- Collector partial state (merge mode) ------------------------------------------------------------
# A shard replica (``--mode shard``) sends its merge tier, beside the fleet.ofu histograms, fleet.gpus and the fleet's
# loss totals, what adds up exactly across shards: each group's OFU counted in GPU capacity (its percentiles are over
# capacity), and each job's window as sums (a job whose points moved to another shard mid-window, on a load balancer's
# ring change, adds up there to what one collector would have reported). The merge tier computes every job.* output,
# the job flags and the fleet's correlation from them; the shard is told apart by SERVICE_INSTANCE_ID.

SERVICE_INSTANCE_ID: Final = "service.instance.id"
PARTIAL_FLEET_OFU_CAPACITY: Final = MetricSpec(
    "fleet.ofu.partial.capacity",
    "1",
    "exponential_histogram",
    "A shard's per-GPU OFU of the window, counted in GPU-microseconds of capacity (GPU equivalents x seconds)",
)
PARTIAL_JOB: Final = MetricSpec(
    "job.partial", "1", "gauge", "A shard's sums of a job's window, one point per otel_ofu.partial.field"
)
# One point per window a shard closed, empty or not: the merge tier closes every window too (a window that only the
# fleet's horizon still spans carries no other point).
PARTIAL_WINDOW: Final = MetricSpec("fleet.partial.window", "{window}", "gauge", "1 for each window a shard closed")
PARTIAL_FIELD: Final = "otel_ofu.partial.field"
PARTIAL_CURRENCY: Final = "otel_ofu.partial.currency"  # on the cost fields: the currency the shard priced in
COLLECTOR_PARTIAL_METRICS: Final = (PARTIAL_WINDOW, PARTIAL_FLEET_OFU_CAPACITY, PARTIAL_JOB)


class PartialField:
    """Values of ``otel_ofu.partial.field`` on ``job.partial``: a job's window sums (``results.JobWindow``), in GPU
    seconds, joules, FLOPs, the shard's currency, kg. A field ending in "." is followed by its key: a loss cause, a
    context kind (dram, nvlink, pcie), a GPU's stream key, a GPU model."""

    GPU_TIME = "gpu_time"  # GPU equivalents x seconds
    USEFUL = "useful"  # OFU x measured GPU equivalents x seconds
    LOST = "lost."  # + ofu.loss.cause
    ENERGY = "energy"
    FLOPS = "flops"
    FLOPS_ENERGY = "flops_energy"  # energy of the GPUs whose FLOPs are known
    COST = "cost"
    COST_LOST = "cost_lost."  # + ofu.loss.cause
    EMISSIONS = "emissions"
    CONTEXT = "context."  # + kind: the value weighted by GPU time
    CONTEXT_WEIGHT = "context_weight."  # + kind: that GPU time
    POINT_OFU = "point_ofu"  # OFU x share of GPUs whose OFU points carried no time
    POINT_OFU_WEIGHT = "point_ofu_weight"
    MFU_SUM = "mfu_sum"
    MFU_COUNT = "mfu_count"
    GPUS = "gpus"  # GPU equivalents that gave OFU
    IDLE_GPU = "idle_gpu."  # + stream key: its share of a GPU
    MODEL = "model."  # + hw.model of the job's GPUs
    STALLED_GPU = "stalled_gpu."  # + stream key: its share of a GPU, running kernels with nothing moving
    MOVING_GPUS = "moving_gpus"  # GPU equivalents judged not stalled
    IDLE_S = "idle_s"  # GPU-seconds of its idle GPUs that were not stalled
    CHECKPOINT_S = "checkpoint_s"  # seconds of the window its framework reported saving or loading checkpoints
    STEP = "step."  # + a job.step point's time in ns: the step


# --- Collector self-metrics (Prometheus endpoint, the OTLP downstream, CollectorService.self_metrics) --

COLLECTOR_POINTS_ACCEPTED: Final = MetricSpec(
    "otel_ofu_collector.points.accepted", "{point}", "sum", "Data points taken into the windows"
)
COLLECTOR_POINTS_REJECTED: Final = MetricSpec(
    "otel_ofu_collector.points.rejected", "{point}", "sum", "Data points rejected (reported in partial_success)"
)
COLLECTOR_REQUESTS_REFUSED: Final = MetricSpec(
    "otel_ofu_collector.requests.refused", "{request}", "sum", "Requests refused UNAVAILABLE, by reason"
)
COLLECTOR_REQUESTS_FORWARDED: Final = MetricSpec(
    "otel_ofu_collector.requests.forwarded", "{request}", "sum", "Requests passed through to the downstream"
)
COLLECTOR_EXPORT_QUEUED: Final = MetricSpec(
    "otel_ofu_collector.export.queued", "{request}", "gauge", "Requests waiting for the downstream, by stream"
)
COLLECTOR_DROPPED: Final = MetricSpec(
    "otel_ofu_collector.dropped",
    "{request}",
    "sum",
    "Requests dropped beyond the queue or spool bound, by reason (windows_spool_failed: held in memory while the "
    "spool's disk refused them, lost at shutdown; records_failed: windows, not requests, left out of the "
    "--record-outputs file while its disk refused them)",
)
COLLECTOR_EVICTED: Final = MetricSpec(
    "otel_ofu_collector.evicted",
    "{item}",
    "sum",
    "GPU streams and jobs evicted after --stale-after of silence, by kind",
)
COLLECTOR_POINTS_OVER_CAP: Final = MetricSpec(
    "otel_ofu_collector.points.over_cap",
    "{point}",
    "sum",
    "Points of a new stream or job over --max-streams / --max-jobs / --max-state-bytes, by cap (refused: a "
    "gpu.ofu of a job over the cap would count in no job's outputs)",
)
COLLECTOR_EXPORT_FAILURES: Final = MetricSpec(
    "otel_ofu_collector.export.failures", "{request}", "sum", "Sends to the downstream that failed, by stream"
)
COLLECTOR_SPOOL_SIZE: Final = MetricSpec(
    "otel_ofu_collector.spool.size", "By", "gauge", "Bytes of undelivered window outputs held in the --spool"
)
COLLECTOR_STATE_SIZE: Final = MetricSpec(
    "otel_ofu_collector.state.size",
    "By",
    "gauge",
    "Bytes of state the collector keeps, by part (windows: bounded by --max-state-bytes; resource_cache)",
)
COLLECTOR_CLOSE_FAILURES: Final = MetricSpec(
    "otel_ofu_collector.close.failures",
    "{item}",
    "sum",
    "Groups, jobs or fleet totals left out of a window because closing them failed, and windows given up, by kind",
)
COLLECTOR_WRITE_AHEAD_UNWRITTEN: Final = MetricSpec(
    "otel_ofu_collector.write_ahead.unwritten",
    "{request}",
    "sum",
    "Accepted requests the write-ahead could not store (a full or failing disk): their points are in the "
    "windows, but a kill or crash before those close loses them",
)
COLLECTOR_WRITE_AHEAD_SKIPPED: Final = MetricSpec(
    "otel_ofu_collector.write_ahead.skipped",
    "{request}",
    "sum",
    "Write-ahead records the replay at start could not use, by reason: damaged (fails its checksum or does not "
    "parse), failed (replaying it raised)",
)
COLLECTOR_FILES_DAMAGED: Final = MetricSpec(
    "otel_ofu_collector.files.damaged",
    "{file}",
    "sum",
    "Damaged --spool files found when opened, by reason: write_ahead_unreadable, spool_unreadable (moved aside, "
    "its readable records kept), write_ahead_wal, spool_wal (WAL frames failing their checksums: what was "
    "written after them is lost)",
)
COLLECTOR_EXPORT_REJECTED: Final = MetricSpec(
    "otel_ofu_collector.export.rejected",
    "{point}",
    "sum",
    "Data points the downstream refused of requests it took (partial_success), by stream",
)
COLLECTOR_SELF_METRICS: Final = (
    COLLECTOR_POINTS_ACCEPTED,
    COLLECTOR_POINTS_REJECTED,
    COLLECTOR_REQUESTS_REFUSED,
    COLLECTOR_REQUESTS_FORWARDED,
    COLLECTOR_EXPORT_QUEUED,
    COLLECTOR_DROPPED,
    COLLECTOR_EVICTED,
    COLLECTOR_POINTS_OVER_CAP,
    COLLECTOR_EXPORT_FAILURES,
    COLLECTOR_SPOOL_SIZE,
    COLLECTOR_STATE_SIZE,
    COLLECTOR_CLOSE_FAILURES,
    COLLECTOR_WRITE_AHEAD_UNWRITTEN,
    COLLECTOR_WRITE_AHEAD_SKIPPED,
    COLLECTOR_FILES_DAMAGED,
    COLLECTOR_EXPORT_REJECTED,
)


class RejectReason:
    """Values of ``reason`` on ``otel_ofu_collector.points.rejected``: why points were refused (a short, fixed set, so
    that the counters can start at 0 and alerts can name them; partial_success gives the details in words)."""

    OUT_OF_RANGE = "out_of_range"  # not finite, or outside the metric's range (OFU in [0, 1], MFU in [0, MFU_MAX])
    IMPLAUSIBLE = "implausible"  # beyond what the hardware can do: power, energy over power x time, clocks
    WRONG_TYPE = "wrong_type"  # a histogram or summary where a gauge or sum belongs
    NO_IDENTITY = "no_identity"  # no hw.id (GPU metrics) or job.id (job.mfu)
    BAD_ATTRIBUTE = "bad_attribute"  # an identity value over --max-attribute-length, an unknown throttle reason
    BAD_TIME = "bad_time"  # no timestamp, or stamped further ahead than the clock allows
    LATE = "late"  # its window already closed
    MAX_STREAMS = "max_streams"  # a new GPU stream over --max-streams
    MAX_JOBS = "max_jobs"  # a new job over --max-jobs
    MAX_STATE = "max_state"  # the collector's state is at its byte bound
    UNREADABLE = "unreadable"  # a shard's partial window that cannot be read (merge mode)

    ALL = (
        OUT_OF_RANGE,
        IMPLAUSIBLE,
        WRONG_TYPE,
        NO_IDENTITY,
        BAD_ATTRIBUTE,
        BAD_TIME,
        LATE,
        MAX_STREAMS,
        MAX_JOBS,
        MAX_STATE,
        UNREADABLE,
    )


# The attribute (Prometheus label) a self-metric's values are split by; "reason" unless named here.
COLLECTOR_SELF_METRIC_KEYS: Final = {
    COLLECTOR_EXPORT_QUEUED.name: "stream",
    COLLECTOR_EXPORT_FAILURES.name: "stream",
    COLLECTOR_EXPORT_REJECTED.name: "stream",
    COLLECTOR_EVICTED.name: "kind",
    COLLECTOR_POINTS_OVER_CAP.name: "cap",
    COLLECTOR_STATE_SIZE.name: "part",
    COLLECTOR_CLOSE_FAILURES.name: "kind",
}

# The largest job.mfu accepted, by the reporter and the collector alike: a framework that over-counts FLOPs
# can claim more than 1 (the paper's MoE case counted ~3x), but beyond a 4x over-count of a fully busy GPU
# the value is a unit mistake (a percent sent as a fraction), not a miscount.
MFU_MAX: Final = 4.0

# --- Attribute keys ---------------------------------------------------------------------------------

SERVICE_NAME: Final = "service.name"
HOST_NAME: Final = "host.name"
HW_ID: Final = "hw.id"
HW_TYPE: Final = "hw.type"
HW_VENDOR: Final = "hw.vendor"
HW_MODEL: Final = "hw.model"
GPU_INDEX: Final = "gpu.index"
GPU_MIG_PROFILE: Final = "gpu.mig.profile"
GPU_MIG_INSTANCE_ID: Final = "gpu.mig.instance_id"
# An AMD Instinct compute partition mode (spx, dpx, tpx, qpx, cpx): the device is that fraction of its GPU.
GPU_COMPUTE_PARTITION: Final = "gpu.compute_partition"
JOB_ID: Final = "job.id"
JOB_NAME: Final = "job.name"
JOB_SCHEDULER: Final = "job.scheduler"
GPU_PRECISION: Final = "gpu.precision"
K8S_POD_NAME: Final = "k8s.pod.name"
K8S_NAMESPACE_NAME: Final = "k8s.namespace.name"
K8S_CONTAINER_NAME: Final = "k8s.container.name"
K8S_POD_UID: Final = "k8s.pod.uid"
QUANTILE: Final = "quantile"
ERROR_REASON: Final = "reason"
NETWORK_IO_DIRECTION: Final = "network.io.direction"


class IoDirection:
    """Values of ``network.io.direction`` (OpenTelemetry semantic conventions)."""

    TRANSMIT = "transmit"
    RECEIVE = "receive"

    ALL = (TRANSMIT, RECEIVE)


class ErrorReason:
    """Values of the ``reason`` attribute of ``otel_ofu.source.errors``: why a reading was skipped."""

    GPU_LOST = "gpu_lost"
    NOT_SUPPORTED = "not_supported"
    NO_PERMISSION = "no_permission"
    DRIVER = "driver"
    NO_VALUE = "no_value"  # N/A, blank sentinel or a reading that is simply not there
    INVALID_VALUE = "invalid_value"  # NaN, TPA outside [0, 1], clock 0, max clock below current
    SCRAPE = "scrape"  # the whole scrape or capture line failed
    UNKNOWN = "unknown"

    ALL = (GPU_LOST, NOT_SUPPORTED, NO_PERMISSION, DRIVER, NO_VALUE, INVALID_VALUE, SCRAPE, UNKNOWN)


class ExportFailureReason:
    """Values of the ``reason`` attribute of ``otel_ofu.export.failures``: why an interval was not delivered."""

    QUEUE_FULL = "queue_full"  # the backend fell behind and the oldest queued interval was dropped
    REJECTED = "rejected"  # the exporter gave up (refused, UNAVAILABLE past its retries, timed out)
    EXCEPTION = "exception"  # the exporter raised
    SHUTDOWN = "shutdown"  # still queued when shutdown ran out of time

    ALL = (QUEUE_FULL, REJECTED, EXCEPTION, SHUTDOWN)


HW_TYPE_GPU: Final = "gpu"
HW_VENDOR_NVIDIA: Final = "nvidia"
HW_VENDOR_AMD: Final = "amd"  # AMD Instinct, through the AMD Device Metrics Exporter

# Identity attributes: copied onto data points by the `datapoint`/`both` placement (Datadog), and
# looked up by the collector on the data point first and the resource second.
IDENTITY_ATTRIBUTES: Final = (
    HOST_NAME,
    HW_ID,
    HW_MODEL,
    GPU_INDEX,
    GPU_MIG_PROFILE,
    GPU_MIG_INSTANCE_ID,
    GPU_COMPUTE_PARTITION,
    JOB_ID,
    JOB_NAME,
    JOB_SCHEDULER,
    GPU_PRECISION,
    K8S_POD_NAME,
    K8S_NAMESPACE_NAME,
    K8S_CONTAINER_NAME,
    K8S_POD_UID,
)

SCHEDULERS: Final = ("slurm", "kubernetes", "process", "static")
PRECISIONS: Final = ("fp64", "tf32", "fp16", "bf16", "fp8", "fp4", "int8", "mixed", "unknown")

# Attribute placement for identity attributes (Datadog drops resource attributes by default).
PLACEMENTS: Final = ("resource", "datapoint", "both")

# --- DCGM field ids (ids are stable across renames; DCGM 4.6 renamed 1004) ---------------------------

DCGM_FI_DEV_SM_CLOCK: Final = 100
DCGM_FI_DEV_APP_SM_CLOCK: Final = 110  # application clock, NOT the max
DCGM_FI_DEV_MAX_SM_CLOCK: Final = 113
DCGM_FI_PROF_GR_ENGINE_ACTIVE: Final = 1001
DCGM_FI_PROF_SM_ACTIVE: Final = 1002
DCGM_FI_PROF_SM_OCCUPANCY: Final = 1003
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE: Final = 1004
DCGM_FI_PROF_DRAM_ACTIVE: Final = 1005
DCGM_FI_PROF_PCIE_TX_BYTES: Final = 1009  # bytes per second, like 1010-1012
DCGM_FI_PROF_PCIE_RX_BYTES: Final = 1010
DCGM_FI_PROF_NVLINK_TX_BYTES: Final = 1011
DCGM_FI_PROF_NVLINK_RX_BYTES: Final = 1012
DCGM_FI_PROF_SM_CYCLES_ELAPSED: Final = 1084
DCGM_FI_PROF_SM_CYCLES_ACTIVE: Final = 1085
DCGM_FI_PROF_MMA_CYCLES_ACTIVE: Final = 1086

# dcgm-exporter's Prometheus metric names for those fields.
DCGM_EXPORTER_SM_CLOCK: Final = "DCGM_FI_DEV_SM_CLOCK"
DCGM_EXPORTER_MAX_SM_CLOCK: Final = "DCGM_FI_DEV_MAX_SM_CLOCK"
DCGM_EXPORTER_TENSOR_ACTIVE: Final = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"
DCGM_EXPORTER_TENSOR_ACTIVE_46: Final = "DCGM_FI_PROF_TENSOR_UTIL_RATIO"
DCGM_EXPORTER_SM_ACTIVE: Final = "DCGM_FI_PROF_SM_ACTIVE"
DCGM_EXPORTER_DRAM_ACTIVE: Final = "DCGM_FI_PROF_DRAM_ACTIVE"
DCGM_EXPORTER_SM_CYCLES_ELAPSED: Final = "DCGM_FI_PROF_SM_CYCLES_ELAPSED"
DCGM_EXPORTER_MMA_CYCLES_ACTIVE: Final = "DCGM_FI_PROF_MMA_CYCLES_ACTIVE"
# DCGM 4.6 tags (dcgm_fields.py alias table): the exporter prints whichever its counters file names.
DCGM_EXPORTER_SM_ACTIVE_46: Final = "DCGM_FI_PROF_SM_UTIL_RATIO"
DCGM_EXPORTER_DRAM_ACTIVE_46: Final = "DCGM_FI_PROF_DRAM_UTIL_RATIO"
DCGM_EXPORTER_SM_CYCLES_ELAPSED_TOTAL: Final = "DCGM_FI_PROF_SM_CYCLES_ELAPSED_TOTAL"
DCGM_EXPORTER_MMA_CYCLES_ACTIVE_TOTAL: Final = "DCGM_FI_PROF_MMA_CYCLES_ACTIVE_TOTAL"
# Engine and SM activity and link traffic. GR_ENGINE_ACTIVE and the PCIe rates are in dcgm-exporter's default counters
# file; SM_ACTIVE, SM_OCCUPANCY and the NVLink rates only when the counters file enables them. The four link fields are
# bytes per second (DCGM's average over its sampling period) whatever TYPE the counters file gives them.
DCGM_EXPORTER_ENGINE_ACTIVE: Final = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
DCGM_EXPORTER_ENGINE_ACTIVE_46: Final = "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO"
DCGM_EXPORTER_SM_OCCUPANCY: Final = "DCGM_FI_PROF_SM_OCCUPANCY"
DCGM_EXPORTER_SM_OCCUPANCY_46: Final = "DCGM_FI_PROF_SM_OCCUPANCY_RATIO"
DCGM_EXPORTER_PCIE_TX_BYTES: Final = "DCGM_FI_PROF_PCIE_TX_BYTES"  # not renamed in DCGM 4.6, like 1010-1012
DCGM_EXPORTER_PCIE_RX_BYTES: Final = "DCGM_FI_PROF_PCIE_RX_BYTES"
DCGM_EXPORTER_NVLINK_TX_BYTES: Final = "DCGM_FI_PROF_NVLINK_TX_BYTES"
DCGM_EXPORTER_NVLINK_RX_BYTES: Final = "DCGM_FI_PROF_NVLINK_RX_BYTES"
# `dcgmi dmon` column headers (the fields' short names in DCGM's dcgm_fields.cpp) -> field id.
DCGMI_DMON_COLUMNS: Final = {
    "SMCLK": DCGM_FI_DEV_SM_CLOCK,
    "SMMAX": DCGM_FI_DEV_MAX_SM_CLOCK,
    "GRACT": DCGM_FI_PROF_GR_ENGINE_ACTIVE,
    "SMACT": DCGM_FI_PROF_SM_ACTIVE,
    "SMOCC": DCGM_FI_PROF_SM_OCCUPANCY,
    "TENSO": DCGM_FI_PROF_PIPE_TENSOR_ACTIVE,
    "DRAMA": DCGM_FI_PROF_DRAM_ACTIVE,
    "SMCELAP": DCGM_FI_PROF_SM_CYCLES_ELAPSED,
    "MMACACT": DCGM_FI_PROF_MMA_CYCLES_ACTIVE,
    "PCITX": DCGM_FI_PROF_PCIE_TX_BYTES,
    "PCIRX": DCGM_FI_PROF_PCIE_RX_BYTES,
    "NVLTX": DCGM_FI_PROF_NVLINK_TX_BYTES,
    "NVLRX": DCGM_FI_PROF_NVLINK_RX_BYTES,
}

# Blank sentinels DCGM uses for "no value"; they leak into dcgm-exporter output as numbers.
DCGM_INT64_BLANK_MIN: Final = 9223372036854775792  # DCGM_INT64_BLANK (0x7ffffffffffffff0) and above
DCGM_INT32_BLANK_MIN: Final = 2147483632  # DCGM_INT32_BLANK (0x7ffffff0) and above
DCGM_FP64_BLANK_MIN: Final = 140737488355328.0  # DCGM_FP64_BLANK (2^47) and above

# --- NVML ids ---------------------------------------------------------------------------------------

NVML_CLOCK_SM: Final = 1
NVML_GPM_METRIC_GRAPHICS_UTIL: Final = 1
NVML_GPM_METRIC_SM_UTIL: Final = 2
NVML_GPM_METRIC_SM_OCCUPANCY: Final = 3
NVML_GPM_METRIC_ANY_TENSOR_UTIL: Final = 5
NVML_GPM_METRIC_DRAM_BW_UTIL: Final = 10
NVML_GPM_METRIC_SM_CYCLES_ELAPSED: Final = 248
NVML_GPM_METRIC_SM_CYCLES_ACTIVE: Final = 249
NVML_GPM_METRIC_MMA_CYCLES_ACTIVE: Final = 250
# Link throughput between the two GPM samples, in MiB per second (nvml.h): totals over all NVLinks of the GPU.
NVML_GPM_METRIC_PCIE_TX_PER_SEC: Final = 20
NVML_GPM_METRIC_PCIE_RX_PER_SEC: Final = 21
NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: Final = 60
NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: Final = 61
NVML_GPM_BYTES_PER_UNIT: Final = 1 << 20  # bytes in one MiB, the unit of the per-second link metrics


class NvmlReturn:
    """nvmlReturn_t codes (nvml.h) the NVML source maps to ``ErrorReason`` and the fake NVML raises on demand."""

    SUCCESS = 0
    ERROR_UNINITIALIZED = 1
    ERROR_INVALID_ARGUMENT = 2
    ERROR_NOT_SUPPORTED = 3
    ERROR_NO_PERMISSION = 4
    ERROR_NOT_FOUND = 6
    ERROR_INSUFFICIENT_SIZE = 7
    ERROR_DRIVER_NOT_LOADED = 9
    ERROR_TIMEOUT = 10
    ERROR_LIBRARY_NOT_FOUND = 12
    ERROR_FUNCTION_NOT_FOUND = 13
    ERROR_GPU_IS_LOST = 15
    ERROR_RESET_REQUIRED = 16
    ERROR_LIB_RM_VERSION_MISMATCH = 18
    ERROR_NO_DATA = 21
    ERROR_ARGUMENT_VERSION_MISMATCH = 25
    ERROR_NOT_READY = 27
    ERROR_GPU_NOT_FOUND = 28
    ERROR_UNKNOWN = 999


# --- Job attribution: the only process-environment keys ever read ----------------------------------

ENV_OFU_JOB_ID: Final = "OFU_JOB_ID"
ENV_OFU_JOB_NAME: Final = "OFU_JOB_NAME"
ENV_OFU_PRECISION: Final = "OFU_PRECISION"
PROCESS_ENV_KEYS: Final = (
    ENV_OFU_JOB_ID,
    ENV_OFU_JOB_NAME,
    ENV_OFU_PRECISION,
    "SLURM_JOB_ID",
    "SLURM_JOB_NAME",
    "TORCHELASTIC_RUN_ID",
)
# A hint only (GpuIdentity.hints), never exported: the MIG device's own UUID, which the kubelet's
# PodResources API lists for MIG allocations. Sources that know it (NVML) may set it.
HINT_MIG_UUID: Final = "gpu.mig.uuid"

# --- Where OFU is lost: power, energy and clock throttling (producer inputs) -------------------------
# Kept apart from the blocks above so the metrics of issue 11 read as one piece. Units: power in W over
# the interval, the board's energy counter in J, throttle as the share of the interval the SM clock was
# held down for a reason (violation-time counters where the source has them, else the reasons bitmask
# sampled through the interval).

GPU_POWER: Final = MetricSpec(
    "gpu.power", "W", "gauge", "Power draw over the interval (energy counter delta / time where the board has one)"
)
GPU_ENERGY: Final = MetricSpec(
    "gpu.energy", "J", "sum", "Energy the board used since the start time (its energy counter, monotonic, cumulative)"
)
GPU_THROTTLE: Final = MetricSpec(
    "gpu.throttle", "1", "gauge", "Share of the interval the SM clock was held down, by gpu.throttle.reason"
)
LOSS_INPUT_METRICS: Final = (GPU_POWER, GPU_ENERGY, GPU_THROTTLE)
# One tuple of every producer metric; last, the mark of a GPU read without OFU.
PRODUCER_METRICS = (*PRODUCER_METRICS, *LOSS_INPUT_METRICS, GPU_OFU_UNMEASURED)
# The producer metrics the collector's loss split takes per GPU, beside gpu.ofu (decoded and averaged per window).
LOSS_SPLIT_INPUTS: Final = (
    GPU_TENSOR_ACTIVE,
    GPU_CLOCK_SM,
    GPU_CLOCK_SM_MAX,
    GPU_FLOPS_ACHIEVED,
    GPU_POWER,
    GPU_ENERGY,
    GPU_THROTTLE,
    GPU_ENGINE_ACTIVE,
    GPU_SM_ACTIVE,
    GPU_DRAM_ACTIVE,
    GPU_NVLINK_IO,
    GPU_PCIE_IO,
)

GPU_THROTTLE_REASON: Final = "gpu.throttle.reason"


class ThrottleReason:
    """Values of ``gpu.throttle.reason``: why the SM clock was held below its maximum."""

    POWER = "power"  # the board's power cap (software power capping)
    THERMAL = "thermal"  # GPU or memory temperature (software or hardware thermal slowdown)
    HW_SLOWDOWN = "hw_slowdown"  # hardware slowdown by 2x or more (power brake, fast power trigger)
    SYNC_BOOST = "sync_boost"  # held to the slowest GPU of its sync-boost group
    APP_CLOCK = "app_clock"  # applications clocks set below the maximum
    OTHER = "other"  # board limit, reliability, display clocks

    ALL = (POWER, THERMAL, HW_SLOWDOWN, SYNC_BOOST, APP_CLOCK, OTHER)


# nvmlClocksEventReason* bits (nvml.h; the same bits as DCGM_CLOCKS_EVENT_REASON_* of field 112) -> reason.
# GPU idle (0x1) is left out on purpose: an idle GPU's low clock costs no tensor work (its loss is "idle").
CLOCKS_EVENT_REASON_GPU_IDLE: Final = 0x1
CLOCKS_EVENT_REASON_BITS: Final = {
    0x0000000000000002: ThrottleReason.APP_CLOCK,  # ApplicationsClocksSetting
    0x0000000000000004: ThrottleReason.POWER,  # SwPowerCap
    0x0000000000000008: ThrottleReason.HW_SLOWDOWN,  # HwSlowdown
    0x0000000000000010: ThrottleReason.SYNC_BOOST,  # SyncBoost
    0x0000000000000020: ThrottleReason.THERMAL,  # SwThermalSlowdown
    0x0000000000000040: ThrottleReason.THERMAL,  # HwThermalSlowdown
    0x0000000000000080: ThrottleReason.HW_SLOWDOWN,  # HwPowerBrakeSlowdown
    0x0000000000000100: ThrottleReason.OTHER,  # DisplayClockSetting
    0x0000000000000200: ThrottleReason.OTHER,  # BoardLimit
    0x0000000000000400: ThrottleReason.OTHER,  # Reliability
}

# NVML: nvmlDeviceGetPowerUsage (mW), nvmlDeviceGetTotalEnergyConsumption (mJ since the driver loaded),
# nvmlDeviceGetCurrentClocksEventReasons (the bitmask above), nvmlDeviceGetViolationStatus(policy) ->
# nvmlViolationTime_t {referenceTime (us), violationTime (ns, cumulative)}.
NVML_PERF_POLICY_POWER: Final = 0
NVML_PERF_POLICY_THERMAL: Final = 1
NVML_PERF_POLICY_SYNC_BOOST: Final = 2
NVML_PERF_POLICY_BOARD_LIMIT: Final = 3
NVML_PERF_POLICY_LOW_UTILIZATION: Final = 4  # an idle GPU: not a throttle (see the GPU idle bit)
NVML_PERF_POLICY_RELIABILITY: Final = 5
# Violation counters by reason; several counters of one reason add up (capped at the whole interval).
NVML_VIOLATION_POLICIES: Final = {
    NVML_PERF_POLICY_POWER: ThrottleReason.POWER,
    NVML_PERF_POLICY_THERMAL: ThrottleReason.THERMAL,
    NVML_PERF_POLICY_SYNC_BOOST: ThrottleReason.SYNC_BOOST,
    NVML_PERF_POLICY_BOARD_LIMIT: ThrottleReason.OTHER,
    NVML_PERF_POLICY_RELIABILITY: ThrottleReason.OTHER,
}

# DCGM fields. 155 is a double in W (DCGM 4.6 tags it DCGM_FI_DEV_BOARD_POWER_WATTS), 156 an int64 in mJ
# since the driver loaded, 112 the bitmask, 240-245 int64 violation counters read from NVML's
# NVML_FI_DEV_PERF_POLICY_* field values, in ns (older dcgm_fields.h comments said usec; the values were
# always NVML's nanoseconds).
DCGM_FI_DEV_CLOCKS_EVENT_REASONS: Final = 112  # formerly DCGM_FI_DEV_CLOCK_THROTTLE_REASONS
DCGM_FI_DEV_POWER_USAGE: Final = 155
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION: Final = 156
DCGM_FI_DEV_POWER_VIOLATION: Final = 240
DCGM_FI_DEV_THERMAL_VIOLATION: Final = 241
DCGM_FI_DEV_SYNC_BOOST_VIOLATION: Final = 242
DCGM_FI_DEV_BOARD_LIMIT_VIOLATION: Final = 243
DCGM_FI_DEV_LOW_UTIL_VIOLATION: Final = 244  # idle, not read
DCGM_FI_DEV_RELIABILITY_VIOLATION: Final = 245
DCGM_VIOLATION_FIELDS: Final = {
    DCGM_FI_DEV_POWER_VIOLATION: ThrottleReason.POWER,
    DCGM_FI_DEV_THERMAL_VIOLATION: ThrottleReason.THERMAL,
    DCGM_FI_DEV_SYNC_BOOST_VIOLATION: ThrottleReason.SYNC_BOOST,
    DCGM_FI_DEV_BOARD_LIMIT_VIOLATION: ThrottleReason.OTHER,
    DCGM_FI_DEV_RELIABILITY_VIOLATION: ThrottleReason.OTHER,
}
DCGM_VIOLATION_UNIT_NS: Final = 1  # nanoseconds per unit of the violation fields

# dcgm-exporter's metric names for them (the violation fields are not in its default counters file).
DCGM_EXPORTER_POWER_USAGE: Final = "DCGM_FI_DEV_POWER_USAGE"
DCGM_EXPORTER_POWER_USAGE_46: Final = "DCGM_FI_DEV_BOARD_POWER_WATTS"
DCGM_EXPORTER_TOTAL_ENERGY: Final = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
DCGM_EXPORTER_CLOCKS_EVENT_REASONS: Final = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"
DCGM_EXPORTER_CLOCK_THROTTLE_REASONS: Final = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
DCGM_EXPORTER_VIOLATIONS: Final = {
    "DCGM_FI_DEV_POWER_VIOLATION": ThrottleReason.POWER,
    "DCGM_FI_DEV_THERMAL_VIOLATION": ThrottleReason.THERMAL,
    "DCGM_FI_DEV_SYNC_BOOST_VIOLATION": ThrottleReason.SYNC_BOOST,
    "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION": ThrottleReason.OTHER,
    "DCGM_FI_DEV_RELIABILITY_VIOLATION": ThrottleReason.OTHER,
}

# --- DCGM field generations (every source reads each one by field id and unit) --------------------------------------
# DCGM 4.6.1 (NVIDIA/go-dcgm pkg/dcgm/const_fields.go, "DCGM 4.6.1 support") moved the clocks and the energy counter
# to new fields in base units and renamed the other fields' tags; the old ids and tags stay valid ("Deprecated: Use ...
# instead"). dcgm-exporter prints a field under whichever tag its counters file names (4.9 names the new ones by
# default), and 4.10 prints the PCIe and NVLink rates as *_BYTES_PER_SECOND (the same fields 1009-1012).

DCGM_FI_DEV_SM_CLOCK_HERTZ: Final = 1603  # Hz; the same clock as field 100 (MHz)
DCGM_FI_DEV_SM_MAX_CLOCK_HERTZ: Final = 1608  # Hz; field 113 (MHz)
DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL: Final = 1611  # J since the driver loaded; field 156 (mJ)
# Old field id -> its base-unit successor: the DCGM source watches the newest a host engine knows; all read either.
DCGM_FIELD_GENERATIONS: Final = {
    DCGM_FI_DEV_SM_CLOCK: DCGM_FI_DEV_SM_CLOCK_HERTZ,
    DCGM_FI_DEV_MAX_SM_CLOCK: DCGM_FI_DEV_SM_MAX_CLOCK_HERTZ,
    DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION: DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL,
}
# Field id -> the factor from its unit to the base unit readings carry (MHz -> Hz, mJ -> J); 1 for every other field.
DCGM_FIELD_TO_BASE_UNIT: Final = {
    DCGM_FI_DEV_SM_CLOCK: 1e6,
    DCGM_FI_DEV_MAX_SM_CLOCK: 1e6,
    DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION: 1e-3,
}
DCGM_EXPORTER_SM_CLOCK_HERTZ: Final = "DCGM_FI_DEV_SM_CLOCK_HERTZ"
DCGM_EXPORTER_SM_MAX_CLOCK_HERTZ: Final = "DCGM_FI_DEV_SM_MAX_CLOCK_HERTZ"
DCGM_EXPORTER_ENERGY_JOULES: Final = "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL"
# The labels dcgm-exporter puts the driver version in, newest first (DCGM 4.6.1 renamed DCGM_FI_DRIVER_VERSION).
DCGM_EXPORTER_DRIVER_LABELS: Final = ("DCGM_FI_SYSTEM_DRIVER_VERSION", "DCGM_FI_DRIVER_VERSION")
# Every dcgm-exporter metric name a source reads -> its DCGM field id: the one table the exporter's pages are read by.
DCGM_EXPORTER_FIELDS: Final = {
    DCGM_EXPORTER_SM_CLOCK: DCGM_FI_DEV_SM_CLOCK,
    DCGM_EXPORTER_SM_CLOCK_HERTZ: DCGM_FI_DEV_SM_CLOCK_HERTZ,
    DCGM_EXPORTER_MAX_SM_CLOCK: DCGM_FI_DEV_MAX_SM_CLOCK,
    DCGM_EXPORTER_SM_MAX_CLOCK_HERTZ: DCGM_FI_DEV_SM_MAX_CLOCK_HERTZ,
    DCGM_EXPORTER_TENSOR_ACTIVE: DCGM_FI_PROF_PIPE_TENSOR_ACTIVE,
    DCGM_EXPORTER_TENSOR_ACTIVE_46: DCGM_FI_PROF_PIPE_TENSOR_ACTIVE,
    DCGM_EXPORTER_ENGINE_ACTIVE: DCGM_FI_PROF_GR_ENGINE_ACTIVE,
    DCGM_EXPORTER_ENGINE_ACTIVE_46: DCGM_FI_PROF_GR_ENGINE_ACTIVE,
    DCGM_EXPORTER_SM_ACTIVE: DCGM_FI_PROF_SM_ACTIVE,
    DCGM_EXPORTER_SM_ACTIVE_46: DCGM_FI_PROF_SM_ACTIVE,
    DCGM_EXPORTER_SM_OCCUPANCY: DCGM_FI_PROF_SM_OCCUPANCY,
    DCGM_EXPORTER_SM_OCCUPANCY_46: DCGM_FI_PROF_SM_OCCUPANCY,
    DCGM_EXPORTER_DRAM_ACTIVE: DCGM_FI_PROF_DRAM_ACTIVE,
    DCGM_EXPORTER_DRAM_ACTIVE_46: DCGM_FI_PROF_DRAM_ACTIVE,
    DCGM_EXPORTER_PCIE_TX_BYTES: DCGM_FI_PROF_PCIE_TX_BYTES,
    DCGM_EXPORTER_PCIE_RX_BYTES: DCGM_FI_PROF_PCIE_RX_BYTES,
    DCGM_EXPORTER_NVLINK_TX_BYTES: DCGM_FI_PROF_NVLINK_TX_BYTES,
    DCGM_EXPORTER_NVLINK_RX_BYTES: DCGM_FI_PROF_NVLINK_RX_BYTES,
    "DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND": DCGM_FI_PROF_PCIE_TX_BYTES,
    "DCGM_FI_PROF_PCIE_RX_BYTES_PER_SECOND": DCGM_FI_PROF_PCIE_RX_BYTES,
    "DCGM_FI_PROF_NVLINK_TX_BYTES_PER_SECOND": DCGM_FI_PROF_NVLINK_TX_BYTES,
    "DCGM_FI_PROF_NVLINK_RX_BYTES_PER_SECOND": DCGM_FI_PROF_NVLINK_RX_BYTES,
    DCGM_EXPORTER_SM_CYCLES_ELAPSED: DCGM_FI_PROF_SM_CYCLES_ELAPSED,
    DCGM_EXPORTER_SM_CYCLES_ELAPSED_TOTAL: DCGM_FI_PROF_SM_CYCLES_ELAPSED,
    DCGM_EXPORTER_MMA_CYCLES_ACTIVE: DCGM_FI_PROF_MMA_CYCLES_ACTIVE,
    DCGM_EXPORTER_MMA_CYCLES_ACTIVE_TOTAL: DCGM_FI_PROF_MMA_CYCLES_ACTIVE,
    DCGM_EXPORTER_POWER_USAGE: DCGM_FI_DEV_POWER_USAGE,
    DCGM_EXPORTER_POWER_USAGE_46: DCGM_FI_DEV_POWER_USAGE,
    DCGM_EXPORTER_TOTAL_ENERGY: DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
    DCGM_EXPORTER_ENERGY_JOULES: DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL,
    DCGM_EXPORTER_CLOCKS_EVENT_REASONS: DCGM_FI_DEV_CLOCKS_EVENT_REASONS,
    DCGM_EXPORTER_CLOCK_THROTTLE_REASONS: DCGM_FI_DEV_CLOCKS_EVENT_REASONS,
    "DCGM_FI_DEV_POWER_VIOLATION": DCGM_FI_DEV_POWER_VIOLATION,
    "DCGM_FI_DEV_THERMAL_VIOLATION": DCGM_FI_DEV_THERMAL_VIOLATION,
    "DCGM_FI_DEV_SYNC_BOOST_VIOLATION": DCGM_FI_DEV_SYNC_BOOST_VIOLATION,
    "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION": DCGM_FI_DEV_BOARD_LIMIT_VIOLATION,
    "DCGM_FI_DEV_RELIABILITY_VIOLATION": DCGM_FI_DEV_RELIABILITY_VIOLATION,
}

# --- AMD Device Metrics Exporter (ROCm/device-metrics-exporter): AMD Instinct GPUs ----------------------------------
# Its Prometheus metric names for the fields OFU and its loss use. The profiler fields (GPU_PROF_*) are rocprofiler
# derived counters the exporter samples when its ProfilerMetrics are on; both below are in its default field list.

AMD_EXPORTER_MFMA_ACTIVE: Final = "gpu_prof_tensor_active_percent"  # MfmaUtil, %: MFMA busy per GPU-active cycle
AMD_EXPORTER_GPU_ACTIVE: Final = "gpu_prof_gui_util_percent"  # GPU_UTIL, %: GRBM_GUI_ACTIVE / GRBM_COUNT; engine active
# GPU_GFX_ACTIVITY, %: the SMI's GFX engine busy share (on by default; a whole GPU's, printed on partition 0 only). It
# stands in for gpu_prof_gui_util_percent, a profiler field that is off unless the exporter's ProfilerMetrics are on.
AMD_EXPORTER_GFX_ACTIVITY: Final = "gpu_gfx_activity"
AMD_EXPORTER_CLOCK: Final = "gpu_clock"  # MHz, one series per clock_type (and clock_index)
AMD_EXPORTER_MAX_CLOCK: Final = "gpu_max_clock"  # MHz, the top of the clock's DPM range, per clock_type
AMD_EXPORTER_ENGINE_CLOCK_TYPE: Final = "system"  # clock_type of the engine (GFX, SCLK) clock OFU is measured in
AMD_EXPORTER_POWER_USAGE: Final = "gpu_power_usage"  # W
AMD_EXPORTER_PACKAGE_POWER: Final = "gpu_package_power"  # W, socket power (MI3xx), where gpu_power_usage is absent
AMD_EXPORTER_ENERGY: Final = "gpu_energy_consumed"  # uJ accumulated since the driver loaded
AMD_ENERGY_UNIT_J: Final = 1e-6  # joules per unit of gpu_energy_consumed
# Values the exporter's own filter treats as "not applicable" (max of the unsigned widths, and of int32): no value.
AMD_NOT_APPLICABLE: Final = (0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF)

# --- Goodput and resilience -----------------------------------------------------------------------------
# Where every allocated GPU-second went: progress from the training side (job.step, checkpoint time), a hang flag
# from the counters, and the GPU time that made no progress (badput) by cause. docs/design.md defines each term
# against Google's ML Productivity Goodput and Meta's ETTR.

# Training side, beside job.mfu (the MFU reporter and the log follower send them, with job.id, from one process of
# the job): its progress, and the time its framework said it spent saving and loading checkpoints.
JOB_STEP: Final = MetricSpec(
    "job.step", "{step}", "gauge", "The last training step the job completed (the one it resumed from, at a restart)"
)
JOB_CHECKPOINT_TIME: Final = MetricSpec(
    "job.checkpoint.time",
    "s",
    "sum",
    "Seconds the job spent saving and loading checkpoints since its reporter started (cumulative), by "
    "checkpoint.operation",
)
CHECKPOINT_OPERATION: Final = "checkpoint.operation"  # on job.checkpoint.time: save or load


class CheckpointOperation:
    """Values of ``checkpoint.operation`` on ``job.checkpoint.time``."""

    SAVE = "save"
    LOAD = "load"

    ALL = (SAVE, LOAD)


TRAINING_METRICS: Final = (JOB_STEP, JOB_CHECKPOINT_TIME)  # the training side's, beside JOB_MFU

# Collector outputs per job and window (job.badput a delta: the GPU-seconds booked in that window) and the fleet's.
# job.goodput is over the job so far; fleet.goodput over the --horizon. Both carry goodput.basis.
JOB_HANG: Final = MetricSpec(
    "job.hang",
    "1",
    "gauge",
    "1 while every GPU of the job runs kernels with nothing moving (no tensor, DRAM or link traffic) for the hang "
    "windows, else 0",
)
JOB_BADPUT: Final = MetricSpec(
    "job.badput", "s", "sum", "GPU-seconds of the job that made no progress, booked in the window, by goodput.cause"
)
JOB_GOODPUT: Final = MetricSpec(
    "job.goodput", "1", "gauge", "Productive GPU time / allocated GPU time of the job so far, on goodput.basis"
)
JOB_GOODPUT_FLOPS: Final = MetricSpec(
    "job.goodput.flops",
    "1",
    "gauge",
    "Useful FLOPs of the job's productive time / the peak FLOPs of its allocated GPU time, so far (OFU x goodput)",
)
FLEET_BADPUT: Final = MetricSpec(
    "fleet.badput", "s", "sum", "GPU-seconds of the fleet's jobs that made no progress, booked in the window, by cause"
)
FLEET_GOODPUT: Final = MetricSpec(
    "fleet.goodput", "1", "gauge", "Productive GPU time / allocated GPU time of the fleet's jobs over the horizon"
)
COLLECTOR_GOODPUT_METRICS: Final = (JOB_HANG, JOB_BADPUT, JOB_GOODPUT, JOB_GOODPUT_FLOPS, FLEET_BADPUT, FLEET_GOODPUT)

GOODPUT_CAUSE: Final = "goodput.cause"  # on job.badput and fleet.badput: why the time made no progress


class GoodputCause:
    """Values of ``goodput.cause`` on ``job.badput``: why allocated GPU time made no progress.

    Each GPU-second is booked once, in this order of precedence within a window: ``hang`` (the whole job's time in a
    window all its GPUs were stalled), ``checkpoint``, then ``idle``; what is left is productive until progress says
    otherwise: ``startup``, ``recovery`` and ``rework`` move productive time already counted to badput in the window
    the step points show it (``otel_ofu_collector.aggregation.goodput``).
    """

    IDLE = "idle"  # GPUs with no tensor activity all window and not hung: their whole time
    HANG = "hang"  # every GPU of the job ran kernels with nothing moving all window (from its first such window)
    CHECKPOINT = "checkpoint"  # the checkpoint save and load seconds its framework reported x the job's GPUs
    STARTUP = "startup"  # from the job's first GPU report to its first job.step point
    RECOVERY = "recovery"  # from the last progress before a restart to the step point the job resumed from
    REWORK = "rework"  # steps done again after a restart: the productive GPU time they took the first time

    ALL = (IDLE, HANG, CHECKPOINT, STARTUP, RECOVERY, REWORK)
    PROGRESS = (STARTUP, RECOVERY, REWORK)  # known only from job.step


GOODPUT_BASIS: Final = "goodput.basis"  # on the goodput outputs: counters, or progress too


class GoodputBasis:
    """Values of ``goodput.basis``: what a goodput was computed from."""

    COUNTERS = "counters"  # no job.step from the job: idle, hang and checkpoint time only; the rest counts productive
    PROGRESS = "progress"  # the job reported job.step: startup, recovery and rework counted too
    MIXED = "mixed"  # fleet.goodput over jobs of both

    ALL = (COUNTERS, PROGRESS, MIXED)


# Flag events: each flag's rise and fall is also an OTLP log record, sent to the collector's downstream beside the
# window's metrics. Its event_name says which; its body is the sentence the reports write; its attributes are the job's
# (and the GPU's) identity, these keys, and the flag's figures under the names of the metrics they are values of
# (job.ofu, job.mfu, job.gpus, job.badput with goodput.cause, gpu.ofu).
EVENT_FLAG: Final = "otel_ofu.flag"  # the flag's metric name (job.hang, gpu.straggler, ...)
EVENT_FLAG_KIND: Final = "otel_ofu.flag.kind"  # its short name in the reports (hang, straggler, miscount, ...)
EVENT_FLAG_VALUE: Final = "otel_ofu.flag.value"  # its value in the window (1 or 0; idle GPU equivalents)
EVENT_FLAG_STATE: Final = "otel_ofu.flag.state"  # raised or cleared: what event_name says, for routing on attributes
EVENT_PEER_OFU: Final = "otel_ofu.peer_ofu"  # a straggler's: the median OFU of its job's other GPUs


class FlagEventName:
    """Values of a flag event's ``event_name`` (the OTLP log record's field)."""

    RAISED = "otel_ofu.flag.raised"  # the flag rose in the window (severity WARN; ERROR for a hang)
    CLEARED = "otel_ofu.flag.cleared"  # it fell (severity INFO)

    ALL = (RAISED, CLEARED)


class FlagState:
    """Values of ``otel_ofu.flag.state`` on a flag event: the same as its ``event_name``, as an attribute (what the
    OpenTelemetry Collector's filter and routing processors and the backends' event views match on most simply)."""

    RAISED = "raised"
    CLEARED = "cleared"

    ALL = (RAISED, CLEARED)


# --- Conventions and stability ------------------------------------------------------------------------
# The OpenTelemetry semantic conventions the telemetry follows, and how far each name of the project's own may
# change. docs/design.md says why the contract's names stay gpu.*, job.*, fleet.* beside the conventions' hw.*.

# Every ResourceMetrics and ScopeMetrics the producer, the MFU reporter and the collector send carries it: the
# version of the conventions whose attributes (SEMCONV_ATTRIBUTES) they use.
SCHEMA_URL: Final = "https://opentelemetry.io/schemas/1.44.0"
# The attribute keys borrowed from the conventions (their meaning and stability are OpenTelemetry's).
SEMCONV_ATTRIBUTES: Final = (
    SERVICE_NAME,
    SERVICE_INSTANCE_ID,
    HOST_NAME,
    HW_ID,
    HW_TYPE,
    HW_VENDOR,
    HW_MODEL,
    K8S_POD_NAME,
    K8S_NAMESPACE_NAME,
    K8S_CONTAINER_NAME,
    K8S_POD_UID,
    NETWORK_IO_DIRECTION,
)


class StabilityLevel:
    """How far a name of the project's own may change, after OpenTelemetry's own levels."""

    STABLE = "stable"  # the product's contract: never renamed; its unit, kind and meaning kept
    DEVELOPMENT = "development"  # may be renamed or dropped in a minor release, said in CHANGELOG.md
    ALL = (STABLE, DEVELOPMENT)


# Outside the contract: the shards' partial state (an interface between the project's own processes), the
# processes' self-metrics (their health, which grows with their faults), the jobs' activity context and the mark of
# a GPU read without OFU (new in this release: its attributes may still change).
_DEVELOPMENT_METRICS: Final = frozenset(
    spec.name
    for spec in (
        GPU_OFU_UNMEASURED,
        *COLLECTOR_PARTIAL_METRICS,
        *COLLECTOR_SELF_METRICS,
        SOURCE_ERRORS,
        EXPORT_FAILURES,
        EXPORT_DURATION,
        EXPORT_REJECTED,
        JOB_DRAM_ACTIVE,
        JOB_NVLINK_THROUGHPUT,
        JOB_PCIE_THROUGHPUT,
        *TRAINING_METRICS,
        *COLLECTOR_GOODPUT_METRICS,
    )
)
# Every metric name of the project's own, by its stability level (docs/reference.md shows it beside each).
STABILITY: Final = {
    spec.name: StabilityLevel.DEVELOPMENT if spec.name in _DEVELOPMENT_METRICS else StabilityLevel.STABLE
    for spec in (
        *PRODUCER_METRICS,
        JOB_MFU,
        SOURCE_ERRORS,
        EXPORT_FAILURES,
        EXPORT_DURATION,
        EXPORT_REJECTED,
        *COLLECTOR_METRICS,
        *COLLECTOR_LOSS_METRICS,
        *COLLECTOR_PARTIAL_METRICS,
        *COLLECTOR_SELF_METRICS,
        *TRAINING_METRICS,
        *COLLECTOR_GOODPUT_METRICS,
    )
}
