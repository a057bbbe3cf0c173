#!/usr/bin/env node
// sless Node.js runtime shim: serves one function over the sless instance protocol.
//
// The platform starts this file inside the sandbox (see docs/instance-protocol.md). It loads the
// entrypoint, listens with HTTP/1.1 on the Unix socket SLESS_SOCKET, writes "ready\n" to
// SLESS_READY_FD and then calls the handler once per `POST /_sless/invoke`.
//
// CommonJS, no npm dependencies, Node 18+. `node sless_runtime.js --check` only loads the
// entrypoint; the builder uses it to validate a build. SLESS_CODE_DIR and SLESS_DEPS_DIR override
// /code and /deps so the shim can run outside the sandbox (tests, local runs).
'use strict';

const fs = require('node:fs');
const http = require('node:http');
const path = require('node:path');
const Module = require('node:module');
const { pathToFileURL } = require('node:url');
const { AsyncLocalStorage } = require('node:async_hooks');

// Exit status for an entrypoint that cannot be loaded; the platform reports it as a load error
// rather than a crash.
const EXIT_LOAD_ERROR = 3;
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
  constructor(requestId, source, identity, deadlineMs) {
    this.request_id = requestId;
    this.source = source;
    this.function_name = identity.functionName;
    this.namespace = identity.namespace;
    this.revision = identity.revision;
    this.deadline_ms = deadlineMs;
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
    return [200, body];
  } catch (err) {
    return [500, errorBody(`result is not JSON serializable: ${errorMessage(err)}`)];
  }
}

function parseDeadline(raw) {
  if (raw === undefined || raw === '') return null;
  const n = Number(raw);
  return Number.isFinite(n) ? Math.trunc(n) : null;
}

