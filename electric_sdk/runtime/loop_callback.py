"""Calling anyio from a loop callback (``loop.call_soon``), which is no task.

anyio finds the running async library through sniffio when sniffio is installed, and sniffio
looks for the current asyncio task, which a loop callback has none of: ``start_soon`` there
raises ``NoEventLoopError``. Without sniffio, anyio asks for the running loop, which a callback
has. sniffio arrives with other packages (it is no dependency of electric's), so a callback
that starts a task names asyncio for the call itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["in_loop_callback"]


@contextlib.contextmanager
def in_loop_callback() -> Iterator[None]:
    """Name asyncio as the running library within the block (a loop callback's)."""
    try:
        import sniffio
    except ImportError:  # anyio then asks for the running loop, which a callback has
        yield
        return
    token = sniffio.current_async_library_cvar.set("asyncio")
    try:
        yield
    finally:
        sniffio.current_async_library_cvar.reset(token)
