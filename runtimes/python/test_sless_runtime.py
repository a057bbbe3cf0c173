"""Tests for the sless Python runtime shim: runs it as a subprocess on a temporary Unix socket.

Run with: /usr/bin/python3 -m unittest discover -s runtimes/python
"""

import array
import fcntl
import http.client
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import termios
import textwrap
import threading
import time
import unittest

SHIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sless_runtime.py")
START_TIMEOUT_S = 15.0


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout=15.0):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.unix_path)
        self.sock = sock


def read_response(sock, buf=b""):
    """Reads one HTTP response from a raw socket; returns (status, headers, body, leftover)."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError("connection closed before a response head: %r" % buf)
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError("connection closed mid-body")
        rest += chunk
    return status, headers, rest[:length], rest[length:]


def invoke_request(event, extra_headers=b""):
    body = json.dumps(event).encode()
    return (
        b"POST /_sless/invoke HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n%s\r\n%s" % (len(body), extra_headers, body)
    )


class Shim:
    """One shim process with its own code dir, socket and log files."""

    def __init__(self, files, entrypoint="handler.handle", concurrency=4, deps=None, args=()):
        self.dir = tempfile.mkdtemp(prefix="sless-py-")
        self.code = os.path.join(self.dir, "code")
        self.deps = os.path.join(self.dir, "deps")
        self.socket = os.path.join(self.dir, "fn.sock")
        _write_tree(self.code, files)
        if deps is not None:
            _write_tree(self.deps, deps)
        self.env = dict(
            os.environ,
            SLESS_CODE_DIR=self.code,
            SLESS_DEPS_DIR=self.deps,
            SLESS_SOCKET=self.socket,
            SLESS_ENTRYPOINT=entrypoint,
            SLESS_CONCURRENCY=str(concurrency),
            SLESS_NAMESPACE="team-a",
            SLESS_FUNCTION="hello",
            SLESS_REVISION="7",
        )
        self.args = list(args)
        self.proc = None
        self.ready_r = None

    def start(self, extra_fds=()):
        ready_r, ready_w = os.pipe()
        self.env["SLESS_READY_FD"] = str(ready_w)
        self.stderr = open(os.path.join(self.dir, "stderr"), "w+")
        self.proc = subprocess.Popen(
            [sys.executable, SHIM, *self.args],
            env=self.env,
            cwd=self.code,
            pass_fds=(ready_w, *extra_fds),
            stdout=subprocess.PIPE,
            stderr=self.stderr,
        )
        os.close(ready_w)
        self.ready_r = ready_r
        return self

    def wait_ready(self):
        """Returns what the shim wrote to its ready fd before closing it."""
        data = b""
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("shim not ready in time; stderr:\n" + self.stderr_text())
            readable, _, _ = select.select([self.ready_r], [], [], left)
            if not readable:
                continue
            chunk = os.read(self.ready_r, 64)
            if not chunk:
                return data
            data += chunk

    def run_to_exit(self):
        """For shims expected to exit on their own (load errors, --check)."""
        code = self.proc.wait(timeout=START_TIMEOUT_S)
        return code, self.stderr_text()

    def stderr_text(self):
        self.stderr.flush()
        self.stderr.seek(0)
        return self.stderr.read()

    def conn(self):
        return UnixHTTPConnection(self.socket)

    def raw(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(15.0)
        try:
            sock.connect(self.socket)
        except OSError:
            sock.close()
            raise
        return sock

    def invoke(self, event, headers=None, conn=None):
        own = conn is None
        conn = conn or self.conn()
        try:
            body = json.dumps(event)
            hdrs = {"Content-Type": "application/json", "x-sless-request-id": "req-1", "x-sless-source": "invoke"}
            hdrs.update(headers or {})
            conn.request("POST", "/_sless/invoke", body=body, headers=hdrs)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, resp.getheader("Content-Type"), json.loads(data)
        finally:
            if own:
                conn.close()

    def stop_keep_logs(self):
        """SIGTERMs the shim and waits for it, keeping its output for reading."""
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=15)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None and self.proc.stdout:
            self.proc.stdout.close()
        if self.ready_r is not None:
            os.close(self.ready_r)
            self.ready_r = None
        self.stderr.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def _write_tree(root, files):
    os.makedirs(root, exist_ok=True)
    for name, text in files.items():
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(textwrap.dedent(text))


HANDLER = """
import asyncio, time

