// The official A2A JavaScript client (@a2a-js/sdk) against an agent of electric --a2a.
// Usage: node client.mjs AGENT_URL TOKEN CONTEXT_ID; prints one JSON line of what it saw, which
// tests/runtime/test_a2a_js.py checks against the entity's stream.
import { randomUUID } from "node:crypto";
import {
  ClientFactory,
  ClientFactoryOptions,
  DefaultAgentCardResolver,
  JsonRpcTransportFactory,
} from "@a2a-js/sdk/client";

const [url, token, contextId] = process.argv.slice(2);

function factory(bearer) {
  // Every request carries the bearer token, the card's fetch too.
  const fetchImpl = (input, init = {}) => {
    const headers = new Headers(init.headers);
    headers.set("Authorization", `Bearer ${bearer}`);
    return fetch(input, { ...init, headers });
  };
  return new ClientFactory(
    ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
      transports: [new JsonRpcTransportFactory({ fetchImpl })],
      cardResolver: new DefaultAgentCardResolver({ fetchImpl }),
    }),
  );
}

function message(text) {
  return {
    message: {
      messageId: randomUUID(),
      contextId,
      role: 1, // ROLE_USER
      parts: [{ content: { $case: "text", value: text } }],
    },
  };
}

const seen = {};
try {
  await factory("not-a-token").createFromUrl(url);
  seen.refused = false;
} catch (error) {
  seen.refused = String(error.message ?? error);
}

const client = await factory(token).createFromUrl(url);
const states = [];
let artifact = "";
for await (const event of client.sendMessageStream(message("hi"))) {
  const payload = event.payload;
  if (payload?.$case === "task") states.push(payload.value.status.state);
  if (payload?.$case === "statusUpdate") states.push(payload.value.status.state);
  if (payload?.$case === "artifactUpdate") artifact = payload.value.artifact.parts[0].content.value;
}
seen.states = states;
seen.artifact = artifact;

// A held run: follow its task until it works, then cancel it mid-step.
const held = client.sendMessageStream(message("hold"));
let taskId = "";
for await (const event of held) {
  const payload = event.payload;
  if (payload?.$case === "task") taskId = payload.value.id;
  if (payload?.$case === "statusUpdate" && payload.value.status.state === 2) break; // WORKING
}
const canceled = await client.cancelTask({ id: taskId });
seen.taskId = taskId;
seen.canceled = canceled.status.state;
try {
  await client.cancelTask({ id: taskId });
  seen.again = "answered";
} catch (error) {
  seen.again = error.constructor.name;
}
console.log(JSON.stringify(seen));
