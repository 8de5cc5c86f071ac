"""``otel-ofu demo``: the simulated fleet through a real producer and a real collector in one process
(``loopback.py``: OTLP over loopback between them), and its report (``command.py``)."""
