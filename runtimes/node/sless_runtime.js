#!/usr/bin/env node
// sless Node.js runtime shim: serves one function over the sless instance protocol.
//
// The platform starts this file inside the sandbox (see docs/instance-protocol.md). It loads the
// entrypoint, listens with HTTP/1.1 on the Unix socket SLESS_SOCKET, writes "ready\n" to
// SLESS_READY_FD and then calls the handler once per `POST /_sless/invoke`.
//
// HTTP is a small hand-written HTTP/1.1 server on node:net rather than node:http, as in the
// Python shim: the only client is the platform's connection pool, so the server needs keep-alive,
// Content-Length bodies and in-order answers per connection, and nothing else. node:http's
// request and response streams cost more per invocation than the rest of the shim together.
//
// CommonJS, no npm dependencies, Node 18+. `node sless_runtime.js --check` only loads the
// entrypoint; the builder uses it to validate a build. SLESS_CODE_DIR and SLESS_DEPS_DIR override
// /code and /deps so the shim can run outside the sandbox (tests, local runs).
'use strict';

const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const Module = require('node:module');
const { pathToFileURL } = require('node:url');
const { AsyncLocalStorage } = require('node:async_hooks');

// Exit status for an entrypoint that cannot be loaded; the platform reports it as a load error
// rather than a crash.
const EXIT_LOAD_ERROR = 3;
// Exit status when the serving loop itself failed (not a handler: those are answered with 500).
// An instance that cannot serve must not look alive, so the shim exits and the platform starts
// a replacement.
const EXIT_SERVE_ERROR = 4;
// Events nested deeper than this are refused before parsing. JSON.parse builds any depth, and a
// few megabytes of `[` become hundreds of megabytes of arrays; the platform itself never sends
// more than 128 levels of a request body.
const MAX_EVENT_DEPTH = 1000;
// Largest result body; the platform refuses larger responses, so the shim says why instead.
const MAX_RESULT_BYTES = 256 * 1024 * 1024;
// A line a handler writes without a newline is passed on in pieces of this many characters, so
// an endless line costs neither the instance nor the platform unbounded memory.
const MAX_LINE_CHARS = 8 * 1024;
const DEFAULT_ENTRYPOINT = 'handler.handle';
// How long in-flight requests may run after SIGTERM before the process exits anyway.
const SHUTDOWN_GRACE_MS = 10_000;

/** The entrypoint cannot be loaded; `message` is the one-line reason the protocol asks for. */
class LoadError extends Error {}

function log(message) {
  process.stderr.write(`sless: ${message}\n`);
}

// The id of the request whose handler (or anything it started) is running; undefined outside.
const requestIds = new AsyncLocalStorage();

/**
 * Makes every line written to `stream` while a request is handled start with `[<request id>] `.
 * A partial line is held per request until its newline arrives (or the request ends), so a
 * prefix never lands mid-line. Outside requests writes pass straight through.
 */
function tagStream(stream) {
  const write = stream.write.bind(stream);
  const partial = new Map(); // request id -> unfinished line
  stream.write = function taggedWrite(chunk, encoding, callback) {
    const rid = requestIds.getStore();
    if (rid === undefined) return write(chunk, encoding, callback);
    if (typeof encoding === 'function') {
      callback = encoding;
      encoding = undefined;
    }
    let text = typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString('utf8');
    const pending = partial.get(rid);
    if (pending !== undefined) {
      partial.delete(rid);
      text = pending + text;
    }
    const last = text.lastIndexOf('\n');
    if (last < 0) {
      if (text.length > MAX_LINE_CHARS) {
        // An endless line: pass it on in pieces rather than hold it all.
        const cut = text.length - (text.length % MAX_LINE_CHARS);
        const pieces = [];
        for (let i = 0; i < cut; i += MAX_LINE_CHARS) pieces.push(`[${rid}] ${text.slice(i, i + MAX_LINE_CHARS)}\n`);
        write(pieces.join(''));
        text = text.slice(cut);
      }
      if (text) partial.set(rid, text);
      if (callback) process.nextTick(callback);
      return true;
    }
    if (last < text.length - 1) partial.set(rid, text.slice(last + 1));
    const prefix = `[${rid}] `;
    return write(prefix + text.slice(0, last).replaceAll('\n', `\n${prefix}`) + '\n', callback);
  };
  return (rid) => {
    const rest = partial.get(rid);
    if (rest !== undefined) {
      partial.delete(rid);
      write(`[${rid}] ${rest}\n`);
    }
  };
}

