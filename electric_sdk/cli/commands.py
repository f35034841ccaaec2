"""The one-shot client commands: spawn, get, ls, signal, kill, send.

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
from . import console, presence_cmds
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
    timeout_s = duration_s(args.timeout or DEFAULT_TIMEOUT, "--timeout")
    return ClientOptions(
        address=args.address or os.environ.get("ELECTRIC_ADDRESS") or DEFAULT_ADDRESS,
        token=args.token or os.environ.get("ELECTRIC_TOKEN") or None,
        timeout_s=timeout_s,
        retry=RetryPolicy(total_s=timeout_s),
        reconnect_s=max(timeout_s, STREAM_RECONNECT_S),
    )


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
    entity = ctx.client.spawn(args.ref, grace_period=args.grace, idle_timeout=args.idle_timeout)
    if ctx.out.json_mode:
        ctx.out.record(entity.to_json())
    else:
        ctx.out.line(console.entity_detail(entity))
    return 0


def get(ctx: Invocation, args: argparse.Namespace) -> int:
    entity = ctx.client.get(args.ref)
    process = _process(ctx, entity)
    presence = presence_cmds.entity_presence(entity, presence_cmds.hosted(ctx))
    if ctx.out.json_mode:
        ctx.out.record(entity.to_json() | ({"process": process} if process else {}) | presence)
    else:
        ctx.out.line(console.entity_detail(entity) + (f"\n{process_lines(process)}" if process else ""))
        if "warning" in presence:
            ctx.out.line(f"  warning: {presence['warning']}")
    return 0


# How far back `get` looks for an exec entity's receipts.
_PROCESS_LOOKBACK = 2000


def _process(ctx: Invocation, entity: Entity) -> dict[str, Any] | None:
    """An exec entity's process, from the receipts at the end of its stream."""
    offset = max(0, entity.head_offset - _PROCESS_LOOKBACK)
    events: list[Event] = []
    while offset < entity.head_offset:
        page = ctx.client.events(entity.ref.url.removeprefix("/"), offset, limit=500)
        events.extend(page.events)
        if not page.events:
            break
        offset = page.next_offset
    return process_json(events)


def ls(ctx: Invocation, args: argparse.Namespace) -> int:
    entities = ctx.client.list(args.type, states_of(args), limit=args.limit)
    types = presence_cmds.hosted(ctx)
    if ctx.out.json_mode:
        ctx.out.record(
            {"entities": [e.to_json() | presence_cmds.entity_presence(e, types) for e in entities]}
        )
    else:
        ctx.out.line(presence_cmds.entity_table(entities, types))
    return 0


def states_of(args: argparse.Namespace) -> list[str]:
    """``--state running idle``, ``--state running --state idle`` and ``--state running,idle``."""
    return [s for item in args.state or () for s in item.split(",") if s]


def signal(ctx: Invocation, args: argparse.Namespace) -> int:
    payload = parse_json(args.payload, "--payload")
    result = ctx.client.signal(args.ref, args.signal, reason=args.reason, payload=payload)
    _print_signal(ctx, result)
    return 0


def kill(ctx: Invocation, args: argparse.Namespace) -> int:
    _print_signal(ctx, ctx.client.kill(args.ref, reason=args.reason))
    return 0


def _print_signal(ctx: Invocation, result: SignalResult) -> None:
    if ctx.out.json_mode:
        ctx.out.record(result.to_json())
    else:
        ctx.out.line(console.signal_line(result))


def send(ctx: Invocation, args: argparse.Namespace) -> int:
    data = parse_json(args.data, "--data")
    receipt = ctx.client.send(args.ref, args.text, data=data)
    if ctx.out.json_mode:
        ctx.out.record(receipt.to_json())
    else:
        ctx.out.line(console.receipt_line(receipt))
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
