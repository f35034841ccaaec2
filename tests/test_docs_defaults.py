"""Where the docs' prose names a server option's default beside it — "`--settle`, 1 s",
"`--max-streams` (5,000)" — it is the settings table's default (server/electric_server/settings.py).

The options table of docs/server.md is generated from the table (tests/test_docs_generated.py);
the prose around it restates a default where a reader needs it, and this keeps those words true
when a default changes. docs/scaling.md is left out: its dated sections record what runs measured,
with the defaults of their day.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from electric_server.settings import SETTINGS, Setting

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "scaling.md")]
# A flag in backticks, then its default: after a comma, or in parentheses.
MENTION = re.compile(r"`(--[a-z-]+)`(?:, | \()(\d[\d,.]*)( ?(?:ms|s|m|MiB/s|MiB))?\b")
MIB = 1024 * 1024
BY_FLAG = {s.flag: s for s in SETTINGS if s.flag is not None}


def mentions() -> list[tuple[str, int, str, str]]:
    found = []
    for page in PAGES:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for match in MENTION.finditer(line):
                flag, number_text, unit = match.group(1), match.group(2), (match.group(3) or "").strip()
                found.append((f"{page.relative_to(ROOT)}:{number}", flag, number_text, unit))
    return found


def value_of(setting: Setting[object], number: str, unit: str) -> object:
    """The prose's value, as the setting's field holds it."""
    digits = number.replace(",", "")
    if unit.startswith("MiB"):
        return round(float(digits) * MIB)
    return setting.kind.parse(f"{digits}{unit}")


def test_the_docs_name_some_defaults() -> None:
    assert len(mentions()) >= 5  # the pattern still finds the prose it is for


@pytest.mark.parametrize(("where", "flag", "number", "unit"), mentions())
def test_a_default_named_in_prose_is_the_tables(where: str, flag: str, number: str, unit: str) -> None:
    setting = BY_FLAG.get(flag)
    assert setting is not None, f"{where}: {flag} is no option of `electric server`"
    assert value_of(setting, number, unit) == setting.value, (
        f"{where}: the prose says {flag} defaults to {number} {unit}, the table {setting.default!r}"
    )
