// A small typed client for electric's HTTP/JSON routes (docs/http.md), for
// browsers and any runtime with `fetch` and web streams (Node.js 20 too).
// It imports nothing from Node or gRPC, so a bundler can ship it to a page.
//
// Live reads use `fetch` streaming, not `EventSource`: EventSource cannot send
// an `Authorization` header. `streamEvents` reads an entity's stream as the
// Durable Streams protocol's SSE mode frames it (`data` events carrying JSON
// arrays, each followed by a `control` event with `streamNextOffset`,
// `streamCursor`, `upToDate`, `streamClosed`), reconnecting from the last
// `streamNextOffset` until the stream is closed. `watchEntities` reads
// `GET /entities?live=sse`.

/** The lifecycle's states and signals, as the HTTP routes spell them. */
export type StateName = "spawning" | "running" | "idle" | "paused" | "stopping" | "stopped" | "killed";
export type SignalName = "SIGINT" | "SIGHUP" | "SIGTERM" | "SIGKILL" | "SIGSTOP" | "SIGCONT" | "SIGUSR";
export type OutcomeName =
  | "pending"
  | "transitioned"
  | "ignored"
  | "delivered"
  | "aborted"
  | "shutdown_requested"
  | "failed";

/** JSON as the routes take and give it. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** An entity: "type/id", "/type/id", or its parts. */
export type EntityRef = string | { type: string; id: string };

export interface Profile {
  grace_period_ms: number | null;
  idle_timeout_ms: number | null;
  /** Profile values not yet fixed (they are fixed at the first lease). */
  pending: string[];
}

export interface Entity {
  url: string;
  type: string;
  id: string;
  state: StateName;
  profile: Profile;
  /** ISO 8601 instants. */
  created_at: string;
  updated_at: string;
  head_offset: number;
  closed: boolean;
  stopping_deadline: string | null;
  /** A string: a JSON number loses 64-bit integers. */
  txid: string;
  /** Its last run asked for input (`ctx.ask`): that run's message key and question; the next message sent is the reply. */
  awaiting_input?: { run: string; question: string } | null;
}

export interface EntityPage {
  entities: Entity[];
  /** "" on the last page. */
  next_page_token: string;
}

export interface SignalRequest {
  signal: SignalName;
  reason?: string;
  /** SIGUSR only. */
  payload?: Json;
  /** A SIGINT scoped to one message's run. */
  message_key?: string;
  /** SIGTERM only: interrupt the step in progress at once, so the cleanup runs within the grace. */
  interrupt?: boolean;
}

/** The RFC's signal response, plus the record's key and outcome. */
export interface SignalResponse {
  url: string;
  signal: SignalName;
  previous_state: StateName;
  new_state: StateName;
  /** Epoch milliseconds, as the RFC writes it. */
  created_at: number;
  txid: string;
  key: string;
  outcome: OutcomeName | null;
}

/** How far a signal has reached (docs/signals.md, "stop receipts"); which signal has which: docs. */
export type StageName = "accepted" | "handled" | "unwound" | "downstream" | "reaped" | "terminal";

/** One stage of a waited signal: reached (the record that shows it, its time), or not (why). */
export interface StageReport {
  stage: StageName;
  reached: boolean;
  offset: number | null;
  at: string | null;
  detail: string;
}

/** A signal's answer after `{ wait: STAGE }`: its result plus each stage the signal has. */
export interface WaitedSignal extends SignalResponse {
  stages: StageReport[];
}

export interface SignalWaitOptions extends CallOptions {
  /** The stage to wait for: one the signal has (else 400 STAGE_NOT_AVAILABLE, nothing sent). */
  wait: StageName;
  /** How long, from the first attempt: a duration ("500ms", "30s") or milliseconds (default: the server's maximum, 1h). */
  timeout?: string | number;
}

export interface Selector {
  type?: string;
  states?: StateName[];
  /** "/type/id" refs. */
  refs?: string[];
}

