"""sless Python runtime shim: serves one function over the sless instance protocol.

The platform starts this file inside the sandbox (see docs/instance-protocol.md). It imports the
entrypoint, listens with HTTP/1.1 on the Unix socket ``SLESS_SOCKET``, writes ``ready\\n`` to
``SLESS_READY_FD`` and then calls the handler once per ``POST /_sless/invoke``.

Standard library only, Python 3.9+. HTTP is a small hand-written HTTP/1.1 parser rather than
``http.server``: the only client is the platform's connection pool, so the server needs
keep-alive, Content-Length bodies and in-order responses, and nothing else. One epoll loop
serves both kinds of handler (see :class:`Server`):

- plain functions run on the loop's own thread, which saves the thread handoffs that dominate
  the cost of a request in CPython; when a call blocks for more than a millisecond the main
  thread hands the loop to a new thread, so blocking handlers still run concurrently, at most
  ``SLESS_CONCURRENCY`` at once.
- ``async def`` handlers run as tasks on an asyncio loop started on the loop's thread once the
  handler is known; the epoll descriptor becomes one of its readers.

Started without ``SLESS_ENTRYPOINT`` the shim is a generic instance: it serves, and imports the
function only when ``POST /_sless/load`` names it (docs/instance-protocol.md).

``python3 sless_runtime.py --check`` only loads the entrypoint; the builder uses it to validate a
build. ``SLESS_CODE_DIR`` and ``SLESS_DEPS_DIR`` override ``/code`` and ``/deps`` so the shim can
run outside the sandbox (tests, local runs).
"""

import asyncio
import collections
import contextvars
import importlib
import inspect
import json
import os
import select
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

# Exit status when the serving loop itself failed (not a handler: those are answered with 500).
# An instance that cannot serve must not look alive, so the shim exits and the platform starts
# a replacement.
EXIT_SERVE_ERROR = 4

# Largest result body; the platform refuses larger responses, so the shim answers an error
# that says why instead.
MAX_RESULT_BYTES = 256 * 1024 * 1024

# A line a handler writes without a newline is passed on in pieces of this size, so an endless
# line costs neither the instance nor the platform unbounded memory.
MAX_LINE_CHARS = 8 * 1024

DEFAULT_ENTRYPOINT = "handler.handle"

# How long in-flight requests may run after SIGTERM before the process exits anyway.
SHUTDOWN_GRACE_S = 10.0

# A request head larger than this is refused; the platform's heads are a few hundred bytes.
MAX_HEAD_BYTES = 64 * 1024

# While a request is in flight on a connection, stop reading from it once this much of the next
# request is buffered, so a pipelining client cannot make the instance buffer without bound.
MAX_BUFFERED_WHILE_BUSY = 256 * 1024

# How much the server asks for per recv(). CPython allocates the whole size before the call and
# shrinks it after; at 128 KiB and above glibc serves that allocation with mmap, which made every
# recv of a small request cost ~18 µs more than it does at this size.
RECV_SIZE = 64 * 1024

# A plain function (or a blocking write) that keeps the loop's thread longer than this gets the
# loop handed to another thread, so other requests do not wait behind it.
PROMOTE_AFTER_S = 0.001

JSON_TYPE = b"application/json"

# The id of the request whose handler is running in this thread or task; None outside requests.
_request_id = contextvars.ContextVar("sless_request_id", default=None)

_REASONS = {
    100: b"Continue",
    200: b"OK",
    400: b"Bad Request",
    404: b"Not Found",
    405: b"Method Not Allowed",
    409: b"Conflict",
    411: b"Length Required",
    431: b"Request Header Fields Too Large",
    500: b"Internal Server Error",
    503: b"Service Unavailable",
    505: b"HTTP Version Not Supported",
}


def log(message):
    """Writes one line to stderr, the function's log, in a single write so threads don't interleave."""
    sys.stderr.write("sless: %s\n" % message)


