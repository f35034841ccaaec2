"""Tests ask the store and its parts through public seams, never through their private attributes.

A private attribute (``._name``, not a dunder) is the store's own to change:
a test that reads one breaks with every refactor of the store, and a seam
a test needs is worth naming (a read-only property, or a small method
documented as for tests, benchmarks or operators). This parses every test
module and fails on a private attribute read through a store or a store part:
an expression whose chain passes a name with "store" in it (``store._x``,
``stores[0]._x``, ``server.store.hub._x``), or a name bound from such an
expression anywhere in the module (``known = store.known``, ``a, b = stores``).
NamedTuple's own API (``_replace``, ``_fields``, ``_make``, ``_asdict``) is
public despite its underscore.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# Public API of every NamedTuple (the store's records are NamedTuples).
NAMED_TUPLE_API = frozenset({"_replace", "_fields", "_make", "_asdict", "_field_defaults"})


def _chain(node: ast.expr) -> Iterator[str]:
    """The identifiers an expression reaches through: attributes, calls, subscripts, awaits."""
    while True:
        if isinstance(node, ast.Attribute):
            yield node.attr
            node = node.value
        elif isinstance(node, ast.Subscript | ast.Starred):
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Await):
            node = node.value
        elif isinstance(node, ast.Name):
            yield node.id
            return
        else:
            return


def _names(target: ast.expr) -> Iterator[str]:
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, ast.Tuple | ast.List):
        for element in target.elts:
            yield from _names(element)
    elif isinstance(target, ast.Starred):
        yield from _names(target.value)


def _bindings(tree: ast.Module) -> Iterator[tuple[list[str], ast.expr]]:
    """(names bound, the expression they are bound from), for every binding in the module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                yield list(_names(target)), node.value
        elif isinstance(node, ast.AnnAssign | ast.NamedExpr) and node.value is not None:
            yield list(_names(node.target)), node.value
        elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
            yield list(_names(node.target)), node.iter
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            yield list(_names(node.optional_vars)), node.context_expr
        elif isinstance(node, ast.arg) and node.annotation is not None:
            yield [node.arg], node.annotation


def private_reads(source: str) -> list[tuple[int, str]]:
    """Where ``source`` reads a private attribute through a store: (line, expression)."""
    tree = ast.parse(source)
    marked: set[str] = set()

    def through_a_store(node: ast.expr) -> bool:
        return any("store" in name.lower() or name in marked for name in _chain(node))

    bindings = list(_bindings(tree))
    grew = True
    while grew:  # a name bound from a marked name is marked too
        grew = False
        for names, value in bindings:
            if through_a_store(value) and not set(names) <= marked:
                marked.update(names)
                grew = True
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        name = node.attr
        if not name.startswith("_") or name.startswith("__") or name in NAMED_TUPLE_API:
            continue
        if through_a_store(node.value):
            found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


def test_no_test_reads_a_private_attribute_of_the_store_or_its_parts() -> None:
    found = [
        f"{path.relative_to(TESTS.parent)}:{line}: {expression}"
        for path in sorted(TESTS.rglob("*.py"))
        for line, expression in private_reads(path.read_text())
    ]
    assert not found, "tests read the store's private attributes (ask a public seam):\n" + "\n".join(found)


def test_the_check_finds_what_it_is_about() -> None:
    source = """
async def test(store, stores, server, record):
    store._wconn
    stores[0]._pool.acquire()
    server.store.hub._entity
    known = store.known
    known._spare
    a, b = await stores()
    b._reachability
    record._replace(txid=1)
    store.__class__
    other._private
"""
    assert [expression for _, expression in private_reads(source)] == [
        "store._wconn",
        "stores[0]._pool",
        "server.store.hub._entity",
        "known._spare",
        "b._reachability",
    ]