export interface SignalManyRequest {
  selector: Selector;
  signal: SignalName;
  reason?: string;
  payload?: Json;
}

export interface SignalManyResponse {
  signalled: number;
  ignored: number;
  skipped: number;
  not_found: number;
  created_at: number;
}

/** What a message does if a run is in progress (docs/double-texting.md). */
export type BusyPolicy = "enqueue" | "reject" | "interrupt" | "rollback" | "steer";

export interface MessageRequest {
  text?: string;
  data?: Json;
  /** Default: the entity type's policy; `reject` while a run is in progress is a 409 ENTITY_BUSY. */
  policy?: BusyPolicy;
}

export interface MessageReceipt {
  url: string;
  key: string;
  offset: number;
  txid: string;
  created_at: number;
  state: StateName;
  /** The policy applied (`enqueue` when no run was in progress). */
  policy?: BusyPolicy;
  /** `interrupt`, `rollback`: the SIGINT it appended. */
  signal_key?: string;
}

/** Where a message's run is: `queued` or `started` until it ends, then how it ended. */
export type RunStatus =
  | "queued"
  | "started"
  | "completed"
  | "failed"
  | "aborted"
  | "cancelled"
  | "input_required"
  | "steered";

/** How the run a message started ended (`send(..., { wait: "run" })`). */
export interface RunOutcome {
  message_key: string;
  /** `completed` (output), `failed` (error), `aborted` (partial output), `cancelled` (never started). */
  status: RunStatus;
  /** False: the timeout passed first; the message stays delivered. */
  ended: boolean;
  started: boolean;
  attempt: number;
  output: string | null;
  error: string | null;
  /** `input_required`: what the run asked (`ctx.ask`); the next message sent is the reply. */
  question?: string;
  entity_state: StateName | null;
}

export interface WaitedReceipt extends MessageReceipt {
  run: RunOutcome;
}

export interface SendWaitOptions extends CallOptions {
  /** What to wait for: the run the message starts. */
  wait: "run";
  /** How long, from the first attempt: a duration ("500ms", "30s") or milliseconds (default: the server's maximum, 1h). */
  timeout?: string | number;
}

/** The RFC's event: a State Protocol change message. */
export interface ChangeMessage {
  type: string;
  key: string;
  value: { [key: string]: Json };
  headers: { operation: "insert" | "update" | "delete"; timestamp: string; txid: string };
}

/** An event in a page of `GET /{type}/{id}/events`: a change message and its offset. */
export interface PagedEvent extends ChangeMessage {
  offset: number;
}

export interface EventsPage {
  events: PagedEvent[];
  next_offset: number;
  head_offset: number;
  end_of_stream: boolean;
}

/** One `data` event (possibly none) and the `control` event after it. */
export interface StreamBatch {
  events: ChangeMessage[];
  /** Resume from here (`streamEvents(ref, { offset })`); opaque, sorts as text. */
  nextOffset: string;
  upToDate: boolean;
  /** The stream is closed: this is its last batch. */
  closed: boolean;
}

export interface EntityChange {
  entity: Entity;
  previous_state: StateName | null;
  changed_at: string;
}

/** What `GET /entities?live=sse` sends: a snapshot, its end, then changes. */
export type EntitiesEvent =
  | { kind: "snapshot"; entities: Entity[] }
  | { kind: "snapshot-complete"; txid: string }
  | { kind: "change"; changes: EntityChange[]; txid: string };

/** The error body every route answers with: `{"error": {code, message, details}}`. */
export class ElectricHttpError extends Error {
  override readonly name = "ElectricHttpError";

  constructor(
    /** The HTTP status. */
    readonly status: number,
    /** The gRPC ErrorInfo reason, e.g. "INVALID_SIGNAL"; "HTTP_<status>" for a body not electric's. */
    readonly code: string,
    message: string,
    readonly details: { [key: string]: string },
    readonly headers: Headers,
  ) {
    super(message);
  }
}

