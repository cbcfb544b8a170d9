// qmq.js: QMQ's browser client. An ES module, no build step, no dependency.
//
//   import { Client } from "/qmq.js";
//   const client = new Client();               // the broker that served the page
//   await client.connect();
//   const sub = client.subscribe("/topic/chat", (message) => show(message.body));
//   await sub.ready;                           // the broker has the subscription
//   await client.send("/topic/chat", "hello"); // resolves on the broker's RECEIPT
//
// It speaks STOMP 1.2 (1.1, 1.0) to QMQ over the first transport that works:
// WebSocket (/stomp), then SockJS xhr-streaming and xhr-polling (/sockjs),
// for networks whose proxies block WebSocket. When the connection drops it
// reconnects with exponential backoff and subscribes again; sends made while
// it is away wait (up to maxQueued) and go out once it is back.
//
// Transactions (STOMP BEGIN, COMMIT, ABORT), as in stomp.js:
//
//   const tx = client.begin();
//   await tx.send("/queue/orders", "one");     // held by the broker until...
//   await tx.ack(message);                     // (an ack may be held too)
//   await tx.commit();                         // ...now all of them, or tx.abort()
//
// A transaction lives on one connection: if it drops, the broker aborts it
// and every later call on it rejects (nothing is sent again by itself).
//
// TypeScript declarations: qmq.d.ts beside this file. As an npm package:
// package.json beside this file (docs/browsers.rst, "qmq.js from npm").
//
// Events (client.addEventListener): "state" (detail: the new state:
// "connecting", "open", "reconnecting", "closed"), "connect" (detail: the
// CONNECTED headers and the transport), "error" (detail: an ERROR frame's
// headers and body, or an Error), "close" (detail: {code, reason}).
//
// Docs: docs/browsers.rst in the QMQ repository.

export const VERSION = "0.1.0";

const encoder = new TextEncoder();
const decoder = new TextDecoder();
const TRANSPORTS = ["websocket", "xhr-streaming", "xhr-polling"];

// -- STOMP frames --------------------------------------------------------------

function escapeHeader(value, version) {
  if (version === "1.0") return String(value).replace(/[\r\n]/g, " ");
  let text = String(value).replace(/\\/g, "\\\\").replace(/\n/g, "\\n").replace(/:/g, "\\c");
  if (version === "1.2") text = text.replace(/\r/g, "\\r");
  return text;
}

function unescapeHeader(value, version) {
  if (version === "1.0") return value;
  return value.replace(/\\([\\nrc])/g, (_, c) => ({ "\\": "\\", n: "\n", r: "\r", c: ":" })[c]);
}

/** Encode one frame; `body` is a string or a Uint8Array. Returns a Uint8Array. */
export function encodeFrame(command, headers = {}, body = "", version = "1.2") {
  const bytes = typeof body === "string" ? encoder.encode(body) : body;
  let head = command + "\n";
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined || value === null) continue;
    head += `${escapeHeader(name, version)}:${escapeHeader(value, version)}\n`;
  }
  if (bytes.length && command !== "CONNECT" && command !== "STOMP") {
    head += `content-length:${bytes.length}\n`;
  }
  head += "\n";
  const headBytes = encoder.encode(head);
  const frame = new Uint8Array(headBytes.length + bytes.length + 1);
  frame.set(headBytes, 0);
  frame.set(bytes, headBytes.length);
  return frame;
}

/** Incremental STOMP parser: feed bytes, get whole frames. */
export class FrameParser {
  constructor(maxFrame = 64 * 1024 * 1024) {
    this.buffer = new Uint8Array(0);
    this.version = "1.2";
    this.maxFrame = maxFrame;
  }

