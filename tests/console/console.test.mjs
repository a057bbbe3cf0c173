// Browser tests of the web console, in Debian's Chromium driven by playwright-core.
// Started by crates/sless/tests/it/console.rs against a real `sless serve`:
//   SLESS_URL, SLESS_TOKEN (admin), HELLO_ZIP (a Python function printing a log line),
//   SHOT_DIR (where screenshots go). Exits non-zero naming the step that failed.
import { chromium } from "playwright-core";
import { writeFileSync } from "node:fs";
import { join } from "node:path";

const base = process.env.SLESS_URL;
const admin = process.env.SLESS_TOKEN;
const zip = process.env.HELLO_ZIP;
const pickyZip = process.env.PICKY_ZIP;
const shots = process.env.SHOT_DIR;

async function api(method, path, body, token = admin) {
  const r = await fetch(base + path, {
    method,
    headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await r.text();
  if (!r.ok) throw new Error(`${method} ${path}: ${r.status} ${text}`);
  return text ? JSON.parse(text) : null;
}

function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`);
}

let step = "start";
const errors = [];
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});

async function newPage(viewport = { width: 1280, height: 800 }) {
  const ctx = await browser.newContext({ viewport });
  const page = await ctx.newPage();
  page.on("console", (m) => { if (m.type() === "error") errors.push(`${step}: ${m.text()}`); });
  page.on("pageerror", (e) => errors.push(`${step}: ${e.message}`));
  return { ctx, page };
}

async function signIn(page, token) {
  await page.goto(base + "/console");
  await page.waitForSelector("#sign-in");
  check(await page.getAttribute("#token", "type") === "password", "the token field is a password field");
  await page.fill("#token", token);
  await page.click("#sign-in button[type=submit]");
  await page.waitForSelector("#nav:not([hidden])");
}

// The browser logs a refused request itself; drops those of status `code` since `mark`.
function expected(mark, code) {
  const later = errors.splice(mark);
  errors.push(...later.filter((e) => !e.includes(`status of ${code}`)));
}

async function shot(page, name) {
  await page.evaluate(() => window.scrollTo(0, 0));
  await page.screenshot({ path: join(shots, `${name}.png`), fullPage: false });
}

try {
  step = "setup";
  await api("PUT", "/v1/namespaces/team-a");
  await api("PUT", "/v1/namespaces/team-b");
  await api("POST", "/v1/namespaces/team-b/functions", { name: "other", runtime: "python3" });
  const nsToken = (await api("POST", "/v1/tokens", { namespace: "team-a" })).token;

  step = "sign in with the admin token";
  const { ctx, page } = await newPage();
  await signIn(page, admin);
  await page.waitForSelector("#main a:has-text(\"team-b\")");
  const cookies = await ctx.cookies();
  const session = cookies.find((c) => c.name === "sless_session");
  check(session && session.httpOnly && session.sameSite === "Strict", "an HttpOnly SameSite=Strict session cookie");
  check(await page.evaluate(() => document.cookie) === "", "the page's script cannot read the session");
  await shot(page, "namespaces");

  step = "an empty namespace is a friendly page";
  await page.goto(base + "/console#/ns/team-a");
  await page.waitForSelector("text=No functions here yet.");

  step = "deploy by uploading a zip";
  await page.fill("#new-name", "hello");
  await page.setInputFiles("#new-zip", zip);
  await page.click("#new-function button[type=submit]");
  await page.waitForSelector("#status .phase-Ready", { timeout: 90000 });
  await page.waitForSelector("#source >> text=handler.py");

  step = "invoke from the panel";
  await page.fill("#invoke-body", JSON.stringify({ name: "console" }));
  await page.click("#invoke");
  await page.waitForSelector("#invoke-status");
  check(await page.textContent("#invoke-status") === "200", "the invoke answered 200");
  check((await page.textContent("#invoke-answer")).includes("hello, console"), "the invoke answer");

  step = "a log line appears live";
  await page.waitForFunction(() => document.querySelector("#logs").textContent.includes("console-log-line"), null, { timeout: 30000 });
  await page.waitForSelector("#invocations td >> text=200");
  await page.waitForSelector("#charts svg circle", { timeout: 30000 });
  check((await page.$$("#charts svg")).length === 2, "the rate/errors and latency charts");
  await shot(page, "function");

  step = "toggle a trigger";
  await api("POST", "/v1/namespaces/team-a/triggers", { name: "web", function: "hello", type: "http", path: "/hello" });
  await page.goto(base + "/console#/ns/team-a/triggers");
  await page.waitForSelector("button[data-trigger=web][aria-pressed=true]");
  await page.click("button[data-trigger=web]");
  await page.waitForSelector("button[data-trigger=web][aria-pressed=false]");
  check((await api("GET", "/v1/namespaces/team-a/triggers/web")).enabled === false, "the API says the trigger is disabled");
  await shot(page, "triggers");

  step = "create a cron trigger from the form";
  await page.fill("#trigger-name", "nightly");
  await page.fill("#trigger-function", "hello");
  await page.selectOption("#trigger-type", "cron");
  await page.fill("#trigger-schedule", "0 3 * * *");
  await page.click("#new-trigger button[type=submit]");
  await page.waitForSelector("button[data-trigger=nightly][aria-pressed=true]");
  check((await api("GET", "/v1/namespaces/team-a/triggers/nightly")).schedule === "0 3 * * *", "the API has the cron trigger");

  step = "a change without the CSRF token is refused";
  const mark = errors.length;
  const status = await page.evaluate(async () => (await fetch("/v1/namespaces/team-a/triggers/web", {
    method: "PATCH", headers: { "Content-Type": "application/json" }, body: '{"enabled": true}' })).status);
  check(status === 403, `PATCH without the CSRF header answered ${status}`);
  expected(mark, "403");

  step = "run a job and re-run it";
  await api("POST", "/v1/namespaces/team-a/jobs", { name: "once", function: "hello", event: { name: "job" }, run_id: 0 });
  await page.goto(base + "/console#/ns/team-a/jobs");
  await page.waitForSelector("tr[data-job-row=once] >> text=Skipped");
  await page.click("button[data-job=once]");
  await page.waitForSelector("tr[data-job-row=once] >> text=Succeeded", { timeout: 60000 });
  check((await page.textContent("tr[data-job-row=once] .outcome")).includes("hello, job"), "the job's result is shown");
  await page.click("button[data-job=once]");
  await page.waitForSelector("tr[data-job-row=once] td:nth-child(4) >> text=2", { timeout: 60000 });
  await shot(page, "jobs");

  step = "redrive a dead letter";
  await api("POST", "/v1/namespaces/team-a/functions", { name: "picky", runtime: "python3", env: { FAIL: "1" } });
  let r = await fetch(`${base}/v1/namespaces/team-a/functions/picky/code`, {
    method: "PUT", headers: { Authorization: `Bearer ${admin}`, "Content-Type": "application/zip" },
    body: (await import("node:fs")).readFileSync(pickyZip) });
  check(r.status === 202, `upload answered ${r.status}`);
  for (let i = 0; i < 300; i++) {
    const f = await api("GET", "/v1/namespaces/team-a/functions/picky");
    if (f.status.phase === "Ready") break;
    await new Promise((res) => setTimeout(res, 200));
  }
  r = await fetch(`${base}/async/team-a/picky`, { method: "POST", body: "{}" });
  check(r.status === 202, `async call answered ${r.status}`);
  await page.goto(base + "/console#/ns/team-a/events");
  await page.waitForSelector("tr[data-dead-letter]", { timeout: 60000 });
  await shot(page, "events");
  const f = await api("PATCH", "/v1/namespaces/team-a/functions/picky", { env: { FAIL: "0" } });
  for (let i = 0; i < 300; i++) {
    const g = await api("GET", "/v1/namespaces/team-a/functions/picky");
    if (g.status.phase === "Ready" && g.status.revision >= f.status.revision) break;
    await new Promise((res) => setTimeout(res, 200));
  }
  await page.click("tr[data-dead-letter] button.redrive");
  await page.waitForSelector("#dead-letters >> text=No dead letters.", { timeout: 60000 });
  check((await api("GET", "/v1/namespaces/team-a/dead-letters")).items.length === 0, "the API has no dead letters left");

  step = "set a secret: its value is never shown";
  await page.goto(base + "/console#/ns/team-a/secrets");
  await page.waitForSelector("text=No secrets here yet.");
  await page.fill("#secret-name", "db");
  await page.fill("#secret-key", "dsn");
  await page.fill("#secret-value", "s3cr3t-value");
  await page.click("#set-secret button[type=submit]");
  await page.waitForSelector("tr[data-secret=db] >> text=dsn");
  check(!(await page.content()).includes("s3cr3t-value"), "the secret's value is not in the page");
  await shot(page, "secrets");

  step = "create a device and see its credentials once";
  await page.goto(base + "/console#/ns/team-a/devices");
  await page.waitForSelector("text=No devices here yet.");
  await page.fill("#device-name", "t1");
  await page.click("#new-device button[type=submit]");
  await page.waitForSelector("#credentials #device-password");
  const password = (await page.textContent("#device-password")).trim();
  check(password.length >= 16, "a password is shown");
  await shot(page, "device");

  step = "publish with the emulator and see the telemetry row appear";
  await page.click("#emu-start");
  await page.waitForFunction(() => document.querySelector("#emu-state").textContent.startsWith("publishing"), null, { timeout: 30000 });
  // The emulator keeps publishing while the user is elsewhere in the console.
  await page.goto(base + "/console#/ns/team-a");
  await page.waitForSelector("#emulator-badge:not([hidden])");
  for (let i = 0; i < 100; i++) {
    const t = await api("GET", "/v1/namespaces/team-a/devices/t1/telemetry");
    if (t.items.length >= 3) break;
    await new Promise((res) => setTimeout(res, 300));
  }
  await page.goto(base + "/console#/ns/team-a/devices/t1");
  await page.waitForSelector("#telemetry .telemetry-row");
  check((await page.textContent("#telemetry")).includes("temperature"), "a telemetry row shows the reading");
  check(await page.$("#credentials") === null, "the credentials are not shown again");
  check(!(await page.content()).includes(password), "the password is not in the page any more");
  await page.click("#emu-stop");

  step = "disable the device";
  await page.click("#device-enable");
  await page.waitForSelector("#device-status dd >> text=no");
  check((await api("GET", "/v1/namespaces/team-a/devices/t1")).enabled === false, "the API says the device is disabled");

  step = "send a command";
  await page.click("#send-command button[type=submit]");
  await page.waitForSelector("#toast >> text=Command sent");

  step = "the function list with 200 functions";
  await api("PUT", "/v1/namespaces/many");
  await Promise.all(Array.from({ length: 200 }, (_, i) =>
    api("POST", "/v1/namespaces/many/functions", { name: `fn-${String(i).padStart(3, "0")}`, runtime: "python3" })));
  const t0 = Date.now();
  await page.goto(base + "/console#/ns/many");
  await page.waitForFunction(() => document.querySelectorAll("tr[data-function]").length === 200);
  const listMs = Date.now() - t0;
  await shot(page, "functions");

  step = "a phone-width screen";
  await page.setViewportSize({ width: 390, height: 844 });
  await page.goto(base + "/console#/ns/team-a/fn/hello");
  await page.waitForSelector("#status .phase-Ready");
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  check(overflow <= 1, `the page is ${overflow}px wider than a phone screen`);
  await shot(page, "function-phone");
  await page.setViewportSize({ width: 1280, height: 800 });

  step = "keyboard: the sign-out button is reachable with Tab";
  await page.focus(".brand");
  let reached = false;
  for (let i = 0; i < 12 && !reached; i++) {
    await page.keyboard.press("Tab");
    reached = await page.evaluate(() => document.activeElement && document.activeElement.id === "sign-out");
  }
  check(reached, "Tab reaches the sign-out button");

  step = "sign out";
  await page.click("#sign-out");
  await page.waitForSelector("#sign-in");
  const signedOut = errors.length;
  const after = await page.evaluate(async () => (await fetch("/v1/whoami")).status);
  expected(signedOut, "401");
  check(after === 401, `after sign-out /v1/whoami answered ${after}`);
  await shot(page, "sign-in");
  await ctx.close();

  step = "sign in with a namespace token";
  const other = await newPage();
  await signIn(other.page, nsToken);
  await other.page.waitForSelector("#status, h1");
  const options = await other.page.$$eval("#ns-select option", (os) => os.map((o) => o.value));
  check(JSON.stringify(options) === '["team-a"]', `a team-a token sees namespaces ${JSON.stringify(options)}`);
  await other.page.waitForSelector("tr[data-function=hello]");
  step = "another namespace's function is a not-found page";
  const before = errors.length;
  await other.page.goto(base + "/console#/ns/team-b/fn/other");
  await other.page.waitForSelector("h1 >> text=Not found");
  expected(before, "404");
  await other.ctx.close();

  step = "no errors in the browser console";
  check(errors.length === 0, `browser console errors:\n${errors.join("\n")}`);
  writeFileSync(join(shots, "figures.json"), JSON.stringify({ function_list_200_ms: listMs }));
  console.log(`ok: function list of 200 rendered in ${listMs} ms`);
} catch (e) {
  console.error(`console test failed at "${step}": ${e.message}`);
  if (errors.length) console.error(`browser console errors:\n${errors.join("\n")}`);
  process.exitCode = 1;
} finally {
  await browser.close();
}
