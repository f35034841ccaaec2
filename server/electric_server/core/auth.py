"""Bearer-token authentication and scope checks, for both doors.

The tokens file is TOML::

    [[tokens]]
    token = "s3cret"                 # what clients send as `authorization: Bearer s3cret`
    principal = "alice"              # recorded as the signal's `sender`
    scopes = ["read", "signal"]      # read | signal | send | runtime | admin
    types = ["my_agent"]             # optional: only these entity types
    expires = 2027-01-01T00:00:00Z   # optional: the token stops working then (a date: its start, UTC)

Any other key is refused at start, naming it: a typo (``type`` for ``types``) would otherwise
drop a restriction silently.

Scopes per method (the HTTP door checks the same, with ``bearer_principal``, ``denial``
and ``type_denial``): ``read`` for Get/List/Read/Watch, ``signal`` for
SignalEntity, SignalEntities and DeleteEntity, ``send`` for SpawnEntity,
SendMessage, ForkEntity and RetryRun, ``runtime`` for workers; ``admin`` grants all. Health and
reflection need no token. A token restricted to types may only name those
types: listing or watching every type, or a selector without a type, is
PERMISSION_DENIED.

The token and the scope are checked on the call's metadata alone: a gRPC call
refused for them is answered by a handler that never decodes its body
(``grpc/auth.py``, the interceptor), so bytes from someone without a token are
never parsed. The file holds secrets:
one that its group or others may read or write is refused
(``TokenFileError``) unless allowed, and then logged as a warning.
"""

from __future__ import annotations

import difflib
import hmac
import logging
import os
import stat
import tomllib
from collections.abc import Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import grpc

from .errors import ApiError

log = logging.getLogger(__name__)

SCOPES = frozenset({"read", "signal", "send", "runtime", "admin"})
_SERVICE = "/electric.v1.EntityService/"
METHOD_SCOPES = {
    f"{_SERVICE}GetEntity": "read",
    f"{_SERVICE}ListEntities": "read",
    f"{_SERVICE}ReadEvents": "read",
    f"{_SERVICE}WatchEvents": "read",
    f"{_SERVICE}WatchEntities": "read",
    f"{_SERVICE}ListWorkers": "read",
    f"{_SERVICE}SignalEntity": "signal",
    f"{_SERVICE}SignalEntities": "signal",
    f"{_SERVICE}DeleteEntity": "signal",
    f"{_SERVICE}SpawnEntity": "send",
    f"{_SERVICE}SendMessage": "send",
    f"{_SERVICE}ListVersions": "read",
    f"{_SERVICE}SetVersion": "admin",
    # A fork creates an entity and a retry sends a message: the scope of a spawn and a send.
    f"{_SERVICE}ForkEntity": "send",
    f"{_SERVICE}RetryRun": "send",
    "/electric.v1.RuntimeService/Connect": "runtime",
}
# A2A's gRPC binding (``--a2a``, docs/a2a.md), served beside these on the same port: the scopes of
# its HTTP bindings (a2a/face.py's SCOPES). CancelTask also reads the stream, to answer once the
# run unwound. A token limited to types names its type as the request's ``tenant``.
_A2A = "/lf.a2a.v1.A2AService/"
A2A_METHOD_SCOPES: dict[str, tuple[str, ...]] = {
    f"{_A2A}SendMessage": ("send",),
    f"{_A2A}SendStreamingMessage": ("send",),
    f"{_A2A}CancelTask": ("signal", "read"),
    **{
        f"{_A2A}{method}": ("read",)
        for method in (
            "GetTask",
            "ListTasks",
            "SubscribeToTask",
            "GetExtendedAgentCard",
            "CreateTaskPushNotificationConfig",
            "GetTaskPushNotificationConfig",
            "ListTaskPushNotificationConfigs",
            "DeleteTaskPushNotificationConfig",
        )
    },
}


