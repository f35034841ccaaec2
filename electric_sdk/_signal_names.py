"""Signal names as people and the wire write them, parsed (``lifecycle.Signal.parse``): text
only, so the lifecycle, which owns the signals, is above it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

__all__ = ["parse_signal"]

T = TypeVar("T")


def parse_signal(text: str, members: Mapping[str, T], numbers: Mapping[int, T], names: Mapping[T, str]) -> T:
    """The signal ``text`` names among ``members`` (by name), or by one of the ``numbers`` POSIX
    fixes; ``names``: each signal's own name, for the errors. ValueError otherwise."""
    name = text.strip().upper()
    if name.isascii() and name.isdigit():
        if int(name) in numbers:
            return numbers[int(name)]
        raise ValueError(
            f"unknown signal number {text!r}: only the numbers POSIX fixes are taken "
            f"({', '.join(f'{n} ({names[s]})' for n, s in numbers.items())}); "
            "give the others by name (SIGSTOP, SIGCONT, SIGUSR): their numbers differ "
            "between platforms"
        )
    for prefix in ("SIGNAL_", ""):  # also the wire's enum names, e.g. SIGNAL_SIGTERM
        candidate = name.removeprefix(prefix)
        candidate = candidate if candidate.startswith("SIG") else f"SIG{candidate}"
        if candidate in members:
            return members[candidate]
    raise ValueError(f"unknown signal {text!r}; expected one of {', '.join(names.values())}")
