"""The electric control plane: gRPC services, auth, reaper and stores."""

__all__ = ["__version__"]
__version__ = "0.1.0"
