"""agentkeel: a SQL-first PostgreSQL schema for AI-agent workloads."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("agentkeel")
except PackageNotFoundError:  # running from a checkout without an install
    __version__ = "0+unknown"

__all__ = ["__version__"]