def fatal(what):
    """Reports the exception being handled and ends the process with :data:`EXIT_SERVE_ERROR`;
    the platform sees the exit and replaces the instance."""
    try:
        sys.stderr.write("sless: %s; exiting\n%s" % (what, traceback.format_exc()))
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001 - exiting matters more than the message
        pass
    os._exit(EXIT_SERVE_ERROR)


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
    if code_dir is None:
        return
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
    """The handler's second argument: who is calling and until when, and for a delivered message
    (queue and device triggers, async calls) the message and which attempt this is."""

    __slots__ = (
        "request_id",
        "source",
        "function_name",
        "namespace",
        "revision",
        "deadline_ms",
        "message",
        "attempt",
    )

    def __init__(
        self, request_id, source, function_name, namespace, revision, deadline_ms, message=None
    ):
        self.request_id = request_id
        self.source = source
        self.function_name = function_name
        self.namespace = namespace
        self.revision = revision
        self.deadline_ms = deadline_ms
        self.message = message
        attempt = message.get("attempt") if isinstance(message, dict) else None
        # bool is an int too, but never an attempt number.
        self.attempt = attempt if type(attempt) is int else None

    def remaining_ms(self):
        """Milliseconds left until the deadline (never negative), or None when there is none."""
        if self.deadline_ms is None:
            return None
        return max(0, self.deadline_ms - int(time.time() * 1000))

    def __repr__(self):
        return (
            "Context(request_id=%r, source=%r, function_name=%r, namespace=%r, revision=%r, "
            "deadline_ms=%r, attempt=%r)"
            % (
                self.request_id,
                self.source,
                self.function_name,
                self.namespace,
                self.revision,
                self.deadline_ms,
                self.attempt,
            )
        )


def decode_message(raw):
    """``context.message`` from the ``x-sless-message`` header (JSON); ``None`` when it is absent
    or is not JSON (the platform always sends JSON: anything else is not a message)."""
    if not raw:
        return None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


class _Unserializable(TypeError):
    pass


def _json_default(value):
    if isinstance(value, (bytes, bytearray, memoryview)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            pass
    raise _Unserializable(type(value).__name__)


# Built once: json.dumps with non-default options would build a new encoder for every result.
_encode_json = json.JSONEncoder(
    default=_json_default, allow_nan=False, separators=(",", ":")
).encode


def encode_result(result):
    """Returns ``(status, body)`` for a handler's return value.

    Whatever the value does while it is encoded (nests too deeply, refers to itself, exhausts
    memory, raises from a ``default`` hook) is that request's error, never the server's.
    """
    try:
        body = _encode_json(result).encode("utf-8")
    except RecursionError:
        return 500, error_body("result is not JSON serializable: nested too deeply")
    except MemoryError:
        return 500, error_body("result is not JSON serializable: out of memory while encoding")
    except Exception as exc:  # noqa: BLE001 - any failure to encode is this request's error
        return 500, error_body("result is not JSON serializable: %s" % exception_message(exc))
    if len(body) > MAX_RESULT_BYTES:
        return 500, error_body(
            "result is too large: %d bytes (at most %d)" % (len(body), MAX_RESULT_BYTES)
        )
    return 200, body


def decode_event(raw):
    """Decodes an invocation body; raises :class:`ValueError` with the reason when it is not an
    event the shim can pass on (not UTF-8, not JSON, nested too deeply, too big for memory)."""
    try:
        return _decode_json(raw.decode("utf-8"))
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except MemoryError:
        raise ValueError("out of memory while decoding") from None


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
            decode_message(headers.get("x-sless-message")),
        )

    def _args(self, event, headers):
        arity = self.entry.arity
        if arity == 1:
            return (event,)
        if arity == 2:
            return (event, self.context(headers))
        return ()

    def call_sync(self, event, headers):
        """Calls a plain function in the calling thread and serializes the result."""
        rid = headers.get("x-sless-request-id") or None
        token = _request_id.set(rid)
        try:
            try:
                result = self.entry.func(*self._args(event, headers))
                if type(result) not in _PLAIN_RESULTS and inspect.isawaitable(result):
                    # A plain function that returns a coroutine: run it on a loop, wait here.
                    loop = self._coroutine_loop()
                    result = asyncio.run_coroutine_threadsafe(_await(result), loop).result()
            except BaseException as exc:  # noqa: BLE001 - SystemExit in a handler must not end the thread
                _log_handler_failure(rid)
                return 500, error_body(exception_message(exc))
            return self._encode(result, rid)
        finally:
            if rid is not None:
                _end_request_output(rid)
            _request_id.reset(token)

    async def call_async(self, event, headers):
        """Awaits an ``async def`` handler; runs as its own task, so the request id set here is
        the task's alone."""
        rid = headers.get("x-sless-request-id") or None
        _request_id.set(rid)
        try:
            try:
                result = await self.entry.func(*self._args(event, headers))
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # noqa: BLE001 - see call_sync
                _log_handler_failure(rid)
                return 500, error_body(exception_message(exc))
            return self._encode(result, rid)
        finally:
            if rid is not None:
                _end_request_output(rid)

    def _coroutine_loop(self):
        with self._loop_lock:
            if self.loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="sless-asyncio", daemon=True).start()
                self.loop = loop
            return self.loop

    @staticmethod
    def _encode(result, rid):
        status, body = encode_result(result)
        if status != 200:
            log("request %s: %s" % (rid or "-", body.decode("utf-8")))
        return status, body


