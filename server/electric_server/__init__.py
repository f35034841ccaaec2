"""The electric control plane: gRPC services, auth, reaper and stores.

This top level is the one door the SDK uses to reach the server (the CLI's
``server``, ``verify`` and ``dev`` commands, and ``electric_sdk.testing``);
nothing in ``electric_sdk`` imports a module inside this package
(tests/test_layers.py). ``ConfigError`` (``DataDirLocked`` is one) and
``TokenFileError`` are ``ValueError``s: a configuration that must not start.
"""

from .app import ElectricServer, ServerConfig, serve, verify_data_dir
from .auth import TokenFileError
from .config_error import ConfigError
from .datadir import DataDirError, DataDirLocked
from .verify import Report

__all__ = [
    "ConfigError",
    "DataDirError",
    "DataDirLocked",
    "ElectricServer",
    "Report",
    "ServerConfig",
    "TokenFileError",
    "__version__",
    "serve",
    "verify_data_dir",
]
__version__ = "0.1.0"