export interface HttpClientOptions {
  /** Bearer token (or a function giving one per request), sent as `Authorization: Bearer`. */
  token?: string | (() => string | Promise<string>);
  /** Another `fetch` (default: the global one). */
  fetch?: typeof fetch;
  /** Headers sent with every request. */
  headers?: Record<string, string>;
}

export interface CallOptions {
  /** Sent as `Idempotency-Key`: a retry with the same key returns the first response and appends nothing. */
  idempotencyKey?: string;
  signal?: AbortSignal;
}

export interface StreamOptions {
  /** Where to start: "-1" (the default) for the beginning, "now" for the tail, or a saved `nextOffset`. */
  offset?: string;
  signal?: AbortSignal;
  /**
   * Reconnect from the last offset when the connection fails on the way (the
   * network, a server restarting or draining: `503`), as EventSource does, a
   * little later each time up to 5 s (default true). Other refusals are thrown.
   */
  reconnect?: boolean;
}

export interface WatchEntitiesOptions {
  type?: string;
  states?: StateName[];
  signal?: AbortSignal;
}

export interface ListOptions {
  type?: string;
  states?: StateName[];
  pageSize?: number;
  pageToken?: string;
  signal?: AbortSignal;
}

/**
 * A client for the HTTP routes at `baseUrl` (e.g. "http://127.0.0.1:7780", or
 * "https://host/_electric/entities" for the ElectricSQL-compatible prefix).
 */
export class ElectricHttpClient {
  readonly baseUrl: string;
  private readonly fetchImpl: typeof fetch;

  constructor(
    baseUrl: string,
    private readonly options: HttpClientOptions = {},
  ) {
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.fetchImpl = options.fetch ?? ((input, init) => fetch(input, init));
  }

  /** `PUT /{type}/{id}`: create an entity (it starts in `spawning`). */
  spawn(ref: EntityRef, profile?: { grace_period_ms?: number; idle_timeout_ms?: number }, call?: CallOptions): Promise<Entity> {
    return this.json("PUT", entityPath(ref), profile === undefined ? undefined : { profile }, call);
  }

  /** `GET /{type}/{id}`. */
  get(ref: EntityRef, call?: CallOptions): Promise<Entity> {
    return this.json("GET", entityPath(ref), undefined, call);
  }

  /** `GET /entities`: one page, ordered by type and id. */
  list(options: ListOptions = {}): Promise<EntityPage> {
    const query = new URLSearchParams();
    if (options.type !== undefined) query.set("type", options.type);
    for (const state of options.states ?? []) query.append("state", state);
    if (options.pageSize !== undefined) query.set("page_size", String(options.pageSize));
    if (options.pageToken) query.set("page_token", options.pageToken);
    return this.json("GET", withQuery("/entities", query), undefined, options);
  }

  /**
   * `POST /{type}/{id}/signal`. With `{ wait: STAGE, timeout }` (`?wait=STAGE&timeout=D`) the
   * answer comes once that stage of the signal, and each before it, is reached or cannot be, or
   * the timeout has passed: the result plus `stages`. A wait cut off is resumed with the same
   * `Idempotency-Key` (made here when none is given): the signal is sent once.
   */
  signal(ref: EntityRef, request: SignalRequest, call: SignalWaitOptions): Promise<WaitedSignal>;
  signal(ref: EntityRef, request: SignalRequest, call?: CallOptions): Promise<SignalResponse>;
  signal(ref: EntityRef, request: SignalRequest, call?: CallOptions | SignalWaitOptions): Promise<SignalResponse> {
    const path = `${entityPath(ref)}/signal`;
    if (call === undefined || !("wait" in call)) return this.json("POST", path, request, call);
    return this.postAndWait<WaitedSignal>(path, request, call);
  }

  /** `POST /signal`: one signal to every entity a selector names. */
  signalMany(request: SignalManyRequest, call?: CallOptions): Promise<SignalManyResponse> {
    return this.json("POST", "/signal", request, call);
  }

