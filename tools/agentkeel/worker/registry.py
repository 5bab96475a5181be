"""Which function handles which tasks: a handler per workflow, or per workflow and state,
with its retry policy."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

HandlerFn = Callable[..., Any]  # (ctx) -> str | None, or an async def of the same


@dataclass(frozen=True)
class Handler:
    """One registered handler and what happens when it fails.

    An exception it raises retries the task (a self-edge transition, event
    RETRY_SCHEDULED, due again after the backoff), up to ``max_attempts`` runs; then the
    task moves to ``failed_state`` (event TASK_FAILED). ``errors`` maps exception classes
    to the state they move the task to at once (event TASK_ERROR). The backoff before
    retry n is ``random() * min(backoff_cap, backoff_base * 2 ** (n - 1))``: full jitter,
    the outbox's formula.
    """

    workflow: str
    state: str | None
    fn: HandlerFn
    max_attempts: int = 5
    failed_state: str = "failed"
    backoff_base: timedelta = timedelta(seconds=1)
    backoff_cap: timedelta = timedelta(hours=1)
    errors: Mapping[type[BaseException], str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.workflow}:{self.state or '*'}"


class Registry:
    """Handlers by workflow (and state). A task is run by the handler of its workflow and
    state, else by its workflow's handler for every state."""

    def __init__(self) -> None:
        self._handlers: dict[tuple[str, str | None], Handler] = {}

    def handler(
        self,
        workflow: str,
        state: str | None = None,
        *,
        max_attempts: int = 5,
        failed_state: str = "failed",
        backoff_base: timedelta = timedelta(seconds=1),
        backoff_cap: timedelta = timedelta(hours=1),
        errors: Mapping[type[BaseException], str] | None = None,
    ) -> Callable[[HandlerFn], HandlerFn]:
        """Register the decorated function for tasks of ``workflow`` (in ``state``, or in
        any state it has no other handler for)."""
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if backoff_base < timedelta(0) or backoff_cap < timedelta(0):
            raise ValueError("backoff_base and backoff_cap must not be negative")

        def register(fn: HandlerFn) -> HandlerFn:
            key = (workflow, state)
            if key in self._handlers:
                raise ValueError(f"a handler for {workflow}:{state or '*'} is registered already")
            self._handlers[key] = Handler(
                workflow,
                state,
                fn,
                max_attempts,
                failed_state,
                backoff_base,
                backoff_cap,
                dict(errors or {}),
            )
            return fn

        return register

    def find(self, workflow: str, state: str) -> Handler | None:
        return self._handlers.get((workflow, state)) or self._handlers.get((workflow, None))

    @property
    def workflows(self) -> list[str]:
        return sorted({w for w, _ in self._handlers})

    @property
    def handlers(self) -> list[Handler]:
        return list(self._handlers.values())


class AppNotFound(Exception):
    """--app names no Registry: the one line the CLI prints."""


def load_registry(spec: str) -> Registry:
    """``module:attribute`` (or ``path/to/file.py:attribute``) to the Registry it names;
    the current directory is importable, as for uvicorn or celery."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise AppNotFound(f"--app {spec!r}: expected module:attribute, e.g. myapp.worker:registry")
    if module_name.endswith(".py"):
        path = Path(module_name)
        sys.path.insert(0, str(path.parent.resolve()))
        module_name = path.stem
    elif "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):
            raise AppNotFound(f"--app {spec!r}: no module named {e.name!r}") from e
        raise AppNotFound(f"--app {spec!r}: importing it raised {type(e).__name__}: {e}") from e
    except Exception as e:  # the app's own error: its traceback under --debug
        raise AppNotFound(f"--app {spec!r}: importing it raised {type(e).__name__}: {e}") from e
    if not hasattr(module, attribute):
        raise AppNotFound(f"--app {spec!r}: module {module_name} has no attribute {attribute!r}")
    registry = getattr(module, attribute)
    if not isinstance(registry, Registry):
        raise AppNotFound(
            f"--app {spec!r}: {module_name}.{attribute} is a {type(registry).__name__}, "
            "not an agentkeel.worker.Registry"
        )
    return registry
