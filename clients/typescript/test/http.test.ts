// The HTTP wrapper (src/http.ts) against a live `electric server --http`:
// every request/response route, the typed error, Idempotency-Key and bearer
// tokens. Synchronised on the server's answers only (no sleeps).
import assert from "node:assert/strict";
import { chmod, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { ElectricHttpClient, ElectricHttpError, http } from "../src/client.js";
import { startElectricServer, type ElectricServer } from "./electric-server.js";

let server: ElectricServer;
let client: ElectricHttpClient;
const run = `p${process.pid}`;

before(async () => {
  server = await startElectricServer(["--http", "127.0.0.1:0"]);
  assert.ok(server.httpUrl, "the server printed its HTTP address");
  client = new ElectricHttpClient(server.httpUrl);
}, { timeout: 60_000 });

after(async () => {
  if (server) {
    assert.equal(await server.stop(), 0, "the server exits 0 on SIGTERM");
  }
}, { timeout: 30_000 });

async function refusal(call: Promise<unknown>): Promise<ElectricHttpError> {
  try {
    await call;
  } catch (error) {
    assert.ok(error instanceof ElectricHttpError, `an ElectricHttpError, got ${String(error)}`);
    return error;
  }
  assert.fail("the call succeeded");
}

test("spawn, get, list, send, events, signal, signalMany and delete", { timeout: 30_000 }, async () => {
  const ref = { type: "ts_http", id: `a-${run}` };
  const spawned = await client.spawn(ref, { grace_period_ms: 5_000 });
  assert.equal(spawned.url, `/ts_http/a-${run}`);
  assert.equal(spawned.state, "spawning");
  assert.equal(spawned.profile.grace_period_ms, 5_000);
  assert.equal(spawned.head_offset, 1);
  assert.equal(typeof spawned.txid, "string");

  const other = await client.spawn(`ts_http/b-${run}`); // the "type/id" form, no profile
  assert.equal(other.profile.grace_period_ms, null);
  assert.deepEqual(await client.get(ref), spawned);

  const page = await client.list({ type: "ts_http", states: ["spawning"], pageSize: 1 });
  assert.deepEqual(page.entities.map((e) => e.id), [`a-${run}`]);
  const rest = await client.list({ type: "ts_http", pageToken: page.next_page_token });
  assert.deepEqual(rest.entities.map((e) => e.id), [`b-${run}`]);
  assert.equal(rest.next_page_token, "");

  const receipt = await client.send(ref, { text: "hello", data: { n: 1 } });
  assert.equal(receipt.offset, 1);
  assert.equal(receipt.key.length > 0, true);
  assert.equal(typeof receipt.created_at, "number");

  const usr = await client.signal(ref, { signal: "SIGUSR", reason: "ts", payload: { focus: "x" } });
  assert.equal(usr.signal, "SIGUSR");
  assert.equal(usr.previous_state, "spawning");

  const many = await client.signalMany({ selector: { type: "ts_http" }, signal: "SIGSTOP" });
  assert.equal(many.signalled + many.ignored + many.skipped, 2);

  const events = await client.events(ref, { offset: 0, limit: 10 });
  assert.deepEqual(events.events.map((e) => [e.offset, e.type]), [
    [0, "state"],
    [1, "message"],
    [2, "signal"],
    [3, "signal"],
  ]);
  const message = events.events[1]!;
  assert.deepEqual(message.value, { text: "hello", sender: "anonymous", data: { n: 1 } });
  assert.equal(message.headers.operation, "insert");
  assert.equal(message.key, receipt.key);
  assert.equal(events.next_offset, 4);
  assert.equal(events.end_of_stream, false);

  const killed = await client.delete(ref);
  assert.equal(killed.signal, "SIGKILL");
  assert.equal(killed.new_state, "killed");
  const after = await client.events(ref, { offset: 4 });
  const deleted = after.events.find((e) => e.key === killed.key);
  assert.equal(deleted?.value.reason, "legacy delete");
  assert.equal(after.events.at(-1)?.value.state, "killed");
});

test("an error body becomes an ElectricHttpError with its code and details", { timeout: 30_000 }, async () => {
  const ref = `ts_http/gone-${run}`;
  await client.spawn(ref);
  await client.delete(ref);
  const head = (await client.get(ref)).head_offset;
  const again = await refusal(client.delete(ref));
  assert.equal(again.status, 409);
  assert.equal(again.code, "INVALID_SIGNAL");
  assert.deepEqual(again.details, { state: "killed", signal: "SIGKILL" });
  assert.match(again.message, /killed/);
  assert.equal((await client.get(ref)).head_offset, head, "nothing appended");

  const missing = await refusal(client.get(`ts_http/none-${run}`));
  assert.equal(missing.status, 404);
  assert.equal(missing.code, "ENTITY_NOT_FOUND");

  const bad = await refusal(client.signal(ref, { signal: "SIGNOPE" as http.SignalName }));
  assert.equal(bad.status, 400);
  assert.equal(bad.code, "UNKNOWN_SIGNAL");

  assert.throws(() => client.get("no-slash"), TypeError);
});

test("Idempotency-Key: a retry replays the first response and appends nothing", { timeout: 30_000 }, async () => {
  const ref = `ts_http/idem-${run}`;
  await client.spawn(ref);
  const key = `retry-${run}`;
  const first = await client.send(ref, { text: "once" }, { idempotencyKey: key });
  const retried = await client.send(ref, { text: "once" }, { idempotencyKey: key });
  assert.deepEqual(retried, first);
  assert.equal((await client.get(ref)).head_offset, 2);

  const reused = await refusal(client.send(ref, { text: "another" }, { idempotencyKey: key }));
  assert.equal(reused.code, "IDEMPOTENCY_KEY_REUSED");
  assert.equal((await client.get(ref)).head_offset, 2);
});

test("bearer tokens: refused without one, accepted with one, a function may supply it", { timeout: 60_000 }, async () => {
  const dir = await mkdtemp(join(tmpdir(), "electric-ts-tokens-"));
  const tokens = join(dir, "tokens.toml");
  await writeFile(tokens, '[[tokens]]\ntoken = "ts-http-token-01"\nprincipal = "tess"\nscopes = ["admin"]\n');
  await chmod(tokens, 0o600);
  const secured = await startElectricServer(["--http", "127.0.0.1:0", "--tokens", tokens]);
  try {
    const anonymous = await refusal(new ElectricHttpClient(secured.httpUrl!).list());
    assert.equal(anonymous.status, 401);
    assert.equal(anonymous.code, "UNAUTHENTICATED");
    assert.match(anonymous.headers.get("www-authenticate") ?? "", /Bearer/);

    const withToken = new ElectricHttpClient(secured.httpUrl!, { token: "ts-http-token-01" });
    await withToken.spawn(`ts_http/secured-${run}`);
    const fromFunction = new ElectricHttpClient(secured.httpUrl!, { token: async () => "ts-http-token-01" });
    const sent = await fromFunction.send(`ts_http/secured-${run}`, { text: "hi" });
    const page = await withToken.events(`ts_http/secured-${run}`, { offset: sent.offset });
    assert.equal(page.events[0]!.value.sender, "tess", "the token's principal is the sender");
  } finally {
    assert.equal(await secured.stop(), 0);
    await rm(dir, { recursive: true, force: true });
  }
});
