"""The notebooks run top to bottom in a real kernel: the project virtualenv's own Python, through
the ``electric`` kernel spec that ``make venv`` installs into the virtualenv."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
from nbclient import NotebookClient
from widgets.support import ThreadedWorker

from electric_sdk.testing import TestServer

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
KERNEL = "electric"
CELL_TIMEOUT_S = 60

# Run after control_panel.ipynb's own cell, in its kernel: the dashboard comes alive there (its
# updates reach the kernel's event loop while a cell awaits) and a click reaches the server.
PANEL_CHECK = """
import asyncio

from electric_sdk.lifecycle import Signal, State


async def reaches(widget, trait, predicate):
    reached = asyncio.Event()

    def check(_change=None):
        if predicate(getattr(widget, trait)):
            reached.set()

    widget.observe(check, trait)
    check()
    try:
        await asyncio.wait_for(reached.wait(), 20)
    finally:
        widget.unobserve(check, trait)


control = dashboard.control  # ELECTRIC_ENTITY's panel, open from the start
await reaches(control, "view", lambda view: view.state is State.RUNNING)
control.buttons[Signal.SIGSTOP].click()
await reaches(control, "view", lambda view: view.state is State.PAUSED)
await reaches(dashboard.table, "entities", lambda entities: State.PAUSED in {e.state for e in entities})
print(client.get(control.ref).state.value, len(dashboard.table.entities))
"""


@pytest.fixture(scope="module")
def kernel_name() -> str:
    try:
        spec = KernelSpecManager().get_kernel_spec(KERNEL)
    except NoSuchKernel:
        pytest.fail(f"no {KERNEL!r} kernel spec: `make venv` installs it into the virtualenv")
    # The kernel must be this virtualenv's Python, not one found elsewhere on the machine.
    assert Path(spec.argv[0]).parent == Path(sys.prefix) / "bin", spec.argv
    return KERNEL


def execute(name: str, kernel_name: str, workdir: Path, *extra_cells: str) -> nbformat.NotebookNode:
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    notebook.cells.extend(nbformat.v4.new_code_cell(source) for source in extra_cells)
    client = NotebookClient(
        notebook,
        kernel_name=kernel_name,
        timeout=CELL_TIMEOUT_S,
        resources={"metadata": {"path": str(workdir)}},
    )
    client.execute()  # raises CellExecutionError, with the cell and its traceback, if a cell fails
    return notebook


def text_of(cell: nbformat.NotebookNode) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


@pytest.fixture(autouse=True)
def own_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernels inherit the environment: none of the caller's server settings reach them."""
    for name in ("ELECTRIC_ADDRESS", "ELECTRIC_TOKEN", "ELECTRIC_ENTITY"):
        monkeypatch.delenv(name, raising=False)


def outputs_of(notebook: nbformat.NotebookNode) -> str:
    return "\n".join(text_of(cell) for cell in notebook.cells if cell.cell_type == "code")


def test_quickstart(kernel_name: str, tmp_path: Path) -> None:
    notebook = execute("quickstart.ipynb", kernel_name, tmp_path)
    outputs = outputs_of(notebook)
    assert "SIGSTOP running → paused" in outputs
    assert "the queued message ran: completed" in outputs
    assert "aborted \"outline of 'a very long essay'\\n\"" in outputs
    assert "SIGTERM running → stopping" in outputs
    assert any("widget-view" in str(o.get("data", {})) for c in notebook.cells for o in c.get("outputs", []))


def test_control_panel(
    kernel_name: str, tmp_path: Path, electric: TestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dashboard's notebook, against a server of the test's own with three live entities and a
    killed one (which the table leaves out until asked)."""
    with ThreadedWorker(electric.address, idle_timeout="10m"):
        client = electric.client()
        for name in ("p1", "p2", "p3"):
            client.spawn(f"probe/{name}")
        client.spawn("probe/gone")
        client.kill("probe/gone")
        monkeypatch.setenv("ELECTRIC_ADDRESS", electric.address)
        monkeypatch.setenv("ELECTRIC_ENTITY", "probe/p1")
        notebook = execute("control_panel.ipynb", kernel_name, tmp_path, PANEL_CHECK)
    assert text_of(notebook.cells[-1]).split() == ["paused", "3"]
    assert not [c for c in notebook.cells if c.cell_type == "markdown"]  # no prose above the console


def test_exec_entities(kernel_name: str, tmp_path: Path) -> None:
    notebook = execute("exec_entities.ipynb", kernel_name, tmp_path)
    outputs = outputs_of(notebook)
    assert outputs.count("same as in Python: True") == 2  # the TOML types equal the Python ones
    assert "echo: hello, polite/p1" in outputs
    assert "echo: hello, stubborn/s1" in outputs
    # The polite process: SIGTERM, then its exit before the deadline; never forced.
    assert "force actions: 0\nexited before the deadline: True\nexit status: 0" in outputs
    # The stubborn one: one SIGKILL, after the deadline, escalated; killed by it.
    assert re.search(r"graceful\s+SIGTERM\s+issued", outputs)
    assert len(re.findall(r"force\s+SIGKILL\s+issued", outputs)) == 1
    assert "force actions: 1 SIGKILL" in outputs
    assert re.search(r"force issued [\d.]+ ms after the deadline: True", outputs)
    assert "escalated: True True\nexit status: -9" in outputs
    # Refused when defined, and nothing added to the app.
    assert "refused: exec 'reckless': SIGKILL cannot be a graceful action" in outputs
    assert "is longer than the grace period" in outputs
    assert "unknown key(s) timout" in outputs
    assert "types in the app: ['polite', 'stubborn']" in outputs
    assert text_of(notebook.cells[-1]).strip() == "stopped"