/** Makes `require('x')` from the function's code find packages in `<deps>/node_modules`. */
function setupModulePaths(depsDir) {
  const nodeModules = path.join(depsDir, 'node_modules');
  if (!fs.existsSync(nodeModules)) return;
  const existing = process.env.NODE_PATH ? process.env.NODE_PATH.split(path.delimiter) : [];
  if (existing.includes(nodeModules)) {
    Module._initPaths();
    return;
  }
  process.env.NODE_PATH = [nodeModules, ...existing].join(path.delimiter);
  // NODE_PATH is read once at startup; re-reading it is the documented-in-source way to change
  // the global lookup paths of an already running process.
  Module._initPaths();
}

function describe(err) {
  if (err instanceof Error) return err.message ? `${err.name}: ${err.message}` : err.name;
  return String(err);
}

/** Resolves the entrypoint module like `require` does, plus `.mjs`/`.cjs`; null when absent. */
function resolveModule(target) {
  try {
    return require.resolve(target);
  } catch (err) {
    if (!err || err.code !== 'MODULE_NOT_FOUND') throw err;
  }
  for (const ext of ['.mjs', '.cjs']) {
    if (fs.existsSync(target + ext)) return target + ext;
  }
  return null;
}

/**
 * Loads `module.function` (the module path is relative to the code dir; `handler` is
 * `handler.js`, `lib/handler` is `lib/handler.js`) and returns the function.
 * ES modules are loaded with `import()` when `require` refuses them.
 */
async function loadEntrypoint(spec, codeDir) {
  const dot = spec.lastIndexOf('.');
  const moduleName = dot > 0 ? spec.slice(0, dot) : '';
  const funcName = dot > 0 ? spec.slice(dot + 1) : '';
  if (!moduleName || !funcName) {
    throw new LoadError(`invalid entrypoint "${spec}" (expected module.function)`);
  }
  const target = path.resolve(codeDir, moduleName);
  const resolved = resolveModule(target);
  if (resolved === null) {
    throw new LoadError(`entrypoint module "${moduleName}" not found (no ${moduleName}.js)`);
  }
  let mod;
  try {
    try {
      mod = require(resolved);
    } catch (err) {
      // An ES module: Node before 20.19 refuses to require it at all, later ones only when it
      // uses top-level await.
      if (!err || (err.code !== 'ERR_REQUIRE_ESM' && err.code !== 'ERR_REQUIRE_ASYNC_MODULE')) throw err;
      mod = await import(pathToFileURL(resolved).href);
    }
  } catch (err) {
    process.stderr.write(`${(err && err.stack) || String(err)}\n`);
    throw new LoadError(`entrypoint module "${moduleName}" failed to import: ${describe(err)}`);
  }
  let fn = mod == null ? undefined : mod[funcName];
  if (fn === undefined && mod != null && mod.default != null && typeof mod.default === 'object') {
    // An ES module importing a CommonJS-style object as its default export.
    fn = mod.default[funcName];
  }
  if (fn === undefined) {
    throw new LoadError(`entrypoint function "${funcName}" not found in module "${moduleName}"`);
  }
  if (typeof fn !== 'function') {
    throw new LoadError(`entrypoint "${spec}" is not callable (it is a ${typeof fn})`);
  }
  return fn;
}