  feed(chunk) {
    const data = typeof chunk === "string" ? encoder.encode(chunk) : new Uint8Array(chunk);
    if (this.buffer.length) {
      const joined = new Uint8Array(this.buffer.length + data.length);
      joined.set(this.buffer, 0);
      joined.set(data, this.buffer.length);
      this.buffer = joined;
    } else {
      this.buffer = data;
    }
    const frames = [];
    let start = 0;
    const buf = this.buffer;
    for (;;) {
      // Heart-beats (EOLs) between frames.
      while (start < buf.length && (buf[start] === 10 || buf[start] === 13)) start++;
      if (start >= buf.length) break;
      const headEnd = findHeadEnd(buf, start);
      if (headEnd < 0) break;
      const lines = decoder.decode(buf.subarray(start, headEnd.index)).split(/\r?\n/);
      const command = lines.shift();
      const headers = {};
      for (const line of lines) {
        const colon = line.indexOf(":");
        if (colon < 0) continue;
        const name = unescapeHeader(line.slice(0, colon), this.version);
        if (!(name in headers)) headers[name] = unescapeHeader(line.slice(colon + 1), this.version);
      }
      const bodyStart = headEnd.index + headEnd.length;
      let bodyEnd;
      if (headers["content-length"] !== undefined) {
        bodyEnd = bodyStart + parseInt(headers["content-length"], 10);
        if (bodyEnd + 1 > buf.length) break;
      } else {
        bodyEnd = buf.indexOf(0, bodyStart);
        if (bodyEnd < 0) break;
      }
      const body = buf.slice(bodyStart, bodyEnd);
      frames.push({ command, headers, binaryBody: body, body: decoder.decode(body) });
      start = bodyEnd + 1;
    }
    this.buffer = start ? buf.slice(start) : buf;
    if (this.buffer.length > this.maxFrame) throw new Error("qmq.js: frame too large");
    return frames;
  }
}

function findHeadEnd(buf, from) {
  for (let i = from; i < buf.length; i++) {
    if (buf[i] !== 10) continue;
    if (buf[i + 1] === 10) return { index: i, length: 2 };
    if (buf[i + 1] === 13 && buf[i + 2] === 10) return { index: i, length: 3 };
  }
  return -1;
}

// -- transports ------------------------------------------------------------------
//
// A transport has send(bytes), close(), and calls its owner's onopen(),
// ondata(bytes or string), onclose(code, reason). open() resolves once it is
// open and rejects if it cannot open within the timeout.

class WebSocketTransport {
  constructor(base, options) {
    const url = new URL(options.path || "/stomp", base);
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    this.url = url.href;
    this.name = "websocket";
  }

  open(timeout) {
    return new Promise((resolve, reject) => {
      let ws;
      try {
        ws = new WebSocket(this.url, ["v12.stomp", "v11.stomp", "v10.stomp"]);
      } catch (e) {
        reject(e);
        return;
      }
      ws.binaryType = "arraybuffer";
      this.ws = ws;
      let opened = false;
      const timer = setTimeout(() => {
        if (!opened) {
          ws.close();
          reject(new Error("WebSocket did not open in time"));
        }
      }, timeout);
      ws.onopen = () => {
        opened = true;
        clearTimeout(timer);
        resolve();
      };
      ws.onmessage = (event) => this.ondata(event.data);
      ws.onclose = (event) => {
        clearTimeout(timer);
        if (!opened) reject(new Error(`WebSocket closed before opening (${event.code})`));
        else this.onclose(event.code, event.reason);
      };
      ws.onerror = () => {};
    });
  }

  get writable() {
    return Boolean(this.ws) && this.ws.readyState === WebSocket.OPEN;
  }

  send(bytes) {
    if (this.writable) this.ws.send(bytes);
  }

  close() {
    if (this.ws) this.ws.close(1000);
  }
}

// SockJS (https://github.com/sockjs/sockjs-protocol) over fetch: a session
// is SERVER/SESSION under /sockjs; frames are "o" (open), "h" (heart-beat),
// "a[...]" (messages, a JSON array of strings) and "c[code,reason]" (close).
class SockJSTransport {
  constructor(base, options, kind) {
    this.name = kind;
    this.streaming = kind === "xhr-streaming";
    const server = String(Math.floor(Math.random() * 1000)).padStart(3, "0");
    const session = Array.from(crypto.getRandomValues(new Uint8Array(12)),
      (b) => b.toString(16).padStart(2, "0")).join("");
    this.root = new URL(`${(options.sockjsPath || "/sockjs").replace(/\/$/, "")}/${server}/${session}/`, base).href;
    this.closed = false;
    this.sending = false;
    this.outbox = [];
    this.controller = new AbortController();
  }

