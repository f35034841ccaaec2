"""electric: Unix-style lifecycle signals for long-running agents."""

__version__ = "0.1.0"
