"""What every receiver shares: the ``Ingest`` call it hands requests to, and the lifecycle the service drives.

``CollectorService`` builds its receivers, then starts each in turn and stops each in turn, knowing no more of
them than ``Receiver`` says; a receiver knows no more of the collector than ``Ingest``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final, Protocol, TypeAlias

if TYPE_CHECKING:  # a name for the type checker only: what imports this (the report feed) loads no codec
    from otel_ofu_collector.otlp.decode import DecodeOutcome

# One ExportMetricsServiceRequest's bytes as received (what the write-ahead keeps; parsed only where needed): what the
# collector did with it. ``otlp.rejections.MalformedRequest`` when the bytes are not one, with nothing taken.
Ingest: TypeAlias = "Callable[[bytes], DecodeOutcome]"

# The listen backlog of every listener the collector opens, as gRPC's: a burst of new connections waits to be
# accepted instead of being reset (socketserver's default is 5). The kernel caps it at net.core.somaxconn.
LISTEN_BACKLOG: Final = 4096
# A request at most this large, uncompressed, may be decoded and ingested on a receiver's event loop thread when
# nothing is in its way (the windows' lock free), skipping the hop to a worker thread and back, which costs more
# than a node's request: 8 GPUs are about 10 KB, a rack's through an agent a few hundred.
INLINE_BYTES: Final = 256 * 1024


class Receiver(Protocol):
    """A listener the service starts and stops (``start`` once, ``stop`` once, in that order)."""

    @property
    def kind(self) -> str:
        """Its short name: in the collector's ready line and as its key in ``CollectorService.ports``."""
        ...

    @property
    def listen(self) -> str:
        """The ``HOST:PORT`` it was asked to listen on (port 0: any free one)."""
        ...

    @property
    def port(self) -> int:
        """The bound port, once started."""
        ...

    def start(self) -> int:
        """Bind and serve; the bound port. OSError, one line naming the address, when it cannot be had."""
        ...

    def stop(self) -> None:
        """Stop serving and free the port; requests in progress are cut short (the service drains the gate
        before it stops its receivers)."""
        ...
