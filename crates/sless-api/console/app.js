// The sless web console: a page that works through the /v1 API with the session cookie
// (HttpOnly; the script never sees the token) and sends the session's CSRF token on every
// change. Plain JavaScript, no build step, no dependencies; all text reaches the page
// through textContent, never as HTML.
"use strict";

const S = { csrf: null, who: null, ns: null, page: null };

// ---- helpers ----------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k === "text") e.textContent = v;
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function toast(msg) {
  const box = document.getElementById("toast");
  const d = el("div", { text: msg });
  box.append(d);
  setTimeout(() => d.remove(), 5000);
}

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(method, path, body, opts = {}) {
  const headers = {};
  if (method !== "GET" && method !== "HEAD" && S.csrf) headers["X-Sless-Csrf"] = S.csrf;
  let payload;
  if (opts.raw !== undefined) {
    payload = opts.raw;
    headers["Content-Type"] = opts.contentType || "application/octet-stream";
  } else if (body !== undefined) {
    payload = JSON.stringify(body);
    headers["Content-Type"] = "application/json";
  }
  const r = await fetch(path, { method, headers, body: payload, credentials: "same-origin", signal: opts.signal });
  const text = await r.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = text; }
  if (!r.ok) {
    const msg = (data && data.error && data.error.message) || r.statusText || "request failed";
    if (r.status === 401 && !opts.quiet401) { S.csrf = null; showSignIn(msg); }
    throw new ApiError(r.status, msg);
  }
  return data;
}

const enc = encodeURIComponent;
const nsPath = (ns, ...rest) => `/v1/namespaces/${enc(ns)}` + rest.map((p) => "/" + enc(p)).join("");

function ago(ts) {
  if (!ts) return "—";
  const s = Math.round((Date.now() - Date.parse(ts)) / 1000);
  if (s < 0) return "in " + human(-s);
  return human(s) + " ago";
}
function human(s) {
  if (s < 60) return s + " s";
  if (s < 3600) return Math.round(s / 60) + " min";
  if (s < 86400) return Math.round(s / 3600) + " h";
  return Math.round(s / 86400) + " d";
}

function main() { return document.getElementById("main"); }

function render(...nodes) {
  const m = main();
  m.replaceChildren(...nodes);
}

function emptyState(title, hint) {
  return el("div", { class: "empty" }, el("p", {}, el("strong", { text: title })), hint ? el("p", { class: "muted", text: hint }) : null);
}

function table(headers, rows) {
  return el("div", { class: "table-wrap" },
    el("table", {}, el("thead", {}, el("tr", {}, headers.map((h) => el("th", { scope: "col", text: h })))),
      el("tbody", {}, rows)));
}

// A small highlighter for the source view: comments, strings, numbers and keywords.
const KEYWORDS = new Set(("def return if elif else for while in import from as class try except finally with lambda " +
  "None True False and or not async await const let var function new this throw catch typeof null true false " +
  "undefined export require module package func go defer type struct interface map range").split(" "));
