"""The private-internal seams (server/electric_server/fastpaths/).

Our dependencies' internals are reached only inside that package, each behind a
named seam with a fallback; ``ELECTRIC_FORCE_FALLBACKS`` forces the fallbacks
and a typo in it is an error, never a quiet run without the fallback meant.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from electric_server.fastpaths import ENV, FAST_PATHS, SEAMS, forced, forced_fallbacks

ROOT = Path(__file__).resolve().parent.parent
INTERNALS = ROOT / "server" / "electric_server" / "fastpaths"

# What each seam reaches into. Outside the seams' package, none of these may appear.
PRIVATE_USES = {
    "acceptors": re.compile(r"grpc\._cython|cygrpc|_request_registered_call"),
    "ready_queue": re.compile(r"""\._ready\b|["']_ready["']"""),
    "wal_index": re.compile(r"""-shm\b|mxFrame"""),
    "http_cork": re.compile(r"uvicorn\.protocols|H11Protocol"),
}


def _sources() -> list[Path]:
    files = [*(ROOT / "electric_sdk").rglob("*.py"), *(ROOT / "server").rglob("*.py")]
    return [f for f in files if "_proto" not in f.parts and INTERNALS not in f.parents]


def test_private_internals_are_reached_only_through_their_seams() -> None:
    found = []
    for path in _sources():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            for seam, pattern in PRIVATE_USES.items():
                if pattern.search(code):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {seam}: {line.strip()}")
    assert not found, "private internals outside server/electric_server/fastpaths/:\n" + "\n".join(found)


def test_every_seam_module_is_a_fast_path_of_the_registry() -> None:
    """A module of the package is the home of a fast path of the same name, and every fast path's
    home exists (the store's live in store/: tricks of our own, with nothing private to fence)."""
    homes = {path.name: ROOT / path.home for path in FAST_PATHS}
    for module in INTERNALS.glob("*.py"):
        if module.stem != "__init__":
            assert homes.get(module.stem) == module, f"{module.name} is no fast path's home"
    missing = [name for name, home in homes.items() if not home.is_file()]
    assert not missing, f"fast paths whose home is gone: {missing}"


# The store's fast paths take their switches from the registry too; they reach into nothing
# private, and their modules are the store's (store/fastpath.py).
STORE_FAST_PATHS = frozenset({"pg_guess", "pg_one_trip", "sqlite_inline_sync"})


def test_every_store_fast_path_reads_its_switch_once() -> None:
    store = ROOT / "server" / "electric_server" / "store"
    sources = "".join(path.read_text() for path in store.rglob("*.py"))
    for name in sorted(STORE_FAST_PATHS):
        assert sources.count(f'switched_on("{name}")') == 1, name


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", frozenset()),
        ("acceptors", frozenset({"acceptors"})),
        (" wal_index , ready_queue,", frozenset({"wal_index", "ready_queue"})),
        ("all", SEAMS),
    ],
)
def test_the_forced_fallbacks_are_parsed(value: str, expected: frozenset[str]) -> None:
    assert forced_fallbacks(value) == expected


def test_an_unknown_seam_is_an_error_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown seam wal_indx; known: ") as refused:
        forced_fallbacks("acceptors,wal_indx")
    assert refused.value.args[0].endswith(f"known: {', '.join(sorted(SEAMS))} or all")
    with pytest.raises(ValueError, match="unknown seam"):
        forced("nope")


def test_the_server_refuses_a_misspelt_fallback_and_writes_nothing(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "electric_sdk.cli.main", "server", "--data", str(tmp_path / "d")],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "", ENV: "acceptor"},
    )
    assert proc.returncode == 2, proc.stderr
    assert f"{ENV}: unknown seam acceptor" in proc.stderr
    assert not (tmp_path / "d" / "electric.db").exists()
