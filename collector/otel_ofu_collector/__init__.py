"""The otel-ofu collector: OTLP in, fleet OFU per window, OFU-vs-MFU per job, flags, outputs.

The folders follow the data, one stage each (receivers import the decoder, outputs the encoder; all rest
on ``results.py`` and the statistics in ``stats/``); every module is named here::

    receivers/      OTLP in: otlp_grpc.py, otlp_http.py (on http_framing.py: HTTP/1.1), base.py (Ingest,
        |           the Receiver lifecycle), admission.py (in-flight gate, body budget, shutdown), auth.py
        |
    otlp/           the codec: decode.py (requests -> points), encode.py (windows -> OTLP), partials.py (a
        |           shard's partial window state, both ways), sink.py (PointSink, what the decoder feeds); the
        |           decoder's parts: roles.py (what each metric is for), resources.py (a Resource's identity,
        |           cached), points.py (a Resource read point by point), templates.py and shapes.py (a
        |           producer's layout read without parsing), rejections.py (why points were refused),
        |           dcgm_series.py (dcgm-exporter scrapes in front of the decoder: their GPUs as a producer sends them)
    aggregation/    windows.py (which window a point goes to and when it closes), cells.py (a window's cells
        |           and GPU inputs), streams.py (the GPUs known, admission, bounds), counters.py (counters'
        |           deltas), coverage.py (each GPU-second once), jobs.py (jobs' state, correlation),
        |           closing.py (a closed window's report), merge.py (the merge tier), loss.py (where OFU is lost),
        |           goodput.py (where a job's GPU time went), checkpoints.py (a job's progress marks)
    detectors/      one module per flag behind base.py's protocols: flops_miscount.py, regression.py,
        |           idle_gpus.py, hang.py (job flags), straggler.py (a GPU flag)
    outputs/        window consumers (consumer.py: WindowConsumer, the one interface of every output):
        |           otlp_export.py (+ delivery.py, queues.py, split.py; otel_ofu.otlp_client
        |           sends), prometheus.py, recorder.py (records file), feed_server.py (live feed),
        |           self_telemetry.py (the self-metrics: the SelfMetrics protocol, sent downstream),
        |           flag_events.py (each flag's rise and fall as an OTLP log record);
        |           record_codec.py and feed_client.py read them back
    report/         summary.py (windows condensed), reasons.py (flags in words), causes.py (a job's bottleneck),
        |           goodput.py (goodput per job and fleet), flag_words.py (the flag events' sentences),
        |           ranking.py (the order of jobs), html_page.py (+ plots.py), terminal.py, command.py (``report``)
    top/            ``otel-ofu top``: model.py, cells.py, feeds.py, app.py, command.py

    stats/          exphist.py, quantiles.py, comoments.py: the mergeable statistics (pure, below all else)
    options/        every option of ``otel-ofu collector`` declared once: option.py, declared.py, file.py
                    (``--config FILE``); option_bounds.py  Bound, a number's range, checked one way
    storage/        on disk: write_ahead.py (the open windows' accepted requests beside the spool, replayed
        |           after a kill), sqlite_files.py (what the spool and the write-ahead share: a damaged file
        |           moved aside, a WAL checked), spool_lock.py (one collector per --spool)
    demo/           ``otel-ofu demo``: command.py, loopback.py (a producer and a collector in one process over
                    OTLP on loopback)
    results.py      what a closed window holds (WindowReport, JobReport, ...): every stage passes these
    lifecycle.py    parts started in order and shut down in reverse, one failure costing no other
    config.py       AggregatorConfig;  prefixes.py  the commands' environment-variable prefixes
    service.py      CollectorService: receivers -> decoder -> windows -> consumers, and its lifecycle
    command.py      ``otel-ofu collector``

The names below are the public surface; they load on first use, so importing one stage does not pull in
the others (the CLI's start-up stays light).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from otel_ofu_collector.aggregation.merge import MergeAggregator
    from otel_ofu_collector.aggregation.windows import Aggregator
    from otel_ofu_collector.config import AggregatorConfig
    from otel_ofu_collector.detectors import DETECTORS, Detector, JobFlag, JobWindowValues
    from otel_ofu_collector.outputs.consumer import CallbackConsumer, WindowConsumer
    from otel_ofu_collector.results import FleetReport, GroupReport, JobReport, WindowReport
    from otel_ofu_collector.service import CollectorOptions, CollectorService

_HOMES = {
    "Aggregator": "otel_ofu_collector.aggregation.windows",
    "AggregatorConfig": "otel_ofu_collector.config",
    "CallbackConsumer": "otel_ofu_collector.outputs.consumer",
    "CollectorOptions": "otel_ofu_collector.service",
    "CollectorService": "otel_ofu_collector.service",
    "DETECTORS": "otel_ofu_collector.detectors",
    "Detector": "otel_ofu_collector.detectors",
    "FleetReport": "otel_ofu_collector.results",
    "GroupReport": "otel_ofu_collector.results",
    "JobFlag": "otel_ofu_collector.detectors",
    "JobReport": "otel_ofu_collector.results",
    "JobWindowValues": "otel_ofu_collector.detectors",
    "MergeAggregator": "otel_ofu_collector.aggregation.merge",
    "WindowConsumer": "otel_ofu_collector.outputs.consumer",
    "WindowReport": "otel_ofu_collector.results",
}

__all__ = [
    "DETECTORS",
    "Aggregator",
    "AggregatorConfig",
    "CallbackConsumer",
    "CollectorOptions",
    "CollectorService",
    "Detector",
    "FleetReport",
    "GroupReport",
    "JobFlag",
    "JobReport",
    "JobWindowValues",
    "MergeAggregator",
    "WindowConsumer",
    "WindowReport",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
