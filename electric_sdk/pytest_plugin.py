"""The pytest plugin: ``electric_server`` and ``electric_client`` fixtures (see ``testing.py``).

Registered through the ``pytest11`` entry point, so pytest loads it at
startup, before any conftest: the user writes no ``pytest_plugins`` line, and
a conftest that imports ``electric_sdk.testing`` first no longer gets
``PytestAssertRewriteWarning`` (an error under ``filterwarnings = error``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from .client import Client

if TYPE_CHECKING:  # imported by pytest itself, through ``pytest_plugins`` below
    from .testing import TestServer

__all__ = ["electric_client", "electric_server"]

# Older conftests list ``electric_sdk.testing`` in their own ``pytest_plugins``, often after
# importing it: registered here first (entry points load before any conftest), it is not imported
# again under pytest's assertion rewriter, which would warn that it cannot rewrite it.
pytest_plugins = ["electric_sdk.testing"]


@pytest.fixture
def electric_server(tmp_path: Path) -> Iterator[TestServer]:
    """A fresh server per test, its data in the test's tmp_path."""
    from .testing import TestServer

    with TestServer(tmp_path / "electric") as server:
        yield server


@pytest.fixture
def electric_client(electric_server: TestServer) -> Client:
    """A sync Client connected to ``electric_server``."""
    return electric_server.client()
