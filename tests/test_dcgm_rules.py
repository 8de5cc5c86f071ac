"""``otel-ofu prometheus-rules``: recording rules computing per-GPU OFU from dcgm-exporter's series, and alerts on
them, checked with the real promtool (``check rules``, and ``test rules`` over the series of dcgm-exporter pages in
tests/data).

Hand-worked (the catalog's H100 SXM tensor clock 1830 MHz and board max 1980 MHz; the A30's 1440 MHz both):

- tests/data/dcgm_exporter_h100_node_written.prom: GPU 0 at 0.5 and 1755 MHz: OFU 0.5 x 1755 / 1830 = 0.4795...,
  raw 0.5 x 1755 / 1980 = 0.4431...; GPU 1 at 0.25 and 1980 MHz: OFU 0.25 (the tensor-clock ratio capped at 1), raw
  0.25; GPU 2 without tensor activity: none, and the alert that says so.
- the real A30 MIG page of dcgm-exporter issue 68 (a 2g.12gb instance at tensor activity 0.022137, no clock), with its
  GPU's SM clock line added at 1440 MHz: the instance takes its GPU's clock, OFU 0.022137 x 1440 / 1440 = 0.022137.

And for every page, the rules give OFU to the GPUs the producer gives it to, with the producer's values.
"""

from __future__ import annotations

import io
import re
import subprocess
from collections.abc import Iterable, Mapping
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from otel_ofu import cli, dcgm_rules, names
from otel_ofu.gpu_samples import compute_snapshot
from otel_ofu.sources.dcgm_exporter import UUID_LABELS, ExporterPages, entries_of
from otel_ofu.sources.prometheus_text import parse_samples

DATA = Path(__file__).parent / "data"
NODE = "dcgm_exporter_h100_node_written.prom"
A30 = "dcgm_exporter_a30_mig_issue68.prom"
# The A30's own SM clock line, as dcgm-exporter prints a MIG GPU's device fields (on the GPU, not its instances).
A30_CLOCK = (
    'DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-603a8873-0edd-c157-ce48-2078e8b1a935",device="nvidia0",'
    'modelName="NVIDIA A30",Hostname="dcgm-exporter-sn5rp",container="",namespace="",pod=""} 1440\n'
)
PAGES = (
    NODE,
    "dcgm_exporter_h100_generation_3x.prom",
    "dcgm_exporter_h100_generation_49.prom",
    "dcgm_exporter_h100_generation_410.prom",
    A30,
    "dcgm_exporter_titanv_issue58.prom",
    "dcgm_exporter_h100_digitalocean_docs.prom",
    "dcgm_exporter_h100_mig_k8s_issue512.prom",
)
TENSOR_NAMES = {
    name for name, field in names.DCGM_EXPORTER_FIELDS.items() if field == names.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE
}
MINUTES = 80  # every series holds its value this long, a sample a minute
EVAL = "20m"  # past the alerts' 15 m


def rules_text() -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli.main(["prometheus-rules"]) == 0
    return out.getvalue()


def page_series(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(metric, labels, value) of every sample of a page, as Prometheus stores a scrape of it (empty labels dropped)."""
    found = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = family.name if family.type == "counter" else sample.name
            found.append((name, {k: v for k, v in sample.labels.items() if v}, float(sample.value)))
    return found


def notation(name: str, labels: Mapping[str, str]) -> str:
    return name + "{" + ",".join(f'{key}="{value}"' for key, value in sorted(labels.items())) + "}"


def input_series(text: str) -> list[dict[str, str]]:
    return [
        {"series": notation(name, labels), "values": f"{value!r}x{MINUTES}"}
        for name, labels, value in page_series(text)
    ]


def recorded_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """A tensor-activity series' labels as the recorded OFU carries them: its own plus the contract's identity."""
    out = dict(labels)
    out[dcgm_rules.HW_ID] = next(labels[key] for key in UUID_LABELS if labels.get(key))
    out[dcgm_rules.HW_MODEL] = labels["modelName"]
    host = labels.get("hostname") or labels.get("Hostname")
    if host:
        out[dcgm_rules.HOST_NAME] = host
    return out


def tensor_series(text: str) -> dict[tuple[str, str | None], dict[str, str]]:
    """(UUID, MIG instance id) -> the labels of the GPU's tensor-activity series."""
    return {
        (next(labels[key] for key in UUID_LABELS if labels.get(key)), labels.get("GPU_I_ID")): labels
        for name, labels, _ in page_series(text)
        if name in TENSOR_NAMES
    }


def producers_values(text: str) -> dict[tuple[str, str | None], tuple[float, float | None]]:
    """What the producer computes from the page: (UUID, MIG instance id) -> (gpu.ofu, gpu.ofu.raw)."""
    snapshot = ExporterPages().snapshot(entries_of(parse_samples(text)), 1_000_000_000_000)
    computed = compute_snapshot(snapshot)
    return {
        (sample.gpu.uuid, None if sample.gpu.mig_instance_id is None else str(sample.gpu.mig_instance_id)): (
            sample.values.ofu,
            sample.values.ofu_raw,
        )
        for sample in computed.samples
    }


def samples_case(expr: str, expected: Iterable[tuple[Mapping[str, str], float]]) -> dict[str, Any]:
    return {
        "expr": expr,
        "eval_time": EVAL,
        "exp_samples": [{"labels": notation(expr, labels), "value": value} for labels, value in expected],
    }


def expand(template: str, labels: Mapping[str, str], value: str = "") -> str:
    """An annotation as Prometheus expands it: the labels, and the value as ``humanizePercentage`` prints it."""
    text = template.replace("{{ $value | humanizePercentage }}", value)
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), text)


