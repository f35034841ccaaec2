"""The one-shot client commands: spawn, get, ls, signal, kill, send, fork, retry.

Each takes the parsed arguments and an ``Invocation`` (the output, and a
``Client`` made on first use), does its local checks first (a bad JSON
payload is an error before anything is sent), makes one SDK call and prints
the result: a human summary, or the model's ``to_json()`` with ``--json``.
SDK errors propagate to main.py, which prints them and picks the exit code.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, field
from typing import Any

from .. import errors
from ..client import Client, ClientOptions, RetryPolicy
from ..durations import parse_ms
from ..models import Entity, Event, SignalResult
from . import console, exit_codes, presence_cmds
from .console import Console
from .exec_view import process_json, process_lines

DEFAULT_ADDRESS = "127.0.0.1:7700"
DEFAULT_TIMEOUT = "10s"
# How long a broken stream (events --follow, watch) keeps trying to reconnect.
STREAM_RECONNECT_S = 60.0


def client_options(args: argparse.Namespace) -> ClientOptions:
    """Flags first, then ELECTRIC_ADDRESS / ELECTRIC_TOKEN, then the defaults.

    ``--timeout`` is each call's deadline and also bounds the retries of a call,
    so an unreachable server fails a command within about that time. A stream
    that broke keeps reconnecting longer (STREAM_RECONNECT_S, or ``--timeout``
    if longer): a server restart should not end ``events --follow``.
    """
    timeout_s = duration_s(_call_timeout(args), "--timeout")
    return ClientOptions(
        address=args.address or os.environ.get("ELECTRIC_ADDRESS") or DEFAULT_ADDRESS,
        token=args.token or os.environ.get("ELECTRIC_TOKEN") or None,
        timeout_s=timeout_s,
        retry=RetryPolicy(total_s=timeout_s),
        reconnect_s=max(timeout_s, STREAM_RECONNECT_S),
    )


def _call_timeout(args: argparse.Namespace) -> str:
    """The calls' deadline: ``--timeout``, unless it bounds a ``--wait`` and is 0 (answer at once
    with what is reached, as the SDK's ``timeout=0``): a call needs time to be answered at all."""
    text: str = args.timeout or DEFAULT_TIMEOUT
    if getattr(args, "wait", None) is not None and _is_zero(text):
        return DEFAULT_TIMEOUT
    return text


def _is_zero(text: str) -> bool:
    try:
        return parse_ms(text) == 0
    except ValueError:
        return False  # refused, with its flag named, where it is read


def duration_s(text: str, flag: str, *, zero: bool = False) -> float:
    """A duration flag in seconds; INVALID_DURATION if it is not one (or is 0, unless ``zero``)."""
    try:
        ms = parse_ms(text)
    except ValueError as exc:
        raise errors.InvalidArgument(f"{flag}: {exc}", code="INVALID_DURATION") from None
    if ms <= 0 and not zero:
        raise errors.InvalidArgument(f"{flag} must be more than 0", code="INVALID_DURATION")
    return ms / 1000


@dataclass
class Invocation:
    out: Console
    options: ClientOptions
    _client: Client | None = field(default=None, init=False)

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = Client(options=self.options)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


