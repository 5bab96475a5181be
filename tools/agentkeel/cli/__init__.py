"""The `agentkeel` command line: `main` and, one module each, its command groups."""

from agentkeel.cli import (  # noqa: F401  (importing a module registers its commands)
    bench,
    bootstrap,
    check,
    conformance,
    distribute,
    embedded,
    lint,
    migrate,
    reference,
    relay,
    rounds,
    tenant,
    worker,
)
from agentkeel.cli.app import main

__all__ = ["main"]