# The platform sends events as UTF-8 JSON; decoding the text directly skips json.loads'
# encoding detection.
_decode_json = json.JSONDecoder().decode

# Results that are certainly not awaitable, checked before the slower inspect.isawaitable().
_PLAIN_RESULTS = frozenset((dict, list, str, bytes, int, float, bool, type(None), tuple))


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
    __slots__ = ("method", "path", "headers", "body", "keep_alive", "decoded")

    def __init__(self, method, path, headers, body, keep_alive):
        self.decoded = False  # body is the decoded event of an invocation
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


_WHITESPACE = " \t\r\n\x0b\x0c"


def parse_head(head):
    """Parses a request head (without the blank line) into ``(method, path, headers, keep_alive)``.

    Header names are lowercased; a repeated header keeps its last value, except Content-Length,
    whose copies must agree.
    """
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        raise HttpError(400, "malformed request line")
    method, target, version = parts
    if version == "HTTP/1.1":
        keep_alive = True
    elif version == "HTTP/1.0":
        keep_alive = False
    elif version.startswith("HTTP/"):
        raise HttpError(505, "unsupported HTTP version")
    else:
        raise HttpError(400, "malformed request line")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name[0] in _WHITESPACE or name[-1] in _WHITESPACE:
            raise HttpError(400, "malformed header line")
        key = name.lower()
        val = value.strip(" \t")
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
    path = target.split("?", 1)[0]
    return method, path, headers, keep_alive


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

    __slots__ = ("buf", "head", "scan_from", "want_continue", "parked")

    def __init__(self):
        self.parked = None  # a parsed request put back by requeue()
        self.buf = bytearray()
        self.head = None  # (method, path, headers, keep_alive, length) once parsed
        self.scan_from = 0
        self.want_continue = False

    def idle(self):
        """True between requests: nothing of a next request has arrived."""
        return self.head is None and not self.buf and self.parked is None

    def requeue(self, request):
        """Puts ``request`` back; the next ``next_request()`` returns it again."""
        self.parked = request

    def next_request(self):
        if self.parked is not None:
            request, self.parked = self.parked, None
            return request
        buf = self.buf
        if self.head is None:
            if not buf:
                return None
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


# --------------------------------------------------------------------------------------------
# Server
# --------------------------------------------------------------------------------------------


class Conn:
    """One client connection. Exactly one thread owns it at a time: the leader while the
    connection is registered with epoll, otherwise the thread that took it out (a deposed
    leader finishing its request, or a thread serving it from the backlog)."""

    __slots__ = ("sock", "fd", "reader", "registered", "busy", "closed")

    def __init__(self, sock):
        self.sock = sock
        self.fd = sock.fileno()
        self.reader = RequestReader()
        self.registered = False
        self.busy = False  # async mode: a request of this connection is running as a task
        self.closed = False