/** The handler's second argument: who is calling and until when. */
class Context {
  constructor(requestId, source, identity, deadlineMs, message) {
    this.request_id = requestId;
    this.source = source;
    this.function_name = identity.functionName;
    this.namespace = identity.namespace;
    this.revision = identity.revision;
    this.deadline_ms = deadlineMs;
    // A delivered message (queue and device triggers, async calls) and which attempt this is.
    this.message = message ?? undefined;
    const attempt = message !== null && typeof message === 'object' ? message.attempt : undefined;
    this.attempt = Number.isInteger(attempt) ? attempt : undefined;
  }

  /** Milliseconds left until the deadline (never negative), or null when there is none. */
  remaining_ms() {
    if (this.deadline_ms === null) return null;
    return Math.max(0, this.deadline_ms - Date.now());
  }
}

function errorBody(message) {
  return JSON.stringify({ error: message });
}

function errorMessage(err) {
  if (err != null && typeof err.message === 'string' && err.message) return err.message;
  try {
    return String(err);
  } catch {
    return 'error';
  }
}

const utf8 = new TextDecoder('utf-8', { fatal: true });

/** Returns `[status, body]` for a handler's return value. */
function encodeResult(result) {
  let value = result === undefined ? null : result;
  try {
    if (value instanceof Uint8Array) {
      // Bytes become their UTF-8 text, as in the Python runtime.
      value = utf8.decode(value);
    }
    const body = JSON.stringify(value);
    if (body === undefined) {
      return [500, errorBody(`result is not JSON serializable: ${typeof value}`)];
    }
    // Characters, not bytes: a cheap bound first, the exact size only near the limit.
    if (body.length * 3 > MAX_RESULT_BYTES) {
      const bytes = Buffer.byteLength(body, 'utf8');
      if (bytes > MAX_RESULT_BYTES) {
        return [500, errorBody(`result is too large: ${bytes} bytes (at most ${MAX_RESULT_BYTES})`)];
      }
    }
    return [200, body];
  } catch (err) {
    if (err instanceof RangeError && /call stack/i.test(err.message)) {
      return [500, errorBody('result is not JSON serializable: nested too deeply')];
    }
    return [500, errorBody(`result is not JSON serializable: ${errorMessage(err)}`)];
  }
}

/** Whether the JSON text in `buf` opens more than `limit` arrays/objects at once. */
function nestedDeeperThan(buf, limit) {
  if (buf.length <= limit) return false;
  let depth = 0;
  let inString = false;
  for (let i = 0; i < buf.length; i++) {
    const c = buf[i];
    if (inString) {
      if (c === 0x5c) i++; // backslash: skip the escaped byte
      else if (c === 0x22) inString = false;
    } else if (c === 0x22) {
      inString = true;
    } else if (c === 0x5b || c === 0x7b) {
      if (++depth > limit) return true;
    } else if (c === 0x5d || c === 0x7d) {
      depth--;
    }
  }
  return false;
}

/** Decodes an invocation body; throws an Error whose message says why it is not an event. */
function decodeEvent(buf) {
  if (nestedDeeperThan(buf, MAX_EVENT_DEPTH)) throw new Error('nested too deeply');
  try {
    return JSON.parse(buf.toString('utf8'));
  } catch (err) {
    if (err instanceof RangeError) throw new Error('nested too deeply');
    throw err;
  }
}

/**
 * `context.message` from the `x-sless-message` header (JSON); undefined when it is absent or is
 * not JSON (the platform always sends JSON: anything else is not a message).
 */
function parseMessage(raw) {
  if (!raw) return undefined;
  try {
    return JSON.parse(raw);
  } catch {
    return undefined;
  }
}

function parseDeadline(raw) {
  if (raw === undefined || raw === '') return null;
  const n = Number(raw);
  return Number.isFinite(n) ? Math.trunc(n) : null;
}