function highlight(code) {
  const out = [];
  const re = /(#[^\n]*|\/\/[^\n]*|\/\*[\s\S]*?\*\/)|("(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'|`(?:\\.|[^`\\])*`)|(\b\d+(?:\.\d+)?\b)|([A-Za-z_]\w*)/g;
  let last = 0, m;
  while ((m = re.exec(code))) {
    if (m.index > last) out.push(document.createTextNode(code.slice(last, m.index)));
    const cls = m[1] ? "com" : m[2] ? "str" : m[3] ? "num" : KEYWORDS.has(m[4]) ? "kw" : null;
    out.push(cls ? el("span", { class: cls, text: m[0] }) : document.createTextNode(m[0]));
    last = re.lastIndex;
  }
  out.push(document.createTextNode(code.slice(last)));
  return out;
}

// ---- session ------------------------------------------------------------------------

function showSignIn(message) {
  stopPage();
  document.getElementById("nav").hidden = true;
  const err = el("p", { class: "error", role: "alert", text: message && message !== "not signed in" ? message : "" });
  const input = el("input", { id: "token", name: "token", type: "password", autocomplete: "current-password", required: true });
  const form = el("form", { class: "card signin", id: "sign-in", onsubmit: async (e) => {
    e.preventDefault();
    try {
      const r = await api("POST", "/v1/console/session", { token: input.value }, { quiet401: true });
      S.csrf = r.csrf;
      input.value = "";
      await afterSignIn();
    } catch (ex) { err.textContent = ex.message; }
  } },
  el("h1", { text: "Sign in to sless" }),
  el("p", { class: "muted", text: "Any token the API takes: the admin token, a namespace token or a JWT." }),
  el("div", { class: "row" }, el("label", { for: "token" }, "Token", input)),
  err,
  el("button", { type: "submit" }, "Sign in"));
  render(form);
  input.focus();
}

async function afterSignIn() {
  S.who = await api("GET", "/v1/whoami");
  const sel = document.getElementById("ns-select");
  sel.replaceChildren(...S.who.namespaces.map((n) => el("option", { value: n, text: n })));
  document.getElementById("nav").hidden = false;
  if (!location.hash || location.hash === "#" || location.hash === "#/") {
    location.hash = S.who.namespaces.length === 1 ? `#/ns/${S.who.namespaces[0]}` : "#/";
  }
  route();
}

async function signOut() {
  try { await api("DELETE", "/v1/console/session"); } catch { /* signed out either way */ }
  S.csrf = null; S.who = null;
  location.hash = "#/";
  showSignIn();
}

// ---- pages --------------------------------------------------------------------------

// Each page gets an AbortController; leaving the page stops its streams and timers.
function stopPage() {
  if (S.page) S.page.abort();
  S.page = new AbortController();
  return S.page.signal;
}

function every(ms, fn, signal) {
  const id = setInterval(() => { if (!signal.aborted) fn(); }, ms);
  signal.addEventListener("abort", () => clearInterval(id));
}

function setNamespace(ns) {
  S.ns = ns;
  const sel = document.getElementById("ns-select");
  if (ns && ![...sel.options].some((o) => o.value === ns)) sel.append(el("option", { value: ns, text: ns }));
  if (ns) sel.value = ns;
  document.getElementById("nav-functions").href = ns ? `#/ns/${ns}` : "#/";
  document.getElementById("nav-triggers").href = ns ? `#/ns/${ns}/triggers` : "#/";
}

async function pageNamespaces() {
  setNamespace(null);
  const list = await api("GET", "/v1/namespaces");
  const items = list.items || [];
  render(el("h1", { text: "Namespaces" }),
    items.length ? table(["Namespace", "Created", ""], items.map((n) =>
      el("tr", {}, el("td", {}, el("a", { href: `#/ns/${n.name}`, text: n.name })),
        el("td", { text: ago(n.created_at) }),
        el("td", {}, el("a", { href: `#/ns/${n.name}/triggers`, text: "Triggers" })))))
      : emptyState("No namespaces yet.", "Create one with `sless ns create NAME`."));
}

function phase(p) { return el("span", { class: `phase phase-${p}`, text: p }); }

async function pageFunctions(ns, signal) {
  setNamespace(ns);
  const [fns, inv] = await Promise.all([
    api("GET", nsPath(ns, "functions")),
    api("GET", nsPath(ns, "invocations") + "?limit=500").catch(() => ({ items: [] })),
  ]);
  const lastCall = {};
  for (const i of inv.items || []) if (!lastCall[i.function]) lastCall[i.function] = i;
  const items = (fns.items || []).sort((a, b) => a.name.localeCompare(b.name));
  const rows = items.map((f) => {
    const last = lastCall[f.name];
    return el("tr", { "data-function": f.name },
      el("td", {}, el("a", { href: `#/ns/${ns}/fn/${f.name}`, text: f.name })),
      el("td", {}, phase(f.status.phase)),
      el("td", { text: f.spec.runtime }),
      el("td", { text: f.status.revision }),
      el("td", { text: `${f.status.instances.ready} ready` + (f.status.instances.starting ? `, ${f.status.instances.starting} starting` : "") }),
      el("td", {}, f.status.url ? el("a", { href: f.status.url, text: f.status.url, target: "_blank", rel: "noopener" }) : "—"),
      el("td", { text: last ? `${ago(last.started_at)} · ${last.status}` : "never" }));
  });
  render(el("h1", {}, `Functions in ${ns}`),
    items.length ? table(["Name", "Phase", "Runtime", "Revision", "Instances", "URL", "Last invocation"], rows)
      : emptyState("No functions here yet.", "Deploy one below, or with `sless deploy ./my-fn`."),
    newFunctionForm(ns));
}

function newFunctionForm(ns) {
  const name = el("input", { id: "new-name", name: "name", required: true, pattern: "[a-z0-9]([a-z0-9\\-]*[a-z0-9])?", maxlength: 63 });
  const runtime = el("select", { id: "new-runtime", name: "runtime" }, ["python3", "nodejs"].map((r) => el("option", { value: r, text: r })));
  const file = el("input", { id: "new-zip", name: "code", type: "file", accept: ".zip,application/zip", required: true });
  const err = el("p", { class: "error", role: "alert" });
  return el("form", { class: "card", id: "new-function", onsubmit: async (e) => {
    e.preventDefault();
    err.textContent = "";
    try {
      await api("POST", nsPath(ns, "functions"), { name: name.value, runtime: runtime.value });
      await api("PUT", nsPath(ns, "functions", name.value, "code"), undefined, { raw: file.files[0], contentType: "application/zip" });
      location.hash = `#/ns/${ns}/fn/${name.value}`;
    } catch (ex) { err.textContent = ex.message; }
  } },
  el("h2", { text: "New function" }),
  el("div", { class: "row" },
    el("label", { for: "new-name" }, "Name", name),
    el("label", { for: "new-runtime" }, "Runtime", runtime),
    el("label", { for: "new-zip" }, "Code (zip)", file),
    el("button", { type: "submit" }, "Deploy")),
  err);
}

async function pageFunction(ns, name, signal) {
  setNamespace(ns);
  const statusBox = el("section", { class: "card", id: "status", "aria-live": "polite" });
  const sourceBox = el("div", { id: "source" });
  const invBox = el("div", { id: "invocations" });
  const logs = el("pre", { id: "logs", tabindex: 0, "aria-label": "Live logs" });

  let f = await api("GET", nsPath(ns, "functions", name));
  const showStatus = () => {
    statusBox.replaceChildren(el("h2", { text: "Status" }), el("dl", { class: "kv" },
      el("dt", { text: "Phase" }), el("dd", {}, phase(f.status.phase)),
      el("dt", { text: "Message" }), el("dd", { id: "status-message", text: f.status.message || "—" }),
      el("dt", { text: "Revision" }), el("dd", { id: "revision", text: f.status.revision }),
      el("dt", { text: "Code" }), el("dd", { text: f.status.code_sha256 || "none uploaded" }),
      el("dt", { text: "Instances" }), el("dd", { text: `${f.status.instances.ready} ready, ${f.status.instances.starting} starting` }),
      el("dt", { text: "URL" }), el("dd", {}, el("a", { href: f.status.url, text: f.status.url, target: "_blank", rel: "noopener" })),
      el("dt", { text: "Last built" }), el("dd", { text: ago(f.status.last_built_at) })),
    el("h2", { text: "Spec" }), el("pre", { text: JSON.stringify(f.spec, null, 2) }));
  };
  const refresh = async () => {
    const before = f.status.revision + f.status.phase;
    f = await api("GET", nsPath(ns, "functions", name), undefined, { signal });
    showStatus();
    if (before !== f.status.revision + f.status.phase) { loadSource(); }
  };
  const loadSource = async () => {
    try {
      const src = await api("GET", nsPath(ns, "functions", name, "source"), undefined, { signal });
      const files = src.items || [];
      sourceBox.replaceChildren(...(files.length ? files.map((file) => el("details", { open: files.length <= 3 },
        el("summary", { text: file.name }),
        el("pre", {}, file.binary ? el("span", { class: "muted", text: "(binary file)" }) : el("code", {}, highlight(file.content)))))
        : [emptyState("No code uploaded yet.")]));
    } catch (ex) { sourceBox.replaceChildren(el("p", { class: "muted", text: ex.message })); }
  };
  const loadInvocations = async (filters) => {
    const q = new URLSearchParams({ function: name, limit: "50", ...filters });
    for (const [k, v] of [...q]) if (!v) q.delete(k);
    const inv = await api("GET", nsPath(ns, "invocations") + "?" + q, undefined, { signal });
    const items = inv.items || [];
    invBox.replaceChildren(items.length ? table(["Started", "Source", "Status", "Duration", "Cold", "Revision", "Error"], items.map((i) =>
      el("tr", {}, el("td", { text: ago(i.started_at), title: i.started_at }), el("td", { text: i.source }),
        el("td", { class: i.status >= 500 ? "bad" : i.status >= 400 ? "" : "ok", text: i.status }),
        el("td", { text: `${i.duration_ms} ms` }), el("td", { text: i.cold_start ? "yes" : "" }),
        el("td", { text: i.revision }), el("td", { text: i.error || "" }))))
      : emptyState("No invocations yet.", "Call the function from the panel above."));
  };

  let filters = {};
  const reloadInvocations = (given) => { if (given) filters = given; return loadInvocations(filters); };
  render(el("h1", {}, el("a", { href: `#/ns/${ns}`, text: ns }), " / ", name),
    statusBox,
    el("div", { class: "grid2" }, uploadPanel(ns, name, refresh), invokePanel(ns, name, f, () => reloadInvocations())),
    el("section", { class: "card" }, el("h2", { text: "Live logs" }), logs),
    el("section", { class: "card" }, el("h2", { text: "Invocations" }), invocationFilters(reloadInvocations), invBox),
    el("section", { class: "card" }, el("h2", { text: "Files" }), sourceBox));
  showStatus();
  loadSource();
  loadInvocations({});
  every(1500, () => refresh().catch(() => {}), signal);
  every(5000, () => reloadInvocations().catch(() => {}), signal);
  followLogs(ns, name, logs, signal);
}

function invocationFilters(load) {
  const status = el("input", { id: "filter-status", name: "status", inputmode: "numeric", size: 5 });
  const source = el("select", { id: "filter-source", name: "source" }, ["", "http", "invoke", "cron", "queue", "job", "async", "device"].map((s) => el("option", { value: s, text: s || "any" })));
  return el("form", { class: "row", onsubmit: (e) => { e.preventDefault(); load({ status: status.value, source: source.value }); } },
    el("label", { for: "filter-status" }, "Status", status), el("label", { for: "filter-source" }, "Source", source),
    el("button", { type: "submit", class: "secondary" }, "Filter"));
}

function uploadPanel(ns, name, refresh) {
  const file = el("input", { id: "upload-zip", type: "file", accept: ".zip,application/zip" });
  const progress = el("p", { id: "upload-progress", "aria-live": "polite", class: "muted" });
  const send = async (blob) => {
    progress.textContent = `Uploading ${blob.name || "archive"}…`;
    try {
      const r = await api("PUT", nsPath(ns, "functions", name, "code"), undefined, { raw: blob, contentType: "application/zip" });
      progress.textContent = `Revision ${r.revision} uploaded; building…`;
      await refresh();
    } catch (ex) { progress.textContent = ex.message; }
  };
  file.addEventListener("change", () => { if (file.files[0]) send(file.files[0]); });
  const drop = el("div", { class: "drop", id: "drop",
    ondragover: (e) => { e.preventDefault(); drop.classList.add("over"); },
    ondragleave: () => drop.classList.remove("over"),
    ondrop: (e) => { e.preventDefault(); drop.classList.remove("over"); if (e.dataTransfer.files[0]) send(e.dataTransfer.files[0]); } },
  el("p", { text: "Drop a zip here to deploy a new revision, or pick one:" }), el("label", { for: "upload-zip" }, "Archive", file));
  return el("section", { class: "card" }, el("h2", { text: "Upload code" }), drop, progress);
}

function invokePanel(ns, name, f, onDone) {
  const method = el("select", { id: "invoke-method" }, ["POST", "GET", "PUT", "PATCH", "DELETE"].map((m) => el("option", { value: m, text: m })));
  const path = el("input", { id: "invoke-path", value: "/", size: 12 });
  const headers = el("textarea", { id: "invoke-headers", rows: 2, placeholder: "Content-Type: application/json" });
  const body = el("textarea", { id: "invoke-body", rows: 4, text: "{}" });
  const result = el("div", { id: "invoke-result", "aria-live": "polite" });
  const form = el("form", { onsubmit: async (e) => {
    e.preventDefault();
    const h = { "Content-Type": "application/json" };
    for (const line of headers.value.split("\n")) {
      const i = line.indexOf(":");
      if (i > 0) h[line.slice(0, i).trim()] = line.slice(i + 1).trim();
    }
    const sub = path.value.startsWith("/") ? path.value : "/" + path.value;
    const t0 = performance.now();
    try {
      const r = await fetch(`/fn/${enc(ns)}/${enc(name)}${sub === "/" ? "" : sub}`, {
        method: method.value, headers: h, credentials: "omit",
        body: method.value === "GET" ? undefined : body.value });
      const text = await r.text();
      const ms = Math.round(performance.now() - t0);
      result.replaceChildren(el("p", {}, el("strong", { id: "invoke-status", class: r.ok ? "ok" : "bad", text: `${r.status}` }), ` in ${ms} ms`),
        el("pre", { id: "invoke-answer", text: text }));
    } catch (ex) { result.replaceChildren(el("p", { class: "error", text: ex.message })); }
    // A record is listable within a second of the call's end.
    setTimeout(onDone, 1200);
  } },
  el("div", { class: "row" }, el("label", { for: "invoke-method" }, "Method", method), el("label", { for: "invoke-path" }, "Path", path)),
  el("label", { for: "invoke-headers" }, "Headers (Name: value per line)", headers),
  el("label", { for: "invoke-body" }, "Body", body),
  el("p", {}, el("button", { type: "submit", id: "invoke" }, "Invoke")),
  result);
  return el("section", { class: "card" }, el("h2", { text: "Invoke" }),
    f.spec.private ? el("p", { class: "muted", text: "This function is private: /fn/ needs a token of its namespace." }) : null, form);
}

async function followLogs(ns, name, pre, signal) {
  try {
    const r = await fetch(nsPath(ns, "functions", name, "logs") + "?tail=200&follow=true", { credentials: "same-origin", signal });
    if (!r.ok || !r.body) { pre.textContent = "(logs unavailable)"; return; }
    const reader = r.body.getReader();
    const dec = new TextDecoder();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      const stick = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      pre.append(document.createTextNode(dec.decode(value, { stream: true })));
      if (pre.textContent.length > 200000) pre.textContent = pre.textContent.slice(-100000);
      if (stick) pre.scrollTop = pre.scrollHeight;
    }
  } catch (ex) { if (!signal.aborted) pre.append(document.createTextNode(`\n(log stream ended: ${ex.message})`)); }
}