  /**
   * `POST /{type}/{id}/messages`. With `{ wait: "run", timeout }`
   * (`?wait=run&timeout=D`) the answer comes once the run the message started
   * has ended, or the timeout has passed (`run.ended` false; the message stays
   * delivered). A wait cut off (the connection lost, a replica draining) is
   * resumed: the same request again, with the same `Idempotency-Key` (made
   * here when none is given), so the message is sent once and the server
   * waits again from its offset, on whichever replica takes it.
   */
  send(ref: EntityRef, message: MessageRequest, call: SendWaitOptions): Promise<WaitedReceipt>;
  send(ref: EntityRef, message: MessageRequest, call?: CallOptions): Promise<MessageReceipt>;
  send(ref: EntityRef, message: MessageRequest, call?: CallOptions | SendWaitOptions): Promise<MessageReceipt> {
    const path = `${entityPath(ref)}/messages`;
    if (call === undefined || !("wait" in call)) return this.json("POST", path, message, call);
    return this.postAndWait<WaitedReceipt>(path, message, call);
  }

  /** A POST with `?wait=&timeout=`, resumed with the same Idempotency-Key when it is cut off. */
  private async postAndWait<T>(path: string, message: unknown, call: SendWaitOptions | SignalWaitOptions): Promise<T> {
    const timeoutMs = call.timeout === undefined ? undefined : durationMs(call.timeout);
    const keyed: CallOptions = { ...call, idempotencyKey: call.idempotencyKey ?? crypto.randomUUID() };
    const started = Date.now();
    let backoffMs = 0;
    for (;;) {
      const query = new URLSearchParams({ wait: call.wait });
      // A bound already spent is 0: the server answers at once with what is reached by then.
      if (timeoutMs !== undefined) query.set("timeout", `${Math.max(0, timeoutMs - (Date.now() - started))}ms`);
      try {
        return await this.json<T>("POST", withQuery(path, query), message, keyed);
      } catch (error) {
        const late = timeoutMs !== undefined && Date.now() - started >= timeoutMs;
        if (late || call.signal?.aborted || !passing(error)) throw error;
      }
      backoffMs = Math.min(Math.max(backoffMs * 2, 100), RECONNECT_MAX_MS);
      await pause(backoffMs, call.signal);
    }
  }

  /** `GET /{type}/{id}/events`: a page from `offset` (continue from `next_offset`). */
  events(ref: EntityRef, page: { offset?: number; limit?: number } = {}, call?: CallOptions): Promise<EventsPage> {
    const query = new URLSearchParams();
    if (page.offset !== undefined) query.set("offset", String(page.offset));
    if (page.limit !== undefined) query.set("limit", String(page.limit));
    return this.json("GET", withQuery(`${entityPath(ref)}/events`, query), undefined, call);
  }

  /** `DELETE /{type}/{id}`: deprecated; exactly SIGKILL with reason "legacy delete". */
  delete(ref: EntityRef, call?: CallOptions): Promise<SignalResponse> {
    return this.json("DELETE", entityPath(ref), undefined, call);
  }

