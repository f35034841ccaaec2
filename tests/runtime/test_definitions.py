"""Entity type definitions: what is refused at definition time, before anything runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from electric_sdk.lifecycle import Signal
from electric_sdk.runtime import HANDLEABLE, App, Context, DefinitionError, EntityType, Message, load_app


def test_class_entity_registers_handlers_and_profile() -> None:
    app = App()

    @app.entity("research", grace_period="30s", idle_timeout="250ms")
    class Research:
        async def on_message(self, ctx: Context, message: Message) -> None: ...

        async def on_signal(self, ctx: Context, signal: Any) -> None: ...

        async def on_sigterm(self, ctx: Context, signal: Any) -> None: ...

    etype = app.types["research"]
    assert set(etype.handlers) == HANDLEABLE
    assert etype.handler_for(Signal.SIGTERM) is Research.on_sigterm  # the per-signal method wins
    assert etype.handler_for(Signal.SIGUSR) is Research.on_signal
    assert etype.handler_for(Signal.SIGKILL) is None
    profile = etype.profile()
    assert (profile.grace_period.seconds, profile.idle_timeout.nanos) == (30, 250_000_000)
    assert isinstance(etype.factory(), Research)


@pytest.mark.parametrize("signal", ["SIGKILL", "SIGSTOP"])
def test_handling_sigkill_or_sigstop_is_refused(signal: str) -> None:
    app = App()
    with pytest.raises(DefinitionError, match=f"{signal} cannot be handled"):

        @app.entity("a", handles={signal, "SIGUSR"})
        class A:
            async def on_message(self, ctx: Context, message: Message) -> None: ...

            async def on_signal(self, ctx: Context, sig: Any) -> None: ...

    # A per-signal method named after it.
    async def handler(self: Any, ctx: Context, sig: Any) -> None: ...

    async def on_message(self: Any, ctx: Context, message: Message) -> None: ...

    namespace = {"on_message": on_message, f"on_{signal.lower()}": handler}
    with pytest.raises(DefinitionError, match=f"{signal} cannot be handled"):
        app.entity("c")(type("C", (), namespace))
    assert set(app.types) == set()


def test_function_entity_and_its_signal_handler() -> None:
    app = App(code_version="v7")

    @app.entity("chat", idle_timeout="1s")
    async def chat(ctx: Context, message: Message) -> None: ...

    assert isinstance(chat, EntityType)
    assert app.types["chat"] is chat

    @chat.on_signal(handles=["SIGUSR", "SIGINT"])
    async def on_signal(ctx: Context, signal: Any) -> None: ...

    assert set(chat.handlers) == {Signal.SIGUSR, Signal.SIGINT}
    with pytest.raises(DefinitionError, match="SIGKILL cannot be handled"):
        chat.on_signal(handles=["SIGKILL"])(on_signal)
    assert app.code_version == "v7"


def test_bad_definitions() -> None:
    app = App()
    with pytest.raises(DefinitionError, match="needs async def on_message"):
        app.entity("x")(type("X", (), {}))
    with pytest.raises(DefinitionError, match="must be an async function"):

        @app.entity("y")
        class Y:
            def on_message(self, ctx: Context, message: Message) -> None: ...

    with pytest.raises(DefinitionError, match="must match"):
        app.entity("no/slash")
    with pytest.raises(DefinitionError, match="invalid duration"):

        @app.entity("z", grace_period="soon")
        async def z(ctx: Context, message: Message) -> None: ...

    @app.entity("dup")
    async def dup(ctx: Context, message: Message) -> None: ...

    with pytest.raises(DefinitionError, match="already defined"):

        @app.entity("dup")
        async def dup2(ctx: Context, message: Message) -> None: ...


def test_code_version_hashes_the_defining_module() -> None:
    app = App()

    @app.entity("h")
    async def h(ctx: Context, message: Message) -> None: ...

    version = app.code_version
    assert len(version) == 12
    assert version != "dev"
    assert App().code_version == "dev"  # nothing to hash


def test_load_app(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parents[2]))
    app = load_app("examples.agents:app")
    assert list(app.types) == ["research", "chat"]
    assert load_app("examples.agents") is app
    with pytest.raises(DefinitionError, match=r"is not an electric_sdk\.runtime\.App"):
        load_app("examples.agents:STEP_S")
