"""The default code version a worker announces: a hash of the app's own source files.

A SIGHUP'd entity wakes on a worker announcing the newest version, so the
version must change whenever the app's code does, including modules the
entity's module only imports (a ``prompts.py`` beside it). Hashed: every
``.py`` file of each defining module's top-level package (recursively), or,
for a module outside any package, the ``.py`` files beside it. Installed
code (under the interpreter's prefix: the standard library, site-packages)
is the module's own source only; data files are not hashed. ``App(code_version=...)``
overrides all of it (a git revision, a release tag).
"""

from __future__ import annotations

import hashlib
import inspect
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

__all__ = ["MAX_FILES", "source_version"]

# A bound on the files hashed, against an app started from a huge directory (a home directory).
MAX_FILES = 2000


def _installed(path: Path) -> bool:
    prefixes = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    return any(path.is_relative_to(prefix) for prefix in prefixes)


def _tree(module_name: str) -> tuple[str, list[Path]] | None:
    """The directory the module's code lives in and whether to walk it: (its label, roots)."""
    top = sys.modules.get(module_name.partition(".")[0])
    module = sys.modules.get(module_name)
    if module is None or top is None:
        return None
    paths = [Path(p) for p in getattr(top, "__path__", ())]  # a package (maybe a namespace one)
    if paths:
        return top.__name__, [p for p in paths if p.is_dir()]
    file = getattr(module, "__file__", None)
    if not file:
        return None
    return "", [Path(file).resolve().parent]


def _files(roots: list[Path], recursive: bool) -> Iterator[Path]:
    for root in roots:
        found = root.rglob("*.py") if recursive else root.glob("*.py")
        yield from (p for p in found if "__pycache__" not in p.parts and p.is_file())


def source_version(module_names: Iterable[str]) -> str:
    """12 hex digits of the hash of the defining modules' code, or "dev" if none can be read."""
    digest = hashlib.sha256()
    seen: set[Path] = set()
    found = 0
    for name in sorted(set(module_names)):
        tree = _tree(name)
        roots = [r for r in tree[1] if not _installed(r.resolve())] if tree is not None else []
        if not roots:  # installed or source-less: the module's own source, as far as it is known
            module = sys.modules.get(name)
            try:
                source = inspect.getsource(module) if module is not None else None
            except (OSError, TypeError):
                source = None
            if source is not None:
                found += 1
                digest.update(name.encode() + b"\0" + source.encode())
            continue
        assert tree is not None
        for root in roots:
            for path in sorted(_files([root], recursive=bool(tree[0]))):
                resolved = path.resolve()
                if resolved in seen or len(seen) >= MAX_FILES:
                    continue
                seen.add(resolved)
                found += 1
                label = f"{tree[0]}/{path.relative_to(root).as_posix()}"
                digest.update(label.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12] if found else "dev"
