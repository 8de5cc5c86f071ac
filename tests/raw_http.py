"""A raw HTTP server on loopback for tests that need a peer no HTTP library would be: each connection is handed to
``serve`` on a thread of its own, which writes whatever bytes it likes (a page, a drip, a body that never ends)."""

from __future__ import annotations

import socket
import threading

import attrs


@attrs.define
class RawHttpServer:
    listener: socket.socket = attrs.field(factory=lambda: socket.create_server(("127.0.0.1", 0)), kw_only=True)
    stop: threading.Event = attrs.field(factory=threading.Event, kw_only=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}/metrics"

    def start(self) -> None:
        threading.Thread(target=self._accept, daemon=True).start()

    def serve(self, connection: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.stop.set()
        self.listener.close()

    def _accept(self) -> None:
        self.listener.settimeout(0.2)
        while not self.stop.is_set():
            try:
                connection, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self.serve, args=(connection,), daemon=True).start()
