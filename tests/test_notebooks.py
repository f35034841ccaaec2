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

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
KERNEL = "electric"
CELL_TIMEOUT_S = 60

# Run after control_panel.ipynb's own cells, in its kernel: the widgets come alive there (their
# updates reach the kernel's event loop while a cell awaits) and a click reaches the server.
PANEL_CHECK = """
import asyncio

from electric_sdk.lifecycle import Signal, State


async def view_reaches(state):
    reached = asyncio.Event()

    def check(_change=None):
        if control.view.state is state:
            reached.set()

    control.observe(check, "view")
    check()
    try:
        await asyncio.wait_for(reached.wait(), 20)
    finally:
        control.unobserve(check, "view")


await view_reaches(State.RUNNING)
control.buttons[Signal.SIGSTOP].click()
await view_reaches(State.PAUSED)
print(client.get(ENTITY).state.value, len(table.entities))
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
    """The kernels inherit the environment: make the notebooks start their own server."""
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


def test_control_panel(kernel_name: str, tmp_path: Path) -> None:
    notebook = execute("control_panel.ipynb", kernel_name, tmp_path, PANEL_CHECK)
    assert text_of(notebook.cells[-1]).split() == ["paused", "3"]


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
