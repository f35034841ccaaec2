"""The electric control plane: gRPC services, auth, reaper and stores.

This top level is the one door the SDK uses to reach the server (the CLI's
``server``, ``verify``, ``backup``, ``restore`` and ``dev`` commands, and
``export``, ``import`` and ``electric_sdk.testing``); nothing in ``electric_sdk`` imports a module inside
this package (tests/test_layers.py). ``ConfigError`` (and ``DataDirLocked``,
one of them), ``TokenFileError``, ``BackupError`` and ``TransferError`` are ``ValueError``s: a
configuration that must not start, or a backup, restore, export or import refused.
``StorageFault``s are the store's: ``DamagedStore`` (refused to start, or found
damage while running), ``StorageFailed`` (the disk failed; the server stopped), ``DiskFull``
(a full disk at the start, where the store cannot even be read),
``DatabaseUnavailable`` (PostgreSQL cannot be reached: the server does not start).
``SETTINGS`` is every setting of ``ServerConfig`` (settings.py), which the CLI builds the options of
``server`` and ``dev`` from. Each name loads its module at its first use, so reading the table
loads nothing else.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the checker sees; at run time ``__getattr__`` loads each name's module
    from .app import ElectricServer, ServerConfig, serve, verify_data_dir, verify_database
    from .config_error import ConfigError
    from .core.auth import TokenFileError
    from .lifetime import TasksCrashed
    from .settings import SETTINGS, Setting, parse_given, setting
    from .store.base import DamagedStore, DatabaseUnavailable, DiskFull, StorageFailed, StorageFault
    from .tools.backup import BackupError, StoreCopy, backup_data_dir, restore_data_dir
    from .tools.datadir import DataDirError, DataDirLocked
    from .tools.transfer import Progress, TransferError, Transferred, counted, export_store, import_store
    from .tools.verify import Report

# Each public name's module, loaded at its first use (PEP 562): `electric --help` reads the
# settings table alone, without grpc's server, Starlette, uvicorn or asyncpg.
_HOME = {
    **dict.fromkeys(
        ["ElectricServer", "ServerConfig", "serve", "verify_data_dir", "verify_database"], ".app"
    ),
    "TokenFileError": ".core.auth",
    **dict.fromkeys(["BackupError", "StoreCopy", "backup_data_dir", "restore_data_dir"], ".tools.backup"),
    "ConfigError": ".config_error",
    "TasksCrashed": ".lifetime",
    **dict.fromkeys(["DataDirError", "DataDirLocked"], ".tools.datadir"),
    **dict.fromkeys(["SETTINGS", "Setting", "parse_given", "setting"], ".settings"),
    **dict.fromkeys(
        ["DamagedStore", "DatabaseUnavailable", "DiskFull", "StorageFailed", "StorageFault"], ".store.base"
    ),
    **dict.fromkeys(
        ["Progress", "TransferError", "Transferred", "counted", "export_store", "import_store"],
        ".tools.transfer",
    ),
    "Report": ".tools.verify",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value  # the next use is a plain global
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOME])


__all__ = [
    "SETTINGS",
    "BackupError",
    "ConfigError",
    "DamagedStore",
    "DataDirError",
    "DataDirLocked",
    "DatabaseUnavailable",
    "DiskFull",
    "ElectricServer",
    "Progress",
    "Report",
    "ServerConfig",
    "Setting",
    "StorageFailed",
    "StorageFault",
    "StoreCopy",
    "TasksCrashed",
    "TokenFileError",
    "TransferError",
    "Transferred",
    "__version__",
    "backup_data_dir",
    "counted",
    "export_store",
    "import_store",
    "parse_given",
    "restore_data_dir",
    "serve",
    "setting",
    "verify_data_dir",
    "verify_database",
]
__version__ = "0.1.0"
