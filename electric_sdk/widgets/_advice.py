"""What a widget says about an error: what happened, where, and what the person can do about it.

The dashboard is often the first thing someone opens, so the usual failures read as
instructions: no server at the address (start one, or point ``ELECTRIC_ADDRESS`` at one), a
token the server refused (set ``ELECTRIC_TOKEN``), an entity it does not know (pick another).
Anything else is the SDK's code and message, never a traceback.
"""

from __future__ import annotations

from .. import errors
from ..client import AsyncClient
from ..models import EntityRef
from ._view import describe


def advice(exc: BaseException, client: AsyncClient, ref: EntityRef | None = None) -> str:
    """One line for people about ``exc``, raised by a call to ``client`` (about ``ref``): what to
    do first, the SDK's code and message last."""
    address = client.options.address
    if isinstance(exc, errors.Unavailable):
        return (
            f"no electric server answers at {address}: start one with `make run` or `electric "
            f"server`, or set ELECTRIC_ADDRESS to its address (retrying meanwhile; {describe(exc)})"
        )
    if isinstance(exc, errors.Unauthenticated):
        if client.options.token is None:
            return (
                f"the server at {address} needs a token: set ELECTRIC_TOKEN to one of its --tokens "
                f"file's tokens, then reload ({describe(exc)})"
            )
        return (
            f"the server at {address} refused the token: set ELECTRIC_TOKEN to one of its --tokens "
            f"file's tokens, then reload ({describe(exc)})"
        )
    if isinstance(exc, errors.PermissionDenied):
        return (
            f"the token may not do this at {address}: the table needs the read scope (for every "
            f"type), the buttons the signal scope ({describe(exc)})"
        )
    if isinstance(exc, errors.EntityNotFound) and ref is not None:
        return (
            f"{ref.url} is not on the server at {address}: it was never spawned there, or its store "
            f"was replaced; pick an entity in the table ({describe(exc)})"
        )
    return describe(exc)
