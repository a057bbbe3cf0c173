"""sless Python runtime shim: serves one function over the sless instance protocol.

The platform starts this file inside the sandbox (see docs/instance-protocol.md). It imports the
entrypoint, listens with HTTP/1.1 on the Unix socket ``SLESS_SOCKET``, writes ``ready\\n`` to
``SLESS_READY_FD`` and then calls the handler once per ``POST /_sless/invoke``.

Standard library only, Python 3.9+. HTTP is a small hand-written HTTP/1.1 parser rather than
``http.server``: the only client is the platform's connection pool, so the server needs
keep-alive, Content-Length bodies and in-order responses, and nothing else. Two servers share it,
chosen by the kind of handler, because each is the fast one for its kind:

- ``async def`` handlers: an ``asyncio.Protocol`` server; handlers run on its event loop.
- plain functions: one thread per connection, the handler called in that thread, at most
  ``SLESS_CONCURRENCY`` at once. Handing each request from an event loop to a worker pool and
  back costs about five context switches under the GIL; this design needs about one and spends
  half the CPU per request (figures in runtimes/README.md).

``python3 sless_runtime.py --check`` only loads the entrypoint; the builder uses it to validate a
build. ``SLESS_CODE_DIR`` and ``SLESS_DEPS_DIR`` override ``/code`` and ``/deps`` so the shim can
run outside the sandbox (tests, local runs).
"""

import asyncio
import importlib
import inspect
import json
import os
import selectors
import signal
import site
import socket
import stat
import sys
import threading
import time
import traceback

# Exit status for an entrypoint that cannot be loaded; the platform reports it as a load error
# rather than a crash.
EXIT_LOAD_ERROR = 3

DEFAULT_ENTRYPOINT = "handler.handle"

# How long in-flight requests may run after SIGTERM before the process exits anyway.
SHUTDOWN_GRACE_S = 10.0

# A request head larger than this is refused; the platform's heads are a few hundred bytes.
MAX_HEAD_BYTES = 64 * 1024

# While a request is in flight on a connection, stop reading from it once this much of the next
# request is buffered, so a pipelining client cannot make the instance buffer without bound.
MAX_BUFFERED_WHILE_BUSY = 256 * 1024

# How much the threaded server asks for per recv().
RECV_SIZE = 256 * 1024

_REASONS = {
    100: b"Continue",
    200: b"OK",
    400: b"Bad Request",
    404: b"Not Found",
    405: b"Method Not Allowed",
    411: b"Length Required",
    431: b"Request Header Fields Too Large",
    500: b"Internal Server Error",
    505: b"HTTP Version Not Supported",
}


def log(message):
    """Writes one line to stderr, the function's log, in a single write so threads don't interleave."""
    sys.stderr.write("sless: %s\n" % message)


# --------------------------------------------------------------------------------------------
# Loading the entrypoint
# --------------------------------------------------------------------------------------------


class LoadError(Exception):
    """The entrypoint cannot be loaded; ``str()`` is the one-line reason the protocol asks for."""


class Entrypoint:
    """The loaded handler and how to call it, decided once at load time."""

    __slots__ = ("func", "is_async", "arity", "module", "name")

    def __init__(self, func, module, name):
        self.func = func
        self.module = module
        self.name = name
        self.is_async = _is_coroutine_callable(func)
        self.arity = _positional_arity(func)


def setup_sys_path(code_dir, deps_dir):
    """Puts the code dir first and the dependency tree second on ``sys.path``.

    The shim's own directory is removed: it is the platform's, and a user module must not be
    shadowed by (or shadow) anything that happens to live next to the shim.
    """
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if p and os.path.abspath(p) != here]
    sys.path.insert(0, code_dir)
    if deps_dir and os.path.isdir(deps_dir):
        sys.path.insert(1, deps_dir)
        # A `pip --target` tree may carry .pth files (namespace packages and the like); addsitedir
        # processes them without appending the directory a second time.
        site.addsitedir(deps_dir)