  open(timeout) {
    return new Promise((resolve, reject) => {
      this.opened = false;
      this.resolveOpen = resolve;
      this.rejectOpen = reject;
      this.timer = setTimeout(() => this.fail(new Error(`${this.name} did not open in time`)), timeout);
      this.receive();
    });
  }

  fail(error) {
    if (!this.opened) {
      clearTimeout(this.timer);
      this.closed = true;
      this.controller.abort();
      this.rejectOpen(error);
    } else {
      this.finish(2000, String(error && error.message || error));
    }
  }

  finish(code, reason) {
    if (this.closed) return;
    this.closed = true;
    this.controller.abort();
    this.onclose(code, reason);
  }

  // One SockJS frame (without its trailing newline).
  frame(text) {
    if (!text) return true;
    const type = text[0];
    if (type === "o") {
      this.opened = true;
      clearTimeout(this.timer);
      this.resolveOpen();
    } else if (type === "a") {
      for (const message of JSON.parse(text.slice(1))) this.ondata(message);
    } else if (type === "c") {
      const [code, reason] = JSON.parse(text.slice(1));
      if (!this.opened) this.fail(new Error(`SockJS closed: ${code} ${reason}`));
      else this.finish(code, reason);
      return false;
    }
    return true;
  }

  async receive() {
    while (!this.closed) {
      let response;
      try {
        response = await fetch(this.root + (this.streaming ? "xhr_streaming" : "xhr"), {
          method: "POST", signal: this.controller.signal, credentials: "include",
        });
      } catch (e) {
        this.fail(e);
        return;
      }
      if (!response.ok) {
        this.fail(new Error(`${this.name}: HTTP ${response.status}`));
        return;
      }
      if (this.streaming) {
        const reader = response.body.getReader();
        let pending = "";
        const streamDecoder = new TextDecoder();
        try {
          for (;;) {
            const { value, done } = await reader.read();
            if (done) break;
            pending += streamDecoder.decode(value, { stream: true });
            let nl;
            while ((nl = pending.indexOf("\n")) >= 0) {
              const line = pending.slice(0, nl);
              pending = pending.slice(nl + 1);
              if (/^h+$/.test(line) && line.length > 1) continue; // the prelude
              if (!this.frame(line)) return;
            }
          }
        } catch (e) {
          if (!this.closed) this.fail(e);
          return;
        }
        // The server ended the stream (its byte limit): open the next one.
      } else {
        const text = await response.text().catch(() => "");
        for (const line of text.split("\n")) {
          if (!this.frame(line)) return;
        }
      }
    }
  }

  get writable() {
    return this.opened && !this.closed;
  }

  send(bytes) {
    if (this.closed) return;
    this.outbox.push(typeof bytes === "string" ? bytes : decoder.decode(bytes));
    if (!this.sending) this.flush();
  }

  async flush() {
    this.sending = true;
    while (this.outbox.length && !this.closed) {
      const batch = this.outbox;
      this.outbox = [];
      try {
        const response = await fetch(this.root + "xhr_send", {
          method: "POST", body: JSON.stringify(batch), credentials: "include",
          headers: { "content-type": "text/plain;charset=UTF-8" },
          signal: this.controller.signal,
        });
        if (!response.ok) throw new Error(`xhr_send: HTTP ${response.status}`);
      } catch (e) {
        this.fail(e);
        break;
      }
    }
    this.sending = false;
  }

  close() {
    this.finish(1000, "closed by the client");
  }
}

