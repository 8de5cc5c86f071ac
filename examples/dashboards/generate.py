"""Dashboards as code: Datadog, Honeycomb and Grafana views of otel-ofu, generated from the vocabulary.

Every metric and attribute name comes from ``otel_ofu.names``, so a renamed metric changes the
generated files and the test that compares them with the committed copies fails until they are
regenerated:

    python examples/dashboards/generate.py          # rewrite the committed JSON files
    python examples/dashboards/generate.py --check  # exit 1 if they are stale
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from otel_ofu import names
from otel_ofu.generated_files import write_or_check
from otel_ofu.prometheus_names import label_name, metric_name

HERE = Path(__file__).resolve().parent
JSON = dict[str, Any]

TEMPLATE_KEYS = (names.HW_MODEL, names.GPU_PRECISION, names.JOB_ID, names.HOST_NAME)
IDLE_OFU_THRESHOLD = 0.02  # an allocated GPU whose OFU stays under 2% is doing no tensor work


# --- Datadog ------------------------------------------------------------------------------------------
# Metric names arrive in Datadog as the OTLP names (dots kept); attributes become tags only where the
# producer copies them onto data points (placement datapoint/both) or the Datadog exporter has
# resource_attributes_as_tags: true. See examples/dashboards/README.md.


def _dd_scope(*extra: str) -> str:
    filters = [f"{key}:${key.replace('.', '_')}" for key in TEMPLATE_KEYS] + list(extra)
    return "{" + ",".join(filters) + "}"


def _dd_query(name: str, query: str, aggregator: str | None = None) -> JSON:
    definition: JSON = {"data_source": "metrics", "name": name, "query": query}
    if aggregator is not None:
        definition["aggregator"] = aggregator
    return definition


def _dd_timeseries(title: str, queries: list[JSON], formulas: list[JSON], display_type: str = "line") -> JSON:
    return {
        "definition": {
            "type": "timeseries",
            "title": title,
            "show_legend": True,
            "requests": [
                {
                    "queries": queries,
                    "formulas": formulas,
                    "response_format": "timeseries",
                    "display_type": display_type,
                }
            ],
        }
    }


def _dd_toplist(title: str, query: str, formula_alias: str, aggregator: str = "last", formula: str = "q") -> JSON:
    return {
        "definition": {
            "type": "toplist",
            "title": title,
            "requests": [
                {
                    "queries": [_dd_query("q", query, aggregator=aggregator)],
                    "formulas": [{"formula": formula, "alias": formula_alias}],
                    "response_format": "scalar",
                }
            ],
        }
    }


def _dd_query_value(title: str, query: str) -> JSON:
    return {
        "definition": {
            "type": "query_value",
            "title": title,
            "precision": 2,
            "requests": [
                {
                    "queries": [_dd_query("q", query, aggregator="last")],
                    "formulas": [{"formula": "q"}],
                    "response_format": "scalar",
                }
            ],
        }
    }


SECONDS_PER_HOUR = 3600
JOULES_PER_KWH = 3_600_000
FLOPS_PER_GFLOP = 1_000_000_000


def _dd_loss_widgets() -> list[JSON]:
    """Where OFU is lost and what it costs: the collector's loss outputs (sums arrive as Datadog counts)."""
    cause, job = names.OFU_LOSS_CAUSE, names.JOB_ID
    per_gpu = f"{{{names.HOST_NAME},{names.HW_ID},{job},{names.GPU_THROTTLE_REASON}}}"
    return [
        _dd_timeseries(
            "Per job: OFU lost by cause (idle, clock, and tensor or its parts no_kernel, sm_idle, non_tensor)",
            [_dd_query("q", f"avg:{names.JOB_OFU_LOSS.name}{_dd_scope()} by {{{job},{cause}}}")],
            [{"formula": "q"}],
            display_type="bars",
        ),
        _dd_timeseries(
            "Fleet GPU-hours lost by cause",
            [_dd_query("q", f"sum:{names.FLEET_GPU_TIME_LOST.name}{{*}} by {{{cause}}}.as_count()")],
            [{"formula": f"q / {SECONDS_PER_HOUR}", "alias": "GPU-hours lost"}],
            display_type="bars",
        ),
        _dd_timeseries(
            "Fleet cost of lost GPU-time by cause",
            [_dd_query("q", f"sum:{names.FLEET_COST_LOST.name}{{*}} by {{{cause}}}.as_count()")],
            [{"formula": "q", "alias": "cost lost"}],
            display_type="bars",
        ),
        _dd_timeseries(
            "Per job: where the tensor pipes' time went (no kernel, SMs empty, SMs off the tensor pipes)",
            [
                _dd_query(f"q{index}", f"avg:{names.JOB_OFU_LOSS.name}{_dd_scope(f'{cause}:{part}')} by {{{job}}}")
                for index, part in enumerate(names.OfuLossCause.TENSOR_PARTS)
            ],
            [{"formula": f"q{index}", "alias": part} for index, part in enumerate(names.OfuLossCause.TENSOR_PARTS)],
            display_type="bars",
        ),
        _dd_timeseries(
            "Per job: DRAM activity (what makes SMs off the tensor pipes memory-bound)",
            [_dd_query("q", f"avg:{names.JOB_DRAM_ACTIVE.name}{_dd_scope()} by {{{job}}}")],
            [{"formula": "q", "alias": "DRAM active"}],
        ),
        _dd_timeseries(
            "Per job: NVLink and PCIe bytes per second per GPU (what makes them communication-bound)",
            [
                _dd_query("nvlink", f"avg:{names.JOB_NVLINK_THROUGHPUT.name}{_dd_scope()} by {{{job}}}"),
                _dd_query("pcie", f"avg:{names.JOB_PCIE_THROUGHPUT.name}{_dd_scope()} by {{{job}}}"),
            ],
            [{"formula": "nvlink", "alias": "NVLink"}, {"formula": "pcie", "alias": "PCIe"}],
        ),
        _dd_toplist(
            "Jobs by cost of lost GPU-time",
            f"sum:{names.JOB_COST_LOST.name}{_dd_scope()} by {{{job}}}.as_count()",
            "cost lost",
            aggregator="sum",
        ),
        _dd_toplist(
            "Jobs by GPU-hours lost",
            f"sum:{names.JOB_GPU_TIME_LOST.name}{_dd_scope()} by {{{job}}}.as_count()",
            "GPU-hours lost",
            aggregator="sum",
            formula=f"q / {SECONDS_PER_HOUR}",
        ),
        _dd_timeseries(
            "Fleet energy (kWh)",
            [_dd_query("q", f"sum:{names.FLEET_ENERGY.name}{{*}}.as_count()")],
            [{"formula": f"q / {JOULES_PER_KWH}", "alias": "kWh"}],
            display_type="bars",
        ),
        _dd_toplist(
            "Per job FLOPs per joule",
            f"avg:{names.JOB_FLOPS_PER_JOULE.name}{_dd_scope()} by {{{job}}}",
            "FLOP/J",
            aggregator="avg",
        ),
        _dd_toplist(
            "Per job emissions (kg CO2e)",
            f"sum:{names.JOB_EMISSIONS.name}{_dd_scope()} by {{{job}}}.as_count()",
            "kg CO2e",
            aggregator="sum",
        ),
        _dd_toplist(
            "Straggler GPUs (with the throttle reason when throttling explains it)",
            f"max:{names.GPU_STRAGGLER.name}{_dd_scope()} by {per_gpu}",
            "straggler flag",
            aggregator="max",
        ),
        _dd_toplist(
            "Idle GPUs per job (allocated, no tensor activity)",
            f"max:{names.JOB_GPUS_IDLE.name}{_dd_scope()} by {{{job}}}",
            "idle GPUs",
            aggregator="last",
        ),
    ]