def _module_file_hint(module_name):
    return module_name.replace(".", "/") + ".py"


def load_entrypoint(spec, code_dir):
    """Imports ``module.function`` and returns an :class:`Entrypoint`, or raises :class:`LoadError`.

    An exception raised while the module imports is printed with its traceback before the
    LoadError is raised, so the log shows where it came from.
    """
    module_name, _, func_name = spec.rpartition(".")
    if not module_name or not func_name:
        raise LoadError('invalid entrypoint "%s" (expected module.function)' % spec)

    top = module_name.partition(".")[0]
    if top in sys.modules and (
        os.path.exists(os.path.join(code_dir, top + ".py"))
        or os.path.isdir(os.path.join(code_dir, top))
    ):
        # The shim imported a module of that name (json, asyncio, ...) before the code dir was on
        # sys.path, so importing would silently return the standard library one.
        raise LoadError(
            'entrypoint module "%s" has the name of a standard library module; rename it' % top
        )

    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing == module_name or module_name.startswith(missing + "."):
            raise LoadError(
                'entrypoint module "%s" not found (no %s)'
                % (module_name, _module_file_hint(module_name))
            ) from None
        traceback.print_exc()
        raise LoadError(
            'entrypoint module "%s" failed to import: %s' % (module_name, _describe(exc))
        ) from None
    except BaseException as exc:  # noqa: BLE001 - SystemExit at import time is a load error too
        traceback.print_exc()
        raise LoadError(
            'entrypoint module "%s" failed to import: %s' % (module_name, _describe(exc))
        ) from None

    func = getattr(module, func_name, None)
    if func is None:
        raise LoadError(
            'entrypoint function "%s" not found in module "%s"' % (func_name, module_name)
        )
    if not callable(func):
        raise LoadError(
            'entrypoint "%s" is not callable (it is a %s)' % (spec, type(func).__name__)
        )
    return Entrypoint(func, module_name, func_name)


def _describe(exc):
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not hide the original error
        text = ""
    name = type(exc).__name__
    return "%s: %s" % (name, text) if text else name


def _is_coroutine_callable(func):
    if inspect.iscoroutinefunction(func):
        return True
    call = getattr(func, "__call__", None)
    return call is not None and inspect.iscoroutinefunction(call)


def _positional_arity(func):
    """How many arguments to pass: 0, 1 (event) or 2 (event, context).

    A handler gets the context only when it can take a second positional argument; one that takes
    none (a cron job that ignores its event) is called with nothing.
    """
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return 1
    count = 0
    for param in sig.parameters.values():
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            return 2
        if param.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            count += 1
    return min(count, 2)


# --------------------------------------------------------------------------------------------
# Invocation
# --------------------------------------------------------------------------------------------


class Context:
    """The handler's second argument: who is calling and until when."""

    __slots__ = ("request_id", "source", "function_name", "namespace", "revision", "deadline_ms")

    def __init__(self, request_id, source, function_name, namespace, revision, deadline_ms):
        self.request_id = request_id
        self.source = source
        self.function_name = function_name
        self.namespace = namespace
        self.revision = revision
        self.deadline_ms = deadline_ms

    def remaining_ms(self):
        """Milliseconds left until the deadline (never negative), or None when there is none."""
        if self.deadline_ms is None:
            return None
        return max(0, self.deadline_ms - int(time.time() * 1000))

    def __repr__(self):
        return "Context(request_id=%r, source=%r, function_name=%r, namespace=%r, revision=%r, deadline_ms=%r)" % (
            self.request_id,
            self.source,
            self.function_name,
            self.namespace,
            self.revision,
            self.deadline_ms,
        )


class _Unserializable(TypeError):
    pass