function makeTransport(kind, base, options) {
  if (kind === "websocket") return new WebSocketTransport(base, options);
  if (kind === "xhr-streaming" || kind === "xhr-polling") return new SockJSTransport(base, options, kind);
  throw new Error(`qmq.js: unknown transport ${kind}`);
}

// -- the client -------------------------------------------------------------------

/** A subscription: unsubscribe(); ready resolves once the broker has it. */
export class Subscription {
  constructor(client, id, destination, callback, headers) {
    this.client = client;
    this.id = id;
    this.destination = destination;
    this.callback = callback;
    this.headers = headers;
    this.active = true;
    this.ready = Promise.resolve();
  }

  unsubscribe() {
    if (!this.active) return Promise.resolve();
    this.active = false;
    this.client.subscriptions.delete(this.id);
    if (this.client.state !== "open") return Promise.resolve();
    return this.client._request("UNSUBSCRIBE", { id: this.id });
  }
}

/**
 * A STOMP transaction made by client.begin(): send, ack and nack inside it
 * are held by the broker until commit() (or dropped by abort()). ready
 * resolves once the broker has the BEGIN. Bound to the connection it began
 * on: after a reconnect every call rejects (the broker aborted it).
 */
export class Transaction {
  constructor(client, id) {
    this.client = client;
    this.id = id;
    this.connection = client.connection;
    this.state = "open";
    this.ready = client._request("BEGIN", { transaction: id });
    this.ready.catch(() => {});
  }

  _usable() {
    if (this.state !== "open") return new Error(`qmq.js: transaction ${this.id} is ${this.state}`);
    if (this.client.state !== "open" || this.client.connection !== this.connection) {
      this.state = "lost";
      return new Error(`qmq.js: transaction ${this.id} was lost with its connection`);
    }
    return null;
  }

  /** Send inside the transaction; resolves on the broker's RECEIPT (held, not yet delivered). */
  send(destination, body = "", headers = {}, { receipt = true } = {}) {
    const error = this._usable();
    if (error) return Promise.reject(error);
    const all = { ...headers, destination, transaction: this.id };
    if (receipt) return this.client._request("SEND", all, body);
    this.client._write(encodeFrame("SEND", all, body, this.client.version));
    return Promise.resolve();
  }

  /** Acknowledge a message inside the transaction (settled on commit). */
  ack(message, headers = {}) {
    const error = this._usable();
    return error ? Promise.reject(error) : message.ack({ ...headers, transaction: this.id });
  }

  /** Refuse a message inside the transaction. */
  nack(message, headers = {}) {
    const error = this._usable();
    return error ? Promise.reject(error) : message.nack({ ...headers, transaction: this.id });
  }

  /** Commit: resolves once the broker has carried out every held frame. */
  commit() {
    return this._end("COMMIT", "committed");
  }

  /** Abort: the held frames are dropped. */
  abort() {
    return this._end("ABORT", "aborted");
  }

  _end(command, state) {
    const error = this._usable();
    if (error) return Promise.reject(error);
    this.state = state;
    return this.client._request(command, { transaction: this.id });
  }
}

export class Client extends EventTarget {
  /**
   * @param {string} [url] the broker's base URL (http: or https:); the page's
   *   own origin by default.
   * @param {object} [options] transports (["websocket", "xhr-streaming",
   *   "xhr-polling"]), login, passcode, host (the virtual host), heartbeat
   *   ([outgoing, incoming] ms, [10000, 10000]), connectTimeout (ms, 5000),
   *   reconnect (true), backoff ({initial: 500, max: 30000, factor: 2}),
   *   maxQueued (sends kept while away, 1000), path ("/stomp"),
   *   sockjsPath ("/sockjs"), debug (a function given each frame's command).
   */
  constructor(url, options = {}) {
    super();
    this.base = url || (typeof location !== "undefined" ? location.href : "http://127.0.0.1:15674/");
    this.options = {
      transports: TRANSPORTS,
      heartbeat: [10000, 10000],
      connectTimeout: 5000,
      reconnect: true,
      backoff: { initial: 500, max: 30000, factor: 2 },
      maxQueued: 1000,
      ...options,
    };
    this.state = "closed";
    this.transport = null;
    this.version = "1.2";
    this.subscriptions = new Map();
    this.receipts = new Map();
    this.queued = [];
    this.nextId = 1;
    this.attempts = 0;
    this.preferred = 0;
    this.wanted = false;
    this.replyHandlers = new Map();
    this.connection = 0; // counts CONNECTED frames: a transaction's connection
  }