  /**
   * An entity's stream, read live over SSE (`GET /{type}/{id}/stream?live=sse`):
   * each batch once, in order, from `offset`. A connection the server ends (a
   * drain, a restart, its periodic close) is reopened from the last
   * `nextOffset`; the iteration ends once the stream is closed. Save
   * `nextOffset` to resume later, exactly where this one stopped.
   */
  async *streamEvents(ref: EntityRef, options: StreamOptions = {}): AsyncGenerator<StreamBatch> {
    const path = `${entityPath(ref)}/stream`;
    let offset = options.offset ?? "-1";
    let cursor: string | undefined;
    let idleMs = 0;
    for (;;) {
      const query = new URLSearchParams({ live: "sse", offset });
      if (cursor !== undefined) query.set("cursor", cursor);
      let events: ChangeMessage[] = [];
      let progressed = false;
      try {
        for await (const event of this.sse(withQuery(path, query), options.signal)) {
          if (event.event === "data") {
            events = events.concat(JSON.parse(event.data) as ChangeMessage[]);
          } else if (event.event === "control") {
            const control = JSON.parse(event.data) as StreamControl;
            offset = control.streamNextOffset;
            cursor = control.streamCursor ?? cursor;
            progressed = true;
            const closed = control.streamClosed === true;
            yield { events, nextOffset: offset, upToDate: closed || control.upToDate === true, closed };
            events = [];
            if (closed) return;
          }
        }
      } catch (error) {
        if (options.reconnect === false || options.signal?.aborted || !passing(error)) throw error;
      }
      // Ended without streamClosed: the protocol says reconnect from the last offset. At once
      // after a connection that got somewhere; after one that did not, a little later each time.
      idleMs = progressed ? 0 : Math.min(Math.max(idleMs * 2, 100), RECONNECT_MAX_MS);
      if (idleMs > 0) await pause(idleMs, options.signal);
    }
  }

  /**
   * State changes of every entity (or of a type, or entering or leaving some
   * states) over SSE (`GET /entities?live=sse`): a snapshot, then each change.
   * Ends when the server ends the response (reconnect for a fresh snapshot).
   */
  async *watchEntities(options: WatchEntitiesOptions = {}): AsyncGenerator<EntitiesEvent> {
    const query = new URLSearchParams({ live: "sse" });
    if (options.type !== undefined) query.set("type", options.type);
    for (const state of options.states ?? []) query.append("state", state);
    for await (const event of this.sse(withQuery("/entities", query), options.signal)) {
      const data: unknown = JSON.parse(event.data);
      if (event.event === "snapshot") {
        yield { kind: "snapshot", entities: data as Entity[] };
      } else if (event.event === "snapshot-complete") {
        yield { kind: "snapshot-complete", txid: (data as { txid: string }).txid };
      } else if (event.event === "change") {
        yield { kind: "change", changes: data as EntityChange[], txid: event.id ?? "" };
      }
    }
  }

  // -- the one place requests are made -----------------------------------------------

  private async request(
    method: string,
    path: string,
    body: unknown,
    call: CallOptions | undefined,
    accept: string,
  ): Promise<Response> {
    const headers = new Headers(this.options.headers);
    headers.set("accept", accept);
    const token = typeof this.options.token === "function" ? await this.options.token() : this.options.token;
    if (token !== undefined) headers.set("authorization", `Bearer ${token}`);
    if (call?.idempotencyKey !== undefined) headers.set("idempotency-key", call.idempotencyKey);
    const init: RequestInit = { method, headers };
    if (call?.signal !== undefined) init.signal = call.signal;
    if (body !== undefined) {
      headers.set("content-type", "application/json");
      init.body = JSON.stringify(body);
    }
    const response = await this.fetchImpl(this.baseUrl + path, init);
    if (!response.ok) throw await httpError(response);
    return response;
  }

  private async json<T>(method: string, path: string, body: unknown, call: CallOptions | undefined): Promise<T> {
    const response = await this.request(method, path, body, call, "application/json");
    return (await response.json()) as T;
  }

  private async *sse(path: string, signal: AbortSignal | undefined): AsyncGenerator<SseEvent> {
    const response = await this.request("GET", path, undefined, signal ? { signal } : undefined, "text/event-stream");
    if (response.body === null) return;
    yield* readSse(response.body);
  }
}

const RECONNECT_MAX_MS = 5_000;
const UNIT_MS: Record<string, number> = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000 };

/** A duration ("500ms", "30s", "1m30s") or milliseconds, in milliseconds. */
function durationMs(value: string | number): number {
  if (typeof value === "number") return value;
  let total = 0;
  let rest = value.trim();
  while (rest) {
    const part = /^(\d+(?:\.\d+)?)(ms|s|m|h)/.exec(rest);
    if (part === null) throw new TypeError(`invalid duration ${JSON.stringify(value)}: use e.g. 500ms or 30s`);
    total += Number(part[1]) * UNIT_MS[part[2]!]!;
    rest = rest.slice(part[0].length);
  }
  return Math.round(total);
}

