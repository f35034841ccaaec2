"""The electric control plane: gRPC services, auth, reaper and stores.

This top level is the one door the SDK uses to reach the server (the CLI's
``server``, ``verify`` and ``dev`` commands, and ``electric_sdk.testing``);
nothing in ``electric_sdk`` imports a module inside this package
(tests/test_layers.py). ``ConfigError`` and ``TokenFileError`` are
``ValueError``s: a configuration that must not start. ``StorageFault``s are
the store's: ``DamagedStore`` (refused to start, or found damage while
running), ``StorageFailed`` (the disk failed; the server stopped).
"""

from .app import ConfigError, ElectricServer, ServerConfig, serve, verify_data_dir
from .auth import TokenFileError
from .store.base import DamagedStore, StorageFailed, StorageFault
from .verify import Report

__all__ = [
    "ConfigError",
    "DamagedStore",
    "ElectricServer",
    "Report",
    "ServerConfig",
    "StorageFailed",
    "StorageFault",
    "TokenFileError",
    "__version__",
    "serve",
    "verify_data_dir",
]
__version__ = "0.1.0"