def datadog_dashboard() -> JSON:
    quantile = names.FLEET_OFU_QUANTILE.name
    percentile_queries = [
        _dd_query(f"p{int(q * 100):02d}", f"avg:{quantile}{_dd_scope(f'{names.QUANTILE}:{q}')}")
        for q in (0.05, 0.5, 0.95)
    ]
    by_group = f"avg:{quantile}{_dd_scope(f'{names.QUANTILE}:0.5')} by {{{names.HW_MODEL},{names.GPU_PRECISION}}}"
    job_ofu = f"avg:{names.JOB_OFU.name}{_dd_scope()} by {{{names.JOB_ID}}}"
    job_gap = f"avg:{names.JOB_OFU_MFU_GAP.name}{_dd_scope()} by {{{names.JOB_ID}}}"
    idle = (
        f"avg:{names.GPU_OFU.name}{_dd_scope(f'{names.JOB_ID}:*')} by "
        f"{{{names.HOST_NAME},{names.HW_ID},{names.JOB_ID}}}"
    )
    return {
        "title": "otel-ofu: fleet FLOP utilization",
        "description": (
            "OFU (tensor pipe activity x clock / max clock) across the fleet, per job against the MFU its "
            "framework reports, and the jobs flagged for FLOP miscounts or regressions. Generated by "
            "examples/dashboards/generate.py from otel_ofu.names."
        ),
        "layout_type": "ordered",
        "template_variables": [
            {"name": key.replace(".", "_"), "prefix": key, "available_values": [], "default": "*"}
            for key in TEMPLATE_KEYS
        ],
        "widgets": [
            _dd_timeseries(
                "Fleet OFU percentiles (p5, p50, p95)",
                percentile_queries,
                [{"formula": query["name"], "alias": query["name"]} for query in percentile_queries],
            ),
            _dd_timeseries("Median OFU by GPU model and precision", [_dd_query("q", by_group)], [{"formula": "q"}]),
            _dd_timeseries(
                "Per job: OFU vs reported MFU",
                [_dd_query("ofu", job_ofu), _dd_query("gap", job_gap)],
                [{"formula": "ofu", "alias": "OFU"}, {"formula": "ofu + gap", "alias": "reported MFU"}],
            ),
            _dd_query_value(
                "Fleet OFU-MFU correlation (Pearson r)", f"avg:{names.FLEET_OFU_MFU_CORRELATION.name}{{*}}"
            ),
            _dd_query_value("Fleet OFU-MFU mean absolute error", f"avg:{names.FLEET_OFU_MFU_MAE.name}{{*}}"),
            _dd_toplist(
                "Jobs flagged: suspected FLOP miscount",
                f"max:{names.JOB_FLOPS_MISCOUNT.name}{_dd_scope()} by {{{names.JOB_ID}}}",
                "miscount flag",
            ),
            _dd_toplist(
                "Jobs flagged: OFU regression",
                f"max:{names.JOB_OFU_REGRESSION.name}{_dd_scope()} by {{{names.JOB_ID}}}",
                "regression flag",
            ),
            _dd_toplist(
                "Per job OFU-MFU correlation",
                f"avg:{names.JOB_OFU_MFU_CORRELATION.name}{_dd_scope()} by {{{names.JOB_ID}}}",
                "r",
            ),
            {
                "definition": {
                    "type": "toplist",
                    "title": f"GPUs allocated to a job but idle (OFU under {IDLE_OFU_THRESHOLD:.0%})",
                    "requests": [
                        {
                            "queries": [_dd_query("q", idle, aggregator="avg")],
                            "formulas": [
                                {
                                    "formula": "q",
                                    "alias": "OFU",
                                    "conditional_formats": [
                                        {"comparator": "<", "value": IDLE_OFU_THRESHOLD, "palette": "white_on_red"}
                                    ],
                                    "limit": {"count": 50, "order": "asc"},
                                }
                            ],
                            "response_format": "scalar",
                        }
                    ],
                }
            },
            *_dd_loss_widgets(),
            *_dd_goodput_widgets(),
        ],
    }


