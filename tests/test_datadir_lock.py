"""One server per data directory (issue 17): a second `electric server`, `electric dev` or
`TestServer` on a directory a server holds is refused (exit 2, naming the directory and the
holder's pid) and writes nothing; a kill -9 frees the lock; readers (`verify`, `backup`) need
no lock. Real processes and files throughout.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from electric_server import ConfigError

from electric_sdk import Client
from electric_sdk.testing import TestServer

ROOT = Path(__file__).resolve().parent.parent
ELECTRIC = [sys.executable, "-m", "electric_sdk.cli.main"]
# Long enough for a refused start on a loaded machine; on a commit without the lock the second
# server serves instead of exiting, and the test fails here.
REFUSAL_TIMEOUT_S = 30


def electric(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ELECTRIC, *args], capture_output=True, text=True, timeout=REFUSAL_TIMEOUT_S, check=False, cwd=cwd
    )


def holder(data_dir: Path) -> dict[str, Any]:
    fields: dict[str, Any] = json.loads((data_dir / "LOCK").read_text())
    return fields


def files(data_dir: Path) -> dict[str, str]:
    """The store's files that a write changes (the database and its WAL) by content hash. Not the
    WAL index (-shm): the live first server's own reads move its read marks at any moment."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(data_dir.iterdir())
        if p.name.startswith("electric.db") and not p.name.endswith("-shm")
    }


def assert_refused(result: subprocess.CompletedProcess[str], data_dir: Path, pid: int) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert str(data_dir) in result.stderr, result.stderr
    assert f"pid {pid}" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert "listening" not in result.stdout


def test_second_server_is_refused_and_writes_nothing(server_process: Callable[..., Any]) -> None:
    first = server_process()
    assert holder(first.data_dir) == {
        "pid": first.proc.pid,
        "by": "electric server",
        "since": holder(first.data_dir)["since"],
        "address": first.address,
    }
    with Client(first.address) as client:
        client.spawn("agent/before")
        before = files(first.data_dir)

        result = electric("server", "--listen", "127.0.0.1:0", "--data", str(first.data_dir))

        assert_refused(result, first.data_dir, first.proc.pid)
        assert "only one server may use a data directory" in result.stderr
        assert files(first.data_dir) == before, "the refused server wrote to the store"
        assert holder(first.data_dir)["pid"] == first.proc.pid
        # The first keeps serving, reads and writes.
        client.spawn("agent/after")
        assert [str(e.ref) for e in client.list()] == ["agent/after", "agent/before"]
    first.send(signal.SIGTERM)
    assert first.wait() == 0


def test_kill_9_frees_the_lock(server_process: Callable[..., Any]) -> None:
    first = server_process()
    with Client(first.address) as client:
        client.spawn("agent/a1")
    first.send(signal.SIGKILL)
    assert first.wait() == -signal.SIGKILL
    # The file stays and still names the dead holder; the kernel dropped its lock.
    assert holder(first.data_dir)["pid"] == first.proc.pid

    second = server_process(first.data_dir)

    assert holder(second.data_dir)["pid"] == second.proc.pid
    with Client(second.address) as client:
        assert client.get("agent/a1").state.value == "spawning"
    second.send(signal.SIGTERM)
    assert second.wait() == 0
    assert (second.data_dir / "LOCK").read_text() == "", "a stopped server leaves a LOCK naming nobody"


def test_dev_is_refused_while_a_server_holds_the_dir(server_process: Callable[..., Any]) -> None:
    first = server_process()
    before = files(first.data_dir)

    result = electric(
        "dev", "examples.agents:app", "--listen", "127.0.0.1:0", "--data", str(first.data_dir), cwd=ROOT
    )

    assert_refused(result, first.data_dir, first.proc.pid)
    assert result.stderr.startswith("electric dev: "), result.stderr
    assert files(first.data_dir) == before


def test_test_server_is_refused_while_a_server_holds_the_dir(server_process: Callable[..., Any]) -> None:
    first = server_process()
    threads = threading.active_count()

    with pytest.raises(ConfigError, match=rf"{first.data_dir}.*pid {first.proc.pid}"):
        TestServer(first.data_dir).start()

    assert threading.active_count() == threads, "the refused TestServer left its loop thread running"
    with Client(first.address) as client:
        client.spawn("agent/still_serving")


def test_two_test_servers_in_one_process_conflict_and_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = TestServer(data).start()
    try:
        first.client().spawn("agent/a1")
        # flock belongs to an open file description: a second one in this process is refused too.
        with pytest.raises(ConfigError, match=rf"{data}.*pid {os.getpid()}"):
            TestServer(data).start()
        first.stop()
        first.start()  # the same object again, on the same directory
        assert first.client().get("agent/a1").state.value == "spawning"
    finally:
        first.stop()
    with TestServer(data) as second:
        assert second.client().get("agent/a1").state.value == "spawning"


def test_children_do_not_inherit_the_lock(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with TestServer(data):
        assert holder(data)["pid"] == os.getpid()
        # close_fds=False: only close-on-exec keeps the lock's descriptor from the child.
        child = subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, close_fds=False
        )
    try:
        held = {os.path.realpath(f"/proc/{child.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{child.pid}/fd")}
        assert str((data / "LOCK").resolve()) not in held
        with TestServer(data):  # the child is still running and does not hold it
            pass
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(10)


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """An empty directory no process may write: a read-only tmpfs as root, a mode 0555 one otherwise."""
    path = tmp_path / "ro"
    path.mkdir()
    if os.geteuid() != 0:
        path.chmod(0o555)
        yield path
        path.chmod(0o755)
        return
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)], capture_output=True, check=False
    )
    if mounted.returncode != 0:
        if os.environ.get("CI") == "true":
            pytest.fail(f"cannot mount a tmpfs in CI: {mounted.stderr!r}")
        pytest.skip(f"root, but mounting a tmpfs is not allowed here: {mounted.stderr!r}")
    try:
        yield path
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            subprocess.run(["umount", str(path)], check=True)


@pytest.mark.parametrize("sub", ["", "missing"])
def test_a_read_only_or_uncreatable_dir_is_a_clear_error(read_only_dir: Path, sub: str) -> None:
    data = read_only_dir / sub if sub else read_only_dir

    result = electric("server", "--listen", "127.0.0.1:0", "--data", str(data))

    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    expected = "cannot create the data directory" if sub else "cannot lock the data directory"
    assert f"electric server: {expected} {data}" in result.stderr, result.stderr
    assert "Read-only file system" in result.stderr or "Permission denied" in result.stderr


def test_verify_and_backup_run_beside_a_live_server(
    server_process: Callable[..., Any], tmp_path: Path
) -> None:
    srv = server_process()
    with Client(srv.address) as client:
        client.spawn("agent/a1")
        client.signal("agent/a1", "SIGUSR", payload={"n": 1})

        verified = electric("verify", "--data", str(srv.data_dir), "--json")
        backed_up = electric("backup", "--data", str(srv.data_dir), str(tmp_path / "copy.db"), "--json")

        assert verified.returncode == 0, verified.stderr
        report = json.loads(verified.stdout)
        assert (report["clean"], report["entities"], report["events"]) == (True, 1, 2)
        assert backed_up.returncode == 0, backed_up.stderr
        assert json.loads(backed_up.stdout)["events"] == 2
        assert holder(srv.data_dir)["pid"] == srv.proc.pid, "a reader took the lock"
        client.spawn("agent/a2")  # and the server never noticed them