def method_scopes(method: str) -> tuple[str, ...] | None:
    """The scopes a gRPC method (its full name) needs; None: none (health, reflection, unknown)."""
    if (scope := METHOD_SCOPES.get(method)) is not None:
        return (scope,)
    return A2A_METHOD_SCOPES.get(method)


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    scopes: frozenset[str]
    # None: every entity type.
    types: frozenset[str] | None = None
    # When its token stops working (the tokens file's `expires`); None: never.
    expires: datetime | None = None

    def allows(self, scope: str) -> bool:
        return "admin" in self.scopes or scope in self.scopes


ANONYMOUS = Principal("anonymous", SCOPES)
current_principal: ContextVar[Principal] = ContextVar("electric_principal", default=ANONYMOUS)


class TokenFileError(ValueError):
    pass


class TokenTable:
    def __init__(self, principals: dict[str, Principal]) -> None:
        self._by_token = principals

    @classmethod
    def load(cls, path: Path, allow_readable: bool = False) -> TokenTable:
        """Read a tokens file; one its group or others may read or write is refused, unless
        ``allow_readable`` (then a warning is logged)."""
        try:
            _check_mode(path, allow_readable)
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise TokenFileError(f"cannot read tokens file {path}: {exc}") from exc
        entries = data.get("tokens")
        if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
            raise TokenFileError(f"{path}: expected one or more [[tokens]] tables")
        if unknown := sorted(set(data) - {"tokens"}):
            raise TokenFileError(f"{path}: unknown key {_known(unknown[0], {'tokens'})}")
        table: dict[str, Principal] = {}
        for n, entry in enumerate(entries, 1):
            where = f"{path}: [[tokens]] #{n}"
            # A key the server does not know is refused: a typo (`type` for `types`) would drop
            # a restriction, and an `expires` it did not read would leave the token working.
            if unknown := sorted(set(entry) - _ENTRY_KEYS):
                raise TokenFileError(f"{where}: unknown key {_known(unknown[0], _ENTRY_KEYS)}")
            token, name, scopes = entry.get("token"), entry.get("principal"), entry.get("scopes")
            if not isinstance(token, str) or len(token) < 8:
                raise TokenFileError(f"{where}: `token` must be a string of at least 8 characters")
            if not isinstance(name, str) or not name:
                raise TokenFileError(f"{where}: `principal` must be a non-empty string")
            if (
                not isinstance(scopes, list)
                or not scopes
                or not all(isinstance(s, str) and s in SCOPES for s in scopes)
            ):
                raise TokenFileError(f"{where}: `scopes` must be a non-empty list from {sorted(SCOPES)}")
            types = entry.get("types")
            if types is not None and (
                not isinstance(types, list) or not all(isinstance(t, str) for t in types)
            ):
                raise TokenFileError(f"{where}: `types` must be a list of entity type names")
            if token in table:
                raise TokenFileError(f"{where}: duplicate token")
            expires = _expires(entry.get("expires"), where)
            if expires is not None and expires <= datetime.now(UTC):
                log.warning("%s: the token of principal %r expired at %s", where, name, expires.isoformat())
            table[token] = Principal(
                name, frozenset(scopes), None if types is None else frozenset(types), expires
            )
        return cls(table)

    def lookup(self, token: str) -> Principal | None:
        # Compare every token in constant time, so timing reveals nothing.
        found = None
        for known, principal in self._by_token.items():
            if hmac.compare_digest(known.encode(), token.encode()):
                found = principal
        if found is not None and found.expires is not None and found.expires <= datetime.now(UTC):
            return None  # expired: as unknown (UNAUTHENTICATED)
        return found


# The keys of a [[tokens]] entry.
_ENTRY_KEYS = frozenset({"token", "principal", "scopes", "types", "expires"})


def _known(key: str, keys: Iterable[str]) -> str:
    """``key`` quoted, with the known key it is closest to, if any."""
    close = difflib.get_close_matches(key, sorted(keys), n=1)
    hint = f" (did you mean `{close[0]}`?)" if close else ""
    return f"`{key}`{hint}: expected one of {', '.join(f'`{k}`' for k in sorted(keys))}"


