// Against a live electric server: spawn an entity, SIGKILL it, watch the
// `killed` transition arrive on WatchEvents, then read INVALID_SIGNAL from a
// second SIGKILL. Synchronised on the server's answers only (no sleeps).
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import {
  Code,
  ConnectError,
  ERROR_DOMAIN,
  Signal,
  SignalOutcome,
  State,
  createElectricClient,
  errorInfo,
  errorReason,
  type Event,
  type WatchEventsResponse,
} from "../src/client.js";
import { startElectricServer, type ElectricServer } from "./electric-server.js";

let server: ElectricServer;

before(async () => {
  server = await startElectricServer();
}, { timeout: 60_000 });

after(async () => {
  if (server) {
    assert.equal(await server.stop(), 0, "the server exits 0 on SIGTERM");
  }
}, { timeout: 30_000 });

test("SIGKILL: watch the killed transition, then INVALID_SIGNAL on a second SIGKILL", { timeout: 30_000 }, async () => {
  const client = createElectricClient(server.address);
  const ref = { type: "ts_client", id: `kill-${process.pid}` };

  const spawned = await client.spawnEntity({ ref });
  assert.equal(spawned.entity?.state, State.SPAWNING);

  const watch: AsyncIterator<WatchEventsResponse> = client
    .watchEvents({ ref, fromOffset: 0n })
    [Symbol.asyncIterator]();
  const nextEvent = async (): Promise<Event> => {
    const result = await watch.next();
    assert.ok(!result.done, "the watch ended before the killed transition");
    assert.equal(result.value.item.case, "event");
    return result.value.item.value;
  };

  // Offset 0 is the spawn's state event; having it means the watch is open.
  const spawnEvent = await nextEvent();
  assert.equal(spawnEvent.offset, 0n);
  assert.equal(spawnEvent.value.case, "state");
  assert.equal(spawnEvent.value.value.state, State.SPAWNING);

  const kill = await client.signalEntity({ ref, signal: Signal.SIGKILL, reason: "typescript client test" });
  assert.equal(kill.signal, Signal.SIGKILL);
  assert.equal(kill.previousState, State.SPAWNING);
  assert.equal(kill.newState, State.KILLED);
  assert.equal(kill.outcome, SignalOutcome.TRANSITIONED);
  assert.equal(kill.url, `/${ref.type}/${ref.id}`);

  const events: Event[] = [spawnEvent];
  let killed: Event | undefined;
  while (killed === undefined) {
    const event = await nextEvent();
    events.push(event);
    if (event.value.case === "state" && event.value.value.state === State.KILLED) killed = event;
  }
  assert.deepEqual(
    events.map((e) => e.offset),
    events.map((_, i) => BigInt(i)),
    "offsets are gap-free from 0",
  );
  const signalEvent = events.find((e) => e.key === kill.key);
  assert.ok(signalEvent, "the SIGKILL record is on the stream");
  assert.equal(signalEvent.value.case, "signal");
  assert.equal(signalEvent.value.value.signal, Signal.SIGKILL);
  assert.equal(signalEvent.value.value.reason, "typescript client test");
  assert.equal(killed.value.case, "state");
  assert.equal(killed.value.value.previousState, State.SPAWNING);
  assert.equal(killed.value.value.cause, "signal");
  assert.equal(killed.value.value.signalKey, kill.key);

  // A killed entity's stream is closed: end_of_stream, then the call ends.
  const end = await watch.next();
  assert.ok(!end.done, "the watch ended without end_of_stream");
  const item = end.value.item;
  assert.ok(item.case === "endOfStream", `expected endOfStream, got ${item.case}`);
  assert.equal(item.value.headOffset, killed.offset + 1n);
  assert.equal((await watch.next()).done, true);

  await assert.rejects(
    client.signalEntity({ ref, signal: Signal.SIGKILL }),
    (error: unknown) => {
      assert.ok(error instanceof ConnectError, `expected a ConnectError, got ${String(error)}`);
      assert.equal(error.code, Code.FailedPrecondition);
      assert.equal(error.rawMessage, "Cannot signal a killed entity");
      assert.equal(errorReason(error), "INVALID_SIGNAL");
      const info = errorInfo(error);
      assert.equal(info?.domain, ERROR_DOMAIN);
      assert.deepEqual(info?.metadata, { state: "killed", signal: "SIGKILL" });
      return true;
    },
  );

  const entity = await client.getEntity({ ref });
  assert.equal(entity.entity?.state, State.KILLED);
  assert.equal(entity.entity?.closed, true);
  assert.equal(entity.entity?.headOffset, killed.offset + 1n);
});

test("ListWorkers: no worker connected, and a spawned entity waits in spawning", { timeout: 30_000 }, async () => {
  const client = createElectricClient(server.address);
  const listed = await client.listWorkers({});
  assert.deepEqual(listed.workers, []);
  const spawned = await client.spawnEntity({ ref: { type: "ts_unhosted", id: "w1" } });
  assert.equal(spawned.entity?.state, State.SPAWNING);
  assert.equal(spawned.entity?.messageWaiting, false);
});
