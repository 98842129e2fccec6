"""The package version: the one definition (pyproject.toml reads it too)."""
__version__ = "0.1.0"
