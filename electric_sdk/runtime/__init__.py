"""The runtime: workers that host entities and enforce every signal.

Define entity types on an ``App``; run them with a ``Worker`` (or the
``electric worker MODULE:APP`` / ``electric dev`` commands)::

    from electric_sdk.runtime import App

    app = App()

    @app.entity("research", grace_period="30s", idle_timeout="60s")
    class Research:
        async def on_message(self, ctx, message):
            async with ctx.step("tool:search"):
                ctx.output.write("found it")

        async def on_signal(self, ctx, signal):
            ...

Modules: ``app`` (definitions), ``context`` (what entity code sees), ``host``
(one leased entity: runs and signal enforcement), ``worker`` (the session
with the server).
"""

from ..durable_state import SnapshotPolicy
from .app import HANDLEABLE, App, AppReloader, DefinitionError, EntityType, load_app
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
    "Context",
    "DefinitionError",
    "EntityHost",
    "EntityType",
    "Message",
    "Output",
    "Retry",
    "SessionLost",
    "SignalInfo",
    "SnapshotPolicy",
    "Worker",
    "load_app",
]
