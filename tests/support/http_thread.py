"""A ThreadingHTTPServer served from a daemon thread: the loopback servers of the test doubles."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def start(host: str, port: int, handler: type[BaseHTTPRequestHandler],
          name: str) -> tuple[ThreadingHTTPServer, threading.Thread]:
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True, name=name)
    thread.start()
    return server, thread


def stop(server: ThreadingHTTPServer | None, thread: threading.Thread | None) -> None:
    """Shut the server down (connections are refused afterwards) and join its thread."""
    if server is not None:
        server.shutdown()
        server.server_close()
    if thread is not None:
        thread.join(timeout=5)