def _json_default(value):
    if isinstance(value, (bytes, bytearray, memoryview)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            pass
    raise _Unserializable(type(value).__name__)


def encode_result(result):
    """Returns ``(status, body)`` for a handler's return value."""
    try:
        body = json.dumps(
            result, default=_json_default, allow_nan=False, separators=(",", ":")
        ).encode("utf-8")
    except _Unserializable as exc:
        return 500, error_body("result is not JSON serializable: %s" % exc)
    except (TypeError, ValueError, RecursionError) as exc:
        return 500, error_body("result is not JSON serializable: %s" % exc)
    return 200, body


def error_body(message):
    return json.dumps({"error": message}).encode("utf-8")


def exception_message(exc):
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not turn into a second failure
        text = ""
    return text or type(exc).__name__


def _log_handler_failure(request_id):
    sys.stderr.write(
        "sless: request %s: handler raised\n%s" % (request_id or "-", traceback.format_exc())
    )


class Invoker:
    """Calls the handler for one request and turns the outcome into ``(status, body)``."""

    def __init__(self, entry, identity, loop=None):
        self.entry = entry
        self.function_name, self.namespace, self.revision = identity
        # The event loop coroutines run on: the server's (async handlers), or one started on
        # first use for a plain function that returns a coroutine.
        self.loop = loop
        self._loop_lock = threading.Lock()

    def context(self, headers):
        deadline = headers.get("x-sless-deadline-ms")
        deadline_ms = None
        if deadline:
            try:
                deadline_ms = int(deadline)
            except ValueError:
                deadline_ms = None
        return Context(
            headers.get("x-sless-request-id", ""),
            headers.get("x-sless-source", ""),
            self.function_name,
            self.namespace,
            self.revision,
            deadline_ms,
        )

    def _args(self, event, headers):
        arity = self.entry.arity
        if arity == 1:
            return (event,)
        if arity == 2:
            return (event, self.context(headers))
        return ()

    def call_sync(self, event, headers):
        """Calls a plain function in the calling (connection) thread and serializes the result."""
        try:
            result = self.entry.func(*self._args(event, headers))
            if inspect.isawaitable(result):
                # A plain function that returns a coroutine: run it on the loop, wait here.
                loop = self._coroutine_loop()
                result = asyncio.run_coroutine_threadsafe(_await(result), loop).result()
        except BaseException as exc:  # noqa: BLE001 - SystemExit in a handler must not end the thread
            _log_handler_failure(headers.get("x-sless-request-id"))
            return 500, error_body(exception_message(exc))
        return self._encode(result, headers)

    async def call_async(self, event, headers):
        try:
            result = await self.entry.func(*self._args(event, headers))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - see call_sync
            _log_handler_failure(headers.get("x-sless-request-id"))
            return 500, error_body(exception_message(exc))
        return self._encode(result, headers)

    def _coroutine_loop(self):
        with self._loop_lock:
            if self.loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="sless-asyncio", daemon=True).start()
                self.loop = loop
            return self.loop

    @staticmethod
    def _encode(result, headers):
        status, body = encode_result(result)
        if status != 200:
            log("request %s: %s" % (headers.get("x-sless-request-id") or "-", body.decode("utf-8")))
        return status, body


async def _await(awaitable):
    return await awaitable


# --------------------------------------------------------------------------------------------
# HTTP/1.1
# --------------------------------------------------------------------------------------------


