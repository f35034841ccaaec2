"""Addresses a process listens on (``HOST:PORT``) and the loopback rule they share: the server's
``--listen`` and ``--http`` and the worker's ``--metrics`` refuse a non-loopback host unless
the operator says ``--insecure``."""

from __future__ import annotations

import ipaddress
import socket

__all__ = ["is_loopback", "listen_host"]


def listen_host(listen: str, flag: str) -> str:
    """The host of ``HOST:PORT`` (an IPv6 host without its brackets); ValueError naming ``flag``."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{flag} must be HOST:PORT, got {listen!r}")
    return host.strip("[]")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(ipaddress.ip_address(a[4][0]).is_loopback for a in socket.getaddrinfo(host, None))
        except OSError:
            return False