function send(res, status, body, contentType = 'application/json') {
  // The platform stamps its own times; skipping Date saves a header per response.
  res.sendDate = false;
  res.writeHead(status, {
    'Content-Type': contentType,
    'Content-Length': Buffer.byteLength(body, 'utf8'),
  });
  // A string body goes out in one write with the head; a Buffer would take a writev.
  res.end(body, 'utf8');
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
 * the entrypoint into `app`. Answers 200, or 500 and exits with the load-error status.
 */
async function loadInto(app, req, res, raw) {
  if (app.fn !== null || app.loading) return send(res, 409, errorBody('a function is already loaded'));
  let spec;
  try {
    spec = raw.length > 0 ? JSON.parse(raw.toString('utf8')) : null;
  } catch (err) {
    return send(res, 400, errorBody(`invalid load request: ${err.message}`));
  }
  if (spec === null || typeof spec !== 'object' || typeof spec.entrypoint !== 'string' || !spec.entrypoint) {
    return send(res, 400, errorBody('invalid load request: "entrypoint" (a string) is required'));
  }
  const env = spec.env == null ? {} : spec.env;
  if (typeof env !== 'object' || Array.isArray(env)) {
    return send(res, 400, errorBody('invalid load request: "env" must be an object'));
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
    res.on('finish', () => {
      try {
        fs.unlinkSync(app.socketPath);
      } catch {
        // Already gone.
      }
      process.exit(EXIT_LOAD_ERROR);
    });
    return send(res, 500, errorBody(message));
  }
  app.identity = identityFromEnv();
  return send(res, 200, '{"ok":true}');
}

function makeServer(app) {
  const state = { inflight: 0, stopping: false, onDrained: null };

  async function invoke(req, res, raw) {
    let event = null;
    if (raw.length > 0) {
      try {
        event = JSON.parse(raw.toString('utf8'));
      } catch (err) {
        send(res, 400, errorBody(`invalid JSON event: ${err.message}`));
        return;
      }
    }
    const requestId = req.headers['x-sless-request-id'] || '';
    const context = new Context(
      requestId,
      req.headers['x-sless-source'] || '',
      app.identity,
      parseDeadline(req.headers['x-sless-deadline-ms']),
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
    if (state.stopping) res.setHeader('Connection', 'close');
    send(res, status, body);
  }

  const server = http.createServer((req, res) => {
    const url = req.url || '';
    const q = url.indexOf('?');
    const p = q < 0 ? url : url.slice(0, q);
    if (p === '/_sless/ready') {
      if (req.method !== 'GET') return send(res, 405, errorBody('use GET'));
      return send(res, 200, 'ok', 'text/plain');
    }
    if (p === '/_sless/load') {
      if (req.method !== 'POST') return send(res, 405, errorBody('use POST'));
      const chunks = [];
      req.on('data', (chunk) => chunks.push(chunk));
      req.on('end', () => {
        loadInto(app, req, res, Buffer.concat(chunks));
      });
      return undefined;
    }
    if (p !== '/_sless/invoke') return send(res, 404, errorBody(`not found: ${p}`));
    if (req.method !== 'POST') return send(res, 405, errorBody('use POST'));
    if (app.fn === null) {
      req.resume();
      return send(res, 503, errorBody('no function loaded'));
    }

    state.inflight += 1;
    // 'close' comes once the answer is sent, or when the client went away before it: either
    // way this request no longer counts.
    res.on('close', () => {
      state.inflight -= 1;
      if (state.stopping && state.inflight === 0 && state.onDrained) state.onDrained();
    });
    const chunks = [];
    req.on('data', (chunk) => chunks.push(chunk));
    req.on('end', () => {
      invoke(req, res, chunks.length === 1 ? chunks[0] : Buffer.concat(chunks));
    });
  });
  // The platform pools connections and keeps them open while the instance lives: no idle
  // timeout, and no limit on how long a request (the handler run) may take; the platform
  // enforces the function's timeout itself.
  server.keepAliveTimeout = 0;
  server.requestTimeout = 0;
  server.headersTimeout = 60_000;
  server.timeout = 0;
  return { server, state };
}

/**
 * Runs the code paths of a load and of a request once, so that a generic instance has nothing
 * left to compile when its function arrives: module resolution and compilation, then one
 * request of each kind over the socket itself.
 */
async function warmUp(codeDir, socketPath) {
  resolveModule(path.join(codeDir, '.sless-warm-up-absent'));
  const warm = new Module(path.join(codeDir, '.sless-warm-up.js'), null);
  warm._compile('exports.handle = (event) => event;', warm.id);
  encodeResult(warm.exports.handle({ warm: [1, 'two', null, true] }));
  new Context('', '', identityFromEnv(), parseDeadline('1')).remaining_ms();
  const agent = new http.Agent({ keepAlive: true });
  const ask = (method, urlPath, body) =>
    new Promise((resolve) => {
      const req = http.request({ socketPath, method, path: urlPath, agent }, (res) => {
        res.resume();
        res.on('end', resolve);
      });
      req.on('error', resolve);
      req.end(body);
    });
  await ask('GET', '/_sless/ready');
  await ask('POST', '/_sless/invoke', '{"warm":true}');
  await ask('GET', '/_sless/warm-up');
  agent.destroy();
}

// Set by main() once stdout/stderr are tagged: flushes a request's unfinished lines.
let endRequestOutput = () => {};

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
  const app = { fn: null, identity: identityFromEnv(), codeDir, depsDir, socketPath: env.SLESS_SOCKET, loading: false };
  let readyFd;
  try {
    readyFd = envInt('SLESS_READY_FD', null);
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

  const socketPath = env.SLESS_SOCKET;
  if (!socketPath) {
    log('SLESS_SOCKET is not set');
    return 2;
  }
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
    removeStaleSocket(socketPath);
    await new Promise((resolve, reject) => {
      server.once('error', reject);
      server.listen({ path: socketPath, backlog: 1024 }, () => {
        server.off('error', reject);
        resolve();
      });
    });
  } catch (err) {
    log(err instanceof LoadError ? err.message : `listen on ${socketPath}: ${err.message}`);
    return 2;
  }

  if (generic) await warmUp(codeDir, socketPath);

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
      server.closeIdleConnections();
      const finish = () => {
        try {
          fs.unlinkSync(socketPath);
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

module.exports = { encodeResult, loadEntrypoint, Context };