class HttpError(Exception):
    """A request the server refuses; the connection is answered and closed."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


class Request:
    __slots__ = ("method", "path", "headers", "body", "keep_alive")

    def __init__(self, method, path, headers, body, keep_alive):
        self.method = method
        self.path = path
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive


def build_response(status, body, content_type=b"application/json", close=False):
    """Returns the whole response, head and body, as one byte string (one write, one syscall)."""
    return b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n%s" % (
        status,
        _REASONS.get(status, b"Unknown"),
        content_type,
        len(body),
        b"Connection: close\r\n" if close else b"",
        body,
    )


CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def parse_head(head):
    """Parses a request head (without the blank line) into ``(method, path, headers, keep_alive)``.

    Header names are lowercased; a repeated header keeps its last value, except Content-Length,
    whose copies must agree.
    """
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3:
        raise HttpError(400, "malformed request line")
    method, target, version = parts
    if version == b"HTTP/1.1":
        keep_alive = True
    elif version == b"HTTP/1.0":
        keep_alive = False
    elif version.startswith(b"HTTP/"):
        raise HttpError(505, "unsupported HTTP version")
    else:
        raise HttpError(400, "malformed request line")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise HttpError(400, "malformed header line")
        key = name.decode("latin-1").lower()
        val = value.strip().decode("latin-1")
        if key == "content-length" and key in headers and headers[key] != val:
            raise HttpError(400, "conflicting Content-Length headers")
        headers[key] = val
    connection = headers.get("connection")
    if connection is not None:
        tokens = connection.lower()
        if "close" in tokens:
            keep_alive = False
        elif "keep-alive" in tokens:
            keep_alive = True
    path = target.split(b"?", 1)[0].decode("latin-1")
    return method.decode("latin-1"), path, headers, keep_alive


def content_length(headers):
    if "transfer-encoding" in headers:
        raise HttpError(411, "chunked request bodies are not supported; send Content-Length")
    raw = headers.get("content-length")
    if raw is None:
        return 0
    if not raw.isdigit():
        raise HttpError(400, "invalid Content-Length")
    return int(raw)


class RequestReader:
    """Cuts requests out of a connection's byte stream; both servers feed it.

    ``next_request()`` returns the next complete request or None when more bytes are needed.
    ``want_continue`` is set once when a client that sent ``Expect: 100-continue`` is waiting for
    permission to send its body; the server writes :data:`CONTINUE` and clears it.
    """

    __slots__ = ("buf", "head", "scan_from", "want_continue")

    def __init__(self):
        self.buf = bytearray()
        self.head = None  # (method, path, headers, keep_alive, length) once parsed
        self.scan_from = 0
        self.want_continue = False

    def idle(self):
        """True between requests: nothing of a next request has arrived."""
        return self.head is None and not self.buf

    def next_request(self):
        buf = self.buf
        if self.head is None:
            # Tolerate empty lines between requests (RFC 9112 section 2.2).
            while buf[:2] == b"\r\n":
                del buf[:2]
            end = buf.find(b"\r\n\r\n", self.scan_from)
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    raise HttpError(431, "request head too large")
                self.scan_from = max(0, len(buf) - 3)
                return None
            if end > MAX_HEAD_BYTES:
                raise HttpError(431, "request head too large")
            method, path, headers, keep_alive = parse_head(bytes(buf[:end]))
            length = content_length(headers)
            del buf[: end + 4]
            self.scan_from = 0
            self.head = (method, path, headers, keep_alive, length)
            if len(buf) < length and headers.get("expect", "").lower() == "100-continue":
                self.want_continue = True
        method, path, headers, keep_alive, length = self.head
        if len(buf) < length:
            return None
        if length:
            body = bytes(buf[:length])
            del buf[:length]
        else:
            body = b""
        self.head = None
        return Request(method, path, headers, body, keep_alive)


def route(request):
    """Answers everything but an invocation: returns ``(status, body, content_type)``, or None
    for a ``POST /_sless/invoke`` whose event decoded (then stored as ``request.body``)."""
    if request.path == "/_sless/invoke":
        if request.method != "POST":
            return 405, error_body("use POST"), b"application/json"
        if request.body:
            try:
                request.body = json.loads(request.body)
            except ValueError as exc:
                return 400, error_body("invalid JSON event: %s" % exc), b"application/json"
        else:
            request.body = None
        return None
    if request.path == "/_sless/ready":
        if request.method != "GET":
            return 405, error_body("use GET"), b"application/json"
        return 200, b"ok", b"text/plain"
    return 404, error_body("not found: %s" % request.path), b"application/json"


# --------------------------------------------------------------------------------------------
# Threaded server (plain-function handlers)
# --------------------------------------------------------------------------------------------


class ThreadedServer:
    """Serves each connection in its own thread and calls the handler right there.

    The platform opens about as many connections as it sends requests at once, so a thread per
    connection is a thread per concurrent request; ``slots`` still bounds handler runs to
    ``SLESS_CONCURRENCY`` in case it holds extra idle connections. Requests on one connection are
    answered in order, one at a time.
    """

    def __init__(self, invoker, concurrency):
        self.invoker = invoker
        self.slots = threading.BoundedSemaphore(max(1, concurrency))
        self.lock = threading.Lock()
        self.drained = threading.Condition(self.lock)
        self.connections = {}  # socket -> RequestReader, for shutdown
        self.busy = set()  # sockets with a request in flight
        self.stopping = False
        self.stop_requested = False

    def serve(self, listener, ready_fd):
        """Accepts connections until SIGTERM/SIGINT; returns True when in-flight work drained."""
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        previous = signal.set_wakeup_fd(wake_w)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        listener.setblocking(False)
        selector = selectors.DefaultSelector()
        selector.register(listener, selectors.EVENT_READ)
        selector.register(wake_r, selectors.EVENT_READ)
        if ready_fd is not None:
            signal_ready(ready_fd)
        try:
            while not self.stop_requested:
                for key, _ in selector.select():
                    if key.fileobj is listener:
                        self._accept(listener)
                    else:
                        try:
                            os.read(wake_r, 512)
                        except BlockingIOError:
                            pass
        finally:
            selector.close()
            signal.set_wakeup_fd(previous)
            os.close(wake_r)
            os.close(wake_w)
        listener.close()
        return self._shutdown()

    def _on_signal(self, signum, frame):
        self.stop_requested = True

    def _accept(self, listener):
        while True:
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                # Out of file descriptors and the like: keep serving the connections there are.
                log("accept: %s" % exc)
                return
            sock.setblocking(True)
            reader = RequestReader()
            with self.lock:
                self.connections[sock] = reader
            threading.Thread(
                target=self._serve_connection, args=(sock, reader), name="sless-conn", daemon=True
            ).start()

    def _shutdown(self):
        """Closes idle connections now and waits (bounded) for in-flight requests."""
        with self.lock:
            self.stopping = True
            for sock, reader in self.connections.items():
                if sock not in self.busy and reader.idle():
                    _shutdown_socket(sock)
            return self.drained.wait_for(lambda: not self.busy, SHUTDOWN_GRACE_S)

    def _serve_connection(self, sock, reader):
        try:
            while self._serve_one(sock, reader):
                pass
        except HttpError as exc:
            try:
                sock.sendall(build_response(exc.status, error_body(str(exc)), close=True))
            except OSError:
                pass
        except OSError:
            pass  # The client went away; nobody to answer.
        finally:
            with self.lock:
                self.connections.pop(sock, None)
                self.busy.discard(sock)
                self.drained.notify_all()
            sock.close()

    def _serve_one(self, sock, reader):
        """Reads, answers one request; returns whether the connection stays open."""
        request = reader.next_request()
        while request is None:
            if reader.want_continue:
                reader.want_continue = False
                sock.sendall(CONTINUE)
            data = sock.recv(RECV_SIZE)
            if not data:
                return False
            reader.buf += data
            request = reader.next_request()

        with self.lock:
            self.busy.add(sock)
        try:
            answer = route(request)
            if answer is None:
                with self.slots:
                    status, body = self.invoker.call_sync(request.body, request.headers)
                content_type = b"application/json"
            else:
                status, body, content_type = answer
            close = not request.keep_alive or self.stopping
            sock.sendall(build_response(status, body, content_type, close))
        finally:
            with self.lock:
                self.busy.discard(sock)
                if self.stopping:
                    self.drained.notify_all()
        return not close


def _shutdown_socket(sock):
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


# --------------------------------------------------------------------------------------------
# asyncio server (async def handlers)
# --------------------------------------------------------------------------------------------


class AsyncServer:
    """Shared state of the asyncio connections: the invoker and shutdown bookkeeping."""

    def __init__(self, invoker, loop):
        self.invoker = invoker
        self.loop = loop
        self.connections = set()
        self.inflight = 0
        self.stopping = False
        self.stop_requested = loop.create_future()
        self.drained = loop.create_future()

    def request_done(self):
        self.inflight -= 1
        self._check_drained()

    def _check_drained(self):
        if self.stopping and self.inflight == 0 and not self.drained.done():
            self.drained.set_result(None)

    def begin_shutdown(self):
        if self.stopping:
            return
        self.stopping = True
        self.stop_requested.set_result(None)
        for conn in list(self.connections):
            conn.shutdown()
        self._check_drained()

    async def serve(self, listener, ready_fd):
        """Serves until SIGTERM/SIGINT; returns True when in-flight work drained."""
        loop = self.loop
        server = await loop.create_unix_server(lambda: Connection(self), sock=listener, backlog=1024)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.begin_shutdown)
        if ready_fd is not None:
            signal_ready(ready_fd)
        await self.stop_requested
        server.close()
        try:
            await asyncio.wait_for(asyncio.shield(self.drained), SHUTDOWN_GRACE_S)
            graceful = True
        except asyncio.TimeoutError:
            graceful = False
        for conn in list(self.connections):
            conn.transport.close()
        return graceful


class Connection(asyncio.Protocol):
    """One client connection of the asyncio server: parses requests and answers them in order.

    Requests on one connection are handled one at a time (the platform's pool sends one request
    per connection at once; a pipelining client simply waits), which keeps responses in order
    without a reordering buffer. Concurrency comes from many connections.
    """

    def __init__(self, server):
        self.server = server
        self.transport = None
        self.reader = RequestReader()
        self.busy = False
        self.reading_paused = False
        self.writing_paused = False
        self.closed = False
        self.close_after_response = False

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport):
        self.transport = transport
        self.server.connections.add(self)
        if self.server.stopping:
            self.closed = True
            transport.close()

    def connection_lost(self, exc):
        self.closed = True
        self.server.connections.discard(self)

    def data_received(self, data):
        self.reader.buf += data
        if self.busy:
            if len(self.reader.buf) > MAX_BUFFERED_WHILE_BUSY and not self.reading_paused:
                self.reading_paused = True
                self.transport.pause_reading()
            return
        self.process()

    def eof_received(self):
        # A half-closed client gets its in-flight answer; the connection closes afterwards.
        if self.busy:
            self.close_after_response = True
            return True
        return False

    def pause_writing(self):
        self.writing_paused = True

    def resume_writing(self):
        self.writing_paused = False
        if not self.busy:
            self.process()

    # -- requests ------------------------------------------------------------------------------

    def process(self):
        """Parses and dispatches buffered requests until one is in flight or data runs out."""
        reader = self.reader
        while not self.busy and not self.closed and not self.writing_paused:
            try:
                request = reader.next_request()
            except HttpError as exc:
                self.busy = True  # nothing more is read from this connection
                self.transport.write(build_response(exc.status, error_body(str(exc)), close=True))
                self.closed = True
                self.transport.close()
                return
            if request is None:
                if reader.want_continue:
                    reader.want_continue = False
                    self.transport.write(CONTINUE)
                break
            answer = route(request)
            if answer is None:
                self.invoke(request)
            else:
                self.respond(request, *answer)
        if self.reading_paused and not self.busy and not self.closed:
            self.reading_paused = False
            self.transport.resume_reading()

    def invoke(self, request):
        server = self.server
        server.inflight += 1
        self.busy = True
        task = server.loop.create_task(server.invoker.call_async(request.body, request.headers))
        task.add_done_callback(lambda t: self._finish(request, t))

    def _finish(self, request, task):
        if task.cancelled():
            status, body = 500, error_body("handler cancelled")
        else:
            try:
                status, body = task.result()
            except BaseException as exc:  # noqa: BLE001 - only if call_async itself broke
                status, body = 500, error_body(exception_message(exc))
        self.server.request_done()
        self.busy = False
        self.respond(request, status, body, b"application/json")
        if not self.closed and self.reader.buf:
            self.process()

    def respond(self, request, status, body, content_type):
        if self.closed:
            return
        close = not request.keep_alive or self.close_after_response or self.server.stopping
        self.transport.write(build_response(status, body, content_type, close))
        if close:
            self.closed = True
            self.transport.close()
        elif self.reading_paused and not self.busy:
            self.reading_paused = False
            self.transport.resume_reading()

    def shutdown(self):
        """Called on SIGTERM: idle connections close now, busy ones after their response."""
        if self.busy:
            self.close_after_response = True
        elif self.reader.idle():
            self.closed = True
            self.transport.close()
        # A partly received request is left to complete; its response closes the connection.


# --------------------------------------------------------------------------------------------
# Startup
# --------------------------------------------------------------------------------------------


def configure_streams():
    """Makes stdout/stderr line-buffered so log lines reach the platform immediately."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True, errors="backslashreplace")
        except (AttributeError, ValueError):
            pass


