"""Baseline for sless-bench: the instance protocol's invoke route served by the standard
library's ``http.server.ThreadingHTTPServer`` (a thread per connection), over a Unix socket.

It reads the same environment as the shim (``SLESS_SOCKET``, ``SLESS_READY_FD``,
``SLESS_ENTRYPOINT``, ``SLESS_CODE_DIR``), imports the same handler, and answers
``POST /_sless/invoke`` with the handler's result as JSON, so the bench compares the two
servers and nothing else.
"""

import http.server
import importlib
import json
import os
import signal
import socket
import socketserver
import sys


class UnixThreadingHTTPServer(http.server.ThreadingHTTPServer):
    """ThreadingHTTPServer on a Unix socket instead of TCP."""

    address_family = socket.AF_UNIX
    daemon_threads = True
    # socketserver's default listen backlog of 5 refuses (EAGAIN) some of the bench's
    # simultaneous connects; the comparison is about serving requests, not about that default.
    request_queue_size = 128

    def server_bind(self):
        # HTTPServer.server_bind resolves a host name from a TCP address; a socket path has none.
        socketserver.TCPServer.server_bind(self)
        self.server_name = "localhost"
        self.server_port = 0


def load_handler():
    code_dir = os.environ.get("SLESS_CODE_DIR") or "/code"
    module_name, _, function_name = (os.environ.get("SLESS_ENTRYPOINT") or "handler.handle").rpartition(".")
    sys.path.insert(0, code_dir)
    return getattr(importlib.import_module(module_name), function_name)


HANDLE = load_handler()


class InvokeHandler(http.server.BaseHTTPRequestHandler):
    # HTTP/1.1 keeps connections alive, as the platform and the bench's load generator expect.
    protocol_version = "HTTP/1.1"

    def _reply(self, status, body):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/_sless/ready":
            self._reply(200, b"ok")
        else:
            self._reply(404, b'{"error": "not found"}')

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path != "/_sless/invoke":
            self._reply(404, b'{"error": "not found"}')
            return
        try:
            result = HANDLE(json.loads(raw) if raw else None)
            self._reply(200, json.dumps(result).encode())
        except Exception as exc:  # the baseline answers errors like the shim: 500 with a message
            self._reply(500, json.dumps({"error": str(exc)}).encode())

    def log_message(self, format, *args):
        # A request log line per request would measure stderr, not the server.
        pass


def main():
    path = os.environ["SLESS_SOCKET"]
    if os.path.exists(path):
        os.unlink(path)
    server = UnixThreadingHTTPServer(path, InvokeHandler)

    def stop(signum, frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    ready_fd = os.environ.get("SLESS_READY_FD")
    if ready_fd:
        os.write(int(ready_fd), b"ready\n")
        os.close(int(ready_fd))
    try:
        server.serve_forever()
    finally:
        server.server_close()
        if os.path.exists(path):
            os.unlink(path)


if __name__ == "__main__":
    main()
