"""The server's settings table (server/electric_server/settings.py) is ServerConfig and the `electric
server` and `electric dev` options: every setting is walked through each of them (and through
docs/server.md's options table in test_docs_generated.py)."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from electric_server import settings
from electric_server.app import ElectricServer, ServerConfig
from electric_server.clock import SYSTEM_CLOCK
from electric_server.config_error import ConfigError
from electric_server.settings import SETTINGS, Setting

from electric_sdk.cli.local import resolve_store
from electric_sdk.cli.main import build_parser, commands_of
from electric_sdk.cli.server_options import help_text, server_fields

ROOT = Path(__file__).resolve().parent.parent
ELECTRIC = [sys.executable, "-m", "electric_sdk.cli.main"]
FLAGGED = [s for s in SETTINGS if s.flag is not None]
RANGED = [s for s in SETTINGS if s.low is not None or s.high is not None]


def _id(s: Setting[Any]) -> str:
    return s.name


def electric(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ELECTRIC, *args], capture_output=True, text=True, timeout=60, check=False)


# -- the table is ServerConfig ----------------------------------------------------------------


def test_every_field_of_serverconfig_is_a_setting_with_its_default() -> None:
    fields = {f.name: f for f in dataclasses.fields(ServerConfig)}
    assert fields.pop("clock").default is SYSTEM_CLOCK  # a test hook, not a setting
    assert set(fields) == {s.name for s in SETTINGS}
    for s in SETTINGS:
        assert fields[s.name].default == s.value, s.name
        assert type(fields[s.name].default) is type(s.value), s.name


def test_the_table_holds_every_setting_once() -> None:
    defined = [v for v in vars(settings).values() if isinstance(v, Setting)]
    assert len(defined) == len(SETTINGS) == len({s.name for s in SETTINGS})
    assert set(map(id, defined)) == set(map(id, SETTINGS))
    flags = [s.flag for s in FLAGGED]
    assert len(flags) == len(set(flags))


@pytest.mark.parametrize("s", SETTINGS, ids=_id)
def test_a_default_is_inside_its_range(s: Setting[Any]) -> None:
    assert s.refusal(s.value) is None
    if s.low is not None:
        assert s.refusal(s.lowest()) is None
    if s.high is not None:
        assert s.refusal(s.highest()) is None
    if s.default is None:  # no value: its field is Optional, and no text typed for it means none
        assert s.flag is not None
        assert s.kind.parse("x") is not None


# -- the flags ---------------------------------------------------------------------------------


def _parse(command: str, *argv: str) -> dict[str, Any]:
    args: argparse.Namespace = build_parser().parse_args([command, *argv])
    resolve_store(args)
    return server_fields(args, command)


@pytest.fixture(autouse=True)
def _no_database_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ELECTRIC_DATABASE_URL", raising=False)


@pytest.mark.parametrize("s", FLAGGED, ids=_id)
def test_each_flag_parses_its_default(s: Setting[Any]) -> None:
    assert s.flag is not None
    commands = ["server", "dev"] if s.dev else ["server"]
    for command in commands:
        given = _parse(command)  # nothing given: ServerConfig's default, and the table's
        assert ServerConfig(**given).__dict__[s.name] == s.value
        if s.kind.action == "store_true":
            assert _parse(command, s.flag)[s.name] is True
        elif s.kind.action == "append":
            two = ("https://a.example", "https://b.example")
            assert _parse(command, s.flag, two[0], s.flag, two[1])[s.name] == two
        elif s.default is not None:
            assert _parse(command, s.flag, s.default)[s.name] == s.value
    if not s.dev:
        with pytest.raises(Exception, match="unrecognized arguments"):
            build_parser().parse_args(["dev", s.flag, s.default or "x"])


@pytest.mark.parametrize("s", FLAGGED, ids=_id)
def test_each_flags_help_ends_with_its_default_and_range(s: Setting[Any]) -> None:
    text = help_text(s)
    shown = " ".join(commands_of(build_parser())["server"].format_help().split())
    assert " ".join(text.split()) in shown
    if s.kind.action != "store_true":
        assert text.endswith(
            f"(default {s.default_words()}{'; ' + s.range_words() if s.range_words() else ''})"
        )


# -- the ranges --------------------------------------------------------------------------------


def _outside(s: Setting[Any]) -> list[Any]:
    """One value below the range and one above, where it has those ends."""
    step = 1
    return [
        *([s.lowest() - step] if s.low is not None else []),
        *([s.highest() + step] if s.high is not None else []),
    ]


@pytest.mark.parametrize("s", RANGED, ids=_id)
def test_a_value_out_of_range_is_refused_by_the_server(s: Setting[Any], tmp_path: Path) -> None:
    for value in _outside(s):
        fields: dict[str, Any] = {s.name: value, "data_dir": tmp_path / "data"}
        if s.store == "PostgreSQL":  # its store checks it; no connection is opened to refuse it
            fields["database_url"] = "postgresql://electric@127.0.0.1:1/electric"
        config = ServerConfig(**fields)
        with pytest.raises(ConfigError) as refused:
            ElectricServer(config)
        if s.store is None:  # the table's own check: the flag, the range, the value
            assert str(refused.value) == f"{s.called} must be {s.range_words()}, not {s.kind.show(value)}"
            with pytest.raises(ConfigError):
                settings.check(config)
        else:  # the store's, with the table's bound
            assert settings.check(config) is None
        assert not (tmp_path / "data").exists()


def test_a_choice_outside_the_table_is_refused() -> None:
    assert settings.SYNCHRONOUS.refusal("SOMETIMES") == "--synchronous must be FULL or NORMAL, not SOMETIMES"
    with pytest.raises(ConfigError, match="synchronous must be"):
        ElectricServer(ServerConfig(synchronous="SOMETIMES"))


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--settle", "0"], "--settle must be 1ms to 60s, not 0ms"),
        (["--poll", "501ms"], "--poll must be 1ms to 500ms, not 501ms"),
        (["--acceptors", "65"], "--acceptors must be 0 to 64, not 65"),
        (["--database-timeout", "9ms"], "--database-timeout must be 10ms to 10m, not 9ms"),
        (["--max-sessions", "0"], "--max-sessions must be at least 1, not 0"),
        (["--sse-heartbeat", "0"], "--sse-heartbeat must be at least 1, not 0"),
        (["--poll", "soon"], "--poll: invalid duration 'soon'"),
        (["--max-streams", "many"], "--max-streams: invalid number 'many'"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_the_cli_refuses_a_value_out_of_range(tmp_path: Path, argv: list[str], says: str) -> None:
    data = tmp_path / "data"
    result = electric("server", "--listen", "127.0.0.1:0", "--data", str(data), *argv)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"electric server: {says}"), result.stderr
    assert "Traceback" not in result.stderr
    assert not data.exists()


def test_dev_refuses_a_value_out_of_range_before_it_starts(tmp_path: Path) -> None:
    data = tmp_path / "data"
    result = electric("dev", "--listen", "127.0.0.1:0", "--data", str(data), "--database-timeout", "11m")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("electric dev: --database-timeout must be 10ms to 10m, not 660000ms")
    assert not data.exists()


# -- the package's top level -------------------------------------------------------------------


def test_reading_the_table_loads_no_server() -> None:
    """`electric --help` builds the server's options from the table: it must not load app.py (grpc's
    server, Starlette, uvicorn, asyncpg), so the CLI and its completion stay as fast."""
    probe = (
        "import sys\n"
        "from electric_server import SETTINGS\n"
        "import electric_sdk.cli.main\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] in ('starlette', 'uvicorn', 'asyncpg')\n"
        "          or (m.startswith('electric_server.') and m not in\n"
        "              ('electric_server.settings', 'electric_server.config_error'))]\n"
        "print(loaded)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_every_public_name_of_the_top_level_resolves() -> None:
    import electric_server

    for name in electric_server.__all__:
        assert getattr(electric_server, name) is not None, name
    assert set(electric_server.__all__) <= set(dir(electric_server))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = electric_server.nope  # type: ignore[attr-defined]
