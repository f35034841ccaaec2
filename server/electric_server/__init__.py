"""The electric control plane: gRPC services, auth, reaper and stores.

This top level is the one door the SDK uses to reach the server (the CLI's
``server``, ``verify``, ``backup``, ``restore`` and ``dev`` commands, and
``export``, ``import`` and ``electric_sdk.testing``); nothing in ``electric_sdk`` imports a module inside
this package (tests/test_layers.py). ``ConfigError`` (and ``DataDirLocked``,
one of them), ``TokenFileError``, ``BackupError`` and ``TransferError`` are ``ValueError``s: a
configuration that must not start, or a backup, restore, export or import refused.
``StorageFault``s are the store's: ``DamagedStore`` (refused to start, or found
damage while running), ``StorageFailed`` (the disk failed; the server stopped),
``DatabaseUnavailable`` (PostgreSQL cannot be reached: the server does not start).
"""

from .app import ElectricServer, ServerConfig, serve, verify_data_dir, verify_database
from .config_error import ConfigError
from .core.auth import TokenFileError
from .store.base import DamagedStore, DatabaseUnavailable, StorageFailed, StorageFault
from .tools.backup import BackupError, StoreCopy, backup_data_dir, restore_data_dir
from .tools.datadir import DataDirError, DataDirLocked
from .tools.transfer import Progress, TransferError, Transferred, counted, export_store, import_store
from .tools.verify import Report

__all__ = [
    "BackupError",
    "ConfigError",
    "DamagedStore",
    "DataDirError",
    "DataDirLocked",
    "DatabaseUnavailable",
    "ElectricServer",
    "Progress",
    "Report",
    "ServerConfig",
    "StorageFailed",
    "StorageFault",
    "StoreCopy",
    "TokenFileError",
    "TransferError",
    "Transferred",
    "__version__",
    "backup_data_dir",
    "counted",
    "export_store",
    "import_store",
    "restore_data_dir",
    "serve",
    "verify_data_dir",
    "verify_database",
]
__version__ = "0.1.0"
