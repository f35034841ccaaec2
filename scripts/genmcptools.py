"""Write the MCP face's tools, read from the HTTP door's route table, to
electric_sdk/mcp_face/tools.json (``server/electric_server/http/mcp_tools.py``).

``--check`` writes nothing and exits 1 when the file is stale (tests/test_mcp_face.py runs the
same comparison).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "server") not in sys.path:  # run as a script from a checkout: import the server from it
    sys.path.insert(0, str(ROOT / "server"))

from electric_server.http.mcp_tools import render  # noqa: E402

TOOLS = ROOT / "electric_sdk" / "mcp_face" / "tools.json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args()
    text = render()
    if TOOLS.exists() and TOOLS.read_text(encoding="utf-8") == text:
        return 0
    if args.check:
        print(f"stale: {TOOLS.name}: run `python scripts/genmcptools.py`", file=sys.stderr)
        return 1
    TOOLS.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