def env_int(name, default):
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise LoadError("%s must be an integer, got %r" % (name, raw)) from None


def signal_ready(fd):
    """Writes ``ready\\n`` to the platform's readiness fd and closes it."""
    try:
        os.write(fd, b"ready\n")
    finally:
        os.close(fd)


def listen_unix(path):
    """Binds the Unix socket, replacing a stale socket file but never another kind of file."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None:
        if not stat.S_ISSOCK(mode):
            raise OSError("SLESS_SOCKET %s exists and is not a socket" % path)
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return sock


def serve(entry, socket_path, ready_fd, concurrency, identity):
    """Listens and serves until SIGTERM; returns True when in-flight requests drained in time."""
    listener = listen_unix(socket_path)
    try:
        if entry.is_async:

            async def run():
                loop = asyncio.get_running_loop()
                server = AsyncServer(Invoker(entry, identity, loop), loop)
                return await server.serve(listener, ready_fd)

            graceful = asyncio.run(run())
        else:
            graceful = ThreadedServer(Invoker(entry, identity), concurrency).serve(listener, ready_fd)
    finally:
        listener.close()
        try:
            os.unlink(socket_path)
        except OSError:
            pass
    if not graceful:
        log("shutdown: requests still running after %.0fs; exiting" % SHUTDOWN_GRACE_S)
    return graceful


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    check = "--check" in argv
    configure_streams()
    env = os.environ
    code_dir = env.get("SLESS_CODE_DIR") or "/code"
    deps_dir = env.get("SLESS_DEPS_DIR") or "/deps"
    spec = env.get("SLESS_ENTRYPOINT") or DEFAULT_ENTRYPOINT
    try:
        concurrency = env_int("SLESS_CONCURRENCY", 1)
        ready_fd = env_int("SLESS_READY_FD", None)
        setup_sys_path(code_dir, deps_dir)
        entry = load_entrypoint(spec, code_dir)
    except LoadError as exc:
        log(str(exc))
        return EXIT_LOAD_ERROR
    if check:
        return 0

    socket_path = env.get("SLESS_SOCKET")
    if not socket_path:
        log("SLESS_SOCKET is not set")
        return 2
    identity = (env.get("SLESS_FUNCTION", ""), env.get("SLESS_NAMESPACE", ""), env.get("SLESS_REVISION", ""))
    try:
        graceful = serve(entry, socket_path, ready_fd, concurrency, identity)
    except OSError as exc:
        log("cannot serve on %s: %s" % (socket_path, exc))
        return 2
    if not graceful:
        # Handler threads that are still running must not hold up (or crash) interpreter exit.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
