"""The version of electric: one number for the wheel (pyproject.toml reads it), `electric --version`
and ``electric_sdk.__version__``."""

__version__ = "0.1.0"
