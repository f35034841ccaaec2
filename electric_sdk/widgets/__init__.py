"""Notebook widgets: the operator's console, and its two parts.

::

    from electric_sdk import Client
    from electric_sdk.widgets import Dashboard, EntityControl, EntityTable

    client = Client()
    Dashboard(client)                      # the table, and the control panel of the row opened
    EntityControl(client, "research/r1")   # badge, signal buttons, SIGUSR payload, live log
    EntityTable(client, type="research")   # filters, id search, pages of rows, signal a selection

Needs the ``notebook`` extra: ``pip install 'electric-sdk[notebook]'``. The
buttons a widget enables come from ``electric_sdk.lifecycle``; updates come
from watch streams on the client's event loop (the sync ``Client``'s portal
thread, or the ``AsyncClient``'s loop) and are applied on the widgets' own
thread, throttled. ``close()`` stops a widget's streams.
"""

try:
    import ipywidgets as _ipywidgets  # noqa: F401  - fail here, with the way out, not deep inside
except ImportError as exc:  # pragma: no cover - the extra is part of every test install
    raise ImportError("electric_sdk.widgets needs ipywidgets: pip install 'electric-sdk[notebook]'") from exc

from ._control import EntityControl
from ._dashboard import Dashboard
from ._table import EntityTable
from ._view import EntityView

__all__ = ["Dashboard", "EntityControl", "EntityTable", "EntityView"]
