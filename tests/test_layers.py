"""The import graph keeps its layers (issue 16).

From the bottom up:

1. the contract and the pure rules: ``_proto``, ``lifecycle``, the wire
   conversions (``_wire``) and the small helpers the server shares
   (``durations``, ``_signals``, ``runtime_session``, ``stream_batches``,
   ``_portal``, ``listen``, ``event_types``), and the durable state's rules and rebuild
   (``durable_state``, ``state_read``: the HTTP door rebuilds it as the client does);
2. the public types: ``models``, ``errors``, ``arguments``, ``event_text``,
   and how a channel is opened (``channels``);
3. the client; 4. the runtime (a worker is a client of the server);
5. the CLI, the widgets, ``testing`` and the package's re-exports, which do
   not import one another.

The server (``electric_server``) uses the bottom layer of the SDK only, and
the SDK reaches the server only through ``electric_server``'s top level (the
CLI and ``testing``). The server keeps layers of its own (``SERVER_LAYERS``),
its rooms by role from the bottom up:

1. what every room may use: the settings table, the clock, the task groups of
   components (``lifetime``), the refusal of a configuration, the log throttle and replica tag,
   and the fast paths' registry and seams;
2. the store; 3. the service core;
4. the doors (gRPC, HTTP) and the worker protocol (runtime), which do not
   import one another;
5. the A2A face, in front of the HTTP door;
6. the assembly (``app``, ``metrics``, the package's re-exports) and the
   offline tools beside it. Every import counts, at module level or inside a
function (a function-level import may keep ``--help`` fast; it may not hide a
circle); imports under ``if TYPE_CHECKING:`` count for the layers but not for
circles, since they never run. No module imports another's underscored name.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = {"electric_sdk": ROOT / "electric_sdk", "electric_server": ROOT / "server" / "electric_server"}

LAYERS: list[tuple[str, ...]] = [
    (
        "electric_sdk._proto",
        "electric_sdk.lifecycle",
        "electric_sdk.busy",
        "electric_sdk.lifecycle_names",
        "electric_sdk._signal_names",
        "electric_sdk._wire",
        "electric_sdk.durations",
        "electric_sdk._signals",
        "electric_sdk.runtime_session",
        "electric_sdk.stream_batches",
        "electric_sdk._portal",
        "electric_sdk.listen",
        "electric_sdk.durable_state",
        "electric_sdk.state_read",
        "electric_sdk.event_types",
        "electric_sdk.version",
        # The MCP face over a backend of either side: the CLI's client, the door's service.
        "electric_sdk.mcp_face",
    ),
    (
        "electric_sdk.models",
        "electric_sdk.errors",
        "electric_sdk.arguments",
        "electric_sdk.event_text",
        "electric_sdk.channels",
        "electric_sdk.presence",
        "electric_sdk.code_versions",
    ),
    ("electric_sdk.client",),
    ("electric_sdk.runtime",),
    (
        "electric_sdk.cli",
        "electric_sdk.widgets",
        "electric_sdk.testing",
        "electric_sdk.pytest_plugin",
        "electric_sdk",
    ),
]
TOP = len(LAYERS) - 1
SERVER = "electric_server"

SERVER_LAYERS: list[tuple[str, ...]] = [
    (
        "electric_server.settings",
        "electric_server.clock",
        "electric_server.lifetime",
        "electric_server.config_error",
        "electric_server.log_throttle",
        "electric_server.log_replica",
        "electric_server.fastpaths",
    ),
    ("electric_server.store",),
    ("electric_server.core",),
    ("electric_server.grpc", "electric_server.http", "electric_server.runtime"),
    # The A2A face: in front of the HTTP door, on the official SDK (the [a2a] extra).
    ("electric_server.a2a",),
    ("electric_server.app", "electric_server.metrics", "electric_server.tools", "electric_server"),
]
# Rooms of one layer that must not import one another: the two doors and the runtime.
SERVER_SIBLINGS = frozenset({"electric_server.grpc", "electric_server.http", "electric_server.runtime"})


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the module imported (the deepest project module the statement names)
    line: int
    type_checking: bool
    private_names: tuple[str, ...]  # underscored names taken from the target


def _modules() -> dict[str, tuple[Path, bool]]:
    found = {}
    for package, directory in SOURCES.items():
        for path in directory.rglob("*.py"):
            parts = [package, *path.relative_to(directory).with_suffix("").parts]
            if "_proto" in parts:
                continue
            is_package = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


MODULES = _modules()


def _project(name: str) -> bool:
    return name.split(".", maxsplit=1)[0] in SOURCES


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    nodes: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            nodes.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return nodes


def _imports() -> list[Import]:
    found = []
    for module, (path, is_package) in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        guarded = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if _project(alias.name):
                        found.append(Import(module, alias.name, node.lineno, id(node) in guarded, ()))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = module.split(".") if is_package else module.split(".")[:-1]
                    base = base[: len(base) - node.level + 1]
                    target = ".".join([*base, node.module] if node.module else base)
                else:
                    target = node.module or ""
                if not _project(target):
                    continue
                for alias in node.names:
                    submodule = f"{target}.{alias.name}"
                    if submodule in MODULES:
                        found.append(Import(module, submodule, node.lineno, id(node) in guarded, ()))
                        continue
                    private = (
                        (alias.name,)
                        if alias.name.startswith("_") and not alias.name.startswith("__")
                        else ()
                    )
                    found.append(Import(module, target, node.lineno, id(node) in guarded, private))
    return found


IMPORTS = _imports()


def _layer(module: str) -> int:
    best, depth = -1, -1
    for index, prefixes in enumerate(SERVER_LAYERS if module.startswith(SERVER) else LAYERS):
        for prefix in prefixes:
            # the package's own __init__, not everything below it
            exact_only = prefix in ("electric_sdk", SERVER)
            matches = module == prefix or (not exact_only and module.startswith(prefix + "."))
            if matches and prefix.count(".") > depth:
                best, depth = index, prefix.count(".")
    return best


# The pytest plugin is the testing kit's (a module of its own only so that pytest can load it
# before anything imports ``electric_sdk.testing``).
_GROUP_OF = {"electric_sdk.pytest_plugin": "electric_sdk.testing"}


def _group(module: str) -> str:
    """A top-layer module's group (cli, widgets, testing, the package itself)."""
    group = ".".join(module.split(".")[:2])
    return _GROUP_OF.get(group, group)


