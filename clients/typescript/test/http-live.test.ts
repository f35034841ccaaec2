// The HTTP wrapper's live reads against a live `electric server --http`: an
// entity's stream over SSE (catch-up, the live tail, resumed from a saved
// offset, closed after SIGKILL, across a server restart), each event once; and
// `GET /entities?live=sse`.
// Synchronised on what the server sends (no sleeps).
import assert from "node:assert/strict";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { ElectricHttpClient, type http } from "../src/client.js";
import { startElectricServer, type ElectricServer } from "./electric-server.js";

let server: ElectricServer;
let client: ElectricHttpClient;
const run = `p${process.pid}`;

before(async () => {
  server = await startElectricServer(["--http", "127.0.0.1:0", "--settle", "50ms"]);
  client = new ElectricHttpClient(server.httpUrl!);
}, { timeout: 60_000 });

after(async () => {
  if (server) {
    assert.equal(await server.stop(), 0, "the server exits 0 on SIGTERM");
  }
}, { timeout: 30_000 });

test("streamEvents: catch-up, live tail, resume from a saved offset, closed", { timeout: 30_000 }, async () => {
  const ref = `ts_live/s-${run}`;
  await client.spawn(ref);
  const first = await client.send(ref, { text: "before" });

  const seen: http.ChangeMessage[] = [];
  let saved: string | undefined;
  let closed = false;
  for await (const batch of client.streamEvents(ref)) {
    seen.push(...batch.events);
    if (saved === undefined && batch.upToDate) {
      // Caught up: the spawn and the first message. Save the offset, then write more.
      assert.deepEqual(seen.map((e) => e.type), ["state", "message"]);
      assert.equal(seen[1]!.key, first.key);
      saved = batch.nextOffset;
      await client.send(ref, { text: "live" });
    } else if (seen.some((e) => e.type === "message" && e.value.text === "live") && !closed) {
      if (!seen.some((e) => e.type === "signal")) await client.delete(ref);
    }
    closed = batch.closed;
  }
  assert.ok(closed, "the stream ended closed");
  const keys = seen.map((e) => e.key);
  assert.equal(new Set(keys).size, keys.length, "each event once");
  assert.equal(seen.length, (await client.get(ref)).head_offset, "every event of the stream");
  assert.deepEqual(seen.at(-1)?.value.state, "killed");
  for (const event of seen) assert.deepEqual(Object.keys(event).sort(), ["headers", "key", "type", "value"]);

  // From the offset saved once caught up: exactly what came after it.
  const resumed: http.ChangeMessage[] = [];
  for await (const batch of client.streamEvents(ref, { offset: saved })) resumed.push(...batch.events);
  assert.deepEqual(resumed, seen.slice(2));
});

test("watchEntities: a snapshot, then each state change", { timeout: 30_000 }, async () => {
  const type = `ts_watch_${run}`;
  await client.spawn(`${type}/a`);
  const abort = new AbortController();
  const kinds: string[] = [];
  try {
    for await (const item of client.watchEntities({ type, signal: abort.signal })) {
      kinds.push(item.kind);
      if (item.kind === "snapshot") {
        assert.deepEqual(item.entities.map((e) => e.id), ["a"]);
      } else if (item.kind === "snapshot-complete") {
        await client.delete(`${type}/a`);
      } else if (item.kind === "change") {
        const change = item.changes.find((c) => c.entity.id === "a" && c.entity.state === "killed");
        if (change) {
          assert.equal(change.previous_state, "spawning");
          break;
        }
      }
    }
  } finally {
    abort.abort();
  }
  assert.deepEqual(kinds.slice(0, 2), ["snapshot", "snapshot-complete"]);
  assert.equal(kinds.at(-1), "change");
});

test("streamEvents rides out a server restart: it reconnects from its offset, each event once", { timeout: 60_000 }, async () => {
  const dataDir = await mkdtemp(join(tmpdir(), "electric-ts-restart-"));
  const first = await startElectricServer(["--http", "127.0.0.1:0", "--data", dataDir]);
  let second: ElectricServer | undefined;
  try {
    const ref = `ts_live/restart-${run}`;
    await new ElectricHttpClient(first.httpUrl!).spawn(ref);
    // One client for both servers: the restarted one listens on the same HTTP port. The reader
    // runs on while the server drains (its SSE response ends), is down (connections refused) and
    // starts again, retrying from its last offset.
    const reader = new ElectricHttpClient(first.httpUrl!);
    const seen: http.ChangeMessage[] = [];
    let caughtUp!: () => void;
    const upToDate = new Promise<void>((resolve) => (caughtUp = resolve));
    const reading = (async () => {
      for await (const batch of reader.streamEvents(ref)) {
        seen.push(...batch.events);
        if (batch.upToDate) caughtUp();
        if (seen.some((e) => e.value.text === "after the restart")) return;
      }
    })();
    await upToDate;
    assert.equal(await first.stop(), 0);
    second = await startElectricServer(["--http", new URL(first.httpUrl!).host, "--data", dataDir]);
    await reader.send(ref, { text: "after the restart" });
    await reading;
    assert.deepEqual(seen.map((e) => e.type), ["state", "message"]);
    assert.equal(new Set(seen.map((e) => e.key)).size, seen.length, "each event once");
  } finally {
    await first.stop();
    if (second) assert.equal(await second.stop(), 0);
    await rm(dataDir, { recursive: true, force: true });
  }
});