def _dd_goodput_widgets() -> list[JSON]:
    """Where the allocated GPU time went: goodput per job and for the fleet, badput by cause, hung jobs."""
    cause, job = names.GOODPUT_CAUSE, names.JOB_ID
    return [
        _dd_timeseries(
            "Per job: goodput (productive / allocated GPU time, over the job so far)",
            [_dd_query("q", f"avg:{names.JOB_GOODPUT.name}{_dd_scope()} by {{{job}}}")],
            [{"formula": "q", "alias": "goodput"}],
        ),
        _dd_query_value("Fleet goodput over the horizon", f"avg:{names.FLEET_GOODPUT.name}{{*}}"),
        _dd_timeseries(
            "Fleet GPU-hours without progress, by cause (idle, hang, checkpoint, startup, recovery, rework)",
            [_dd_query("q", f"sum:{names.FLEET_BADPUT.name}{{*}} by {{{cause}}}.as_count()")],
            [{"formula": f"q / {SECONDS_PER_HOUR}", "alias": "GPU-hours without progress"}],
            display_type="bars",
        ),
        _dd_toplist(
            "Hung jobs (every GPU running kernels with nothing moving)",
            f"max:{names.JOB_HANG.name}{_dd_scope()} by {{{job}}}",
            "hang flag",
            aggregator="max",
        ),
    ]


# --- Honeycomb ----------------------------------------------------------------------------------------
# Honeycomb stores OTLP metrics in a dataset (x-honeycomb-dataset) with one column per metric name and one
# per attribute. Query specs follow Honeycomb's Query Specification; the board is a flexible board whose
# panels reference the queries by name (create the queries, then the board, with Honeycomb's API).

HONEYCOMB_TIME_RANGE_S = 86400


