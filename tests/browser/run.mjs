// Drives a real headless Chromium (Debian's /usr/bin/chromium) with
// playwright-core against a QMQ broker that the trial test started.
//
//   node run.mjs SCENARIO BASE_URL [--spki HASH] [--screenshots DIR]
//
// SCENARIO is stompjs, sockjs-xhr-streaming, sockjs-xhr-polling,
// sockjs-binary, sockjs-services, qmqjs, qmqjs-reconnect, qmqjs-transaction, chat, tasks,
// cross-site-form (which takes --evil URL: a page of another site) or
// console (which takes --admin USER:PASSWORD, --user USER:PASSWORD and
// --queue NAME: a queue the test filled), console-manage (--admin and
// --token JWT: the console's forms and token login) or console-open (the
// console of a broker without authentication); BASE_URL
// the broker's http(s)://127.0.0.1:PORT/. Over HTTPS, --spki gives the base64
// SHA-256 of the test server certificate's public key, which Chromium is
// told to accept (--ignore-certificate-errors-spki-list): nothing else is
// relaxed. Prints one JSON line ({"ok": true, ...} or {"ok": false,
// "error": ...}) and exits 0 when the scenario passed, 1 when it failed,
// 3 when Chromium could not start.

import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const here = dirname(fileURLToPath(import.meta.url));
const [scenario, base, ...rest] = process.argv.slice(2);
const option = (name) => {
  const i = rest.indexOf(name);
  return i >= 0 ? rest[i + 1] : undefined;
};
const spki = option("--spki");
const evil = option("--evil");
const screenshots = option("--screenshots");
const executablePath = process.env.CHROMIUM || "/usr/bin/chromium";
const STEP = 15000;

function finish(code, result) {
  process.stdout.write(JSON.stringify(result) + "\n");
  process.exitCode = code;
}

async function launch() {
  const userDataDir = mkdtempSync(join(tmpdir(), "qmq-chromium-"));
  const args = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
  ];
  if (spki) args.push(`--ignore-certificate-errors-spki-list=${spki}`);
  // Another site for the cross-site scenario: evil.test is 127.0.0.1.
  args.push("--host-resolver-rules=MAP evil.test 127.0.0.1");
  const context = await chromium.launchPersistentContext(userDataDir, {
    executablePath, headless: true, args, viewport: { width: 900, height: 640 },
  });
  return { context, cleanup: () => rmSync(userDataDir, { recursive: true, force: true }) };
}

async function open(context, path) {
  const page = await context.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  page.on("console", (m) => { if (m.type() === "error") errors.push(m.text()); });
  const response = await page.goto(new URL(path, base).href, { timeout: STEP });
  if (!response || !response.ok()) throw new Error(`GET ${path}: ${response && response.status()}`);
  page.errors = errors;
  return page;
}

// @stomp/stompjs over sockjs-client at /sockjs with one transport: queue,
// topic, UTF-8 (with characters SockJS must escape), a 70 KB body, client
// acks; and the transport sockjs-client reports it used.
async function sockjsStomp(context, transport) {
  const page = await open(context, "/");
  await page.addScriptTag({ path: join(here, "node_modules/sockjs-client/dist/sockjs.min.js") });
  await page.addScriptTag({ path: join(here, "node_modules/@stomp/stompjs/bundles/stomp.umd.js") });
  return await page.evaluate(async ([step, transport]) => {
    let sock;
    const client = new StompJs.Client({
      webSocketFactory: () => {
        sock = new SockJS(new URL("/sockjs", location.href).href, null, { transports: [transport] });
        return sock;
      },
      reconnectDelay: 0, heartbeatIncoming: 4000, heartbeatOutgoing: 4000,
    });
    const connected = new Promise((resolve, reject) => {
      client.onConnect = resolve;
      client.onStompError = (frame) => reject(new Error(frame.headers.message));
      client.onWebSocketClose = (e) => reject(new Error(`closed ${e.code} ${e.reason}`));
    });
    setTimeout(() => client.deactivate(), step * 2);
    client.activate();
    const frame = await connected;
    const bodies = ["hello", "h\u00e9llo \u2028 w\u00f6rld \u2713", "x".repeat(70000)];
    const got = [];
    const all = new Promise((resolve) => {
      client.subscribe("/queue/sockjs-test", (message) => {
        got.push(message.body);
        message.ack();
        if (got.length === bodies.length) resolve();
      }, { ack: "client-individual" });
    });
    const topicDone = new Promise((resolve) => {
      client.subscribe("/topic/sockjs.news", (m) => resolve(m.body));
    });
    await new Promise((resolve) => {
      client.watchForReceipt("sub-ready", resolve);
      client.publish({ destination: "/queue/sockjs-warmup", headers: { receipt: "sub-ready" } });
    });
    for (const body of bodies) client.publish({ destination: "/queue/sockjs-test", body });
    client.publish({ destination: "/topic/sockjs.news", body: "extra" });
    await all;
    const topic = await topicDone;
    const used = sock.transport;
    await client.deactivate();
    const ok = JSON.stringify(got) === JSON.stringify(bodies) && topic === "extra"
      && used === transport;
    return { ok, transport: used, version: frame.headers.version,
      lengths: got.map((b) => b.length) };
  }, [STEP, transport]);
}