const REASONS = {
  100: 'Continue',
  200: 'OK',
  400: 'Bad Request',
  404: 'Not Found',
  405: 'Method Not Allowed',
  409: 'Conflict',
  411: 'Length Required',
  431: 'Request Header Fields Too Large',
  500: 'Internal Server Error',
  503: 'Service Unavailable',
  505: 'HTTP Version Not Supported',
};

/** The whole response as one string: head and body go out in one write. */
function response(status, body, contentType = 'application/json', close = false) {
  return (
    `HTTP/1.1 ${status} ${REASONS[status] || 'Unknown'}\r\n` +
    `Content-Type: ${contentType}\r\nContent-Length: ${Buffer.byteLength(body, 'utf8')}\r\n` +
    (close ? 'Connection: close\r\n' : '') +
    `\r\n${body}`
  );
}

// A request head larger than this is refused; the platform's heads are a few hundred bytes.
const MAX_HEAD_BYTES = 64 * 1024;
// While a request runs, stop reading its connection once this much of the next one is buffered.
const MAX_BUFFERED_WHILE_BUSY = 256 * 1024;

/** A request the server refuses: answered with `status`, then the connection is closed. */
class HttpError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

/**
 * Parses a request head (without the blank line): `{ method, path, headers, keepAlive }`. Header
 * names are lowercased; a repeated header keeps its last value, except Content-Length, whose
 * copies must agree.
 */
function parseHead(text) {
  const lines = text.split('\r\n');
  const parts = lines[0].split(' ');
  if (parts.length !== 3) throw new HttpError(400, 'malformed request line');
  const [method, target, version] = parts;
  let keepAlive;
  if (version === 'HTTP/1.1') keepAlive = true;
  else if (version === 'HTTP/1.0') keepAlive = false;
  else if (version.startsWith('HTTP/')) throw new HttpError(505, 'unsupported HTTP version');
  else throw new HttpError(400, 'malformed request line');
  const headers = Object.create(null);
  for (let i = 1; i < lines.length; i++) {
    const line = lines[i];
    const colon = line.indexOf(':');
    if (colon <= 0 || line.charCodeAt(0) <= 32 || line.charCodeAt(colon - 1) <= 32) {
      throw new HttpError(400, 'malformed header line');
    }
    const name = line.slice(0, colon).toLowerCase();
    const value = line.slice(colon + 1).trim();
    if (name === 'content-length' && name in headers && headers[name] !== value) {
      throw new HttpError(400, 'conflicting Content-Length headers');
    }
    headers[name] = value;
  }
  const connection = headers.connection;
  if (connection !== undefined) {
    const tokens = connection.toLowerCase();
    if (tokens.includes('close')) keepAlive = false;
    else if (tokens.includes('keep-alive')) keepAlive = true;
  }
  const q = target.indexOf('?');
  return { method, path: q < 0 ? target : target.slice(0, q), headers, keepAlive };
}

function contentLength(headers) {
  if (headers['transfer-encoding'] !== undefined) {
    throw new HttpError(411, 'chunked request bodies are not supported; send Content-Length');
  }
  const raw = headers['content-length'];
  if (raw === undefined) return 0;
  if (!/^\d+$/.test(raw)) throw new HttpError(400, 'invalid Content-Length');
  return Number(raw);
}

function identityFromEnv() {
  return {
    functionName: process.env.SLESS_FUNCTION || '',
    namespace: process.env.SLESS_NAMESPACE || '',
    revision: process.env.SLESS_REVISION || '',
  };
}

/**
 * `POST /_sless/load` of a generic instance: applies the environment from the body and loads
 * the entrypoint into `app`. Returns `[status, body]`; after a failed load `app.failedLoad` is
 * set and the process exits with the load-error status once the answer is written.
 */