def honeycomb_queries() -> dict[str, JSON]:
    quantile = names.FLEET_OFU_QUANTILE.name
    return {
        "fleet-ofu-median-by-model": {
            "calculations": [{"op": "AVG", "column": quantile}],
            "filters": [{"column": names.QUANTILE, "op": "=", "value": 0.5}],
            "breakdowns": [names.HW_MODEL, names.GPU_PRECISION],
            "time_range": HONEYCOMB_TIME_RANGE_S,
            "granularity": 60,
        },
        "fleet-ofu-tail": {
            "calculations": [{"op": "MIN", "column": quantile}, {"op": "MAX", "column": quantile}],
            "filters": [{"column": names.QUANTILE, "op": "in", "value": [0.05, 0.95]}],
            "breakdowns": [names.QUANTILE],
            "time_range": HONEYCOMB_TIME_RANGE_S,
            "granularity": 60,
        },
        "job-ofu-vs-gap": {
            "calculations": [
                {"op": "AVG", "column": names.JOB_OFU.name},
                {"op": "AVG", "column": names.JOB_OFU_MFU_GAP.name},
            ],
            "filters": [{"column": names.JOB_ID, "op": "exists"}],
            "breakdowns": [names.JOB_ID],
            "time_range": HONEYCOMB_TIME_RANGE_S,
            "granularity": 60,
        },
        "flagged-jobs": {
            "calculations": [
                {"op": "MAX", "column": names.JOB_FLOPS_MISCOUNT.name},
                {"op": "MAX", "column": names.JOB_OFU_REGRESSION.name},
            ],
            "filters": [
                {"column": names.JOB_FLOPS_MISCOUNT.name, "op": "=", "value": 1},
                {"column": names.JOB_OFU_REGRESSION.name, "op": "=", "value": 1},
            ],
            "filter_combination": "OR",
            "breakdowns": [names.JOB_ID, names.JOB_NAME],
            "orders": [{"op": "MAX", "column": names.JOB_FLOPS_MISCOUNT.name, "order": "descending"}],
            "time_range": HONEYCOMB_TIME_RANGE_S,
        },
        "fleet-correlation": {
            "calculations": [
                {"op": "AVG", "column": names.FLEET_OFU_MFU_CORRELATION.name},
                {"op": "AVG", "column": names.FLEET_OFU_MFU_MAE.name},
            ],
            "time_range": HONEYCOMB_TIME_RANGE_S,
            "granularity": 300,
        },
        "idle-allocated-gpus": {
            "calculations": [{"op": "AVG", "column": names.GPU_OFU.name}],
            "filters": [
                {"column": names.JOB_ID, "op": "exists"},
                {"column": names.GPU_OFU.name, "op": "<", "value": IDLE_OFU_THRESHOLD},
            ],
            "breakdowns": [names.HOST_NAME, names.HW_ID, names.JOB_ID],
            "time_range": 3600,
        },
        **_honeycomb_loss_queries(),
        **_honeycomb_goodput_queries(),
    }


def _honeycomb_goodput_queries() -> dict[str, JSON]:
    """Where the allocated GPU time went: goodput, badput by cause, hung jobs."""
    cause, job = names.GOODPUT_CAUSE, names.JOB_ID
    return {
        "job-goodput": {
            "calculations": [
                {"op": "MIN", "column": names.JOB_GOODPUT.name},
                {"op": "MIN", "column": names.JOB_GOODPUT_FLOPS.name},
            ],
            "filters": [{"column": names.JOB_GOODPUT.name, "op": "exists"}],
            "breakdowns": [job, names.GOODPUT_BASIS],
            "orders": [{"op": "MIN", "column": names.JOB_GOODPUT.name, "order": "ascending"}],
            "time_range": HONEYCOMB_TIME_RANGE_S,
            "granularity": 300,
        },
        "fleet-gpu-hours-without-progress-by-cause": {
            "calculated_fields": [
                {"name": "gpu_hours_badput", "expression": f"DIV(${names.FLEET_BADPUT.name}, {SECONDS_PER_HOUR})"}
            ],
            "calculations": [
                {"op": "SUM", "column": "gpu_hours_badput"},
                {"op": "AVG", "column": names.FLEET_GOODPUT.name},
            ],
            "filters": [{"column": names.FLEET_BADPUT.name, "op": "exists"}],
            "breakdowns": [cause],
            "time_range": HONEYCOMB_TIME_RANGE_S,
            "granularity": 3600,
        },
        "hung-jobs": {
            "calculations": [{"op": "MAX", "column": names.JOB_HANG.name}],
            "filters": [{"column": names.JOB_HANG.name, "op": "=", "value": 1}],
            "breakdowns": [job, names.JOB_NAME],
            "time_range": 3600,
        },
    }