// -- scenarios ---------------------------------------------------------------

const scenarios = {
  // The web console (/console/): an admin logs in, watches the overview's
  // charts while the page publishes and receives over the API, sees the
  // depth of the queue the test filled over STOMP, browses it by range
  // scan, purges it and sees it empty, and sees the users; every tab is
  // then checked at phone width for horizontal overflow. A user who is no
  // admin sees neither users nor connections.
  async console(context) {
    const [adminName, adminPassword] = option("--admin").split(":");
    const [userName, userPassword] = option("--user").split(":");
    const queue = option("--queue");
    const login = async (page, name, password) => {
      await page.locator("#login-form").waitFor({ timeout: STEP });
      await page.fill("#login-user", name);
      await page.fill("#login-password", password);
      await page.click("#login-form button[type=submit]");
      await page.locator("#tabs").waitFor({ timeout: STEP });
    };
    const overflow = {};
    const measure = async (page, who) => {
      for (const [tab, content] of [["overview", "#cards .card"], ["queues", "#queue-table > *"],
        ["exchanges", "#exchange-table > *"], ["connections", "#connection-table > *"],
        ["links", "#link-table > *"], ["users", "#user-table > *"]]) {
        if (!(await page.locator(`#tabs a[data-tab=${tab}]`).isVisible())) continue;
        await page.click(`#tabs a[data-tab=${tab}]`);
        await page.locator(`#${tab} ${content}`).first().waitFor({ timeout: STEP });
        const width = await page.evaluate(() => [document.documentElement.scrollWidth, window.innerWidth]);
        if (width[0] > width[1]) overflow[`${who}/${tab}`] = width;
      }
    };
    const page = await open(context, "/console/");
    page.on("dialog", (dialog) => dialog.accept());
    await page.setViewportSize({ width: 1200, height: 820 });
    await login(page, adminName, adminPassword);
    const adminTabs = await page.locator("#tabs a:visible").allInnerTexts();
    await page.selectOption("#refresh", "1000");
    // Traffic over the API for the charts: a few batches in, some out.
    await page.evaluate(async (auth) => {
      const headers = { authorization: auth, "content-type": "application/json" };
      const api = "/api/v1/vhosts/%2F/queues/console-demo";
      for (let i = 0; i < 12; i++) {
        const messages = Array.from({ length: 20 + 15 * (i % 4) }, (_, j) => ({ body: `m${i}.${j}` }));
        await fetch(`${api}/messages`, { method: "POST", headers, body: JSON.stringify({ messages }) });
        const got = await (await fetch(`${api}/receive?max=${10 + 5 * (i % 3)}`, { method: "POST", headers })).json();
        const handles = got.messages.map((m) => m.handle);
        if (handles.length) await fetch(`${api}/ack`, { method: "POST", headers, body: JSON.stringify({ handles }) });
        await new Promise((resolve) => setTimeout(resolve, 1000));
      }
    }, `Basic ${Buffer.from(`${adminName}:${adminPassword}`).toString("base64")}`);
    await page.locator("#chart-published .legend i").first().waitFor({ timeout: STEP });
    if (screenshots) await page.screenshot({ path: join(screenshots, "console-desktop.png") });
    await page.click("#tabs a[data-tab=queues]");
    const ready = page.locator(`#queue-table tr[data-name="${queue}"] td[data-col=ready]`);
    await ready.waitFor({ timeout: STEP });
    const depth = [await ready.innerText()];
    await page.click(`#queue-table tr[data-name="${queue}"] button:text("Browse")`);
    await page.locator("#browse-result td.body").first().waitFor({ timeout: STEP });
    const browsed = await page.locator("#browse-result td.body").allInnerTexts();
    if (screenshots) await page.screenshot({ path: join(screenshots, "console-queues.png"), fullPage: true });
    await page.click(`#queue-table tr[data-name="${queue}"] button:text("Purge")`);
    await page.locator("#flash", { hasText: "Purged" }).waitFor({ timeout: STEP });
    await page.locator(`#queue-table tr[data-name="${queue}"] td[data-col=ready]`, { hasText: /^0$/ })
      .waitFor({ timeout: STEP });
    depth.push(await ready.innerText());
    await page.click("#tabs a[data-tab=users]");
    await page.locator(`#user-table tr[data-name="${userName}"]`).waitFor({ timeout: STEP });
    const adminSeesUsers = await page.locator(`#user-table tr[data-name="${userName}"]`).isVisible();
    await page.setViewportSize({ width: 390, height: 844 });
    await measure(page, "admin");
    await page.click("#tabs a[data-tab=overview]");
    await page.locator("#chart-published canvas").waitFor({ timeout: STEP });
    if (screenshots) await page.screenshot({ path: join(screenshots, "console-phone.png") });
    // The other user, on a page of its own.
    const other = await open(context, "/console/");
    await other.setViewportSize({ width: 390, height: 844 });
    await login(other, userName, userPassword);
    const userTabs = await other.locator("#tabs a:visible").allInnerTexts();
    await other.locator("#cards .card").first().waitFor({ timeout: STEP });
    // No /metrics for a user who is neither admin nor monitor: the page says so.
    await other.locator("#charts-note").waitFor({ timeout: STEP });
    const userCharts = await other.locator("#chart-published").count();
    await measure(other, "user");
    await other.evaluate(() => { location.hash = "#users"; });
    await other.locator("#overview").waitFor({ timeout: STEP });
    const userSeesUsers = await other.locator("#users").isVisible();
    // A refused login (401) or probe (403) is logged by Chromium as a failed
    // resource load: that is the API's answer, not a fault of the page.
    const errors = [...page.errors, ...other.errors].filter((e) => !e.startsWith("Failed to load resource"));
    const ok = depth[0] === browsed.length.toString() && depth[1] === "0" && adminSeesUsers
      && adminTabs.includes("Users") && !userTabs.includes("Users") && !userTabs.includes("Connections")
      && adminTabs.includes("Links") && !userTabs.includes("Links")
      && !userSeesUsers && userCharts === 0 && Object.keys(overflow).length === 0 && errors.length === 0;
    return { ok, depth, browsed, admin_sees_users: adminSeesUsers, admin_tabs: adminTabs, user_charts: userCharts,
      user_tabs: userTabs, user_sees_users: userSeesUsers, overflow, errors };
  },

  // A page of another site (--evil: a page served by the test on another
  // port, under the name evil.test) tries to receive, and so hide, a
  // queue's messages: real HTML form POSTs of each encoding a form has, and
  // no-cors fetches (a typeless Blob, an empty body). The broker's own page
  // published the messages and receives them afterwards: all three must
  // still be there, and every cross-site attempt answered 403 or 415.
  async "cross-site-form"(context) {
    const queue = `cross-site-${Date.now()}`;
    const api = new URL(`/api/v1/vhosts/%2F/queues/${queue}`, base).href;
    const receive = `${api}/receive?max=10000&visibility=43200`;
    const own = await open(context, "/");
    const published = await own.evaluate(async (api) => (await fetch(`${api}/messages`, {
      method: "POST", headers: { "content-type": "application/json" },
      body: JSON.stringify({ messages: [{ body: "a" }, { body: "b" }, { body: "c" }] }),
    })).status, api);
    const attempts = [];
    const attempt = async (what, action, arg = receive) => {
      const page = await context.newPage();  // one each: a form navigates away
      await page.goto(evil, { timeout: STEP });
      const [response] = await Promise.all([
        page.waitForResponse((r) => r.url().startsWith(`${api}/receive`), { timeout: STEP }),
        page.evaluate(action, arg),
      ]);
      // Playwright reports the Origin a form sent, not the one Chromium adds
      // to a no-cors fetch further down (a 403 says the broker saw one).
      const origin = (await response.request().allHeaders()).origin ?? null;
      attempts.push({ what, status: response.status(), origin });
      await page.close();
    };
    for (const enctype of ["application/x-www-form-urlencoded", "multipart/form-data", "text/plain"]) {
      await attempt(`form ${enctype}`, ([url, enctype]) => {
        const form = document.createElement("form");
        form.method = "POST";
        form.action = url;
        form.enctype = enctype;
        for (const [name, value] of [["max", "10000"], ["visibility", "43200"]]) {
          const input = document.createElement("input");
          input.type = "hidden";
          input.name = name;
          input.value = value;
          form.appendChild(input);
        }
        document.body.appendChild(form);
        form.submit();
      }, [receive, enctype]);
    }
    await attempt("no-cors fetch of a Blob", (url) => {
      fetch(url, { method: "POST", mode: "no-cors", body: new Blob(["{}"]) }).catch(() => {});
    });
    await attempt("no-cors fetch, no body", (url) => {
      fetch(url, { method: "POST", mode: "no-cors" }).catch(() => {});
    });
    const received = await own.evaluate(async (api) => {
      const r = await fetch(`${api}/receive?max=10`, { method: "POST" });
      return (await r.json()).messages.map((m) => m.body);
    }, api);
    const ok = published === 201 && attempts.length === 5
      && attempts.every((a) => a.status === 403 || a.status === 415)
      && JSON.stringify(received) === JSON.stringify(["a", "b", "c"]);
    return { ok, published, attempts, received };
  },

  // The console's forms and its token login. A user who is no admin logs
  // in with a token (--token, a JWT of the virtual host) and reads the
  // overview's totals, which count every queue (the test made more than one
  // page of the listing); the admin (--admin) makes an exchange, a queue
  // with arguments (max length, TTL, dead-letter exchange) and a binding
  // through the forms, at desktop width; then every tab, its forms open, is
  // checked at phone width for horizontal overflow.
  async "console-manage"(context) {
    const [adminName, adminPassword] = option("--admin").split(":");
    const token = option("--token");
    const overflow = {};
    const measure = async (page, who) => {
      for (const tab of ["overview", "queues", "exchanges", "connections", "links", "users"]) {
        if (!(await page.locator(`#tabs a[data-tab=${tab}]`).isVisible())) continue;
        await page.click(`#tabs a[data-tab=${tab}]`);
        await page.locator(`#${tab}`).waitFor({ timeout: STEP });
        for (const details of await page.locator(`#${tab} details`).all()) {
          await details.evaluate((d) => { d.open = true; });
        }
        const width = await page.evaluate(() => [document.documentElement.scrollWidth, window.innerWidth]);
        if (width[0] > width[1]) overflow[`${who}/${tab}`] = width;
      }
    };
    // The token login, at phone width.
    const viewer = await open(context, "/console/");
    await viewer.setViewportSize({ width: 390, height: 844 });
    await viewer.locator("#login-form").waitFor({ timeout: STEP });
    await viewer.check("#login-mode-token");
    const passwordShown = await viewer.locator("#login-user").isVisible();
    await viewer.fill("#login-token", token);
    await viewer.click("#login-form button[type=submit]");
    await viewer.locator("#tabs").waitFor({ timeout: STEP });
    const tokenUser = await viewer.locator("#user").innerText();
    const tokenTabs = await viewer.locator("#tabs a:visible").allInnerTexts();
    const card = (name) => viewer.locator(`#cards .card[data-card="${name}"] b`);
    await card("queues").waitFor({ timeout: STEP });
    const cards = { queues: await card("queues").innerText(), ready: await card("ready").innerText() };
    const cardNote = await viewer.locator("#cards p.note").count();
    if (screenshots) await viewer.screenshot({ path: join(screenshots, "console-token-phone.png") });
    await measure(viewer, "token");

    // The admin's forms, at desktop width.
    const page = await open(context, "/console/");
    await page.setViewportSize({ width: 1200, height: 820 });
    await page.locator("#login-form").waitFor({ timeout: STEP });
    await page.fill("#login-user", adminName);
    await page.fill("#login-password", adminPassword);
    await page.click("#login-form button[type=submit]");
    await page.locator("#tabs").waitFor({ timeout: STEP });
    const flashes = [];
    const flashed = async (text) => {
      await page.locator("#flash", { hasText: text }).waitFor({ timeout: STEP });
      flashes.push(await page.locator("#flash").innerText());
    };
    await page.click("#tabs a[data-tab=exchanges]");
    await page.click("#exchange-new summary");
    await page.fill("#exchange-name", "console-ex");
    await page.selectOption("#exchange-type", "topic");
    await page.click("#exchange-form button[type=submit]");
    await flashed("Created the exchange console-ex");
    await page.locator('#exchange-table tr[data-name="console-ex"]').waitFor({ timeout: STEP });
    await page.click("#tabs a[data-tab=queues]");
    await page.click("#queue-new summary");
    await page.fill("#queue-name", "console-made");
    await page.fill("#queue-max-length", "10");
    await page.selectOption("#queue-overflow", "reject-publish");
    await page.fill("#queue-ttl", "60000");
    await page.fill("#queue-dlx", "console-ex");
    await page.fill("#queue-dlk", "dead");
    await page.click("#queue-form button[type=submit]");
    await flashed("Created the queue console-made");
    // Past the first pages of the listing (the bulk queues come first): the
    // next page, then the filter finds it.
    await page.locator("#queues-next").click();
    await page.locator("#queues-count", { hasText: /^501/ }).waitFor({ timeout: STEP });
    const paged = await page.locator("#queues-count").innerText();
    await page.fill("#queue-filter", "console-");
    await page.locator("#queue-filter").dispatchEvent("change");
    await page.locator('#queue-table tr[data-name="console-made"]').waitFor({ timeout: STEP });
    // The same again: the broker has it, as declared.
    await page.fill("#queue-name", "console-made");
    await page.fill("#queue-max-length", "10");
    await page.selectOption("#queue-overflow", "reject-publish");
    await page.fill("#queue-ttl", "60000");
    await page.fill("#queue-dlx", "console-ex");
    await page.fill("#queue-dlk", "dead");
    await page.click("#queue-form button[type=submit]");
    await flashed("already exists");
    await page.click("#tabs a[data-tab=exchanges]");
    await page.click("#binding-new summary");
    await page.locator('#binding-exchange option[value="console-ex"]').waitFor({ state: "attached", timeout: STEP });
    await page.selectOption("#binding-exchange", "console-ex");
    await page.fill("#binding-queue", "console-made");
    await page.fill("#binding-key", "orders.#");
    await page.click("#binding-form button[type=submit]");
    await flashed("Created the binding of console-made to console-ex");
    const binding = page.locator("#binding-table tr", { hasText: "orders.#" });
    await binding.waitFor({ timeout: STEP });
    const bound = await binding.locator("td").allInnerTexts();
    if (screenshots) await page.screenshot({ path: join(screenshots, "console-forms-desktop.png"), fullPage: true });
    await page.setViewportSize({ width: 390, height: 844 });
    await measure(page, "admin");
    await page.click("#tabs a[data-tab=queues]");
    if (screenshots) await page.screenshot({ path: join(screenshots, "console-forms-phone.png") });
    const errors = [...viewer.errors, ...page.errors].filter((e) => !e.startsWith("Failed to load resource"));
    const ok = !passwordShown && Object.keys(overflow).length === 0 && errors.length === 0
      && !tokenTabs.includes("Users") && flashes.length === 4;
    return { ok, password_shown: passwordShown, token_user: tokenUser, token_tabs: tokenTabs, cards,
      card_note: cardNote, flashes, paged, bound, overflow, errors };
  },

  // The console of a broker without authentication: no login, every tab;
  // a STOMP client over WebSocket (in another page) listed among the
  // connections and closed from the console.
  async "console-open"(context) {
    const page = await open(context, "/console/");
    page.on("dialog", (dialog) => dialog.accept());
    await page.locator("#tabs").waitFor({ timeout: STEP });
    const loginShown = await page.locator("#login").isVisible();
    const who = await page.locator("#user").innerText();
    const tabs = await page.locator("#tabs a:visible").allInnerTexts();
    const client = await open(context, "/");
    const connected = await client.evaluate(async (step) => {
      const url = new URL("/ws", location.href);
      url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
      const ws = new WebSocket(url.href, ["v12.stomp"]);
      window.wsClosed = new Promise((resolve) => { ws.onclose = (e) => resolve([e.code, e.reason]); });
      return await new Promise((resolve, reject) => {
        ws.onopen = () => ws.send("CONNECT\naccept-version:1.2\nhost:/\n\n\0");
        ws.onmessage = (e) => resolve(String(e.data).split("\n")[0]);
        ws.onerror = () => reject(new Error("websocket error"));
        setTimeout(() => reject(new Error("no CONNECTED")), step);
      });
    }, STEP);
    await page.click("#tabs a[data-tab=connections]");
    const row = page.locator("#connection-table tr", {
      has: page.locator("td[data-col=protocol]", { hasText: /^websocket$/ }) });
    await row.first().waitFor({ timeout: STEP });
    const listed = await row.count();
    await row.first().locator("button:text('Close')").click();
    const closed = await client.evaluate(() => window.wsClosed);
    await page.locator("#flash", { hasText: "Done." }).waitFor({ timeout: STEP });
    await row.first().waitFor({ state: "detached", timeout: STEP });
    const errors = [...page.errors].filter((e) => !e.startsWith("Failed to load resource"));
    const ok = !loginShown && who === "authentication off" && tabs.includes("Users")
      && connected === "CONNECTED" && listed === 1 && errors.length === 0;
    return { ok, login_shown: loginShown, who, tabs, connected, listed, closed, errors };
  },

  // @stomp/stompjs over native WebSocket, at /ws (RabbitMQ's path).
  async stompjs(context) {
    const page = await open(context, "/");
    await page.addScriptTag({ path: join(here, "node_modules/@stomp/stompjs/bundles/stomp.umd.js") });
    return await page.evaluate(async (step) => {
      const url = new URL("/ws", location.href);
      url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
      const client = new StompJs.Client({ brokerURL: url.href, reconnectDelay: 0,
        heartbeatIncoming: 4000, heartbeatOutgoing: 4000 });
      const connected = new Promise((resolve, reject) => {
        client.onConnect = resolve;
        client.onStompError = (frame) => reject(new Error(frame.headers.message));
        client.onWebSocketError = () => reject(new Error("websocket error"));
      });
      setTimeout(() => client.deactivate(), step * 2);
      client.activate();
      const frame = await connected;
      const bodies = ["hello", "h\u00e9llo w\u00f6rld \u2713", "x".repeat(70000)];
      const got = [];
      const all = new Promise((resolve) => {
        client.subscribe("/queue/stompjs-test", (message) => {
          got.push(message.body);
          message.ack();
          if (got.length === bodies.length) resolve();
        }, { ack: "client-individual" });
      });
      const topic = [];
      const topicDone = new Promise((resolve) => {
        client.subscribe("/topic/stompjs.news", (m) => { topic.push(m.body); resolve(); });
      });
      // A receipt proves the subscriptions are in place before sending.
      await new Promise((resolve) => {
        client.watchForReceipt("sub-ready", resolve);
        client.publish({ destination: "/queue/stompjs-warmup", headers: { receipt: "sub-ready" } });
      });
      for (const body of bodies) client.publish({ destination: "/queue/stompjs-test", body });
      client.publish({ destination: "/topic/stompjs.news", body: "extra" });
      const binary = new Uint8Array([0, 1, 2, 255]);
      const binaryDone = new Promise((resolve) => {
        client.subscribe("/queue/stompjs-binary", (m) => resolve(Array.from(m.binaryBody)));
      });
      client.publish({ destination: "/queue/stompjs-binary", binaryBody: binary,
        headers: { "content-type": "application/octet-stream" } });
      await Promise.all([all, topicDone]);
      const bin = await binaryDone;
      await client.deactivate();
      const ok = JSON.stringify(got) === JSON.stringify(bodies) && topic[0] === "extra"
        && JSON.stringify(bin) === "[0,1,2,255]";
      return { ok, version: frame.headers.version, server: frame.headers.server,
        lengths: got.map((b) => b.length), binary: bin };
    }, STEP);
  },

  // @stomp/stompjs over sockjs-client, WebSocket disabled: xhr-streaming.
  async "sockjs-xhr-streaming"(context) {
    return await sockjsStomp(context, "xhr-streaming");
  },

  // @stomp/stompjs over sockjs-client, WebSocket disabled: xhr-polling.
  async "sockjs-xhr-polling"(context) {
    return await sockjsStomp(context, "xhr-polling");
  },

  // A body that is not UTF-8, published over the HTTP API, then consumed
  // with @stomp/stompjs over sockjs-client (xhr-streaming): SockJS carries
  // text only, so the broker refuses it with an ERROR ("binary body") and
  // keeps it in its queue (stomp.js's parser stays in step: the text message
  // before it arrives whole); then the same message is read, byte for byte,
  // over STOMP over WebSocket at /ws.
  async "sockjs-binary"(context) {
    const page = await open(context, "/");
    await page.addScriptTag({ path: join(here, "node_modules/sockjs-client/dist/sockjs.min.js") });
    await page.addScriptTag({ path: join(here, "node_modules/@stomp/stompjs/bundles/stomp.umd.js") });
    return await page.evaluate(async (step) => {
      const bytes = [0x89, 0x50, 0x4e, 0x47, 0xff, 0xfe, 0x00, 0x01, 0xc3];
      const posted = await fetch("/api/v1/vhosts/%2F/queues/sockjs-binary/messages", {
        method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ messages: [
          { body: "before \u00e9" },
          { body: btoa(String.fromCharCode(...bytes)), encoding: "base64" },
          { body: "after" },
        ] }),
      });
      if (!posted.ok) return { ok: false, error: `publish: ${posted.status} ${await posted.text()}` };
      // Over SockJS: the text message, then an ERROR for the binary one.
      let sock;
      const got = [];
      const sockjs = new StompJs.Client({
        webSocketFactory: () => {
          sock = new SockJS(new URL("/sockjs", location.href).href, null,
            { transports: ["xhr-streaming"] });
          return sock;
        },
        reconnectDelay: 0, heartbeatIncoming: 0, heartbeatOutgoing: 0,
      });
      const refused = new Promise((resolve, reject) => {
        sockjs.onConnect = () => sockjs.subscribe("/queue/sockjs-binary", (m) => {
          got.push(m.body);
        });
        sockjs.onStompError = (frame) => resolve(frame);
        setTimeout(() => reject(new Error(`no ERROR; got ${JSON.stringify(got)}`)), step);
      });
      const closed = new Promise((resolve) => { sockjs.onWebSocketClose = (e) => resolve(e); });
      sockjs.activate();
      const error = await refused;
      const close = await closed;
      await sockjs.deactivate();
      // Over WebSocket: the binary message, intact, then the last one.
      const url = new URL("/ws", location.href);
      url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
      const ws = new StompJs.Client({ brokerURL: url.href, reconnectDelay: 0 });
      const rest = [];
      const done = new Promise((resolve, reject) => {
        ws.onConnect = () => ws.subscribe("/queue/sockjs-binary", (m) => {
          rest.push({ bytes: Array.from(m.binaryBody), redelivered: m.headers.redelivered });
          if (rest.length === 2) resolve();
        });
        setTimeout(() => reject(new Error(`over /ws: ${JSON.stringify(rest)}`)), step);
      });
      ws.activate();
      await done;
      await ws.deactivate();
      const after = Array.from(new TextEncoder().encode("after"));
      const ok = JSON.stringify(got) === JSON.stringify(["before \u00e9"])
        && error.headers.message === "binary body" && /not UTF-8/.test(error.body)
        && close.code === 3000 && close.reason === "binary body"
        && JSON.stringify(rest[0].bytes) === JSON.stringify(bytes)
        && rest[0].redelivered === "true"
        && JSON.stringify(rest[1].bytes) === JSON.stringify(after);
      return { ok, got, error: { message: error.headers.message, body: error.body },
        close: [close.code, close.reason], rest };
    }, STEP);
  },

  // sockjs-client against the protocol's test services (echo, close,
  // cookie_needed_echo), over xhr-streaming and xhr-polling.
  async "sockjs-services"(context) {
    const page = await open(context, "/");
    await page.addScriptTag({ path: join(here, "node_modules/sockjs-client/dist/sockjs.min.js") });
    return await page.evaluate(async (step) => {
      const within = (promise, what) => Promise.race([promise, new Promise((_, reject) =>
        setTimeout(() => reject(new Error(`timed out: ${what}`)), step))]);
      const results = {};
      for (const transport of ["xhr-streaming", "xhr-polling"]) {
        for (const service of ["echo", "cookie_needed_echo"]) {
          const sock = new SockJS(new URL(`/sockjs_test/${service}`, location.href).href, null,
            { transports: [transport] });
          const texts = ["hello", "h\u00e9llo \u2028 \u2713 \ufff0", "x".repeat(20000)];
          const got = [];
          await within(new Promise((resolve, reject) => {
            sock.onopen = () => { for (const t of texts) sock.send(t); };
            sock.onmessage = (e) => { got.push(e.data); if (got.length === texts.length) resolve(); };
            sock.onclose = (e) => reject(new Error(`closed ${e.code} ${e.reason}`));
          }), `${service} over ${transport}`);
          const used = sock.transport;
          sock.onclose = null;
          sock.close();
          results[`${service}/${transport}`] = {
            same: JSON.stringify(got) === JSON.stringify(texts), transport: used };
        }
        const closing = new SockJS(new URL("/sockjs_test/close", location.href).href, null,
          { transports: [transport] });
        const closed = await within(new Promise((resolve) => {
          closing.onclose = (e) => resolve({ code: e.code, reason: e.reason });
        }), `close over ${transport}`);
        results[`close/${transport}`] = closed;
      }
      const ok = Object.entries(results).every(([key, r]) => key.startsWith("close/")
        ? r.code === 3000 && r.reason === "Go away!"
        : r.same && key.endsWith(r.transport));
      return { ok, results };
    }, STEP);
  },

  // qmq.js: subscribe, send with receipts, acks, request/reply.
  async qmqjs(context) {
    const page = await open(context, "/");
    return await page.evaluate(async () => {
      const { Client } = await import("/qmq.js");
      const client = new Client(location.href, { transports: ["websocket"] });
      const states = [];
      client.addEventListener("state", (e) => states.push(e.detail));
      const connected = await client.connect();
      const got = [];
      const done = new Promise((resolve) => {
        client.subscribe("/queue/qmqjs-test", async (message) => {
          got.push(message.body);
          await message.ack();
          if (got.length === 3) resolve();
        }, { ack: "client-individual", "prefetch-count": "2" });
      });
      const responder = client.subscribe("/queue/qmqjs-rpc", (message) => {
        client.send(message.headers["reply-to"], `re: ${message.body}`,
          { "correlation-id": message.headers["correlation-id"] });
      });
      await responder.ready;
      for (const body of ["one", "tw\u00f6", "three"]) await client.send("/queue/qmqjs-test", body);
      await done;
      const reply = await client.request("/queue/qmqjs-rpc", "ping", {}, { timeout: 10000 });
      await client.disconnect();
      const ok = got.join(",") === "one,tw\u00f6,three" && reply.body === "re: ping"
        && states.join(",") === "connecting,open,closed";
      return { ok, got, reply: reply.body, states, version: connected.version };
    });
  },

  // qmq.js: a dropped connection comes back, resubscribed; sends wait.
  async "qmqjs-reconnect"(context) {
    const page = await open(context, "/");
    return await page.evaluate(async () => {
      const { Client } = await import("/qmq.js");
      const client = new Client(location.href, { transports: ["websocket"],
        backoff: { initial: 100, max: 1000, factor: 2 } });
      const states = [];
      client.addEventListener("state", (e) => states.push(e.detail));
      await client.connect();
      const got = [];
      let resolveSecond;
      const second = new Promise((resolve) => { resolveSecond = resolve; });
      const sub = client.subscribe("/topic/qmqjs.reconnect", (m) => {
        got.push(m.body);
        if (m.body === "after") resolveSecond();
      });
      await sub.ready;
      await client.send("/topic/qmqjs.reconnect", "before");
      // Cut the connection under the client (as a network failure would).
      const reopened = new Promise((resolve) => client.addEventListener("connect", resolve, { once: true }));
      client.transport.ws.close(3000, "test cut");
      const waiting = client.send("/topic/qmqjs.reconnect", "after"); // queued while away
      await reopened;
      await sub.ready;
      await waiting;
      await Promise.race([second, new Promise((_, reject) => setTimeout(() => reject(new Error("no message after reconnect")), 10000))]);
      await client.disconnect();
      const ok = got.join(",") === "before,after" && states.includes("reconnecting");
      return { ok, got, states };
    });
  },

  // qmq.js transactions: sends in an aborted transaction never arrive,
  // committed ones do (and only at the commit); an ack in a committed
  // transaction settles, one in an aborted transaction does not (the
  // message comes back once its subscription ends); a finished
  // transaction refuses more work.
  async "qmqjs-transaction"(context) {
    const page = await open(context, "/");
    return await page.evaluate(async () => {
      const { Client, Transaction } = await import("/qmq.js");
      const client = new Client(location.href, { transports: ["websocket"] });
      await client.connect();
      const got = [];
      const waiters = new Map();
      const until = (body) => new Promise((resolve, reject) => {
        if (got.includes(body)) return resolve();
        waiters.set(body, resolve);
        setTimeout(() => reject(new Error(`no ${body}: got ${got}`)), 10000);
      });
      const take = (m) => {
        got.push(m.body);
        if (waiters.has(m.body)) waiters.get(m.body)();
      };
      const q = "/queue/qmqjs-tx";
      const sub = client.subscribe(q, take);
      await sub.ready;
      const aborted = client.begin();
      await aborted.ready;
      await aborted.send(q, "aborted-1");
      await aborted.send(q, "aborted-2", {}, { receipt: false });
      await aborted.abort();
      const committed = client.begin("tx-committed");
      await committed.send(q, "committed-1");
      await committed.send(q, "committed-2");
      await client.send(q, "plain");
      await until("plain");
      const beforeCommit = got.slice();
      await committed.commit();
      await until("committed-2");
      await client.send(q, "end");
      await until("end");
      const refused = await committed.send(q, "late").then(() => "sent", (e) => e.message);

      // Acks: m1 acked in a committed transaction, m2 in an aborted one.
      const q2 = "/queue/qmqjs-txack";
      const held = [];
      let both;
      const two = new Promise((resolve) => { both = resolve; });
      const acking = client.subscribe(q2, (m) => {
        held.push(m);
        if (held.length === 2) both();
      }, { ack: "client-individual" });
      await acking.ready;
      await client.send(q2, "m1");
      await client.send(q2, "m2");
      await two;
      const t3 = client.begin();
      await t3.ack(held[0]);
      await t3.commit();
      const t4 = client.begin();
      await t4.ack(held[1]);
      await t4.abort();
      await acking.unsubscribe(); // m2, never acked, goes back to the queue
      const again = client.subscribe(q2, take);
      await again.ready;
      await client.send(q2, "end2");
      await until("end2");
      await client.disconnect();
      const ok = JSON.stringify(beforeCommit) === JSON.stringify(["plain"])
        && JSON.stringify(got) === JSON.stringify(["plain", "committed-1", "committed-2", "end", "m2", "end2"])
        && refused === "qmq.js: transaction tx-committed is committed"
        && aborted instanceof Transaction && committed.id === "tx-committed";
      return { ok, got, beforeCommit, refused };
    });
  },

  // qmq.js over SockJS transports, and the automatic fallback from a
  // WebSocket that cannot open (as behind a proxy that blocks it).
  "qmqjs-xhr-streaming": (context) => sockjs(context, { transports: ["xhr-streaming"] }),
  "qmqjs-xhr-polling": (context) => sockjs(context, { transports: ["xhr-polling"] }),
  "qmqjs-fallback": (context) => sockjs(context, { path: "/no-websocket-here" }),

  // The chat example: two people in one room.
  async chat(context) {
    const alice = await open(context, "/examples/chat.html");
    const bob = await open(context, "/examples/chat.html");
    for (const [page, name] of [[alice, "alice"], [bob, "bob"]]) {
      await page.locator("#status.open").waitFor({ timeout: STEP });
      await page.fill("#name", name);
      await page.fill("#room", "lobby");
      await page.click("#join-button");
      await page.locator("#text:not([disabled])").waitFor({ timeout: STEP });
    }
    await alice.fill("#text", "hi bob!");
    await alice.click("#send");
    await bob.locator("#messages li", { hasText: "hi bob" }).waitFor({ timeout: STEP });
    await bob.fill("#text", "hello alice");
    await bob.press("#text", "Enter");
    await alice.locator("#messages li", { hasText: "hello alice" }).waitFor({ timeout: STEP });
    const seen = await alice.locator("#messages li").allInnerTexts();
    if (screenshots) await alice.screenshot({ path: join(screenshots, "chat.png") });
    const errors = [...alice.errors, ...bob.errors];
    return { ok: seen.length === 2 && errors.length === 0, seen, errors };
  },

  // The live task queue: jobs out, results back through /temp-queue/.
  async tasks(context) {
    const page = await open(context, "/examples/tasks.html");
    await page.locator("#status.open").waitFor({ timeout: STEP });
    const jobs = [["wordcount", "the quick brown fox"], ["reverse", "stressed"], ["sha256", "abc"],
      ["upper", "qmq"]];
    for (const [kind, input] of jobs) {
      await page.selectOption("#kind", kind);
      await page.fill("#input", input);
      await page.click("#submit");
    }
    for (let i = 1; i <= jobs.length; i++) {
      await page.locator(`#job-${i}[data-state="done"]`).waitFor({ timeout: STEP });
    }
    const rows = await page.locator("#jobs tr").allInnerTexts();
    if (screenshots) await page.screenshot({ path: join(screenshots, "tasks.png") });
    const text = rows.join("\n");
    const ok = text.includes("4") && text.includes("desserts")
      && text.includes("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
      && text.includes("QMQ") && page.errors.length === 0;
    return { ok, rows, errors: page.errors };
  },
};