  _setState(state) {
    if (state === this.state) return;
    this.state = state;
    this.dispatchEvent(new CustomEvent("state", { detail: state }));
  }

  /** Connect (or reconnect); resolves with the CONNECTED frame's headers. */
  connect() {
    this.wanted = true;
    if (this.state === "open") return Promise.resolve(this.connected);
    if (!this.connecting) {
      this.connecting = new Promise((resolve, reject) => {
        this._connected = resolve;
        this._failed = reject;
      });
      this._attempt();
    }
    return this.connecting;
  }

  async _attempt() {
    this._setState(this.attempts ? "reconnecting" : "connecting");
    const kinds = this.options.transports;
    const order = kinds.slice(this.preferred).concat(kinds.slice(0, this.preferred));
    let lastError = null;
    for (const kind of order) {
      if (!this.wanted) return;
      const transport = makeTransport(kind, this.base, this.options);
      const parser = new FrameParser();
      transport.onopen = () => {};
      transport.ondata = (data) => this._data(transport, parser, data);
      transport.onclose = (code, reason) => this._closed(transport, code, reason);
      try {
        await transport.open(this.options.connectTimeout);
      } catch (e) {
        lastError = e;
        continue;
      }
      if (!this.wanted) {
        transport.close();
        return;
      }
      this.transport = transport;
      this.parser = parser;
      this.preferred = kinds.indexOf(kind);
      const [cx, cy] = this.options.heartbeat;
      this._write(encodeFrame("CONNECT", {
        "accept-version": "1.2,1.1,1.0",
        host: this.options.host || new URL(this.base).hostname,
        login: this.options.login,
        passcode: this.options.passcode,
        "heart-beat": `${cx},${cy}`,
      }, "", "1.0"));
      return;
    }
    this._retry(lastError || new Error("no transport"));
  }

  _retry(error) {
    this.transport = null;
    if (!this.wanted || !this.options.reconnect) {
      this._setState("closed");
      if (this.connecting) {
        this._failed(error);
        this.connecting = null;
      }
      return;
    }
    this._setState("reconnecting");
    const { initial, max, factor } = this.options.backoff;
    const delay = Math.min(max, initial * factor ** this.attempts) * (0.5 + Math.random() / 2);
    this.attempts++;
    this.retryTimer = setTimeout(() => this._attempt(), delay);
  }

  _write(bytes) {
    if (this.options.debug) this.options.debug(">>>", decoder.decode(bytes.subarray(0, bytes.indexOf(10))));
    this.transport.send(this.transport.name === "websocket" && isText(bytes) ? decoder.decode(bytes) : bytes);
  }

  _data(transport, parser, data) {
    if (transport !== this.transport) return;
    this.lastRead = Date.now();
    let frames;
    try {
      frames = parser.feed(data);
    } catch (e) {
      this._emitError(e);
      transport.close();
      return;
    }
    for (const frame of frames) this._frame(frame);
  }

  _frame(frame) {
    if (this.options.debug) this.options.debug("<<<", frame.command);
    const h = frame.headers;
    switch (frame.command) {
      case "CONNECTED":
        this._opened(h);
        break;
      case "MESSAGE": {
        const sub = this.subscriptions.get(h.subscription);
        const message = this._message(frame, sub);
        if (sub && sub.active) sub.callback(message);
        else if (h["correlation-id"] && this.replyHandlers.has(h["correlation-id"])) {
          this.replyHandlers.get(h["correlation-id"])(message);
        }
        break;
      }
      case "RECEIPT": {
        const waiter = this.receipts.get(h["receipt-id"]);
        if (waiter) {
          this.receipts.delete(h["receipt-id"]);
          waiter.resolve(frame);
        }
        break;
      }
      case "ERROR":
        this._emitError(frame);
        if (h["receipt-id"] && this.receipts.has(h["receipt-id"])) {
          this.receipts.get(h["receipt-id"]).reject(new StompError(frame));
          this.receipts.delete(h["receipt-id"]);
        }
        break;
      default:
        break;
    }
  }