def parse_json(text: str | None, flag: str) -> Any:
    """The value of a JSON flag (None when absent); INVALID_PAYLOAD if it is not JSON."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise errors.InvalidArgument(f"{flag} is not valid JSON: {exc}", code="INVALID_PAYLOAD") from None


def spawn(ctx: Invocation, args: argparse.Namespace) -> int:
    entity = ctx.client.spawn(
        args.ref, grace_period=args.grace, idle_timeout=args.idle_timeout, parent=args.parent
    )
    if ctx.out.json_mode:
        ctx.out.record(entity.to_json())
    else:
        ctx.out.line(console.entity_detail(entity))
    return 0


def get(ctx: Invocation, args: argparse.Namespace) -> int:
    entity = ctx.client.get(args.ref)
    tail = _tail(ctx, entity)
    process = process_json(tail, entity)
    presence = presence_cmds.entity_presence(entity, presence_cmds.hosted(ctx))
    # Its children, the first few (`ls --parent` lists them all): one more says whether there are more.
    children = ctx.client.list(parent=entity.ref, limit=SHOWN_CHILDREN + 1)
    if ctx.out.json_mode:
        ctx.out.record(
            entity.to_json()
            | ({"process": process} if process else {})
            | children_json(children)
            | recent_events_json(tail)
            | presence
        )
    else:
        extra = [("children", children_text(entity, children))] if children else []
        sections = [console.entity_detail(entity, extra)]
        if process:
            sections.append(process_lines(process))
        if "warning" in presence:
            sections.append(f"  warning: {presence['warning']}")
        sections.append(recent_events_lines(tail))
        ctx.out.line("\n".join(sections))
    return 0


# How many of an entity's children `get` names.
SHOWN_CHILDREN = 20


def children_json(children: list[Entity]) -> dict[str, Any]:
    """``children``: the first ``SHOWN_CHILDREN`` (url and state); ``children_truncated`` if more."""
    shown = [{"url": c.ref.url, "state": c.state.value} for c in children[:SHOWN_CHILDREN]]
    return {"children": shown, "children_truncated": len(children) > SHOWN_CHILDREN}


def children_text(entity: Entity, children: list[Entity]) -> str:
    """``/team/a (running), /team/b (stopped)``, and how to list them all if more."""
    named = ", ".join(f"{c.ref.url} ({c.state.value})" for c in children[:SHOWN_CHILDREN])
    more = f", ... (all: electric ls --parent {entity.ref})" if len(children) > SHOWN_CHILDREN else ""
    return named + more


# How far back `get` looks for an exec entity's receipts.
_PROCESS_LOOKBACK = 2000
# `get` ends with the entity's last few events, as `kubectl describe` ends with its events.
RECENT_EVENTS = 5


def _tail(ctx: Invocation, entity: Entity) -> list[Event]:
    """The events at the end of the entity's stream (an exec entity's receipts among them)."""
    offset = max(0, entity.head_offset - _PROCESS_LOOKBACK)
    events: list[Event] = []
    while offset < entity.head_offset:
        page = ctx.client.events(entity.ref.url.removeprefix("/"), offset, limit=500)
        events.extend(page.events)
        if not page.events:
            break
        offset = page.next_offset
    return events


def recent_events_json(tail: list[Event]) -> dict[str, Any]:
    """``get --json``'s ``recent_events``: the last RECENT_EVENTS events, oldest first."""
    return {"recent_events": [event.to_json() for event in tail[-RECENT_EVENTS:]]}


def recent_events_lines(tail: list[Event]) -> str:
    recent = tail[-RECENT_EVENTS:]
    if not recent:
        return "  recent events  none"
    return "\n".join(
        [f"  recent events (last {len(recent)})", *(f"    {console.event_line(e)}" for e in recent)]
    )


def ls(ctx: Invocation, args: argparse.Namespace) -> int:
    # One more than asked tells whether --limit cut the list, without a count of them all.
    limit = args.limit + 1 if args.limit is not None else None
    entities = ctx.client.list(args.type, states_of(args), limit=limit, parent=args.parent)
    truncated = args.limit is not None and len(entities) > args.limit
    entities = entities[: args.limit] if truncated else entities
    types = presence_cmds.hosted(ctx)
    if ctx.out.json_mode:
        ctx.out.record(
            {
                "entities": [e.to_json() | presence_cmds.entity_presence(e, types) for e in entities],
                "truncated": truncated,
            }
        )
    else:
        ctx.out.line(presence_cmds.entity_table(entities, types))
        if truncated:  # on stderr: stdout stays the table a script may read
            ctx.out.note(f"the first {args.limit} entities; more match (raise --limit to see them)")
    return 0


def states_of(args: argparse.Namespace) -> list[str]:
    """``--state running idle``, ``--state running --state idle`` and ``--state running,idle``."""
    return [s for item in args.state or () for s in item.split(",") if s]


def signal(ctx: Invocation, args: argparse.Namespace) -> int:
    payload = parse_json(args.payload, "--payload")
    wait, timeout_s = _stage_wait(args)
    result = ctx.client.signal(
        args.ref,
        args.signal,
        reason=args.reason,
        payload=payload,
        interrupt=args.interrupt,
        wait=wait,
        timeout=timeout_s,
    )
    return _print_signal(ctx, result, wait)


def kill(ctx: Invocation, args: argparse.Namespace) -> int:
    wait, timeout_s = _stage_wait(args)
    return _print_signal(
        ctx, ctx.client.kill(args.ref, reason=args.reason, wait=wait, timeout=timeout_s), wait
    )


def _stage_wait(args: argparse.Namespace) -> tuple[str | None, float | None]:
    """``--wait STAGE``, bounded by ``--timeout`` (from the signal's acceptance) when given; 0
    answers at once with the stages reached by then."""
    wait: str | None = getattr(args, "wait", None)
    limit = getattr(args, "timeout", None)
    return wait, duration_s(limit, "--timeout", zero=True) if wait is not None and limit else None