async function loadInto(app, raw) {
  if (app.fn !== null || app.loading) return [409, errorBody('a function is already loaded')];
  let spec;
  try {
    spec = raw.length > 0 ? JSON.parse(raw.toString('utf8')) : null;
  } catch (err) {
    return [400, errorBody(`invalid load request: ${err.message}`)];
  }
  if (spec === null || typeof spec !== 'object' || typeof spec.entrypoint !== 'string' || !spec.entrypoint) {
    return [400, errorBody('invalid load request: "entrypoint" (a string) is required')];
  }
  const env = spec.env == null ? {} : spec.env;
  if (typeof env !== 'object' || Array.isArray(env)) {
    return [400, errorBody('invalid load request: "env" must be an object')];
  }
  app.loading = true;
  for (const [key, value] of Object.entries(env)) process.env[key] = String(value);
  const fixed = {
    SLESS_ENTRYPOINT: spec.entrypoint,
    SLESS_NAMESPACE: spec.namespace,
    SLESS_FUNCTION: spec.function,
    SLESS_REVISION: spec.revision,
    SLESS_CONCURRENCY: spec.concurrency,
  };
  for (const [key, value] of Object.entries(fixed)) {
    if (value !== undefined && value !== null) process.env[key] = String(value);
  }
  try {
    setupModulePaths(app.depsDir);
    app.fn = await loadEntrypoint(spec.entrypoint, app.codeDir);
  } catch (err) {
    if (!(err instanceof LoadError)) process.stderr.write(`${(err && err.stack) || String(err)}\n`);
    const message = err instanceof LoadError ? err.message : describe(err);
    log(message);
    app.failedLoad = message;
    return [500, errorBody(message)];
  }
  app.identity = identityFromEnv();
  return [200, '{"ok":true}'];
}

/** Reports `err` and ends the process with EXIT_SERVE_ERROR; the platform replaces the instance. */
function fatal(what, err) {
  try {
    process.stderr.write(`sless: ${what}; exiting\n${(err && err.stack) || String(err)}\n`);
  } finally {
    process.exit(EXIT_SERVE_ERROR);
  }
}

function exitAfterFailedLoad(app) {
  try {
    // An inherited socket (no path) belongs to the platform.
    if (app.socketPath) fs.unlinkSync(app.socketPath);
  } catch {
    // Already gone.
  }
  process.exit(EXIT_LOAD_ERROR);
}

