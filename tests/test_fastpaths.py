"""The fast paths' registry (server/electric_server/fastpaths/__init__.py) and their switches.

Every speed trick is named once, with its fallback; its switch is read where it
is set up; a library whose internals one subclasses or clones is pinned exactly
to the version installed; the HTTP door's two follow their switches.
tests/test_internals.py scans for the private internals themselves.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
import tomllib
from importlib.metadata import packages_distributions, version
from pathlib import Path
from typing import Any

import pytest
from electric_server.app import ElectricServer
from electric_server.fastpaths import BENCH, ENV, FAST_PATHS, FIGURES, SEAMS
from electric_server.fastpaths.http_cork import CorkedH11Protocol
from electric_server.fastpaths.route_table import RouteTable
from electric_server.http.door import HttpDoor
from starlette.applications import Starlette
from uvicorn.protocols.http.h11_impl import H11Protocol

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "server" / "electric_server"
REGISTRY = SERVER / "fastpaths" / "__init__.py"
SERVER_DOC = ROOT / "docs" / "server.md"
# docs/scaling.md's section of the bench's figures: a row per fast path, the fallback beside it.
FIGURES_SECTION = "## Fast paths beside their fallbacks"


def test_each_fast_path_is_named_once_with_its_fallback() -> None:
    names = [path.name for path in FAST_PATHS]
    assert len(names) == len(set(names)) == len(SEAMS)
    assert set(names) == SEAMS
    assert "all" not in SEAMS  # the word that forces every one
    for path in FAST_PATHS:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", path.name), path.name
        assert all((path.buys, path.risks, path.fallback)), path.name
        assert path.row.startswith(f"{path.name}: "), path.row  # the bench's row names it
        assert (ROOT / path.home).is_file(), path.home
    assert (ROOT / BENCH).is_file()


def _switches_read() -> set[str]:
    """The fast-path names given as a literal to a call, in a server module outside the registry."""
    read = set()
    for module in SERVER.rglob("*.py"):
        if module == REGISTRY:
            continue
        for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                read |= {a.value for a in node.args if isinstance(a, ast.Constant) and a.value in SEAMS}
    return read


def test_every_fast_path_reads_its_switch() -> None:
    """A name in the registry that nothing reads would be a switch that switches nothing."""
    read = _switches_read()
    assert read >= SEAMS, f"nothing reads the switch of {sorted(SEAMS - read)}"


def _pins() -> dict[str, str]:
    """Each requirement of pyproject.toml pinned with ``==``: its distribution's version."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    requirements = [
        *project["dependencies"],
        *(r for rs in project["optional-dependencies"].values() for r in rs),
    ]
    pins = {}
    for requirement in requirements:
        found = re.fullmatch(r"([A-Za-z0-9_.-]+)==([^;\s]+)", requirement.strip())
        if found:
            pins[found.group(1).lower()] = found.group(2)
    return pins


def test_what_a_fast_path_reaches_into_is_pinned_to_the_installed_version() -> None:
    libraries = {library for path in FAST_PATHS for library in path.libraries}
    assert libraries == {"grpcio", "uvicorn", "starlette"}
    pins = _pins()
    for library in sorted(libraries):
        assert library in pins, f"{library} is not pinned with == in pyproject.toml"
        assert pins[library] == version(library), (
            f"pyproject.toml pins {library}=={pins[library]}, but {version(library)} is installed: "
            f"check what fastpaths/ reaches into against it, then move the pin"
        )


def test_a_seams_libraries_are_what_its_module_imports() -> None:
    """A seam of fastpaths/ names as its libraries exactly the distributions it imports."""
    distributions = packages_distributions()
    stdlib = sys.stdlib_module_names
    for path in FAST_PATHS:
        home = ROOT / path.home
        if home.parent != REGISTRY.parent:
            continue  # the store's: tricks of our own, reaching into nobody's internals
        imported = set()
        for node in ast.walk(ast.parse(home.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.split(".")[0])
        third_party = {name for name in imported - stdlib if name != "__future__"}
        found = {dist.lower() for name in third_party for dist in distributions.get(name, [name])}
        assert found == set(path.libraries), (path.name, found)


@pytest.mark.anyio
async def test_the_doors_fast_paths_follow_their_switches(
    door: ElectricServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forced off, Starlette's own router routes every request and uvicorn's own h11 protocol
    serves it; each switch alone turns off only its own."""
    assert door.http is not None
    service, readiness = door.http.service, door.http.readiness
    expected = {
        "": (RouteTable, CorkedH11Protocol),
        "route_table": (Starlette, CorkedH11Protocol),
        "http_cork": (RouteTable, H11Protocol),
        "all": (Starlette, H11Protocol),
    }
    for forced, (router, protocol) in expected.items():
        monkeypatch.setenv(ENV, forced)
        built = HttpDoor(service, None, readiness, "127.0.0.1:0")
        assert type(built.router) is router, forced  # under CORS and the broken-framing guard
        assert built.protocol is protocol, forced


def _gendocs() -> Any:
    spec = importlib.util.spec_from_file_location("gendocs", ROOT / "scripts" / "gendocs.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_server_md_has_the_fast_paths_as_the_registry_says(tmp_path: Path) -> None:
    """docs/server.md's fast-path table is generated from the registry, and drift fails the check."""
    gendocs = _gendocs()
    assert gendocs.check(SERVER_DOC) is None, "docs/server.md is stale: run `python scripts/gendocs.py`"
    page = SERVER_DOC.read_text(encoding="utf-8")
    block = page[
        page.index(gendocs.FASTPATHS_BEGIN) : page.index(gendocs.END, page.index(gendocs.FASTPATHS_BEGIN))
    ]
    assert [line.split("`")[1] for line in block.splitlines() if line.startswith("| `")] == [
        path.name for path in FAST_PATHS
    ]
    drifted = tmp_path / "server.md"
    drifted.write_text(page.replace(FAST_PATHS[0].fallback, "something else"), encoding="utf-8")
    assert gendocs.check(drifted) is not None


def test_docs_scaling_md_records_each_fast_path_beside_its_fallback() -> None:
    """Each fast path's figure is a row of docs/scaling.md's section of the bench, not a docstring."""
    page = (ROOT / FIGURES).read_text(encoding="utf-8")
    assert FIGURES_SECTION in page
    section = page[page.index(FIGURES_SECTION) :].split("\n## ", 1)[0]
    rows = {line.split("|")[1].strip() for line in section.splitlines() if line.startswith("| ")}
    assert {path.row for path in FAST_PATHS} <= rows
