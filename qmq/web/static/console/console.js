// QMQ console: a static page that calls the broker's own JSON API
// (/api/v1, docs/http-api.rst) and /metrics with the user's credentials.
//
// The credentials are kept in this module's memory only (no cookie, no
// storage): every request carries them in an Authorization header, sent
// with credentials: "omit" so the browser adds none of its own and shows no
// prompt of its own. Every state-changing request has a JSON body or none
// (the site's guard, qmq/web/guard.py, refuses anything a form could send),
// and goes to this page's own origin. Nothing is loaded from elsewhere: the
// charts are drawn on <canvas> here.
//
// A user logs in with a password (HTTP Basic) or with a token of the virtual
// host (a JWT, sent as a bearer token). Queues, exchanges and bindings are
// made through the API's own PUT and POST, as a program would.

const HISTORY = 60; // points per chart: five minutes at the default refresh (5 s)
const LIST_LIMIT = 500;
// The overview's totals walk every page of the queue listing (at most
// WALK_PAGES pages of WALK_LIMIT queues: a bounded walk).
const WALK_LIMIT = 1000;
const WALK_PAGES = 100;

const state = {
  auth: null, // "Basic ..." or "Bearer ...", or null (authentication off)
  user: "",
  vhost: "/",
  vhosts: [],
  admin: false,
  metrics: null, // may read /metrics (admins and monitors): null until asked
  tab: "overview",
  timer: null,
  poll: 5000, // ms between readings (the refresh selector)
  samples: [], // {t, counters: {kind: {protocol: n}}, memory, watermark, disk, diskLimit}
  browse: null, // {queue, cursor, start, end}
  queueOffset: 0, // the Queues tab's page (offset into the listing)
};

const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

const enc = encodeURIComponent;
const vpath = (rest = "") => `/api/v1/vhosts/${enc(state.vhost)}${rest}`;