def _where(i: Import) -> str:
    return f"{MODULES[i.source][0].relative_to(ROOT)}:{i.line}: {i.source} imports {i.target}"


def test_every_sdk_module_has_a_layer() -> None:
    missing = [m for m in MODULES if m.startswith("electric_sdk") and _layer(m) < 0]
    assert not missing, f"place these modules in a layer of tests/test_layers.py: {missing}"


def test_the_sdk_imports_only_downwards() -> None:
    wrong = []
    for i in IMPORTS:
        if not (i.source.startswith("electric_sdk") and i.target.startswith("electric_sdk")):
            continue
        source, target = _layer(i.source), _layer(i.target)
        if target > source:
            wrong.append(f"{_where(i)} (layer {source} → layer {target})")
        elif source == target == TOP and _group(i.source) != _group(i.target) and i.source != "electric_sdk":
            wrong.append(f"{_where(i)} (the CLI, the widgets and testing do not import one another)")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_every_server_module_has_a_layer() -> None:
    missing = [m for m in MODULES if m.startswith(SERVER) and _layer(m) < 0]
    assert not missing, f"place these modules in a layer of tests/test_layers.py: {missing}"


def _room(module: str) -> str:
    """A server module's room: its folder (``electric_server.core``), or itself at the top."""
    return ".".join(module.split(".")[:2])


def test_the_server_imports_only_downwards() -> None:
    wrong = []
    for i in IMPORTS:
        if not (i.source.startswith(SERVER) and i.target.startswith(SERVER)):
            continue
        source, target = _layer(i.source), _layer(i.target)
        if target > source:
            wrong.append(f"{_where(i)} (layer {source} → layer {target})")
        elif (
            source == target
            and _room(i.source) != _room(i.target)
            and {_room(i.source), _room(i.target)} <= SERVER_SIBLINGS
        ):
            wrong.append(f"{_where(i)} (the doors and the runtime do not import one another)")
    assert not wrong, "server imports against the layers:\n" + "\n".join(wrong)


def test_the_server_uses_only_the_sdks_bottom_layer() -> None:
    wrong = [
        _where(i)
        for i in IMPORTS
        if i.source.startswith(SERVER) and i.target.startswith("electric_sdk") and _layer(i.target) != 0
    ]
    assert not wrong, "the server imports above the SDK's bottom layer:\n" + "\n".join(wrong)


def test_the_sdk_reaches_the_server_only_through_its_top_level() -> None:
    wrong = [
        _where(i)
        for i in IMPORTS
        if i.source.startswith("electric_sdk")
        and i.target.startswith(SERVER)
        and (i.target != SERVER or _group(i.source) not in ("electric_sdk.cli", "electric_sdk.testing"))
    ]
    assert not wrong, "only the CLI and testing import the server, and only `electric_server`:\n" + "\n".join(
        sorted(set(wrong))
    )


def test_no_import_circles() -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    for i in IMPORTS:
        if not i.type_checking and i.source != i.target:
            graph[i.source].add(i.target)
    # Tarjan's strongly connected components; any of two or more modules is a circle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(MODULES):
        if module not in index:
            visit(module)
    assert not circles, f"import circles: {circles}"


def test_no_underscored_name_is_imported_across_modules() -> None:
    wrong = [f"{_where(i)}.{name}" for i in IMPORTS for name in i.private_names]
    assert not wrong, "make these public in the module that owns them:\n" + "\n".join(wrong)


def test_no_underscored_attribute_of_another_project_module() -> None:
    """``from . import models`` then ``models._time(...)`` is the same reach as importing ``_time``."""
    wrong = []
    for module, (path, _) in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        aliases = {
            alias.asname or alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
            if any(i.source == module and i.target.endswith("." + alias.name) for i in IMPORTS)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value.id}.{node.attr}")
    assert not wrong, "underscored names of other modules:\n" + "\n".join(wrong)
