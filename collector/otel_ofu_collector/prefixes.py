"""The environment-variable prefixes of the collector's commands (``otel_ofu.cli_support.CommandOptions``).

Each command reads ``<PREFIX><FLAG>`` for its options: a node that also runs a producer must not have the
producer's settings (``OTEL_OFU_*``) read as the collector's, so every collector command has a prefix of
its own.
"""

from __future__ import annotations

from typing import Final

COLLECTOR_PREFIX: Final = "OTEL_OFU_COLLECTOR_"
DEMO_PREFIX: Final = "OTEL_OFU_DEMO_"
REPORT_PREFIX: Final = "OTEL_OFU_REPORT_"
TOP_PREFIX: Final = "OTEL_OFU_TOP_"
