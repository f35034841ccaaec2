"""docs/signals.md and docs/runtime.md are generated from electric_sdk/lifecycle.py, and docs/server.md's
options from server/electric_server/settings.py: none may drift."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from electric_server.settings import SETTINGS, Setting

from electric_sdk.busy import BusyPolicy
from electric_sdk.lifecycle import (
    OPT_IN_TIMING,
    RUNTIME_TRANSITIONS,
    SIGNAL_TIMING,
    TABLE,
    TERMINAL_STATES,
    Signal,
)

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gendocs.py"
DOC = ROOT / "docs" / "signals.md"


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gendocs", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gendocs = _load_script()


def _block(text: str, begin: str) -> str:
    """The text between a BEGIN marker and the END marker after it."""
    head = text.index(begin) + len(begin)
    return text[head : text.index(gendocs.END, head)]


def _outside_blocks(text: str) -> str:
    for begin in (gendocs.TABLE_BEGIN, gendocs.WAITING_BEGIN, gendocs.STAGES_BEGIN, gendocs.DIAGRAM_BEGIN):
        text = text.replace(_block(text, begin), "\n")
    return text


def _run_check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--check", "--path", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_docs_are_up_to_date() -> None:
    problem = gendocs.check(DOC)
    assert problem is None, f"{problem}\n\ndocs/signals.md is stale: run `python scripts/gendocs.py`"


def test_check_command_passes() -> None:
    result = _run_check(DOC)
    assert result.returncode == 0, result.stdout + result.stderr


def test_table_is_inserted_verbatim() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert _block(text, gendocs.TABLE_BEGIN) == "\n" + gendocs.markdown_table()


def test_diagram_has_every_transition_and_nothing_else() -> None:
    text = DOC.read_text(encoding="utf-8")
    block = _block(text, gendocs.DIAGRAM_BEGIN)
    assert "```mermaid\nstateDiagram-v2\n" in block
    edges = set(re.findall(r"^\s*(\S+) --> ([^:\s]+)", block, flags=re.MULTILINE))
    want = {(s.value, c.new_state.value) for s, row in TABLE.items() for c in row.values() if c.new_state}
    want |= {(a.value, b.value) for a, b in RUNTIME_TRANSITIONS}
    want |= {("[*]", "spawning")} | {(s.value, "[*]") for s in TERMINAL_STATES}
    assert edges == want
    for state, row in TABLE.items():
        for signal, c in row.items():
            if c.new_state:
                edge = rf"^\s*{state.value} --> {c.new_state.value}: .*\b{signal.value}\b"
                assert re.search(edge, block, flags=re.MULTILINE)


def test_prose_does_not_retype_the_table() -> None:
    prose = _outside_blocks(DOC.read_text(encoding="utf-8"))
    assert "server rejects" not in prose
    assert not re.search(r"^\|", prose, flags=re.MULTILINE), "a Markdown table outside the generated blocks"
    assert "stateDiagram" not in prose


def test_prose_covers_every_signal() -> None:
    prose = _outside_blocks(DOC.read_text(encoding="utf-8"))
    for signal in ("SIGINT", "SIGHUP", "SIGTERM", "SIGKILL", "SIGSTOP", "SIGCONT", "SIGUSR"):
        assert f"### {signal}" in prose
    assert "SIGINT, SIGKILL, SIGUSR" in prose  # immediate
    assert "SIGTERM, SIGSTOP, SIGCONT, SIGHUP" in prose  # at step boundaries


def test_check_fails_on_drift_and_regeneration_keeps_prose(tmp_path: Path) -> None:
    page = tmp_path / "signals.md"
    original = DOC.read_text(encoding="utf-8")
    stale = original.replace("| → `stopping` |", "| → `stopped` |", 1)
    stale = stale.replace("## State table\n", "## State table\n\nA note someone added.\n", 1)
    assert stale != original
    page.write_text(stale, encoding="utf-8")

    assert gendocs.check(page) is not None
    result = _run_check(page)
    assert result.returncode == 1
    assert "stale" in result.stderr

    assert gendocs.write(page) is True
    fixed = page.read_text(encoding="utf-8")
    assert "A note someone added." in fixed
    assert fixed == original.replace("## State table\n", "## State table\n\nA note someone added.\n", 1)
    assert gendocs.check(page) is None
    assert gendocs.write(page) is False


def test_missing_page_or_markers_is_stale(tmp_path: Path) -> None:
    page = tmp_path / "signals.md"
    assert _run_check(page).returncode == 1
    page.write_text("# Signals\n\nNo markers here.\n", encoding="utf-8")
    assert "not found" in (gendocs.check(page) or "")
    assert _run_check(page).returncode == 1
    with pytest.raises(gendocs.MarkerError):
        gendocs.render(f"{gendocs.TABLE_BEGIN}\n{gendocs.DIAGRAM_BEGIN}\n{gendocs.END}\n")


def test_starter_page_renders_to_a_page_that_checks(tmp_path: Path) -> None:
    page = tmp_path / "docs" / "signals.md"
    assert gendocs.write(page) is True
    assert gendocs.check(page) is None


RUNTIME_DOC = ROOT / "docs" / "runtime.md"


def test_runtime_signal_timing_table_is_up_to_date() -> None:
    problem = gendocs.check(RUNTIME_DOC)
    assert problem is None, f"{problem}\n\ndocs/runtime.md is stale: run `python scripts/gendocs.py`"
    assert _run_check(RUNTIME_DOC).returncode == 0


def test_runtime_signal_timing_table_says_what_the_rules_say() -> None:
    block = _block(RUNTIME_DOC.read_text(encoding="utf-8"), gendocs.TIMING_BEGIN)
    rows = {line.split(" | ")[0].strip("| "): line for line in block.splitlines() if line.startswith("| SIG")}
    assert set(rows) == {s.value for s in Signal}
    for signal, line in rows.items():
        assert SIGNAL_TIMING[Signal(signal)].value in line
    # What users were surprised by: an idle entity has no worker, so no handler runs.
    assert "→ `stopped`; no cleanup runs" in rows["SIGTERM"]
    assert "ignored (not processing); no handler is called" in rows["SIGUSR"]
    # Each per-type opt-in is a row of its own; the default rows above do not change for it.
    opt_ins = [line for line in block.splitlines() if line.startswith("| per type: ")]
    assert len(opt_ins) == len(OPT_IN_TIMING)
    for signal, (option, timing) in OPT_IN_TIMING.items():
        assert any(f"{signal.value} with `{option}=True` | {timing.value} |" in line for line in opt_ins)


def test_runtime_timing_drift_fails_the_check(tmp_path: Path) -> None:
    page = tmp_path / "runtime.md"
    text = RUNTIME_DOC.read_text(encoding="utf-8")
    page.write_text(text.replace("no cleanup runs", "the cleanup runs"), encoding="utf-8")
    assert gendocs.check(page) is not None
    assert _run_check(page).returncode == 1
    assert gendocs.write(page) is True
    assert page.read_text(encoding="utf-8") == text


SERVER_DOC = ROOT / "docs" / "server.md"


def _option_rows(setting: Setting[Any]) -> list[str]:
    """The rows of docs/server.md's options whose first cell is this setting's flag or field."""
    first = {setting.flag or setting.name, f"{setting.flag} {setting.kind.metavar}"}
    return [
        line
        for line in _block(SERVER_DOC.read_text(encoding="utf-8"), gendocs.OPTIONS_BEGIN).splitlines()
        if line.split("`")[1:2] and line.split("`")[1] in first
    ]


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.name)
def test_each_server_setting_has_its_row_in_the_docs(setting: Setting[Any]) -> None:
    (row,) = _option_rows(setting)
    cells = row.split(" | ")
    assert cells[1:3] == [setting.default_words(gendocs.code_span), setting.range_words()]
    assert setting.help in row


def test_server_options_are_up_to_date() -> None:
    problem = gendocs.check(SERVER_DOC)
    assert problem is None, f"{problem}\n\ndocs/server.md is stale: run `python scripts/gendocs.py`"
    assert _run_check(SERVER_DOC).returncode == 0


def test_server_options_drift_fails_the_check_and_regeneration_keeps_prose(tmp_path: Path) -> None:
    page = tmp_path / "server.md"
    original = SERVER_DOC.read_text(encoding="utf-8")
    settle = "| `--settle DURATION` | `1s` | 1ms to 60s |"
    assert settle in original
    note = "## Configuration\n\nA note someone added.\n"
    with_note = original.replace("## Configuration\n", note, 1)
    page.write_text(with_note.replace(settle, settle.replace("`1s`", "`2s`")), encoding="utf-8")

    assert gendocs.check(page) is not None
    result = _run_check(page)
    assert result.returncode == 1
    assert "stale" in result.stderr

    assert gendocs.write(page) is True
    assert page.read_text(encoding="utf-8") == with_note
    assert gendocs.check(page) is None


BUSY_DOC = ROOT / "docs" / "double-texting.md"


def test_double_texting_policies_table_matches_busy_py() -> None:
    problem = gendocs.check(BUSY_DOC)
    assert problem is None, f"{problem}\n\ndocs/double-texting.md is stale: run `python scripts/gendocs.py`"
    block = _block(BUSY_DOC.read_text(encoding="utf-8"), gendocs.POLICIES_BEGIN)
    assert block == "\n" + gendocs.policies_table()
    assert all(f"| `{policy.value}` |" in block for policy in BusyPolicy)
