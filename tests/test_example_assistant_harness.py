"""examples/assistant.py under the testing kit's harness: its handlers, called directly."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from electric_sdk.lifecycle import State
from electric_sdk.runtime import App
from electric_sdk.testing import EntityHarness

pytestmark = pytest.mark.anyio

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "assistant.py"


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> App:
    """The example's app, loaded from its file, with its fake calls taking no time."""
    monkeypatch.setenv("ASSISTANT_STEP_S", "0")
    spec = importlib.util.spec_from_file_location("assistant_example", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    example: App = module.app
    return example


async def test_steering_and_the_sigterm_summary(app: App) -> None:
    async with EntityHarness(app, "assistant") as h:
        await h.signal("SIGUSR", payload={"tone": "short"})
        run = await h.send("tides")
        assert (run.status, run.output) == ("completed", "tides: see 3 sources.")
        steps = [e.value["data"]["name"] for e in h.events if e.type == "electric.step"]
        assert steps == ["tool:search", "model:answer"]
        await h.signal("SIGTERM")
        assert await h.wait_lifecycle(State.STOPPED) is State.STOPPED
        assert h.causes[-1] == "cleanup_complete"
        summary = next(e.value["data"] for e in h.events if e.type == "summary")
        assert summary == {"turns": 2, "questions": ["tides"]}
