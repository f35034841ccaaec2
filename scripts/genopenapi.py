"""Write what the HTTP door's route table generates: docs/openapi.json and the
error table of docs/http.md (``make openapi``).

The error table sits between ``<!-- BEGIN GENERATED: errors -->`` and
``<!-- END GENERATED -->`` in docs/http.md; the prose around it is the page's
own. ``--check`` writes nothing and exits 1, saying which file is stale
(tests/test_openapi.py runs the same comparison).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "server") not in sys.path:  # run as a script from a checkout: import the server from it
    sys.path.insert(0, str(ROOT / "server"))

from electric_server.http.openapi import error_table, render  # noqa: E402

OPENAPI = ROOT / "docs" / "openapi.json"
HTTP_DOC = ROOT / "docs" / "http.md"
BEGIN, END = "<!-- BEGIN GENERATED: errors -->\n", "<!-- END GENERATED -->\n"


def with_error_table(page: str) -> str:
    """``page`` with its generated error table replaced by the current one."""
    head, begin, rest = page.partition(BEGIN)
    _old, end, tail = rest.partition(END)
    if not begin or not end:
        raise SystemExit(f"{HTTP_DOC.name}: no {BEGIN.strip()} … {END.strip()} block")
    return f"{head}{BEGIN}{error_table()}{END}{tail}"


def expected() -> dict[Path, str]:
    return {OPENAPI: render(), HTTP_DOC: with_error_table(HTTP_DOC.read_text(encoding="utf-8"))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args()
    stale = []
    for path, text in expected().items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            stale.append(path)
            if not args.check:
                path.write_text(text, encoding="utf-8")
    if args.check and stale:
        print(f"stale: {', '.join(p.name for p in stale)}: run `make openapi`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
