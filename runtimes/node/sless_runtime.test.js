// Tests for the sless Node.js runtime shim: runs it as a subprocess on a temporary Unix socket.
//
// Run with: node --test runtimes/node/
'use strict';

const { test, describe, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const fs = require('node:fs');
const http = require('node:http');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');

const SHIM = path.join(__dirname, 'sless_runtime.js');

function writeTree(root, files) {
  for (const [name, text] of Object.entries(files)) {
    const file = path.join(root, name);
    fs.mkdirSync(path.dirname(file), { recursive: true });
    fs.writeFileSync(file, text);
  }
}

// Shims still running. If the test run dies early (interrupted, or its output pipe closed),
// they die with it instead of lingering.
const live = new Set();
function reapShims() {
  for (const child of live) child.kill('SIGKILL');
}
process.on('exit', reapShims);
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
  process.once(sig, () => {
    reapShims();
    process.kill(process.pid, sig);
  });
}

/** One shim process with its own code dir and socket; fd 3 of the child is the ready pipe. */
const LISTEN_LAUNCHER = `
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1])
s.listen(8)
if s.fileno() != 4:
    os.dup2(s.fileno(), 4)
os.set_inheritable(4, True)
os.execv(sys.argv[2], sys.argv[2:])
`;

class Shim {
  constructor(files, { entrypoint = 'handler.handle', deps = null, args = [], identity = true, inherit = false } = {}) {
    this.dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sless-node-'));
    this.code = path.join(this.dir, 'code');
    this.deps = path.join(this.dir, 'deps');
    this.socket = path.join(this.dir, 'fn.sock');
    fs.mkdirSync(this.code, { recursive: true });
    writeTree(this.code, files);
    if (deps) writeTree(this.deps, deps);
    this.stderr = '';
    this.stdout = '';
    this.ready = '';
    // `inherit`: the platform's way, a listening socket made outside and passed as fd 4
    // (SLESS_LISTEN_FD). A small Python launcher binds it and execs node with it.
    const [command, commandArgs] = inherit
      ? ['/usr/bin/python3', ['-c', LISTEN_LAUNCHER, this.socket, process.execPath, SHIM, ...args]]
      : [process.execPath, [SHIM, ...args]];
    this.child = spawn(command, commandArgs, {
      cwd: this.code,
      env: {
        ...process.env,
        SLESS_CODE_DIR: this.code,
        SLESS_DEPS_DIR: this.deps,
        SLESS_SOCKET: this.socket,
        SLESS_ENTRYPOINT: entrypoint,
        SLESS_CONCURRENCY: '8',
        SLESS_NAMESPACE: 'team-a',
        SLESS_FUNCTION: 'hello',
        SLESS_REVISION: '7',
        SLESS_READY_FD: '3',
        ...(identity ? {} : { SLESS_NAMESPACE: '', SLESS_FUNCTION: '', SLESS_REVISION: '' }),
        ...(inherit ? { SLESS_SOCKET: '', SLESS_LISTEN_FD: '4' } : {}),
      },
      stdio: ['ignore', 'pipe', 'pipe', 'pipe'],
    });
    this.child.stdout.on('data', (d) => (this.stdout += d));
    this.child.stderr.on('data', (d) => (this.stderr += d));
    this.exited = new Promise((resolve) => this.child.on('exit', (code) => resolve(code)));
    live.add(this.child);
    this.exited.then(() => live.delete(this.child));
    // Resolves with everything written to fd 3 once the shim closes it (or exits).
    this.readyClosed = new Promise((resolve) => {
      this.child.stdio[3].on('data', (d) => (this.ready += d));
      this.child.stdio[3].on('close', () => resolve(this.ready));
    });
    this.agent = new http.Agent({ keepAlive: true, maxSockets: 64 });
  }

  async waitReady() {
    const ready = await this.readyClosed;
    assert.equal(ready, 'ready\n', `shim not ready; stderr:\n${this.stderr}`);
  }