function fmt(n, digits = 0) {
  if (n === null || n === undefined || Number.isNaN(n)) return "–";
  return Number(n).toLocaleString("en", { maximumFractionDigits: digits });
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

// The subject of a JWT, for the header (the broker checks the token; the
// page only shows whom it names).
function tokenSubject(token) {
  try {
    const part = token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    const text = atob(part + "=".repeat((4 - (part.length % 4)) % 4));
    const bytes = Uint8Array.from(text, (c) => c.charCodeAt(0));
    return String(JSON.parse(new TextDecoder().decode(bytes)).sub || "token");
  } catch {
    return "token";
  }
}

function basic(user, password) {
  const raw = new TextEncoder().encode(`${user}:${password}`);
  let text = "";
  for (const b of raw) text += String.fromCharCode(b);
  return `Basic ${btoa(text)}`;
}

class ApiError extends Error {
  constructor(status, doc) {
    super(doc && (doc.detail || doc.error) ? `${status}: ${doc.detail || doc.error}` : `HTTP ${status}`);
    this.status = status;
    this.doc = doc || {};
  }
}

// One request to the broker. body undefined: no body and no Content-Type;
// otherwise JSON. Answers the parsed JSON (or text, for /metrics).
async function call(method, path, body, { text = false, status = false } = {}) {
  const headers = { Accept: text ? "text/plain" : "application/json" };
  if (state.auth) headers.Authorization = state.auth;
  const init = { method, headers, credentials: "omit", cache: "no-store", redirect: "error" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (!response.ok) {
    let doc = null;
    try { doc = await response.json(); } catch { /* not JSON */ }
    throw new ApiError(response.status, doc);
  }
  const answer = await (text ? response.text() : response.json());
  return status ? [response.status, answer] : answer;
}

function flash(message, error = false) {
  const box = $("flash");
  box.textContent = message;
  box.className = error ? "error" : "";
  box.hidden = !message;
}

function failed(e) {
  if (e instanceof ApiError && e.status === 401) {
    logout("Your login was refused; log in again.");
    return;
  }
  flash(String(e.message || e), true);
}

// -- logging in ------------------------------------------------------------------

async function start() {
  $("login-form").addEventListener("submit", (e) => { e.preventDefault(); login(); });
  for (const radio of document.querySelectorAll("input[name=login-mode]")) {
    radio.addEventListener("change", loginMode);
  }
  $("logout").addEventListener("click", () => logout(""));
  $("vhost").addEventListener("change", () => {
    state.vhost = $("vhost").value;
    state.samples = [];
    state.queueOffset = 0;
    show(state.tab);
  });
  $("refresh").addEventListener("change", () => { state.poll = Number($("refresh").value); show(state.tab); });
  window.addEventListener("hashchange", () => show(location.hash.slice(1)));
  bindForms();
  // Authentication off: the API answers without credentials.
  try {
    await call("GET", "/api/v1/vhosts");
    await enter(null, "", "/");
  } catch (e) {
    if (e instanceof ApiError && (e.status === 401 || e.status === 403)) showLogin("");
    else showLogin(String(e.message || e));
  }
}

function showLogin(error) {
  stopPolling();
  for (const section of document.querySelectorAll("main > section")) section.hidden = section.id !== "login";
  $("tabs").hidden = true;
  $("who").hidden = true;
  $("login-error").textContent = error;
  $("login-error").hidden = !error;
}

// Password or token: only the chosen mode's fields are shown and required.
function loginMode() {
  const mode = $("login-mode-token").checked ? "token" : "password";
  for (const label of document.querySelectorAll("#login-form [data-mode]")) {
    const on = label.dataset.mode === mode;
    label.hidden = !on;
    for (const input of label.querySelectorAll("input, textarea")) input.required = on;
  }
}

async function login() {
  const token = $("login-mode-token").checked ? $("login-token").value.trim() : null;
  const user = token ? tokenSubject(token) : $("login-user").value;
  const auth = token ? `Bearer ${token}` : basic(user, $("login-password").value);
  const vhost = $("login-vhost").value || "/";
  $("login-error").hidden = true;
  try {
    await enter(auth, user, vhost);
    $("login-password").value = "";
    $("login-token").value = "";
  } catch (e) {
    state.auth = null;
    const why = e instanceof ApiError && e.status === 401
      ? (token ? "The token was refused (expired, or not signed with this virtual host's key)."
        : "Wrong user name or password.")
      : e instanceof ApiError && e.status === 403 ? `${user} may not use the virtual host ${vhost}.`
      : String(e.message || e);
    showLogin(why);
  }
}

// Checks the login against the virtual host, then finds what this user may see.
async function enter(auth, user, vhost) {
  state.auth = auth;
  state.user = user;
  state.vhost = vhost;
  await call("GET", vpath());
  try {
    state.vhosts = (await call("GET", "/api/v1/vhosts")).vhosts.map((v) => v.name);
  } catch {
    state.vhosts = [vhost]; // a user who may not use "/" cannot list them
  }
  if (!state.vhosts.includes(vhost)) state.vhosts.unshift(vhost);
  // Admins (http_api.admins) may list users; nobody else may.
  try {
    await call("GET", "/api/v1/users?limit=1");
    state.admin = true;
  } catch {
    state.admin = false;
  }
  const select = $("vhost");
  select.replaceChildren(...state.vhosts.map((v) => el("option", { value: v, selected: v === vhost }, v)));
  $("user").textContent = auth ? `${user}${state.admin ? " (admin)" : ""}` : "authentication off";
  $("logout").hidden = !auth;
  for (const link of document.querySelectorAll("[data-admin]")) link.hidden = !state.admin;
  $("tabs").hidden = false;
  $("who").hidden = false;
  $("login").hidden = true;
  flash("");
  show(location.hash.slice(1) || "overview");
}

function logout(message) {
  state.auth = null;
  state.admin = false;
  state.metrics = null;
  state.samples = [];
  $("login-password").value = "";
  $("login-token").value = "";
  flash(message, Boolean(message));
  showLogin("");
}

// -- tabs --------------------------------------------------------------------------

const TABS = {
  overview: { load: loadOverview, poll: true },
  queues: { load: loadQueues, poll: true },
  exchanges: { load: loadExchanges },
  connections: { load: loadConnections, admin: true, poll: true },
  links: { load: loadLinks, admin: true, poll: true },
  users: { load: loadUsers, admin: true },
};

function show(tab) {
  if (!TABS[tab] || (TABS[tab].admin && !state.admin)) tab = "overview";
  if ($("tabs").hidden) return; // not logged in yet
  state.tab = tab;
  for (const section of document.querySelectorAll("section.tab")) section.hidden = section.id !== tab;
  for (const link of document.querySelectorAll("#tabs a")) link.classList.toggle("active", link.dataset.tab === tab);
  stopPolling();
  const run = () => TABS[tab].load().catch(failed);
  run();
  // No readings while the page is in a background tab: it would only load the broker.
  if (TABS[tab].poll) state.timer = setInterval(() => { if (!document.hidden) run(); }, state.poll);
}

function stopPolling() {
  if (state.timer !== null) clearInterval(state.timer);
  state.timer = null;
}

function table(columns, rows, empty) {
  if (!rows.length) return el("p", { class: "empty" }, empty);
  return el("table", {},
    el("thead", {}, el("tr", {}, columns.map((c) => el("th", { class: c.num ? "num" : null }, c.label)))),
    el("tbody", {}, rows.map((row) => el("tr", { "data-name": row.name ?? row.id ?? null },
      columns.map((c) => {
        const value = c.value(row);
        return el("td", { class: c.num ? "num" : c.cls || null, "data-label": c.label, "data-col": c.key || null },
          value instanceof Node || Array.isArray(value) ? value : c.num ? fmt(value, c.digits || 0) : value ?? "");
      })))));
}

function button(label, onclick, danger = false) {
  return el("button", { type: "button", class: danger ? "danger" : null, onclick }, label);
}

// -- overview ------------------------------------------------------------------------

// Prometheus text format, the little of it the console reads: name{labels} value.
function parseMetrics(text) {
  const out = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = /^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels = {};
    for (const l of (m[2] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2];
    out.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return out;
}

function first(metrics, ...names) {
  for (const name of names) {
    const m = metrics.find((x) => x.name === name);
    if (m) return m.value;
  }
  return null;
}

// Every queue the user may read, page by page (offset and next_offset, as
// the API pages every listing), bounded by WALK_PAGES. Answers
// {queues, total}; total counts them all even when the walk stopped early.
async function walkQueues() {
  const queues = [];
  let offset = 0;
  let total = 0;
  let limit = WALK_LIMIT;
  for (let pages = 0; pages < WALK_PAGES && offset !== null; pages++) {
    let page;
    try {
      page = await call("GET", vpath(`/queues?limit=${limit}&offset=${offset}`));
    } catch (e) {
      // A broker whose http_api.max_list is below WALK_LIMIT: smaller pages.
      if (e instanceof ApiError && e.status === 400 && limit > 100 && pages === 0) { limit = 100; pages--; continue; }
      throw e;
    }
    queues.push(...page.queues);
    total = page.total ?? queues.length;
    offset = page.next_offset ?? null;
  }
  return { queues, total };
}

async function loadOverview() {
  const [queues, health, metrics] = await Promise.all([
    walkQueues(),
    call("GET", "/api/v1/health").catch((e) => (e instanceof ApiError && e.status === 503 ? e.doc : null)),
    state.metrics === false ? null : call("GET", "/metrics", undefined, { text: true }).then(parseMetrics, (e) => {
      // Only admins and monitors (http_api.admins, http_api.monitors) may read it: ask once.
      if (e instanceof ApiError && (e.status === 401 || e.status === 403)) state.metrics = false;
      return null;
    }),
  ]);
  const qs = queues.queues;
  const sum = (key) => qs.reduce((n, q) => n + (q[key] || 0), 0);
  const rate = (key) => qs.reduce((n, q) => n + ((q.message_stats || {})[key] || 0), 0);
  const cards = [
    ["queues", queues.total ?? qs.length, 0],
    ["ready", sum("messages_ready"), 0],
    ["unacked", sum("messages_unacknowledged"), 0],
    ["consumers", sum("consumers"), 0],
    ["published/s", rate("publish_rate"), 1],
    ["delivered/s", rate("deliver_rate"), 1],
  ];
  const sample = { t: Date.now(), counters: {}, memory: null, watermark: null, disk: null, diskLimit: null };
  if (metrics) {
    state.metrics = true;
    const conns = metrics.filter((m) => m.name === "qmq_connections").reduce((n, m) => n + m.value, 0);
    cards.push(["connections", conns, 0]);
    for (const m of metrics) {
      const kind = /^qmq_(?:protocol_)?messages_(published|delivered|acked)(?:_total)?$/.exec(m.name);
      if (kind && m.labels.protocol !== undefined) {
        (sample.counters[kind[1]] ??= {})[m.labels.protocol] = m.value;
      }
    }
    sample.memory = first(metrics, "qmq_memory_rss_bytes", "qmq_process_resident_memory_bytes", "process_resident_memory_bytes");
    sample.watermark = first(metrics, "qmq_memory_high_watermark_bytes", "qmq_memory_limit_bytes");
    sample.disk = first(metrics, "qmq_disk_free_bytes");
    sample.diskLimit = first(metrics, "qmq_disk_free_limit_bytes", "qmq_disk_limit_bytes");
  }
  $("cards").replaceChildren(...cards.map(([label, value, digits]) =>
    el("div", { class: "card", "data-card": label }, el("b", {}, fmt(value, digits)), el("span", {}, label))));
  if (queues.total > qs.length) {
    $("cards").append(el("p", { class: "note" }, `Messages, consumers and rates: the first ${fmt(qs.length)} queues of ${fmt(queues.total)}.`));
  }
  // GET /api/v1/health: each readiness check, and the alarms holding publishers back.
  const checks = (health && health.checks) || {};
  const alarms = (checks.alarms && checks.alarms.alarms) || [];
  const failing = Object.entries(checks).filter(([name, c]) => name !== "alarms" && c && c.ok === false);
  const problems = [
    ...alarms.map((name) => `${name} alarm: publishers are held back${name === "memory" ? "" : " (persistent messages)"}.`),
    ...failing.map(([name]) => `The ${name} check fails.`),
  ];
  $("alarms").replaceChildren(problems.length
    ? problems.map((text) => el("p", { class: "alarm" }, text))
    : el("p", { class: "alarm clear" }, health ? "No alarm: publishers are admitted." : "Health unknown."));
  state.samples.push(sample);
  if (state.samples.length > HISTORY + 1) state.samples.shift();
  drawCharts();
}

const COLORS = ["#2f6fd6", "#1e8e4f", "#c77c02", "#8e44ad", "#c0392b", "#16a0a0", "#555"];

function drawCharts() {
  const note = $("charts-note");
  const box = $("charts");
  note.textContent = "Message rates by protocol and memory come from /metrics, which only admins and monitors may read.";
  note.hidden = state.metrics !== false;
  const samples = state.samples;
  const charts = [];
  if (state.metrics) {
    for (const kind of ["published", "delivered", "acked"]) {
      const protocols = new Set();
      for (const s of samples) for (const p of Object.keys(s.counters[kind] || {})) protocols.add(p);
      const series = [...protocols].sort().map((p, i) => ({
        label: p, color: COLORS[i % COLORS.length],
        points: samples.slice(1).map((s, j) => {
          const before = (samples[j].counters[kind] || {})[p];
          const now = (s.counters[kind] || {})[p];
          const dt = (s.t - samples[j].t) / 1000;
          return before === undefined || now === undefined || dt <= 0 ? null : Math.max(0, (now - before) / dt);
        }),
      }));
      charts.push({ id: `chart-${kind}`, title: `Messages ${kind} / s, by protocol`, series, unit: fmt,
        wait: samples.length < 2 });
    }
    charts.push({ id: "chart-memory", title: "Memory (resident) and its alarm", unit: bytes, series: [
      { label: "resident", color: COLORS[0], points: samples.map((s) => s.memory) },
      { label: "high watermark", color: "#c0392b", dashed: true, points: samples.map((s) => s.watermark) },
    ] });
  }
  if (samples.some((s) => s.disk !== null)) {
    charts.push({ id: "chart-disk", title: "Disk free and its alarm", unit: bytes, series: [
      { label: "free", color: COLORS[1], points: samples.map((s) => s.disk) },
      { label: "limit", color: "#c0392b", dashed: true, points: samples.map((s) => s.diskLimit) },
    ] });
  }
  for (const chart of charts) {
    let figure = document.getElementById(chart.id);
    if (!figure) {
      figure = el("div", { class: "chart", id: chart.id }, el("h3", {}, chart.title), el("canvas", {}),
        el("div", { class: "legend" }));
      box.append(figure);
    }
    const legend = figure.querySelector(".legend");
    legend.replaceChildren(...(chart.wait ? [el("span", {}, "measuring…")] : chart.series.map((s) => {
      const last = [...s.points].reverse().find((p) => p !== null && p !== undefined);
      return el("span", {}, el("i", { class: s.dashed ? "dashed" : null, "data-color": s.color }),
        `${s.label} ${last === undefined ? "–" : chart.unit(last)}`);
    })));
    for (const i of legend.querySelectorAll("i[data-color]")) {
      i.style.background = i.dataset.color;
      i.style.borderColor = i.dataset.color;
    }
    plot(figure.querySelector("canvas"), chart.series, chart.unit);
  }
  for (const figure of [...box.children]) if (!charts.some((c) => c.id === figure.id)) figure.remove();
}

// A line chart on a canvas, scaled for the screen's pixel ratio; the y axis
// from 0 to the largest value; dashed series are limits (alarms).
function plot(canvas, series, unit) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || 300;
  const height = canvas.clientHeight || 150;
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(height * ratio);
  const g = canvas.getContext("2d");
  g.scale(ratio, ratio);
  g.clearRect(0, 0, width, height);
  const values = series.flatMap((s) => s.points).filter((v) => v !== null && v !== undefined);
  const max = Math.max(1, ...values) * 1.1;
  const left = 4;
  const top = 14;
  const bottom = height - 4;
  const span = bottom - top;
  g.font = "11px system-ui, sans-serif";
  g.fillStyle = "#5d6675";
  g.strokeStyle = "#e6e9ee";
  g.lineWidth = 1;
  for (const f of [0, 0.5, 1]) {
    const y = Math.round(bottom - f * span / 1.1) + 0.5;
    g.beginPath(); g.moveTo(left, y); g.lineTo(width, y); g.stroke();
    if (f > 0) g.fillText(unit(f * max / 1.1), left + 2, y - 3);
  }
  // The x axis grows with the readings until it holds HISTORY of them.
  const slots = Math.min(HISTORY, Math.max(2, ...series.map((s) => s.points.length)));
  const step = (width - left) / (slots - 1);
  for (const s of series) {
    g.strokeStyle = s.color;
    g.lineWidth = 2;
    g.setLineDash(s.dashed ? [6, 4] : []);
    g.beginPath();
    let drawing = false;
    const offset = slots - s.points.length;
    s.points.forEach((v, i) => {
      if (v === null || v === undefined) { drawing = false; return; }
      const x = left + (offset + i) * step;
      const y = bottom - (v / max) * span;
      if (drawing) g.lineTo(x, y); else g.moveTo(x, y);
      drawing = true;
    });
    g.stroke();
  }
  g.setLineDash([]);
}

// -- queues ------------------------------------------------------------------------------

// With workers (a mesh), a listing is the whole broker's: each row names its
// node, and the nodes that did not answer are named (page.missing).
function nodeColumn(rows, field, label) {
  return rows.some((r) => r[field] !== undefined) ? [{ label, value: (r) => r[field] }] : [];
}

function missingText(page) {
  const missing = Object.entries(page.missing || {});
  return missing.length ? ` — not listed, no answer from: ${missing.map(([n, why]) => `${n} (${why})`).join("; ")}` : "";
}

async function loadQueues() {
  const prefix = $("queue-filter").value;
  const page = await call("GET", vpath(
    `/queues?limit=${LIST_LIMIT}&offset=${state.queueOffset}${prefix ? `&prefix=${enc(prefix)}` : ""}`));
  const qs = page.queues;
  const from = state.queueOffset;
  $("queues-count").textContent = page.total > qs.length
    ? `${fmt(from + (qs.length ? 1 : 0))}–${fmt(from + qs.length)} of ${fmt(page.total)} queues${missingText(page)}`
    : `${qs.length} queues${missingText(page)}`;
  $("queues-previous").hidden = from === 0;
  $("queues-next").hidden = page.next_offset === null || page.next_offset === undefined;
  $("queue-table").replaceChildren(table([
    { label: "Name", value: (q) => q.name, key: "name" },
    ...nodeColumn(qs, "home", "Home"),
    { label: "Ready", value: (q) => q.messages_ready, num: true, key: "ready" },
    { label: "Unacked", value: (q) => q.messages_unacknowledged, num: true, key: "unacked" },
    { label: "Consumers", value: (q) => q.consumers, num: true, key: "consumers" },
    { label: "In/s", value: (q) => q.message_stats.publish_rate, num: true, digits: 1 },
    { label: "Out/s", value: (q) => q.message_stats.deliver_rate, num: true, digits: 1 },
    { label: "Durable", value: (q) => (q.durable ? "yes" : "no") },
    { label: "", cls: "actions", value: (q) => [
      button("Browse", () => openBrowse(q.name)),
      button("Purge", () => purge(q.name), true),
      button("Delete", () => deleteQueue(q.name), true),
    ] },
  ], qs, prefix ? "No queue starts so." : "No queue you may read."));
}

async function purge(name) {
  if (!confirm(`Purge every ready message of the queue ${name}?`)) return;
  try {
    const r = await call("DELETE", vpath(`/queues/${enc(name)}/messages`));
    flash(`Purged ${fmt(r.purged)} messages from ${name}.`);
    await loadQueues();
  } catch (e) { failed(e); }
}

async function deleteQueue(name) {
  if (!confirm(`Delete the queue ${name} and its messages?`)) return;
  try {
    const r = await call("DELETE", vpath(`/queues/${enc(name)}`));
    flash(`Deleted ${name} (${fmt(r.messages)} messages).`);
    if (state.browse && state.browse.queue === name) closeBrowse();
    await loadQueues();
  } catch (e) { failed(e); }
}

function openBrowse(name) {
  state.browse = { queue: name, cursor: null };
  $("browse-name").textContent = name;
  $("browse-result").replaceChildren();
  $("browse-more").hidden = true;
  $("browse").hidden = false;
  scan(false);
}

function closeBrowse() {
  state.browse = null;
  $("browse").hidden = true;
}

async function scan(more) {
  const b = state.browse;
  if (!b) return;
  if (!more) {
    const range = Number($("browse-range").value);
    const now = Date.now() / 1000;
    b.start = range ? Math.floor(now - range) : 0;
    b.end = Math.ceil(now + 60);
    b.cursor = null;
  }
  const params = new URLSearchParams({ start: b.start, end: b.end, limit: 50 });
  if (b.cursor) params.set("cursor", b.cursor);
  try {
    const page = await call("GET", vpath(`/queues/${enc(b.queue)}/scan?${params}`));
    b.cursor = page.next_cursor;
    $("browse-more").hidden = !b.cursor;
    $("browse-result").replaceChildren(table([
      { label: "Id", value: (m) => String(m.id) },
      { label: "Published", value: (m) => new Date(m.timestamp * 1000).toLocaleString() },
      { label: "Headers", value: (m) => Object.entries(m.headers || {}).map(([k, v]) => `${k}: ${typeof v === "object" && v ? "(bytes)" : v}`).join("\n") },
      { label: "Body", cls: "body", value: (m) => (m.encoding === "base64" ? `(base64) ${m.body}` : m.body).slice(0, 2000) },
    ], page.messages, "No kept message in that range."));
  } catch (e) {
    if (e instanceof ApiError && e.status === 400) {
      $("browse-result").replaceChildren(el("p", { class: "empty" }, e.doc.detail || e.message));
    } else failed(e);
  }
}

// -- exchanges and bindings ------------------------------------------------------------------

async function loadExchanges() {
  const [exchanges, bindings] = await Promise.all([
    call("GET", vpath(`/exchanges?limit=${LIST_LIMIT}`)),
    call("GET", vpath(`/bindings?limit=${LIST_LIMIT}`)),
  ]);
  $("exchange-table").replaceChildren(table([
    { label: "Name", value: (x) => x.name || "(default)" },
    { label: "Type", value: (x) => x.type },
    { label: "Bindings", value: (x) => x.bindings, num: true },
    { label: "Durable", value: (x) => (x.durable ? "yes" : "no") },
    { label: "", cls: "actions", value: (x) => (x.name === "" || x.name.startsWith("amq.") ? [] :
      [button("Delete", () => act(`Delete the exchange ${x.name}?`, "DELETE", vpath(`/exchanges/${enc(x.name)}`), loadExchanges), true)]) },
  ], exchanges.exchanges, "No exchange you may read."));
  const select = $("binding-exchange");
  const chosen = select.value;
  select.replaceChildren(...exchanges.exchanges.filter((x) => x.name !== "").map((x) =>
    el("option", { value: x.name, selected: x.name === chosen }, x.name)));
  call("GET", vpath(`/queues?limit=${LIST_LIMIT}`)).then((page) => {
    $("binding-queues").replaceChildren(...page.queues.map((q) => el("option", { value: q.name })));
  }, () => {});
  $("binding-table").replaceChildren(table([
    { label: "Exchange", value: (b) => b.exchange || "(default)" },
    { label: "Queue", value: (b) => b.queue },
    { label: "Routing key", value: (b) => b.routing_key },
    ...nodeColumn(bindings.bindings, "home", "Home"),
    { label: "", cls: "actions", value: (b) => [button("Unbind", () => act(
      `Unbind ${b.queue} from ${b.exchange} (${b.routing_key})?`, "DELETE",
      vpath(`/bindings?${new URLSearchParams({ queue: b.queue, exchange: b.exchange, routing_key: b.routing_key })}`),
      loadExchanges), true)] },
  ], bindings.bindings, "No binding."));
}

async function act(question, method, path, reload, body) {
  if (question && !confirm(question)) return;
  try {
    await call(method, path, body);
    flash("Done.");
    await reload();
  } catch (e) { failed(e); }
}

// -- connections (admins) ---------------------------------------------------------------------

async function loadConnections() {
  const page = await call("GET", `/api/v1/connections?limit=${LIST_LIMIT}`);
  const by = {};
  for (const c of page.connections) by[c.protocol] = (by[c.protocol] || 0) + 1;
  $("connections-count").textContent = `${fmt(page.total)} open: ${Object.entries(by).map(([p, n]) => `${p} ${n}`).join(", ")}${missingText(page)}`;
  $("connection-table").replaceChildren(table([
    { label: "Id", value: (c) => c.id },
    ...nodeColumn(page.connections, "node", "Worker"),
    { label: "Protocol", value: (c) => c.protocol, key: "protocol" },
    { label: "Peer", value: (c) => c.peer },
    { label: "User", value: (c) => c.user },
    { label: "", cls: "actions", value: (c) => [button("Close", () => act(
      `Close connection ${c.id} (${c.protocol}, ${c.peer})?`, "DELETE", `/api/v1/connections/${enc(c.id)}`, loadConnections), true)] },
  ], page.connections, "No connection."));
}

// -- links to the other nodes of a mesh (admins) ------------------------------------------------

async function loadLinks() {
  const doc = await call("GET", "/api/v1/links");
  $("links-node").textContent = `node ${doc.node}: ${fmt(doc.links.length)} link(s)`;
  $("link-table").replaceChildren(table([
    { label: "Node", value: (l) => l.node },
    { label: "Direction", value: (l) => l.direction },
    { label: "Address", value: (l) => l.address },
    { label: "State", value: (l) => l.state, key: "state" },
    { label: "RTT ms", value: (l) => l.rtt_ms, num: true, digits: 1 },
    { label: "Msgs out", value: (l) => l.messages_out, num: true },
    { label: "Msgs in", value: (l) => l.messages_in, num: true },
    { label: "Dropped", value: (l) => l.dropped, num: true },
    { label: "Peer interest", value: (l) => l.peer_interest.join(" ") },
  ], doc.links, "No link: this node is not in a mesh, or no peer is up (docs/cluster.rst)."));
}

// -- users and permissions (admins) -------------------------------------------------------------

async function loadUsers() {
  const [users, permissions] = await Promise.all([
    call("GET", `/api/v1/users?limit=${LIST_LIMIT}`),
    call("GET", `/api/v1/permissions?limit=${LIST_LIMIT}`),
  ]);
  $("user-table").replaceChildren(table([
    { label: "Name", value: (u) => u.name },
    { label: "Password", value: (u) => (u.password ? "yes" : "no") },
    { label: "Certificates", value: (u) => u.certificate_names.join(", ") },
    { label: "Admin", value: (u) => (u.admin ? "yes" : "no") },
    { label: "From", value: (u) => u.source },
    { label: "", cls: "actions", value: (u) => (u.name === state.user ? [] : [button("Delete", () => act(
      `Delete the user ${u.name} (and close its connections)?`, "DELETE", `/api/v1/users/${enc(u.name)}`, loadUsers), true)]) },
  ], users.users, "No user (authentication is off)."));
  $("permission-table").replaceChildren(table([
    { label: "User", value: (p) => p.user },
    { label: "Vhost", value: (p) => p.vhost },
    { label: "Configure", value: (p) => p.configure },
    { label: "Write", value: (p) => p.write },
    { label: "Read", value: (p) => p.read },
    { label: "", cls: "actions", value: (p) => [button("Remove", () => act(
      `Remove ${p.user}'s permissions in ${p.vhost}?`, "DELETE",
      `/api/v1/permissions/${enc(p.vhost)}/${enc(p.user)}`, loadUsers), true)] },
  ], permissions.permissions, "No permission."));
}

// The queue arguments the form sets (docs/http-api.rst, as in STOMP and the
// configuration): only those filled in.
function queueArguments() {
  const args = {};
  const number = (id, name) => {
    const text = $(id).value.trim();
    if (text !== "") args[name] = Number(text);
  };
  const string = (id, name) => {
    const text = $(id).value.trim();
    if (text !== "") args[name] = text;
  };
  number("queue-max-length", "x-max-length");
  number("queue-max-bytes", "x-max-length-bytes");
  string("queue-overflow", "x-overflow");
  number("queue-ttl", "x-message-ttl");
  number("queue-expires", "x-expires");
  string("queue-dlx", "x-dead-letter-exchange");
  string("queue-dlk", "x-dead-letter-routing-key");
  number("queue-max-priority", "x-max-priority");
  number("queue-delivery-limit", "x-delivery-limit");
  return args;
}

// PUT or POST a declaration; says whether it was made or already there.
async function declare(path, body, what, reload, method = "PUT") {
  try {
    const [status] = await call(method, path, body, { status: true });
    flash(status === 201 ? `Created ${what}.` : `${what} already exists, as declared.`);
    await reload();
    return true;
  } catch (e) { failed(e); return false; }
}

function bindForms() {
  $("queue-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const name = $("queue-name").value;
    const body = { durable: $("queue-durable").checked, auto_delete: $("queue-auto-delete").checked,
      arguments: queueArguments() };
    if (await declare(vpath(`/queues/${enc(name)}`), body, `the queue ${name}`, loadQueues)) $("queue-form").reset();
  });
  $("exchange-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const name = $("exchange-name").value;
    const body = { type: $("exchange-type").value, durable: $("exchange-durable").checked,
      auto_delete: $("exchange-auto-delete").checked };
    if (await declare(vpath(`/exchanges/${enc(name)}`), body, `the exchange ${name}`, loadExchanges)) {
      $("exchange-form").reset();
    }
  });
  $("binding-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const body = { exchange: $("binding-exchange").value, queue: $("binding-queue").value,
      routing_key: $("binding-key").value };
    const what = `the binding of ${body.queue} to ${body.exchange} (${body.routing_key || "no key"})`;
    if (await declare(vpath("/bindings"), body, what, loadExchanges, "POST")) {
      $("binding-queue").value = "";
      $("binding-key").value = "";
    }
  });
  $("queues-refresh").addEventListener("click", () => loadQueues().catch(failed));
  $("queue-filter").addEventListener("change", () => { state.queueOffset = 0; loadQueues().catch(failed); });
  $("queues-previous").addEventListener("click", () => {
    state.queueOffset = Math.max(0, state.queueOffset - LIST_LIMIT);
    loadQueues().catch(failed);
  });
  $("queues-next").addEventListener("click", () => {
    state.queueOffset += LIST_LIMIT;
    loadQueues().catch(failed);
  });
  $("connections-refresh").addEventListener("click", () => loadConnections().catch(failed));
  $("links-refresh").addEventListener("click", () => loadLinks().catch(failed));
  $("browse-scan").addEventListener("click", () => scan(false));
  $("browse-more").addEventListener("click", () => scan(true));
  $("browse-close").addEventListener("click", closeBrowse);
  $("user-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const name = $("new-user").value;
    await act("", "PUT", `/api/v1/users/${enc(name)}`, loadUsers, { password: $("new-password").value });
    $("new-password").value = "";
  });
  $("permission-form").addEventListener("submit", (e) => {
    e.preventDefault();
    act("", "PUT", `/api/v1/permissions/${enc($("perm-vhost").value)}/${enc($("perm-user").value)}`, loadUsers, {
      configure: $("perm-configure").value, write: $("perm-write").value, read: $("perm-read").value,
    });
  });
  window.addEventListener("resize", () => { if (state.tab === "overview") drawCharts(); });
}

start();