def handle(event):
    kind = event.get("kind") if isinstance(event, dict) else None
    if kind == "dict":
        return {"a": 1, "nested": {"b": [1, 2]}}
    if kind == "list":
        return [1, "two", None]
    if kind == "str":
        return "hello"
    if kind == "int":
        return 42
    if kind == "float":
        return 1.5
    if kind == "none":
        return None
    if kind == "bytes":
        return b"caf\\xc3\\xa9"
    if kind == "bad-bytes":
        return b"\\xff"
    if kind == "set":
        return {1, 2}
    if kind == "nan":
        return float("nan")
    if kind == "raise":
        raise ValueError("boom: " + str(event.get("n")))
    if kind == "raise-empty":
        raise KeyError()
    if kind == "exit":
        raise SystemExit(5)
    if kind == "sleep":
        time.sleep(event["seconds"])
        return "slept"
    if kind == "deep":
        value = []
        for _ in range(100000):
            value = [value]
        return value
    if kind == "circular":
        value = []
        value.append(value)
        return value
    if kind == "coroutine":
        async def later():
            await asyncio.sleep(0)
            return "from coroutine"
        return later()
    return event
"""


# The same cases behind an `async def` handler, which the shim serves on its asyncio server.
ASYNC_HANDLER = """
import asyncio, inspect, cases

async def handle(event):
    if isinstance(event, dict) and event.get("kind") == "sleep":
        await asyncio.sleep(event["seconds"])
        return "slept"
    result = cases.handle(event)
    if inspect.isawaitable(result):
        result = await result
    return result