  request(method, urlPath, body, headers = {}) {
    return new Promise((resolve, reject) => {
      const req = http.request(
        { socketPath: this.socket, method, path: urlPath, headers, agent: this.agent },
        (res) => {
          const chunks = [];
          res.on('data', (c) => chunks.push(c));
          res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks).toString() }));
        },
      );
      req.on('error', reject);
      req.end(body);
    });
  }

  async invoke(event, headers = {}) {
    const body = JSON.stringify(event);
    const res = await this.request('POST', '/_sless/invoke', body, {
      'content-type': 'application/json',
      'content-length': Buffer.byteLength(body),
      'x-sless-request-id': 'req-1',
      'x-sless-source': 'invoke',
      ...headers,
    });
    return { status: res.status, type: res.headers['content-type'], body: JSON.parse(res.body) };
  }

  async stop() {
    this.agent.destroy();
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill('SIGTERM');
    const code = await this.exited;
    fs.rmSync(this.dir, { recursive: true, force: true });
    return code;
  }
}

/** Sends raw bytes on a fresh connection and collects `count` responses. */
function rawExchange(socketPath, payload, count) {
  return new Promise((resolve, reject) => {
    const sock = net.connect(socketPath);
    let buf = Buffer.alloc(0);
    const responses = [];
    sock.on('data', (d) => {
      buf = Buffer.concat([buf, d]);
      for (;;) {
        const end = buf.indexOf('\r\n\r\n');
        if (end < 0) break;
        const head = buf.subarray(0, end).toString('latin1');
        const m = /content-length:\s*(\d+)/i.exec(head);
        const len = m ? Number(m[1]) : 0;
        if (buf.length < end + 4 + len) break;
        responses.push({
          status: Number(head.split(' ')[1]),
          head,
          body: buf.subarray(end + 4, end + 4 + len).toString(),
        });
        buf = buf.subarray(end + 4 + len);
      }
      if (responses.length >= count) {
        sock.end();
        resolve(responses);
      }
    });
    sock.on('error', reject);
    sock.write(payload);
  });
}