  _message(frame, sub) {
    const client = this;
    const h = frame.headers;
    return {
      ...frame,
      destination: h.destination,
      ack(headers = {}) { return client._settle("ACK", h, headers); },
      nack(headers = {}) { return client._settle("NACK", h, headers); },
    };
  }

  _settle(command, h, extra) {
    const headers = this.version === "1.2"
      ? { id: h.ack }
      : { "message-id": h["message-id"], subscription: h.subscription };
    return this._request(command, { ...headers, ...extra });
  }

  _opened(headers) {
    this.version = headers.version || "1.0";
    this.parser.version = this.version;
    this.connected = headers;
    this.connection++;
    this.attempts = 0;
    this._setState("open");
    this._startHeartbeats(headers["heart-beat"] || "0,0");
    // Subscribe again, then send what waited.
    for (const sub of this.subscriptions.values()) this._subscribeFrame(sub);
    const queued = this.queued;
    this.queued = [];
    for (const item of queued) this._sendNow(item);
    this.dispatchEvent(new CustomEvent("connect", { detail: { headers, transport: this.transport.name } }));
    if (this.connecting) {
      this._connected(headers);
      this.connecting = null;
    }
  }

  _startHeartbeats(value) {
    this._stopHeartbeats();
    const [sx, sy] = value.split(",").map((n) => parseInt(n, 10) || 0);
    const [cx, cy] = this.options.heartbeat;
    if (cx && sy) {
      const every = Math.max(cx, sy);
      this.beatTimer = setInterval(() => this.transport && this.transport.send("\n"), every);
    }
    if (cy && sx) {
      const every = Math.max(cy, sx);
      this.lastRead = Date.now();
      this.watchTimer = setInterval(() => {
        if (Date.now() - this.lastRead > every * 2) {
          this._emitError(new Error("no heart-beat from the broker"));
          if (this.transport) this.transport.close();
        }
      }, every);
    }
  }

  _stopHeartbeats() {
    clearInterval(this.beatTimer);
    clearInterval(this.watchTimer);
    this.beatTimer = this.watchTimer = null;
  }

  _emitError(detail) {
    this.dispatchEvent(new CustomEvent("error", { detail }));
  }

  _closed(transport, code, reason) {
    if (transport !== this.transport) return;
    this._stopHeartbeats();
    this.transport = null;
    for (const waiter of this.receipts.values()) waiter.reject(new Error(`connection lost (${code} ${reason || ""})`));
    this.receipts.clear();
    this.dispatchEvent(new CustomEvent("close", { detail: { code, reason } }));
    this._retry(new Error(`connection closed (${code} ${reason || ""})`));
  }

  _request(command, headers, body = "") {
    if (this.state !== "open") return Promise.reject(new Error("qmq.js: not connected"));
    const receipt = `r-${this.nextId++}`;
    const promise = new Promise((resolve, reject) => this.receipts.set(receipt, { resolve, reject }));
    this._write(encodeFrame(command, { ...headers, receipt }, body, this.version));
    return promise;
  }

  _subscribeFrame(sub) {
    sub.ready = this._request("SUBSCRIBE", { ...sub.headers, id: sub.id, destination: sub.destination });
    sub.ready.catch(() => {});
  }