class Server:
    """Serves the Unix socket with one epoll loop; see "How the Python shim serves" in
    runtimes/README.md for why it is built this way.

    Plain functions run right on the loop's thread (the *leader*), which saves the thread
    handoffs that dominate a per-request cost in CPython. Concurrency stays real because the
    main thread watches the leader: when one call (or a blocking write) has been running for
    more than :data:`PROMOTE_AFTER_S`, a new thread takes over the loop and the old one finishes
    its request as an ordinary worker. ``async def`` handlers run on an asyncio loop that the
    leader starts once the handler is known; the epoll descriptor is one of its readers.
    """

    def __init__(self, listener, app):
        self.listener = listener
        self.app = app
        self.ep = select.epoll()
        self.conns = {}  # fd -> Conn
        self.batch = collections.deque()  # polled events not yet handled; survives a promotion
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        # Leadership: the generation of the current leader, and what it is doing.
        self.leader_gen = 0
        self.in_call = False
        self.call_seq = 0
        self.call_conn = None
        self.watcher_parked = True
        self.running = 0  # plain-function calls in progress, bounded by app.concurrency
        self.backlog = collections.deque()  # connections with a request waiting for a slot
        self.inflight = 0  # invocations in progress (for shutdown)
        self.stopping = False
        self.loop = None  # the asyncio loop, once an async handler is served
        self.wake_r, self.wake_w = _pipe()  # wakes the leader (shutdown)
        self.watch_r, self.watch_w = _pipe()  # wakes the watcher (a leader call began)
        self.signal_r, self.signal_w = _pipe()
        listener.setblocking(False)
        self.ep.register(listener.fileno(), select.EPOLLIN)
        self.ep.register(self.wake_r, select.EPOLLIN)

    # -- main thread -----------------------------------------------------------------------

    def serve(self, ready_fd):
        """Runs until SIGTERM/SIGINT; returns True when in-flight requests drained in time."""
        previous = signal.set_wakeup_fd(self.signal_w)
        stop = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: stop.append(signum))
        threading.Thread(target=self._lead, args=(0,), name="sless-leader", daemon=True).start()
        if ready_fd is not None:
            signal_ready(ready_fd)
        try:
            self._watch(stop)
        finally:
            signal.set_wakeup_fd(previous)
        with self.lock:
            self.stopping = True
        os.write(self.wake_w, b"x")
        with self.lock:
            return self.cond.wait_for(lambda: self.inflight == 0, SHUTDOWN_GRACE_S)

    def _watch(self, stop):
        """Deposes a leader stuck in one call for longer than PROMOTE_AFTER_S, until a signal."""
        seen = -1
        idle_rounds = 0
        readers = [self.signal_r, self.watch_r]
        while not stop:
            timeout = None if self.watcher_parked else PROMOTE_AFTER_S
            ready, _, _ = select.select(readers, [], [], timeout)
            for fd in ready:
                _drain(fd)
            with self.lock:
                if self.in_call:
                    idle_rounds = 0
                    if self.call_seq == seen:
                        self._promote()
                    seen = self.call_seq
                else:
                    idle_rounds += 1
                    if idle_rounds > 50:
                        # Nothing ran for a while: stop ticking until the next call.
                        self.watcher_parked = True
                        idle_rounds = 0

    def _promote(self):
        """Called with the lock held: hands the loop to a new thread."""
        self.leader_gen += 1
        self.in_call = False
        conn = self.call_conn
        if conn is not None and conn.registered:
            # The old leader still owns it; the new one must not read from it meanwhile.
            self._unregister(conn)
        threading.Thread(target=self._lead, args=(self.leader_gen,), name="sless-leader", daemon=True).start()

    # -- the loop ----------------------------------------------------------------------------

    def _lead(self, gen):
        """Runs the epoll loop until deposed (then returns) or until the loop turns asyncio.

        Handlers' failures are answered inside; anything that escapes to here broke the server
        itself, which then exits rather than keep a socket that accepts and never answers."""
        try:
            self._lead_loop(gen)
        except BaseException:  # noqa: BLE001 - see above
            fatal("serving loop failed")

    def _lead_loop(self, gen):
        batch = self.batch
        poll = self.ep.poll
        while True:
            if not batch:
                if self.loop is not None:
                    return
                batch.extend(poll())
            while batch:
                fd, events = batch.popleft()
                self._on_event(fd, gen)
                if self.leader_gen != gen:
                    return
                if self.app.entry is not None and self.app.entry.is_async and self.loop is None:
                    self._run_asyncio()
                    return

    def _run_asyncio(self):
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self.loop = loop
        self.app.invoker.loop = loop
        loop.add_reader(self.ep.fileno(), self._on_epoll_async)
        loop.call_soon(self._on_epoll_async)
        loop.run_forever()

    def _on_epoll_async(self):
        try:
            batch = self.batch
            batch.extend(self.ep.poll(0))
            while batch:
                fd, events = batch.popleft()
                self._on_event(fd, self.leader_gen)
        except BaseException:  # noqa: BLE001 - asyncio would log it and go on without us
            fatal("serving loop failed")

    def _on_event(self, fd, gen):
        conn = self.conns.get(fd)
        if conn is not None:
            if not conn.registered:
                return  # a stale event of a connection another thread owns now
            try:
                data = conn.sock.recv(RECV_SIZE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:
                self._close(conn)
                return
            conn.reader.buf += data
            if conn.busy:
                if len(conn.reader.buf) > MAX_BUFFERED_WHILE_BUSY:
                    self._unregister(conn)  # read again once the running request is answered
                return
            self._drive(conn, gen)
        elif fd == self.listener.fileno():
            self._accept()
        elif fd == self.wake_r:
            _drain(fd)
            if self.stopping:
                self._begin_stop()

    def _accept(self):
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                # Out of file descriptors and the like: keep serving the connections there are.
                log("accept: %s" % exc)
                return
            if self.stopping:
                sock.close()
                continue
            sock.setblocking(False)
            conn = Conn(sock)
            self.conns[conn.fd] = conn
            self._register(conn)

    def _register(self, conn):
        conn.registered = True
        self.ep.register(conn.fd, select.EPOLLIN)

    def _unregister(self, conn):
        conn.registered = False
        try:
            self.ep.unregister(conn.fd)
        except (OSError, ValueError):
            pass

    def _close(self, conn):
        if conn.closed:
            return
        conn.closed = True
        if conn.registered:
            self._unregister(conn)
        self.conns.pop(conn.fd, None)
        conn.sock.close()

    def _begin_stop(self):
        """On the leader's thread: stop accepting, close idle connections."""
        try:
            self.ep.unregister(self.listener.fileno())
        except (OSError, ValueError):
            pass
        self.listener.close()
        for conn in list(self.conns.values()):
            if conn.registered and not conn.busy and conn.reader.idle():
                _shutdown_socket(conn.sock)
                self._close(conn)

    # -- requests --------------------------------------------------------------------------

    def _drive(self, conn, gen):
        """Answers the complete requests buffered on ``conn``, in order.

        ``gen`` is the leadership generation of the calling thread; a thread that is not (or is
        no longer) the leader owns ``conn`` and registers it again when done.
        """
        reader = conn.reader
        app = self.app
        while not conn.closed:
            try:
                request = reader.next_request()
            except HttpError as exc:
                self._send(conn, build_response(exc.status, error_body(str(exc)), close=True), gen)
                self._close(conn)
                return
            if request is None:
                if reader.want_continue:
                    reader.want_continue = False
                    self._send(conn, CONTINUE, gen)
                break
            if request.decoded:
                answer = None
            else:
                try:
                    answer = app.route(request, self, conn)
                except Exception as exc:  # noqa: BLE001 - one bad request must not end the loop
                    log("request %s: %s" % (request.path, _describe(exc)))
                    answer = 500, error_body(exception_message(exc)), JSON_TYPE
            if answer is not None:
                status, body, content_type = answer
                self._respond(conn, request, status, body, content_type, gen)
                if app.failed_load is not None:
                    app.exit_after_failed_load(self)
                continue
            if app.entry.is_async:
                self._start_task(conn, request)
                return
            with self.lock:
                if self.running >= app.concurrency:
                    # No slot: park the connection; a finishing call picks it up.
                    reader.requeue(request)
                    if conn.registered:
                        self._unregister(conn)
                    self.backlog.append(conn)
                    return
                self.running += 1
                self.inflight += 1
            leader = self.leader_gen == gen
            if leader:
                self.call_conn = conn
                self.call_seq += 1
                self.in_call = True
                if self.watcher_parked:
                    self.watcher_parked = False
                    os.write(self.watch_w, b"x")
            try:
                status, body = app.invoker.call_sync(request.body, request.headers)
                self._respond(conn, request, status, body, JSON_TYPE, gen)
            finally:
                # One lock round per request: the slot is given back once the answer is sent.
                with self.lock:
                    self.running -= 1
                    self.inflight -= 1
                    if leader:
                        self.in_call = False
                        leader = self.leader_gen == gen
                    waiting = self.backlog.popleft() if self.backlog else None
                    if self.stopping:
                        self.cond.notify_all()
            if not leader:
                gen = -1  # deposed meanwhile: finish this connection as a worker
            if waiting is not None:
                self._drive(waiting, gen)
        if not conn.closed and not conn.registered and not conn.busy:
            if self.stopping and reader.idle():
                self._close(conn)
            else:
                self._register(conn)

    def _respond(self, conn, request, status, body, content_type, gen):
        close = not request.keep_alive or self.stopping
        self._send(conn, build_response(status, body, content_type, close), gen)
        if close:
            self._close(conn)

    def _send(self, conn, data, gen):
        """Writes all of ``data``; a write that would block is finished blocking, watched like a
        handler call so that a slow reader cannot stall the loop."""
        sock = conn.sock
        try:
            sent = sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._close(conn)
            return
        if sent == len(data):
            return
        leader = self.loop is None and self.leader_gen == gen
        if leader:
            self.call_conn = conn
            self.call_seq += 1
            self.in_call = True
            if self.watcher_parked:
                self.watcher_parked = False
                os.write(self.watch_w, b"x")
        try:
            sock.setblocking(True)
            sock.sendall(memoryview(data)[sent:])
            sock.setblocking(False)
        except OSError:
            self._close(conn)
        finally:
            if leader:
                with self.lock:
                    self.in_call = False

    def _start_task(self, conn, request):
        conn.busy = True
        with self.lock:
            self.inflight += 1
        task = self.loop.create_task(self.app.invoker.call_async(request.body, request.headers))
        task.add_done_callback(lambda t: self._finish_task(conn, request, t))

    def _finish_task(self, conn, request, task):
        try:
            self._finish_task_inner(conn, request, task)
        except BaseException:  # noqa: BLE001 - see _on_epoll_async
            fatal("serving loop failed")

    def _finish_task_inner(self, conn, request, task):
        if task.cancelled():
            status, body = 500, error_body("handler cancelled")
        else:
            try:
                status, body = task.result()
            except BaseException as exc:  # noqa: BLE001 - only if call_async itself broke
                status, body = 500, error_body(exception_message(exc))
        conn.busy = False
        if not conn.closed:
            self._respond(conn, request, status, body, JSON_TYPE, self.leader_gen)
        with self.lock:
            self.inflight -= 1
            if self.stopping:
                self.cond.notify_all()
        if not conn.closed:
            self._drive(conn, self.leader_gen)


def _pipe():
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    return r, w


def _drain(fd):
    try:
        while os.read(fd, 512):
            pass
    except (BlockingIOError, InterruptedError):
        pass


def _shutdown_socket(sock):
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


# --------------------------------------------------------------------------------------------
# The function being served
# --------------------------------------------------------------------------------------------


class App:
    """What the server serves: the entrypoint once loaded, and the routes of the protocol."""

    def __init__(self, code_dir, deps_dir, entry=None, identity=("", "", ""), concurrency=1):
        self.code_dir = code_dir
        self.deps_dir = deps_dir
        self.entry = entry
        self.invoker = Invoker(entry, identity) if entry is not None else None
        self.concurrency = max(1, concurrency)
        self.failed_load = None  # the message of a failed /_sless/load; the process then exits
        self.socket_path = None

    def route(self, request, server, conn):
        """Answers everything but an invocation: returns ``(status, body, content_type)``, or
        None for a ``POST /_sless/invoke`` whose event decoded (then stored as ``request.body``)."""
        path = request.path
        if path == "/_sless/invoke":
            if request.method != "POST":
                return 405, error_body("use POST"), JSON_TYPE
            if self.entry is None:
                return 503, error_body("no function loaded"), JSON_TYPE
            if request.body:
                try:
                    request.body = decode_event(request.body)
                except ValueError as exc:
                    return 400, error_body("invalid JSON event: %s" % exc), JSON_TYPE
            else:
                request.body = None
            request.decoded = True
            return None
        if path == "/_sless/ready":
            if request.method != "GET":
                return 405, error_body("use GET"), JSON_TYPE
            return 200, b"ok", b"text/plain"
        if path == "/_sless/load":
            if request.method != "POST":
                return 405, error_body("use POST"), JSON_TYPE
            return self.load(request.body)
        return 404, error_body("not found: %s" % path), JSON_TYPE

    def load(self, raw):
        """``POST /_sless/load`` of a generic instance: imports the function named in the body."""
        if self.entry is not None or self.failed_load is not None:
            return 409, error_body("a function is already loaded"), JSON_TYPE
        try:
            spec = json.loads(raw) if raw else None
        except ValueError as exc:
            return 400, error_body("invalid load request: %s" % exc), JSON_TYPE
        if not isinstance(spec, dict) or not isinstance(spec.get("entrypoint"), str) or not spec["entrypoint"]:
            return 400, error_body('invalid load request: "entrypoint" (a string) is required'), JSON_TYPE
        env = spec.get("env") or {}
        if not isinstance(env, dict):
            return 400, error_body('invalid load request: "env" must be an object'), JSON_TYPE
        environ = os.environ
        for key, value in env.items():
            environ[str(key)] = str(value)
        identity = {
            "SLESS_ENTRYPOINT": spec["entrypoint"],
            "SLESS_NAMESPACE": spec.get("namespace"),
            "SLESS_FUNCTION": spec.get("function"),
            "SLESS_REVISION": spec.get("revision"),
            "SLESS_CONCURRENCY": spec.get("concurrency"),
        }
        for key, value in identity.items():
            if value is not None:
                environ[key] = str(value)
        try:
            concurrency = env_int("SLESS_CONCURRENCY", 1)
            setup_sys_path(self.code_dir, self.deps_dir)
            # The finders may have looked at the (then empty) code dir already.
            importlib.invalidate_caches()
            entry = load_entrypoint(spec["entrypoint"], self.code_dir)
        except LoadError as exc:
            log(str(exc))
            self.failed_load = str(exc)
            return 500, error_body(str(exc)), JSON_TYPE
        self.concurrency = max(1, concurrency)
        self.invoker = Invoker(
            entry,
            (environ.get("SLESS_FUNCTION", ""), environ.get("SLESS_NAMESPACE", ""), environ.get("SLESS_REVISION", "")),
        )
        self.entry = entry
        return 200, b'{"ok":true}', JSON_TYPE

    def exit_after_failed_load(self, server):
        """The answer to a failed load is on its way: exit with the load-error status."""
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            if self.socket_path:
                try:
                    os.unlink(self.socket_path)
                except OSError:
                    pass
            os._exit(EXIT_LOAD_ERROR)


# --------------------------------------------------------------------------------------------
# Output: request ids on log lines
# --------------------------------------------------------------------------------------------


class TaggedStream:
    """Wraps sys.stdout/sys.stderr: while a request is handled, every line written starts with
    ``[<request id>] ``. Outside a request writes pass straight through.

    The request id lives in a context variable, so it follows the handler into the thread it
    runs in and into its asyncio task. A partial line is held (per request and thread) until its
    newline arrives, or until the request ends, so that a prefix is never written mid-line.
    """

    def __init__(self, stream):
        self._stream = stream
        self._partial = {}  # (request id, thread id) -> text of an unfinished line

    def write(self, text):
        rid = _request_id.get()
        if rid is None:
            return self._stream.write(text)
        key = (rid, threading.get_ident())
        pending = self._partial.pop(key, None)
        if pending is not None:
            text_all = pending + text
        else:
            text_all = text
        if "\n" not in text_all:
            if len(text_all) > MAX_LINE_CHARS:
                # An endless line: pass it on in pieces rather than hold it all.
                prefix = "[%s] " % rid
                cut = len(text_all) - len(text_all) % MAX_LINE_CHARS
                pieces = [text_all[i : i + MAX_LINE_CHARS] for i in range(0, cut, MAX_LINE_CHARS)]
                self._stream.write("".join(prefix + p + "\n" for p in pieces))
                text_all = text_all[cut:]
            if text_all:
                self._partial[key] = text_all
            return len(text)
        head, _, tail = text_all.rpartition("\n")
        prefix = "[%s] " % rid
        if tail:
            self._partial[key] = tail
        self._stream.write(prefix + head.replace("\n", "\n" + prefix) + "\n")
        return len(text)

    def end_request(self, rid):
        """Writes what is left of an unfinished line of ``rid`` in the calling thread."""
        if self._partial:
            tail = self._partial.pop((rid, threading.get_ident()), None)
            if tail:
                self._stream.write("[%s] %s\n" % (rid, tail))

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def __getattr__(self, name):
        return getattr(self._stream, name)


# The streams configure_streams() tagged; a request's unfinished lines are flushed from these.
_TAGGED_STREAMS = []


def configure_streams():
    """Makes stdout/stderr line-buffered (log lines reach the platform immediately) and tags the
    lines handlers write with their request id."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        try:
            stream.reconfigure(line_buffering=True, errors="backslashreplace")
        except (AttributeError, ValueError):
            pass
        if not isinstance(stream, TaggedStream):
            stream = TaggedStream(stream)
            setattr(sys, name, stream)
        if stream not in _TAGGED_STREAMS:
            _TAGGED_STREAMS.append(stream)


def _end_request_output(rid):
    for stream in _TAGGED_STREAMS:
        if stream._partial:
            stream.end_request(rid)


# --------------------------------------------------------------------------------------------
# Startup
# --------------------------------------------------------------------------------------------


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


def listen_inherited(fd):
    """The listening socket the platform created and passed as ``fd`` (``SLESS_LISTEN_FD``)."""
    sock = socket.socket(fileno=fd)
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        sock.detach()
        raise OSError("SLESS_LISTEN_FD %d is not a Unix stream socket" % fd)
    # Listening already; this only raises the backlog to the shim's own.
    sock.listen(1024)
    return sock


def serve(app, socket_path, ready_fd, listen_fd=None):
    """Listens and serves until SIGTERM; returns True when in-flight requests drained in time.
    An inherited listening socket (``listen_fd``) wins over binding ``socket_path``; its file
    belongs to the platform and is left alone."""
    if listen_fd is not None:
        listener, socket_path = listen_inherited(listen_fd), None
    else:
        listener = listen_unix(socket_path)
    app.socket_path = socket_path
    try:
        graceful = Server(listener, app).serve(ready_fd)
    finally:
        listener.close()
        if socket_path:
            try:
                os.unlink(socket_path)
            except OSError:
                pass
    if not graceful:
        log("shutdown: requests still running after %.0fs; exiting" % SHUTDOWN_GRACE_S)
    return graceful


def _warm_up():
    """Runs the per-request code paths once so a generic instance has nothing left to import or
    compile when its function arrives."""
    reader = RequestReader()
    reader.buf += b"POST /_sless/invoke HTTP/1.1\r\nContent-Length: 2\r\nx-sless-request-id: w\r\n\r\n{}"
    request = reader.next_request()
    decode_event(request.body)
    encode_result({"warm": [1, 2.5, None, True]})
    build_response(200, b"{}")
    inspect.signature(_warm_up)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    check = "--check" in argv
    configure_streams()
    env = os.environ
    code_dir = env.get("SLESS_CODE_DIR") or "/code"
    deps_dir = env.get("SLESS_DEPS_DIR") or "/deps"
    spec = env.get("SLESS_ENTRYPOINT", "")
    generic = not spec and not check
    try:
        concurrency = env_int("SLESS_CONCURRENCY", 1)
        ready_fd = env_int("SLESS_READY_FD", None)
        if generic:
            # The code arrives later (POST /_sless/load); until then only the shim's own
            # directory is taken off the path.
            setup_sys_path(None, None)
            app = App(code_dir, deps_dir, concurrency=concurrency)
            _warm_up()
        else:
            setup_sys_path(code_dir, deps_dir)
            entry = load_entrypoint(spec or DEFAULT_ENTRYPOINT, code_dir)
            identity = (env.get("SLESS_FUNCTION", ""), env.get("SLESS_NAMESPACE", ""), env.get("SLESS_REVISION", ""))
            app = App(code_dir, deps_dir, entry, identity, concurrency)
    except LoadError as exc:
        log(str(exc))
        return EXIT_LOAD_ERROR
    if check:
        return 0

    socket_path = env.get("SLESS_SOCKET")
    try:
        listen_fd = env_int("SLESS_LISTEN_FD", None)
    except LoadError as exc:
        log(str(exc))
        return 2
    if listen_fd is None and not socket_path:
        log("neither SLESS_LISTEN_FD nor SLESS_SOCKET is set")
        return 2
    try:
        graceful = serve(app, socket_path, ready_fd, listen_fd)
    except OSError as exc:
        where = "fd %d" % listen_fd if listen_fd is not None else socket_path
        log("cannot serve on %s: %s" % (where, exc))
        return 2
    # Handler threads that are still running (or idle leaders) must not hold up interpreter exit.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
