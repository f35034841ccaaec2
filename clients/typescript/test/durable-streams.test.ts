// An entity's stream read with the real Durable Streams client (@durable-streams/client's
// `stream()`) against a live electric server's HTTP door: catch-up, live by long-poll and by SSE,
// resumed from a saved offset across a server restart, each event exactly once; materialized
// with @durable-streams/state, and every event validated against that package's
// state-protocol.schema.json. Synchronised on the server's answers only (no sleeps).
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";

import { stream, type JsonBatch } from "@durable-streams/client";
import { MaterializedState, isChangeEvent, type ChangeEvent } from "@durable-streams/state";
import { Ajv } from "ajv";
import formats from "ajv-formats";

const repoRoot = fileURLToPath(new URL("../../../../", import.meta.url));

interface HttpServer {
  /** "http://127.0.0.1:PORT" */
  url: string;
  /** SIGTERM, then the exit code. */
  stop(): Promise<number | null>;
}

/** `electric server` with its HTTP door on a free port, on `dataDir` (kept across restarts). */
async function startServer(dataDir: string): Promise<HttpServer> {
  const python = process.env.ELECTRIC_PYTHON || "python3";
  const child = spawn(
    python,
    [
      "-m", "electric_sdk.cli.main", "server", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
      "--data", dataDir, "--drain-grace", "5s",
    ],
    { cwd: repoRoot, stdio: ["ignore", "pipe", "pipe"] },
  );
  let stderr = "";
  child.stderr.setEncoding("utf8");
  child.stderr.on("data", (chunk: string) => {
    stderr = (stderr + chunk).slice(-16_384);
  });
  const exited = new Promise<number | null>((resolve) => child.once("close", (code) => resolve(code)));
  const url = await new Promise<string>((resolve, reject) => {
    createInterface({ input: child.stdout }).on("line", (line) => {
      const match = /^electric http listening on (\S+)$/.exec(line);
      if (match) resolve(match[1]!);
    });
    child.once("error", reject);
    child.once("exit", (code, signal) =>
      reject(new Error(`electric server exited with ${code ?? signal} before it was ready:\n${stderr}`)),
    );
  });
  return {
    url,
    async stop() {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGTERM");
      return exited;
    },
  };
}