async function sockjs(context, options) {
  const page = await open(context, "/");
  return await page.evaluate(async (options) => {
    const { Client } = await import("/qmq.js");
    const client = new Client(location.href, { connectTimeout: 3000, ...options });
    let transport = null;
    client.addEventListener("connect", (e) => { transport = e.detail.transport; });
    await client.connect();
    const got = [];
    let done;
    const all = new Promise((resolve) => { done = resolve; });
    const bodies = ["one", "tw\u00f6", "x".repeat(20000), "four"];
    const sub = client.subscribe("/queue/sockjs-test", async (m) => {
      got.push(m.body);
      await m.ack();
      if (got.length === bodies.length) done();
    }, { ack: "client-individual" });
    await sub.ready;
    for (const body of bodies) await client.send("/queue/sockjs-test", body);
    await Promise.race([all, new Promise((_, reject) => setTimeout(() => reject(new Error(`got ${got.length}`)), 10000))]);
    await client.disconnect();
    const expected = options.transports ? options.transports[0] : "xhr-streaming";
    const ok = transport === expected && JSON.stringify(got) === JSON.stringify(bodies);
    return { ok, transport, lengths: got.map((b) => b.length) };
  }, options);
}

// -- main ----------------------------------------------------------------------

const run = scenarios[scenario];
if (!run || !base) {
  finish(2, { ok: false, error: `usage: node run.mjs (${Object.keys(scenarios).join("|")}) BASE_URL` });
} else {
  let browser;
  try {
    browser = await launch();
  } catch (e) {
    finish(3, { ok: false, error: `Chromium could not start: ${e.message.split("\n")[0]}` });
  }
  if (browser) {
    try {
      const result = await run(browser.context);
      finish(result.ok ? 0 : 1, result);
    } catch (e) {
      finish(1, { ok: false, error: String(e && e.stack || e) });
    } finally {
      await browser.context.close().catch(() => {});
      browser.cleanup();
    }
  }
}
