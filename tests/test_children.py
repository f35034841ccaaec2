"""Child entities: the parent link a spawn records, `ls --parent`, and a refused unknown parent.

A real server (SQLite, and PostgreSQL for the `both_stores` tests) and the real
`electric` CLI as a subprocess; the cascade of signals is tests/test_children_cascade.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from electric_sdk import AsyncClient, errors
from electric_sdk.testing import TestServer

pytestmark = [pytest.mark.anyio, pytest.mark.both_stores]

ELECTRIC = [sys.executable, "-m", "electric_sdk.cli.main"]


def cli(server: TestServer, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELECTRIC_")}
    env["ELECTRIC_ADDRESS"] = server.address
    result = subprocess.run(
        [*ELECTRIC, *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


async def test_a_child_records_its_parent_and_ls_lists_a_parents_children(
    electric: TestServer, client: AsyncClient
) -> None:
    await client.spawn("boss/root")
    child = await client.spawn("worker/a", parent="boss/root")
    await client.spawn("worker/b", parent="boss/root")
    await client.spawn("worker/c")  # a root of its own
    grandchild = await client.spawn("worker/a1", parent="worker/a")

    assert child.parent is not None
    assert child.parent.url == "/boss/root"
    assert (await client.get("worker/a1")).parent == grandchild.parent
    assert (await client.get("worker/c")).parent is None
    assert [e.ref.url for e in await client.list(parent="boss/root")] == ["/worker/a", "/worker/b"]
    assert [e.ref.url for e in await client.list(parent="worker/a")] == ["/worker/a1"]

    listed = cli(electric, "ls", "--parent", "boss/root", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [e["url"] for e in json.loads(listed.stdout)["entities"]] == ["/worker/a", "/worker/b"]
    got = cli(electric, "get", "worker/a1", "--json")
    assert json.loads(got.stdout)["parent"] == "/worker/a"
    assert "parent" in cli(electric, "get", "worker/a1").stdout
    spawned = cli(electric, "spawn", "worker/d", "--parent", "boss/root", "--json")
    assert json.loads(spawned.stdout)["parent"] == "/boss/root"
    # `get` names a parent's children (the first few; `ls --parent` lists them all).
    root = json.loads(cli(electric, "get", "boss/root", "--json").stdout)
    assert [c["url"] for c in root["children"]] == ["/worker/a", "/worker/b", "/worker/d"]
    assert root["children"][0]["state"] == "spawning"
    assert root["children_truncated"] is False
    shown = cli(electric, "get", "boss/root").stdout
    # A field of the entity's, aligned with the others (the widest, "grace period", sets it).
    assert "\n  children      /worker/a (spawning), /worker/b (spawning), /worker/d" in shown
    assert "\n  grace period  " in shown
    assert json.loads(cli(electric, "get", "worker/c", "--json").stdout)["children"] == []
    assert "children" not in cli(electric, "get", "worker/c").stdout


async def test_a_spawn_under_an_unknown_or_ended_parent_is_refused_and_writes_nothing(
    electric: TestServer, client: AsyncClient
) -> None:
    with pytest.raises(errors.ElectricError) as refused:
        await client.spawn("worker/orphan", parent="boss/nobody")
    assert refused.value.code == "PARENT_NOT_FOUND"
    assert not await client.list("worker")

    await client.spawn("boss/gone")
    await client.kill("boss/gone")
    with pytest.raises(errors.ElectricError) as ended:
        await client.spawn("worker/late", parent="boss/gone")
    assert ended.value.code == "PARENT_ENDED"
    assert not await client.list("worker")

    result = cli(electric, "spawn", "worker/orphan", "--parent", "boss/nobody")
    assert result.returncode != 0
    assert "boss/nobody" in result.stderr
    assert not await client.list("worker")


async def test_the_http_door_spawns_a_child_and_refuses_an_unknown_parent(http: Any) -> None:
    assert (await http.put("/boss/root")).status_code in (200, 201)
    child = await http.put("/team/a", json={"parent": "/boss/root"})
    assert child.status_code in (200, 201), child.text
    assert child.json()["parent"] == "/boss/root"
    assert (await http.get("/team/a")).json()["parent"] == "/boss/root"
    orphan = await http.put("/team/b", json={"parent": "boss/nobody"})
    assert orphan.status_code == 404
    assert orphan.json()["error"]["code"] == "PARENT_NOT_FOUND"
    assert (await http.get("/team/b")).status_code == 404