"""


class RunningShimTest(unittest.TestCase):
    """Tests that share one running shim with a general-purpose plain-function handler."""

    FILES = {"handler.py": HANDLER}

    @classmethod
    def setUpClass(cls):
        cls.shim = Shim(cls.FILES, concurrency=10).start()
        cls.ready = cls.shim.wait_ready()

    @classmethod
    def tearDownClass(cls):
        cls.shim.stop()

    def test_ready_line_written_once_listening(self):
        self.assertEqual(self.ready, b"ready\n")

    def test_ready_endpoint(self):
        conn = self.shim.conn()
        conn.request("GET", "/_sless/ready")
        resp = conn.getresponse()
        self.assertEqual((resp.status, resp.read()), (200, b"ok"))
        conn.close()

    def test_results_are_json(self):
        cases = {
            "dict": {"a": 1, "nested": {"b": [1, 2]}},
            "list": [1, "two", None],
            "str": "hello",
            "int": 42,
            "float": 1.5,
            "none": None,
            "bytes": "café",
        }
        for kind, expected in cases.items():
            with self.subTest(kind=kind):
                status, ctype, body = self.shim.invoke({"kind": kind})
                self.assertEqual(status, 200)
                self.assertEqual(ctype, "application/json")
                self.assertEqual(body, expected)

    def test_event_is_passed_through(self):
        event = {"kind": "echo", "x": [1, {"y": "ü"}]}
        self.assertEqual(self.shim.invoke(event)[2], event)

    def test_empty_body_is_null_event(self):
        conn = self.shim.conn()
        conn.request("POST", "/_sless/invoke", body=b"", headers={"Content-Length": "0"})
        resp = conn.getresponse()
        self.assertEqual((resp.status, json.loads(resp.read())), (200, None))
        conn.close()

    def test_exception_is_500_and_instance_keeps_serving(self):
        status, _, body = self.shim.invoke({"kind": "raise", "n": 3})
        self.assertEqual((status, body), (500, {"error": "boom: 3"}))
        self.assertIn("ValueError: boom: 3", self.shim.stderr_text())
        self.assertIn("Traceback", self.shim.stderr_text())
        self.assertEqual(self.shim.invoke({"kind": "int"})[:3:2], (200, 42))

    def test_exception_without_message_uses_class_name(self):
        self.assertEqual(self.shim.invoke({"kind": "raise-empty"})[::2], (500, {"error": "KeyError"}))

    def test_system_exit_in_handler_is_an_error_not_an_exit(self):
        self.assertEqual(self.shim.invoke({"kind": "exit"})[::2], (500, {"error": "5"}))
        self.assertEqual(self.shim.invoke({"kind": "str"})[::2], (200, "hello"))

    def test_unserializable_results_are_errors(self):
        cases = {
            "set": "result is not JSON serializable: set",
            "bad-bytes": "result is not JSON serializable: bytes",
        }
        for kind, message in cases.items():
            with self.subTest(kind=kind):
                self.assertEqual(self.shim.invoke({"kind": kind})[::2], (500, {"error": message}))
        status, _, body = self.shim.invoke({"kind": "nan"})
        self.assertEqual(status, 500)
        self.assertTrue(body["error"].startswith("result is not JSON serializable: "), body)

    def test_sync_handler_returning_a_coroutine_is_awaited(self):
        self.assertEqual(self.shim.invoke({"kind": "coroutine"})[::2], (200, "from coroutine"))

    def test_sync_handlers_run_concurrently(self):
        results = []

        def call():
            results.append(self.shim.invoke({"kind": "sleep", "seconds": 0.5})[::2])

        threads = [threading.Thread(target=call) for _ in range(10)]
        started = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - started
        self.assertEqual(results, [(200, "slept")] * 10)
        # Serially this takes 5 s; concurrently a little over 0.5 s.
        self.assertLess(elapsed, 2.5)

    def test_keep_alive_serves_many_requests_on_one_connection(self):
        sock = self.shim.raw()
        leftover = b""
        for n in range(5):
            sock.sendall(invoke_request({"kind": "echo", "n": n}))
            status, headers, body, leftover = read_response(sock, leftover)
            self.assertEqual(status, 200)
            self.assertNotIn("connection", headers)
            self.assertEqual(json.loads(body), {"kind": "echo", "n": n})
        sock.close()

    def test_pipelined_requests_are_answered_in_order(self):
        sock = self.shim.raw()
        # The first is slow: a server answering out of order would send the second first.
        sock.sendall(
            invoke_request({"kind": "sleep", "seconds": 0.2})
            + invoke_request({"kind": "echo", "n": 2})
            + b"GET /_sless/ready HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        status, _, body, rest = read_response(sock)
        self.assertEqual((status, json.loads(body)), (200, "slept"))
        status, _, body, rest = read_response(sock, rest)
        self.assertEqual((status, json.loads(body)), (200, {"kind": "echo", "n": 2}))
        status, _, body, rest = read_response(sock, rest)
        self.assertEqual((status, body, rest), (200, b"ok", b""))
        sock.close()

    def test_request_split_into_tiny_writes(self):
        sock = self.shim.raw()
        for i, byte in enumerate(invoke_request({"kind": "echo", "split": True})):
            sock.sendall(bytes([byte]))
        status, _, body, _ = read_response(sock)
        self.assertEqual((status, json.loads(body)), (200, {"kind": "echo", "split": True}))
        sock.close()

    def test_large_body_round_trips(self):
        event = {"kind": "echo", "data": "x" * (1024 * 1024)}
        status, _, body = self.shim.invoke(event)
        self.assertEqual(status, 200)
        self.assertEqual(body, event)

    def test_invalid_json_is_400(self):
        conn = self.shim.conn()
        conn.request("POST", "/_sless/invoke", body=b"{nope")
        resp = conn.getresponse()
        self.assertEqual(resp.status, 400)
        self.assertIn("invalid JSON event", json.loads(resp.read())["error"])
        conn.close()

    def test_deeply_nested_event_is_400_and_instance_keeps_serving(self):
        for body in (b"[" * 100000 + b"]" * 100000, b'{"a":' * 5000 + b"1" + b"}" * 5000):
            conn = self.shim.conn()
            conn.request("POST", "/_sless/invoke", body=body)
            resp = conn.getresponse()
            self.assertEqual(resp.status, 400)
            self.assertEqual(json.loads(resp.read()), {"error": "invalid JSON event: nested too deeply"})
            conn.close()
            self.assertEqual(self.shim.invoke({"kind": "int"})[::2], (200, 42))

    def test_results_that_cannot_be_encoded_are_errors_and_instance_keeps_serving(self):
        self.assertEqual(
            self.shim.invoke({"kind": "deep"})[::2],
            (500, {"error": "result is not JSON serializable: nested too deeply"}),
        )
        status, _, body = self.shim.invoke({"kind": "circular"})
        self.assertEqual(status, 500)
        self.assertIn("Circular reference", body["error"])
        self.assertEqual(self.shim.invoke({"kind": "str"})[::2], (200, "hello"))

    def test_unknown_path_is_404_and_wrong_method_is_405(self):
        conn = self.shim.conn()
        conn.request("GET", "/elsewhere")
        resp = conn.getresponse()
        self.assertEqual(resp.status, 404)
        resp.read()
        conn.request("GET", "/_sless/invoke")
        resp = conn.getresponse()
        self.assertEqual(resp.status, 405)
        resp.read()
        conn.close()

    def test_chunked_body_is_refused_and_connection_closed(self):
        sock = self.shim.raw()
        sock.sendall(
            b"POST /_sless/invoke HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"2\r\n{}\r\n0\r\n\r\n"
        )
        status, headers, _, _ = read_response(sock)
        self.assertEqual((status, headers.get("connection")), (411, "close"))
        self.assertEqual(sock.recv(10), b"")
        sock.close()

    def test_malformed_request_is_400(self):
        sock = self.shim.raw()
        sock.sendall(b"NONSENSE\r\n\r\n")
        status, _, _, _ = read_response(sock)
        self.assertEqual(status, 400)
        sock.close()

    def test_expect_100_continue(self):
        body = json.dumps({"kind": "echo", "expect": True}).encode()
        sock = self.shim.raw()
        sock.sendall(
            b"POST /_sless/invoke HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)
        )
        status, _, _, rest = read_response(sock)
        self.assertEqual((status, rest), (100, b""))
        sock.sendall(body)
        status, _, got, _ = read_response(sock)
        self.assertEqual((status, json.loads(got)), (200, {"kind": "echo", "expect": True}))
        sock.close()

    def test_http_1_0_closes_after_response(self):
        sock = self.shim.raw()
        sock.sendall(b"GET /_sless/ready HTTP/1.0\r\n\r\n")
        status, headers, body, _ = read_response(sock)
        self.assertEqual((status, body, headers.get("connection")), (200, b"ok", "close"))
        self.assertEqual(sock.recv(10), b"")
        sock.close()


class AsyncRunningShimTest(RunningShimTest):
    """The same HTTP-level tests against an `async def` handler (the asyncio server)."""

    FILES = {"cases.py": HANDLER, "handler.py": ASYNC_HANDLER}


class ContextTest(unittest.TestCase):
    def test_two_argument_handler_gets_context(self):
        shim = Shim(
            {
                "handler.py": """
                def handle(event, context):
                    return {
                        "request_id": context.request_id,
                        "source": context.source,
                        "function_name": context.function_name,
                        "namespace": context.namespace,
                        "revision": context.revision,
                        "deadline_ms": context.deadline_ms,
                        "remaining_ms": context.remaining_ms(),
                    }
                """
            }
        ).start()
        try:
            shim.wait_ready()
            deadline = int(time.time() * 1000) + 60_000
            status, _, body = shim.invoke(
                {}, {"x-sless-request-id": "r-42", "x-sless-source": "cron", "x-sless-deadline-ms": str(deadline)}
            )
            self.assertEqual(status, 200)
            remaining = body.pop("remaining_ms")
            self.assertEqual(
                body,
                {
                    "request_id": "r-42",
                    "source": "cron",
                    "function_name": "hello",
                    "namespace": "team-a",
                    "revision": "7",
                    "deadline_ms": deadline,
                },
            )
            self.assertTrue(50_000 < remaining <= 60_000, remaining)
            # Without a deadline header there is no deadline.
            status, _, body = shim.invoke({}, {"x-sless-request-id": "r-43"})
            self.assertEqual((body["deadline_ms"], body["remaining_ms"]), (None, None))
        finally:
            shim.stop()

    def test_delivered_messages_reach_the_context(self):
        shim = Shim(
            {
                "handler.py": """
                def handle(event, context):
                    return {"message": context.message, "attempt": context.attempt}
                """
            }
        ).start()
        try:
            shim.wait_ready()
            message = {
                "kind": "amqp",
                "topic": "orders",
                "key": "k1",
                "id": "m-1",
                "headers": {"x-trace": "caf\u00e9"},
                "attempt": 2,
            }
            status, _, body = shim.invoke(
                {"order": 1},
                {"x-sless-source": "queue", "x-sless-message": json.dumps(message)},
            )
            self.assertEqual(status, 200)
            self.assertEqual(body, {"message": message, "attempt": 2})
            # Not a delivery: neither is set.
            status, _, body = shim.invoke({})
            self.assertEqual(body, {"message": None, "attempt": None})
            # A header that is not JSON is no message.
            status, _, body = shim.invoke({}, {"x-sless-message": "{not json"})
            self.assertEqual((status, body), (200, {"message": None, "attempt": None}))
        finally:
            shim.stop()

    def test_async_handler_is_awaited_with_context_and_zero_arg_handler_works(self):
        shim = Shim(
            {
                "handler.py": """
                import asyncio
                async def handle(event, ctx):
                    await asyncio.sleep(0.3)
                    if event == "fail":
                        raise RuntimeError("async boom")
                    return {"event": event, "rid": ctx.request_id}

                def tick():
                    return "tock"
                """
            }
        ).start()
        try:
            shim.wait_ready()
            results = []
            threads = [
                threading.Thread(target=lambda n=n: results.append(shim.invoke(n, {"x-sless-request-id": str(n)})[2]))
                for n in range(8)
            ]
            started = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.assertLess(time.monotonic() - started, 2.0)
            self.assertEqual(sorted(results, key=lambda r: r["event"]), [{"event": n, "rid": str(n)} for n in range(8)])
            self.assertEqual(shim.invoke("fail")[::2], (500, {"error": "async boom"}))
        finally:
            shim.stop()

        shim = Shim({"handler.py": "def tick():\n    return 'tock'\n"}, entrypoint="handler.tick").start()
        try:
            shim.wait_ready()
            self.assertEqual(shim.invoke({"ignored": True})[::2], (200, "tock"))
        finally:
            shim.stop()


class LoadingTest(unittest.TestCase):
    def run_shim(self, files, entrypoint="handler.handle", args=(), deps=None):
        shim = Shim(files, entrypoint=entrypoint, args=args, deps=deps).start()
        try:
            code, stderr = shim.run_to_exit()
            ready = shim.wait_ready()
            return code, stderr, ready
        finally:
            shim.stop()

    def test_missing_module_exits_3_naming_it(self):
        code, stderr, ready = self.run_shim({"other.py": "def handle(e): pass\n"})
        self.assertEqual(code, 3)
        self.assertEqual(ready, b"")
        self.assertIn('sless: entrypoint module "handler" not found (no handler.py)', stderr)

    def test_missing_dotted_module_names_its_path(self):
        code, stderr, _ = self.run_shim({"pkg/__init__.py": ""}, entrypoint="pkg.api.handle")
        self.assertEqual(code, 3)
        self.assertIn('entrypoint module "pkg.api" not found (no pkg/api.py)', stderr)

    def test_missing_function_exits_3_naming_it(self):
        code, stderr, _ = self.run_shim({"handler.py": "def other(e): pass\n"})
        self.assertEqual(code, 3)
        self.assertIn('sless: entrypoint function "handle" not found in module "handler"', stderr)

    def test_not_callable_exits_3(self):
        code, stderr, _ = self.run_shim({"handler.py": "handle = 5\n"})
        self.assertEqual(code, 3)
        self.assertIn('entrypoint "handler.handle" is not callable (it is a int)', stderr)

    def test_import_exception_exits_3_with_traceback(self):
        code, stderr, _ = self.run_shim({"handler.py": "raise RuntimeError('bad config')\n"})
        self.assertEqual(code, 3)
        self.assertIn("Traceback", stderr)
        self.assertIn('sless: entrypoint module "handler" failed to import: RuntimeError: bad config', stderr)

    def test_missing_dependency_is_an_import_failure_not_a_missing_entrypoint(self):
        code, stderr, _ = self.run_shim({"handler.py": "import not_installed_anywhere\n"})
        self.assertEqual(code, 3)
        self.assertIn("ModuleNotFoundError: No module named 'not_installed_anywhere'", stderr)
        self.assertNotIn("not found (no", stderr)

    def test_module_shadowing_the_standard_library_is_reported(self):
        code, stderr, _ = self.run_shim({"json.py": "def handle(e): pass\n"}, entrypoint="json.handle")
        self.assertEqual(code, 3)
        self.assertIn('"json" has the name of a standard library module', stderr)

    def test_check_succeeds_silently_without_listening(self):
        code, stderr, ready = self.run_shim({"handler.py": "def handle(e): return e\n"}, args=["--check"])
        self.assertEqual((code, stderr, ready), (0, "", b""))

    def test_check_fails_like_startup(self):
        code, stderr, _ = self.run_shim({"handler.py": "x = 1\n"}, args=["--check"])
        self.assertEqual(code, 3)
        self.assertIn('entrypoint function "handle" not found in module "handler"', stderr)

    def test_dotted_module_and_deps_dir_are_importable(self):
        shim = Shim(
            {"pkg/__init__.py": "", "pkg/api.py": "import helper\ndef run(e):\n    return helper.shout(e)\n"},
            entrypoint="pkg.api.run",
            deps={"helper.py": "def shout(s):\n    return s.upper()\n"},
        ).start()
        try:
            shim.wait_ready()
            self.assertEqual(shim.invoke("hi")[::2], (200, "HI"))
        finally:
            shim.stop()


class ConcurrencyLimitTest(unittest.TestCase):
    def test_plain_handlers_never_run_more_than_concurrency_at_once(self):
        shim = Shim(
            {
                "handler.py": """
                import threading, time
                lock = threading.Lock()
                running = 0
                peak = 0
                def handle(event):
                    global running, peak
                    with lock:
                        running += 1
                        peak = max(peak, running)
                    time.sleep(0.2)
                    with lock:
                        running -= 1
                    return peak
                """
            },
            concurrency=2,
        ).start()
        try:
            shim.wait_ready()
            peaks = []
            threads = [threading.Thread(target=lambda: peaks.append(shim.invoke({})[2])) for _ in range(6)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.assertEqual(len(peaks), 6)
            self.assertEqual(max(peaks), 2)
        finally:
            shim.stop()


def post_json(shim, path, payload, conn=None):
    own = conn is None
    conn = conn or shim.conn()
    try:
        conn.request("POST", path, body=json.dumps(payload), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        if own:
            conn.close()


LOAD = {
    "entrypoint": "handler.handle",
    "env": {"GREETING": "hej"},
    "namespace": "team-b",
    "function": "late",
    "revision": 3,
    "concurrency": 4,
}


class InheritedListenerTest(unittest.TestCase):
    """The platform's way: a listening socket created outside, passed as SLESS_LISTEN_FD."""

    def test_serves_on_the_inherited_socket_and_leaves_its_file(self):
        for entrypoint in ("handler.handle", ""):
            with self.subTest(entrypoint=entrypoint):
                shim = Shim({"handler.py": HANDLER}, entrypoint=entrypoint)
                listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                listener.bind(shim.socket)
                listener.listen(8)
                del shim.env["SLESS_SOCKET"]
                shim.env["SLESS_LISTEN_FD"] = str(listener.fileno())
                shim.start(extra_fds=(listener.fileno(),))
                listener.close()
                self.addCleanup(shim.stop)
                self.assertEqual(shim.wait_ready(), b"ready\n")
                conn = shim.conn()
                conn.request("GET", "/_sless/ready")
                resp = conn.getresponse()
                self.assertEqual((resp.status, resp.read()), (200, b"ok"))
                conn.close()
                if entrypoint:
                    self.assertEqual(shim.invoke({"kind": "int"})[2], 42)
                shim.stop_keep_logs()
                self.assertEqual(shim.proc.returncode, 0, shim.stderr_text())
                # The socket file is the platform's: the shim never unlinks it.
                self.assertTrue(os.path.exists(shim.socket))

    def test_a_descriptor_that_is_not_a_socket_is_exit_2(self):
        shim = Shim({"handler.py": HANDLER})
        r, w = os.pipe()
        del shim.env["SLESS_SOCKET"]
        shim.env["SLESS_LISTEN_FD"] = str(r)
        shim.start(extra_fds=(r,))
        os.close(r)
        os.close(w)
        self.addCleanup(shim.stop)
        code, stderr = shim.run_to_exit()
        self.assertEqual(code, 2, stderr)
        self.assertIn("cannot serve on fd", stderr)