function triggerDetail(t) {
  switch (t.type) {
    case "http": return `/t/${t.namespace}${t.path} (${(t.methods || []).join(", ")})`;
    case "cron": return `${t.schedule} ${t.timezone || ""}`;
    case "queue": return `${t.source.kind} ${t.source.topic}`;
    case "device": return `devices ${t.devices}`;
    default: return "";
  }
}

async function pageTriggers(ns, signal) {
  setNamespace(ns);
  const box = el("div", { id: "triggers" });
  const load = async () => {
    const list = await api("GET", nsPath(ns, "triggers"), undefined, { signal });
    const items = (list.items || []).sort((a, b) => a.name.localeCompare(b.name));
    box.replaceChildren(items.length ? table(["Name", "Type", "Function", "What", "Enabled", "Last fired", "Next fire", "Connection", "Counters"], items.map((t) => {
      const toggle = el("button", { type: "button", class: t.enabled ? "" : "secondary", "aria-pressed": t.enabled ? "true" : "false",
        "data-trigger": t.name, onclick: async () => {
          try { await api("PATCH", nsPath(ns, "triggers", t.name), { enabled: !t.enabled }); await load(); }
          catch (ex) { toast(ex.message); }
        } }, t.enabled ? "Enabled" : "Disabled");
      const c = t.status.counters;
      return el("tr", {}, el("td", { text: t.name }), el("td", { text: t.type }),
        el("td", {}, el("a", { href: `#/ns/${ns}/fn/${t.function}`, text: t.function })),
        el("td", { text: triggerDetail(t) }), el("td", {}, toggle),
        el("td", { text: ago(t.status.last_fired_at), title: t.status.last_result || "" }),
        el("td", { text: t.status.next_fire_at ? ago(t.status.next_fire_at) : "—" }),
        el("td", { text: t.status.connection ? `${t.status.connection}${t.status.last_error ? ": " + t.status.last_error : ""}` : "—" }),
        el("td", { text: c ? `${c.received} in, ${c.succeeded} ok, ${c.retried} retried, ${c.dead_lettered} dead` : "—" }));
    })) : emptyState("No triggers here yet.", "Create one with `sless trigger create`."));
  };
  render(el("h1", {}, `Triggers in ${ns}`), box);
  await load();
  every(5000, () => load().catch(() => {}), signal);
}