def _honeycomb_loss_queries() -> dict[str, JSON]:
    """Where OFU is lost and what it costs. Sums are per-window deltas, so SUM over time adds windows."""
    cause, job = names.OFU_LOSS_CAUSE, names.JOB_ID
    return {
        "job-ofu-loss-by-cause": {
            "calculations": [{"op": "AVG", "column": names.JOB_OFU_LOSS.name}],
            "filters": [{"column": names.JOB_OFU_LOSS.name, "op": "exists"}],
            "breakdowns": [job, cause],
            "time_range": HONEYCOMB_TIME_RANGE_S,
            "granularity": 300,
        },
        "job-tensor-pipe-causes": {
            "calculations": [{"op": "AVG", "column": names.JOB_OFU_LOSS.name}],
            "filters": [{"column": cause, "op": "in", "value": list(names.OfuLossCause.TENSOR_PARTS)}],
            "breakdowns": [job, cause],
            "time_range": HONEYCOMB_TIME_RANGE_S,
            "granularity": 300,
        },
        "job-dram-and-links": {
            "calculations": [
                {"op": "AVG", "column": names.JOB_DRAM_ACTIVE.name},
                {"op": "AVG", "column": names.JOB_NVLINK_THROUGHPUT.name},
                {"op": "AVG", "column": names.JOB_PCIE_THROUGHPUT.name},
            ],
            "filters": [
                {"column": names.JOB_DRAM_ACTIVE.name, "op": "exists"},
                {"column": names.JOB_NVLINK_THROUGHPUT.name, "op": "exists"},
                {"column": names.JOB_PCIE_THROUGHPUT.name, "op": "exists"},
            ],
            "filter_combination": "OR",
            "breakdowns": [job],
            "time_range": HONEYCOMB_TIME_RANGE_S,
            "granularity": 300,
        },
        "fleet-gpu-hours-lost-by-cause": {
            "calculated_fields": [
                {"name": "gpu_hours_lost", "expression": f"DIV(${names.FLEET_GPU_TIME_LOST.name}, {SECONDS_PER_HOUR})"}
            ],
            "calculations": [{"op": "SUM", "column": "gpu_hours_lost"}],
            "filters": [{"column": names.FLEET_GPU_TIME_LOST.name, "op": "exists"}],
            "breakdowns": [cause],
            "time_range": HONEYCOMB_TIME_RANGE_S,
            "granularity": 3600,
        },
        "fleet-cost-lost-by-cause": {
            "calculations": [{"op": "SUM", "column": names.FLEET_COST_LOST.name}],
            "filters": [{"column": names.FLEET_COST_LOST.name, "op": "exists"}],
            "breakdowns": [cause],
            "time_range": HONEYCOMB_TIME_RANGE_S,
            "granularity": 3600,
        },
        "jobs-by-cost-lost": {
            "calculations": [
                {"op": "SUM", "column": names.JOB_COST_LOST.name},
                {"op": "SUM", "column": names.JOB_GPU_TIME_LOST.name},
            ],
            "filters": [{"column": names.JOB_GPU_TIME_LOST.name, "op": "exists"}],
            "breakdowns": [job, cause],
            "orders": [{"op": "SUM", "column": names.JOB_COST_LOST.name, "order": "descending"}],
            "limit": 50,
            "time_range": HONEYCOMB_TIME_RANGE_S,
        },
        "fleet-energy": {
            "calculated_fields": [
                {"name": "energy_kwh", "expression": f"DIV(${names.FLEET_ENERGY.name}, {JOULES_PER_KWH})"}
            ],
            "calculations": [{"op": "SUM", "column": "energy_kwh"}],
            "filters": [{"column": names.FLEET_ENERGY.name, "op": "exists"}],
            "time_range": HONEYCOMB_TIME_RANGE_S,
            "granularity": 3600,
        },
        "job-flops-per-joule": {
            "calculations": [
                {"op": "AVG", "column": names.JOB_FLOPS_PER_JOULE.name},
                {"op": "SUM", "column": names.JOB_EMISSIONS.name},
            ],
            "filters": [{"column": names.JOB_FLOPS_PER_JOULE.name, "op": "exists"}],
            "breakdowns": [job, names.HW_MODEL],
            "time_range": HONEYCOMB_TIME_RANGE_S,
        },
        "straggler-gpus": {
            "calculations": [{"op": "MAX", "column": names.GPU_STRAGGLER.name}],
            "filters": [{"column": names.GPU_STRAGGLER.name, "op": "=", "value": 1}],
            "breakdowns": [names.HOST_NAME, names.HW_ID, job, names.GPU_THROTTLE_REASON],
            "time_range": 3600,
        },
        "idle-gpus-per-job": {
            "calculations": [{"op": "MAX", "column": names.JOB_GPUS_IDLE.name}],
            "filters": [{"column": names.JOB_GPUS_IDLE.name, "op": ">", "value": 0}],
            "breakdowns": [job, names.JOB_NAME],
            "time_range": 3600,
        },
    }


def honeycomb_board() -> JSON:
    return {
        "name": "otel-ofu: fleet FLOP utilization",
        "description": "Generated by examples/dashboards/generate.py from otel_ofu.names.",
        "type": "flexible",
        "panels": [
            {"type": "query", "query_panel": {"query_ref": name, "query_style": "graph"}}
            for name in honeycomb_queries()
        ],
    }


# --- Grafana (Prometheus path) -----------------------------------------------------------------------


def prometheus_name(metric: str) -> str:
    """The collector's Prometheus exposition name for a metric: by name alone, dots become underscores."""
    return metric_name(metric)