class GenericInstanceTest(unittest.TestCase):
    """An instance started without SLESS_ENTRYPOINT, specialised by POST /_sless/load."""

    def start_generic(self):
        shim = Shim({}, entrypoint="")
        del shim.env["SLESS_FUNCTION"], shim.env["SLESS_NAMESPACE"], shim.env["SLESS_REVISION"]
        shim.start()
        self.addCleanup(shim.stop)
        self.assertEqual(shim.wait_ready(), b"ready\n")
        return shim

    def test_load_then_invoke_with_env_and_context(self):
        shim = self.start_generic()
        conn = shim.conn()
        conn.request("GET", "/_sless/ready")
        resp = conn.getresponse()
        self.assertEqual((resp.status, resp.read()), (200, b"ok"))
        self.assertEqual(shim.invoke({}, conn=conn)[::2], (503, {"error": "no function loaded"}))
        # The platform fills the code dir only now, after the instance started.
        _write_tree(
            shim.code,
            {
                "handler.py": """
                import os
                AT_IMPORT = os.environ.get("GREETING")
                def handle(event, context):
                    return {
                        "at_import": AT_IMPORT,
                        "entrypoint": os.environ["SLESS_ENTRYPOINT"],
                        "function": context.function_name,
                        "namespace": context.namespace,
                        "revision": context.revision,
                        "event": event,
                    }
                """
            },
        )
        self.assertEqual(post_json(shim, "/_sless/load", LOAD, conn), (200, {"ok": True}))
        status, _, body = shim.invoke(5, conn=conn)
        self.assertEqual(status, 200)
        self.assertEqual(
            body,
            {
                "at_import": "hej",
                "entrypoint": "handler.handle",
                "function": "late",
                "namespace": "team-b",
                "revision": "3",
                "event": 5,
            },
        )
        self.assertEqual(post_json(shim, "/_sless/load", LOAD, conn)[0], 409)
        self.assertEqual(shim.invoke(6, conn=conn)[0], 200)
        conn.close()

    def test_async_handler_and_deps_after_load(self):
        shim = self.start_generic()
        _write_tree(shim.code, {"handler.py": "import asyncio, helper\nasync def handle(e):\n    await asyncio.sleep(0.2)\n    return helper.shout(e)\n"})
        _write_tree(shim.deps, {"helper.py": "def shout(s):\n    return s.upper()\n"})
        self.assertEqual(post_json(shim, "/_sless/load", LOAD), (200, {"ok": True}))
        results = []
        threads = [threading.Thread(target=lambda: results.append(shim.invoke("hi")[::2])) for _ in range(6)]
        started = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertLess(time.monotonic() - started, 1.0)
        self.assertEqual(results, [(200, "HI")] * 6)

    def test_load_of_missing_module_is_500_and_exit_3(self):
        shim = self.start_generic()
        status, body = post_json(shim, "/_sless/load", LOAD)
        self.assertEqual(
            (status, body), (500, {"error": 'entrypoint module "handler" not found (no handler.py)'})
        )
        self.assertEqual(shim.proc.wait(timeout=START_TIMEOUT_S), 3)
        self.assertIn('sless: entrypoint module "handler" not found (no handler.py)', shim.stderr_text())

    def test_load_of_failing_import_prints_traceback(self):
        shim = self.start_generic()
        _write_tree(shim.code, {"handler.py": "raise RuntimeError('bad config')\n"})
        status, body = post_json(shim, "/_sless/load", LOAD)
        self.assertEqual(status, 500)
        self.assertEqual(body["error"], 'entrypoint module "handler" failed to import: RuntimeError: bad config')
        self.assertEqual(shim.proc.wait(timeout=START_TIMEOUT_S), 3)
        self.assertIn("Traceback", shim.stderr_text())


