// A TypeScript program using qmq.js through its declarations (qmq.d.ts), as
// an application that installed it with npm would. Type-checked, never run,
// by tests/test_web_qmqjs_package.py (tsc --noEmit, strict). The last
// lines are each marked as an expected error: the declarations are not `any`.
import {
  Client, FrameParser, StompError, Subscription, Transaction, VERSION, encodeFrame,
  type ClientState, type Message,
} from "@qmq/client";

async function main(): Promise<void> {
  const client = new Client("https://broker.example/", {
    transports: ["websocket", "xhr-polling"], login: "alice", passcode: "secret",
    heartbeat: [10000, 10000], backoff: { initial: 100 }, debug: (d, c) => console.log(d, c),
  });
  client.addEventListener("state", (e) => {
    const s: ClientState = e.detail;
    console.log(s);
  });
  client.addEventListener("connect", (e) => console.log(e.detail.transport));
  const connected: Record<string, string> = await client.connect();
  console.log(connected.version, VERSION.length);
  const sub: Subscription = client.subscribe("/queue/orders", async (m: Message) => {
    console.log(m.destination, m.body, m.binaryBody.byteLength);
    await m.ack();
  }, { ack: "client-individual", "prefetch-count": 10 });
  await sub.ready;
  await client.send("/queue/orders", "one", { priority: 4 });
  await client.send("/queue/orders", new Uint8Array([1, 2]), {}, { receipt: false });
  const reply: Message = await client.request("/queue/rpc", "ping", {}, { timeout: 1000 });
  const tx: Transaction = client.begin();
  await tx.ready;
  await tx.send("/queue/orders", "two");
  await tx.ack(reply);
  await tx.nack(reply, { requeue: false });
  if (tx.state === "open") await tx.commit();
  await client.begin("named").abort();
  const frames = new FrameParser().feed(encodeFrame("SEND", { destination: "/queue/x" }, "b"));
  console.log(frames[0].command, new StompError(frames[0]).frame.headers);
  await sub.unsubscribe();
  await client.disconnect();

  // @ts-expect-error: no such transport
  new Client(undefined, { transports: ["carrier-pigeon"] });
  // @ts-expect-error: commit takes nothing
  await tx.commit(true);
  // @ts-expect-error: a body is a string or bytes
  await client.send("/queue/orders", { json: true });
  // @ts-expect-error: no such ack mode
  client.subscribe("/queue/x", () => {}, { ack: "sometimes" });
}

void main();
