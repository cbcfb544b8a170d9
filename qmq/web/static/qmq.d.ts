// TypeScript declarations of qmq.js, QMQ's browser client (the file beside
// this one). Kept by hand with qmq.js: tests/test_web_qmqjs_package.py checks
// that both export the same names and that tsc accepts a program using them.
// Docs: docs/browsers.rst in the QMQ repository.

/** The client's version (the broker's release it came with). */
export declare const VERSION: string;

/** STOMP headers: names to values (undefined and null values are left out). */
export type Headers = Record<string, string | number | boolean | undefined | null>;

/** A STOMP protocol version. */
export type StompVersion = "1.0" | "1.1" | "1.2";

/** A transport qmq.js can speak, in the order it tries them by default. */
export type TransportName = "websocket" | "xhr-streaming" | "xhr-polling";

/** The client's state ("state" events carry the new one). */
export type ClientState = "connecting" | "open" | "reconnecting" | "closed";

/** One received frame. */
export interface Frame {
  command: string;
  headers: Record<string, string>;
  /** The body's bytes. */
  binaryBody: Uint8Array;
  /** The body decoded as UTF-8. */
  body: string;
}

/** A MESSAGE given to a subscription's callback. */
export interface Message extends Frame {
  destination: string;
  /** Acknowledge it (ack "client" or "client-individual"); resolves on the RECEIPT. */
  ack(headers?: Headers): Promise<Frame>;
  /** Refuse it; resolves on the RECEIPT. */
  nack(headers?: Headers): Promise<Frame>;
}

export interface Backoff {
  /** ms before the first retry (500). */
  initial?: number;
  /** ms between retries at most (30000). */
  max?: number;
  /** growth per attempt (2). */
  factor?: number;
}

export interface ClientOptions {
  /** Transports to try, in order (all three by default). */
  transports?: TransportName[];
  login?: string;
  passcode?: string;
  /** The virtual host (the URL's host name by default). */
  host?: string;
  /** [outgoing, incoming] heart-beats in ms ([10000, 10000]). */
  heartbeat?: [number, number];
  /** ms to open a transport (5000). */
  connectTimeout?: number;
  /** Reconnect when the connection drops (true). */
  reconnect?: boolean;
  backoff?: Backoff;
  /** Sends kept while away (1000). */
  maxQueued?: number;
  /** The WebSocket path ("/stomp"). */
  path?: string;
  /** The SockJS path ("/sockjs"). */
  sockjsPath?: string;
  /** Given each frame's direction (">>>" or "<<<") and command. */
  debug?: (direction: string, command: string) => void;
}

export interface SendOptions {
  /** Ask for a RECEIPT and resolve on it (true); false: resolve once written. */
  receipt?: boolean;
}

export interface RequestOptions {
  /** ms to wait for the reply (30000). */
  timeout?: number;
  /** The reply destination ("/temp-queue/qmq-replies"). */
  replyTo?: string;
}

/** Subscription headers: ack mode, prefetch-count and any other. */
export interface SubscribeHeaders {
  ack?: "auto" | "client" | "client-individual";
  id?: string;
  "prefetch-count"?: string | number;
  [name: string]: string | number | boolean | undefined | null;
}

/** Encode one frame; body is a string or bytes. */
export declare function encodeFrame(
  command: string, headers?: Headers, body?: string | Uint8Array, version?: StompVersion,
): Uint8Array;

/** Incremental STOMP parser: feed bytes, get whole frames. */
export declare class FrameParser {
  constructor(maxFrame?: number);
  version: StompVersion;
  maxFrame: number;
  feed(chunk: string | ArrayBuffer | Uint8Array): Frame[];
}

/** A subscription: unsubscribe(); ready resolves once the broker has it. */
export declare class Subscription {
  readonly client: Client;
  readonly id: string;
  readonly destination: string;
  readonly headers: SubscribeHeaders;
  active: boolean;
  ready: Promise<unknown>;
  unsubscribe(): Promise<unknown>;
}

/** A transaction made by Client.begin(): held until commit() or abort(). */
export declare class Transaction {
  readonly client: Client;
  readonly id: string;
  /** "open", then "committed", "aborted" or "lost" (its connection dropped). */
  state: "open" | "committed" | "aborted" | "lost";
  /** Resolves once the broker has the BEGIN. */
  ready: Promise<Frame>;
  send(destination: string, body?: string | Uint8Array, headers?: Headers,
       options?: SendOptions): Promise<Frame | void>;
  ack(message: Message, headers?: Headers): Promise<Frame>;
  nack(message: Message, headers?: Headers): Promise<Frame>;
  commit(): Promise<Frame>;
  abort(): Promise<Frame>;
}

export interface ConnectEventDetail {
  headers: Record<string, string>;
  transport: TransportName;
}

export interface ClientEventMap {
  state: CustomEvent<ClientState>;
  connect: CustomEvent<ConnectEventDetail>;
  error: CustomEvent<Frame | Error>;
  close: CustomEvent<{ code: number; reason: string }>;
}

export declare class Client extends EventTarget {
  /** @param url the broker's base URL (http: or https:); the page's origin by default. */
  constructor(url?: string, options?: ClientOptions);
  readonly base: string;
  readonly options: ClientOptions;
  readonly state: ClientState;
  /** The STOMP version the broker chose. */
  readonly version: StompVersion;
  /** The CONNECTED frame's headers, once connected. */
  readonly connected?: Record<string, string>;
  /** Connect (or reconnect); resolves with the CONNECTED headers. */
  connect(): Promise<Record<string, string>>;
  subscribe(destination: string, callback: (message: Message) => void,
            headers?: SubscribeHeaders): Subscription;
  /** Resolves on the broker's RECEIPT (or at once with receipt: false); waits while away. */
  send(destination: string, body?: string | Uint8Array, headers?: Headers,
       options?: SendOptions): Promise<Frame | void>;
  /** Request/reply over a /temp-queue/: resolves with the reply. */
  request(destination: string, body?: string | Uint8Array, headers?: Headers,
          options?: RequestOptions): Promise<Message>;
  /** Begin a transaction on the open connection; throws when not connected. */
  begin(id?: string): Transaction;
  disconnect(): Promise<void>;
  addEventListener<K extends keyof ClientEventMap>(
    type: K, listener: (event: ClientEventMap[K]) => void,
    options?: boolean | AddEventListenerOptions): void;
  addEventListener(type: string, listener: EventListenerOrEventListenerObject | null,
                   options?: boolean | AddEventListenerOptions): void;
  removeEventListener<K extends keyof ClientEventMap>(
    type: K, listener: (event: ClientEventMap[K]) => void,
    options?: boolean | EventListenerOptions): void;
  removeEventListener(type: string, listener: EventListenerOrEventListenerObject | null,
                      options?: boolean | EventListenerOptions): void;
}

/** An ERROR frame from the broker, as an exception. */
export declare class StompError extends Error {
  constructor(frame: Frame);
  readonly frame: Frame;
}