/** A failure that passes: `fetch`'s network errors (a TypeError), and a server draining or starting (503). */
function passing(error: unknown): boolean {
  return error instanceof TypeError || (error instanceof ElectricHttpError && error.status === 503);
}

function pause(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

interface StreamControl {
  streamNextOffset: string;
  streamCursor?: string;
  upToDate?: boolean;
  streamClosed?: boolean;
}

/** One server-sent event. */
export interface SseEvent {
  /** The `event:` field ("message" when none was given). */
  event: string;
  /** The `data:` lines, joined with "\n". */
  data: string;
  /** The last `id:` field seen, if any. */
  id?: string;
}

/**
 * Server-sent events from a response body, parsed as the HTML standard says:
 * lines end with CRLF, LF or CR; a line starting with ":" is a comment (a
 * heartbeat); a blank line dispatches the event gathered so far, if it has data.
 */
export async function* readSse(body: ReadableStream<Uint8Array>): AsyncGenerator<SseEvent> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let first = true;
  let event = "";
  let data: string[] = [];
  let id: string | undefined;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      buffer += done ? decoder.decode() : decoder.decode(value, { stream: true });
      if (first && buffer.length > 0) {
        buffer = buffer.replace(/^\uFEFF/, "");
        first = false;
      }
      let match: RegExpExecArray | null;
      // A lone CR at the buffer's end may be the first half of a CRLF: wait for more unless done.
      const lineEnd = done ? /\r\n|\n|\r/ : /\r\n|\n|\r(?=[^\n])/;
      while ((match = lineEnd.exec(buffer)) !== null) {
        const line = buffer.slice(0, match.index);
        buffer = buffer.slice(match.index + match[0].length);
        if (line === "") {
          if (data.length > 0) {
            const dispatched: SseEvent = { event: event || "message", data: data.join("\n") };
            if (id !== undefined) dispatched.id = id;
            yield dispatched;
          }
          event = "";
          data = [];
          continue;
        }
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        if (field === "event") event = value;
        else if (field === "data") data.push(value);
        else if (field === "id" && !value.includes("\0")) id = value;
      }
      if (done) return; // an event without its blank line is dropped, as the standard says
    }
  } finally {
    await reader.cancel().catch(() => undefined);
  }
}

function entityPath(ref: EntityRef): string {
  let type: string;
  let id: string;
  if (typeof ref === "string") {
    const text = ref.replace(/^\//, "");
    const slash = text.indexOf("/");
    if (slash <= 0 || slash === text.length - 1) throw new TypeError(`an entity is "type/id", got ${JSON.stringify(ref)}`);
    type = text.slice(0, slash);
    id = text.slice(slash + 1);
  } else {
    ({ type, id } = ref);
  }
  return `/${encodeURIComponent(type)}/${encodeURIComponent(id)}`;
}

function withQuery(path: string, query: URLSearchParams): string {
  const text = query.toString();
  return text ? `${path}?${text}` : path;
}

async function httpError(response: Response): Promise<ElectricHttpError> {
  const text = await response.text().catch(() => "");
  try {
    const body = JSON.parse(text) as { error?: { code?: unknown; message?: unknown; details?: unknown } };
    const error = body.error;
    if (error && typeof error.code === "string" && typeof error.message === "string") {
      const details = (error.details ?? {}) as { [key: string]: string };
      return new ElectricHttpError(response.status, error.code, error.message, details, response.headers);
    }
  } catch {
    // not JSON: a proxy's page, say; reported by its status below
  }
  const message = `${response.status} ${response.statusText}${text ? `: ${text.slice(0, 200)}` : ""}`;
  return new ElectricHttpError(response.status, `HTTP_${response.status}`, message, {}, response.headers);
}