# Template variables: (variable, label it filters, the query listing its values). A job output carries job_id
# (and hw_model, gpu_precision where known); a GPU-level output carries host_name too. "All" is ".*", which
# also matches series without the label, so an unset variable hides nothing.
GRAFANA_VARIABLES = (
    ("job", names.JOB_ID, f"label_values({metric_name(names.JOB_OFU.name)}, {label_name(names.JOB_ID)})"),
    ("model", names.HW_MODEL, f"label_values({metric_name(names.FLEET_GPUS.name)}, {label_name(names.HW_MODEL)})"),
    (
        "precision",
        names.GPU_PRECISION,
        f"label_values({metric_name(names.FLEET_GPUS.name)}, {label_name(names.GPU_PRECISION)})",
    ),
    ("host", names.HOST_NAME, f"label_values({label_name(names.HOST_NAME)})"),
)
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def _grafana_selector(*keys: str, extra: str = "") -> str:
    """A label selector filtering ``keys`` by their template variables (plus ``extra`` matchers)."""
    by_key = {key: variable for variable, key, _ in GRAFANA_VARIABLES}
    matchers = [f'{label_name(key)}=~"${by_key[key]}"' for key in keys] + ([extra] if extra else [])
    return "{" + ",".join(matchers) + "}"


def _grafana_variable(variable: str, key: str, query: str) -> JSON:
    return {
        "name": variable,
        "label": key,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": {"query": query, "refId": f"{variable}-values"},
        "refresh": 2,  # on time range change: jobs come and go
        "includeAll": True,
        "allValue": ".*",
        "multi": True,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
    }


# Grafana units (its unit ids; "suffix:" adds a custom one). OFU and its shares are fractions: percentunit.
OFU_UNIT = "percentunit"
COUNT_UNIT = "none"
GPUS_UNIT = "suffix: GPUs"
GPU_HOURS_UNIT = "suffix: GPU-h"
# The collector's cost outputs are in its --currency (USD unless told): change these for another currency.
COST_UNIT = "currencyUSD"
COST_PER_HOUR_UNIT = "suffix: USD/h"
ENERGY_UNIT = "kwatth"
FLOPS_PER_JOULE_UNIT = "suffix: GFLOP/J"
BYTES_PER_S_UNIT = "Bps"  # bytes per second
# Tables show each series' latest value once (an instant query), not a range of samples per series.
TABLE_KINDS = frozenset({"table"})
REFRESH = "1m"  # the collector's default window


def _override(ref_id: str, unit: str, *, right_axis: bool = False) -> JSON:
    """A unit for one query's series (and the right-hand axis, for a second quantity in one panel)."""
    properties: list[JSON] = [{"id": "unit", "value": unit}]
    if right_axis:
        properties.append({"id": "custom.axisPlacement", "value": "right"})
    return {"matcher": {"id": "byFrameRefID", "options": ref_id}, "properties": properties}