function invokeRequest(event) {
  const body = JSON.stringify(event);
  return `POST /_sless/invoke HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;
}

const HANDLER = `
exports.handle = async (event, context) => {
  switch (event && event.kind) {
    case 'dict': return { a: 1, nested: { b: [1, 2] } };
    case 'list': return [1, 'two', null];
    case 'str': return 'hello';
    case 'num': return 42;
    case 'none': return undefined;
    case 'null': return null;
    case 'buffer': return Buffer.from('café');
    case 'bigint': return 10n;
    case 'fn': return () => 1;
    case 'deep': { let v = []; for (let i = 0; i < 1e6; i++) v = [v]; return v; }
    case 'circular': { const v = []; v.push(v); return v; }
    case 'raise': throw new Error('boom: ' + event.n);
    case 'raise-string': throw 'plain string';
    case 'reject': return Promise.reject(new TypeError('rejected'));
    case 'sleep': await new Promise((r) => setTimeout(r, event.ms)); return 'slept';
    case 'context': return {
      request_id: context.request_id, source: context.source, function_name: context.function_name,
      namespace: context.namespace, revision: context.revision, deadline_ms: context.deadline_ms,
      remaining_ms: context.remaining_ms(),
    };
    case 'message': return { message: context.message ?? null, attempt: context.attempt ?? null };
    default: return event;
  }
};
exports.syncHandle = (event) => ({ sync: event });
exports.notAFunction = 5;
`;

describe('running shim', () => {
  let shim;
  before(async () => {
    shim = new Shim({ 'handler.js': HANDLER });
    await shim.waitReady();
  });
  after(async () => {
    assert.equal(await shim.stop(), 0);
  });

  test('ready endpoint answers ok', async () => {
    const res = await shim.request('GET', '/_sless/ready');
    assert.deepEqual([res.status, res.body], [200, 'ok']);
  });

  test('results are JSON', async () => {
    const cases = {
      dict: { a: 1, nested: { b: [1, 2] } },
      list: [1, 'two', null],
      str: 'hello',
      num: 42,
      none: null,
      null: null,
      buffer: 'café',
    };
    for (const [kind, expected] of Object.entries(cases)) {
      const res = await shim.invoke({ kind });
      assert.equal(res.status, 200, kind);
      assert.equal(res.type, 'application/json');
      assert.deepEqual(res.body, expected, kind);
    }
  });

  test('unserializable results are errors', async () => {
    const big = await shim.invoke({ kind: 'bigint' });
    assert.equal(big.status, 500);
    assert.match(big.body.error, /^result is not JSON serializable: /);
    assert.deepEqual(await shim.invoke({ kind: 'fn' }), {
      status: 500,
      type: 'application/json',
      body: { error: 'result is not JSON serializable: function' },
    });
  });

  test('deeply nested events are 400 and the instance keeps serving', async () => {
    // 2 MB of brackets would otherwise become hundreds of megabytes of arrays.
    for (const body of ['['.repeat(2_000_000) + ']'.repeat(2_000_000), '{"a":'.repeat(5000) + '1' + '}'.repeat(5000)]) {
      const res = await shim.request('POST', '/_sless/invoke', body, { 'content-length': Buffer.byteLength(body) });
      assert.equal(res.status, 400);
      assert.deepEqual(JSON.parse(res.body), { error: 'invalid JSON event: nested too deeply' });
      assert.deepEqual((await shim.invoke({ kind: 'num' })).body, 42);
    }
    // Brackets inside strings are text, not nesting.
    const text = { kind: 'echo', s: '['.repeat(5000) };
    assert.deepEqual((await shim.invoke(text)).body, text);
  });

  test('results that cannot be encoded are errors and the instance keeps serving', async () => {
    assert.deepEqual((await shim.invoke({ kind: 'deep' })).body, {
      error: 'result is not JSON serializable: nested too deeply',
    });
    const circular = await shim.invoke({ kind: 'circular' });
    assert.equal(circular.status, 500);
    assert.match(circular.body.error, /circular/i);
    assert.deepEqual((await shim.invoke({ kind: 'num' })).body, 42);
  });

  test('throw and rejection are 500 and the instance keeps serving', async () => {
    assert.deepEqual((await shim.invoke({ kind: 'raise', n: 3 })).body, { error: 'boom: 3' });
    assert.equal((await shim.invoke({ kind: 'raise', n: 3 })).status, 500);
    assert.deepEqual(await shim.invoke({ kind: 'reject' }), {
      status: 500,
      type: 'application/json',
      body: { error: 'rejected' },
    });
    assert.deepEqual((await shim.invoke({ kind: 'raise-string' })).body, { error: 'plain string' });
    assert.match(shim.stderr, /Error: boom: 3\n\s+at /);
    assert.deepEqual((await shim.invoke({ kind: 'num' })).body, 42);
  });

  test('context carries identity and deadline', async () => {
    const deadline = Date.now() + 60_000;
    const res = await shim.invoke(
      { kind: 'context' },
      { 'x-sless-request-id': 'r-42', 'x-sless-source': 'cron', 'x-sless-deadline-ms': String(deadline) },
    );
    const { remaining_ms: remaining, ...rest } = res.body;
    assert.deepEqual(rest, {
      request_id: 'r-42',
      source: 'cron',
      function_name: 'hello',
      namespace: 'team-a',
      revision: '7',
      deadline_ms: deadline,
    });
    assert.ok(remaining > 50_000 && remaining <= 60_000, String(remaining));
    const none = await shim.invoke({ kind: 'context' });
    assert.deepEqual([none.body.deadline_ms, none.body.remaining_ms], [null, null]);
  });

  test('delivered messages reach the context', async () => {
    const message = {
      kind: 'amqp', topic: 'orders', key: 'k1', id: 'm-1', headers: { 'x-trace': 'caf\u00e9' }, attempt: 2,
    };
    // The platform sends the header as ASCII, with \uXXXX escapes.
    const ascii = JSON.stringify(message).replace(
      /[\u0080-\uffff]/g,
      (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`,
    );
    const res = await shim.invoke({ kind: 'message' }, { 'x-sless-source': 'queue', 'x-sless-message': ascii });
    assert.equal(res.status, 200);
    assert.deepEqual(res.body, { message, attempt: 2 });
    // Not a delivery: neither is set.
    assert.deepEqual((await shim.invoke({ kind: 'message' })).body, { message: null, attempt: null });
    // A header that is not JSON is no message.
    const bad = await shim.invoke({ kind: 'message' }, { 'x-sless-message': '{not json' });
    assert.deepEqual([bad.status, bad.body], [200, { message: null, attempt: null }]);
  });

  test('async handlers run concurrently', async () => {
    const started = Date.now();
    const results = await Promise.all(Array.from({ length: 10 }, () => shim.invoke({ kind: 'sleep', ms: 500 })));
    assert.deepEqual(results.map((r) => r.body), Array(10).fill('slept'));
    // Serially this takes 5 s.
    assert.ok(Date.now() - started < 2500);
  });

  test('keep-alive serves several requests on one connection', async () => {
    let payload = '';
    for (let n = 0; n < 5; n++) payload += invokeRequest({ kind: 'echo', n });
    const responses = await rawExchange(shim.socket, payload, 5);
    assert.deepEqual(
      responses.map((r) => [r.status, JSON.parse(r.body)]),
      [0, 1, 2, 3, 4].map((n) => [200, { kind: 'echo', n }]),
    );
    assert.doesNotMatch(responses[4].head, /connection: close/i);
  });

  test('pipelined requests are answered in order', async () => {
    const responses = await rawExchange(
      shim.socket,
      invokeRequest({ kind: 'sleep', ms: 200 }) + invokeRequest({ kind: 'echo', n: 2 }),
      2,
    );
    assert.deepEqual(
      responses.map((r) => JSON.parse(r.body)),
      ['slept', { kind: 'echo', n: 2 }],
    );
  });

  test('a 1 MiB body round-trips', async () => {
    const event = { kind: 'echo', data: 'x'.repeat(1024 * 1024) };
    const res = await shim.invoke(event);
    assert.equal(res.status, 200);
    assert.deepEqual(res.body, event);
  });

  test('invalid JSON is 400, unknown path 404, wrong method 405', async () => {
    const bad = await shim.request('POST', '/_sless/invoke', '{nope', { 'content-length': 5 });
    assert.equal(bad.status, 400);
    assert.match(JSON.parse(bad.body).error, /^invalid JSON event/);
    assert.equal((await shim.request('GET', '/elsewhere')).status, 404);
    assert.equal((await shim.request('GET', '/_sless/invoke')).status, 405);
  });

  test('requests the protocol does not allow are refused and the connection closed', async () => {
    const cases = [
      ['POST /_sless/invoke HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n', 411],
      ['NONSENSE\r\n\r\n', 400],
      ['GET /_sless/ready HTTP/2.0\r\n\r\n', 505],
      ['POST /_sless/invoke HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}', 400],
      [`GET /_sless/ready HTTP/1.1\r\nX-Big: ${'a'.repeat(70 * 1024)}\r\n\r\n`, 431],
    ];
    for (const [payload, status] of cases) {
      const [res] = await rawExchange(shim.socket, payload, 1);
      assert.equal(res.status, status, payload.slice(0, 60));
      assert.match(res.head, /connection: close/i);
    }
  });

  test('Expect: 100-continue is answered before the body, and HTTP/1.0 closes', async () => {
    const body = JSON.stringify({ kind: 'echo', n: 7 });
    const head = `POST /_sless/invoke HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: ${body.length}\r\n\r\n`;
    const got = await new Promise((resolve, reject) => {
      const sock = net.connect(shim.socket, () => sock.write(head));
      let text = '';
      sock.on('data', (d) => {
        text += d.toString();
        if (text === 'HTTP/1.1 100 Continue\r\n\r\n') sock.write(body);
        if (text.endsWith(body)) {
          sock.end();
          resolve(text);
        }
      });
      sock.on('error', reject);
    });
    assert.match(got, /^HTTP\/1.1 100 Continue\r\n\r\nHTTP\/1.1 200 OK\r\n/);
    const [old] = await rawExchange(shim.socket, 'GET /_sless/ready HTTP/1.0\r\n\r\n', 1);
    assert.equal(old.status, 200);
    assert.match(old.head, /connection: close/i);
  });
});