async function call(url: string, method: string, body?: unknown): Promise<unknown> {
  const response = await fetch(url, {
    method,
    headers: body === undefined ? {} : { "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!response.ok) assert.fail(`${method} ${url}: ${response.status} ${await response.text()}`);
  return response.json();
}

/** The entity's whole log from the plain page route, offsets dropped: what every read must add up to. */
async function log(server: HttpServer, path: string): Promise<unknown[]> {
  const page = (await call(`${server.url}${path}/events?limit=1000`, "GET")) as { events: Record<string, unknown>[] };
  return page.events.map(({ offset: _offset, ...change }) => change);
}

/** Subscribe to a live read and collect batches until `count` events have come; then cancel. */
async function collect(
  url: string,
  offset: string,
  live: "long-poll" | "sse",
  count: number,
  whileOpen: () => Promise<void>,
): Promise<{ items: unknown[]; offset: string }> {
  const response = await stream<unknown>({ url, offset, live, json: true });
  const items: unknown[] = [];
  let last = offset;
  let resolve!: () => void;
  const done = new Promise<void>((r) => (resolve = r));
  let caughtUp!: () => void;
  const upToDate = new Promise<void>((r) => (caughtUp = r));
  response.subscribeJson((batch: JsonBatch<unknown>) => {
    items.push(...batch.items);
    last = batch.offset;
    if (batch.upToDate) caughtUp();
    if (items.length >= count) resolve();
  });
  await upToDate; // the reader is at the tail: what is written next arrives live
  await whileOpen();
  await done;
  response.cancel();
  return { items, offset: last };
}

let dataDir: string;
let schemaValidate: (value: unknown) => boolean;
let schemaErrors: () => string;

before(async () => {
  dataDir = await mkdtemp(join(tmpdir(), "electric-ds-"));
  const require = createRequire(import.meta.url);
  const stateDir = dirname(require.resolve("@durable-streams/state/package.json"));
  const schema = JSON.parse(await readFile(join(stateDir, "state-protocol.schema.json"), "utf8"));
  // strictTypes off: the package's schema leaves `type: object` implicit in its if-clauses.
  const ajv = new Ajv({ allErrors: true, strictTypes: false });
  formats.default(ajv); // date-time, as the schema's timestamps are
  const validate = ajv.compile(schema);
  schemaValidate = (value) => validate(value) as boolean;
  schemaErrors = () => ajv.errorsText(validate.errors);
});

after(async () => {
  await rm(dataDir, { recursive: true, force: true });
});

function assertStateProtocol(events: unknown[]): asserts events is ChangeEvent[] {
  for (const event of events) {
    assert.ok(schemaValidate(event), `not a State Protocol message: ${JSON.stringify(event)}: ${schemaErrors()}`);
    assert.ok(isChangeEvent(event as ChangeEvent), `not a change message: ${JSON.stringify(event)}`);
  }
}

test("the Durable Streams client reads an entity's stream: catch-up, long-poll, SSE, resumed across a restart", { timeout: 90_000 }, async () => {
  const path = `/ts_stream/e-${process.pid}`;
  let server = await startServer(dataDir);
  const seen: unknown[] = [];
  try {
    await call(`${server.url}${path}`, "PUT", {});
    for (const text of ["a", "b", "c"]) await call(`${server.url}${path}/messages`, "POST", { text });

    // Catch-up: from the start to the tail, then stop.
    const caughtUp = await stream<unknown>({ url: `${server.url}${path}/stream`, offset: "-1", live: false });
    const history = await caughtUp.json();
    assert.equal(caughtUp.upToDate, true);
    assert.deepEqual(history, await log(server, path));
    seen.push(...history);
    let offset = caughtUp.offset;

    // Live by long-poll, from the saved offset.
    const polled = await collect(`${server.url}${path}/stream`, offset, "long-poll", 2, async () => {
      for (const text of ["d", "e"]) await call(`${server.url}${path}/messages`, "POST", { text });
    });
    seen.push(...polled.items);
    offset = polled.offset;

    // Live by SSE, from there.
    const streamed = await collect(`${server.url}${path}/stream`, offset, "sse", 2, async () => {
      for (const text of ["f", "g"]) await call(`${server.url}${path}/messages`, "POST", { text });
    });
    seen.push(...streamed.items);
    offset = streamed.offset;
    assert.deepEqual(seen, await log(server, path), "catch-up, long-poll and SSE: each event once, in order");

    // Restart; write more; resume from the saved offset.
    assert.equal(await server.stop(), 0, "the server drains and exits 0 on SIGTERM");
    server = await startServer(dataDir);
    for (const text of ["h", "i"]) await call(`${server.url}${path}/messages`, "POST", { text });
    const resumed = await collect(`${server.url}${path}/stream`, offset, "sse", 4, async () => {
      await call(`${server.url}${path}/signal`, "POST", { signal: "SIGKILL", reason: "done" });
    });
    seen.push(...resumed.items);
    assert.deepEqual(seen, await log(server, path), "resumed after a restart: nothing twice, nothing missed");

    // A closed stream: the client reads to its end and learns it is closed.
    const closed = await stream<unknown>({ url: `${server.url}${path}/stream`, offset: resumed.offset, live: "sse" });
    const rest = await closed.json();
    assert.deepEqual(rest, []);
    assert.equal(closed.streamClosed, true);

    assertStateProtocol(seen);
    const state = new MaterializedState();
    state.applyBatch(seen);
    const messages = [...state.getType("message").values()] as { text: string }[];
    assert.deepEqual(messages.map((m) => m.text), ["a", "b", "c", "d", "e", "f", "g", "h", "i"]);
    const states = [...state.getType("state").values()] as { state: string }[];
    assert.deepEqual(states.map((s) => s.state), ["spawning", "killed"]);
  } finally {
    await server.stop();
  }
});

/** A change message without its headers: a fork keeps its origin's events but not their commits. */
function withoutHeaders(items: unknown[]): unknown[] {
  return items.map((item) => {
    const { headers, ...rest } = item as { headers: { operation: string } };
    return { ...rest, operation: headers.operation };
  });
}

test("a fork made with the Durable Streams fork headers reads as its origin up to the offset, then its own", { timeout: 60_000 }, async () => {
  const origin = `/ts_fork/origin-${process.pid}`;
  const fork = `/ts_fork/fork-${process.pid}`;
  const server = await startServer(join(dataDir, "fork")); // removed with dataDir, after the tests
  try {
    await call(`${server.url}${origin}`, "PUT", {});
    for (const text of ["a", "b"]) await call(`${server.url}${origin}/messages`, "POST", { text });
    // The offset to fork at is one the origin's stream gave: its Stream-Next-Offset after a read.
    const before = await stream<unknown>({ url: `${server.url}${origin}/stream`, offset: "-1", live: false });
    const shared = await before.json();
    const at = before.offset;
    for (const text of ["c", "d"]) await call(`${server.url}${origin}/messages`, "POST", { text });

    const created = await fetch(`${server.url}${fork}`, {
      method: "PUT",
      headers: { "Stream-Forked-From": `${origin}/stream`, "Stream-Fork-Offset": at },
    });
    assert.equal(created.status, 201, await created.clone().text());
    assert.equal(((await created.json()) as { state: string }).state, "idle");

    // The whole fork: the origin's events before the offset, at the same offsets, then its own.
    const whole = await stream<unknown>({ url: `${server.url}${fork}/stream`, offset: "-1", live: false });
    const items = await whole.json();
    assertStateProtocol(items);
    assert.deepEqual(withoutHeaders(items.slice(0, shared.length)), withoutHeaders(shared));
    const own = items.slice(shared.length) as { type: string; value: { data?: Record<string, unknown>; state?: string } }[];
    assert.deepEqual(own.map((e) => e.type), ["electric.fork", "state"]);
    assert.deepEqual(own[0]!.value.data, { origin: origin, offset: Number(at), sender: "anonymous", reason: "" });
    assert.equal(own[1]!.value.state, "idle");

    // An offset names the same place in both streams: read from the fork offset, the origin goes on
    // with its own events ("c", "d"), the fork with its fork record.
    const originAfter = await (await stream<unknown>({ url: `${server.url}${origin}/stream`, offset: at, live: false })).json();
    const forkAfter = await (await stream<unknown>({ url: `${server.url}${fork}/stream`, offset: at, live: false })).json();
    assert.equal((originAfter[0] as { type: string }).type, "message");
    assert.equal((forkAfter[0] as { type: string }).type, "electric.fork");
    const mid = String(shared.length - 1).padStart(at.length, "0");
    const originMid = await (await stream<unknown>({ url: `${server.url}${origin}/stream`, offset: mid, live: false })).json();
    const forkMid = await (await stream<unknown>({ url: `${server.url}${fork}/stream`, offset: mid, live: false })).json();
    assert.deepEqual(withoutHeaders(forkMid.slice(0, 1)), withoutHeaders(originMid.slice(0, 1)));

    // A bad offset is refused with the door's error body, and makes nothing.
    const refused = await fetch(`${server.url}${fork}-bad`, {
      method: "PUT",
      headers: { "Stream-Forked-From": `${origin}/stream`, "Stream-Fork-Offset": "-1" },
    });
    assert.equal(refused.status, 400);
    assert.equal(((await refused.json()) as { error: { code: string } }).error.code, "INVALID_OFFSET");
    assert.equal((await fetch(`${server.url}${fork}-bad`)).status, 404);
  } finally {
    await server.stop();
  }
});
