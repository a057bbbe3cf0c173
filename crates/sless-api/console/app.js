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

// ---- charts: inline SVG, no library ---------------------------------------------

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs, ...children) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

// A line chart of `series` ([{name, points: [[x, y], ...]}]) over x in [x0, x1].
function lineChart(title, series, x0, x1, unit) {
  const W = 600, H = 150, L = 44, R = 8, T = 10, B = 22;
  const ymax = Math.max(1, ...series.flatMap((s) => s.points.map((p) => p[1])));
  const sx = (x) => L + ((x - x0) / Math.max(1, x1 - x0)) * (W - L - R);
  const sy = (y) => T + (1 - y / ymax) * (H - T - B);
  const colors = ["#2454d6", "#b42318", "#17803d"];
  const g = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", class: "chart", "aria-label": title });
  g.append(svg("title", {}, title));
  g.append(svg("line", { x1: L, y1: sy(0), x2: W - R, y2: sy(0), stroke: "#aab3bf" }));
  g.append(svg("text", { x: 2, y: T + 8, "font-size": 10, fill: "#5f6b7a" }, `${Math.round(ymax * 10) / 10}${unit}`));
  g.append(svg("text", { x: 2, y: sy(0), "font-size": 10, fill: "#5f6b7a" }, `0`));
  g.append(svg("text", { x: L, y: H - 6, "font-size": 10, fill: "#5f6b7a" }, "1 h ago"));
  g.append(svg("text", { x: W - R - 24, y: H - 6, "font-size": 10, fill: "#5f6b7a" }, "now"));
  series.forEach((s, i) => {
    if (!s.points.length) return;
    const d = s.points.map((p, j) => `${j ? "L" : "M"}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" ");
    g.append(svg("path", { d, fill: "none", stroke: colors[i % 3], "stroke-width": 2 }));
    for (const p of s.points) g.append(svg("circle", { cx: sx(p[0]).toFixed(1), cy: sy(p[1]).toFixed(1), r: 2.5, fill: colors[i % 3] }));
    g.append(svg("text", { x: L + 6 + i * 90, y: T + 8, "font-size": 10, fill: colors[i % 3] }, s.name));
  });
  return g;
}

function quantile(sorted, q) {
  if (!sorted.length) return 0;
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
}

// Rate, errors and p50/p99 duration per minute over the last hour, from the records.
function invocationCharts(items) {
  const now = Date.now(), start = now - 3600 * 1000;
  const buckets = new Map();
  for (const i of items) {
    const t = Date.parse(i.started_at);
    if (!(t >= start)) continue;
    const m = Math.floor((t - start) / 60000);
    if (!buckets.has(m)) buckets.set(m, []);
    buckets.get(m).push(i);
  }
  const mins = [...buckets.keys()].sort((a, b) => a - b);
  const x = (m) => start + m * 60000 + 30000;
  const rate = mins.map((m) => [x(m), buckets.get(m).length]);
  const errors = mins.map((m) => [x(m), buckets.get(m).filter((i) => i.status >= 500).length]);
  const lat = mins.map((m) => buckets.get(m).map((i) => i.duration_ms).sort((a, b) => a - b));
  const p50 = mins.map((m, j) => [x(m), quantile(lat[j], 0.5)]);
  const p99 = mins.map((m, j) => [x(m), quantile(lat[j], 0.99)]);
  return el("div", { class: "charts", id: "charts" },
    lineChart("Invocations per minute and errors (5xx) per minute", [{ name: "calls/min", points: rate }, { name: "errors/min", points: errors }], start, now, ""),
    lineChart("Duration per minute, p50 and p99", [{ name: "p50", points: p50 }, { name: "p99", points: p99 }], start, now, " ms"));
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

// Renders a page unless the user has moved on: a page still loading when the route
// changed must not replace the newer one when its data arrives.
function renderFor(signal, ...nodes) {
  if (!signal.aborted) render(...nodes);
}

function every(ms, fn, signal) {
  if (signal.aborted) return;
  const id = setInterval(() => { if (!signal.aborted) fn(); }, ms);
  signal.addEventListener("abort", () => clearInterval(id));
}

function setNamespace(ns) {
  S.ns = ns;
  const sel = document.getElementById("ns-select");
  if (ns && ![...sel.options].some((o) => o.value === ns)) sel.append(el("option", { value: ns, text: ns }));
  if (ns) sel.value = ns;
  document.getElementById("nav-functions").href = ns ? `#/ns/${ns}` : "#/";
  for (const [id, sub] of [["nav-triggers", "triggers"], ["nav-jobs", "jobs"], ["nav-events", "events"], ["nav-secrets", "secrets"], ["nav-devices", "devices"]]) {
    document.getElementById(id).href = ns ? `#/ns/${ns}/${sub}` : "#/";
  }
}

async function pageNamespaces(signal) {
  setNamespace(null);
  const list = await api("GET", "/v1/namespaces");
  const items = list.items || [];
  renderFor(signal, el("h1", { text: "Namespaces" }),
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
  renderFor(signal, el("h1", {}, `Functions in ${ns}`),
    items.length ? table(["Name", "Phase", "Runtime", "Revision", "Instances", "URL", "Last invocation"], rows)
      : emptyState("No functions here yet.", "Deploy one below, or with `sless deploy ./my-fn`."),
    newFunctionForm(ns));
}

function newFunctionForm(ns) {
  const name = el("input", { id: "new-name", name: "name", required: true, pattern: "[a-z0-9]([a-z0-9\\-]*[a-z0-9])?", maxlength: 63 });
  const runtime = el("select", { id: "new-runtime", name: "runtime" }, ["python3", "nodejs", "go", "custom"].map((r) => el("option", { value: r, text: r })));
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
  const chartBox = el("div", { id: "chart-box" });
  const loadCharts = async () => {
    const since = new Date(Date.now() - 3600 * 1000).toISOString();
    const inv = await api("GET", nsPath(ns, "invocations") + "?" + new URLSearchParams({ function: name, since, limit: "1000" }), undefined, { signal });
    chartBox.replaceChildren(invocationCharts(inv.items || []));
  };
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
  renderFor(signal, el("h1", {}, el("a", { href: `#/ns/${ns}`, text: ns }), " / ", name),
    statusBox,
    el("div", { class: "grid2" }, uploadPanel(ns, name, refresh), invokePanel(ns, name, f, () => reloadInvocations())),
    el("section", { class: "card" }, el("h2", { text: "Live logs" }), logs),
    el("section", { class: "card" }, el("h2", { text: "Invocations" }), chartBox, invocationFilters(reloadInvocations), invBox),
    el("section", { class: "card" }, el("h2", { text: "Files" }), sourceBox));
  showStatus();
  loadSource();
  loadInvocations({});
  every(1500, () => refresh().catch(() => {}), signal);
  every(5000, () => reloadInvocations().catch(() => {}), signal);
  loadCharts().catch(() => {});
  every(10000, () => loadCharts().catch(() => {}), signal);
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

function newTriggerForm(ns, reload) {
  const name = el("input", { id: "trigger-name", required: true });
  const fn = el("input", { id: "trigger-function", required: true });
  const type = el("select", { id: "trigger-type" }, ["http", "cron", "queue"].map((t) => el("option", { value: t, text: t })));
  const fields = {
    http: [["path", "Path", "/orders"]],
    cron: [["schedule", "Schedule", "*/5 * * * *"], ["timezone", "Time zone", "UTC"]],
    queue: [["kind", "Broker (amqp, kafka, mqtt, nats)", "mqtt"], ["url", "URL", "mqtt://127.0.0.1:1883"], ["topic", "Topic", "orders"]],
  };
  const inputs = {};
  const extra = el("div", { class: "row" });
  const showFields = () => {
    extra.replaceChildren(...fields[type.value].map(([k, label, ph]) => {
      inputs[k] = el("input", { id: `trigger-${k}`, placeholder: ph, required: k !== "timezone" });
      return el("label", { for: `trigger-${k}` }, label, inputs[k]);
    }));
  };
  type.addEventListener("change", showFields);
  showFields();
  const err = el("p", { class: "error", role: "alert" });
  return el("form", { class: "card", id: "new-trigger", onsubmit: async (e) => {
    e.preventDefault();
    err.textContent = "";
    const body = { name: name.value, function: fn.value, type: type.value };
    const v = (k) => inputs[k].value.trim();
    if (type.value === "http") body.path = v("path");
    if (type.value === "cron") { body.schedule = v("schedule"); if (v("timezone")) body.timezone = v("timezone"); }
    if (type.value === "queue") body.source = { kind: v("kind"), url: v("url"), topic: v("topic") };
    try { await api("POST", nsPath(ns, "triggers"), body); name.value = ""; await reload(); }
    catch (ex) { err.textContent = ex.message; }
  } },
  el("h2", { text: "New trigger" }),
  el("div", { class: "row" }, el("label", { for: "trigger-name" }, "Name", name), el("label", { for: "trigger-function" }, "Function", fn),
    el("label", { for: "trigger-type" }, "Type", type)),
  extra, err, el("button", { type: "submit" }, "Create"));
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
  renderFor(signal, el("h1", {}, `Triggers in ${ns}`), box, newTriggerForm(ns, () => load()));
  await load();
  every(5000, () => load().catch(() => {}), signal);
}

async function pageJobs(ns, signal) {
  setNamespace(ns);
  const box = el("div", { id: "jobs" });
  const load = async () => {
    const list = await api("GET", nsPath(ns, "jobs"), undefined, { signal });
    const items = (list.items || []).sort((a, b) => a.name.localeCompare(b.name));
    box.replaceChildren(items.length ? table(["Name", "Runs", "Phase", "Run", "Attempts", "Finished", "Result or error", ""], items.map((j) => {
      const run = el("button", { type: "button", class: "secondary", "data-job": j.name, onclick: async () => {
        try { await api("PATCH", nsPath(ns, "jobs", j.name), { run_id: (j.spec.run_id || 0) + 1 }); await load(); }
        catch (ex) { toast(ex.message); }
      } }, j.status.run_id ? "Re-run" : "Run");
      const outcome = j.status.phase === "Succeeded" ? JSON.stringify(j.status.result) : (j.status.message || "");
      return el("tr", { "data-job-row": j.name }, el("td", { text: j.name }),
        el("td", { text: j.spec.function || `${j.spec.runtime} (own code)` }),
        el("td", {}, el("span", { class: `phase phase-${j.status.phase === "Succeeded" ? "Ready" : j.status.phase}`, text: j.status.phase })),
        el("td", { text: j.status.run_id }), el("td", { text: j.status.attempts }),
        el("td", { text: ago(j.status.finished_at) }),
        el("td", {}, el("code", { class: "outcome", text: outcome.length > 300 ? outcome.slice(0, 300) + "…" : outcome })),
        el("td", {}, run));
    })) : emptyState("No jobs here yet.", "Create one with `sless job run`."));
  };
  renderFor(signal, el("h1", {}, `Jobs in ${ns}`), box);
  await load();
  every(2000, () => load().catch(() => {}), signal);
}

async function pageEvents(ns, signal) {
  setNamespace(ns);
  const calls = el("div", { id: "calls" });
  const dead = el("div", { id: "dead-letters" });
  const load = async () => {
    const [c, d] = await Promise.all([
      api("GET", nsPath(ns, "calls") + "?limit=100", undefined, { signal }),
      api("GET", nsPath(ns, "dead-letters") + "?limit=100", undefined, { signal }),
    ]);
    const ci = c.items || [];
    calls.replaceChildren(ci.length ? table(["Call", "Function", "Phase", "Attempts", "Queued", "Answer or error"], ci.map((x) =>
      el("tr", {}, el("td", {}, el("code", { text: x.id })), el("td", { text: x.function }),
        el("td", { text: x.phase }), el("td", { text: x.attempts }), el("td", { text: ago(x.queued_at) }),
        el("td", { text: x.response ? `${x.response.status} ${JSON.stringify(x.response.body).slice(0, 200)}` : (x.error || "") }))))
      : emptyState("No async calls yet.", "Queue one with POST /async/{namespace}/{function}."));
    const di = d.items || [];
    dead.replaceChildren(di.length ? table(["Failed", "Source", "Trigger", "Function", "Attempts", "Last status", "Error", "Payload", ""], di.map((x) =>
      el("tr", { "data-dead-letter": x.id }, el("td", { text: ago(x.failed_at) }), el("td", { text: x.source }),
        el("td", { text: x.trigger || "—" }), el("td", { text: x.function }), el("td", { text: x.attempts }),
        el("td", { text: x.last_status }), el("td", { text: x.error || "" }),
        el("td", {}, el("code", { text: JSON.stringify(x.payload).slice(0, 200) })),
        el("td", {},
          el("button", { type: "button", class: "redrive", onclick: async () => {
            try { await api("POST", nsPath(ns, "dead-letters", x.id, "redrive")); toast("Sent back for delivery"); await load(); }
            catch (ex) { toast(ex.message); }
          } }, "Redrive"), " ",
          el("button", { type: "button", class: "secondary", onclick: async () => {
            try { await api("DELETE", nsPath(ns, "dead-letters", x.id)); await load(); } catch (ex) { toast(ex.message); }
          } }, "Delete")))))
      : emptyState("No dead letters.", "Messages that exhaust their delivery policy land here."));
  };
  renderFor(signal, el("h1", {}, `Async calls and dead letters in ${ns}`),
    el("section", { class: "card" }, el("h2", { text: "Dead letters" }), dead),
    el("section", { class: "card" }, el("h2", { text: "Async calls" }), calls));
  await load();
  every(3000, () => load().catch(() => {}), signal);
}

async function pageSecrets(ns, signal) {
  setNamespace(ns);
  const box = el("div", { id: "secrets" });
  const load = async () => {
    const list = await api("GET", nsPath(ns, "secrets"), undefined, { signal });
    const items = list.items || [];
    box.replaceChildren(items.length ? table(["Name", "Keys", "Updated", ""], items.map((x) =>
      el("tr", { "data-secret": x.name }, el("td", { text: x.name }), el("td", { text: x.keys.join(", ") }), el("td", { text: ago(x.updated_at) }),
        el("td", {}, el("button", { type: "button", class: "secondary", onclick: async () => {
          if (!confirm(`Delete the secret ${x.name}?`)) return;
          try { await api("DELETE", nsPath(ns, "secrets", x.name)); await load(); } catch (ex) { toast(ex.message); }
        } }, "Delete")))))
      : emptyState("No secrets here yet.", "Set one below; its values are never shown again."));
  };
  const name = el("input", { id: "secret-name", required: true });
  const key = el("input", { id: "secret-key", required: true });
  const value = el("input", { id: "secret-value", type: "password", autocomplete: "off", required: true });
  const err = el("p", { class: "error", role: "alert" });
  const form = el("form", { class: "card", id: "set-secret", onsubmit: async (e) => {
    e.preventDefault();
    err.textContent = "";
    try {
      await api("PUT", nsPath(ns, "secrets", name.value), { data: { [key.value]: value.value } });
      value.value = "";
      await load();
    } catch (ex) { err.textContent = ex.message; }
  } },
  el("h2", { text: "Set a secret" }),
  el("p", { class: "muted", text: "Replaces the secret's keys with this one. Values are encrypted at rest and never displayed." }),
  el("div", { class: "row" }, el("label", { for: "secret-name" }, "Name", name), el("label", { for: "secret-key" }, "Key", key),
    el("label", { for: "secret-value" }, "Value", value), el("button", { type: "submit" }, "Set")), err);
  renderFor(signal, el("h1", {}, `Secrets in ${ns}`), box, form);
  await load();
}

// ---- devices and the emulator -----------------------------------------------------

// MQTT 3.1.1 over WebSocket, just what the emulator needs: CONNECT, PUBLISH at QoS 1,
// PINGREQ. It lives outside any page, so it keeps publishing while the user looks
// elsewhere in the console.
const utf8 = new TextEncoder();
function mqttString(s) { const b = utf8.encode(s); return [b.length >> 8, b.length & 255, ...b]; }
function mqttPacket(type, body) {
  const len = [];
  let n = body.length;
  do { let d = n % 128; n = Math.floor(n / 128); if (n > 0) d |= 128; len.push(d); } while (n > 0);
  return new Uint8Array([type, ...len, ...body]);
}

const Emulator = {
  ws: null, timer: null, ping: null, sent: 0, acked: 0, state: "stopped", error: "", device: null, listeners: new Set(),
  notify() { for (const f of this.listeners) f(); badge(); },
  start({ url, clientId, username, password, topic, everyMs, device }) {
    this.stop();
    this.sent = 0; this.acked = 0; this.error = ""; this.state = "connecting"; this.device = device;
    const ws = new WebSocket(url, ["mqtt"]);
    ws.binaryType = "arraybuffer";
    this.ws = ws;
    let nextId = 1;
    ws.onopen = () => {
      const flags = 0x80 | 0x40 | 0x02;
      ws.send(mqttPacket(0x10, [...mqttString("MQTT"), 4, flags, 0, 30, ...mqttString(clientId), ...mqttString(username), ...mqttString(password)]));
    };
    ws.onmessage = (ev) => {
      const b = new Uint8Array(ev.data);
      if (b[0] === 0x20) {
        if (b[3] !== 0) { this.error = `the broker refused the connection (code ${b[3]}: ${b[3] === 4 || b[3] === 5 ? "wrong credentials or not allowed" : "refused"})`; this.stop("failed"); return; }
        this.state = "publishing";
        const publish = () => {
          const id = nextId++ & 0xffff || 1;
          const payload = utf8.encode(JSON.stringify({ temperature: Math.round((18 + Math.random() * 8) * 10) / 10, seq: this.sent + 1, at: new Date().toISOString() }));
          ws.send(mqttPacket(0x32, [...mqttString(topic), id >> 8, id & 255, ...payload]));
          this.sent++;
          this.notify();
        };
        publish();
        this.timer = setInterval(publish, everyMs);
        this.ping = setInterval(() => ws.readyState === 1 && ws.send(new Uint8Array([0xc0, 0])), 20000);
      } else if (b[0] === 0x40) { this.acked++; }
      this.notify();
    };
    ws.onerror = () => { this.error = `cannot reach ${url}`; };
    ws.onclose = () => { if (this.state !== "stopped" && this.state !== "failed") { this.stop(this.error ? "failed" : "disconnected"); } };
    this.notify();
  },
  stop(state = "stopped") {
    clearInterval(this.timer); clearInterval(this.ping);
    this.timer = null; this.ping = null;
    if (this.ws) { const ws = this.ws; this.ws = null; try { ws.close(); } catch { /* closed */ } }
    this.state = state;
    this.notify();
  },
};

function badge() {
  const b = document.getElementById("emulator-badge");
  if (!b) return;
  b.hidden = Emulator.state === "stopped";
  b.textContent = `Emulator ${Emulator.device || ""}: ${Emulator.state}, ${Emulator.sent} sent`;
}

// Credentials shown once, right after create or rotate; kept in memory for the emulator.
const shownCredentials = {};

function credentialsBox(d) {
  const m = d.mqtt;
  return el("section", { class: "card creds", id: "credentials", role: "alert" },
    el("h2", { text: `Credentials of ${d.name}` }),
    el("p", { text: "Shown this once: copy the password now. sless keeps only a hash of it." }),
    el("dl", { class: "kv" },
      el("dt", { text: "Host" }), el("dd", { text: `${m.host}:${m.port}` }),
      el("dt", { text: "WebSocket" }), el("dd", { text: m.ws_url || "—" }),
      el("dt", { text: "Client id" }), el("dd", { text: m.client_id }),
      el("dt", { text: "Username" }), el("dd", { text: m.username }),
      el("dt", { text: "Password" }), el("dd", {}, el("code", { id: "device-password", text: m.password })),
      el("dt", { text: "Publish to" }), el("dd", { text: m.publish_topic }),
      el("dt", { text: "Subscribe to" }), el("dd", { text: m.subscribe_topic })));
}

async function pageDevices(ns, signal, created) {
  setNamespace(ns);
  const box = el("div", { id: "devices" });
  const load = async () => {
    let list;
    try { list = await api("GET", nsPath(ns, "devices"), undefined, { signal }); }
    catch (ex) {
      if (ex.status === 503) { box.replaceChildren(emptyState("Devices are off on this server.", "Start it with --mqtt-listen (and --mqtt-ws-listen for the emulator).")); return false; }
      throw ex;
    }
    const items = (list.items || []).sort((a, b) => a.name.localeCompare(b.name));
    box.replaceChildren(items.length ? table(["Name", "Online", "Last seen", "Messages", "Enabled", "Labels"], items.map((d) =>
      el("tr", { "data-device": d.name }, el("td", {}, el("a", { href: `#/ns/${ns}/devices/${d.name}`, text: d.name })),
        el("td", { class: d.status.online ? "ok" : "muted", text: d.status.online ? "online" : "offline" }),
        el("td", { text: ago(d.status.last_seen_at) }), el("td", { text: d.status.messages }),
        el("td", { text: d.enabled ? "yes" : "no" }),
        el("td", { text: Object.entries(d.labels || {}).map(([k, v]) => `${k}=${v}`).join(", ") }))))
      : emptyState("No devices here yet.", "Create one below: it gets MQTT credentials of its own."));
    return true;
  };
  const name = el("input", { id: "device-name", required: true });
  const err = el("p", { class: "error", role: "alert" });
  const form = el("form", { class: "card", id: "new-device", onsubmit: async (e) => {
    e.preventDefault();
    err.textContent = "";
    try {
      const d = await api("POST", nsPath(ns, "devices"), { name: name.value });
      shownCredentials[`${ns}/${d.name}`] = d.mqtt;
      location.hash = `#/ns/${ns}/devices/${d.name}`;
    } catch (ex) { err.textContent = ex.message; }
  } },
  el("h2", { text: "New device" }),
  el("div", { class: "row" }, el("label", { for: "device-name" }, "Name", name), el("button", { type: "submit" }, "Create")), err);
  renderFor(signal, el("h1", {}, `Devices in ${ns}`), box);
  if (await load()) { main().append(form); every(3000, () => load().catch(() => {}), signal); }
}

async function pageDevice(ns, name, signal) {
  setNamespace(ns);
  let d = await api("GET", nsPath(ns, "devices", name));
  const key = `${ns}/${name}`;
  const once = shownCredentials[key] && shownCredentials[key].password ? { ...d, mqtt: shownCredentials[key] } : null;
  // Shown once: a reload or a later visit no longer has it.
  if (shownCredentials[key]) {
    const c = shownCredentials[key];
    shownCredentials[key] = { ...c, password: undefined, remembered: c.password || c.remembered };
  }
  const statusBox = el("section", { class: "card", id: "device-status" });
  const showStatus = () => statusBox.replaceChildren(el("h2", { text: "Status" }), el("dl", { class: "kv" },
    el("dt", { text: "Online" }), el("dd", { id: "device-online", text: d.status.online ? "online" : "offline" }),
    el("dt", { text: "Last seen" }), el("dd", { text: ago(d.status.last_seen_at) }),
    el("dt", { text: "Messages" }), el("dd", { id: "device-messages", text: d.status.messages }),
    el("dt", { text: "Enabled" }), el("dd", { text: d.enabled ? "yes" : "no" }),
    el("dt", { text: "Username" }), el("dd", { text: d.mqtt.username }),
    el("dt", { text: "Topics" }), el("dd", { text: `publish ${d.mqtt.publish_topic}, subscribe ${d.mqtt.subscribe_topic}` })),
  el("p", { class: "row" },
    el("button", { type: "button", id: "device-rotate", class: "secondary", onclick: async () => {
      if (!confirm("Rotate the password? The old one stops working at once.")) return;
      try { const r = await api("POST", nsPath(ns, "devices", name, "credentials")); shownCredentials[key] = r.mqtt; route(); } catch (ex) { toast(ex.message); }
    } }, "Rotate credentials"),
    el("button", { type: "button", id: "device-enable", class: "secondary", onclick: async () => {
      try { d = await api("PATCH", nsPath(ns, "devices", name), { enabled: !d.enabled }); showStatus(); } catch (ex) { toast(ex.message); }
    } }, d.enabled ? "Disable" : "Enable"),
    el("button", { type: "button", class: "secondary", onclick: async () => {
      if (!confirm(`Delete the device ${name}? Its credentials stop working at once.`)) return;
      try { await api("DELETE", nsPath(ns, "devices", name)); location.hash = `#/ns/${ns}/devices`; } catch (ex) { toast(ex.message); }
    } }, "Delete")));
  const telemetry = el("div", { id: "telemetry" });
  const chart = el("div", { id: "telemetry-chart" });
  const loadTelemetry = async () => {
    const t = await api("GET", nsPath(ns, "devices", name, "telemetry") + "?limit=100", undefined, { signal });
    const items = t.items || [];
    telemetry.replaceChildren(items.length ? table(["Received", "Payload"], items.map((m) =>
      el("tr", { class: "telemetry-row" }, el("td", { text: ago(m.received_at), title: m.received_at }), el("td", {}, el("code", { text: JSON.stringify(m.payload) })))))
      : emptyState("No telemetry yet.", `The device publishes to ${d.mqtt.publish_topic}; try the emulator below.`));
    // Every numeric field of the payloads, over the last hour.
    const fields = {};
    for (const m of items) if (m.payload && typeof m.payload === "object") for (const [k, v] of Object.entries(m.payload)) if (typeof v === "number" && k !== "seq") (fields[k] ||= []).push([Date.parse(m.received_at), v]);
    const series = Object.entries(fields).slice(0, 3).map(([k, pts]) => ({ name: k, points: pts.sort((a, b) => a[0] - b[0]) }));
    chart.replaceChildren(series.length ? lineChart("Numeric telemetry fields", series, Date.now() - 3600 * 1000, Date.now(), "") : "");
    d = await api("GET", nsPath(ns, "devices", name), undefined, { signal });
    showStatus();
  };
  const command = el("textarea", { id: "command-body", rows: 3, text: '{"led": "on"}' });
  const commandForm = el("form", { class: "card", id: "send-command", onsubmit: async (e) => {
    e.preventDefault();
    try { await api("POST", nsPath(ns, "devices", name, "commands"), JSON.parse(command.value)); toast(`Command sent to ${d.mqtt.subscribe_topic}`); }
    catch (ex) { toast(ex instanceof SyntaxError ? "The command is not JSON" : ex.message); }
  } }, el("h2", { text: "Send a command" }), el("label", { for: "command-body" }, "JSON", command), el("button", { type: "submit" }, "Send"));
  renderFor(signal, el("h1", {}, el("a", { href: `#/ns/${ns}/devices`, text: "Devices" }), " / ", name),
    once ? credentialsBox(once) : null, statusBox,
    el("section", { class: "card" }, el("h2", { text: "Telemetry" }), chart, telemetry),
    emulatorPanel(ns, d, shownCredentials[key] && shownCredentials[key].remembered),
    commandForm);
  showStatus();
  await loadTelemetry();
  every(2000, () => loadTelemetry().catch(() => {}), signal);
}

function emulatorPanel(ns, d, remembered) {
  const m = d.mqtt;
  const url = el("input", { id: "emu-url", value: m.ws_url || "", size: 30 });
  const pass = el("input", { id: "emu-password", type: "password", autocomplete: "off" });
  // As a property, not an attribute: the password never becomes part of the document.
  pass.value = remembered || "";
  const every = el("input", { id: "emu-every", type: "number", min: 1, value: 2, size: 4 });
  const state = el("p", { id: "emu-state", "aria-live": "polite" });
  const show = () => {
    state.textContent = Emulator.device === d.name || Emulator.state === "stopped"
      ? `${Emulator.state}${Emulator.error ? ": " + Emulator.error : ""} · ${Emulator.sent} published, ${Emulator.acked} acknowledged`
      : `running for ${Emulator.device}`;
  };
  Emulator.listeners.clear();
  Emulator.listeners.add(show);
  show();
  return el("section", { class: "card", id: "emulator" },
    el("h2", { text: "Device emulator" }),
    el("p", { class: "muted", text: "Connects to the broker over MQTT-over-WebSocket with this device's credentials and publishes a generated reading on a timer, which keeps running while you use the rest of the console." }),
    el("div", { class: "row" },
      el("label", { for: "emu-url" }, "WebSocket URL", url), el("label", { for: "emu-password" }, "Password", pass),
      el("label", { for: "emu-every" }, "Every (s)", every)),
    el("p", { class: "row" },
      el("button", { type: "button", id: "emu-start", onclick: () => {
        if (!url.value) { toast("This server has no MQTT-over-WebSocket listener (--mqtt-ws-listen)."); return; }
        Emulator.start({ url: url.value, clientId: `${m.client_id}-console`, username: m.username, password: pass.value,
          topic: m.publish_topic, everyMs: Math.max(1, Number(every.value) || 2) * 1000, device: d.name });
      } }, "Start"),
      el("button", { type: "button", id: "emu-stop", class: "secondary", onclick: () => Emulator.stop() }, "Stop")),
    state);
}

// ---- routing ------------------------------------------------------------------------

async function route() {
  if (!S.csrf) return;
  const signal = stopPage();
  const parts = location.hash.replace(/^#\/?/, "").split("/").filter(Boolean).map(decodeURIComponent);
  try {
    if (parts[0] === "ns" && parts[1] && parts[2] === "fn" && parts[3]) await pageFunction(parts[1], parts[3], signal);
    else if (parts[0] === "ns" && parts[1] && parts[2] === "triggers") await pageTriggers(parts[1], signal);
    else if (parts[0] === "ns" && parts[1] && parts[2] === "jobs") await pageJobs(parts[1], signal);
    else if (parts[0] === "ns" && parts[1] && parts[2] === "events") await pageEvents(parts[1], signal);
    else if (parts[0] === "ns" && parts[1] && parts[2] === "secrets") await pageSecrets(parts[1], signal);
    else if (parts[0] === "ns" && parts[1] && parts[2] === "devices" && parts[3]) await pageDevice(parts[1], parts[3], signal);
    else if (parts[0] === "ns" && parts[1] && parts[2] === "devices") await pageDevices(parts[1], signal);
    else if (parts[0] === "ns" && parts[1]) await pageFunctions(parts[1], signal);
    else await pageNamespaces(signal);
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
