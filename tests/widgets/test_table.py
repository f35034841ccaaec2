"""EntityTable against a real server and worker: live rows, filters, search, pages, signals to a
selection, and the errors a person can act on."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from electric_sdk import Client, Entity
from electric_sdk.lifecycle import Signal, State
from electric_sdk.testing import TestServer
from electric_sdk.widgets import EntityTable

from .support import TIMEOUT_S, ThreadedWorker, wait_for, wait_until


def table_for(opened: list[Any], client: Client, **kw: Any) -> EntityTable:
    table = EntityTable(client, **kw)
    opened.append(table)
    return table


def states(expected: dict[str, State]) -> Callable[[tuple[Entity, ...]], bool]:
    def match(entities: tuple[Entity, ...]) -> bool:
        return {str(e.ref): e.state for e in entities} == expected

    return match


def shown(table: EntityTable) -> list[str]:
    """The ids on the page, top to bottom."""
    return [str(slot.ref) for slot in table.slots if slot.ref is not None]


def cell(table: EntityTable, ref: str, column: str) -> str:
    """The text of one column of the row showing ``ref``."""
    slot = next(s for s in table.slots if str(s.ref) == ref)
    after = slot.cells.value.split(f"data-col='{column}'", 1)[1]
    return after.split(">", 1)[1].split("</span>", 1)[0]


def test_the_rows_follow_the_entities_and_hide_final_ones_until_asked(
    client: Client, worker: ThreadedWorker, opened: list[Any]
) -> None:
    for name in ("p1", "p2", "p3"):
        client.spawn(f"probe/{name}")
    client.spawn("nobody/n1")  # no worker hosts it: it waits in spawning
    client.spawn("nobody/gone")
    client.kill("nobody/gone")
    table = table_for(opened, client, throttle_s=0.05)
    live = {"probe/p1": State.RUNNING, "probe/p2": State.RUNNING, "probe/p3": State.RUNNING}
    wait_for(table, "entities", states({**live, "nobody/n1": State.SPAWNING}))
    assert "4 entities" in table.summary.value
    assert shown(table) == ["nobody/n1", "probe/p3", "probe/p2", "probe/p1"]  # newest first
    wait_for(table.slots[0].cells, "value", lambda text: "color:#dc3545'>no<" in text)  # its worker
    assert cell(table, "probe/p1", "worker") == "yes"
    assert cell(table, "probe/p1", "events") == str(client.get("probe/p1").head_offset)
    assert cell(table, "probe/p1", "last change").endswith(" ago")

    # A live change moves a row in place: the same widgets, new values.
    slot = next(s for s in table.slots if str(s.ref) == "probe/p2")
    client.pause("probe/p2")
    wait_for(slot.cells, "value", lambda text: "data-state='paused'" in text)
    assert str(slot.ref) == "probe/p2"

    # Killed entities show once asked for (a new stream brings them), and go again.
    table.show_final.value = True
    wait_for(
        table,
        "entities",
        states({**live, "probe/p2": State.PAUSED, "nobody/n1": State.SPAWNING, "nobody/gone": State.KILLED}),
    )
    table.show_final.value = False
    wait_for(table, "entities", lambda entities: "nobody/gone" not in {str(e.ref) for e in entities})


def test_filters_and_the_search_narrow_the_rows_at_once(
    client: Client, worker: ThreadedWorker, opened: list[Any]
) -> None:
    for ref in ("probe/alpha-1", "probe/alpha-2", "probe/beta-1", "nobody/alpha-9"):
        client.spawn(ref)
    client.wait_for_state("probe/beta-1", State.RUNNING, timeout=10)
    client.pause("probe/beta-1")
    table = table_for(opened, client)
    wait_for(table, "entities", lambda entities: len(entities) == 4)
    assert [label for label, _ in table.type_filter.options] == ["all types", "nobody", "probe"]
    watching = table.watch_filter

    table.type_filter.value = "probe"
    wait_for(table, "entities", lambda entities: {e.ref.type for e in entities} == {"probe"})
    table.state_filter.value = "paused"
    wait_for(table, "entities", states({"probe/beta-1": State.PAUSED}))
    table.state_filter.value = ""
    table.search.value = "ALPHA"
    wait_for(
        table,
        "entities",
        lambda entities: {str(e.ref) for e in entities} == {"probe/alpha-1", "probe/alpha-2"},
    )
    table.type_filter.value = ""
    wait_for(table, "entities", lambda entities: len(entities) == 3)
    assert watching is not None
    assert table.watch_filter is watching  # all of that from the rows the first stream brought

    table.sort.value = "name"
    wait_for(
        table, "entities", lambda _: shown(table) == ["nobody/alpha-9", "probe/alpha-1", "probe/alpha-2"]
    )


def test_pages_reuse_the_same_rows(client: Client, opened: list[Any]) -> None:
    for i in range(7):
        client.spawn(f"nobody/n{i}")
    table = table_for(opened, client, page_size=3)
    table.sort.value = "name"
    names = [f"nobody/n{i}" for i in range(7)]
    # In name order: a render the table computed before the sort changed may come first.
    wait_for(table, "entities", lambda entities: [str(e.ref) for e in entities] == names)
    wait_for(table.page_label, "value", lambda text: "page 1 of 3" in text)
    rows = table.children[-2].children
    assert shown(table) == ["nobody/n0", "nobody/n1", "nobody/n2"]
    assert table.previous_page.disabled
    table.next_page.click()
    table.next_page.click()
    wait_for(table.page_label, "value", lambda text: "page 3 of 3" in text)
    assert shown(table) == ["nobody/n6"]
    assert table.next_page.disabled
    assert [slot.box.layout.display for slot in table.slots] == ["", "none", "none"]
    assert table.children[-2].children is rows  # no widget was made or dropped
    table.previous_page.click()
    wait_for(table.page_label, "value", lambda text: "page 2 of 3" in text)
    assert shown(table) == ["nobody/n3", "nobody/n4", "nobody/n5"]


def test_pressing_an_id_opens_it(client: Client, opened: list[Any]) -> None:
    client.spawn("nobody/n1")
    table = table_for(opened, client)
    wait_for(table, "entities", lambda entities: len(entities) == 1)
    table.slots[0].name.click()
    assert str(table.opened) == "nobody/n1"
    assert "electric-opened" in table.slots[0].box._dom_classes


def test_a_selection_is_signalled_at_once_and_kill_asks_first(
    client: Client, worker: ThreadedWorker, opened: list[Any]
) -> None:
    for name in ("p1", "p2", "p3"):
        client.spawn(f"probe/{name}")
    table = table_for(opened, client, page_size=2)
    table.sort.value = "name"
    running = dict.fromkeys(("probe/p1", "probe/p2", "probe/p3"), State.RUNNING)
    # In name order too: a render the table computed before the sort changed may come first.
    wait_for(
        table, "entities", lambda es: states(running)(es) and [str(e.ref) for e in es] == sorted(running)
    )
    assert table.send_selected.disabled
    table.slots[0].tick.value = table.slots[1].tick.value = True
    assert [str(r) for r in table.selected] == ["probe/p1", "probe/p2"]
    assert table.send_selected.description == "Signal 2 selected"
    table.signal_choice.value = Signal.SIGSTOP
    table.reason.value = "deploy"
    table.send_selected.click()
    paused = {**running, "probe/p1": State.PAUSED, "probe/p2": State.PAUSED}
    wait_for(table, "entities", states(paused))
    wait_for(table.message, "value", lambda text: "SIGSTOP: 2 signalled" in text)

    # "all": every matching row, on every page; Kill asks first.
    table.select_all.value = True
    assert len(table.selected) == 3
    table.signal_choice.value = Signal.SIGKILL
    table.send_selected.click()
    assert table.confirm_kill.asking
    assert "Kill 3 entities" in table.confirm_kill.question.value
    assert client.get("probe/p3").state is State.RUNNING  # nothing sent yet
    table.confirm_kill.confirm.click()
    wait_for(table, "entities", states({}))  # killed: final, so out of the table
    assert [client.get(r).state for r in running] == [State.KILLED] * 3
    assert table.selected == []


def test_a_selection_sigusr_needs_valid_json(
    client: Client, worker: ThreadedWorker, opened: list[Any]
) -> None:
    client.spawn("probe/p1")
    table = table_for(opened, client)
    wait_for(table, "entities", states({"probe/p1": State.RUNNING}))
    table.select_all.value = True
    table.signal_choice.value = Signal.SIGUSR
    assert table.payload.layout.display == ""  # the payload box shows for SIGUSR only
    table.payload.value = "{not json"
    table.send_selected.click()
    assert "not valid JSON" in table.message.value
    table.payload.value = '{"focus": "costs"}'
    table.send_selected.click()
    wait_for(table.message, "value", lambda text: "SIGUSR: 1 signalled" in text)
    signals = [e for e in client.events("probe/p1").events if e.type == "signal" and e.operation == "insert"]
    assert [e.value.get("payload") for e in signals] == [{"focus": "costs"}]


def test_no_server_says_where_it_looked_and_how_to_start_one(tmp_path: Path, opened: list[Any]) -> None:
    address = f"127.0.0.1:{free_port()}"
    client = Client(address)
    try:
        table = table_for(opened, client)
        text = wait_for(table.alert, "value", lambda text: "no electric server answers" in text)
        assert address in text
        assert "`make run`" in text
        assert "`electric server`" in text
        assert "ELECTRIC_ADDRESS" in text
        # The server comes up there: the table finds it on its own.
        with TestServer(tmp_path / "late", listen=address) as server:
            setup = server.client()
            # gRPC waits out its reconnect backoff first (this process's channels share it).
            setup.wait_ready(TIMEOUT_S)
            setup.spawn("nobody/n1")
            wait_for(table, "entities", lambda entities: len(entities) == 1)
            assert table.alert.value == ""
            table.close()
    finally:
        client.close()


def test_a_refused_token_says_so(tmp_path: Path, opened: list[Any]) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text('[[tokens]]\ntoken = "right-token"\nprincipal = "ops"\nscopes = ["admin"]\n')
    tokens.chmod(0o600)
    with TestServer(tmp_path / "secured", tokens_file=tokens) as server:
        for token in ("wrong-token", None):
            client = Client(server.address, token=token)
            try:
                table = EntityTable(client)
                text = wait_for(table.alert, "value", lambda text: "UNAUTHENTICATED" in text)
                assert ("refused the token" if token else "needs a token") in text
                assert "set ELECTRIC_TOKEN" in text
                table.close()
            finally:
                client.close()


def test_close_stops_the_watch_stream(electric: TestServer, client: Client) -> None:
    client.spawn("nobody/n1")
    table = EntityTable(client)
    wait_for(table, "entities", lambda entities: len(entities) == 1)
    watches = electric.server.watches
    assert watches.active == 1  # the snapshot came through the stream itself
    assert table.streaming
    table.close()
    assert not table.streaming  # close() waited for the stream to end on the client
    wait_until(lambda: watches.active == 0)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_the_tree_order_shows_each_child_under_its_parent(client: Client, opened: list[Any]) -> None:
    client.spawn("boss/root")
    client.spawn("aide/a", parent="boss/root")
    client.spawn("aide/a1", parent="aide/a")
    client.spawn("aide/b", parent="boss/root")
    client.spawn("zed/x")
    table = table_for(opened, client)
    table.sort.value = "tree"
    order = ["boss/root", "aide/a", "aide/a1", "aide/b", "zed/x"]
    # The rows are shown before ``entities`` is set (last, in the same render).
    wait_for(table, "entities", lambda entities: [str(e.ref) for e in entities] == order)
    assert shown(table) == order
    assert [slot.name.description for slot in table.slots if slot.ref is not None] == [
        "root",
        "\u2514 a",
        "\u2003\u2514 a1",
        "\u2514 b",
        "x",
    ]
    assert cell(table, "aide/a1", "parent") == "aide/a"
    assert cell(table, "boss/root", "parent") == ""
    table.sort.value = "name"  # another order shows the plain ids again
    by_name = ["aide/a", "aide/a1", "aide/b", "boss/root", "zed/x"]
    wait_for(table, "entities", lambda entities: [str(e.ref) for e in entities] == by_name)
    assert [s.name.description for s in table.slots if s.ref is not None] == ["a", "a1", "b", "root", "x"]
