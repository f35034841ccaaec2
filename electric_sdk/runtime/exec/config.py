"""Exec entity types declared in a TOML file (``electric worker --exec FILE``).

::

    [[exec]]
    id = "indexer"                        # the entity type
    command = ["python3", "-u", "index.py"]   # or a string, split like a shell (no shell runs)
    cwd = "jobs"                          # relative to this file's folder (the default)
    env = { LOG_LEVEL = "debug" }
    keep = false
    tags = ["batch"]
    grace_period = "30s"
    idle_timeout = "5m"
    backend = "posix"                     # or "portable"
    stdin_format = "text"                 # or "json"
    output_limit = 1048576                # bytes kept per generation and stream
    reply = { until_line = "END" }        # or { lines = 1 }, { idle = "200ms" }: a run's output

    [exec.shutdown]
    graceful = "SIGTERM"                  # posix: a signal or stdin:close / stdin:shutdown
    timeout = "10s"                       # > 0, ≤ 10m, ≤ grace_period

Durations are strings with a unit: ``500ms``, ``10s``, ``2m``, ``1h``,
``1m30s``. Unknown keys are errors, so a typo cannot silently drop a policy.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any

from ...durations import parse_ms
from ..entity_type import DefinitionError
from .reply import Reply
from .spec import ExecSpec, ExecType, ShutdownPolicy, define

__all__ = ["load_exec_file", "parse_exec_file"]

_KEYS = {
    "id", "command", "cwd", "env", "keep", "tags", "shutdown", "grace_period",
    "idle_timeout", "backend", "stdin_format", "output_limit", "reply",
}  # fmt: skip
_SHUTDOWN_KEYS = {"graceful", "timeout"}
_UNIT = re.compile(r"\s*\d+(?:\.\d+)?\s*(ms|s|m|h)")


def _duration(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _UNIT.match(value.lstrip().removeprefix("-")):
        raise DefinitionError(f'{where}: a duration is a string with a unit, such as "500ms", "10s" or "2m"')
    try:
        parse_ms(value)
    except ValueError as exc:  # e.g. "-1s": say what is wrong with it, not only what a duration looks like
        raise DefinitionError(f"{where}: {exc}") from None
    return value


def _entry(raw: Any, index: int, base: Path) -> ExecType:
    where = f"exec[{index}]"
    if not isinstance(raw, dict):
        raise DefinitionError(f"{where}: expected a table ([[exec]])")
    if isinstance(raw.get("id"), str):
        where = f"exec[{index}] ({raw['id']})"
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise DefinitionError(
            f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(_KEYS))})"
        )
    for key in ("id", "command"):
        if key not in raw:
            raise DefinitionError(f"{where}: {key} is required")
    if not isinstance(raw["id"], str):
        raise DefinitionError(f"{where}: id must be a string")
    shutdown = None
    if "shutdown" in raw:
        table = raw["shutdown"]
        if not isinstance(table, dict):
            raise DefinitionError(f"{where}: shutdown must be a table ([exec.shutdown])")
        unknown = sorted(set(table) - _SHUTDOWN_KEYS)
        if unknown:
            raise DefinitionError(
                f"{where}: shutdown: unknown key(s) {', '.join(unknown)} (known: graceful, timeout)"
            )
        graceful = table.get("graceful", "SIGTERM")
        if not isinstance(graceful, str):
            raise DefinitionError(f"{where}: shutdown.graceful must be a string")
        timeout = _duration(table["timeout"], f"{where}: shutdown.timeout") if "timeout" in table else None
        shutdown = ShutdownPolicy(graceful, timeout)
    cwd = raw.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise DefinitionError(f"{where}: cwd must be a string")
    for key, kind in (("keep", bool), ("env", dict), ("tags", list), ("output_limit", int)):
        if key in raw and not isinstance(raw[key], kind):
            raise DefinitionError(f"{where}: {key} must be a {kind.__name__}")
    for key in ("backend", "stdin_format"):
        if key in raw and not isinstance(raw[key], str):
            raise DefinitionError(f"{where}: {key} must be a string")
    spec = ExecSpec(
        id=raw["id"],
        command=raw["command"],
        cwd=str(base / (cwd or ".")),  # a file's commands run from its folder unless it says otherwise
        env=raw.get("env", {}),
        keep=raw.get("keep", False),
        tags=tuple(raw.get("tags", ())),
        shutdown=shutdown,
        grace_period=_duration(raw["grace_period"], f"{where}: grace_period")
        if "grace_period" in raw
        else None,
        idle_timeout=_duration(raw["idle_timeout"], f"{where}: idle_timeout")
        if "idle_timeout" in raw
        else None,
        reply=Reply.from_table(raw["reply"], where) if "reply" in raw else None,
        **{k: raw[k] for k in ("backend", "stdin_format", "output_limit") if k in raw},
    )
    try:
        return define(spec)
    except DefinitionError as exc:
        message = str(exc).removeprefix(f"exec {spec.id!r}: ")
        raise DefinitionError(f"{where}: {message}") from None


def parse_exec_file(
    text: str, base: str | os.PathLike[str] = ".", *, name: str = "<exec file>"
) -> list[ExecType]:
    """Every exec type in ``text``; DefinitionError naming the file and the entry at fault."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise DefinitionError(f"{name}: not valid TOML: {exc}") from None
    unknown = sorted(set(doc) - {"exec"})
    if unknown:
        raise DefinitionError(
            f"{name}: unknown top-level key(s) {', '.join(unknown)} (expected [[exec]] tables)"
        )
    entries = doc.get("exec", [])
    if not isinstance(entries, list) or not entries:
        raise DefinitionError(f"{name}: no [[exec]] entries")
    types: list[ExecType] = []
    seen: set[str] = set()
    for index, raw in enumerate(entries):
        try:
            etype = _entry(raw, index, Path(base))
        except DefinitionError as exc:
            raise DefinitionError(f"{name}: {exc}") from None
        if etype.name in seen:
            raise DefinitionError(f"{name}: exec[{index}]: id {etype.name!r} is declared twice")
        seen.add(etype.name)
        types.append(etype)
    return types


def load_exec_file(path: str | os.PathLike[str]) -> list[ExecType]:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise DefinitionError(f"{p}: {exc.strerror or exc}") from None
    return parse_exec_file(text, p.resolve().parent, name=str(p))
