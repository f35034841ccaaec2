"""How the SDK opens a gRPC channel to one server or to several replicas.

An address is ``HOST:PORT``, or several of them separated by commas
(``a:7700,b:7701``; ``Client(["a:7700", "b:7701"])`` is the same). With
several addresses, or one name that resolves to several, the channel uses
gRPC's ``round_robin`` policy: calls are spread over the replicas that
answer, and a replica that goes away is left out until it answers again.

- IP literals become one static target (``ipv4:a:p,b:q`` / ``ipv6:...``).
- One DNS name is left to gRPC's resolver: it resolves it, and again when its
  connections break, so a name whose records change is followed.
- Several names (or names and literals mixed) are resolved here, once, when
  the channel opens; with TLS the certificate is checked against the first
  name. A name that does not resolve is left out with a warning (a replica
  that is gone may take its name with it, as a Kubernetes pod's does), and
  only when none resolves is the channel refused (``UNRESOLVED_ADDRESS``). A
  reconnecting worker opens a new channel, so it resolves again.
- A gRPC target with its scheme (``unix:/run/electric.sock``, ``dns:///…``,
  ``ipv4:…``) is used as it is.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from . import errors
from ._wire.limits import CHANNEL_OPTIONS

__all__ = ["Target", "channel_target", "check_address", "open_channel", "parse_addresses"]

log = logging.getLogger("electric.client")

_ROUND_ROBIN = ("grpc.lb_policy_name", "round_robin")
_SCHEMES = ("unix:", "unix-abstract:", "dns:", "ipv4:", "ipv6:", "vsock:")


def check_address(address: str) -> None:
    """Refuse a malformed address (``INVALID_ADDRESS``) without resolving it: a name that does not
    resolve now may by the time a call is made, or a worker reconnects."""
    if not address.startswith(_SCHEMES):
        parse_addresses(address)


def parse_addresses(address: str | Sequence[str]) -> tuple[tuple[str, int], ...]:
    """``HOST:PORT`` entries, checked; a clear ``INVALID_ADDRESS`` for anything else."""
    parts = address.split(",") if isinstance(address, str) else list(address)
    out: list[tuple[str, int]] = []
    for raw in parts:
        part = raw.strip()
        host, sep, port = part.rpartition(":")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise errors.InvalidArgument(
                f"the address {part!r} is not HOST:PORT (several: HOST:PORT,HOST:PORT)",
                code="INVALID_ADDRESS",
            )
        out.append((host, int(port)))
    if not out:
        raise errors.InvalidArgument("no address given", code="INVALID_ADDRESS")
    return tuple(out)


def _family(host: str) -> int | None:
    try:
        return ipaddress.ip_address(host).version
    except ValueError:
        return None


def _join(entries: Sequence[tuple[str, int]], version: int) -> str:
    if version == 4:
        return "ipv4:" + ",".join(f"{h}:{p}" for h, p in entries)
    return "ipv6:" + ",".join(f"[{h}]:{p}" for h, p in entries)


@dataclass(frozen=True)
class Target:
    """What ``grpc.aio.*_channel`` takes: the target and the options it needs."""

    target: str
    options: tuple[tuple[str, Any], ...]


def channel_target(address: str | Sequence[str]) -> Target:
    if isinstance(address, str) and address.startswith(_SCHEMES):
        return Target(address, (*CHANNEL_OPTIONS, _ROUND_ROBIN))
    entries = parse_addresses(address)
    if len(entries) == 1:
        host, port = entries[0]
        if _family(host) is not None:  # one literal: a plain target, nothing to balance
            return Target(f"[{host}]:{port}" if _family(host) == 6 else f"{host}:{port}", CHANNEL_OPTIONS)
        # One name: gRPC's own resolver (DNS), which may find several replicas behind it.
        return Target(f"{host}:{port}", (*CHANNEL_OPTIONS, _ROUND_ROBIN))
    versions = {_family(h) for h, _ in entries}
    if versions in ({4}, {6}):
        return Target(_join(entries, versions.pop() or 4), (*CHANNEL_OPTIONS, _ROUND_ROBIN))
    resolved = _resolve(entries)
    authority = next((h for h, _ in entries if _family(h) is None), entries[0][0])
    options = (*CHANNEL_OPTIONS, _ROUND_ROBIN, ("grpc.default_authority", authority))
    v4 = [e for e in resolved if _family(e[0]) == 4]
    return Target(_join(v4, 4) if v4 else _join(resolved, 6), options)


def _resolve(entries: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
    found: list[tuple[str, int]] = []
    failed: list[str] = []
    for host, port in entries:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            failed.append(f"{host} ({exc})")
            continue
        for info in infos:
            entry = (str(info[4][0]), port)
            if entry not in found:
                found.append(entry)
    if not found:
        raise errors.Unavailable(f"cannot resolve {', '.join(failed)}", code="UNRESOLVED_ADDRESS")
    if failed:
        log.warning("left out of the channel, as they do not resolve: %s", ", ".join(failed))
    return found


def open_channel(
    address: str | Sequence[str],
    *,
    tls: bool = False,
    root_certificates: bytes | None = None,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.aio.Channel:
    """A grpc.aio channel to the server or replicas at ``address`` (see the module's docstring);
    ``options`` replace the defaults of the same names (a worker's keepalive: runtime/worker.py)."""
    target = channel_target(address)
    given = {name for name, _ in options}
    merged = [*(o for o in target.options if o[0] not in given), *options]
    if tls or root_certificates:
        creds = grpc.ssl_channel_credentials(root_certificates=root_certificates)
        return grpc.aio.secure_channel(target.target, creds, options=merged)
    return grpc.aio.insecure_channel(target.target, options=merged)