describe('loading', () => {
  async function runToExit(files, opts) {
    const shim = new Shim(files, opts);
    const code = await shim.exited;
    const ready = await shim.readyClosed;
    await shim.stop();
    return { code, stderr: shim.stderr, ready };
  }

  test('missing module exits 3 naming it', async () => {
    const r = await runToExit({ 'other.js': 'exports.handle = () => 1;' });
    assert.equal(r.code, 3);
    assert.equal(r.ready, '');
    assert.match(r.stderr, /sless: entrypoint module "handler" not found \(no handler\.js\)/);
  });

  test('missing function exits 3 naming it', async () => {
    const r = await runToExit({ 'handler.js': 'exports.other = () => 1;' });
    assert.equal(r.code, 3);
    assert.match(r.stderr, /sless: entrypoint function "handle" not found in module "handler"/);
  });

  test('non-function export exits 3', async () => {
    const r = await runToExit({ 'handler.js': HANDLER }, { entrypoint: 'handler.notAFunction' });
    assert.equal(r.code, 3);
    assert.match(r.stderr, /entrypoint "handler.notAFunction" is not callable \(it is a number\)/);
  });

  test('exception at load time exits 3 with stack', async () => {
    const r = await runToExit({ 'handler.js': "throw new Error('bad config');" });
    assert.equal(r.code, 3);
    assert.match(r.stderr, /handler\.js:1/);
    assert.match(r.stderr, /sless: entrypoint module "handler" failed to import: Error: bad config/);
  });

  test('a missing dependency is an import failure, not a missing entrypoint', async () => {
    const r = await runToExit({ 'handler.js': "require('not-installed-anywhere');" });
    assert.equal(r.code, 3);
    assert.match(r.stderr, /failed to import: Error: Cannot find module 'not-installed-anywhere'/);
    assert.doesNotMatch(r.stderr, /not found \(no/);
  });

  test('--check succeeds silently', async () => {
    const r = await runToExit({ 'handler.js': HANDLER }, { args: ['--check'] });
    assert.deepEqual([r.code, r.stderr, r.ready], [0, '', '']);
  });

  test('--check fails like startup', async () => {
    const r = await runToExit({ 'handler.js': 'exports.x = 1;' }, { args: ['--check'] });
    assert.equal(r.code, 3);
    assert.match(r.stderr, /entrypoint function "handle" not found in module "handler"/);
  });

  test('modules resolve from <deps>/node_modules; sync handlers and nested paths work', async () => {
    const shim = new Shim(
      { 'lib/api.js': "const h = require('helper'); exports.run = (e) => h.shout(e);" },
      { entrypoint: 'lib/api.run', deps: { 'node_modules/helper/index.js': 'exports.shout = (s) => s.toUpperCase();' } },
    );
    try {
      await shim.waitReady();
      assert.deepEqual((await shim.invoke('hi')).body, 'HI');
    } finally {
      await shim.stop();
    }
  });

  test('ES module handlers are imported', async () => {
    const shim = new Shim({ 'handler.mjs': 'await Promise.resolve();\nexport async function handle(e) { return { esm: e }; }' });
    try {
      await shim.waitReady();
      assert.deepEqual((await shim.invoke(1)).body, { esm: 1 });
    } finally {
      await shim.stop();
    }
  });
});

describe('inherited listening socket', () => {
  for (const entrypoint of ['handler.handle', '']) {
    test(`serves on SLESS_LISTEN_FD and leaves the socket file (${entrypoint || 'generic'})`, async () => {
      const shim = new Shim({ 'handler.js': HANDLER }, { entrypoint, inherit: true });
      await shim.waitReady();
      const ready = await shim.request('GET', '/_sless/ready');
      assert.deepEqual([ready.status, ready.body], [200, 'ok']);
      if (entrypoint) assert.equal((await shim.invoke({ n: 1 })).status, 200);
      shim.agent.destroy();
      shim.child.kill('SIGTERM');
      assert.equal(await shim.exited, 0, shim.stderr);
      // The socket file is the platform's; the warm-up's own socket is gone.
      assert.ok(fs.statSync(shim.socket).isSocket());
      assert.deepEqual(
        fs.readdirSync(os.tmpdir()).filter((n) => n === `.sless-warm-up-${shim.child.pid}.sock`),
        [],
      );
      await shim.stop();
    });
  }
});

describe('generic instance', () => {
  const LOAD = {
    entrypoint: 'handler.handle',
    env: { GREETING: 'hej' },
    namespace: 'team-b',
    function: 'late',
    revision: 3,
    concurrency: 4,
  };

  async function startGeneric() {
    const shim = new Shim({}, { entrypoint: '', identity: false });
    await shim.waitReady();
    return shim;
  }

  function load(shim, body = LOAD) {
    return shim.request('POST', '/_sless/load', JSON.stringify(body), { 'content-type': 'application/json' });
  }

  test('load, then invoke with the env and identity from the load', async () => {
    const shim = await startGeneric();
    try {
      const ready = await shim.request('GET', '/_sless/ready');
      assert.deepEqual([ready.status, ready.body], [200, 'ok']);
      assert.deepEqual(await shim.invoke({}), { status: 503, type: 'application/json', body: { error: 'no function loaded' } });
      // The platform fills the code dir only now, after the instance started; the dependency
      // comes from <deps>/node_modules, which did not exist at startup either.
      writeTree(shim.code, {
        'handler.js': `const helper = require('helper');
const atImport = process.env.GREETING;
exports.handle = (event, context) => ({
  atImport, entrypoint: process.env.SLESS_ENTRYPOINT, shout: helper.shout('x'),
  function: context.function_name, namespace: context.namespace, revision: context.revision, event,
});`,
      });
      writeTree(shim.deps, { 'node_modules/helper/index.js': 'exports.shout = (s) => s.toUpperCase();' });
      const res = await load(shim);
      assert.deepEqual([res.status, JSON.parse(res.body)], [200, { ok: true }]);
      assert.deepEqual((await shim.invoke(5)).body, {
        atImport: 'hej',
        entrypoint: 'handler.handle',
        shout: 'X',
        function: 'late',
        namespace: 'team-b',
        revision: '3',
        event: 5,
      });
      assert.equal((await load(shim)).status, 409);
      assert.equal((await shim.invoke(6)).status, 200);
    } finally {
      assert.equal(await shim.stop(), 0);
    }
  });

  test('load of a missing module is 500, then exit 3', async () => {
    const shim = await startGeneric();
    const res = await load(shim);
    assert.deepEqual([res.status, JSON.parse(res.body)], [
      500,
      { error: 'entrypoint module "handler" not found (no handler.js)' },
    ]);
    assert.equal(await shim.exited, 3);
    assert.match(shim.stderr, /sless: entrypoint module "handler" not found \(no handler\.js\)/);
    await shim.stop();
  });
});

describe('log lines', () => {
  test('lines written while handling a request start with its id', async () => {
    const shim = new Shim({
      'handler.js': `console.log('importing');
exports.handle = async (event) => {
  const n = event.n;
  console.log('start', n);
  process.stdout.write('partial ');
  await new Promise((r) => setTimeout(r, 30 + 10 * (n % 3)));
  process.stdout.write('line ' + n + '\\n');
  console.error('err ' + n + '\\ntwo ' + n);
  setTimeout(() => process.stdout.write('no newline ' + n), 1);
  await new Promise((r) => setTimeout(r, 20));
  return n;
};`,
    });
    try {
      await shim.waitReady();
      await Promise.all([0, 1, 2, 3, 4, 5].map((n) => shim.invoke({ n }, { 'x-sless-request-id': `r${n}` })));
    } finally {
      assert.equal(await shim.stop(), 0);
    }
    const lines = shim.stdout.split('\n').filter(Boolean);
    assert.equal(lines[0], 'importing');
    for (let n = 0; n < 6; n++) {
      for (const line of [`[r${n}] start ${n}`, `[r${n}] partial line ${n}`, `[r${n}] no newline ${n}`]) {
        assert.ok(lines.includes(line), `${line} in\n${shim.stdout}`);
      }
      assert.ok(shim.stderr.includes(`[r${n}] err ${n}\n[r${n}] two ${n}\n`), shim.stderr);
    }
    for (const line of lines.slice(1)) {
      const m = /^\[r(\d)\] .* (\d)$/.exec(line);
      assert.ok(m && m[1] === m[2], line);
    }
  });
});

describe('output and answers', () => {
  test('everything a handler printed is in the pipes before its answer is sent', async () => {
    // 4 MiB per stream: far more than a pipe holds, so Node must queue most of it.
    const shim = new Shim({
      'handler.js': `exports.handle = async (event) => {
  const text = ('x'.repeat(1023) + '\\n').repeat(4096);
  process.stdout.write(text);
  process.stderr.write(text);
  if (event.raise) throw new Error('after printing');
  return 'printed';
};`,
    });
    const perStream = (rid) => 4096 * (`[${rid}] `.length + 1024);
    // What may still sit in a pipe (its capacity is 64 KiB unless raised, at most 1 MiB).
    const inPipe = 1 << 20;
    try {
      await shim.waitReady();
      for (const raise of [false, true]) {
        const rid = raise ? 'raised' : 'returned';
        const [out, err] = [shim.stdout.length, shim.stderr.length];
        const answer = await shim.invoke({ raise }, { 'x-sless-request-id': rid });
        const read = [shim.stdout.length - out, shim.stderr.length - err];
        assert.equal(answer.status, raise ? 500 : 200);
        for (const n of read) {
          assert.ok(n >= perStream(rid) - inPipe, `only ${n} of ${perStream(rid)} bytes were written before the answer`);
        }
      }
    } finally {
      assert.equal(await shim.stop(), 0);
    }
  });
});

describe('serving failures', () => {
  test('a broken serving loop exits with status 4', async () => {
    const shim = new Shim({
      'handler.js': `exports.handle = async () => {
  // Breaks how the shim frames its answer, i.e. the server itself.
  Buffer.byteLength = () => { throw new Error('framing is broken'); };
  return 'unreachable';
};`,
    });
    await shim.waitReady();
    await assert.rejects(shim.invoke({}));
    assert.equal(await shim.exited, 4);
    assert.match(shim.stderr, /sless: serving loop failed; exiting\nError: framing is broken/);
    await shim.stop();
  });

  test('a line without a newline is passed on in pieces', async () => {
    const shim = new Shim({
      'handler.js': `exports.handle = async () => {
  for (let i = 0; i < 40; i++) process.stdout.write('x'.repeat(1000));
  return 'ok';
};`,
    });
    await shim.waitReady();
    assert.deepEqual((await shim.invoke({}, { 'x-sless-request-id': 'r1' })).body, 'ok');
    assert.equal(await shim.stop(), 0);
    assert.deepEqual(shim.stdout.split('\n').filter(Boolean), [
      ...Array(4).fill(`[r1] ${'x'.repeat(8192)}`),
      `[r1] ${'x'.repeat(40000 - 4 * 8192)}`,
    ]);
  });
});

describe('shutdown', () => {
  test('SIGTERM lets the in-flight request finish, then exits 0', async () => {
    const shim = new Shim({
      'handler.js': `exports.handle = async () => {
        console.log('started');
        await new Promise((r) => setTimeout(r, 500));
        return 'done';
      };`,
    });
    await shim.waitReady();
    const pending = shim.invoke({});
    await new Promise((resolve) => {
      const check = () => (shim.stdout.includes('started\n') ? resolve() : shim.child.stdout.once('data', check));
      check();
    });
    shim.child.kill('SIGTERM');
    assert.deepEqual((await pending).body, 'done');
    assert.equal(await shim.exited, 0);
    assert.equal(fs.existsSync(shim.socket), false);
    await shim.stop();
  });
});
