"""The runtime: workers that host entities and enforce every signal.

Define entity types on an ``App``; run them with a ``Worker`` (or the
``electric worker MODULE:APP`` / ``electric dev`` commands)::

    from electric_sdk.runtime import App

    app = App()

    @app.entity("research", grace_period="30s", idle_timeout="60s")
    class Research:
        async def on_message(self, ctx, message):
            ctx.state["questions"].append(message.text)  # durable entity state
            hits = await ctx.step("tool:search", search, message.text)  # recorded, replayed
            ctx.output.write(f"found {len(hits)}")

        async def on_signal(self, ctx, signal):
            ...

Modules: ``app`` (definitions), ``context`` (what entity code sees), ``steps``
(``codec``: step results) and ``state`` (recorded steps and ``ctx.state``), ``records`` (a lease's
records of both), ``host`` (one leased entity: runs and signal enforcement),
``worker`` (the session with the server), ``patches`` (``ctx.patched``) and
``replay`` (the replay check of new code against recorded runs).
"""

from ..durable_state import SnapshotPolicy, StateError
from .app import HANDLEABLE, App, AppReloader, DefinitionError, EntityType, load_app
from .codec import Codec, JSONCodec
from .context import Context, Message, Output, SignalInfo
from .fenced import SessionLost
from .host import EntityHost
from .steps import MAX_RESULT_BYTES, Retry
from .worker import Worker

__all__ = [
    "HANDLEABLE",
    "MAX_RESULT_BYTES",
    "App",
    "AppReloader",
    "Codec",
    "Context",
    "DefinitionError",
    "EntityHost",
    "EntityType",
    "JSONCodec",
    "Message",
    "Output",
    "Retry",
    "SessionLost",
    "SignalInfo",
    "SnapshotPolicy",
    "StateError",
    "Worker",
    "load_app",
]