// ---- routing ------------------------------------------------------------------------

async function route() {
  if (!S.csrf) return;
  const signal = stopPage();
  const parts = location.hash.replace(/^#\/?/, "").split("/").filter(Boolean).map(decodeURIComponent);
  try {
    if (parts[0] === "ns" && parts[1] && parts[2] === "fn" && parts[3]) await pageFunction(parts[1], parts[3], signal);
    else if (parts[0] === "ns" && parts[1] && parts[2] === "triggers") await pageTriggers(parts[1], signal);
    else if (parts[0] === "ns" && parts[1]) await pageFunctions(parts[1], signal);
    else await pageNamespaces();
    main().focus({ preventScroll: true });
  } catch (ex) {
    if (ex.status === 401 || signal.aborted) return;
    render(el("h1", { text: ex.status === 404 ? "Not found" : "Something went wrong" }),
      el("p", { text: ex.status === 404 ? "There is nothing here, or this token may not see it." : ex.message }),
      el("p", {}, el("a", { href: "#/", text: "Back to the namespaces" })));
  }
}

async function boot() {
  document.getElementById("sign-out").addEventListener("click", signOut);
  document.getElementById("ns-select").addEventListener("change", (e) => { location.hash = `#/ns/${e.target.value}`; });
  window.addEventListener("hashchange", route);
  try {
    const r = await api("GET", "/v1/console/session", undefined, { quiet401: true });
    if (!r.csrf) { showSignIn(); return; }
    S.csrf = r.csrf;
    await afterSignIn();
  } catch (ex) { showSignIn(ex.message); }
}

document.addEventListener("DOMContentLoaded", boot);