def _grafana_panel(
    panel_id: int,
    title: str,
    exprs: list[tuple[str, str]],
    *,
    unit: str,
    kind: str = "timeseries",
    overrides: list[JSON] | None = None,
) -> JSON:
    instant = kind in TABLE_KINDS
    panel: JSON = {
        "id": panel_id,
        "type": kind,
        "title": title,
        "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": 12, "x": 12 * ((panel_id - 1) % 2), "y": 8 * ((panel_id - 1) // 2)},
        "targets": [
            {
                "refId": chr(ord("A") + index),
                "expr": expr,
                "legendFormat": legend,
                **({"instant": True, "range": False, "format": "table"} if instant else {}),
            }
            for index, (expr, legend) in enumerate(exprs)
        ],
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": overrides or []},
    }
    return panel


def grafana_dashboard() -> JSON:
    model, precision, job, cause, host, hw_id, reason = (
        label_name(key)
        for key in (
            names.HW_MODEL,
            names.GPU_PRECISION,
            names.JOB_ID,
            names.OFU_LOSS_CAUSE,
            names.HOST_NAME,
            names.HW_ID,
            names.GPU_THROTTLE_REASON,
        )
    )
    group = _grafana_selector(names.HW_MODEL, names.GPU_PRECISION)
    per_job = _grafana_selector(names.JOB_ID, names.HW_MODEL, names.GPU_PRECISION)
    # A GPU flag's series carry the GPU's identity (host, GPU id) and its job, not the model or precision:
    # filtering on those would empty the panel whenever a model is chosen.
    per_gpu = _grafana_selector(names.JOB_ID, names.HOST_NAME)
    tensor_parts = f'{cause}=~"{"|".join(names.OfuLossCause.TENSOR_PARTS)}"'
    goodput_cause = label_name(names.GOODPUT_CAUSE)

    def series(spec: names.MetricSpec, selector: str = per_job) -> str:
        return f"{prometheus_name(spec.name)}{selector}"

    def at_quantile(q: str) -> str:
        matcher = f'{names.PROMETHEUS_QUANTILE_LABEL}="{q}"'
        return prometheus_name(names.FLEET_OFU_QUANTILE.name) + _grafana_selector(
            names.HW_MODEL, names.GPU_PRECISION, extra=matcher
        )

    # The collector shows each window's sums as gauges holding that window's value. Cost lost per hour needs
    # no window length: cost lost / GPU-seconds x GPUs is cost per second.
    cost_per_hour = (
        f"sum by ({job}) ({series(names.JOB_COST_LOST)}) / sum by ({job}) ({series(names.JOB_GPU_TIME)})"
        f" * sum by ({job}) ({series(names.JOB_GPUS)}) * {SECONDS_PER_HOUR}"
    )
    panels = [
        _grafana_panel(
            1,
            "Fleet OFU percentiles",
            [(f"avg({at_quantile(str(q))})", f"p{int(q * 100)}") for q in (0.05, 0.5, 0.95)],
            unit=OFU_UNIT,
        ),
        _grafana_panel(
            2,
            "Median OFU by model and precision",
            [(at_quantile("0.5"), f"{{{{{model}}}}} {{{{{precision}}}}}")],
            unit=OFU_UNIT,
        ),
        _grafana_panel(
            3,
            "Per job: OFU vs reported MFU",
            [
                (series(names.JOB_OFU), f"OFU {{{{{job}}}}}"),
                (f"{series(names.JOB_OFU)} + on({job}) {series(names.JOB_OFU_MFU_GAP)}", f"MFU {{{{{job}}}}}"),
            ],
            unit=OFU_UNIT,
        ),
        _grafana_panel(
            4,
            "Flagged jobs",
            [
                (f"{series(names.JOB_FLOPS_MISCOUNT)} == 1", f"miscount {{{{{job}}}}}"),
                (f"{series(names.JOB_OFU_REGRESSION)} == 1", f"regression {{{{{job}}}}}"),
            ],
            kind="table",
            unit=COUNT_UNIT,  # the flag's value: 1 while up
        ),
        _grafana_panel(
            5,
            "Fleet OFU-MFU correlation and MAE",
            [
                (prometheus_name(names.FLEET_OFU_MFU_CORRELATION.name), "Pearson r"),
                (prometheus_name(names.FLEET_OFU_MFU_MAE.name), "MAE"),
            ],
            kind="stat",
            unit=COUNT_UNIT,  # r is a plain number in [-1, 1]; the MAE is a difference of OFUs
            overrides=[_override("B", OFU_UNIT)],
        ),
        _grafana_panel(
            6, "GPUs reporting", [(f"sum({series(names.FLEET_GPUS, group)})", "GPUs")], kind="stat", unit=GPUS_UNIT
        ),
        # Where OFU is lost, and what it costs.
        _grafana_panel(
            7,
            "Per job: OFU lost by cause",
            [(series(names.JOB_OFU_LOSS), f"{{{{{job}}}}} {{{{{cause}}}}}")],
            unit=OFU_UNIT,
        ),
        _grafana_panel(
            8,
            "GPUs' worth lost by cause (loss x GPUs)",
            [
                (
                    f"sum by ({cause}) ({series(names.JOB_OFU_LOSS)} * on({job}) group_left() "
                    f"sum by ({job}) ({series(names.JOB_GPUS)}))",
                    f"{{{{{cause}}}}}",
                )
            ],
            unit=GPUS_UNIT,
        ),
        _grafana_panel(
            9,
            "Fleet GPU-hours lost per window, by cause",
            [
                (
                    f"sum by ({cause}) ({prometheus_name(names.FLEET_GPU_TIME_LOST.name)}) / {SECONDS_PER_HOUR}",
                    f"{{{{{cause}}}}}",
                )
            ],
            unit=GPU_HOURS_UNIT,
        ),
        _grafana_panel(
            10,
            "Fleet cost lost per window, by cause",
            [(f"sum by ({cause}) ({prometheus_name(names.FLEET_COST_LOST.name)})", f"{{{{{cause}}}}}")],
            unit=COST_UNIT,
        ),
        _grafana_panel(11, "Per job: cost lost per hour", [(cost_per_hour, f"{{{{{job}}}}}")], unit=COST_PER_HOUR_UNIT),
        # Two quantities, two axes: the fleet's kWh on the left, each job's GFLOP/J on the right.
        _grafana_panel(
            12,
            "Energy per window (kWh) and FLOPs per joule",
            [
                (f"sum({prometheus_name(names.FLEET_ENERGY.name)}) / {JOULES_PER_KWH}", "fleet kWh"),
                (f"{series(names.JOB_FLOPS_PER_JOULE)} / {FLOPS_PER_GFLOP}", f"GFLOP/J {{{{{job}}}}}"),
            ],
            unit=ENERGY_UNIT,
            overrides=[_override("B", FLOPS_PER_JOULE_UNIT, right_axis=True)],
        ),
        _grafana_panel(
            13,
            "Straggler GPUs",
            [
                (
                    f"{series(names.GPU_STRAGGLER, per_gpu)} == 1",
                    f"{{{{{host}}}}} {{{{{hw_id}}}}} {{{{{job}}}}} {{{{{reason}}}}}",
                )
            ],
            kind="table",
            unit=COUNT_UNIT,  # the flag's value: 1 while up
        ),
        _grafana_panel(
            14,
            "Idle GPUs per job (allocated, no tensor activity)",
            [(f"{series(names.JOB_GPUS_IDLE)} > 0", f"{{{{{job}}}}}")],
            kind="table",
            unit=GPUS_UNIT,
        ),
        # The tensor pipes' loss split by what the engine and SMs did, beside what tells its causes apart.
        _grafana_panel(
            15,
            "Per job: where the tensor pipes' time went (no kernel, SMs empty, SMs off the tensor pipes)",
            [
                (
                    prometheus_name(names.JOB_OFU_LOSS.name)
                    + _grafana_selector(names.JOB_ID, names.HW_MODEL, names.GPU_PRECISION, extra=tensor_parts),
                    f"{{{{{job}}}}} {{{{{cause}}}}}",
                )
            ],
            unit=OFU_UNIT,
        ),
        _grafana_panel(
            16,
            "Per job: DRAM activity, NVLink and PCIe bytes/s per GPU",
            [
                (series(names.JOB_DRAM_ACTIVE), f"DRAM {{{{{job}}}}}"),
                (series(names.JOB_NVLINK_THROUGHPUT), f"NVLink {{{{{job}}}}}"),
                (series(names.JOB_PCIE_THROUGHPUT), f"PCIe {{{{{job}}}}}"),
            ],
            unit=OFU_UNIT,  # DRAM activity is a fraction of cycles; the links' bytes/s on the right axis
            overrides=[
                _override("B", BYTES_PER_S_UNIT, right_axis=True),
                _override("C", BYTES_PER_S_UNIT, right_axis=True),
            ],
        ),
        # Where the allocated GPU time went.
        _grafana_panel(
            17,
            "Per job: goodput (productive / allocated GPU time, so far) and its FLOP view",
            [
                (series(names.JOB_GOODPUT), f"goodput {{{{{job}}}}}"),
                (series(names.JOB_GOODPUT_FLOPS), f"FLOPs {{{{{job}}}}}"),
            ],
            unit=OFU_UNIT,
        ),
        _grafana_panel(
            18,
            "Fleet GPU-hours without progress per window, by cause",
            [
                (
                    f"sum by ({goodput_cause}) ({prometheus_name(names.FLEET_BADPUT.name)}) / {SECONDS_PER_HOUR}",
                    f"{{{{{goodput_cause}}}}}",
                )
            ],
            unit=GPU_HOURS_UNIT,
        ),
        _grafana_panel(
            19,
            "Fleet goodput over the horizon",
            [(prometheus_name(names.FLEET_GOODPUT.name), "goodput")],
            kind="stat",
            unit=OFU_UNIT,
        ),
        _grafana_panel(
            20,
            "Hung jobs (every GPU running kernels with nothing moving)",
            [(f"{series(names.JOB_HANG)} == 1", f"{{{{{job}}}}}")],
            kind="table",
            unit=COUNT_UNIT,  # the flag's value: 1 while up
        ),
    ]
    return {
        "title": "otel-ofu: fleet FLOP utilization",
        "uid": "otel-ofu-fleet",
        "schemaVersion": 39,
        "tags": ["gpu", "ofu", "opentelemetry"],
        "time": {"from": "now-6h", "to": "now"},
        "refresh": REFRESH,
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
                *(_grafana_variable(variable, key, query) for variable, key, query in GRAFANA_VARIABLES),
            ]
        },
        "panels": panels,
    }


def generated() -> dict[str, JSON]:
    """File name -> content of every generated dashboard file."""
    return {
        "datadog.json": datadog_dashboard(),
        "honeycomb-queries.json": honeycomb_queries(),
        "honeycomb-board.json": honeycomb_board(),
        "grafana.json": grafana_dashboard(),
    }


def render(content: JSON) -> str:
    return json.dumps(content, indent=2, sort_keys=False) + "\n"


# The Helm chart's copy (its Grafana sidecar ConfigMap): a chart reads only the files inside it.
CHART_COPY = "../deploy/helm/otel-ofu/files/grafana.json"


def main(argv: list[str] | None = None) -> int:
    files = {name: render(content) for name, content in generated().items()}
    return write_or_check(HERE, {**files, CHART_COPY: files["grafana.json"]}, argv, __doc__ or "")


if __name__ == "__main__":
    sys.exit(main())
