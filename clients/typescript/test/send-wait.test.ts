// `send(..., { wait: "run", timeout })` (src/http.ts) against a live `electric server --http` and a
// real Python worker hosting tests/runtime/headless_app.py: a run's outcome, a timeout that leaves
// the message delivered, and a wait resumed with the same Idempotency-Key. Synchronised on the
// server's answers and on the worker's "connecting to" line (no sleeps).
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";

import { ElectricHttpClient, ElectricHttpError } from "../src/client.js";
import { startElectricServer, type ElectricServer } from "./electric-server.js";

const repoRoot = fileURLToPath(new URL("../../../../", import.meta.url));
let server: ElectricServer;
let worker: ChildProcess;
let client: ElectricHttpClient;
let dir: string;
const run = `p${process.pid}`;

before(async () => {
  server = await startElectricServer(["--http", "127.0.0.1:0"]);
  client = new ElectricHttpClient(server.httpUrl!);
  dir = await mkdtemp(join(tmpdir(), "electric-ts-wait-"));
  const python = process.env.ELECTRIC_PYTHON || "python3";
  worker = spawn(
    python,
    ["-m", "electric_sdk.cli.main", "--address", server.address, "worker", "tests.runtime.headless_app:app"],
    { cwd: repoRoot, stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, PYTHONUNBUFFERED: "1" } },
  );
  worker.stderr!.resume();
  await new Promise<void>((resolve, reject) => {
    createInterface({ input: worker.stdout! }).on("line", (line) => {
      if (line.includes("connecting to")) resolve();
    });
    worker.once("exit", (code) => reject(new Error(`the worker exited with ${code}`)));
  });
}, { timeout: 60_000 });

after(async () => {
  worker?.kill("SIGKILL");
  await rm(dir, { recursive: true, force: true });
  if (server) await server.stop();
}, { timeout: 30_000 });

async function running(ref: string): Promise<void> {
  await client.spawn(ref);
  // The first send queues until the worker has the entity; a wait for its run covers that.
  const warm = await client.send(ref, { text: "warm" }, { wait: "run", timeout: "30s" });
  assert.equal(warm.run.status, "completed");
}

test("send and wait: completed with its output, failed with its error", { timeout: 60_000 }, async () => {
  const ref = `headless/ts-a-${run}`;
  await running(ref);
  const done = await client.send(ref, { text: "hello" }, { wait: "run", timeout: 30_000 });
  assert.equal(done.run.status, "completed");
  assert.equal(done.run.ended, true);
  assert.equal(done.run.message_key, done.key);
  assert.match(done.run.output ?? "", /^echo hello pid=\d+$/);
  const failed = await client.send(ref, { text: "fail" }, { wait: "run" });
  assert.equal(failed.run.status, "failed");
  assert.match(failed.run.error ?? "", /asked to fail/);
});

test("a timeout leaves the message delivered; the same key resumes the wait", { timeout: 60_000 }, async () => {
  const ref = `headless/ts-b-${run}`;
  await running(ref);
  const gate = join(dir, "gate");
  const message = { text: `hold ${gate}` };
  const key = `ts-wait-${run}`;
  const late = await client.send(ref, message, { wait: "run", timeout: "300ms", idempotencyKey: key });
  assert.equal(late.run.ended, false);
  assert.ok(["queued", "started"].includes(late.run.status));
  await writeFile(gate, "");
  const again = await client.send(ref, message, { wait: "run", idempotencyKey: key });
  assert.equal(again.key, late.key, "the same message, not a second one");
  assert.equal(again.run.status, "completed");
  assert.match(again.run.output ?? "", / done$/);
});

test("a signal waits for its stage: SIGINT unwound, a stage it lacks refused", { timeout: 60_000 }, async () => {
  const ref = `headless/ts-c-${run}`;
  await running(ref);
  const gate = join(dir, "gate-c");
  const held = await client.send(ref, { text: `hold ${gate}` });
  const refused = await client.signal(ref, { signal: "SIGINT" }, { wait: "terminal" }).catch((error: unknown) => error);
  assert.ok(refused instanceof ElectricHttpError);
  assert.equal(refused.status, 400);
  assert.equal(refused.code, "STAGE_NOT_AVAILABLE");
  // Once the run has started (its record read back from the server), the SIGINT unwinds it: the
  // answer names the run's aborted record.
  for (let offset = 0; ; ) {
    const page = await client.events(ref, { offset, limit: 100 });
    const events = page.events as { type: string; value: { status?: string; message_key?: string } }[];
    if (events.some((e) => e.type === "run" && e.value.status === "started" && e.value.message_key === held.key)) break;
    offset = page.next_offset;
  }
  const stopped = await client.signal(ref, { signal: "SIGINT" }, { wait: "unwound", timeout: "30s" });
  assert.deepEqual(stopped.stages.map((s) => s.stage), ["accepted", "unwound", "downstream"]);
  const unwound = stopped.stages[1]!;
  assert.equal(unwound.reached, true);
  const page = await client.events(ref, { offset: unwound.offset!, limit: 1 });
  const record = page.events[0] as { type: string; value: { status?: string; message_key?: string } };
  assert.equal(record.type, "run");
  assert.equal(record.value.message_key, held.key);
});