def _print_signal(ctx: Invocation, result: SignalResult, wait: str | None = None) -> int:
    """The signal's answer (and its stages, after a wait); the exit code the wait's end says."""
    if ctx.out.json_mode:
        ctx.out.record(result.to_json())
    else:
        ctx.out.line(console.signal_line(result))
        for report in result.stages:
            ctx.out.line(console.stage_line(report))
    if wait is None or result.reached(wait):
        return exit_codes.OK
    (report,) = [r for r in result.stages if r.stage.value == wait]
    ctx.out.stderr.write(f"electric: {result.url}: {wait} not reached: {report.detail}\n")
    return (
        exit_codes.TIMEOUT if report.detail.startswith("not reached within") else exit_codes.STAGE_NOT_REACHED
    )


def send(ctx: Invocation, args: argparse.Namespace) -> int:
    data = parse_json(args.data, "--data")
    if args.wait is None:
        receipt = ctx.client.send(args.ref, args.text, data=data, policy=args.policy)
        if ctx.out.json_mode:
            ctx.out.record(receipt.to_json())
        else:
            ctx.out.line(console.receipt_line(receipt))
        return 0
    limit = getattr(args, "timeout", None)
    timeout_s = duration_s(limit, "--timeout", zero=True) if limit else None
    try:
        result = ctx.client.send(
            args.ref, args.text, data=data, wait=args.wait, timeout=timeout_s, policy=args.policy
        )
    except errors.RunNotEnded as exc:
        if ctx.out.json_mode:
            ctx.out.record({"receipt": exc.receipt.to_json(), "status": exc.run_status, "ended": False})
        else:
            ctx.out.line(console.receipt_line(exc.receipt))
        ctx.out.stderr.write(f"electric: {exc.code}: {exc.message}\n")
        return exit_codes.TIMEOUT
    if ctx.out.json_mode:
        ctx.out.record(result.to_json() | {"ended": True})
    else:
        ctx.out.line(console.receipt_line(result.receipt))
        ctx.out.line(console.run_line(result))
    return _RUN_EXIT.get(result.status, exit_codes.RUN_ABORTED)


# How a waited run's end is the command's exit code (as `electric run`'s).
_RUN_EXIT = {
    "completed": exit_codes.OK,
    "failed": exit_codes.RUN_FAILED,
    "input_required": exit_codes.OK,
    "steered": exit_codes.OK,
}


def fork(ctx: Invocation, args: argparse.Namespace) -> int:
    entity = ctx.client.fork(args.ref, args.new_id, at=args.at, reason=args.reason)
    if ctx.out.json_mode:
        ctx.out.record(entity.to_json())
    else:
        ctx.out.line(console.entity_detail(entity))
    return 0


def retry(ctx: Invocation, args: argparse.Namespace) -> int:
    receipt = ctx.client.retry(args.ref, args.run, from_step=args.from_step, reason=args.reason)
    if ctx.out.json_mode:
        ctx.out.record(receipt.to_json() | {"retry_of": args.run, "from_step": args.from_step})
    else:
        ctx.out.line(f"{console.receipt_line(receipt)}  (retry of {args.run} from step {args.from_step})")
    return 0


# `electric ready` waits this long unless --timeout says otherwise: a server still starting.
DEFAULT_READY = "30s"


def ready(ctx: Invocation, args: argparse.Namespace) -> int:
    """Until the server answers and serves (its health is SERVING): for scripts that start a server
    and use it at once. Exit 0, or 5 (UNAVAILABLE) when --timeout passes first."""
    limit = getattr(args, "timeout", None) or DEFAULT_READY
    ctx.client.wait_ready(duration_s(limit, "--timeout"))
    if ctx.out.json_mode:
        ctx.out.record({"address": ctx.options.address, "ready": True})
    else:
        ctx.out.line(f"{ctx.options.address} ready")
    return 0


# gRPC's words when nothing listens at the address.
_NO_SERVER_MARKS = ("failed to connect to all addresses",)


def with_hint(exc: errors.ElectricError, address: str | None) -> errors.ElectricError:
    """gRPC's "failed to connect to all addresses ... UNKNOWN" tells a user nothing to do: say
    that no server answers there and how to start one. Same class and code, so the exit code
    and the JSON error are unchanged."""
    if address is None or not isinstance(exc, errors.Unavailable):
        return exc
    if not any(mark in exc.message for mark in _NO_SERVER_MARKS):
        return exc
    hint = f"no server at {address} — start one with `make run` or `electric server`, or set ELECTRIC_ADDRESS"
    return type(exc)(hint, code=exc.code, status=exc.status, metadata=exc.metadata)
