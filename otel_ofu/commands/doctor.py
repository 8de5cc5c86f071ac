"""``otel-ofu doctor``: the first thing to run against a source. For each GPU, which outputs it will have (OFU, raw OFU,
the finer loss split, energy, throttle, links, its job) and, for each one missing, why and the exact line to add.

Exit status: 0 when at least one GPU gives OFU, 1 when none does (a page that is not the exporter's included), 2 when
the source cannot open: ``otel-ofu doctor ... || fix-it`` works in a script.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from otel_ofu import doctor, names
from otel_ofu.cli_support import DOCTOR_PREFIX, CommandOptions, non_negative_float
from otel_ofu.commands.snapshot import read_from_args
from otel_ofu.model import GpuError, Source
from otel_ofu.sources.factory import add_source_options

FORMATS = ("text", "json")
DESCRIPTION = """\
Read a source once and say, for each GPU, which outputs it will have (OFU, raw OFU, the finer loss split, energy,
throttle, links, job attribution) and, for each one missing, why and the exact line that gives it: a line of
dcgm-exporter's counters file, a field of the AMD Device Metrics Exporter's config, a DCGM field, a dcgmi dmon -e
list, or an otel-ofu option such as --max-sm-clock.

Exit status: 0 when at least one GPU gives OFU, 1 when none does, 2 when the source could not open."""


def facts_of(kind: str, source: Source) -> doctor.SourceFacts:
    """What the doctor needs of the source beside its snapshot (dmon's -e list, the AMD activity basis)."""
    fields = getattr(source, "field_ids", None)
    basis = getattr(source, "activity_basis", None)
    return doctor.SourceFacts(
        kind=kind,
        dmon_fields=tuple(fields) if fields is not None else None,
        activity_basis=dict(basis) if basis is not None else {},
    )


def _where(diagnosis: doctor.GpuDiagnosis) -> str:
    gpu = diagnosis.gpu
    instance = f", MIG instance {gpu.mig_instance_id} ({gpu.mig_profile})" if gpu.mig_instance_id is not None else ""
    return f"GPU {gpu.index} of {gpu.host}{instance}: {gpu.model}, {gpu.uuid}"


def print_text(diagnoses: Sequence[doctor.GpuDiagnosis], errors: Sequence[GpuError]) -> None:
    out = sys.stdout
    for error in errors:
        out.write(f"source: {error.message}\n")
    width = max(len(label) for label in doctor.LABELS.values())
    for diagnosis in diagnoses:
        out.write(_where(diagnosis) + "\n")
        for finding in diagnosis.findings:
            state = "yes" if finding.present else "no "
            value = f"{finding.value:.3f} " if finding.value is not None else ""
            text = f"{value}{finding.note}" if finding.present else finding.why
            out.write(f"  {doctor.LABELS[finding.output]:<{width}}  {state}  {text}\n")
            for line in finding.fix.splitlines():
                out.write(f"  {'':<{width}}       {line}\n")
    out.write(doctor.summary(diagnoses) + "\n")


def run(args: argparse.Namespace) -> int:
    kind: str = args.source
    read = read_from_args(args, "doctor", lambda source: facts_of(kind, source))
    if read is None:
        return 2
    snapshot, facts = read
    diagnoses, errors = doctor.diagnose(snapshot, facts)
    if args.format == "json":
        for failure in errors:
            sys.stdout.write(json.dumps({"error": failure.message, names.ERROR_REASON: failure.reason}) + "\n")
        for diagnosis in diagnoses:
            sys.stdout.write(json.dumps(diagnosis.as_json(), allow_nan=False) + "\n")
    else:
        print_text(diagnoses, errors)
    sys.stdout.flush()
    return 0 if any(diagnosis.gives_ofu for diagnosis in diagnoses) else 1


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="say which outputs each GPU of a source will have, and what to add for the others",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_source_options(CommandOptions(parser))
    ours = CommandOptions(parser, DOCTOR_PREFIX)
    ours.option(
        "--interval",
        metavar="SECONDS",
        default=1.0,
        type=non_negative_float,
        help="seconds between the two reads of rate sources",
    )
    ours.option("--format", default="text", choices=FORMATS, help="output format")
    parser.set_defaults(handler=run)
