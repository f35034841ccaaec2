"""No task of the server starts outside its one task-group helper (server/electric_server/lifetime.py).

A task started with ``create_task`` or ``ensure_future`` (on asyncio or a loop), a coroutine handed
to another loop (``run_coroutine_threadsafe``), another task group, or a ``gather`` left running
unawaited, belongs to no component: nothing cancels it when the server stops, nothing awaits it,
and its crash is lost. Each component starts its tasks in a ``TaskGroup`` it owns instead.

There is no allow-list: the store's parts (its writers, the pool's hand-backs, the commit feed's
reader and doorbell, the database's probe, the lone writes' findings) own their tasks too.
"""

from __future__ import annotations

import ast
from pathlib import Path

SERVER = Path(__file__).resolve().parent.parent / "server" / "electric_server"
HELPER = "lifetime.py"
# Store modules that start tasks of their own (the store's rewrite takes them into its components).
STARTERS = frozenset({"create_task", "ensure_future", "run_coroutine_threadsafe", "create_task_group"})
# What starts tasks when imported by name from these (``TaskGroup()`` alone could be asyncio's).
LIBRARIES = frozenset({"asyncio", "anyio"})


def loose_tasks(source: str) -> list[tuple[int, str]]:
    """(line, what) of each task ``source`` starts outside a task group's helper."""
    tree = ast.parse(source)
    awaited = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Await)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in LIBRARIES:
            taken = {alias.name for alias in node.names} & (STARTERS | {"TaskGroup", "gather"})
            found += [(node.lineno, f"from {node.module} import {name}") for name in sorted(taken)]
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        library_group = (
            name == "TaskGroup" and isinstance(func, ast.Attribute) and ast.unparse(func.value) in LIBRARIES
        )
        if name in STARTERS or library_group or (name == "gather" and id(node) not in awaited):
            found.append((node.lineno, f"{ast.unparse(func)}(...)"))
    return sorted(found)


def offenders() -> dict[str, list[tuple[int, str]]]:
    found = {}
    for path in sorted(SERVER.rglob("*.py")):
        relative = path.relative_to(SERVER).as_posix()
        if relative != HELPER and (loose := loose_tasks(path.read_text())):
            found[relative] = loose
    return found


def test_no_task_starts_outside_the_task_group_helper() -> None:
    loose = [
        f"server/electric_server/{path}:{line}: {call}"
        for path, calls in offenders().items()
        for line, call in calls
    ]
    assert not loose, "tasks started outside lifetime.TaskGroup:\n" + "\n".join(loose)


def test_the_guard_finds_each_way_to_start_a_loose_task() -> None:
    source = """
import asyncio
from asyncio import TaskGroup, sleep

from electric_server.lifetime import TaskGroup as Ours

async def f(loop, coro, other):
    asyncio.create_task(coro)
    loop.create_task(coro)
    asyncio.get_running_loop().create_task(coro, name="x")
    asyncio.ensure_future(coro)
    asyncio.run_coroutine_threadsafe(coro, other)
    pending = asyncio.gather(coro, coro)
    async with asyncio.TaskGroup() as group:
        group.create_task(coro)
    await asyncio.gather(coro, coro)  # awaited where it starts: no task outlives the call
    await asyncio.wait_for(coro, 1)
    async with Ours("the component") as tasks:  # the helper's own group is what to use
        tasks.start_soon(coro)
"""
    assert [line for line, _ in loose_tasks(source)] == [3, 8, 9, 10, 11, 12, 13, 14, 15]