class RequestIdLogTest(unittest.TestCase):
    def test_lines_written_during_a_request_carry_its_id(self):
        shim = Shim(
            {
                "handler.py": """
                import sys, threading, time
                print("importing")
                def handle(event):
                    n = event["n"]
                    print("start", n)
                    sys.stdout.write("partial ")
                    time.sleep(0.05)
                    sys.stdout.write("line %d\\n" % n)
                    sys.stderr.write("err %d\\ntwo %d\\n" % (n, n))
                    time.sleep(0.05)
                    print("no newline", n, end="")
                    return n
                """
            },
            concurrency=8,
        ).start()
        try:
            shim.wait_ready()
            threads = [
                threading.Thread(target=lambda n=n: shim.invoke({"n": n}, {"x-sless-request-id": "r%d" % n}))
                for n in range(6)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            shim.stop_keep_logs()
            out = shim.proc.stdout.read().decode()
            err = shim.stderr_text()
        finally:
            shim.stop()
        out_lines = out.splitlines()
        self.assertEqual(out_lines[0], "importing")
        for n in range(6):
            for line in ("[r%d] start %d" % (n, n), "[r%d] partial line %d" % (n, n), "[r%d] no newline %d" % (n, n)):
                self.assertIn(line, out_lines)
            self.assertIn("[r%d] err %d\n[r%d] two %d\n" % (n, n, n, n), err)
        for line in out_lines[1:]:
            rid, _, text = line.partition("] ")
            self.assertEqual(rid[2:], text.split()[-1], line)


class OutputBeforeAnswerTest(unittest.TestCase):
    """The platform collects a request's output from the pipes once it has the answer, so all
    of it must be in them before the answer is sent."""

    HANDLERS = {
        "handler.py": """
        import sys

        def _print(event, rid):
            sys.stdout.write(("x" * 1023 + "\\n") * 4096)
            sys.stderr.write("last line of %s\\n" % rid)
            print("no newline", end="")
            if event["raise"]:
                raise ValueError("after printing")
            return "printed"

        def handle(event, context):
            return _print(event, context.request_id)

        async def handle_async(event, context):
            return _print(event, context.request_id)
        """
    }

    def check(self, entrypoint, unbuffered):
        shim = Shim(self.HANDLERS, entrypoint=entrypoint)
        if unbuffered:
            shim.env["PYTHONUNBUFFERED"] = "1"
        else:
            shim.env.pop("PYTHONUNBUFFERED", None)
        shim.start()
        out = shim.proc.stdout.fileno()
        try:
            shim.wait_ready()
            for raised in (False, True):
                rid = "raised" if raised else "returned"
                sock = shim.raw()
                sock.sendall(invoke_request({"raise": raised}, b"x-sless-request-id: %s\r\n" % rid.encode()))
                # One thread reads both the pipe (the shim may block writing to it) and the
                # answer, so no byte is ever between the two counts.
                got, answer = 0, b""
                while True:
                    head, sep, rest = answer.partition(b"\r\n\r\n")
                    if sep:
                        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                        if len(rest) >= length:
                            break
                    readable, _, _ = select.select([sock, out], [], [], START_TIMEOUT_S)
                    self.assertTrue(readable, "no answer in time")
                    if out in readable:
                        got += len(os.read(out, 1 << 16))
                    if sock in readable:
                        chunk = sock.recv(1 << 16)
                        self.assertTrue(chunk, "connection closed before the answer")
                        answer += chunk
                sock.close()
                waiting = array.array("i", [0])
                fcntl.ioctl(out, termios.FIONREAD, waiting)
                self.assertTrue(answer.startswith(b"HTTP/1.1 500" if raised else b"HTTP/1.1 200"), answer)
                prefix = len("[%s] " % rid)
                total = 4096 * (prefix + 1024) + prefix + len("no newline\n")
                self.assertEqual(got + waiting[0], total, "written before the answer")
                self.assertIn("[%s] last line of %s\n" % (rid, rid), shim.stderr_text())
                # Take what is left, so the next round counts only its own.
                while waiting[0] > 0:
                    waiting[0] -= len(os.read(out, waiting[0]))
        finally:
            shim.stop()

    def test_sync_handler(self):
        for unbuffered in (True, False):
            with self.subTest(unbuffered=unbuffered):
                self.check("handler.handle", unbuffered)

    def test_async_handler(self):
        for unbuffered in (True, False):
            with self.subTest(unbuffered=unbuffered):
                self.check("handler.handle_async", unbuffered)


class ServingFailureTest(unittest.TestCase):
    """A failure of the server itself (not of a handler) ends the process, so the platform can
    replace an instance that would otherwise accept requests and never answer them."""

    BREAKS_THE_SERVER = """
        import __main__
        def handle(event):
            # The shim runs as __main__; removing its response builder breaks the serving loop.
            __main__.build_response = None
            return "unreachable"
        """

    def test_a_broken_serving_loop_exits_with_status_4(self):
        for label, source in (
            ("plain", self.BREAKS_THE_SERVER),
            ("async", self.BREAKS_THE_SERVER.replace("def handle", "async def handle")),
        ):
            with self.subTest(kind=label):
                shim = Shim({"handler.py": source}).start()
                try:
                    shim.wait_ready()
                    with self.assertRaises((http.client.HTTPException, OSError)):
                        shim.invoke({})
                    self.assertEqual(shim.proc.wait(timeout=10), 4)
                    self.assertIn("sless: serving loop failed; exiting", shim.stderr_text())
                finally:
                    shim.stop()


class LongLineTest(unittest.TestCase):
    def test_a_line_without_newline_is_passed_on_in_pieces(self):
        shim = Shim(
            {
                "handler.py": """
                import sys
                def handle(event):
                    for _ in range(40):
                        sys.stdout.write("x" * 1000)
                    return "ok"
                """
            }
        ).start()
        try:
            shim.wait_ready()
            self.assertEqual(shim.invoke({}, {"x-sless-request-id": "r1"})[::2], (200, "ok"))
            shim.stop_keep_logs()
            lines = shim.proc.stdout.read().decode().splitlines()
        finally:
            shim.stop()
        self.assertEqual(
            lines, ["[r1] " + "x" * 8192] * 4 + ["[r1] " + "x" * (40000 - 4 * 8192)]
        )


class ShutdownTest(unittest.TestCase):
    SLOW_HANDLERS = {
        "plain": """
            import time
            def handle(event):
                print("started", flush=False)
                time.sleep(0.5)
                return "done"
            """,
        "async": """
            import asyncio
            async def handle(event):
                print("started", flush=False)
                await asyncio.sleep(0.5)
                return "done"
            """,
    }

    def test_sigterm_finishes_in_flight_request_then_exits_0(self):
        for kind, source in self.SLOW_HANDLERS.items():
            with self.subTest(kind=kind):
                self.check_graceful_shutdown(source)

    def check_graceful_shutdown(self, source):
        shim = Shim({"handler.py": source}).start()
        try:
            shim.wait_ready()
            # An idle keep-alive connection must not hold up the exit.
            idle = shim.raw()
            idle.sendall(b"GET /_sless/ready HTTP/1.1\r\nHost: x\r\n\r\n")
            self.assertEqual(read_response(idle)[0], 200)
            result = []
            t = threading.Thread(target=lambda: result.append(shim.invoke({})[::2]))
            t.start()
            # The handler's print arrives while it still runs: stdout is line-buffered.
            self.assertEqual(shim.proc.stdout.readline(), b"[req-1] started\n")
            shim.proc.send_signal(signal.SIGTERM)
            t.join()
            self.assertEqual(result, [(200, "done")])
            self.assertEqual(shim.proc.wait(timeout=10), 0)
            self.assertFalse(os.path.exists(shim.socket))
            with self.assertRaises(OSError):
                shim.raw()
            self.assertEqual(idle.recv(10), b"")
            idle.close()
        finally:
            shim.stop()


if __name__ == "__main__":
    unittest.main()
