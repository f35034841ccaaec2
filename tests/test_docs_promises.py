"""The docs promise only what the code does (issue 23, point 3).

Every `electric COMMAND ...` written in README.md or docs/*.md — in a code
block, a code span or a table — names a command that exists, and only flags
that command takes; a flag written with a value out of its fixed choices is
caught too (e.g. `--synchronous EXTRA`, which the CLI refuses).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from electric_sdk.cli.main import build_parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# `electric`, its global flags, then the command and what follows it up to the end of the span.
USE = re.compile(
    r"(?<![\w/.-])electric((?:\s+--(?:json|address\s+\S+|token\s+\S+|timeout\s+\S+))*)\s+([a-z][a-z-]*)([^`\n|#]*)"
)
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)(?:[ =]([A-Z][A-Z0-9_]*|[a-z][a-z0-9_.-]*))?")


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {flag: action for action in parser._actions for flag in action.option_strings}


def _code(page: Path) -> list[tuple[int, str]]:
    """The page's code: fenced blocks' lines and code spans, with their line numbers."""
    code, fenced = [], False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced:
            code.append((number, line))
        else:
            code += [(number, span) for span in re.findall(r"`([^`]+)`", line)]
    return code


def uses() -> list[tuple[str, str, str]]:
    return [
        (f"{page.relative_to(ROOT)}:{number}", use.group(2), use.group(3))
        for page in PAGES
        for number, text in _code(page)
        for use in USE.finditer(text)
        if not use.group(3).lstrip().startswith("listening")  # a log line, e.g. "electric http listening on"
    ]


def test_the_docs_use_the_cli() -> None:
    assert len(uses()) > 50  # the pattern finds the docs' commands at all


@pytest.mark.parametrize(("where", "command", "rest"), uses(), ids=lambda v: str(v)[:40])
def test_every_documented_command_and_flag_exists(where: str, command: str, rest: str) -> None:
    commands = _commands()
    assert command in commands, f"{where}: `electric {command}` is not a command ({', '.join(commands)})"
    options = _options(commands[command])
    for flag, value in FLAG.findall(rest):
        assert flag in options, f"{where}: `electric {command}` has no {flag}"
        choices = options[flag].choices
        if choices is not None and value and value.isupper():
            assert value in choices, (
                f"{where}: `electric {command} {flag} {value}`: not one of {sorted(choices)}"
            )


def _all_options() -> dict[str, list[argparse.Action]]:
    every: dict[str, list[argparse.Action]] = {}
    for parser in [build_parser(), *_commands().values()]:
        for flag, action in _options(parser).items():
            every.setdefault(flag, []).append(action)
    return every


# Flags of other tools that these pages show beside electric's own, and the tools whose command lines
# are not electric's.
OTHER_TOOLS = {"--no-browser", "--port", "--tb", "--install-links"}
OTHER_COMMANDS = re.compile(
    r"^\s*(?:\$\s*)?(?:curl|wrk|npm|node|pg_dump|pg_basebackup|createdb|psql|pip|python3?|voila|docker|apt-get|openssl|make|buf|grpcurl)\b"
)


@pytest.mark.parametrize("page", ["docs/cli.md", "docs/server.md", "docs/runtime.md", "docs/http.md"])
def test_every_flag_in_the_reference_pages_exists(page: str) -> None:
    """The option tables and prose of the reference pages: each flag is one some command takes, with
    a value among its choices where it has fixed ones."""
    every = _all_options()
    wrong = []
    for number, text in _code(ROOT / page):
        if OTHER_COMMANDS.match(text):
            continue
        for flag, value in FLAG.findall(text):
            if flag in OTHER_TOOLS:
                continue
            if flag not in every:
                wrong.append(f"{page}:{number}: {flag}")
            elif value.isupper() and all(
                a.choices is not None and value not in a.choices for a in every[flag]
            ):
                wrong.append(f"{page}:{number}: {flag} {value}")
    assert not wrong, "flags no command takes:\n" + "\n".join(wrong)
