"""No module of the SDK or the server is over 600 lines (issue 44; STYLE.md: modules small).

A module past the limit is split into modules named for what they own, not
allowed in. ``OVERSIZED`` lists the modules that were already over it when this
test came, each with the line count it had then: one may shrink, never grow,
and the entry is removed once the module is split (an entry whose module is
gone or back under the limit fails the test until it is). Generated code
(``_proto/``) is not counted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = (ROOT / "electric_sdk", ROOT / "server")
LIMIT = 600
SKIPPED_DIRS = frozenset({"_proto", "__pycache__", ".venv"})

# Over the limit before the limit was kept, at 4133c82: path → lines then. Remove an entry when
# its module is split; never add one.
OVERSIZED: dict[str, int] = {}


def line_counts(root: Path, tops: Iterable[Path]) -> dict[str, int]:
    """Every module under ``tops`` but generated code: its path from ``root`` → its lines."""
    counts = {}
    for top in tops:
        for path in sorted(top.rglob("*.py")):
            if SKIPPED_DIRS.isdisjoint(path.relative_to(top).parts):
                counts[path.relative_to(root).as_posix()] = len(path.read_text(encoding="utf-8").splitlines())
    return counts


def problems(counts: Mapping[str, int], limit: int, oversized: Mapping[str, int]) -> list[str]:
    """What breaks the limit: a module over it that is not allowed, an allowed one that grew, and
    an allowance no longer needed."""
    found = []
    for path, lines in sorted(counts.items()):
        allowed = oversized.get(path)
        if allowed is None and lines > limit:
            found.append(
                f"{path}: {lines} lines, over {limit}: split it into modules named for what they own"
            )
        elif allowed is not None and lines > allowed:
            found.append(f"{path}: {lines} lines, grew past the {allowed} it was allowed: split it")
    for path, allowed in sorted(oversized.items()):
        if path not in counts:
            found.append(f"{path}: gone (was {allowed} lines): remove it from OVERSIZED")
        elif counts[path] <= limit:
            found.append(f"{path}: {counts[path]} lines, within {limit}: remove it from OVERSIZED")
    return found


def test_no_module_is_over_the_limit() -> None:
    found = problems(line_counts(ROOT, SCANNED), LIMIT, OVERSIZED)
    assert not found, "modules over the size limit:\n" + "\n".join(found)


def test_the_scan_covers_the_sdk_and_the_server_but_not_generated_code() -> None:
    counts = line_counts(ROOT, SCANNED)
    assert "electric_sdk/lifecycle.py" in counts
    assert "electric_sdk/runtime/exec/host.py" in counts
    assert "server/electric_server/app.py" in counts
    assert not any("/_proto/" in path for path in counts)


# --- the check itself ------------------------------------------------------------------


def _tree(root: Path, files: Mapping[str, int]) -> dict[str, int]:
    for name, lines in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x = 1\n" * lines, encoding="utf-8")
    return line_counts(root, [root / "pkg"])


def test_the_check_counts_lines_and_skips_generated_code(tmp_path: Path) -> None:
    counts = _tree(tmp_path, {"pkg/a.py": 3, "pkg/sub/b.py": 7, "pkg/_proto/gen.py": 900, "pkg/c.txt": 900})
    assert counts == {"pkg/a.py": 3, "pkg/sub/b.py": 7}


def test_the_check_names_every_offender(tmp_path: Path) -> None:
    counts = _tree(tmp_path, {"pkg/small.py": 10, "pkg/edge.py": 10, "pkg/big.py": 11, "pkg/sub/huge.py": 50})
    found = problems(counts, 10, {})
    assert len(found) == 2
    assert found[0].startswith("pkg/big.py: 11 lines, over 10")
    assert found[1].startswith("pkg/sub/huge.py: 50 lines, over 10")


def test_an_allowed_module_may_shrink_but_not_grow(tmp_path: Path) -> None:
    counts = _tree(tmp_path, {"pkg/old.py": 15, "pkg/older.py": 21})
    assert problems(counts, 10, {"pkg/old.py": 15, "pkg/older.py": 25}) == []
    [grew] = problems(counts, 10, {"pkg/old.py": 14, "pkg/older.py": 25})
    assert grew.startswith("pkg/old.py: 15 lines, grew past the 14")


def test_an_allowance_no_longer_needed_must_be_removed(tmp_path: Path) -> None:
    counts = _tree(tmp_path, {"pkg/split.py": 10})
    found = problems(counts, 10, {"pkg/split.py": 15, "pkg/moved.py": 20})
    assert found == [
        "pkg/moved.py: gone (was 20 lines): remove it from OVERSIZED",
        "pkg/split.py: 10 lines, within 10: remove it from OVERSIZED",
    ]