def alert_case(alert: str, firing: Iterable[Mapping[str, str]], value: str = "", at: str = EVAL) -> dict[str, Any]:
    (rule,) = [rule for rule in dcgm_rules.alert_rules() if rule["alert"] == alert]
    return {
        "alertname": alert,
        "eval_time": at,
        "exp_alerts": [
            {
                "exp_labels": {**labels, **rule["labels"]},
                "exp_annotations": {key: expand(text, labels, value) for key, text in rule["annotations"].items()},
            }
            for labels in firing
        ],
    }


def promtool_test(promtool: str, tmp_path: Path, tests: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "rules.yaml").write_text(rules_text())
    (tmp_path / "rules.test.yaml").write_text(
        yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}, sort_keys=False)
    )
    return subprocess.run(
        [promtool, "test", "rules", "rules.test.yaml"], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )


def test_promtool_check_rules_accepts_them(promtool: str, tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(rules_text())
    result = subprocess.run([promtool, "check", "rules", "rules.yaml"], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    count = len(dcgm_rules.recording_rules()) + len(dcgm_rules.alert_rules())
    assert f"SUCCESS: {count} rules found" in result.stdout


def test_hand_worked_ofu_of_the_node_page_and_the_mig_instance(promtool: str, tmp_path: Path) -> None:
    node = (DATA / NODE).read_text()
    a30 = (DATA / A30).read_text() + A30_CLOCK
    node_gpus = tensor_series(node)
    gpu0 = recorded_labels(node_gpus[("GPU-927d7444-b45a-7c49-8402-5e686e46a026", None)])
    gpu1 = recorded_labels(node_gpus[("GPU-3f1c2a9e-5d47-4b6e-9a0c-7e2b8d1f6a53", None)])
    (instance,) = [recorded_labels(labels) for labels in tensor_series(a30).values()]
    tests = [
        {
            "interval": "1m",
            "input_series": input_series(node),
            "promql_expr_test": [
                # TPA x (f / f_ref), in that order: promtool compares the values exactly.
                samples_case(dcgm_rules.OFU, [(gpu0, 0.5 * (1755 / 1830)), (gpu1, 0.25)]),
                samples_case(dcgm_rules.OFU_RAW, [(gpu0, 0.5 * (1755 / 1980)), (gpu1, 0.25)]),
            ],
            "alert_rule_test": [
                alert_case(
                    "OfuDcgmNoTensorActivity",
                    [
                        {
                            "hw_id": "GPU-b83e0f27-9c1d-4a5b-8e6f-0d2c4a7b9e18",
                            "hw_model": "NVIDIA H100 80GB HBM3",
                            "host_name": "6d6d7dc3ce21",
                        }
                    ],
                ),
                alert_case("OfuDcgmNoOfu", []),
                alert_case("OfuDcgmGpuIdle", []),
            ],
        },
        {
            "interval": "1m",
            "input_series": input_series(a30),
            "promql_expr_test": [samples_case(dcgm_rules.OFU, [(instance, 0.022137)])],
        },
    ]
    result = promtool_test(promtool, tmp_path, tests)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("page", PAGES)
def test_the_rules_give_the_producers_ofu_on_every_page(page: str, promtool: str, tmp_path: Path) -> None:
    text = (DATA / page).read_text() + (A30_CLOCK if page == A30 else "")
    produced = producers_values(text)
    gpus = tensor_series(text)
    assert set(produced) <= set(gpus)
    ofu = [(recorded_labels(gpus[key]), values[0]) for key, values in produced.items()]
    raw = [(recorded_labels(gpus[key]), values[1]) for key, values in produced.items() if values[1] is not None]
    # Tensor activity without OFU: the producer's GPUs without it, which the alert names.
    without = [recorded_labels(labels) for key, labels in gpus.items() if key not in produced]
    tests = [
        {
            "interval": "1m",
            "input_series": input_series(text),
            "promql_expr_test": [samples_case(dcgm_rules.OFU, ofu), samples_case(dcgm_rules.OFU_RAW, raw)],
            "alert_rule_test": [alert_case("OfuDcgmNoOfu", without)],
        }
    ]
    result = promtool_test(promtool, tmp_path, tests)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_alerts_fire_on_an_idle_allocated_gpu_and_a_clock_above_its_own_max(promtool: str, tmp_path: Path) -> None:
    node = (DATA / NODE).read_text()
    # GPU 0 (held by pod llm-train/pretrain-7b-worker-0) idle: tensor activity 0 all along.
    idle = node.replace('pod="pretrain-7b-worker-0"} 0.5\n', 'pod="pretrain-7b-worker-0"} 0\n')
    gpu0 = recorded_labels(tensor_series(idle)[("GPU-927d7444-b45a-7c49-8402-5e686e46a026", None)])
    # The 4.9 page's GPU at 2100 MHz against its own max of 1980 MHz: a stale or wrong max, no OFU (as the producer).
    page_49 = (DATA / "dcgm_exporter_h100_generation_49.prom").read_text()
    above = page_49.replace("} 1755000000\n", "} 2100000000\n")
    (gpu,) = [recorded_labels(labels) for labels in tensor_series(above).values()]
    assert producers_values(above) == {}
    tests = [
        {
            "interval": "1m",
            "input_series": input_series(idle),
            "promql_expr_test": [
                samples_case(
                    dcgm_rules.OFU,
                    [
                        (gpu0, 0.0),
                        (
                            recorded_labels(tensor_series(idle)[("GPU-3f1c2a9e-5d47-4b6e-9a0c-7e2b8d1f6a53", None)]),
                            0.25,
                        ),
                    ],
                ),
            ],
            "alert_rule_test": [
                alert_case("OfuDcgmGpuIdle", []),  # not yet: 30 min
                alert_case("OfuDcgmGpuIdle", [gpu0], at="35m"),
                # The idle GPU holds the median of the model's two GPUs down, (0 + 0.25) / 2 = 12.5%, for an hour.
                alert_case("OfuDcgmFleetLow", [], at="55m"),
                alert_case("OfuDcgmFleetLow", [{"hw_model": "NVIDIA H100 80GB HBM3"}], value="12.5%", at="65m"),
            ],
        },
        {
            "interval": "1m",
            "input_series": input_series(above),
            "promql_expr_test": [samples_case(dcgm_rules.OFU, []), samples_case(dcgm_rules.OFU_RAW, [])],
            "alert_rule_test": [alert_case("OfuDcgmNoOfu", [gpu])],
        },
    ]
    result = promtool_test(promtool, tmp_path, tests)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_wrong_expectation_fails(promtool: str, tmp_path: Path) -> None:
    """The promtool tests can fail: GPU 0's OFU is not its tensor activity."""
    node = (DATA / NODE).read_text()
    gpu0 = recorded_labels(tensor_series(node)[("GPU-927d7444-b45a-7c49-8402-5e686e46a026", None)])
    tests = [{"interval": "1m", "input_series": input_series(node),
              "promql_expr_test": [samples_case(dcgm_rules.OFU, [(gpu0, 0.5)])]}]  # fmt: skip
    result = promtool_test(promtool, tmp_path, tests)
    assert result.returncode != 0


def test_the_printed_file_is_the_rules_as_yaml_reads_them() -> None:
    """The command writes its YAML itself (the runtime has no YAML library): a YAML parser reads back the rules."""
    assert yaml.safe_load(rules_text()) == dcgm_rules.rule_groups()