function makeServer(app) {
  const state = { inflight: 0, stopping: false, onDrained: null, conns: new Set() };

  /** Calls the handler; returns `[status, body]`. */
  async function invoke(request) {
    let event = null;
    if (request.body.length > 0) {
      try {
        event = decodeEvent(request.body);
      } catch (err) {
        return [400, errorBody(`invalid JSON event: ${errorMessage(err)}`)];
      }
    }
    const headers = request.headers;
    const requestId = headers['x-sless-request-id'] || '';
    const context = new Context(
      requestId,
      headers['x-sless-source'] || '',
      app.identity,
      parseDeadline(headers['x-sless-deadline-ms']),
      parseMessage(headers['x-sless-message']),
    );
    let status;
    let body;
    try {
      const result = requestId ? await requestIds.run(requestId, app.fn, event, context) : await app.fn(event, context);
      [status, body] = encodeResult(result);
      if (status !== 200) log(`request ${requestId || '-'}: ${body}`);
    } catch (err) {
      process.stderr.write(
        `sless: request ${requestId || '-'}: handler raised\n${(err && err.stack) || String(err)}\n`,
      );
      [status, body] = [500, errorBody(errorMessage(err))];
    }
    if (requestId) endRequestOutput(requestId);
    // The platform collects a request's output from the pipes once it has the answer, so
    // all of it must be in them first. Node queues what a pipe cannot take at once.
    if (process.stdout.writableLength > 0 || process.stderr.writableLength > 0) await outputWritten();
    return [status, body];
  }

  /** Answers one request: `[status, body, contentType]`, synchronously when it can. */
  function route(request) {
    const { method, path: p } = request;
    if (p === '/_sless/invoke') {
      if (method !== 'POST') return [405, errorBody('use POST')];
      if (app.fn === null) return [503, errorBody('no function loaded')];
      return invoke(request);
    }
    if (p === '/_sless/ready') {
      if (method !== 'GET') return [405, errorBody('use GET')];
      return [200, 'ok', 'text/plain'];
    }
    if (p === '/_sless/load') {
      if (method !== 'POST') return [405, errorBody('use POST')];
      return loadInto(app, request.body);
    }
    return [404, errorBody(`not found: ${p}`)];
  }

  /** Serves one connection: its requests are answered one after another, in order. */
  function serveConnection(socket) {
    state.conns.add(socket);
    let buf = null; // bytes received and not yet consumed (with `parts` after it)
    let parts = []; // chunks of a body still arriving, joined once it is complete
    let size = 0; // bytes in `buf` and `parts`
    let head = null; // the parsed head of a request whose body is still arriving
    let busy = false; // a request of this connection is being answered
    let ended = false; // the client will send nothing more
    let closed = false;

    const gather = () => {
      if (parts.length > 0) {
        buf = Buffer.concat(buf === null ? parts : [buf, ...parts]);
        parts = [];
      }
    };
    const consume = (n) => {
      buf = buf.length > n ? buf.subarray(n) : null;
      size = buf === null ? 0 : buf.length;
    };

    const nextRequest = () => {
      if (head === null) {
        if (size === 0) return null;
        gather();
        const end = buf.indexOf('\r\n\r\n');
        if (end < 0) {
          if (size > MAX_HEAD_BYTES) throw new HttpError(431, 'request head too large');
          return null;
        }
        if (end > MAX_HEAD_BYTES) throw new HttpError(431, 'request head too large');
        head = parseHead(buf.toString('latin1', 0, end));
        head.bodyLength = contentLength(head.headers);
        consume(end + 4);
        if (size < head.bodyLength && (head.headers.expect || '').toLowerCase() === '100-continue') {
          socket.write('HTTP/1.1 100 Continue\r\n\r\n');
        }
      }
      if (size < head.bodyLength) return null;
      const request = head;
      head = null;
      if (request.bodyLength === 0) {
        request.body = EMPTY;
      } else {
        gather();
        request.body = buf.subarray(0, request.bodyLength);
        consume(request.bodyLength);
      }
      return request;
    };

    const answer = (request, [status, body, contentType]) => {
      if (closed || socket.destroyed) return;
      const close = !request.keepAlive || state.stopping || ended;
      socket.write(response(status, body, contentType, close));
      if (app.failedLoad !== null) {
        closed = true;
        socket.end(() => exitAfterFailedLoad(app));
      } else if (close) {
        closed = true;
        socket.end();
      }
    };

    const pump = () => {
      while (!busy && !closed) {
        let request;
        try {
          request = nextRequest();
        } catch (err) {
          if (!(err instanceof HttpError)) fatal('serving loop failed', err);
          closed = true;
          socket.end(response(err.status, errorBody(err.message), 'application/json', true));
          return;
        }
        if (request === null) {
          if (ended) {
            closed = true;
            socket.end();
          } else if (socket.isPaused()) {
            socket.resume();
          }
          return;
        }
        let result;
        try {
          result = route(request);
        } catch (err) {
          // One bad request must not end the loop.
          log(`request ${request.path}: ${describe(err)}`);
          result = [500, errorBody(errorMessage(err))];
        }
        if (Array.isArray(result)) {
          answer(request, result);
          continue;
        }
        busy = true;
        state.inflight += 1;
        const done = (outcome) => {
          busy = false;
          state.inflight -= 1;
          answer(request, outcome);
          if (state.stopping && state.inflight === 0 && state.onDrained) state.onDrained();
          pump();
        };
        result
          .then(done, (err) => done([500, errorBody(errorMessage(err))]))
          .catch((err) => fatal('serving loop failed', err));
      }
    };

    socket.on('data', (chunk) => {
      if (buf === null) buf = chunk;
      else parts.push(chunk);
      size += chunk.length;
      if (busy) {
        if (size > MAX_BUFFERED_WHILE_BUSY) socket.pause();
        return;
      }
      // A body still arriving is joined once, when it is complete.
      if (head !== null && size < head.bodyLength) return;
      pump();
    });
    socket.on('end', () => {
      // The client is done sending: answer what it asked, then close.
      ended = true;
      if (!busy) pump();
    });
    socket.on('error', () => {
      // 'close' follows; a client that went away needs no answer.
    });
    socket.on('close', () => {
      closed = true;
      state.conns.delete(socket);
    });
    socket.isIdle = () => !busy && size === 0 && head === null;
  }

  const server = net.createServer({ allowHalfOpen: true }, serveConnection);
  return { server, state };
}

