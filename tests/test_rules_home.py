"""Every state rule lives in ``electric_sdk/lifecycle.py``: nobody else tests for a group of states.

A rule such as "messages are delivered in spawning, running and idle" written as
``state in (State.SPAWNING, State.RUNNING, State.IDLE)`` outside lifecycle.py is a
copy that drifts: the next rule change would have to find it. This test scans
every module of the SDK and the server (not the generated ``_proto`` code, not
lifecycle.py itself) and fails on

- a tuple, list or set literal holding two or more ``State`` members (however
  the module spells ``State``: ``State.X``, an alias ``S.X``, ``lifecycle.State.X``),
  or two or more state names as strings (``("stopping", "stopped")``), whether it
  is compared with ``in``/``not in``, passed along, or kept in a constant;
- a chain of two or more tests against single states, such as
  ``state is State.A or state is State.B``.

Ask lifecycle instead (``STATE_RULES[state].delivers_messages``, ...). Tests may
type the table out: they are not scanned.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from electric_sdk.lifecycle import State

ROOT = Path(__file__).resolve().parent.parent
SCANNED = (ROOT / "electric_sdk", ROOT / "server")
HOME = ROOT / "electric_sdk" / "lifecycle.py"
GENERATED = ROOT / "electric_sdk" / "_proto"
STATE_NAMES = frozenset(s.value for s in State)
LIFECYCLE_MODULES = frozenset({"electric_sdk.lifecycle", "lifecycle"})


def _modules() -> list[Path]:
    found = []
    for top in SCANNED:
        for path in sorted(top.rglob("*.py")):
            if path == HOME or GENERATED in path.parents or ".venv" in path.parts:
                continue
            found.append(path)
    return found


class _Aliases:
    """The names a module reaches ``State`` and the lifecycle module by."""

    def __init__(self, tree: ast.Module) -> None:
        self.state: set[str] = set()
        self.module: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = node.module or ""
                for alias in node.names:
                    local = alias.asname or alias.name
                    if alias.name == "State" and source.rsplit(".", 1)[-1] == "lifecycle":
                        self.state.add(local)
                    elif alias.name == "lifecycle":
                        self.module.add(local)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in LIFECYCLE_MODULES:
                        self.module.add(alias.asname or alias.name)
        # Plain re-bindings such as ``S = State`` (or ``S, G = State, Signal``).
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                pairs: list[tuple[ast.expr, ast.expr]] = []
                for target in node.targets:
                    if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                        pairs.extend(zip(target.elts, node.value.elts, strict=False))
                    else:
                        pairs.append((target, node.value))
                for target, value in pairs:
                    if isinstance(target, ast.Name) and self.is_state_class(value):
                        self.state.add(target.id)

    def is_state_class(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.state
        return (
            isinstance(node, ast.Attribute)
            and node.attr == "State"
            and isinstance(node.value, ast.Name)
            and node.value.id in self.module
        )

    def is_member(self, node: ast.expr) -> bool:
        """``State.RUNNING`` (or through an alias); ``"running"`` counts too."""
        if isinstance(node, ast.Constant):
            return isinstance(node.value, str) and node.value in STATE_NAMES
        return isinstance(node, ast.Attribute) and node.attr.isupper() and self.is_state_class(node.value)


def _single_state_test(node: ast.expr, aliases: _Aliases) -> bool:
    """``x is State.A``, ``x == "idle"``, ``x is not State.B``: one comparison with one state."""
    return (
        isinstance(node, ast.Compare)
        and len(node.ops) == 1
        and isinstance(node.ops[0], (ast.Is, ast.IsNot, ast.Eq, ast.NotEq))
        and (aliases.is_member(node.comparators[0]) or aliases.is_member(node.left))
    )


def violations(source: str, filename: str = "<string>") -> Iterator[str]:
    """``file:line: what`` for every group of states tested outside lifecycle.py."""
    tree = ast.parse(source, filename)
    aliases = _Aliases(tree)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            members = [e for e in node.elts if aliases.is_member(e)]
            if len(members) >= 2:
                shown = ", ".join(ast.unparse(e) for e in members)
                yield f"{filename}:{node.lineno}: a group of states ({shown}): ask electric_sdk.lifecycle"
        elif isinstance(node, ast.BoolOp):
            tests = [v for v in node.values if _single_state_test(v, aliases)]
            if len(tests) >= 2:
                shown = f" {type(node.op).__name__.lower()} ".join(ast.unparse(t) for t in tests)
                yield f"{filename}:{node.lineno}: a chain of state tests ({shown}): ask electric_sdk.lifecycle"


def test_no_module_outside_lifecycle_tests_for_a_group_of_states() -> None:
    found = [
        problem
        for path in _modules()
        for problem in violations(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    ]
    assert not found, "state rules outside electric_sdk/lifecycle.py:\n" + "\n".join(found)


def test_the_scan_covers_the_sdk_and_the_server() -> None:
    names = {str(p.relative_to(ROOT)) for p in _modules()}
    assert "server/electric_server/runtime/hosting.py" in names
    assert "electric_sdk/runtime/host.py" in names
    assert "electric_sdk/cli/run_cmd.py" in names
    assert "electric_sdk/lifecycle.py" not in names
    assert not any(name.startswith("electric_sdk/_proto/") for name in names)


# --- the detector itself ---------------------------------------------------------------

CAUGHT = {
    "tuple": "from electric_sdk.lifecycle import State\nok = s in (State.IDLE, State.SPAWNING)\n",
    "not in a list": "from electric_sdk.lifecycle import State\nok = s not in [State.IDLE, State.PAUSED]\n",
    "constant": "from electric_sdk.lifecycle import State\nX = frozenset({State.RUNNING, State.IDLE})\n",
    "call argument": "from ..lifecycle import State\nf(kind, [State.A, State.B, State.C], after)\n",
    "alias": "from ..lifecycle import State as S\nok = s in (S.RUNNING, S.IDLE)\n",
    "rebound": "from electric_sdk.lifecycle import State\nS = State\nok = s in {S.RUNNING, S.IDLE}\n",
    "module": "from electric_sdk import lifecycle\nok = s in (lifecycle.State.RUNNING, lifecycle.State.IDLE)\n",
    "module alias": "import electric_sdk.lifecycle as lc\nok = s in (lc.State.RUNNING, lc.State.IDLE)\n",
    "names": 'ok = run.state in ("stopping", "stopped", "killed")\n',
    "or chain": "from electric_sdk.lifecycle import State\nok = s is State.IDLE or s is State.SPAWNING\n",
    "and chain": "from ..lifecycle import State\nok = s is not State.IDLE and x and s is not State.PAUSED\n",
    "name chain": 'ok = state == "idle" or state == "paused"\n',
}

LEFT_ALONE = {
    "one state": "from electric_sdk.lifecycle import State\nok = s is State.RUNNING\n",
    "one in a tuple": "from electric_sdk.lifecycle import State\nok = s in (State.RUNNING,)\n",
    "a table keyed by state": "from electric_sdk.lifecycle import State\nC = {State.IDLE: 1, State.PAUSED: 2}\n",
    "another enum": "import enum\nclass Colour(enum.Enum):\n    A = 1\n    B = 2\nok = c in (Colour.A, Colour.B)\n",
    "other strings": 'ok = status in ("started", "step", "running")\n',
    "one state in a chain": "from electric_sdk.lifecycle import State\nok = s is State.IDLE or ready\n",
}


@pytest.mark.parametrize("source", CAUGHT.values(), ids=CAUGHT.keys())
def test_the_detector_catches(source: str) -> None:
    found = list(violations(source, "m.py"))
    assert len(found) == 1, found
    assert found[0].startswith("m.py:")


@pytest.mark.parametrize("source", LEFT_ALONE.values(), ids=LEFT_ALONE.keys())
def test_the_detector_leaves_alone(source: str) -> None:
    assert list(violations(source, "m.py")) == []