  /**
   * Subscribe to a destination. headers may say ack ("auto", "client",
   * "client-individual"), prefetch-count, durable... Returns a Subscription
   * whose ready promise resolves once the broker has it.
   */
  subscribe(destination, callback, headers = {}) {
    // A /temp-queue/ subscription uses its destination as its id: the broker
    // then delivers replies to it (and makes no subscription of its own).
    const id = headers.id || (destination.startsWith("/temp-queue/") ? destination : `sub-${this.nextId++}`);
    const sub = new Subscription(this, id, destination, callback, { ack: "auto", ...headers });
    delete sub.headers.id;
    this.subscriptions.set(id, sub);
    if (this.state === "open") this._subscribeFrame(sub);
    return sub;
  }

  /**
   * Send body (a string or a Uint8Array) to destination. Resolves once the
   * broker confirms it (its RECEIPT; for a persistent message, once stored),
   * or at once with {receipt: false}. While the client is away, the send
   * waits (up to maxQueued).
   */
  send(destination, body = "", headers = {}, { receipt = true } = {}) {
    return new Promise((resolve, reject) => {
      const item = { destination, body, headers, receipt, resolve, reject };
      if (this.state === "open" && this.transport && this.transport.writable) this._sendNow(item);
      else if (this.queued.length < this.options.maxQueued) this.queued.push(item);
      else reject(new Error("qmq.js: too many sends waiting for the connection"));
    });
  }

  _sendNow({ destination, body, headers, receipt, resolve, reject }) {
    const all = { ...headers, destination };
    if (receipt) {
      this._request("SEND", all, body).then(resolve, reject);
    } else {
      this._write(encodeFrame("SEND", all, body, this.version));
      resolve();
    }
  }

  /**
   * Request/reply: send body to destination with a reply-to of a private
   * /temp-queue/ and resolve with the reply (the message whose
   * correlation-id matches), or reject after timeout ms.
   */
  request(destination, body = "", headers = {}, { timeout = 30000, replyTo = "/temp-queue/qmq-replies" } = {}) {
    if (!this.subscriptions.has(replyTo)) {
      this.subscribe(replyTo, (message) => {
        const handler = this.replyHandlers.get(message.headers["correlation-id"]);
        if (handler) handler(message);
      });
    }
    const id = `c-${Date.now().toString(36)}-${this.nextId++}`;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.replyHandlers.delete(id);
        reject(new Error(`qmq.js: no reply within ${timeout} ms`));
      }, timeout);
      this.replyHandlers.set(id, (message) => {
        clearTimeout(timer);
        this.replyHandlers.delete(id);
        resolve(message);
      });
      this.send(destination, body, { ...headers, "reply-to": replyTo, "correlation-id": id })
        .catch((e) => {
          clearTimeout(timer);
          this.replyHandlers.delete(id);
          reject(e);
        });
    });
  }

  /**
   * Begin a transaction (STOMP BEGIN) on the open connection; throws when
   * not connected. id: the transaction's name (a fresh one by default).
   */
  begin(id) {
    if (this.state !== "open") throw new Error("qmq.js: not connected");
    return new Transaction(this, id || `tx-${Date.now().toString(36)}-${this.nextId++}`);
  }

  /** Disconnect cleanly (DISCONNECT with a receipt); no reconnect. */
  async disconnect() {
    this.wanted = false;
    clearTimeout(this.retryTimer);
    const transport = this.transport;
    if (this.state === "open" && transport) {
      try {
        await Promise.race([
          this._request("DISCONNECT", {}),
          new Promise((resolve) => setTimeout(resolve, 2000)),
        ]);
      } catch (e) {
        // closing anyway
      }
    }
    this._stopHeartbeats();
    this.transport = null;
    if (transport) transport.close();
    for (const item of this.queued) item.reject(new Error("qmq.js: disconnected"));
    this.queued = [];
    this._setState("closed");
  }
}

/** An ERROR frame from the broker, as an exception. */
export class StompError extends Error {
  constructor(frame) {
    super(frame.headers.message || "STOMP error");
    this.frame = frame;
  }
}

function isText(bytes) {
  try {
    new TextDecoder("utf-8", { fatal: true }).decode(bytes);
    return true;
  } catch (e) {
    return false;
  }
}