const EMPTY = Buffer.alloc(0);

/**
 * Runs the code paths of a load and of a request once, so that a generic instance has nothing
 * left to compile when its function arrives: module resolution and compilation, then one
 * request of each kind through the server itself. An inherited listening socket has no path
 * inside the sandbox, so then the requests come through a throwaway socket in the temporary
 * directory whose connections are handed to the server.
 */
async function warmUp(codeDir, server, socketPath) {
  resolveModule(path.join(codeDir, '.sless-warm-up-absent'));
  const warm = new Module(path.join(codeDir, '.sless-warm-up.js'), null);
  warm._compile('exports.handle = (event) => event;', warm.id);
  encodeResult(warm.exports.handle({ warm: [1, 'two', null, true] }));
  new Context('', '', identityFromEnv(), parseDeadline('1')).remaining_ms();
  let target = socketPath;
  let relay = null;
  if (!target) {
    target = path.join(os.tmpdir(), `.sless-warm-up-${process.pid}.sock`);
    relay = net.createServer((conn) => server.emit('connection', conn));
    await new Promise((resolve, reject) => {
      relay.once('error', reject);
      relay.listen(target, resolve);
    });
  }
  // One request of each kind, each on its own connection.
  const ask = (raw) =>
    new Promise((resolve) => {
      const sock = net.connect(target, () => sock.end(raw));
      sock.on('data', () => {});
      sock.on('close', resolve);
      sock.on('error', resolve);
    });
  await ask('GET /_sless/ready HTTP/1.1\r\nHost: instance\r\nConnection: close\r\n\r\n');
  const body = '{"warm":true}';
  await ask(
    `POST /_sless/invoke HTTP/1.1\r\nHost: instance\r\nConnection: close\r\nContent-Length: ${body.length}\r\n\r\n${body}`,
  );
  await ask('GET /_sless/warm-up HTTP/1.1\r\nHost: instance\r\nConnection: close\r\n\r\n');
  // Closing a path-bound server removes its socket file.
  if (relay) await new Promise((resolve) => relay.close(resolve));
}

// Set by main() once stdout/stderr are tagged: flushes a request's unfinished lines.
let endRequestOutput = () => {};

/** Resolves once everything written to stdout and stderr so far is in their pipes. */
function outputWritten() {
  const queued = [process.stdout, process.stderr].filter((stream) => stream.writableLength > 0);
  // Writes complete in order, so an empty write's callback comes after all queued before it.
  return Promise.all(queued.map((stream) => new Promise((resolve) => stream.write('', () => resolve()))));
}

function envInt(name, fallback) {
  const raw = (process.env[name] || '').trim();
  if (!raw) return fallback;
  if (!/^\d+$/.test(raw)) throw new LoadError(`${name} must be an integer, got "${raw}"`);
  return Number(raw);
}

function removeStaleSocket(socketPath) {
  let st;
  try {
    st = fs.lstatSync(socketPath);
  } catch {
    return;
  }
  if (!st.isSocket()) throw new LoadError(`SLESS_SOCKET ${socketPath} exists and is not a socket`);
  fs.unlinkSync(socketPath);
}

