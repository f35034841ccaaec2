"""The exec tests' fixtures: ``ns``, a PID namespace of the test's own (pidns.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .pidns import Namespace


@pytest.fixture
def ns(tmp_path: Path) -> Iterator[Namespace]:
    namespace = Namespace(tmp_path)
    try:
        yield namespace
    finally:
        namespace.close()