def _expires(value: object, where: str) -> datetime | None:
    """An entry's `expires`: a TOML offset date-time (or a date: its start, UTC)."""
    if value is None:
        return None
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value
    if isinstance(value, date) and not isinstance(value, datetime):
        return datetime(value.year, value.month, value.day, tzinfo=UTC)
    raise TokenFileError(
        f"{where}: `expires` must be a TOML date-time with its offset, e.g. 2027-01-01T00:00:00Z, or a date"
    )


ALLOW_READABLE_FLAG = "--allow-readable-tokens"


def _check_mode(path: Path, allow_readable: bool) -> None:
    if os.name != "posix":
        return  # no such mode bits to read
    mode = stat.S_IMODE(path.stat().st_mode)
    if not mode & 0o066:
        return
    problem = f"tokens file {path} may be read or changed by its group or others (mode {mode:04o})"
    if not allow_readable:
        raise TokenFileError(
            f"{problem}: run `chmod 600 {path}`, or pass {ALLOW_READABLE_FLAG} to use it anyway"
        )
    log.warning(
        "%s; used anyway (%s): `chmod 600 %s` to keep its secrets", problem, ALLOW_READABLE_FLAG, path
    )


def _types_named(request: Any) -> list[str]:
    """The entity types a request touches; [] means "every type"."""
    if request.HasField("ref") if hasattr(request, "ref") else False:
        return [request.ref.type]
    if request.HasField("origin") if hasattr(request, "origin") else False:
        return [request.origin.type]  # a fork: the new entity's type is its origin's
    selector = getattr(request, "selector", None)
    if selector is not None:
        if selector.refs:
            return sorted({r.type for r in selector.refs})
        return [selector.type] if selector.type else []
    type_ = getattr(request, "type", "")
    if not type_:
        type_ = getattr(request, "tenant", "")  # an A2A request: its agent's type
    return [type_] if type_ else []


def entity_scope(method: str) -> str:
    """The scope an EntityService method needs (``"SignalEntity"`` → ``"signal"``)."""
    return METHOD_SCOPES[f"{_SERVICE}{method}"]


def bearer_principal(tokens: TokenTable, authorization: str | None) -> Principal | None:
    """The principal of an ``authorization`` value ``Bearer <token>``; None for none or an unknown one."""
    if authorization is None:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():  # the scheme is case-insensitive (RFC 9110)
        return None
    return tokens.lookup(token.strip())


def principal_of(tokens: TokenTable, authorization: Sequence[str]) -> Principal | ApiError | None:
    """The principal of a call's ``authorization`` values, as both doors read them: more than one
    is refused (each door would otherwise read a different one), none or an unknown token is None."""
    if len(authorization) > 1:
        return ApiError(
            grpc.StatusCode.UNAUTHENTICATED,
            "DUPLICATE_AUTHORIZATION",
            f"{len(authorization)} authorization headers: send one",
        )
    return bearer_principal(tokens, authorization[0] if authorization else None)


def refusal_of(found: Principal | ApiError | None, scope: str) -> ApiError | None:
    """Why a call whose ``principal_of`` is ``found`` may not call a method of ``scope``."""
    return found if isinstance(found, ApiError) else denial(found, scope)


def denial(principal: Principal | None, scope: str) -> ApiError | None:
    """Why the token in the metadata may not call a method of ``scope``; None when it may."""
    if principal is None:
        return ApiError(grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED", "missing or unknown bearer token")
    if not principal.allows(scope):
        return ApiError(
            grpc.StatusCode.PERMISSION_DENIED,
            "MISSING_SCOPE",
            f"principal {principal.name!r} lacks the {scope!r} scope",
            {"scope": scope},
        )
    return None


def type_denial(principal: Principal, request: Any) -> ApiError | None:
    """Why a principal restricted to types may not make this request; None when it may."""
    types = _types_named(request)
    if not types or not set(types) <= (principal.types or frozenset()):
        return ApiError(
            grpc.StatusCode.PERMISSION_DENIED,
            "TYPE_NOT_ALLOWED",
            f"principal {principal.name!r} may only use entity types {sorted(principal.types or ())}",
            {"types": ",".join(types) or "*"},
        )
    return None