async function main(argv) {
  const check = argv.includes('--check');
  const env = process.env;
  const codeDir = env.SLESS_CODE_DIR || '/code';
  const depsDir = env.SLESS_DEPS_DIR || '/deps';
  // Without an entrypoint the instance is generic: it serves and waits for POST /_sless/load.
  const generic = !env.SLESS_ENTRYPOINT && !check;
  const spec = env.SLESS_ENTRYPOINT || DEFAULT_ENTRYPOINT;
  const app = {
    fn: null,
    identity: identityFromEnv(),
    codeDir,
    depsDir,
    socketPath: null,
    loading: false,
    failedLoad: null,
  };
  let readyFd;
  let listenFd;
  try {
    readyFd = envInt('SLESS_READY_FD', null);
    listenFd = envInt('SLESS_LISTEN_FD', null);
    setupModulePaths(depsDir);
    if (!generic) app.fn = await loadEntrypoint(spec, codeDir);
  } catch (err) {
    if (!(err instanceof LoadError)) {
      process.stderr.write(`${(err && err.stack) || String(err)}\n`);
    }
    log(err instanceof LoadError ? err.message : describe(err));
    return EXIT_LOAD_ERROR;
  }
  if (check) return 0;

  // An inherited listening socket (the platform's way) wins over binding a path.
  const socketPath = listenFd === null ? env.SLESS_SOCKET : null;
  if (listenFd === null && !socketPath) {
    log('neither SLESS_LISTEN_FD nor SLESS_SOCKET is set');
    return 2;
  }
  app.socketPath = socketPath;
  const endOut = tagStream(process.stdout);
  const endErr = tagStream(process.stderr);
  endRequestOutput = (rid) => {
    endOut(rid);
    endErr(rid);
  };
  const { server, state } = makeServer(app);

  // A stray rejection in fire-and-forget code of the handler must not take down the requests
  // other invocations have in flight.
  process.on('unhandledRejection', (reason) => {
    process.stderr.write(`sless: unhandled rejection\n${(reason && reason.stack) || String(reason)}\n`);
  });

  try {
    if (socketPath) removeStaleSocket(socketPath);
    const where = socketPath ? { path: socketPath } : { fd: listenFd };
    await new Promise((resolve, reject) => {
      server.once('error', reject);
      server.listen({ ...where, backlog: 1024 }, () => {
        server.off('error', reject);
        resolve();
      });
    });
  } catch (err) {
    const where = socketPath || `fd ${listenFd}`;
    log(err instanceof LoadError ? err.message : `listen on ${where}: ${err.message}`);
    return 2;
  }

  if (generic) await warmUp(codeDir, server, socketPath);

  if (readyFd !== null) {
    try {
      fs.writeSync(readyFd, 'ready\n');
    } finally {
      fs.closeSync(readyFd);
    }
  }

  return new Promise((resolve) => {
    const stop = () => {
      if (state.stopping) return;
      state.stopping = true;
      server.close();
      for (const socket of state.conns) {
        if (socket.isIdle()) socket.end();
      }
      const finish = () => {
        try {
          if (socketPath) fs.unlinkSync(socketPath);
        } catch {
          // Already gone: nothing to clean up.
        }
        resolve(0);
      };
      if (state.inflight === 0) return finish();
      state.onDrained = finish;
      setTimeout(() => {
        log(`shutdown: ${state.inflight} request(s) still running after ${SHUTDOWN_GRACE_MS / 1000}s; exiting`);
        finish();
      }, SHUTDOWN_GRACE_MS);
    };
    process.on('SIGTERM', stop);
    process.on('SIGINT', stop);
  });
}

if (require.main === module) {
  main(process.argv.slice(2)).then(
    (code) => process.exit(code),
    (err) => {
      process.stderr.write(`${(err && err.stack) || String(err)}\n`);
      process.exit(1);
    },
  );
}

module.exports = { encodeResult, decodeEvent, nestedDeeperThan, loadEntrypoint, Context };
