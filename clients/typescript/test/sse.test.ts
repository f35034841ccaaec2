// The HTTP wrapper's SSE reader (src/http.ts) against a tiny Node server that
// speaks the Durable Streams protocol's SSE framing (PROTOCOL.md, "Read Stream
// - Live (SSE)"): `data` events carrying JSON arrays (split over several
// `data:` lines), each followed by a `control` event; heartbeat comments; a
// connection closed without `streamClosed`, which the reader must reopen from
// the last `streamNextOffset` (and `cursor`); `streamClosed` ending it.
import assert from "node:assert/strict";
import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, test } from "node:test";

import { ElectricHttpClient, ElectricHttpError, readSse, type http } from "../src/client.js";

const offset = (n: number) => String(n).padStart(20, "0");
const change = (n: number, text: string): http.ChangeMessage => ({
  type: "message",
  key: `msg_${n}`,
  value: { text, sender: "anonymous" },
  headers: { operation: "insert", timestamp: "2026-12-01T10:00:00.000Z", txid: String(n + 1) },
});
const EVENTS = [change(0, "zero"), change(1, "één 🙂"), change(2, "two")];
const TOKEN = "sse-test-token";

let server: Server;
let baseUrl: string;
const requests: { url: string; authorization: string | undefined }[] = [];

function frames(req: IncomingMessage): string[] {
  const url = new URL(req.url!, "http://x");
  const from = url.searchParams.get("offset");
  if (url.pathname === "/entities") {
    const entity = { url: "/t/e1", type: "t", id: "e1", state: "running" };
    return [
      `event: snapshot\ndata: ${JSON.stringify([entity])}\n\n`,
      `id: 7\nevent: snapshot-complete\ndata: {"txid":"7"}\n\n`,
      ": heartbeat\n\n",
      `id: 9\nevent: change\ndata: ${JSON.stringify([{ entity: { ...entity, state: "idle" }, previous_state: "running", changed_at: "2026-12-01T10:00:01.000Z" }])}\n\n`,
    ];
  }
  if (from === "-1") {
    // Two events as one JSON array over four data: lines, CRLF line ends, a heartbeat; then the
    // connection ends without streamClosed, as a server's periodic close or drain does.
    return [
      `event: data\r\ndata: [\r\ndata: ${JSON.stringify(EVENTS[0])},\r\n`,
      `data: ${JSON.stringify(EVENTS[1])}\r\ndata: ]\r\n\r\n`,
      ": heartbeat\n\n",
      `event: control\ndata: {"streamNextOffset":"${offset(2)}","streamCursor":"c1","upToDate":true}\n\n`,
    ];
  }
  if (from === offset(2)) {
    return [
      `event: data\ndata: ${JSON.stringify([EVENTS[2]])}\n\n`,
      `event: control\ndata: {"streamNextOffset":"${offset(3)}","streamClosed":true}\n\n`,
    ];
  }
  return [];
}

before(async () => {
  server = createServer((req, res) => {
    requests.push({ url: req.url!, authorization: req.headers.authorization });
    if (req.headers.authorization !== `Bearer ${TOKEN}`) {
      res.writeHead(401, { "content-type": "application/json", "www-authenticate": "Bearer" });
      res.end(JSON.stringify({ error: { code: "UNAUTHENTICATED", message: "a bearer token is required", details: {} } }));
      return;
    }
    res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-store" });
    for (const frame of frames(req)) res.write(frame);
    res.end();
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

after(async () => {
  await new Promise<void>((resolve) => server.close(() => resolve()));
});

test("streamEvents: batches once each, reconnecting from streamNextOffset until streamClosed", async () => {
  requests.length = 0;
  const client = new ElectricHttpClient(baseUrl, { token: TOKEN });
  const batches: http.StreamBatch[] = [];
  for await (const batch of client.streamEvents({ type: "t", id: "e1" })) batches.push(batch);
  assert.deepEqual(batches, [
    { events: [EVENTS[0], EVENTS[1]], nextOffset: offset(2), upToDate: true, closed: false },
    { events: [EVENTS[2]], nextOffset: offset(3), upToDate: true, closed: true },
  ]);
  assert.deepEqual(requests, [
    { url: "/t/e1/stream?live=sse&offset=-1", authorization: `Bearer ${TOKEN}` },
    { url: `/t/e1/stream?live=sse&offset=${offset(2)}&cursor=c1`, authorization: `Bearer ${TOKEN}` },
  ]);

  // Resumed from a saved offset: only what came after it.
  const resumed: http.StreamBatch[] = [];
  for await (const batch of client.streamEvents("t/e1", { offset: offset(2) })) resumed.push(batch);
  assert.deepEqual(resumed.flatMap((b) => b.events), [EVENTS[2]]);
});

test("watchEntities: the snapshot, its end, then changes with their txid", async () => {
  const client = new ElectricHttpClient(baseUrl, { token: TOKEN });
  const seen: http.EntitiesEvent[] = [];
  for await (const event of client.watchEntities({ type: "t", states: ["running", "idle"] })) seen.push(event);
  assert.deepEqual(seen.map((e) => e.kind), ["snapshot", "snapshot-complete", "change"]);
  assert.equal(seen[2]?.kind === "change" && seen[2].txid, "9");
  assert.equal(seen[2]?.kind === "change" && seen[2].changes[0]?.entity.state, "idle");
  assert.equal(requests.at(-1)?.url, "/entities?live=sse&type=t&state=running&state=idle");
});

test("a refused SSE request throws the typed error", async () => {
  const client = new ElectricHttpClient(baseUrl);
  const stream = client.streamEvents("t/e1");
  await assert.rejects(stream.next(), (error: unknown) => {
    assert.ok(error instanceof ElectricHttpError);
    assert.equal(error.status, 401);
    assert.equal(error.code, "UNAUTHENTICATED");
    return true;
  });
});

test("readSse: split anywhere, CR, LF or CRLF, comments skipped, multi-line data joined", async () => {
  const text = '\uFEFFevent: data\rdata: [1,\r\ndata: 2]\n\n: comment\n\nid: 5\ndata: é🙂\n\ndata: dropped without its blank line';
  const bytes = new TextEncoder().encode(text);
  // Every byte its own chunk: CRLF pairs and a multi-byte character split across reads.
  const body = new ReadableStream<Uint8Array>({
    start(controller) {
      for (const byte of bytes) controller.enqueue(new Uint8Array([byte]));
      controller.close();
    },
  });
  const events = [];
  for await (const event of readSse(body)) events.push(event);
  assert.deepEqual(events, [
    { event: "data", data: "[1,\n2]" },
    { event: "message", data: "é🙂", id: "5" },
  ]);
});
